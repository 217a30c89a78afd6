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
from collections import Counter, deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast

import numpy as np
import torch

from fedsim import __version__, checkpoint, clock
from fedsim.algorithms.base import AsyncRule, ClientUpdate
from fedsim.algorithms.sampling import participation_bias, weight_shares
from fedsim.data import FederatedData, build_data
from fedsim.data.partition import partition_table, plot_partition
from fedsim.data.validation import describe_validation
from fedsim.executors import Executor, make_executor
from fedsim.fleet import Fleet
from fedsim.params import l2_norm
from fedsim.results import Recorder, check_free_space, summarize, write_arrow
from fedsim.scenario import Scenario
from fedsim.selectors import Draw, Selector, SelectorContext, make_selector
from fedsim.server import Applied, DivergenceError, Server, evaluates
from fedsim.workers import Payload, Task

_SELECT_TAG = 0x5E1
_CLOCK_TAG = 0xC10C
_ASYNC_SELECT_TAG = 0xD15C  # the timeline's dispatch stream: (seed, tag, n)

Row = dict[str, Any]
RoundCallback = Callable[[Row, list[Row]], None]
Pair = tuple[ClientUpdate, float]  # an update and its effective weight
Trained = Sequence[Pair]


class SetupError(OSError):
    """The run directory cannot take the run; nothing was trained."""


@dataclass
class RunResult:
    """What a run produced: rounds.parquet's ``rows``, clients.parquet's
    ``clients``, the final model (None unless ``completed``) and ``status``:
    ``completed``, ``diverged`` (NaN or infinite model or loss), ``stalled``
    (no further asynchronous version possible) or ``interrupted``."""

    scenario: Scenario
    rows: list[Row]
    clients: list[Row]
    final_params: torch.Tensor | None
    status: Literal["completed", "diverged", "stalled", "interrupted"]
    message: str
    workers: int  # Ray worker actors (0: in-process)
    wall_time_s: float
    data: FederatedData | None = field(default=None, repr=False)
    initial: dict[str, float] | None = None  # x_0's accuracy, loss and t = 0.0
    # Ray runs: where the workers ran, nodes lost, tasks retried (summary.json)
    placement: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
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
                server_validation=describe_validation(self.scenario, self.data),
            ),
            **self.placement,
            "initial": initial,
            "status": self.status,
            "degenerate": self.degenerate(),
            "participation_bias": self.participation_bias(),
        }

    def participation_bias(self) -> dict[str, Any] | None:
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
        """Why the run's numbers mean little (no update, no test set, too few
        devices online in most synchronous rounds), or None."""
        if not self.rows:
            return None
        if sum(int(r["n_completed"]) for r in self.rows) == 0:
            return "no update ever reached the server"
        # The last round is always evaluated: NaN everywhere means an empty
        # test set (e.g. one sample per client, all of it kept for training).
        if all(math.isnan(float(r.get("test_loss", 0.0))) for r in self.rows):
            return "the test set is empty, so no round has a test loss or accuracy"
        # async has no rounds; a selector drawing with replacement returns
        # fewer distinct ids than clients_per_round when it draws one twice
        sel = self.scenario.selector
        if self.scenario.round.policy == "async" or type(sel).with_replacement:
            return None
        k = sel.clients_per_round
        short = sum(int(r["n_selected"]) < k for r in self.rows)
        if short > len(self.rows) / 2:
            return (
                f"fewer than clients_per_round = {k} devices were online in "
                f"{short} of {len(self.rows)} rounds"
            )
        return None


@dataclass(frozen=True)
class ClientRecord:
    """One client row: the clock's plan, whether the upload reached the server
    (billed), and in asynchronous mode (``round``: the version at arrival) the
    job (version started, version applied or None, staleness or None, index)."""

    round: int
    plan: clock.Plan
    uploaded: bool
    job: tuple[int, int | None, int | None, int] | None = None

    @classmethod
    def from_plan(cls, t: int, p: clock.Plan) -> ClientRecord:
        # Late and surplus updates were uploaded; the server did not use them.
        return cls(t, p, uploaded=not p.dropped or p.reason in ("late", "surplus"))

    @classmethod
    def from_arrival(cls, a: clock.Arrival) -> ClientRecord:
        applied = None if a.dropped else a.version
        job = (a.job.version, applied, a.staleness, a.job.index)
        # a stale update was sent, then refused
        return cls(a.version, a.plan, a.status in ("applied", "stale"), job)


