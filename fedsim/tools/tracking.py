"""Runs in the trackers researchers already watch: TensorBoard and MLflow.

``fedsim run --log tensorboard`` (or ``--log mlflow``, or both) sends every
round's row to a tracker as the run goes; ``compare`` and ``stress`` send one
tracked run per arm and seed, grouped under the comparison (docs/results.md,
"Trackers"). Both libraries are optional (``pip install 'fedsim[track]'``)
and imported only when asked for, so a run without ``--log`` imports
neither.

What a round sends (:func:`round_metrics`): every numeric column of its row
in rounds.parquet (test metrics, tau statistics, participation counts,
simulated and wall time, chi^2, and any column a plug-in adds), under a
readable tag (``test/accuracy``, ``tau/mean``, ``participation/dropped``),
plus the bytes its clients downloaded and uploaded (sums of clients.parquet's
``bytes_down`` and ``bytes_up``). NaN values (a round without evaluation) are
left out. The step is the round (asynchronous mode: the server version).

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
  (``fleet.groups.0.count``: MLflow allows no brackets). A resumed run logs
  into the MLflow run it started (its id is kept in
  ``<run dir>/mlflow_run_id``).

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
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypeGuard

import yaml

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


class TrackingUnavailable(ImportError):
    """A ``--log`` tracker whose library is not installed (the CLI exits 2)."""


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


def rows_metrics(rows: Sequence[Row]) -> Iterator[tuple[int, dict[str, float]]]:
    """(step, metrics) of finished round rows, without client rows (compare's
    and stress's runs): the uploads come from ``bytes_up_cum`` when present."""
    before = 0
    for row in rows:
        m = round_metrics({k: v for k, v in row.items() if k != "bytes_up_cum"}, [])
        if "bytes_up_cum" in row:
            m["bytes/up"] = float(whole(row["bytes_up_cum"]) - before)
            before = whole(row["bytes_up_cum"])
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


def require(kinds: Sequence[str]) -> None:
    """Refuse ``--log`` choices that are unknown or not installed.

    Raises:
        TrackingUnavailable: a library is missing (the message names the
            extra to install); ValueError: an unknown tracker.
    """
    for kind in kinds:
        if kind not in KINDS:
            raise ValueError(f"--log {kind!r}: expected one of {', '.join(KINDS)}")
        module = "tensorboard" if kind == "tensorboard" else "mlflow"
        try:
            __import__(module)
        except ImportError:
            raise TrackingUnavailable(
                f"--log {kind} needs the {module} package: {EXTRA}"
            ) from None


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
    """

    def __init__(self, folder: Path, resolved: str | None) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(folder), flush_secs=int(_FLUSH_S))
        if resolved is not None:
            # four spaces: TensorBoard's text plugin reads markdown
            text = "".join("    " + ln for ln in resolved.splitlines(True))
            self.writer.add_text("scenario", text, 0)

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        for tag, value in metrics.items():
            self.writer.add_scalar(tag, value, step)

    def close(self, status: str) -> None:
        self.writer.close()


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
        run_id: a run to continue (a resume) instead of a new one.
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
    """

    def __init__(self, kinds: Sequence[str], run_dir: Path, experiment: str) -> None:
        resolved = (run_dir / "scenario.yaml").read_text(encoding="utf-8")
        self.sinks: list[_Sink] = []
        for kind in kinds:
            if kind == "tensorboard":
                self.sinks.append(_TensorBoard(run_dir / "tensorboard", resolved))
            elif kind == "mlflow":
                self.sinks.append(_mlflow_run(run_dir, experiment, resolved))

    def on_round(self, row: Row, clients: Sequence[Row]) -> None:
        """Send one round (a ``run_scenario`` ``on_round`` callback)."""
        metrics = round_metrics(row, clients)
        for sink in self.sinks:
            sink.log(whole(row["round"], "round"), metrics)

    def close(self, status: str = "completed") -> None:
        """End every tracker's run with the fedsim run's ``status``."""
        for sink in self.sinks:
            sink.close(status)


def _mlflow_run(run_dir: Path, experiment: str, resolved: str) -> _MLflow:
    """The run's MLflow run: the one a resumed run started, else a new one."""
    keep = run_dir / "mlflow_run_id"
    client = mlflow_client()
    old = keep.read_text().strip() if keep.exists() else None
    tags = {"fedsim.run_dir": str(run_dir.resolve())}
    sink = _MLflow(client, experiment, run_dir.name, resolved, tags, old)
    if old is None:
        keep.write_text(sink.run_id + "\n")
    return sink


class Tracked:
    """What :func:`tracked` yields: the run's ``on_round`` callback (the
    caller's, then the trackers'), and ``status`` to set once the run ends."""

    def __init__(self, on_round: OnRound | None, tracker: Tracker | None):
        self.tracker = tracker
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
    """
    tracker = Tracker(kinds, run_dir, experiment) if kinds else None
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
