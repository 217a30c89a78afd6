"""Runs in the trackers researchers already watch: TensorBoard and MLflow.

``fedsim run --log tensorboard`` (or ``--log mlflow``, or both) sends every
round's row to a tracker as the run goes; ``compare`` and ``stress`` send one
tracked run per arm and seed, grouped under the comparison (README.md,
"Watching runs in TensorBoard or MLflow"). Both libraries are optional
(``pip install 'fedsim[track]'``) and imported only when asked for, so a
run without ``--log`` imports neither.

What a round sends (:func:`round_metrics`): every numeric column of its row
in rounds.parquet (test metrics, tau statistics, participation counts,
simulated and wall time, chi^2, and any column a plug-in adds), under a
readable tag (``test/accuracy``, ``tau/mean``, ``participation/dropped``),
plus the bytes its clients downloaded and uploaded (sums of clients.parquet's
``bytes_down`` and ``bytes_up``; compare's and stress's runs carry the same
sums in their round rows, :func:`with_round_bytes`). NaN values (a round
without evaluation) are left out. The step is the round (asynchronous mode:
the server version).

Where it goes:

- TensorBoard: event files in ``<run dir>/tensorboard/`` (compare and
  stress: ``<out>/tensorboard/<arm>-seed<s>/``, so one ``tensorboard
  --logdir`` shows every arm), with the resolved scenario as a text summary.
- MLflow: the tracking store ``MLFLOW_TRACKING_URI`` names, else a SQLite
  store in ``./mlruns/mlflow.db`` (MLflow 3 keeps the plain-file store only
  behind an opt-out). The experiment is the scenario's name (compare and
  stress: ``compare-<name>`` / ``stress-<name>``, a parent run per
  comparison and a child run per arm and seed, tagged ``fedsim.arm`` and
  ``fedsim.seed``); parameters are the resolved scenario's fields, dotted
  (``fleet.groups.0.count``: MLflow allows no brackets).

A resumed run (``fedsim run --resume DIR --log ...``) logs into what the run
it continues started: the same MLflow run (its id is kept in
``<run dir>/mlflow_run_id``; the run reads RUNNING again, then ends as the
resume ends) and the same TensorBoard folder. A resume trains again the
rounds after its checkpoint, some of which the interrupted run had logged
already; each tracker sends only the rounds it does not hold yet (the last
step it holds is read back from the tracker itself), so every round is
logged once. A new run in a folder (``--overwrite``) starts a new MLflow run
and replaces the old run's event files.

Before anything is run, :func:`require` checks each tracker: its library
installed, the MLflow store usable (one request, without MLflow's retries:
a closed port or an unwritable path is said at once, not after minutes),
and no file in the way of the TensorBoard folder. A failed check is one
line naming the tracker (the CLI exits 2).

Nothing reaches the network: TensorBoard only writes files, and MLflow's
anonymous usage telemetry is switched off (``MLFLOW_DISABLE_TELEMETRY``)
before it is imported, unless the user set that variable.

Example (the metrics of one round row and its client rows):

    >>> row = {"round": 3, "test_accuracy": 0.5, "test_loss": float("nan"),
    ...        "tau_mean": 4.0, "n_dropped": 1}
    >>> round_metrics(row, [{"bytes_down": 10, "bytes_up": 4},
    ...                     {"bytes_down": 10, "bytes_up": 0}])
    {'test/accuracy': 0.5, 'tau/mean': 4.0, 'participation/dropped': 1.0, \
'bytes/down': 20.0, 'bytes/up': 4.0}
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypeGuard

import yaml

from fedsim.errors import LoadError
from fedsim.rows import Row, whole

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from mlflow.entities import Metric

# The runtime's per-round callback: the round's row and its client rows.
OnRound = Callable[[Row, Sequence[Row]], None]

KINDS = ("tensorboard", "mlflow")
EXTRA = "pip install 'fedsim[track]'"

# rounds.parquet's columns under a tracker's tag; other numeric columns
# (asynchronous mode's, a plug-in's) keep their name under ``fedsim/``
TAGS = {
    "test_accuracy": "test/accuracy",
    "test_loss": "test/loss",
    "train_loss": "train/loss",
    "train_objective": "train/objective",
    "tau_mean": "tau/mean",
    "tau_min": "tau/min",
    "tau_max": "tau/max",
    "tau_eff": "tau/eff",
    "chi2_pw": "weights/chi2_pw",
    "n_selected": "participation/selected",
    "n_completed": "participation/completed",
    "n_dropped": "participation/dropped",
    "sim_time": "time/sim_s",
    "wall_time": "time/wall_s",
}
_NOT_METRICS = {"round"}
_FLUSH_S = 5.0  # MLflow: batches at most this old (each write costs ~30 ms)


class TrackingUnavailable(LoadError, ImportError):
    """A ``--log`` tracker whose library is not installed (the CLI exits 2)."""


class TrackerUnusable(LoadError, ValueError):
    """A ``--log`` tracker that cannot take the run: an MLflow store that
    cannot be reached or written, a file where the TensorBoard folder goes
    (the CLI exits 2, before any training)."""


def round_metrics(row: Row, clients: Sequence[Row]) -> dict[str, float]:
    """A round's metrics, by tracker tag (see the module docstring).

    Guarantees: only finite numbers (NaN and infinities are left out, as
    are non-numeric columns); the same tags for both trackers.

    Args:
        row: the round's row of rounds.parquet.
        clients: its rows of clients.parquet (empty: no byte sums).
    """
    out: dict[str, float] = {}
    for key, value in row.items():
        if key in _NOT_METRICS or not isinstance(value, (int, float)):
            continue  # bool is an int: counts and flags are kept
        if math.isfinite(float(value)):
            out[TAGS.get(key, f"fedsim/{key}")] = float(value)
    if clients:
        out["bytes/down"] = float(sum(whole(c["bytes_down"]) for c in clients))
        out["bytes/up"] = float(sum(whole(c["bytes_up"]) for c in clients))
    return out


# the per-round byte sums :func:`with_round_bytes` adds, by tracker tag
_ROUND_BYTES = {"round_bytes_down": "bytes/down", "round_bytes_up": "bytes/up"}


def with_round_bytes(
    rows: Sequence[Row], clients: Sequence[Row]
) -> list[dict[str, object]]:
    """Copies of the round rows with ``round_bytes_down`` and
    ``round_bytes_up``: the bytes the round's clients downloaded and
    uploaded (what :func:`round_metrics` sums for ``fedsim run``), so that
    compare's and stress's runs, whose client rows stay in their worker,
    log the same ``bytes/down`` and ``bytes/up``.

    >>> with_round_bytes([{"round": 0}, {"round": 1}],
    ...                  [{"round": 1, "bytes_down": 8, "bytes_up": 3},
    ...                   {"round": 1, "bytes_down": 8, "bytes_up": 0}])
    [{'round': 0, 'round_bytes_down': 0, 'round_bytes_up': 0}, \
{'round': 1, 'round_bytes_down': 16, 'round_bytes_up': 3}]
    """
    sums: dict[int, list[int]] = {}
    for c in clients:
        s = sums.setdefault(whole(c["round"], "round"), [0, 0])
        s[0] += whole(c["bytes_down"], "bytes_down")
        s[1] += whole(c["bytes_up"], "bytes_up")
    out: list[dict[str, object]] = []
    for r in rows:
        down, up = sums.get(whole(r["round"], "round"), (0, 0))
        out.append({**r, "round_bytes_down": down, "round_bytes_up": up})
    return out


def rows_metrics(rows: Sequence[Row]) -> Iterator[tuple[int, dict[str, float]]]:
    """(step, metrics) of finished round rows, without client rows (compare's
    and stress's runs): the bytes from ``round_bytes_down`` and
    ``round_bytes_up`` (:func:`with_round_bytes`) when present, else the
    uploads from ``bytes_up_cum``."""
    before = 0
    skip = {"bytes_up_cum", *_ROUND_BYTES}
    for row in rows:
        m = round_metrics({k: v for k, v in row.items() if k not in skip}, [])
        if "bytes_up_cum" in row:
            m["bytes/up"] = float(whole(row["bytes_up_cum"]) - before)
            before = whole(row["bytes_up_cum"])
        for key, tag in _ROUND_BYTES.items():
            if key in row:
                m[tag] = float(whole(row[key], key))
        yield whole(row["round"], "round"), m


def scenario_params(resolved: str) -> dict[str, str]:
    """The resolved scenario as flat ``dotted.path -> text`` parameters.

    Args:
        resolved: the resolved scenario as YAML (``dump_scenario``, the text
            of a run's scenario.yaml).

    >>> scenario_params("{name: a, fleet: {groups: [{count: 2}]}, rounds: 3}")
    {'name': 'a', 'fleet.groups.0.count': '2', 'rounds': '3'}
    """
    out: dict[str, str] = {}
    _walk("", yaml.safe_load(resolved), out)
    return out


def _walk(prefix: str, node: object, out: dict[str, str]) -> None:
    """Flatten ``node`` into ``out``: mappings and lists of mappings by dotted
    path (MLflow allows no brackets), any other value as text (a string as it
    is, the rest as JSON: a list of numbers stays one parameter)."""
    if isinstance(node, dict):
        for k, v in node.items():
            _walk(f"{prefix}.{k}" if prefix else str(k), v, out)
    elif _is_table(node):
        for i, v in enumerate(node):
            _walk(f"{prefix}.{i}", v, out)
    else:
        out[prefix] = node if isinstance(node, str) else json.dumps(node)


def _is_table(node: object) -> TypeGuard[list[object]]:
    """Whether ``node`` is a list holding a mapping (``fleet.groups``): its
    items get a dotted index each, where a list of plain values (``steps:
    [1, 2]``) stays one parameter."""
    return isinstance(node, list) and any(isinstance(v, dict) for v in node)


def require(kinds: Sequence[str], folder: Path | None = None) -> None:
    """Refuse ``--log`` choices that are unknown, not installed or unusable,
    before anything is run.

    Args:
        kinds: the ``--log`` choices.
        folder: where the run (or comparison) writes, when known: its
            ``tensorboard`` must be a folder or not exist yet.

    Raises:
        TrackingUnavailable: a library is missing (the message names the
            extra to install); TrackerUnusable: the MLflow store cannot be
            used (:func:`check_mlflow`) or a file is where the TensorBoard
            folder goes; ValueError: an unknown tracker.
    """
    for kind in kinds:
        if kind not in KINDS:
            raise ValueError(f"--log {kind!r}: expected one of {', '.join(KINDS)}")
        # each tracker's package is named as the tracker is (KINDS)
        try:
            __import__(kind)
        except ImportError:
            raise TrackingUnavailable(
                f"--log {kind} needs the {kind} package: {EXTRA}"
            ) from None
    if "tensorboard" in kinds and folder is not None:
        _check_event_folder(folder / "tensorboard")
    if "mlflow" in kinds:
        check_mlflow()


def _check_event_folder(folder: Path) -> None:
    """Refuse a ``tensorboard`` path that exists and is not a folder (the
    event files could not be written there)."""
    if folder.exists() and not folder.is_dir():
        raise TrackerUnusable(
            f"--log tensorboard: {folder} is a file, where the event files' "
            "folder goes; move it, or choose another --out"
        )


# MLflow's HTTP requests, while the store is checked: one try, a short wait
# (its defaults retry a refused connection for about four minutes)
_CHECK_ENV = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "10",
}


def check_mlflow() -> None:
    """Check that the MLflow store the runs would log to can be used: one
    cheap request (a search for one experiment) through the client the
    runs use, with MLflow's retries off, so that a garbage
    ``MLFLOW_TRACKING_URI``, a server that is down (a closed port) or a
    path that cannot be written is said in one line at once, not as a raw
    exception after minutes of retries, or at the end of training.

    Raises:
        TrackerUnusable: naming the store and why it cannot be used.
    """
    uri = os.environ.get("MLFLOW_TRACKING_URI") or "./mlruns/mlflow.db (the default)"
    saved = {k: os.environ.get(k) for k in _CHECK_ENV}
    os.environ.update(_CHECK_ENV)
    try:
        with _quiet_mlflow():
            mlflow_client().search_experiments(max_results=1)
    except Exception as exc:  # MLflow's, SQLAlchemy's, the OS's: all one line
        raise TrackerUnusable(
            f"--log mlflow: cannot use the MLflow tracking store {uri} "
            f"(MLFLOW_TRACKING_URI): {_why(exc)}"
        ) from None
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _why(exc: BaseException) -> str:
    """The reason in ``exc``'s text, in a few words: the OS's ("Connection
    refused") when a connection failed, else its first line, shortened."""
    text = str(exc) or type(exc).__name__
    found = re.search(r"\[Errno -?\d+\] ([^'\")\]]+)", text)
    if found:
        return found.group(1).strip(" :")
    first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    return first if len(first) <= 300 else first[:297] + "..."


class _Sink(Protocol):
    """One tracker's run: what :class:`Tracker` and :class:`RunGroup` send."""

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        """Record ``metrics`` at ``step`` (the round or server version)."""

    def close(self, status: str) -> None:
        """End the run as the fedsim run ended (``completed``, ...)."""


class _TensorBoard:
    """One run's event files (torch's writer, TensorBoard's file format).

    Args:
        folder: where the event files go.
        resolved: the resolved scenario as YAML, kept as a text summary
            (None: none, a comparison's parent).
        resume: the run continues one that logged here: ``logged`` is the
            last round its event files hold. Else event files already in
            ``folder`` are an older run's (``--overwrite``) and go.

    Raises:
        TrackerUnusable: ``folder`` is a file.
    """

    def __init__(self, folder: Path, resolved: str | None, resume: bool = False):
        from torch.utils.tensorboard import SummaryWriter

        _check_event_folder(folder)
        self.logged = _last_event_step(folder) if resume else -1
        if not resume and folder.is_dir():
            for old in folder.glob("events.out.tfevents.*"):
                old.unlink()
        self.writer = SummaryWriter(str(folder), flush_secs=int(_FLUSH_S))
        if resolved is not None and not resume:
            # four spaces: TensorBoard's text plugin reads markdown
            text = "".join("    " + ln for ln in resolved.splitlines(True))
            self.writer.add_text("scenario", text, 0)

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        for tag, value in metrics.items():
            self.writer.add_scalar(tag, value, step)

    def close(self, status: str) -> None:
        self.writer.close()


# A tag every round row has (its simulated time): the steps a tracker holds
_EVERY_ROUND = TAGS["sim_time"]


def _last_event_step(folder: Path) -> int:
    """The last step of :data:`_EVERY_ROUND` in ``folder``'s event files
    (-1: none), read with TensorBoard's own reader."""
    if not folder.is_dir() or not any(folder.glob("events.out.tfevents.*")):
        return -1
    from tensorboard.backend.event_processing import event_accumulator as ea

    acc = ea.EventAccumulator(str(folder), size_guidance={ea.SCALARS: 0})
    acc.Reload()
    if _EVERY_ROUND not in acc.Tags()["scalars"]:
        return -1
    return max(e.step for e in acc.Scalars(_EVERY_ROUND))


@contextmanager
def _quiet_mlflow() -> Iterator[None]:
    """MLflow's store set-up logs and SQLAlchemy's deprecation warnings
    would land between fedsim's progress lines."""
    log = logging.getLogger("mlflow")
    level = log.level
    log.setLevel(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        log.setLevel(level)


def mlflow_client() -> MlflowClient:
    """An ``MlflowClient`` on ``MLFLOW_TRACKING_URI`` or ``./mlruns/mlflow.db``,
    with usage telemetry off (unless the user set the variable)."""
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    with _quiet_mlflow():
        from mlflow.tracking import MlflowClient

        uri = os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:
            folder = Path("mlruns").resolve()
            folder.mkdir(parents=True, exist_ok=True)
            uri = f"sqlite:///{folder / 'mlflow.db'}"
        return MlflowClient(tracking_uri=uri)


class _MLflow:
    """One MLflow run: parameters at the start, metrics in batches.

    Args:
        client: the store's client.
        experiment: the MLflow experiment (created when missing).
        name: the run's name.
        resolved: the resolved scenario as YAML, logged as parameters
            (None: none, a comparison's parent).
        tags: the run's tags.
        run_id: a run to continue (a resume) instead of a new one:
            ``logged`` is the last round it holds (-1 for a new run).
    """

    def __init__(
        self,
        client: MlflowClient,
        experiment: str,
        name: str,
        resolved: str | None,
        tags: Mapping[str, str],
        run_id: str | None = None,
    ) -> None:
        from mlflow.entities import Param

        self.client = client
        self.pending: list[Metric] = []
        self.last = time.monotonic()
        continued = run_id is not None
        with _quiet_mlflow():
            if run_id is None:
                exp = client.get_experiment_by_name(experiment)
                eid = exp.experiment_id if exp else client.create_experiment(experiment)
                run = client.create_run(eid, run_name=name, tags=dict(tags))
                run_id = run.info.run_id
                if resolved is not None:
                    params = [
                        Param(k, v[:6000]) for k, v in scenario_params(resolved).items()
                    ]
                    for i in range(0, len(params), 100):  # MLflow's batch limit
                        client.log_batch(run_id, params=params[i : i + 100])
            else:
                client.update_run(run_id, status="RUNNING")
        self.run_id: str = run_id
        self.logged = -1
        if continued:
            with _quiet_mlflow():
                held = client.get_metric_history(run_id, _EVERY_ROUND)
            self.logged = max((m.step for m in held), default=-1)

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        from mlflow.entities import Metric

        ms = int(time.time() * 1000)  # MLflow's timestamp: the host's clock
        self.pending += [Metric(k, v, ms, step) for k, v in metrics.items()]
        if time.monotonic() - self.last >= _FLUSH_S:
            self.flush()

    def flush(self) -> None:
        with _quiet_mlflow():
            for i in range(0, len(self.pending), 1000):  # MLflow's batch limit
                self.client.log_batch(self.run_id, metrics=self.pending[i : i + 1000])
        self.pending = []
        self.last = time.monotonic()

    def close(self, status: str) -> None:
        self.flush()
        done = {"completed": "FINISHED", "interrupted": "KILLED"}.get(status, "FAILED")
        with _quiet_mlflow():
            self.client.set_terminated(self.run_id, done)


class Tracker:
    """The trackers of one run: :meth:`on_round` is the runtime's per-round
    callback (``run_scenario(on_round=...)``); :meth:`close` ends the run.

    Args:
        kinds: ``tensorboard`` and/or ``mlflow`` (:func:`require` first).
        run_dir: the run's folder (event files; the MLflow run's id); its
            scenario.yaml, the resolved scenario, is what the trackers record.
        experiment: the MLflow experiment (the scenario's name).
        resume: the run continues an interrupted one: its trackers' runs
            go on, and the rounds they hold already are not sent again.
    """

    def __init__(
        self, kinds: Sequence[str], run_dir: Path, experiment: str, resume: bool = False
    ) -> None:
        resolved = (run_dir / "scenario.yaml").read_text(encoding="utf-8")
        self.sinks: list[_TensorBoard | _MLflow] = []
        for kind in kinds:
            if kind == "tensorboard":
                folder = run_dir / "tensorboard"
                self.sinks.append(_TensorBoard(folder, resolved, resume))
            elif kind == "mlflow":
                self.sinks.append(_mlflow_run(run_dir, experiment, resolved, resume))

    def on_round(self, row: Row, clients: Sequence[Row]) -> None:
        """Send one round (a ``run_scenario`` ``on_round`` callback) to each
        tracker that does not hold it yet (a resume trains again rounds the
        interrupted run had logged)."""
        step = whole(row["round"], "round")
        metrics = round_metrics(row, clients)
        for sink in self.sinks:
            if step > sink.logged:
                sink.log(step, metrics)
                sink.logged = step

    def close(self, status: str = "completed") -> None:
        """End every tracker's run with the fedsim run's ``status``."""
        for sink in self.sinks:
            sink.close(status)


def _mlflow_run(run_dir: Path, experiment: str, resolved: str, resume: bool) -> _MLflow:
    """The run's MLflow run: the one the run it resumes started, else a new
    one (also in a folder an overwritten run had logged from)."""
    keep = run_dir / "mlflow_run_id"
    client = mlflow_client()
    old = keep.read_text().strip() if keep.exists() else None
    old = old if resume else None
    tags = {"fedsim.run_dir": str(run_dir.resolve())}
    sink = _MLflow(client, experiment, run_dir.name, resolved, tags, old)
    if old is None:
        from fedsim.results import atomic_write_bytes

        atomic_write_bytes(keep, f"{sink.run_id}\n".encode())
    return sink


class Tracked:
    """What :func:`tracked` yields: the run's ``on_round`` callback (the
    caller's, then the trackers'), and ``status`` to set once the run ends."""

    def __init__(self, on_round: OnRound | None, tracker: Tracker | None):
        self.status = "interrupted"  # until the caller says how it ended

        def each(row: Row, clients: Sequence[Row]) -> None:
            if on_round is not None:
                on_round(row, clients)
            if tracker is not None:
                tracker.on_round(row, clients)

        self.on_round = each


@contextmanager
def tracked(
    kinds: Sequence[str] | None,
    run_dir: Path,
    experiment: str,
    on_round: OnRound | None = None,
    resume: bool = False,
) -> Iterator[Tracked]:
    """Track one ``fedsim run`` (nothing when ``kinds`` is empty): yields a
    :class:`Tracked` whose ``on_round`` goes to ``run_scenario``; on exit the
    trackers' runs end with the ``status`` the caller set (an exception
    leaves ``interrupted``).

    Args:
        kinds: the ``--log`` choices (checked with :func:`require` first).
        run_dir: the run's folder, with the resolved scenario.yaml written.
        experiment: the MLflow experiment (the scenario's name).
        on_round: the caller's own callback (progress), called first.
        resume: the run continues an interrupted one (:class:`Tracker`).
    """
    tracker = Tracker(kinds, run_dir, experiment, resume) if kinds else None
    out = Tracked(on_round, tracker)
    try:
        yield out
    finally:
        if tracker is not None:
            tracker.close(out.status)


class RunGroup:
    """A comparison's (or sweep's) tracked runs: one per arm and seed, sent
    when the run ends (its rows come back from a Ray task or the loop).

    Args:
        kinds: ``tensorboard`` and/or ``mlflow``.
        out_dir: the comparison's folder (event files under ``tensorboard/``).
        experiment: ``compare-<name>`` or ``stress-<name>``, the MLflow
            experiment; the comparison is its parent run, named after
            ``out_dir``.
    """

    def __init__(self, kinds: Sequence[str], out_dir: Path, experiment: str) -> None:
        self.kinds = list(kinds)
        self.out = out_dir
        self.client: MlflowClient | None = None
        self.parent: _MLflow | None = None
        if "mlflow" in self.kinds:
            self.client = mlflow_client()
            tags = {"fedsim.out_dir": str(out_dir.resolve())}
            self.parent = _MLflow(self.client, experiment, out_dir.name, None, tags)
            self.experiment = experiment

    def log_run(
        self, name: str, resolved: str, rows: Sequence[Row], **tags: str | int
    ) -> None:
        """One finished arm's rounds.

        Args:
            name: the run's name (``<arm>-seed<s>``, stress: with its cell).
            resolved: the arm's resolved scenario as YAML (its parameters).
            rows: its rounds.parquet rows.
            tags: ``arm``, ``seed``, ``cell``..., tagged ``fedsim.<key>``.
        """
        sinks = self._sinks(name, resolved, tags)
        for step, metrics in rows_metrics(rows):
            for sink in sinks:
                sink.log(step, metrics)
        for sink in sinks:
            sink.close("completed")

    def _sinks(
        self, name: str, resolved: str, tags: Mapping[str, str | int]
    ) -> list[_Sink]:
        """One arm's tracked runs: TensorBoard event files in its own folder,
        an MLflow child run of the comparison's parent run."""
        sinks: list[_Sink] = []
        if "tensorboard" in self.kinds:
            sinks.append(_TensorBoard(self.out / "tensorboard" / name, resolved))
        if self.parent is not None and self.client is not None:
            t = {f"fedsim.{k}": str(v) for k, v in tags.items()}
            t["mlflow.parentRunId"] = self.parent.run_id
            sinks.append(_MLflow(self.client, self.experiment, name, resolved, t))
        return sinks

    def close(self, status: str = "completed") -> None:
        """End the comparison's parent run."""
        if self.parent is not None:
            self.parent.close(status)


def run_group(
    kinds: Sequence[str],
    out: Path | None,
    tool: str,
    scenario_path: str | Path,
    overrides: Sequence[str],
) -> RunGroup | None:
    """compare's and stress's trackers: a :class:`RunGroup` named
    ``<tool>-<scenario name>`` (the MLflow experiment), None without ``kinds``.

    Raises:
        ValueError: trackers without an output folder.
    """
    if not kinds:
        return None
    if out is None:
        raise ValueError(f"{tool}: trackers need an output folder")
    from fedsim.scenario import load_scenario

    name = load_scenario(scenario_path, list(overrides)).name
    return RunGroup(kinds, out, f"{tool}-{name}")