class _Run:
    """One run's parts, built once, and what both loops share."""

    def __init__(
        self, sc: Scenario, run_dir: Path | None, on_round: RoundCallback | None
    ) -> None:
        self.sc = sc
        self.run_dir = run_dir
        self.on_round = on_round
        self.asynchronous = sc.round.policy == "async"
        self.fleet = Fleet.from_spec(sc.fleet, sc.seed)
        self.data = build_data(sc.data, sc.num_clients, sc.seed)
        torch.set_num_threads(max(1, int(sc.resources.cpus_per_worker)))
        self.server = Server(sc, self.data)
        self.recorder = Recorder(run_dir, asynchronous=self.asynchronous)
        d, elem = self.server.num_params, sc.model.elem_bytes
        self.bytes_down = sc.algorithm.down_factor * d * elem
        self.bytes_up = sc.algorithm.up_factor * d * elem
        self.work = job_work(sc, self.data)  # FedDM: its iterations and upload
        self.groups = [str(g) for g in self.fleet.group_names]
        self.selector = make_selector(sc.selector)
        self.sel_ctx = SelectorContext.from_run(
            self.fleet,
            self.data.n_samples,
            sc.round,
            sc.client.batch_size,
            self.bytes_down,
            self.bytes_up,
            self.work,
        )
        self.every = sc.checkpoint.every_rounds if run_dir is not None else 0

    @classmethod
    def plan_only(cls, scenario: Scenario) -> _Run:
        """The run's parts without executor or results (no training)."""
        return cls(scenario, None, None)

    def start(self, workers: int, resume: bool) -> None:
        # x_0 is a pure function of (scenario, seed): a resume evaluates it again
        loss, acc = self.server.evaluate()
        self.initial = {"accuracy": acc, "loss": loss, "t": 0.0}
        if self.run_dir is not None:
            self._prepare(self.run_dir, resume)
        self.executor: Executor = make_executor(self.sc, self.data, workers)
        self.wall0 = time.perf_counter()  # rows' wall_time: training only

    def _prepare(self, run_dir: Path, resume: bool) -> None:
        """Room for two checkpoints; the partition's table and figure."""
        sc, alg = self.sc, self.sc.algorithm
        if self.every:
            d, elem = self.server.num_params, sc.model.elem_bytes
            need = checkpoint.checkpoint_bytes(d, elem, sc.num_clients, alg.stateful)
            try:
                check_free_space(run_dir, need + 2**20, "checkpoints")
            except OSError as exc:
                raise SetupError(str(exc)) from None
        if not resume and sc.data.dataset != "quadratic":
            try:
                table = partition_table(self.data)  # label histograms
                write_arrow(run_dir / "partition.parquet", table)
                plot_partition(table, run_dir / "partition.png")
            except OSError as exc:
                raise SetupError(f"cannot write results: {exc}") from None

    def rng(self, tag: int, n: int) -> np.random.Generator:
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
        """Add round (or version) ``t``'s rows; ``trained`` pairs each
        non-dropped record's update (in order) with its effective weight."""
        nan = math.nan
        test_loss, test_acc = (
            self.server.evaluate() if evaluates(self.sc, t) else (nan, nan)
        )
        done = [r.plan for r in records if not r.plan.dropped]
        taus = np.array([p.tau for p in done], dtype=np.float64)
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
            "tau_mean": float(taus.mean()) if len(taus) else nan,
            "tau_min": float(taus.min()) if len(taus) else nan,
            "tau_max": float(taus.max()) if len(taus) else nan,
            "tau_eff": applied.info.tau_eff,
            "chi2_pw": applied.info.chi2_pw,
            **extra,
        }
        it = iter(trained)
        these = [
            self.client_row(r, None if r.plan.dropped else next(it), applied)
            for r in records
        ]
        self.recorder.add(row, these, selector_rows)
        if self.on_round is not None:
            self.on_round(row, these)

    def client_row(
        self, r: ClientRecord, trained: Pair | None, applied: Applied
    ) -> Row:
        u, weight = trained or (None, 0.0)
        up = self.bytes_up if u is None or u.bytes_up is None else u.bytes_up
        if u is None and self.work is not None:  # uploaded, then not used
            up = int(self.work.bytes_up[r.plan.client])
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
            "update_norm": l2_norm(u.delta) if u is not None else math.nan,
            "train_loss": u.train_loss if u is not None else math.nan,
            "bytes_down": self.bytes_down,
            "bytes_up": up if r.uploaded else 0,
            **(applied.info.flags.get(p.client, {}) if u is not None else {}),
        }
        if r.job is not None:
            keys = ("version_started", "version_applied", "staleness", "job")
            row |= dict(zip(keys, r.job, strict=True))
        return row

    def save_checkpoint(
        self, next_round: int, sim_time: float, state: Any, payloads: dict[int, Payload]
    ) -> None:
        """Save the state after ``next_round`` rounds (or versions); ``state``:
        the selector's; ``payloads``: the versions jobs in flight started from."""
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
        checkpoint.write_fingerprint(ckpt, self.sc)
        checkpoint.commit_checkpoint(self.run_dir, ckpt)

    def restore(self) -> checkpoint.Checkpoint:
        """Load the latest checkpoint (server, client store, rows); return it."""
        assert self.run_dir is not None
        ck = checkpoint.latest_checkpoint(self.run_dir)
        if not 0 < ck.next_round <= self.sc.rounds:
            raise checkpoint.CheckpointError(
                f"{ck.path}: round {ck.next_round} is not in this run "
                f"(rounds: {self.sc.rounds})"
            )
        self.server.load(ck.path)
        self.recorder.load(ck.n_rows, ck.n_client_rows, ck.n_selector_rows)
        if self.recorder.rows:  # wall time counts the whole run, resumes included
            self.wall0 -= float(self.recorder.rows[-1]["wall_time"])
        return ck

    def due(self, done: int) -> bool:
        """Whether a checkpoint is due after ``done`` rounds or versions."""
        return bool(self.every) and (done % self.every == 0 or done == self.sc.rounds)

    def observe(
        self, sel: Selector, state: Any, t: int, applied: Applied, trained: Trained
    ) -> tuple[Any, list[Row]]:
        """The selector learns round (or version) ``t``: its state and rows."""
        state = sel.observe(state, t, applied.result(trained), self.sel_ctx)
        return state, [{"round": t, **r} for r in sel.artifact(state, t)]


