"""Run directories: resolved scenario, Parquet tables and a JSON summary.

Every file is written atomically (to a temporary file in the same directory,
fsync'd, then renamed over the target), so a crash never leaves a
half-written file; a reader sees the old version or the new one.

Layout of a run directory::

    scenario.yaml     the fully resolved scenario (every default filled in)
    rounds.parquet    one row per round
    clients.parquet   one row per selected client per round
    summary.json      final and best accuracy, simulated and wall time, version
"""

from __future__ import annotations

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

__all__ = [
    "ASYNC_CLIENT_SCHEMA",
    "ASYNC_ROUND_SCHEMA",
    "ROUND_SCHEMA",
    "CLIENT_SCHEMA",
    "SELECTOR_SCHEMA",
    "atomic_write_bytes",
    "write_table",
    "default_run_dir",
    "prepare_run_dir",
    "summarize",
]

I64, F64, STR, BOOL = pa.int64(), pa.float64(), pa.string(), pa.bool_()


def schema(*runs: tuple[pa.DataType, str], base: pa.Schema | None = None) -> pa.Schema:
    """The columns of ``base`` (if any), then each run's space-separated
    names with that run's type, in order."""
    fields = list(base) if base is not None else []
    for dtype, names in runs:
        fields += [pa.field(name, dtype) for name in names.split()]
    return pa.schema(fields)


# rounds.parquet: one row per round. tau_mean/min/max: local steps of the
# completed updates; tau_eff, chi2_pw: the algorithm's effective steps and its
# weights' objective inconsistency.
ROUND_SCHEMA = schema(
    (I64, "round"),
    (F64, "sim_time wall_time test_loss test_accuracy train_loss"),
    (I64, "n_selected n_completed n_dropped"),
    (F64, "tau_mean tau_min tau_max tau_eff chi2_pw"),
)

# clients.parquet: one row per selected client per round. weight: the
# effective weight w_i (normalised, the chi^2 meter's); agg_weight: the weight
# the client's delta got in the server step as applied (sampling weight, not
# normalised; the participation-bias meter's).
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

# Asynchronous runs: clients.parquet has one row per job the server saw end
# (arrived or dropped); rounds.parquet one row per server version (``round``
# = the version w the updates were applied to; the metrics are those of w + 1).
# version_started: the version the device downloaded; version_applied: null
# unless applied; staleness: version at arrival - version_started, null when
# the device went offline; job: the device's job index (0, 1, ...).
ASYNC_CLIENT_SCHEMA = schema(
    (I64, "version_started version_applied staleness job"), base=CLIENT_SCHEMA
)
ASYNC_ROUND_SCHEMA = schema(
    (F64, "staleness_mean"),
    (I64, "staleness_max n_stale n_offline n_started in_flight"),
    base=ROUND_SCHEMA,
)

# selector.parquet: one row per client (or per whatever the selector reports)
# per round; the selector's artifact() adds its own columns (FedPNS:
# probability, selected, labeled, removed).
SELECTOR_SCHEMA = pa.schema([("round", pa.int64()), ("client_id", pa.int64())])

_UMASK = os.umask(0)
os.umask(_UMASK)

# Columns that depend on the host machine, not on (scenario, seed).
WALL_CLOCK_COLUMNS = ("wall_time",)


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
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        if isinstance(exc, OSError) and exc.errno is not None:
            # name the file the caller meant, not the temporary one
            raise OSError(exc.errno, exc.strerror, str(path)) from None
        raise


def with_extra_columns(rows: list[dict[str, Any]], schema: pa.Schema) -> pa.Schema:
    """``schema`` plus any columns the rows carry beyond it (types inferred),
    e.g. an algorithm's per-client flags or async columns."""
    extra: dict[str, None] = {}
    for r in rows:
        for k in r:
            if k not in extra and schema.get_field_index(k) < 0:
                extra[k] = None
    for k in extra:
        values = [r.get(k) for r in rows]
        schema = schema.append(pa.field(k, pa.array(values).type))
    return schema


