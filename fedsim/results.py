"""Run directories: resolved scenario, Parquet tables and a JSON summary, each
written atomically (temp file, fsync, rename): a reader never sees half a file.
Layout and columns: README.md ("What a run writes") and docs/results.md."""

from __future__ import annotations

import itertools
import json
import math
import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from fedsim.errors import LoadError

I64, F64, STR, BOOL = pa.int64(), pa.float64(), pa.string(), pa.bool_()
_Row = dict[str, Any]


def schema(*runs: tuple[pa.DataType, str], base: pa.Schema | None = None) -> pa.Schema:
    """``base``'s columns, then each run's space-separated names with its type."""
    fields = list(base) if base is not None else []
    return pa.schema(fields + [(n, t) for t, names in runs for n in names.split()])


ROUND_SCHEMA = schema(
    (I64, "round"),
    (F64, "sim_time wall_time test_loss test_accuracy train_loss"),
    (I64, "n_selected n_completed n_dropped"),
    (F64, "tau_mean tau_min tau_max tau_eff chi2_pw"),
)
CLIENT_SCHEMA = schema(
    (I64, "round client_id"),
    (STR, "device_group"),
    (I64, "tau"),
    (F64, "t_start t_arrive"),
    (BOOL, "dropped"),
    (STR, "drop_reason"),
    (F64, "slowdown weight update_norm train_loss"),
    (I64, "bytes_down bytes_up"),
    (F64, "agg_weight"),
)
ASYNC_CLIENT_SCHEMA = schema(
    (I64, "version_started version_applied staleness job"), base=CLIENT_SCHEMA
)
ASYNC_ROUND_SCHEMA = schema(
    (F64, "staleness_mean"),
    (I64, "staleness_max n_stale n_offline n_started in_flight"),
    base=ROUND_SCHEMA,
)

# selector.parquet: the selector's artifact() rows add their own columns.
SELECTOR_SCHEMA = pa.schema([("round", pa.int64()), ("client_id", pa.int64())])

_UMASK = os.umask(0)
os.umask(_UMASK)

# Columns that depend on the host machine, not on (scenario, seed).
WALL_CLOCK_COLUMNS = ("wall_time",)

# A loss beyond this is divergence even while it is still finite: float32
# overflows to inf only near 3.4e38, so a run can spend many rounds at 1e30
# before the NaN check sees anything. No model this simulator trains has a
# meaningful loss near 1e12 (cross-entropy of a uniform guess over 1000
# classes is 6.9; the quadratic objectives start below 1e6).
DIVERGENCE_BOUND = 1e12


def is_diverged_value(x: float) -> bool:
    """Whether a loss means the run diverged: NaN, infinite, or beyond
    :data:`DIVERGENCE_BOUND` in magnitude (docs/results.md, "Divergence").

    >>> is_diverged_value(2.3), is_diverged_value(1e30), is_diverged_value(float("nan"))
    (False, True, True)
    """
    return not math.isfinite(x) or abs(x) > DIVERGENCE_BOUND


def first_divergence(rows: Sequence[_Row]) -> str | None:
    """Why a run whose model stayed finite diverged: the first round (or
    version) with a test or training loss :func:`is_diverged_value` calls
    diverged, or None. NaN is left out: it means "not evaluated" (test loss)
    or "no update" (training loss); a NaN model stops the run on its own.

    Such a run is not stopped, so its rows are those it always had; only
    its status says ``diverged`` (docs/results.md, "Divergence").

    >>> first_divergence([{"round": 0, "test_loss": 2.3, "train_loss": 1e30}])
    'round 0: the train_loss is 1e+30, beyond 1e+12'
    """
    for row in rows:
        for key in ("test_loss", "train_loss"):
            x = row.get(key, math.nan)
            if isinstance(x, float | int) and not math.isnan(x):
                if is_diverged_value(x):
                    bound = f"{DIVERGENCE_BOUND:.0e}"
                    return f"round {row['round']}: the {key} is {x:.3g}, beyond {bound}"
    return None


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (temp file + fsync + rename)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600; use the usual mode
        os.replace(tmp, path)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.errno is not None:
            # name the file the caller meant, not the temporary one
            raise OSError(exc.errno, exc.strerror, str(path)) from None
        raise


def rows_table(rows: list[_Row], schema: pa.Schema) -> pa.Table:
    """Rows as a table: ``schema``'s columns, then any extra ones (types inferred)."""
    extra = dict.fromkeys(k for r in rows for k in r if schema.get_field_index(k) < 0)
    for k in extra:
        schema = schema.append(pa.field(k, pa.array([r.get(k) for r in rows]).type))
    return pa.Table.from_pylist(rows, schema=schema)