def job_work(sc: Scenario, data: FederatedData) -> clock.JobWork | None:
    """What the clock charges an algorithm whose client work is not local
    SGD steps, as the algorithm states it (``Algorithm.clock_work``: e.g. the
    iterations and upload of a synthetic set); None for the rest."""
    return sc.algorithm.clock_work(sc, data)


def _run_rounds(run: _Run, resume: bool) -> None:
    sc, server, sel = run.sc, run.server, run.selector
    keep: int | None = None
    if sc.round.over_select > 1:  # ask for ceil(over_select k), keep k arrivals
        k = sc.selector.clients_per_round
        asked = math.ceil(round(sc.round.over_select * k, 9))
        # power-of-choice keeps its d / k ratio (as for free async slots)
        keep, sel = k, sel.with_slots(min(asked, run.fleet.size))
    state = sel.init(run.sel_ctx)
    start, now = 0, 0.0
    if resume:
        ck = run.restore()
        start, now, state = ck.next_round, ck.sim_time, ck.selector_state
    for t in range(start, sc.rounds):
        now = run.fleet.next_online_time(now)
        online = np.flatnonzero(run.fleet.online(now))
        draw = Draw(t, online, run.rng(_SELECT_TAG, t), run.sel_ctx)
        chosen, state = sel.select(state, draw)
        multiplicity = sel.multiplicity(state, chosen)
        plan = clock.plan_round(
            run.fleet,
            chosen,
            now,
            sc.round,
            run.rng(_CLOCK_TAG, t),
            run.bytes_down,
            run.bytes_up,
            run.data.n_samples,
            sc.client.batch_size,
            keep=keep,
            work=run.work,
        )
        records = [ClientRecord.from_plan(t, p) for p in plan.plans]
        tasks = [Task(p.client, t, p.tau, t) for p in plan.plans if not p.dropped]
        clients = [task.client for task in tasks]
        ups = run.executor.train(
            tasks, {t: server.payload()}, server.client_states(clients)
        )
        run.executor.forget(t)
        applied = server.apply(ups, multiplicity=multiplicity, where=f"round {t}")
        w = dict(zip(sorted(clients), applied.weights, strict=True))
        trained = [(u, w[u.client]) for u in ups]
        state, artifact = run.observe(sel, state, t, applied, trained)
        run.record(t, plan.t_end, records, trained, applied, {}, artifact)
        now = plan.t_end
        if run.due(t + 1):
            run.save_checkpoint(t + 1, now, state, {})