def rows_table(rows: list[dict[str, Any]], schema: pa.Schema) -> pa.Table:
    """Rows as an Arrow table: ``schema``'s columns first, in its order and
    types, then any extra columns the rows carry."""
    return pa.Table.from_pylist(rows, schema=with_extra_columns(rows, schema))


def write_arrow(path: Path, table: pa.Table) -> None:
    """Write an Arrow table as a Parquet file, atomically."""
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    atomic_write_bytes(Path(path), sink.getvalue().to_pybytes())


def write_table(path: Path, rows: list[dict[str, Any]], schema: pa.Schema) -> None:
    """Write rows (see :func:`rows_table`) as a Parquet file, atomically."""
    write_arrow(path, rows_table(rows, schema))


class _Converted:
    """One table's rows already converted to Arrow, so that a flush converts
    only the rows added since (rather than every row of a long run, each
    time). Rebuilt whole when new rows change the columns or their types."""

    def __init__(self) -> None:
        self.n = 0
        self.table: pa.Table | None = None

    def of(self, rows: list[dict[str, Any]], schema: pa.Schema) -> pa.Table:
        if self.table is not None and self.n <= len(rows):
            if self.n == len(rows):
                return self.table
            part = rows_table(rows[self.n :], schema)
            if part.schema.equals(self.table.schema):
                self.table = pa.concat_tables([self.table, part])
                self.n = len(rows)
                return self.table
        self.table, self.n = rows_table(rows, schema), len(rows)
        return self.table


def default_run_dir(name: str, root: Path = Path("results")) -> Path:
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    path = root / f"{name}-{stamp}"
    i = 1
    while path.exists():
        i += 1
        path = root / f"{name}-{stamp}-{i}"
    return path