def write_arrow(path: Path, table: pa.Table) -> None:
    """Write an Arrow table as a Parquet file, atomically."""
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    atomic_write_bytes(Path(path), sink.getvalue().to_pybytes())


def write_table(path: Path, rows: list[_Row], schema: pa.Schema) -> None:
    """Write rows (see :func:`rows_table`) as a Parquet file, atomically."""
    write_arrow(path, rows_table(rows, schema))


def default_run_dir(name: str, root: Path = Path("results")) -> Path:
    """``root/<name>-<YYYYmmdd-HHMMSS>``, with ``-2``, ``-3``, ... added when
    that exists: two runs started in the same second never share a folder."""
    base = root / f"{name}-{datetime.now():%Y%m%d-%H%M%S}"
    tries = itertools.chain([base], (Path(f"{base}-{i}") for i in itertools.count(2)))
    return next(path for path in tries if not path.exists())


def prepare_run_dir(path: Path) -> Path:
    """Create the run directory and check it is writable, before training.

    Raises:
        OSError: naming ``path`` and why (read-only, a file in the way, no
            space), so that the run fails before hours of training, not at
            its first write.
    """
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".write-probe"
        probe.write_bytes(b"ok")
        probe.unlink()
    except OSError as exc:
        why = exc.strerror or exc
        raise OSError(f"cannot write results to {path}: {why}") from None
    return path


def check_free_space(path: Path, need_bytes: int, what: str) -> None:
    """Raise OSError if ``path``'s file system has less than ``need_bytes`` free."""
    free = shutil.disk_usage(path).free
    if free < need_bytes:
        raise OSError(
            f"{path}: {what} need about {need_bytes / 2**20:,.1f} MiB of disk, "
            f"but only {free / 2**20:,.1f} MiB are free there; free some space, "
            "choose another --out, or set checkpoint.every_rounds: 0"
        )


def _is_value(x: Any) -> bool:
    """A finite number; None and NaN mean "not evaluated this round"."""
    return isinstance(x, float | int) and not isinstance(x, bool) and math.isfinite(x)


def summarize(
    rows: list[_Row],
    client_rows: list[_Row],
    *,
    scenario_name: str,
    wall_time_s: float,
    workers: int,
    version: str,
    server_validation: str | None = None,
) -> dict[str, Any]:
    """summary.json's content (docs/results.md, "summary.json")."""
    return {
        "scenario": scenario_name,
        "rounds": len(rows),
        **_test_figures(rows),
        "sim_time_s": rows[-1]["sim_time"] if rows else 0.0,
        "wall_time_s": wall_time_s,
        "updates_completed": int(sum(r["n_completed"] for r in rows)),
        "updates_dropped": int(sum(r["n_dropped"] for r in rows)),
        "bytes_down": int(sum(c["bytes_down"] for c in client_rows)),
        "bytes_up": int(sum(c["bytes_up"] for c in client_rows)),
        "workers": workers,
        "fedsim_version": version,
        "server_validation": server_validation,
    }


def _test_figures(rows: list[_Row]) -> dict[str, Any]:
    """The summary's test-set figures: the final and best accuracy (with its
    round) and loss over the rounds that evaluated (None: none did)."""
    evaluated = [r for r in rows if _is_value(r.get("test_accuracy"))]
    accs = [(float(r["test_accuracy"]), int(r["round"])) for r in evaluated]
    losses = [float(r["test_loss"]) for r in rows if _is_value(r.get("test_loss"))]
    # max over (accuracy, round): a tie goes to the latest round
    best: tuple[float | None, int | None] = max(accs, default=(None, None))
    return {
        "final_test_accuracy": accs[-1][0] if accs else None,
        "best_test_accuracy": best[0],
        "best_round": best[1],
        "final_test_loss": losses[-1] if losses else None,
        "best_test_loss": min(losses, default=None),
    }