class _Async:
    """The asynchronous loop (docs/architecture.md, "Asynchronous mode")."""

    def __init__(self, run: _Run, max_lookahead: int | None) -> None:
        sc = run.sc
        self.run = run
        self.rule = cast(AsyncRule, sc.algorithm)  # the scenario checked it
        self.concurrency = sc.round.concurrency or sc.selector.clients_per_round
        default = 4 * math.ceil(self.concurrency / self.rule.buffer_size) + 4
        self.adaptive = run.selector.adaptive
        # adaptive: every choice waits for the versions before it
        self.max_lookahead = 1 if self.adaptive else max_lookahead or default
        self.sel_state = run.selector.init(run.sel_ctx)
        # adaptive selectors: every pick so far (choice n -> ids), which the
        # checkpoint keeps so that a resumed replay makes the same picks
        self.picks: list[list[int]] = []
        self.replay: list[list[int]] = []
        self.tl = clock.AsyncTimeline(
            run.fleet,
            sc.round,
            versions=sc.rounds,
            buffer_size=self.rule.buffer_size,
            concurrency=self.concurrency,
            seed=sc.seed,
            bytes_down=run.bytes_down,
            bytes_up=run.bytes_up,
            n_samples=run.data.n_samples,
            batch_size=sc.client.batch_size,
            choose=self._choose,
        )
        self.timeline: Iterator[clock.Version] = iter(self.tl)
        self.payloads: dict[int, Payload] = {}
        self.users: Counter[int] = Counter()  # version -> its jobs still open
        self.pending: deque[clock.Version] = deque()
        self.trained: dict[clock.Job, ClientUpdate] = {}
        self.w = 0  # the newest computed version

    def _choose(self, candidates: np.ndarray, free: int, n: int) -> np.ndarray:
        """The selector's n-th pick for the free slots (or the logged one)."""
        if n < len(self.replay):
            return np.asarray(self.replay[n], dtype=np.int64)
        run = self.run
        rng = run.rng(_ASYNC_SELECT_TAG, n)
        draw = Draw(self.tl.version, candidates, rng, run.sel_ctx)
        ids, self.sel_state = run.selector.with_slots(free).select(self.sel_state, draw)
        if self.adaptive:
            self.picks.append(ids.tolist())
        return ids

    def _restore(self) -> None:
        """Load the latest checkpoint and replay the timeline up to it."""
        run = self.run
        ck = run.restore()
        w = ck.next_round
        if self.adaptive:  # the picks up to the checkpoint, then its state
            self.replay = [list(ids) for ids in ck.selector_state["picks"]]
        for _ in range(w):
            rec = next(self.timeline)
            self.users.update(j.version for j in rec.started)
            self.users.subtract(a.job.version for a in rec.ended)
        try:
            for v in [v for v in range(w) if self.users[v] > 0]:
                path = ck.path / f"payload-{v:08d}.pt"
                self.payloads[v] = checkpoint.load_tensors(path)
        except OSError as exc:
            raise checkpoint.CheckpointError(
                f"{ck.path}: missing version parameters ({exc})"
            ) from None
        self.payloads[w] = run.server.payload()
        self.users = +self.users  # only the versions open jobs started from
        self.w = w
        if self.adaptive:
            self.sel_state = ck.selector_state["state"]
            self.picks, self.replay = self.replay, []

    def loop(self, resume: bool) -> None:
        if resume:
            self._restore()
        else:
            self.payloads[0] = self.run.server.payload()
        while self.w < self.run.sc.rounds:
            self._train(self._look_ahead())
            while self.pending and all(
                a.job in self.trained for a in self.pending[0].applied
            ):
                self._apply(self.pending.popleft())

    def _look_ahead(self) -> list[clock.Job]:
        """Pull records (docs/architecture.md); the jobs trainable now."""
        w, pending = self.w, self.pending
        ready = [a.job for r in pending for a in r.applied if a.job.version <= w]
        batch = [j for j in ready if j not in self.trained]
        while len(pending) < self.max_lookahead and (
            not pending
            or all(a.job.version <= w for a in pending[-1].applied)
            or len(batch) < self.concurrency
        ):
            rec = next(self.timeline, None)
            if rec is None:
                break
            pending.append(rec)
            self.users.update(j.version for j in rec.started)
            batch += [a.job for a in rec.applied if a.job.version <= w]
        return batch

    def _train(self, batch: list[clock.Job]) -> None:
        # The job index plays the round's part in the client's seed.
        tasks = [Task(j.device, j.index, j.tau, j.version) for j in batch]
        states = self.run.server.client_states([t.client for t in tasks])
        ups = self.run.executor.train(tasks, self.payloads, states)
        self.trained.update(zip(batch, ups, strict=True))

    def _apply(self, rec: clock.Version) -> None:
        run = self.run
        jobs = [a.job for a in rec.applied]
        ups = [self.trained.pop(j) for j in jobs]
        starts = [self.payloads[a.job.version]["x"] for a in rec.applied]
        staleness = [int(a.staleness or 0) for a in rec.applied]
        applied = run.server.apply(
            ups, staleness=staleness, starts=starts, where=f"version {rec.version}"
        )
        status = Counter(a.status for a in rec.ended)
        extra = {
            "staleness_mean": float(np.mean(staleness)),
            "staleness_max": int(max(staleness)),
            "n_stale": status["stale"],
            "n_offline": status["offline"],
            "n_started": len(rec.started),
            "in_flight": rec.in_flight,
        }
        by_job = dict(zip(jobs, zip(ups, applied.weights, strict=True), strict=True))
        trained = [by_job[a.job] for a in rec.ended if not a.dropped]
        records = [ClientRecord.from_arrival(a) for a in rec.ended]
        artifact: list[Row] = []
        if self.adaptive:  # in arrival order: a device's later update wins
            self.sel_state, artifact = run.observe(
                run.selector, self.sel_state, rec.version, applied, trained
            )
        run.record(rec.version, rec.t, records, trained, applied, extra, artifact)
        self.w += 1
        self._forget(rec)
        if run.due(self.w):
            state: Any = self.sel_state
            if self.adaptive:
                state = {"state": state, "picks": self.picks}
            run.save_checkpoint(self.w, rec.t, state, self.payloads)

    def _forget(self, rec: clock.Version) -> None:
        """Keep the new version; drop versions no open job started from."""
        w = self.w
        self.payloads[w] = self.run.server.payload()
        self.users.subtract(a.job.version for a in rec.ended)
        for v in [v for v in self.payloads if v < w and self.users[v] <= 0]:
            del self.payloads[v]
            self.users.pop(v, None)
            self.run.executor.forget(v)


