"""Device trace files: measured devices, one row each, next to the parametric models.

A fleet group can be read from a trace instead of being drawn from
distributions::

    fleet:
      groups:
        - name: measured-phones
          trace: traces/phones.csv          # count = number of rows
        - name: measured-phones-daily
          trace: {file: traces/phones.parquet, period_s: 86400}

A trace is a CSV file (with a header line) or a Parquet file, one row per
device, with these columns:

=====================  ========  ==============================================
column                 required  meaning
=====================  ========  ==============================================
``speed_steps_per_s``  yes       local steps per simulated second (> 0)
``down_mbps``          yes       download bandwidth, Mbit/s (> 0)
``up_mbps``            yes       upload bandwidth, Mbit/s (> 0)
``latency_s``          no        added to every transfer, s (>= 0; default 0)
``availability``       no        online intervals: ``"start-end;start-end"``
                                 in seconds (``end`` may be ``inf``); an
                                 empty cell means always online. Without the
                                 column, every device is always online.
``device``             no        a name or id, kept for messages only
=====================  ========  ==============================================

In Parquet, ``availability`` may also be a list of ``[start, end]`` pairs.
Intervals are half-open ``[start, end)``, must be sorted and must not
overlap (touching ones are merged). With ``period_s`` the intervals repeat
every ``period_s`` seconds and must lie within ``[0, period_s]``; without it
a device stays in its last state after its last interval (offline, usually).

Any other column is an error (a typo such as ``down_mpbs`` would otherwise be
silently ignored). Every error names the file, the row and the column.

Example:
    >>> import tempfile, pathlib
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "devices.csv"
    >>> _ = path.write_text(
    ...     "device,speed_steps_per_s,down_mbps,up_mbps,availability\\n"
    ...     "a,2.5,40,20,0-3600;7200-9000\\n"
    ...     "b,8.0,80,30,\\n")
    >>> trace = load_trace(path)
    >>> trace.size, trace.speed.tolist()
    (2, [2.5, 8.0])
    >>> trace.availability.of(0), trace.availability.of(1)
    ([(0.0, 3600.0), (7200.0, 9000.0)], None)
"""

from __future__ import annotations

import csv
import functools
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "DeviceTrace",
    "Intervals",
    "TraceError",
    "format_intervals",
    "load_trace",
    "parse_intervals",
    "resolve_trace_path",
    "write_trace",
]

MAX_TRACE_BYTES = 1 << 30
MAX_ROWS = 10_000_000
REQUIRED = ("speed_steps_per_s", "down_mbps", "up_mbps")
OPTIONAL = ("latency_s", "availability", "device")
COLUMNS = REQUIRED + OPTIONAL

_NUM = r"(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?"
_INTERVAL = re.compile(rf"^\s*({_NUM})\s*-\s*({_NUM}|inf)\s*$")


class TraceError(ValueError):
    """An invalid trace file: the message names the file, row and column."""


@dataclass(frozen=True, eq=False)
class Intervals:
    """Online intervals ``[start, end)`` per device, in CSR layout.

    Device ``i``'s intervals are ``start[offsets[i]:offsets[i+1]]`` and the
    matching ``end``; sorted, disjoint, not touching. ``always[i]`` marks a
    device with no availability given (online all the time).

    Attributes:
        offsets: int64 ``[n + 1]``.
        start: float64 ``[N]``, seconds.
        end: float64 ``[N]``, seconds (``inf`` allowed without a period).
        always: bool ``[n]``.
        period_s: the intervals repeat with this period, or None.
    """

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
        """The same availability as state flips, for an alternating process.

        Returns ``(first_on, offsets, times)``: device ``i`` is online at
        t = 0 when ``first_on[i]``, and changes state at each of
        ``times[offsets[i]:offsets[i+1]]`` (increasing). With a period, the
        flips cover one period ``(0, period_s]`` and repeat; an odd count is
        made even by a flip at ``period_s`` when the state at the end of the
        period differs from the state at 0.
        """
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
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        return first_on, offsets, times.astype(np.float64)