def prepare_run_dir(path: Path) -> Path:
    """Create the run directory and check it is writable, before training."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".write-probe"
        probe.write_bytes(b"ok")
        probe.unlink()
    except OSError as exc:
        raise OSError(
            f"cannot write results to {path}: {exc.strerror or exc}"
        ) from None
    return path


def check_free_space(path: Path, need_bytes: int, what: str) -> None:
    """Raise OSError, before any training, if ``path``'s file system has less
    than ``need_bytes`` free."""
    free = shutil.disk_usage(path).free
    if free < need_bytes:
        raise OSError(
            f"{path}: {what} need about {need_bytes / 2**20:,.1f} MiB of disk, "
            f"but only {free / 2**20:,.1f} MiB are free there; free some space, "
            "choose another --out, or set checkpoint.every_rounds: 0"
        )


def _is_value(x: Any) -> bool:
    """Whether ``x`` is a recorded metric: a finite number. None and NaN mean
    "not evaluated this round"; 0.0 is a value like any other."""
    return isinstance(x, float | int) and not isinstance(x, bool) and math.isfinite(x)


def summarize(
    rows: list[dict[str, Any]],
    client_rows: list[dict[str, Any]],
    *,
    scenario_name: str,
    wall_time_s: float,
    workers: int,
    version: str,
    server_validation: str | None = None,
) -> dict[str, Any]:
    """summary.json's content.

    The test metrics come from the evaluated rounds only (a round without
    evaluation, see ``eval.every_rounds``, records NaN): ``final_*`` is the
    last evaluated value, ``best_test_accuracy`` the highest and
    ``best_round`` the round it was reached in. On a tie, ``best_round`` is
    the latest such round: the newest model that is as good as any is the
    one worth keeping. Metrics of exactly 0.0 count as values. Traffic sums
    every client row, dropped ones included (a dropped client still
    downloaded the model). With no evaluated round the metric fields are
    None. ``server_validation`` says which data the server's model choices
    (FedPNS's CHECK LOSS) scored on: ``"validation split (n rows)"``,
    ``"test set (opt-in)"`` (the test metrics are then optimistic), or None
    when no server-side choice looked at data
    (:func:`fedsim.data.validation.describe_validation`).
    """
    accs = [
        (float(r["test_accuracy"]), int(r["round"]))
        for r in rows
        if _is_value(r.get("test_accuracy"))
    ]
    losses = [float(r["test_loss"]) for r in rows if _is_value(r.get("test_loss"))]
    # max over (accuracy, round): equal accuracies are ordered by round, so a
    # tie goes to the latest round.
    best = max(accs) if accs else (None, None)
    return {
        "scenario": scenario_name,
        "rounds": len(rows),
        "final_test_accuracy": accs[-1][0] if accs else None,
        "best_test_accuracy": best[0],
        "best_round": best[1],
        "final_test_loss": losses[-1] if losses else None,
        "best_test_loss": min(losses) if losses else None,
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


class Recorder:
    """Collects result rows and, given a run directory, writes them as Parquet
    atomically as the run goes (at most every ``flush_every_s`` seconds, and on
    :meth:`flush`).

    Only rows added since the last write are a reason to write: a resume that
    fails before its first round never overwrites the results on disk.
    Asynchronous runs (``asynchronous=True``) use the async schemas.
    """

    def __init__(
        self,
        run_dir: Path | None,
        flush_every_s: float = 5.0,
        asynchronous: bool = False,
    ) -> None:
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.schemas = (
            (ASYNC_ROUND_SCHEMA, ASYNC_CLIENT_SCHEMA)
            if asynchronous
            else (ROUND_SCHEMA, CLIENT_SCHEMA)
        )
        self.rows: list[dict[str, Any]] = []
        self.clients: list[dict[str, Any]] = []
        self.selector_rows: list[dict[str, Any]] = []
        self.flush_every_s = flush_every_s
        self._last = time.monotonic()
        self._dirty = False
        self._converted: dict[str, _Converted] = {}

    def add(
        self,
        row: dict[str, Any],
        clients: list[dict[str, Any]],
        selector_rows: Sequence[dict[str, Any]] = (),
    ) -> None:
        self.rows.append(row)
        self.clients.extend(clients)
        self.selector_rows.extend(selector_rows)
        self._dirty = True
        if time.monotonic() - self._last > self.flush_every_s:
            self.flush()

    def flush(self) -> None:
        """Write the tables now, if any row was added since the last write
        (or none are on disk yet: a run that stopped before its first row,
        e.g. a stalled one, still leaves empty tables for ``fedsim report``)."""
        if self.run_dir is None:
            return
        if not self._dirty and (self.run_dir / "rounds.parquet").exists():
            return
        self.write(self.run_dir)
        self._dirty = False
        self._last = time.monotonic()

    def write(self, run_dir: Path) -> None:
        rounds, clients = self.schemas
        self._write(run_dir / "rounds.parquet", self.rows, rounds)
        self._write(run_dir / "clients.parquet", self.clients, clients)
        if self.selector_rows:
            self._write(
                run_dir / "selector.parquet", self.selector_rows, SELECTOR_SCHEMA
            )

    def _write(self, path: Path, rows: list[dict[str, Any]], schema: pa.Schema) -> None:
        table = self._converted.setdefault(path.name, _Converted()).of(rows, schema)
        write_arrow(path, table)

    def load(self, n_rows: int, n_client_rows: int, n_selector_rows: int = 0) -> None:
        """Read back the first rows of an interrupted run (for --resume)."""
        assert self.run_dir is not None
        rounds = pq.read_table(self.run_dir / "rounds.parquet").to_pylist()
        clients = pq.read_table(self.run_dir / "clients.parquet").to_pylist()
        selector: list[dict[str, Any]] = []
        if n_selector_rows:
            selector = pq.read_table(self.run_dir / "selector.parquet").to_pylist()
        if (
            len(rounds) < n_rows
            or len(clients) < n_client_rows
            or len(selector) < n_selector_rows
        ):
            raise OSError(
                f"{self.run_dir}: the result files hold fewer rows than the "
                "checkpoint expects; cannot resume"
            )
        self.rows, self.clients = rounds[:n_rows], clients[:n_client_rows]
        self.selector_rows = selector[:n_selector_rows]
        self._converted.clear()


def write_summary(path: Path, summary: dict[str, Any]) -> None:
    atomic_write_bytes(Path(path), (json.dumps(summary, indent=2) + "\n").encode())