class Recorder:
    """Collects result rows, written to ``run_dir`` (if any) every ``flush_every_s``
    seconds at most and on :meth:`flush`; only new rows cause a write."""

    flush_every_s = 5.0

    def __init__(self, run_dir: Path | None, asynchronous: bool = False) -> None:
        """A recorder with no rows yet.

        Args:
            run_dir: where the tables go; None keeps the rows in memory only
                (compare, stress and tests that need no files).
            asynchronous: use the asynchronous tables' extra columns.
        """
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.schemas = (ROUND_SCHEMA, CLIENT_SCHEMA)
        if asynchronous:
            self.schemas = (ASYNC_ROUND_SCHEMA, ASYNC_CLIENT_SCHEMA)
        self.rows: list[_Row] = []
        self.clients: list[_Row] = []
        self.selector_rows: list[_Row] = []
        self._last = time.monotonic()
        self._dirty = False
        # per file: the rows converted so far and their table
        self._converted: dict[str, tuple[int, pa.Table]] = {}

    def add(
        self, row: _Row, clients: list[_Row], selector_rows: Sequence[_Row] = ()
    ) -> None:
        """Keep a round's rows; write them when the last write is older than
        ``flush_every_s`` (a round every few milliseconds would otherwise
        rewrite the tables thousands of times)."""
        self.rows.append(row)
        self.clients.extend(clients)
        self.selector_rows.extend(selector_rows)
        self._dirty = True
        if time.monotonic() - self._last > self.flush_every_s:
            self.flush()

    def flush(self) -> None:
        """Write the tables if rows were added, or none are on disk yet."""
        if self.run_dir is not None and (
            self._dirty or not (self.run_dir / "rounds.parquet").exists()
        ):
            self.write(self.run_dir)
            self._dirty = False
            self._last = time.monotonic()

    def write(self, run_dir: Path) -> None:
        """Write every table to ``run_dir`` now (each file atomically)."""
        rounds, clients = self.schemas
        tables = [("rounds", self.rows, rounds), ("clients", self.clients, clients)]
        if self.selector_rows:
            tables.append(("selector", self.selector_rows, SELECTOR_SCHEMA))
        for name, rows, schema in tables:
            self._write(run_dir / f"{name}.parquet", rows, schema)

    def _write(self, path: Path, rows: list[_Row], schema: pa.Schema) -> None:
        """Write ``rows``, converting only new ones (all of them, on new types)."""
        n, table = self._converted.get(path.name, (0, None))
        if table is None:
            table = rows_table(rows, schema)
        elif n < len(rows):
            part = rows_table(rows[n:], schema)
            same = part.schema.equals(table.schema)
            table = (
                pa.concat_tables([table, part]) if same else rows_table(rows, schema)
            )
        self._converted[path.name] = (len(rows), table)
        write_arrow(path, table)

    def load(self, n_rows: int, n_client_rows: int, n_selector_rows: int = 0) -> None:
        """Read back the first rows of an interrupted run (for --resume).

        Raises:
            UnreadableResults: a table is missing, damaged or shorter than
                the checkpoint says. The recorder then writes nothing more,
                so that the run's ``finally: flush()`` cannot replace the
                files on disk with the empty tables it holds.
        """
        assert self.run_dir is not None
        try:
            rounds = read_rows(self.run_dir / "rounds.parquet", n_rows)
            clients = read_rows(self.run_dir / "clients.parquet", n_client_rows)
            selector: list[_Row] = []
            if n_selector_rows:
                path = self.run_dir / "selector.parquet"
                selector = read_rows(path, n_selector_rows)
        except UnreadableResults:
            self.run_dir = None  # nothing was loaded: never write over the files
            raise
        self.rows, self.clients = rounds[:n_rows], clients[:n_client_rows]
        self.selector_rows = selector[:n_selector_rows]
        self._converted.clear()


class UnreadableResults(LoadError, ValueError):
    """A result table a resume needs is missing, damaged or too short; the
    message names the file."""


def read_rows(path: Path, at_least: int) -> list[_Row]:
    """The rows of the Parquet file ``path``, which must hold ``at_least``.

    Raises:
        UnreadableResults: naming ``path``, when it is missing, cannot be
            parsed (e.g. truncated by a full disk or a copy cut short) or
            holds fewer rows than ``at_least``.
    """
    try:
        rows = pq.read_table(path).to_pylist()
    except FileNotFoundError:
        raise UnreadableResults(f"{path}: missing") from None
    except (OSError, pa.ArrowException) as exc:  # ArrowInvalid: not Parquet
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise UnreadableResults(f"{path}: damaged ({why})") from None
    if len(rows) < at_least:
        raise UnreadableResults(
            f"{path}: holds {len(rows)} rows, the checkpoint expects {at_least}"
        )
    return rows


def write_summary(path: Path, summary: dict[str, Any]) -> None:
    """Write summary.json atomically. JSON has no NaN nor infinity: a
    non-finite float anywhere in ``summary`` (a device group never
    selected has no mean) is written as null, so that any JSON reader
    reads the file."""
    text = json.dumps(_finite_or_none(summary), indent=2, allow_nan=False)
    atomic_write_bytes(Path(path), (text + "\n").encode())


def _finite_or_none(value: Any) -> Any:
    """``value`` with every NaN or infinite float (NumPy's too) at any
    depth of dicts, lists and tuples replaced by None."""
    if isinstance(value, dict):
        return {k: _finite_or_none(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite_or_none(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