@dataclass(frozen=True, eq=False)
class DeviceTrace:
    """The devices of one trace file (arrays are read-only, one entry per row).

    Attributes:
        path: the file it was read from.
        speed: local steps per simulated second.
        down_mbps, up_mbps: bandwidth in Mbit/s.
        latency_s: seconds added to every transfer.
        availability: online intervals, or None when the file has none.
        device: the ``device`` column, if any.
    """

    path: Path
    speed: np.ndarray
    down_mbps: np.ndarray
    up_mbps: np.ndarray
    latency_s: np.ndarray
    availability: Intervals | None
    device: tuple[str, ...] | None

    @property
    def size(self) -> int:
        return int(self.speed.size)


# ------------------------------------------------------------------ intervals
def parse_intervals(text: str) -> list[tuple[float, float]]:
    """Parse ``"start-end;start-end"`` (seconds) into a list of pairs.

    >>> parse_intervals("0-3600; 7200-9000.5")
    [(0.0, 3600.0), (7200.0, 9000.5)]
    >>> parse_intervals("100-inf")
    [(100.0, inf)]

    Raises:
        ValueError: with a short reason, for the caller to place.
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

    def num(x: float) -> str:
        if math.isinf(x):
            return "inf"
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


# -------------------------------------------------------------------- loading
def resolve_trace_path(file: str | Path, base_dir: str | Path | None = None) -> Path:
    """Absolute path of a trace: next to the scenario (``base_dir``) if it is
    there, else relative to the current directory.

    Raises:
        TraceError: if the file does not exist.
    """
    p = Path(file)
    candidates = [p] if p.is_absolute() else []
    if not p.is_absolute():
        if base_dir is not None:
            candidates.append(Path(base_dir) / p)
        candidates.append(Path.cwd() / p)
    for c in candidates:
        try:
            if c.is_file():
                return c.resolve()
        except (OSError, ValueError):  # a name too long, a NUL byte, ...
            continue
    where = " or ".join(str(c) for c in candidates)
    raise TraceError(f"{file}: no such trace file (looked for {where})")


def load_trace(path: str | Path, period_s: float | None = None) -> DeviceTrace:
    """Read and check a trace file (CSV, or Parquet by its ``.parquet`` suffix).

    Reading is cached on (path, size, modification time, period), so a
    scenario that is validated and then built reads its trace once.

    Raises:
        TraceError: naming the file, the row (1-based, and the line for CSV)
            and the column of the first problem found.
    """
    p = Path(path)
    try:
        st = p.stat()
    except FileNotFoundError:
        raise TraceError(f"{p}: no such trace file") from None
    except (OSError, ValueError) as exc:
        raise TraceError(f"{p}: cannot read ({exc})") from None
    if not p.is_file():
        raise TraceError(f"{p}: not a file")
    if st.st_size > MAX_TRACE_BYTES:
        raise TraceError(f"{p}: {st.st_size} bytes; the limit is {MAX_TRACE_BYTES}")
    if period_s is not None and not (
        isinstance(period_s, int | float)
        and not isinstance(period_s, bool)
        and math.isfinite(period_s)
        and period_s > 0
    ):
        raise TraceError(f"{p}: period_s must be a positive number, got {period_s}")
    return _load_cached(str(p.resolve()), st.st_size, st.st_mtime_ns, period_s)


@functools.lru_cache(maxsize=32)
def _load_cached(
    path: str, size: int, mtime_ns: int, period_s: float | None
) -> DeviceTrace:
    p = Path(path)
    if p.suffix.lower() in (".parquet", ".pq"):
        columns, where = _read_parquet(p)
    else:
        columns, where = _read_csv(p)
    return _build(p, columns, where, period_s)


def _read_csv(p: Path) -> tuple[dict[str, list[Any]], Any]:
    try:
        with p.open(newline="", encoding="utf-8") as f:
            reader = csv.reader(f)
            header = next(reader, None)
            if header is None:
                raise TraceError(f"{p}: empty file; expected a header line")
            names = [h.strip() for h in header]
            _check_header(p, names)
            columns: dict[str, list[Any]] = {n: [] for n in names}
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

    def where(i: int) -> str:
        return f"row {i + 1} (line {lines[i]})"

    return columns, where


def _read_parquet(p: Path) -> tuple[dict[str, list[Any]], Any]:
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
    columns = {n: table.column(n).to_pylist() for n in names}

    def where(i: int) -> str:
        return f"row {i + 1}"

    return columns, where


def _check_header(p: Path, names: list[str]) -> None:
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
    p: Path, columns: dict[str, list[Any]], name: str, where: Any, positive: bool
) -> np.ndarray:
    out = np.empty(len(columns[name]), dtype=np.float64)
    need = "a positive number" if positive else "a number >= 0"
    for i, v in enumerate(columns[name]):
        try:
            x = float(v) if v is not None and v != "" else math.nan
        except (TypeError, ValueError):
            x = math.nan
        if not math.isfinite(x) or x < 0 or (positive and x == 0):
            raise TraceError(
                f"{p}: {where(i)}, column {name!r}: expected {need}, got {v!r}"
            )
        out[i] = x
    out.setflags(write=False)
    return out


def _build(
    p: Path, columns: dict[str, list[Any]], where: Any, period_s: float | None
) -> DeviceTrace:
    n = len(columns[REQUIRED[0]])
    if n == 0:
        raise TraceError(f"{p}: no rows; a trace needs at least one device")
    speed = _numbers(p, columns, "speed_steps_per_s", where, positive=True)
    down = _numbers(p, columns, "down_mbps", where, positive=True)
    up = _numbers(p, columns, "up_mbps", where, positive=True)
    if "latency_s" in columns:
        latency = _numbers(p, columns, "latency_s", where, positive=False)
    else:
        latency = np.zeros(n)
        latency.setflags(write=False)
    availability = None
    if "availability" in columns:
        availability = _intervals(p, columns["availability"], where, period_s)
    device = None
    if "device" in columns:
        device = tuple("" if v is None else str(v) for v in columns["device"])
    return DeviceTrace(p, speed, down, up, latency, availability, device)


def _intervals(
    p: Path, cells: list[Any], where: Any, period_s: float | None
) -> Intervals:
    starts: list[float] = []
    ends: list[float] = []
    offsets = [0]
    always = np.zeros(len(cells), dtype=bool)
    for i, cell in enumerate(cells):
        try:
            if cell is None or (isinstance(cell, str) and not cell.strip()):
                always[i] = True
                pairs = []
            elif isinstance(cell, str):
                pairs = parse_intervals(cell)
            else:
                pairs = [(float(a), float(b)) for a, b in cell]
            pairs = _check_intervals(pairs, period_s)
        except (TypeError, ValueError) as exc:
            raise TraceError(f"{p}: {where(i)}, column 'availability': {exc}") from None
        starts += [a for a, _ in pairs]
        ends += [b for _, b in pairs]
        offsets.append(len(starts))
    arrays = (
        np.array(offsets, dtype=np.int64),
        np.array(starts, dtype=np.float64),
        np.array(ends, dtype=np.float64),
        always,
    )
    for a in arrays:
        a.setflags(write=False)
    return Intervals(*arrays, period_s=period_s)


# -------------------------------------------------------------------- writing
def write_trace(path: str | Path, rows: Sequence[dict[str, Any]]) -> Path:
    """Write devices (dicts with the trace columns) as CSV or Parquet.

    ``availability`` may be given as a string or as a list of pairs.

    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "t.csv"
    >>> _ = write_trace(p, [{"speed_steps_per_s": 2, "down_mbps": 10,
    ...                      "up_mbps": 5, "availability": [(0, 60)]}])
    >>> load_trace(p).availability.of(0)
    [(0.0, 60.0)]
    """
    p = Path(path)
    order = ("device", *REQUIRED, "latency_s", "availability")
    names = [c for c in order if any(c in r for r in rows)]
    unknown = sorted({k for r in rows for k in r} - set(COLUMNS))
    if unknown:
        raise TraceError(f"{p}: unknown column {unknown[0]!r}")

    def cell(r: dict[str, Any], c: str) -> Any:
        v = r.get(c)
        if c == "availability" and v is not None and not isinstance(v, str):
            return format_intervals(v)
        return v

    table = [[cell(r, c) for c in names] for r in rows]
    if p.suffix.lower() in (".parquet", ".pq"):
        import pyarrow as pa
        import pyarrow.parquet as pq

        data = {c: [row[j] for row in table] for j, c in enumerate(names)}
        pq.write_table(pa.table(data), p)
    else:
        with p.open("w", newline="", encoding="utf-8") as f:
            w = csv.writer(f)
            w.writerow(names)
            for row in table:
                w.writerow(["" if v is None else v for v in row])
    return p
