"""Device trace files (CSV or Parquet): measured devices, one row each, as a
fleet group. The columns: docs/fleets.md, "Trace files"; any other column is
an error, and every error names the file, the row and the column.
"""

from __future__ import annotations

import csv
import functools
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import SupportsFloat

import numpy as np

from fedsim.errors import LoadError

MAX_TRACE_BYTES = 1 << 30
MAX_ROWS = 10_000_000
REQUIRED = ("speed_steps_per_s", "down_mbps", "up_mbps")
OPTIONAL = ("latency_s", "availability", "device", "samples")  # samples: links
COLUMNS = REQUIRED + OPTIONAL
_PARQUET = (".parquet", ".pq")  # suffixes of Parquet traces; any other is CSV

_NUM = r"(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?"
_INTERVAL = re.compile(rf"^\s*({_NUM})\s*-\s*({_NUM}|inf)\s*$")


class TraceError(LoadError, ValueError):
    """An invalid trace file: the message names the file, row and column."""


@dataclass(frozen=True, eq=False)
class Intervals:
    """Online intervals ``[start, end)`` per device, in CSR layout: device
    ``i``'s are ``start[offsets[i]:offsets[i+1]]`` and the matching ``end``
    (sorted, disjoint, not touching); ``always[i]``: none given, always online.
    They repeat every ``period_s`` if set."""

    offsets: np.ndarray
    start: np.ndarray
    end: np.ndarray
    always: np.ndarray
    period_s: float | None = None

    @property
    def size(self) -> int:
        return int(self.always.size)

    def of(self, i: int) -> list[tuple[float, float]] | None:
        """Device ``i``'s intervals, or None when it is always online."""
        if self.always[i]:
            return None
        a, b = int(self.offsets[i]), int(self.offsets[i + 1])
        return list(zip(self.start[a:b].tolist(), self.end[a:b].tolist(), strict=True))

    def flips(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The same availability as state flips ``(first_on, offsets, times)``:
        device ``i`` is online at t = 0 when ``first_on[i]`` and flips at each
        of ``times[offsets[i]:offsets[i+1]]``; with a period, the flips cover
        ``(0, period_s]`` (an even count) and repeat."""
        n = self.size
        cnt = np.diff(self.offsets)
        owner = np.repeat(np.arange(n), cnt)  # the device of each interval
        first_on = self.always.copy()
        has = (cnt > 0) & ~self.always
        first_on[has] = self.start[self.offsets[:-1][has]] <= 0.0
        # every boundary is a flip, except a start at 0 (the initial state)
        # and, with a period, an end at the period (the wrap, added below)
        times = np.column_stack([self.start, self.end]).reshape(-1)
        keep = np.repeat(~self.always[owner], 2) & (times > 0.0)
        period = self.period_s
        if period is not None:
            keep &= times < period
        times, dev = times[keep], np.repeat(owner, 2)[keep]
        counts = np.bincount(dev, minlength=n).astype(np.int64)
        if period is not None:  # an odd count: the state at the end differs
            odd = np.flatnonzero(counts % 2)
            times = np.insert(times, np.cumsum(counts)[odd], period)
            counts[odd] += 1
        offsets = np.concatenate([[0], np.cumsum(counts)])
        return first_on, offsets, times.astype(np.float64)


@dataclass(frozen=True, eq=False)
class DeviceTrace:
    """The devices of one trace file: read-only arrays, one entry per row
    (``availability`` and ``device`` None without that column)."""

    path: Path
    speed: np.ndarray
    down_mbps: np.ndarray
    up_mbps: np.ndarray
    latency_s: np.ndarray
    availability: Intervals | None
    device: tuple[str, ...] | None
    samples: np.ndarray | None = None  # training samples (fedsim/links.py)

    @property
    def size(self) -> int:
        return int(self.speed.size)


def parse_intervals(text: str) -> list[tuple[float, float]]:
    """Parse ``"start-end;start-end"`` (seconds) into a list of pairs.

    >>> parse_intervals("0-3600; 7200-9000.5")
    [(0.0, 3600.0), (7200.0, 9000.5)]
    >>> parse_intervals("100-inf")
    [(100.0, inf)]
    """
    out = []
    for piece in text.split(";"):
        if not piece.strip():
            continue
        m = _INTERVAL.match(piece)
        if m is None:
            raise ValueError(
                f"expected intervals like '0-3600;7200-9000' (seconds), got {piece!r}"
            )
        out.append((float(m.group(1)), float(m.group(2))))
    return out


def format_intervals(pairs: Sequence[tuple[float, float]]) -> str:
    """The inverse of :func:`parse_intervals` (shortest exact float text).

    >>> format_intervals([(0.0, 3600.0), (7200.5, float("inf"))])
    '0-3600;7200.5-inf'
    """

    def num(x: float) -> str:  # repr(inf) is "inf"
        return str(int(x)) if float(x).is_integer() else repr(float(x))

    return ";".join(f"{num(a)}-{num(b)}" for a, b in pairs)


def _check_intervals(
    pairs: list[tuple[float, float]], period: float | None
) -> list[tuple[float, float]]:
    """Sorted, disjoint, within the period; touching intervals merged."""
    merged: list[tuple[float, float]] = []
    for s, e in pairs:
        if not math.isfinite(s) or s < 0:
            raise ValueError(f"interval start {s} must be a finite number >= 0")
        if not e > s:
            raise ValueError(f"interval {s}-{e} must end after it starts")
        if period is not None and e > period:
            raise ValueError(
                f"interval {s}-{e} goes past period_s ({period}); with a period, "
                "intervals must lie within [0, period_s]"
            )
        if merged and s < merged[-1][1]:
            raise ValueError(
                f"intervals must be sorted and must not overlap: {s}-{e} starts "
                f"before {merged[-1][0]}-{merged[-1][1]} ends"
            )
        if merged and s == merged[-1][1]:
            merged[-1] = (merged[-1][0], e)
        else:
            merged.append((s, e))
    return merged


def resolve_trace_path(file: str | Path, base_dir: str | Path | None = None) -> Path:
    """Absolute path of a trace: next to the scenario (``base_dir``) if it is
    there, else relative to the current directory.

    Raises:
        TraceError: when neither holds a file of that name, saying whether a
            folder of that name was found (so the user does not look for a
            missing file) and every place looked at.
    """
    p = Path(file)
    bases = [Path(b) for b in (base_dir, Path.cwd()) if b is not None]
    candidates = [p] if p.is_absolute() else [b / p for b in bases]
    kinds = [_kind(c) for c in candidates]
    if "file" in kinds:
        return candidates[kinds.index("file")].resolve()
    if "folder" in kinds:
        raise TraceError(
            f"{file}: is a directory ({candidates[kinds.index('folder')]}), "
            "expected a trace file (CSV, or Parquet by its .parquet suffix)"
        )
    where = " or ".join(str(c) for c in candidates)
    raise TraceError(f"{file}: no such trace file (looked for {where})")


def _kind(path: Path) -> str:
    """``file``, ``folder`` or ``none`` (also for a name the system refuses:
    too long, a NUL byte, ...)."""
    try:
        return "file" if path.is_file() else "folder" if path.is_dir() else "none"
    except (OSError, ValueError):
        return "none"


def load_trace(path: str | Path, period_s: float | None = None) -> DeviceTrace:
    """Read and check a trace file (CSV, or Parquet by its ``.parquet`` suffix),
    cached on (path, size, modification time, period); raises TraceError."""
    p = Path(path)
    try:
        st = p.stat()
    except FileNotFoundError:
        raise TraceError(f"{p}: no such trace file") from None
    except (OSError, ValueError) as exc:
        raise TraceError(f"{p}: cannot read ({exc})") from None
    if not p.is_file():
        what = "is a directory" if p.is_dir() else "not a file"
        raise TraceError(f"{p}: {what}, expected a trace file")
    if st.st_size > MAX_TRACE_BYTES:
        raise TraceError(f"{p}: {st.st_size} bytes; the limit is {MAX_TRACE_BYTES}")
    _check_period(p, period_s)
    return _load_cached(str(p.resolve()), st.st_size, st.st_mtime_ns, period_s)


def _check_period(p: Path, period_s: float | None) -> None:
    """TraceError unless ``period_s`` is None or a finite positive number
    (a bool is refused although Python counts it as an int)."""
    if period_s is not None and not (
        isinstance(period_s, int | float)
        and not isinstance(period_s, bool)
        and 0 < period_s < math.inf
    ):
        raise TraceError(f"{p}: period_s must be a positive number, got {period_s}")


@functools.lru_cache(maxsize=32)
def _load_cached(
    path: str, size: int, mtime_ns: int, period_s: float | None
) -> DeviceTrace:
    """The parsed trace; size and mtime are part of the key only, so that an
    edited file is read again while a fleet of many groups sharing one trace
    (or a sweep's many runs) reads it once."""
    p = Path(path)
    read = _read_parquet if p.suffix.lower() in _PARQUET else _read_csv
    return _build(p, *read(p), period_s)


# Parsed columns (CSV: stripped strings; Parquet: typed values, None for
# nulls) and a function naming row i for messages.
_Columns = dict[str, list[object]]
_Where = Callable[[int], str]


def _read_csv(p: Path) -> tuple[_Columns, _Where]:
    """A CSV trace's columns (stripped strings) and a function naming row
    ``i`` for messages, with its line number in the file: blank lines are
    skipped, so row and line differ and the user needs the line to find it.

    Raises:
        TraceError: an empty file, a bad header, a row of the wrong width,
            text that is not UTF-8, malformed CSV, or too many rows.
    """
    try:
        with p.open(newline="", encoding="utf-8") as f:
            reader = csv.reader(f)
            header = next(reader, None)
            if header is None:
                raise TraceError(f"{p}: empty file; expected a header line")
            names = [h.strip() for h in header]
            _check_header(p, names)
            columns: _Columns = {n: [] for n in names}
            lines: list[int] = []
            for row in reader:
                if not row or all(not c.strip() for c in row):
                    continue  # blank line
                if len(row) != len(names):
                    raise TraceError(
                        f"{p}: row {len(lines) + 1} (line {reader.line_num}): "
                        f"{len(row)} fields, expected {len(names)} "
                        f"({', '.join(names)})"
                    )
                for n, v in zip(names, row, strict=True):
                    columns[n].append(v.strip())
                lines.append(reader.line_num)
                if len(lines) > MAX_ROWS:
                    raise TraceError(f"{p}: more than {MAX_ROWS} rows")
    except UnicodeDecodeError:
        raise TraceError(f"{p}: not UTF-8 text (a CSV trace is expected)") from None
    except csv.Error as exc:
        raise TraceError(f"{p}: malformed CSV: {exc}") from None
    return columns, lambda i: f"row {i + 1} (line {lines[i]})"


def _read_parquet(p: Path) -> tuple[_Columns, _Where]:
    """A Parquet trace's columns (typed values, None for nulls) and a
    function naming row ``i`` for messages; the same header checks as CSV.

    Raises:
        TraceError: a file pyarrow cannot read (cut short, not Parquet), a
            bad header, or too many rows.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(p)
    except (pa.ArrowException, OSError) as exc:
        raise TraceError(f"{p}: not a readable Parquet file ({exc})") from None
    names = list(table.column_names)
    _check_header(p, names)
    if table.num_rows > MAX_ROWS:
        raise TraceError(f"{p}: more than {MAX_ROWS} rows")
    return table.to_pydict(), lambda i: f"row {i + 1}"


def _check_header(p: Path, names: list[str]) -> None:
    """TraceError for an unknown, repeated or missing column: a typo in a
    column name would otherwise drop that column without a word."""
    unknown = [n for n in names if n not in COLUMNS]
    if unknown:
        raise TraceError(
            f"{p}: unknown column {unknown[0]!r}; the columns are "
            f"{', '.join(COLUMNS)} (the first three required)"
        )
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise TraceError(f"{p}: column {dup[0]!r} appears twice")
    missing = [n for n in REQUIRED if n not in names]
    if missing:
        raise TraceError(
            f"{p}: missing column {missing[0]!r} (required: {', '.join(REQUIRED)})"
        )


def _numbers(
    p: Path, columns: _Columns, name: str, where: _Where, positive: bool
) -> np.ndarray:
    """Column ``name`` as a read-only float array.

    Args:
        p: the file, named in messages.
        columns: the parsed columns (strings from CSV, values from Parquet).
        name: the column.
        where: names row ``i`` (and its line) for messages.
        positive: zero is refused too (a speed or bandwidth of 0 would make
            a device that never finishes; a latency of 0 is fine).

    Raises:
        TraceError: the first value that is not a finite number in range.
    """
    out = np.empty(len(columns[name]), dtype=np.float64)
    need = "a positive number" if positive else "a number >= 0"
    for i, v in enumerate(columns[name]):
        x = _as_float(v)
        if not math.isfinite(x) or x < 0 or (positive and x == 0):
            raise TraceError(
                f"{p}: {where(i)}, column {name!r}: expected {need}, got {v!r}"
            )
        out[i] = x
    return _readonly(out)


def _as_float(v: object) -> float:
    """``float(v)`` as Python reads a cell (a number, numeric text, a
    Parquet decimal); NaN where it cannot (None, "", text that is not a
    number), for the caller to refuse with the cell in its message."""
    with suppress(TypeError, ValueError):
        if isinstance(v, str | bytes | SupportsFloat):
            return float(v)
    return math.nan


def _cell_pairs(cell: object) -> list[tuple[float, float]]:
    """An ``availability`` cell's pairs: text (CSV, or Parquet strings) is
    parsed, [] for a blank or null cell; a Parquet list is read as pairs.

    Raises:
        TypeError, ValueError: the cell is neither (named by the caller).
    """
    if cell is None or isinstance(cell, str):
        return parse_intervals(cell or "")  # [] for a blank cell
    return _pairs(cell)


def _pairs(cell: object) -> list[tuple[float, float]]:
    """A cell holding a list of ``(start, end)`` pairs, as floats.

    Raises:
        TypeError: ``cell`` is not iterable, or a pair not a pair of numbers.
        ValueError: a pair of the wrong length, or not numbers.
    """
    if not isinstance(cell, Iterable):
        raise TypeError(f"'{type(cell).__name__}' object is not iterable")
    return [(float(a), float(b)) for a, b in cell]


def _readonly(a: np.ndarray) -> np.ndarray:
    """``a``, made read-only: cached traces are shared by every fleet built
    from them, so one caller must not be able to change another's devices."""
    a.setflags(write=False)
    return a


def _build(
    p: Path, columns: _Columns, where: _Where, period_s: float | None
) -> DeviceTrace:
    """The checked trace from parsed columns; the optional ones default to
    no latency, always online, and no device names."""
    if not columns[REQUIRED[0]]:
        raise TraceError(f"{p}: no rows; a trace needs at least one device")
    speed, down, up = (_numbers(p, columns, c, where, True) for c in REQUIRED)
    latency = _readonly(np.zeros(speed.size))
    if "latency_s" in columns:
        latency = _numbers(p, columns, "latency_s", where, positive=False)
    cells = columns.get("availability")
    availability = None if cells is None else _intervals(p, cells, where, period_s)
    device = _device_names(columns.get("device"))
    samples = None
    if "samples" in columns:
        samples = _numbers(p, columns, "samples", where, positive=True)
    return DeviceTrace(p, speed, down, up, latency, availability, device, samples)


def _device_names(names: list[object] | None) -> tuple[str, ...] | None:
    """The ``device`` column as names ("" for a null cell); None without it."""
    if names is None:
        return None
    return tuple("" if v is None else str(v) for v in names)


def _intervals(
    p: Path, cells: list[object], where: _Where, period_s: float | None
) -> Intervals:
    """The ``availability`` column as :class:`Intervals`: a CSV cell is text
    (``0-3600;7200-inf``), a Parquet cell text or a list of pairs; a blank
    or null cell means always online (no intervals given), which is not the
    same as an empty list of intervals (never online)."""
    pairs: list[tuple[float, float]] = []
    offsets = [0]
    for i, cell in enumerate(cells):
        try:
            pairs += _check_intervals(_cell_pairs(cell), period_s)
        except (TypeError, ValueError) as exc:
            raise TraceError(f"{p}: {where(i)}, column 'availability': {exc}") from None
        offsets.append(len(pairs))
    always = [c is None or (isinstance(c, str) and not c.strip()) for c in cells]
    bounds = np.array(pairs, dtype=np.float64).reshape(-1, 2)
    return Intervals(
        _readonly(np.array(offsets, dtype=np.int64)),
        _readonly(bounds[:, 0].copy()),
        _readonly(bounds[:, 1].copy()),
        _readonly(np.array(always, dtype=bool)),
        period_s,
    )


def write_trace(path: str | Path, rows: Sequence[Mapping[str, object]]) -> Path:
    """Write devices (dicts with the trace columns; ``availability`` a string
    or pairs) as CSV or Parquet.

    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "t.csv"
    >>> _ = write_trace(p, [{"speed_steps_per_s": 2, "down_mbps": 10,
    ...                      "up_mbps": 5, "availability": [(0, 60)]}])
    >>> load_trace(p).availability.of(0)
    [(0.0, 60.0)]
    """
    p = Path(path)
    order = ("device", *REQUIRED, "latency_s", "availability", "samples")
    names = [c for c in order if any(c in r for r in rows)]
    unknown = sorted({k for r in rows for k in r} - set(COLUMNS))
    if unknown:
        raise TraceError(f"{p}: unknown column {unknown[0]!r}")
    if p.suffix.lower() in _PARQUET:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table({c: [_cell(r, c) for r in rows] for c in names}), p)
    else:
        with p.open("w", newline="", encoding="utf-8") as f:
            table = [[_cell(r, c) for c in names] for r in rows]
            csv.writer(f).writerows([names, *table])  # None is written as ""
    return p


def _cell(row: Mapping[str, object], column: str) -> object:
    """The value written for ``column`` of a device's ``row``: availability
    pairs as the text a CSV cell holds (a Parquet reader takes both)."""
    v = row.get(column)
    if column == "availability" and v is not None and not isinstance(v, str):
        return format_intervals(_pairs(v))
    return v