def async_timeline(scenario: Scenario) -> clock.AsyncTimeline:
    """A fresh asynchronous timeline of ``scenario``, exactly as a run sees
    it, without training (an adaptive selector observes nothing here)."""
    return _Async(_Run.plan_only(scenario), None).tl


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
            actors (Ray must be initialised: :func:`fedsim.ray_session.init_ray`).
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
        if run_dir is None:
            raise ValueError("resume needs the run directory")
        checkpoint.latest_checkpoint(run_dir)  # none usable: fail before building
    run = _Run(scenario, run_dir, on_round)
    run.start(workers, resume)
    status: Literal["completed", "diverged", "stalled", "interrupted"] = "completed"
    message = ""
    try:
        if run.asynchronous:
            _Async(run, max_lookahead).loop(resume)
        else:
            _run_rounds(run, resume)
    except DivergenceError as exc:
        status, message = "diverged", str(exc)
    except clock.Stalled as exc:
        status, message = "stalled", str(exc)
    except KeyboardInterrupt:
        status, message = "interrupted", "interrupted"
    finally:
        try:
            run.recorder.flush()
        finally:  # the actors go even when the disk is full
            try:
                placement = run.executor.report()
            finally:
                run.executor.shutdown()
    final = run.server.params().clone() if status == "completed" else None
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
    )
