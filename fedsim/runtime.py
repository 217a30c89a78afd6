"""Run one scenario: the recipe behind ``fedsim run``, compare, stress, the
benchmarks and the tests. docs/architecture.md describes both loops
(synchronous rounds, asynchronous versions), the bytes rule and checkpoints.

Example:
    >>> from fedsim.scenario import load_scenario
    >>> res = run_scenario(load_scenario("scenarios/quickstart.yaml", ["rounds=2"]))
    >>> [r["round"] for r in res.rows], res.status
    ([0, 1], 'completed')
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from fedsim import (
    __version__,
    checkpoint,
    clock,
    hooks,
    interrupts,
    params,
    privacy,
    realised,
)
from fedsim.algorithms.base import (
    AggregateInfo,
    Failure,
    ServerWork,
)
from fedsim.algorithms.sampling import participation_bias, weight_shares
from fedsim.asyncrun import AsyncLoop
from fedsim.compression import upload_bytes
from fedsim.data import FederatedData, build_data
from fedsim.data.heldout import heldout_clients, with_heldout
from fedsim.data.partition import partition_table
from fedsim.data.validation import describe_validation, validation_use
from fedsim.errors import RunError
from fedsim.executors import (
    DataRecipe,
    Executor,
    ExecutorSetup,
    InProcessExecutor,
    Payloads,
    Placement,
)
from fedsim.facts import RunFacts
from fedsim.fleet import Fleet
from fedsim.flops import scenario_fleet, step_flops
from fedsim.hooks import PluginFailure
from fedsim.links import apply_links, summary_entry
from fedsim.models import NetworkSetup, make_model
from fedsim.records import (
    ClientRecord,
    Kept,
    Pair,
    Row,
    Trained,
    select,
    selector_columns,
)
from fedsim.remote.executor import RayExecutor
from fedsim.remote.server_actor import ServerLost, on_actor
from fedsim.results import (
    Recorder,
    atomic_write_bytes,
    check_free_space,
    first_divergence,
    summarize,
    write_arrow,
)
from fedsim.scenario import Scenario
from fedsim.secagg import RoundCost, aborted, secagg_model
from fedsim.selectors import Draw, Selector, SelectorContext, make_selector
from fedsim.selectors.base import SelectorState
from fedsim.selectors.chosen import AlgorithmChoice
from fedsim.server import (
    Applied,
    DivergenceError,
    RoundServer,
    Server,
    ServerSetup,
    Step,
    evaluates,
    federated_due,
    objective_due,
)
from fedsim.servertime import ServerTimer, server_clock
from fedsim.spec import EvalSpec
from fedsim.tasks import WorkerSetup, update_norm
from fedsim.workers import Task

# Tags of the run's random streams, each (seed, tag, n): distinct tags keep
# the selector's and the timeline's draws independent, and a stream is
# rebuilt from (seed, tag, round) on resume (nothing is saved).
_SELECT_TAG = 0x5E1
# Which clients a round's federated evaluation asks (eval.federated_clients):
# a stream of its own, so turning the evaluation on never moves training's
_FED_EVAL_TAG = 0xFEDE

RoundCallback = Callable[[Row, list[Row]], None]
# How a run ended (RunResult.status; the CLI maps each to an exit code)
Status = Literal["completed", "diverged", "stalled", "interrupted", "failed"]
# The traceback of a failed run, in its run directory (summary.json names it)
FAILURE_FILE = "failure.txt"


@dataclass(frozen=True)
class RunSetup:
    """Every part's set-up record, built once from the scenario by
    :func:`run_setup`: the runtime is the only reader of the
    :class:`~fedsim.scenario.Scenario` below the command line, and each part
    receives only its own small, frozen record (as the clock receives
    :class:`clock.RunContext`).

    Attributes:
        facts: what a plug-in's questions read (``bytes_per_client``,
            ``clock_work``).
        network: how the server and the workers build the network.
        worker: what every worker needs.
        server: what the server needs (in the driver or the actor).
        executor: what the executor needs (the workers', the resources,
            the data's recipe).
    """

    facts: RunFacts
    network: NetworkSetup
    worker: WorkerSetup
    server: ServerSetup
    executor: ExecutorSetup


def run_setup(scenario: Scenario) -> RunSetup:
    """The set-up records of a run of ``scenario`` (pure: the same scenario
    gives equal records, so a resumed run builds exactly what the first did).

    Args:
        scenario: the validated scenario.

    Returns:
        Every part's record (:class:`RunSetup`).
    """
    sc = scenario
    network = NetworkSetup(sc.model, sc.seed, sc.data.start_value)
    res = sc.resources
    worker = WorkerSetup(
        algorithm=sc.algorithm,
        network=network,
        client=sc.client,
        seed=sc.seed,
        rounds=sc.rounds,
        gpus=res.gpus_per_worker,
        vectorize=res.vectorize,
        # under fixed_window the clock's tau caps an own procedure's work
        capped=sc.round.policy == "fixed_window",
        threads=max(1, int(res.cpus_per_worker)),
        compression=sc.compression,
        privacy=sc.privacy,  # DP's clipping (and local noise) on the workers
    )
    validation = validation_use(sc.algorithm, sc.selector.clients_per_round)
    residuals = sc.compression is not None and sc.compression.error_feedback
    # DP's noise on the sum, added by the server (None: no DP, or local noise)
    noise = privacy.central_noise(sc.privacy, sc.seed)
    server = ServerSetup(
        sc.algorithm, network, sc.eval, validation, residuals, noise=noise
    )
    recipe = DataRecipe(sc.data, sc.num_clients, sc.seed, sc.fleet, sc.links)
    executor = ExecutorSetup(worker, res, recipe)
    return RunSetup(sc.facts, network, worker, server, executor)


class SetupError(RunError, OSError):
    """The run directory cannot take the run; nothing was trained."""


@dataclass
class RunResult:
    """What a run produced: rounds.parquet's ``rows``, clients.parquet's
    ``clients``, the final model (None unless ``completed``) and ``status``:
    ``completed``, ``diverged`` (NaN or infinite model or loss), ``stalled``
    (no further asynchronous version possible), ``interrupted``, or
    ``failed`` (plug-in code raised or broke a hook's contract: ``failure``
    says who, where and what; the rows so far and the last checkpoint are
    kept, so a resume continues once the plug-in is fixed)."""

    scenario: Scenario
    rows: list[Row]
    clients: list[Row]
    final_params: torch.Tensor | None
    status: Status
    message: str
    workers: int  # Ray worker actors (0: in-process)
    wall_time_s: float
    data: FederatedData | None = field(default=None, repr=False)
    initial: dict[str, float] | None = None  # x_0's accuracy, loss and t = 0.0
    # Ray runs: where the workers ran, nodes lost, tasks retried (summary.json)
    placement: dict[str, object] = field(default_factory=dict)
    fleet: Fleet | None = field(default=None, repr=False)  # declared vs realised
    # a failed run: plugin, hook, error, and the file holding the traceback
    failure: dict[str, str] | None = None

    def reraise_failure(self) -> None:
        """Raise the plug-in's failure again, for a caller that cannot
        record a failed run as such (compare and stress tables have no
        status column): a failed arm must not pass for a short run.

        Raises:
            PluginFailure: ``status`` is ``failed`` (its traceback is in
                the message's plug-in frames only when a run folder kept
                ``failure.txt``).
        """
        if self.status == "failed" and self.failure is not None:
            f = self.failure
            raise PluginFailure(f["plugin"], f["hook"], f["error"])

    def summary(self) -> Row:
        """summary.json's content, with ``status`` and ``degenerate``."""
        initial = None
        if self.initial is not None:  # JSON has no NaN: a missing value is null
            initial = {
                k: (v if math.isfinite(v) else None) for k, v in self.initial.items()
            }
        return {
            **summarize(
                self.rows,
                self.clients,
                scenario_name=self.scenario.name,
                wall_time_s=self.wall_time_s,
                workers=self.workers,
                version=__version__,
                server_validation=describe_validation(
                    validation_use(
                        self.scenario.algorithm,
                        self.scenario.selector.clients_per_round,
                    ),
                    self.data,
                ),
            ),
            **self.placement,
            "initial": initial,
            "status": self.status,
            # only a failed run has the key: other summaries stay as they were
            **({"failure": self.failure} if self.failure is not None else {}),
            # likewise only a run with federated evaluation
            **federated_entry(self.scenario.eval, self.data, self.rows),
            "degenerate": self.degenerate(),
            "participation_bias": self.participation_bias(),
            **summary_entry(self.scenario, self.data, self.clients),
            # what the fleet did beside what was declared (fedsim.realised)
            **realised.summary_entry(
                self.scenario, self.fleet, self.rows, self.clients
            ),
            # only a run with a privacy section: epsilon spent, and why
            **privacy.summary_entry(self.scenario, self.rows),
        }

    def participation_bias(self) -> dict[str, object] | None:
        """Each client's mean ``agg_weight`` (over rounds with updates) against
        its data share p_i (``sampling.participation_bias``); None without data."""
        if self.data is None:
            return None
        n = np.asarray(self.data.weights, dtype=np.float64)
        used = sum(int(r["n_completed"]) > 0 for r in self.rows)
        done = [c for c in self.clients if not c["dropped"]]
        w = [c["agg_weight"] for c in done]
        shares = weight_shares(n.size, [c["client_id"] for c in done], w, used)
        return participation_bias(shares, n / n.sum())

    def degenerate(self) -> str | None:
        """Why the run's numbers mean little, or None.

        Returns:
            A sentence for summary.json when no update ever reached the
            server, the test set is empty, or fewer than
            ``clients_per_round`` devices were online in most synchronous
            rounds; None when the run is meaningful (or has no rows).
        """
        if not self.rows:
            return None
        if sum(int(r["n_completed"]) for r in self.rows) == 0:
            return "no update ever reached the server"
        # The last round is always evaluated: NaN everywhere means an empty
        # test set (e.g. one sample per client, all of it kept for training).
        if all(math.isnan(float(r.get("test_loss", 0.0))) for r in self.rows):
            return "the test set is empty, so no round has a test loss or accuracy"
        return self._short_rounds()

    def _short_rounds(self) -> str | None:
        """Whether most synchronous rounds selected fewer than k devices."""
        # async has no rounds; a selector drawing with replacement returns
        # fewer distinct ids than clients_per_round when it draws one twice,
        # and one without a fixed count (independent participation) treats
        # clients_per_round as a cap, not as the number it selects
        sel = self.scenario.selector
        kind = type(sel)
        if self.scenario.round.policy == "async" or kind.with_replacement:
            return None
        if not kind.fixed_count or self.scenario.algorithm.chooses is not None:
            return None  # a cap, or the algorithm's own choice sets the count
        k = sel.clients_per_round
        short = sum(int(r["n_selected"]) < k for r in self.rows)
        if short > len(self.rows) / 2:
            return (
                f"fewer than clients_per_round = {k} devices were online in "
                f"{short} of {len(self.rows)} rounds"
            )
        return None


def federated_entry(
    spec: EvalSpec, data: FederatedData | None, rows: Sequence[Row]
) -> Row:
    """summary.json's ``federated_evaluation`` (only for a run with
    ``eval.federated_every`` > 0: other summaries stay as they were): the
    cadence, how many clients are asked (None: all with held-out rows), the
    held-out rows in all, and the last value of each ``fed_`` column.

    Args:
        spec: the run's ``eval`` section.
        data: the run's data (None: unknown, e.g. a run that never started).
        rows: rounds.parquet's rows so far.
    """
    if not spec.federated_every:
        return {}
    offsets = None if data is None else data.heldout_offsets
    final: dict[str, float] = {}
    for row in rows:  # the last finite value of each column
        final |= {k: float(v) for k, v in row.items() if _finite_fed(k, v)}
    entry = {
        "every": spec.federated_every,
        "clients": spec.federated_clients,
        "heldout_rows": None if offsets is None else int(offsets[-1]),
        "final": final,
    }
    return {"federated_evaluation": entry}


def _finite_fed(column: str, value: object) -> bool:
    """Whether a round row's cell is a federated evaluation's finite value
    (its other rounds hold null)."""
    return (
        column.startswith("fed_") and isinstance(value, float) and math.isfinite(value)
    )


class _Run:
    """One run's parts, built once, and what both loops share.

    Guarantees: every part is a pure function of the scenario (fleet, data,
    x_0, the per-run :class:`clock.RunContext`), so a resumed run rebuilds
    exactly what the interrupted one had; the host's clock feeds only the
    ``wall_time`` column. The server and the executor are placed by
    :meth:`start`.

    Args:
        sc: the validated scenario.
        run_dir: where results and checkpoints go (None: kept in memory).
        on_round: called with each round's row and client rows.
    """

    def __init__(
        self, sc: Scenario, run_dir: Path | None, on_round: RoundCallback | None
    ) -> None:
        self.sc = sc
        self.setup = run_setup(sc)
        self.run_dir = run_dir
        self.on_round = on_round
        self.asynchronous = sc.round.policy == "async"
        data = build_data(sc.data, sc.num_clients, sc.seed)
        # a speed in FLOP/s needs the model's FLOPs per step (fedsim.flops)
        self.fleet = scenario_fleet(sc.facts, data)
        # fleet-data links permute the partitions over the devices (none: as is)
        data = apply_links(sc.links, self.fleet, data, sc.seed, sc.fleet)
        # each client's own held-out rows (federated evaluation), taken
        # last: from the rows the device trains on once linked
        self.data = with_heldout(sc.data, data, sc.seed)
        # who can take part in federated evaluation (ascending ids)
        self.fed_clients = heldout_clients(self.data)
        self.threads = max(1, int(sc.resources.cpus_per_worker))
        torch.set_num_threads(self.threads)
        # the server (in the driver or the actor) and the executor, placed
        # together by start(); the loops call either home alike
        self.server: RoundServer
        self.executor: Executor
        self.recorder = Recorder(run_dir, asynchronous=self.asynchronous)
        # The constants every plan, the timeline and the selectors charge
        # for, in one frozen value (docs/architecture.md, "Bytes"); the
        # algorithm says what its clients send (a plug-in may override it).
        facts = self.setup.facts
        bytes_down, bytes_up = sc.algorithm.bytes_per_client(facts, self.num_params)
        # a compressed update is billed at its size on the wire
        bytes_up = self._compressed_upload(bytes_up)
        self.ctx = clock.RunContext(
            bytes_down=bytes_down,
            bytes_up=bytes_up,
            n_samples=self.data.n_samples,
            batch_size=sc.client.batch_size,
            # an algorithm whose client work is not local steps says its own
            work=sc.algorithm.clock_work(facts, self.data),
        )
        self._server_costs(bytes_up)
        self.groups = [str(g) for g in self.fleet.group_names]
        self.selector = make_selector(sc.selector)
        ctx = self.ctx
        self.sel_ctx = SelectorContext.from_run(
            self.fleet,
            ctx.n_samples,
            sc.round,
            ctx.batch_size,
            ctx.bytes_down,
            ctx.bytes_up,
            ctx.work,
        )
        # differential privacy's accountant (None: no privacy section); who
        # takes part decides the sample rate it may assume
        self.ledger = privacy.ledger(sc, self.fleet, self.ctx, self.sel_ctx)
        self.every = sc.checkpoint.every_rounds if run_dir is not None else 0
        # what each checkpoint stores of the scenario (resumes compare it)
        self.fingerprint = checkpoint.fingerprint(sc) if self.every else {}

    def _server_costs(self, bytes_up: int) -> None:
        """Set ``server_time`` (the server as a device; None: a free server,
        today's path exactly) and ``secagg`` (secure aggregation's costs;
        None: off), both billed at the server's speed.

        Args:
            bytes_up: one client's upload as billed (after compression).
        """
        sc, facts = self.sc, self.setup.facts
        clock_ = server_clock(
            sc.server,
            lambda: self.fleet.step_flops or step_flops(facts, self.data),
            sc.client.batch_size,
        )
        self.server_time: ServerTimer | None = None
        if clock_ is not None:
            self.server_time = ServerTimer(clock_, sc.algorithm, self.num_params)
        rate = math.inf if clock_ is None else clock_.flops_per_s
        spec, elem = sc.secure_aggregation, sc.model.elem_bytes
        self.secagg = secagg_model(spec, bytes_up, elem, rate)

    def _compressed_upload(self, bytes_up: int) -> int:
        """The upload with the scenario's compressor (as is without one).

        Raises:
            SetupError: the compressor cannot compress this model (a ``k``
                above its parameter count), one line before training.
        """
        comp, d = self.sc.compression, self.num_params
        if comp is None:
            return bytes_up
        problem = comp.problem(d)
        if problem is not None:
            raise SetupError(problem)
        return upload_bytes(comp, bytes_up, d, self.sc.model.elem_bytes)

    @cached_property
    def num_params(self) -> int:
        """d, the model's number of parameters (known before the server is
        placed: the byte counts and the clock need it first)."""
        return params.num_params(make_model(self.setup.network, self.data))

    def start(self, workers: int, resume: bool) -> None:
        """Place the server and the executor (:func:`place`), evaluate x_0
        and prepare the run directory.

        Args:
            workers: 0 trains in this process, n >= 1 on n Ray actors.
            resume: the run continues from a checkpoint (the partition's
                table and figure are already there).

        Raises:
            SetupError: the run directory cannot take the run, or the
                server actor is asked for without Ray workers.
        """
        self.server, self.executor = place(self.setup, self.data, workers, self.threads)
        # an algorithm that chooses its own clients (Algorithm.chooses: one
        # that adapts another framework's server strategy) does so on top
        # of the selector; it reads the driver's server, and refuses an actor
        if self.sc.algorithm.chooses is not None and isinstance(self.server, Server):
            self.selector = AlgorithmChoice.around(
                self.selector, self.sc.algorithm, self.server, self.setup.facts
            )
        # x_0 is a pure function of (scenario, seed): a resume evaluates it again
        loss, acc = self.server.evaluate()
        self.initial = {"accuracy": acc, "loss": loss, "t": 0.0}
        if self.sc.eval.objective_every:  # F(x_0), only when asked for
            self.initial["objective"] = self.server.objective()
        if self.run_dir is not None:
            self._prepare(self.run_dir, resume)
        self.wall0 = time.perf_counter()  # rows' wall_time: training only

    def _prepare(self, run_dir: Path, resume: bool) -> None:
        """Room for two checkpoints; the partition's table (its figure,
        partition.png, is the report's: drawn from this table, so a run
        with ``--no-report`` spends nothing on plotting)."""
        sc = self.sc
        if self.every:
            d, elem = self.num_params, sc.model.elem_bytes
            keeps = self.setup.server.keeps_states
            need = checkpoint.checkpoint_bytes(d, elem, sc.num_clients, keeps)
            try:
                check_free_space(run_dir, need + 2**20, "checkpoints")
            except OSError as exc:
                raise SetupError(str(exc)) from None
        # label histograms: data with classes only (an objective has none)
        if not resume and self.data.num_classes > 0:
            try:
                table = partition_table(self.data)  # label histograms
                write_arrow(run_dir / "partition.parquet", table)
            except OSError as exc:
                raise SetupError(f"cannot write results: {exc}") from None

    def rng(self, tag: int, n: int) -> np.random.Generator:
        """A fresh generator for stream ``tag``'s ``n``-th draw (round, or
        the timeline's choice counter): pure in (seed, tag, n)."""
        return np.random.default_rng(np.random.SeedSequence([self.sc.seed, tag, n]))

    def record(
        self,
        t: int,
        sim_time: float,
        records: Sequence[ClientRecord],
        trained: Trained,
        applied: Applied,
        extra: Row,
        selector_rows: Sequence[Row] = (),
    ) -> None:
        """Add round (or version) ``t``'s rows to the recorder.

        Evaluates the model first when ``t`` is an evaluation round, so the
        row's test columns describe the model after ``applied``; likewise
        ``train_objective`` (a column only when ``eval.objective_every`` > 0:
        F(x) on its rounds, NaN on the others).

        Args:
            t: the round, or in asynchronous mode the version made.
            sim_time: the simulated time at which ``t`` ended.
            records: every device of ``t``, dropped ones included.
            trained: one :class:`Pair` per non-dropped record, in order.
            applied: what the server did with them.
            extra: mode-specific columns of the round row.
            selector_rows: the selector's artifact rows for ``t``.
        """
        nan = math.nan
        test_loss, test_acc = (
            self.server.evaluate()
            if evaluates(self.sc.eval, self.sc.rounds, t)
            else (nan, nan)
        )
        # the column only when asked for: other runs' tables stay as they were
        objective = {}
        if self.sc.eval.objective_every:
            due = objective_due(self.sc.eval, self.sc.rounds, t)
            objective["train_objective"] = self.server.objective() if due else nan
        done = [r.plan for r in records if not r.plan.dropped]
        row = {
            "round": t,
            "sim_time": sim_time,
            "wall_time": time.perf_counter() - self.wall0,
            "test_loss": test_loss,
            "test_accuracy": test_acc,
            "train_loss": applied.train_loss,
            "n_selected": len(records),
            "n_completed": len(done),
            "n_dropped": len(records) - len(done),
            **_tau_columns([p.tau for p in done]),
            "tau_eff": applied.info.tau_eff,
            "chi2_pw": applied.info.chi2_pw,
            **objective,
            **extra,
            # the algorithm's own scalars (AggregateInfo.metrics, checked
            # by the server): a column each, absent (null) in a step
            # without them, e.g. an empty round
            **{f"alg_{k}": v for k, v in applied.info.metrics.items()},
            # federated evaluation's columns, in its rounds only (null else)
            **self.federated(t),
        }
        # trained skips the dropped records: walk both in step
        it = iter(trained)
        these = [
            self.client_row(r, None if r.plan.dropped else next(it), applied)
            for r in records
        ]
        self.recorder.add(row, these, selector_rows)
        if self.on_round is not None:
            self.on_round(row, these)

    def federated(self, t: int) -> Row:
        """Round ``t``'s federated evaluation as rounds.parquet columns
        ``fed_<name>``: the clients evaluate the model after ``t``'s step on
        their own held-out rows (on the workers, forward passes only), and
        the algorithm's ``aggregate_evaluation`` turns their results, in
        client-id order, into named scalars. {} when ``t`` has none.

        It costs no simulated time (it runs beside the round, as the
        central evaluation does) and draws from no training stream.

        Raises:
            PluginFailure: the rule raised or returned other than named
                real numbers (naming the algorithm and the hook).
        """
        spec = self.sc.eval
        if not federated_due(spec, self.sc.rounds, t):
            return {}
        clients = self.fed_clients
        n = spec.federated_clients
        if n is not None and n < len(clients):
            # drawn per round from a stream of its own (seed, tag, round)
            pick = self.rng(_FED_EVAL_TAG, t).choice(len(clients), n, replace=False)
            clients = [clients[j] for j in sorted(pick.tolist())]
        results = self.executor.evaluate(self.server.params(), clients, spec.batch_size)
        alg = self.sc.algorithm
        plugin, hook = hooks.algorithm_label(alg.name), "aggregate_evaluation"
        out = hooks.call(plugin, hook, alg.aggregate_evaluation, results, t)
        metrics = hooks.check_metrics(plugin, hook, out)
        return {f"fed_{k}": v for k, v in metrics.items()}

    def client_row(
        self, r: ClientRecord, trained: Pair | None, applied: Applied
    ) -> Row:
        """One row of clients.parquet.

        Args:
            r: the device's record.
            trained: its update and effective weight; None when it dropped
                (no update: weight 0 and NaN update columns).
            applied: the server's step, for ``agg_weight`` and the
                algorithm's per-client flag columns.
        """
        u, weight = trained or (None, 0.0)
        p = r.plan
        row: Row = {
            "round": r.round,
            "client_id": p.client,
            "device_group": self.groups[int(self.fleet.group[p.client])],
            "tau": p.tau,
            "t_start": p.t_start,
            "t_arrive": p.t_arrive,
            "dropped": p.dropped,
            "drop_reason": p.reason,
            "slowdown": p.slowdown,
            "weight": weight,
            "agg_weight": 0.0 if u is None else applied.shares.get(p.client, weight),
            "update_norm": update_norm(u) if u is not None else math.nan,
            "train_loss": u.train_loss if u is not None else math.nan,
            "bytes_down": self.ctx.bytes_down,
            "bytes_up": self._bytes_up(p.client, u) if r.uploaded else 0,
            **(applied.info.flags.get(p.client, {}) if u is not None else {}),
        }
        if r.job is not None:
            row |= r.job._asdict()
        return row

    def _bytes_up(self, client: int, u: Kept | None) -> int:
        """What ``client``'s upload weighed (billed only if it arrived):
        the update's own size when it says one, else the algorithm's upload
        size for this client, else the model-sized default."""
        work = self.ctx.work
        if u is None and work is not None:  # uploaded, then not used
            return int(work.bytes_up[client])
        if u is None or u.bytes_up is None:
            return self.ctx.bytes_up
        return u.bytes_up

    def save_checkpoint(
        self,
        next_round: int,
        sim_time: float,
        state: SelectorState,
        payloads: Payloads,
    ) -> None:
        """Save the state after ``next_round`` rounds (or versions).

        The rows are flushed first and ``LATEST`` moves last, so a crash at
        any point leaves the previous checkpoint usable.

        Args:
            next_round: the first round (or version) a resume will run.
            sim_time: the simulated time at that point.
            state: the selector's state (JSON-able).
            payloads: by version; those older than ``next_round`` are the
                versions jobs in flight started from, and are saved.
        """
        assert self.run_dir is not None
        self.recorder.flush()
        ckpt = checkpoint.checkpoint_dir(self.run_dir, next_round)
        self.server.save(ckpt)
        old = sorted(v for v in payloads if v < next_round)
        for v in old:
            checkpoint.save_tensors(ckpt / f"payload-{v:08d}.pt", payloads[v])
        checkpoint.write_meta(
            ckpt,
            {
                "next_round": next_round,
                "sim_time": sim_time,
                "selector_state": state,
                "payload_versions": old,
                "n_rows": len(self.recorder.rows),
                "n_client_rows": len(self.recorder.clients),
                "n_selector_rows": len(self.recorder.selector_rows),
            },
        )
        checkpoint.write_fingerprint(ckpt, self.fingerprint)
        checkpoint.commit_checkpoint(self.run_dir, ckpt)

    def restore(self) -> checkpoint.Checkpoint:
        """Load the latest checkpoint (server, client store, rows); return it.

        Raises:
            CheckpointError: no usable checkpoint, or one outside ``rounds``.
        """
        assert self.run_dir is not None
        ck = checkpoint.latest_checkpoint(self.run_dir)
        if not 0 < ck.next_round <= self.sc.rounds:
            raise checkpoint.CheckpointError(
                f"{ck.path}: round {ck.next_round} is not in this run "
                f"(rounds: {self.sc.rounds})"
            )
        self.server.load(ck.path)
        self.recorder.load(ck.n_rows, ck.n_client_rows, ck.n_selector_rows)
        if self.server_time is not None:
            self.server_time.restore(self.recorder.rows)
        if self.recorder.rows:  # wall time counts the whole run, resumes included
            self.wall0 -= float(self.recorder.rows[-1]["wall_time"])
        return ck

    def due(self, done: int) -> bool:
        """Whether a checkpoint is due after ``done`` rounds or versions."""
        return bool(self.every) and (done % self.every == 0 or done == self.sc.rounds)

    def observe(
        self,
        sel: Selector,
        state: SelectorState,
        t: int,
        applied: Applied,
        trained: Trained,
    ) -> tuple[SelectorState, list[Row]]:
        """The selector learns round (or version) ``t``.

        Args:
            sel: the selector (possibly resized by ``with_slots``).
            state: its state before ``t``.
            t: the round or version just applied.
            applied: the server's step.
            trained: each aggregated update with its effective weight.

        Returns:
            The selector's new state and its artifact rows for ``t``.
        """
        plugin = hooks.selector_label(getattr(sel, "name", type(sel).__name__))
        result = applied.result(trained)
        state = hooks.call(
            plugin, "observe", sel.observe, state, t, result, self.sel_ctx
        )
        hooks.check_json(plugin, "observe", state)
        rows = hooks.call(plugin, "artifact", sel.artifact, state, t)
        return state, [{"round": t, **r} for r in rows]


def _close(run: _Run) -> dict[str, object]:
    """Flush the rows and release the actors (even when the disk is full);
    return where the work and the server ran, for summary.json."""
    placement: dict[str, object] = {}
    try:
        run.recorder.flush()
    finally:
        try:
            placement = {**run.executor.report(), "server": run.server.report()}
        finally:
            run.executor.shutdown()
            run.server.shutdown()
    return placement


def _tau_columns(taus: Sequence[int]) -> Row:
    """A round row's tau statistics over the devices that did not drop
    (NaN when none is left)."""
    a = np.array(taus, dtype=np.float64)
    if not len(a):
        return {"tau_mean": math.nan, "tau_min": math.nan, "tau_max": math.nan}
    return {
        "tau_mean": float(a.mean()),
        "tau_min": float(a.min()),
        "tau_max": float(a.max()),
    }


def _over_selection(run: _Run) -> tuple[Selector, int | None]:
    """The selector a round asks, and how many arrivals it keeps.

    With ``round.over_select`` > 1 a round asks for ceil(over_select k)
    devices and keeps the first k arrivals; the selector is resized with
    ``with_slots`` so that a selector with a candidate ratio keeps it (as
    for free asynchronous slots). Otherwise: the selector, keep None.
    """
    sc, sel = run.sc, run.selector
    if sc.round.over_select <= 1:
        return sel, None
    k = sc.selector.clients_per_round
    # round(.., 9): 1.1 * 50 is 55.00000000000001 in floats, whose ceil
    # would ask for one device more than the scenario means
    asked = math.ceil(round(sc.round.over_select * k, 9))
    return sel.with_slots(min(asked, run.fleet.size)), k


def _run_rounds(run: _Run, resume: bool) -> None:
    """The synchronous loop: select, plan (SimPy), train, apply, record.

    Each round's randomness comes from (seed, tag, round), and the round
    starts at the first instant a device is online, so a resumed run
    continues with exactly the rounds an uninterrupted one would run.
    """
    sc, sel = run.sc, run.selector
    sel, keep = _over_selection(run)
    state = sel.init(run.sel_ctx)
    start, now = 0, 0.0
    if resume:
        ck = run.restore()
        start, now, state = ck.next_round, ck.sim_time, ck.selector_state
    for t in range(start, sc.rounds):
        interrupts.before_round()  # a Ctrl-C during the last round stops here
        now = run.fleet.next_online_time(now)
        online = np.flatnonzero(run.fleet.online(now))
        draw = Draw(t, online, run.rng(_SELECT_TAG, t), run.sel_ctx)
        chosen, state = select(sel, state, draw)
        # each device's draws are its own, of (seed, device, t): fleet.round_draws
        ctx = (
            run.ctx if run.secagg is None else run.secagg.context(run.ctx, len(chosen))
        )
        plan = clock.plan_round(run.fleet, chosen, now, sc.round, t, ctx, keep)
        secagg = _secagg_round(run, len(chosen), plan)
        trained: list[Pair] = []
        if secagg is not None and secagg.failed:  # nothing to unmask, nothing applied
            plan, applied = aborted(plan), _NOTHING_APPLIED
        else:
            mult = sel.multiplicity(state, chosen)
            trained, applied = _train_round(run, t, plan, mult)
        state, artifact = run.observe(sel, state, t, applied, trained)
        records = [ClientRecord.from_plan(t, p) for p in plan.plans]
        extra = selector_columns(sel, state, t)
        now, work = plan.t_end, applied.server_work
        if secagg is not None:  # the unmasking exchange, then the server's part
            now += secagg.unmask_s
            work = work + ServerWork(flops=secagg.server_flops)
            extra |= secagg.columns
        if run.server_time is not None:  # the next round waits for the server
            now, busy = run.server_time.round_end(now, len(applied.clients), work)
            extra |= busy
        if run.ledger is not None:  # the privacy spent after round t
            extra |= run.ledger.columns(t)
        run.record(t, now, records, trained, applied, extra, artifact)
        if run.due(t + 1):
            run.save_checkpoint(t + 1, now, state, {})


# A failed secure aggregation's step: no update, the state untouched.
_NOTHING_APPLIED = Applied(AggregateInfo({}, math.nan, math.nan), (), math.nan)


def _secagg_round(run: _Run, n: int, plan: clock.RoundPlan) -> RoundCost | None:
    """Secure aggregation's unmasking (or failure) in a round of ``n``
    chosen devices; None when the scenario has none."""
    return None if run.secagg is None else run.secagg.round_cost(n, plan, run.fleet)


def _train_round(
    run: _Run, t: int, plan: clock.RoundPlan, multiplicity: dict[int, int] | None
) -> tuple[list[Pair], Applied]:
    """Train round ``t``'s non-dropped devices for their tau and apply them.

    Args:
        run: the run's parts.
        t: the round (it seeds each client's minibatches).
        plan: the clock's plan of the round.
        multiplicity: how often the selector drew each client (None: once).

    Returns:
        Each update with its effective weight, in the plan's order, and
        what the server did.
    """
    server = run.server
    tasks = [Task(p.client, t, p.tau, t) for p in plan.plans if not p.dropped]
    clients = [task.client for task in tasks]
    # per-client payload entries, only for an algorithm that gives them (a
    # server actor would otherwise answer an empty call every round)
    own = server.instructions(clients, t) if run.sc.algorithm.instructs else {}
    # a server actor gets references: the updates do not pass through here
    ups, parcels = run.executor.train_apart(
        tasks, {t: server.payload()}, server.client_states(clients), own
    )
    run.executor.forget(t)
    # the selected clients whose updates the step will not have, and why
    lost = [Failure(p.client, p.reason) for p in plan.plans if p.dropped]
    at = Step(f"round {t}", t, multiplicity=multiplicity, failures=lost)
    applied = server.apply(parcels, at)
    # the ordering contract: weights come in applied.clients' order (by id)
    w = dict(zip(applied.clients, applied.weights, strict=True))
    return [Pair(u, w[u.client]) for u in ups], applied


def async_timeline(scenario: Scenario) -> clock.AsyncTimeline:
    """A fresh asynchronous timeline of ``scenario``, exactly as a run sees
    it, without training (an adaptive selector observes nothing here)."""
    return AsyncLoop(_Run(scenario, None, None), None).tl


def run_scenario(
    scenario: Scenario,
    *,
    workers: int = 0,
    run_dir: Path | str | None = None,
    resume: bool = False,
    on_round: RoundCallback | None = None,
    max_lookahead: int | None = None,
) -> RunResult:
    """Run every (remaining) round or server version of ``scenario``.

    Args:
        workers: 0 trains in this process; ``n >= 1`` uses ``n`` Ray worker
            actors (Ray must be initialised:
            :func:`fedsim.remote.ray_session.init_ray`).
        run_dir: where rows (Parquet, written as the run goes) and
            checkpoints (every ``checkpoint.every_rounds``) go.
        on_round: called with each round's row and client rows (progress).
        max_lookahead: asynchronous mode: at most this many version records
            held ahead of the model (default about four job lifetimes; 1
            with an adaptive selector); the results do not depend on it.

    Returns:
        A :class:`RunResult`, also when the run diverges or is interrupted.

    Raises:
        SetupError, CheckpointError (``resume`` without a usable checkpoint),
        OSError (results not written), fedsim.data.DataError.
    """
    run_dir = Path(run_dir) if run_dir is not None else None
    if resume:
        _check_resume(scenario, run_dir)  # fail before building or writing
    run = _Run(scenario, run_dir, on_round)
    run.start(workers, resume)
    status: Status = "completed"
    message = ""
    failed: PluginFailure | None = None
    final: torch.Tensor | None = None  # the model, once every round is done
    try:
        with interrupts.round_loop():  # the CLI's Ctrl-C waits for a round's end
            if run.asynchronous:
                AsyncLoop(run, max_lookahead).loop(resume)
            else:
                _run_rounds(run, resume)
        final = run.server.params().clone()  # before a server actor goes
    except DivergenceError as exc:
        status, message = "diverged", str(exc)
    except clock.Stalled as exc:
        status, message = "stalled", str(exc)
    except KeyboardInterrupt:
        status, message = "interrupted", "interrupted"
    except ServerLost as exc:  # stop at the last checkpoint, like Ctrl-C
        status, message = "interrupted", str(exc)
    except (PluginFailure, SystemExit) as exc:  # plug-in code: the rows stay
        failed = _plugin_failure(scenario, exc)
        status, message = "failed", str(failed)
    finally:
        placement = _close(run)
    if status == "completed" and (why := first_divergence(run.recorder.rows)):
        status, message = "diverged", why  # a finite loss beyond the bound
        final = None
    if status == "completed" and run_dir is not None:
        # a resume after the plug-in was fixed: the old traceback is history
        (run_dir / FAILURE_FILE).unlink(missing_ok=True)
    return RunResult(
        scenario=scenario,
        rows=run.recorder.rows,
        clients=run.recorder.clients,
        final_params=final,
        status=status,
        message=message,
        workers=workers,
        wall_time_s=time.perf_counter() - run.wall0,
        data=run.data,
        initial=run.initial,
        placement=placement,
        fleet=run.fleet,
        failure=None if failed is None else _failure_record(failed, run_dir),
    )


def _check_resume(scenario: checkpoint.Resolvable, run_dir: Path | None) -> None:
    """Everything a resume of ``run_dir`` reads, and that its checkpoint is
    of ``scenario``'s experiment: a checkpoint of another one (another seed,
    lr, ...) would finish "completed" with two runs' rows mixed, so it is
    refused as the command line refuses it, naming every differing field.

    Raises:
        ValueError: no run directory.
        CheckpointError: a file is missing or damaged, or the fingerprints
            differ.
    """
    if run_dir is None:
        raise ValueError("resume needs the run directory")
    checkpoint.check_resumable(run_dir)
    checkpoint.check_fingerprint(run_dir, scenario, missing_ok=True)


def _plugin_failure(
    scenario: Scenario, exc: PluginFailure | SystemExit
) -> PluginFailure:
    """``exc`` as the run's failure: a PluginFailure as it is; a SystemExit
    (plug-in code that called ``sys.exit`` outside the hooks that wrap it,
    a client's) as the algorithm's failure in "a client". Call it in the
    ``except`` block: the traceback is the current one."""
    if isinstance(exc, PluginFailure):
        return exc
    return hooks.failure(
        hooks.algorithm_label(scenario.algorithm.name), "a client", exc
    )


def _failure_record(exc: PluginFailure, run_dir: Path | None) -> dict[str, str]:
    """summary.json's ``failure`` of a failed run, after writing its full
    traceback into the run directory (:data:`FAILURE_FILE`).

    The traceback is the plug-in's own (from a Ray worker or the server
    actor too: it travels as text inside the error). A hook that returned
    the wrong thing raised nothing, and its file says so.
    """
    record = exc.record()
    if run_dir is None:
        return record
    why = exc.trace or (
        "No exception was raised: the hook returned something its contract "
        "does not allow (above), found by fedsim's check of its result.\n"
    )
    text = f"{exc}\n\n{why}"
    try:
        atomic_write_bytes(run_dir / FAILURE_FILE, text.encode())
    except OSError:  # the rows and summary matter more than this file
        return record
    return {**record, "traceback": FAILURE_FILE}


def make_executor(setup: ExecutorSetup, data: FederatedData, workers: int) -> Executor:
    """The run's executor, chosen once: in-process for ``workers == 0``,
    else ``workers`` Ray actors (Ray must be initialised).

    Args:
        setup: the executor's set-up record.
        data: the federated dataset.
        workers: 0, or the number of Ray worker actors.
    """
    if workers == 0:
        return InProcessExecutor(setup.worker, data)
    return RayExecutor(setup, data, workers)


def place(
    setup: RunSetup, data: FederatedData, workers: int, threads: int
) -> Placement:
    """The run's server and executor, asked once of the side
    ``resources.server.home`` names: the server in this process beside
    :func:`make_executor`'s executor, or the Ray workers first and the
    server actor placed with them (:func:`fedsim.remote.server_actor.on_actor`).

    Args:
        setup: the run's set-up records.
        data: the federated dataset.
        workers: 0 trains in this process, n >= 1 on n Ray actors.
        threads: torch's threads in a server actor (the driver's figure).

    Raises:
        SetupError: the server actor is asked for without Ray workers.
        PlacementError: the actors cannot be placed in time.
    """
    if setup.executor.resources.server.home == "driver":
        server = Server(setup.server, data)
        return Placement(server, make_executor(setup.executor, data, workers))
    if workers == 0:
        raise SetupError(
            "resources.server.home actor needs Ray: run with --workers >= 1 "
            "(or home: driver)"
        )
    return on_actor(setup.executor, setup.server, data, workers, threads)
