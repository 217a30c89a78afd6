"""The asynchronous loop (docs/architecture.md, "Asynchronous mode"): the
SimPy timeline's versions, trained ahead of it in batches and applied in
simulated arrival order. :func:`fedsim.runtime.run_scenario` builds the
run's parts once and runs this loop or the synchronous one on them.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Iterator, Sequence
from typing import Protocol, cast

import numpy as np

from fedsim import checkpoint, clock, interrupts
from fedsim.algorithms.base import AsyncRule, Failure
from fedsim.executors import Executor, Payloads
from fedsim.fleet import Fleet
from fedsim.records import (
    ClientRecord,
    Ids,
    Kept,
    Pair,
    Row,
    select,
    selector_columns,
)
from fedsim.scenario import Scenario
from fedsim.selectors import Draw, Selector, SelectorContext
from fedsim.selectors.base import SelectorState
from fedsim.server import Applied, RoundServer, Step
from fedsim.servertime import ServerTimer
from fedsim.tasks import Parcel
from fedsim.workers import Payload, Task

# The timeline's n-th choice draws from (seed, tag, n), with the tag the
# clock's default chooser uses for the same stream (apart from the round
# streams' tags in fedsim.runtime, so the draws stay independent).
_ASYNC_SELECT_TAG = 0xD15C


class RunParts(Protocol):
    """What the loop reads of the run's parts (:class:`fedsim.runtime._Run`
    builds them once, for both loops, and places the server and executor)."""

    sc: Scenario
    fleet: Fleet
    ctx: clock.RunContext
    selector: Selector
    sel_ctx: SelectorContext
    server_time: ServerTimer | None
    server: RoundServer
    executor: Executor

    def rng(self, tag: int, n: int) -> np.random.Generator:
        """A fresh generator for stream ``tag``'s ``n``-th draw."""

    def restore(self) -> checkpoint.Checkpoint:
        """Load the latest checkpoint (server, rows); return it."""

    def observe(
        self,
        sel: Selector,
        before: SelectorState,
        version: int,
        applied: Applied,
        pairs: Sequence[Pair],
        /,
    ) -> tuple[SelectorState, list[Row]]:
        """What the selector learns of ``version``: its state and artifact rows."""

    def record(
        self,
        version: int,
        at: float,
        ends: Sequence[ClientRecord],
        pairs: Sequence[Pair],
        applied: Applied,
        columns: Row,
        artifact: Sequence[Row],
        /,
    ) -> None:
        """Add the rows of ``version``, made at simulated time ``at``."""

    def due(self, done: int) -> bool:
        """Whether a checkpoint is due after ``done`` versions."""

    def save_checkpoint(
        self, versions: int, at: float, state: SelectorState, payloads: Payloads, /
    ) -> None:
        """Save the state after ``versions`` versions, with the payloads that
        open jobs started from."""


class AsyncLoop:
    """The asynchronous loop (docs/architecture.md, "Asynchronous mode").

    The SimPy timeline never depends on training results, so the loop
    trains ahead of it: it pulls version records, trains in one executor
    call every job whose start version is already computed, and applies
    records in order once all their jobs are trained. Guarantees: updates
    are applied in simulated arrival order, and the result does not depend
    on how jobs were batched (``max_lookahead`` 1 gives the same bits).

    Args:
        run: the run's parts.
        max_lookahead: at most this many version records held ahead of the
            model (None: about four job lifetimes); forced to 1 with an
            adaptive selector, whose every choice must see the versions
            made before it.
    """

    def __init__(self, run: RunParts, max_lookahead: int | None) -> None:
        sc = run.sc
        self.run = run
        self.rule = cast(AsyncRule, sc.algorithm)  # the scenario checked it
        self.concurrency = sc.round.concurrency or sc.selector.clients_per_round
        # A job lives about concurrency / buffer_size versions: four lifetimes
        # keep the workers busy without holding many payloads.
        default = 4 * math.ceil(self.concurrency / self.rule.buffer_size) + 4
        self.adaptive = run.selector.adaptive
        self.max_lookahead = 1 if self.adaptive else max_lookahead or default
        self.sel_state = run.selector.init(run.sel_ctx)
        # adaptive selectors: every pick so far (choice n -> ids), which the
        # checkpoint keeps so that a resumed replay makes the same picks
        self.picks: list[list[int]] = []
        self.replay: list[list[int]] = []
        # the server's seconds per version (0: a free server)
        timer = run.server_time
        self.server_s = timer.step_s(self.rule.buffer_size) if timer else 0.0
        self.tl = clock.AsyncTimeline(
            run.fleet,
            sc.round,
            versions=sc.rounds,
            buffer_size=self.rule.buffer_size,
            concurrency=self.concurrency,
            seed=sc.seed,
            ctx=run.ctx,
            choose=self._choose,
            server_s=self.server_s,
        )
        self.timeline: Iterator[clock.Version] = iter(self.tl)
        self.payloads: dict[int, Payload] = {}
        self.users: Counter[int] = Counter()  # version -> its jobs still open
        self.pending: deque[clock.Version] = deque()
        # by job: what the driver keeps of the update, and what goes to the server
        self.trained: dict[clock.Job, tuple[Kept, Parcel]] = {}
        self.w = 0  # the newest computed version

    def _choose(self, candidates: Ids, free: int, n: int) -> Ids:
        """The selector's n-th pick for the free slots (or the logged one).

        The timeline calls this only once every version made so far has been
        yielded, so ``self.tl.version`` is the version the picked devices
        download, and an adaptive selector has observed every version
        before it (the runtime pulls one record at a time then).
        """
        if n < len(self.replay):
            return np.asarray(self.replay[n], dtype=np.int64)
        run = self.run
        rng = run.rng(_ASYNC_SELECT_TAG, n)
        draw = Draw(self.tl.version, candidates, rng, run.sel_ctx)
        sel = run.selector.with_slots(free)
        ids, self.sel_state = select(sel, self.sel_state, draw)
        if self.adaptive:
            self.picks.append(ids.tolist())
        return ids

    def _restore(self) -> None:
        """Load the latest checkpoint and replay the timeline up to it.

        The timeline is replayed without training: it is a pure function of
        the scenario (and, for adaptive selectors, of the saved picks), so
        the replay rebuilds exactly which jobs are in flight.
        """
        run = self.run
        ck = run.restore()
        w = ck.next_round
        if self.adaptive:  # the picks up to the checkpoint, then its state
            self.replay = [list(ids) for ids in ck.selector_state["picks"]]
        for _ in range(w):
            rec = next(self.timeline)
            self.users.update(j.version for j in rec.started)
            self.users.subtract(a.job.version for a in rec.ended)
        self._load_payloads(ck, w)
        self.users = +self.users  # only the versions open jobs started from
        self.w = w
        if self.adaptive:
            self.sel_state = ck.selector_state["state"]
            self.picks, self.replay = self.replay, []

    def _load_payloads(self, ck: checkpoint.Checkpoint, w: int) -> None:
        """The parameters of every version an open job started from, saved
        with the checkpoint, and version ``w``'s from the restored server.

        Raises:
            CheckpointError: a needed version's file is missing or unreadable.
        """
        try:
            for v in [v for v in range(w) if self.users[v] > 0]:
                path = ck.path / f"payload-{v:08d}.pt"
                self.payloads[v] = checkpoint.load_tensors(path)
        except OSError as exc:
            raise checkpoint.CheckpointError(
                f"{ck.path}: missing version parameters ({exc})"
            ) from None
        self.payloads[w] = self.run.server.payload()

    def loop(self, resume: bool) -> None:
        """Run every remaining version (``resume``: from the checkpoint).

        Raises:
            clock.Stalled: the timeline can make no further version.
            DivergenceError: the model or the training loss is not finite.
        """
        if resume:
            self._restore()
        else:
            self.payloads[0] = self.run.server.payload()
        while self.w < self.run.sc.rounds:
            interrupts.before_round()  # a Ctrl-C during the last batch stops here
            self._train(self._look_ahead())
            while self.pending and all(
                a.job in self.trained for a in self.pending[0].applied
            ):
                self._apply(self.pending.popleft())

    def _look_ahead(self) -> list[clock.Job]:
        """Pull version records; return the jobs trainable now, untrained.

        A job is trainable once the version it starts from is computed
        (``<= self.w``). Records are pulled while the newest one needs only
        computed versions (it can be applied as soon as it is trained) and,
        past that, while fewer than ``concurrency`` jobs are ready (keep the
        workers busy), never beyond ``max_lookahead`` records held.
        """
        pending = self.pending
        batch = [j for r in pending for j in self._ready(r) if j not in self.trained]
        while len(pending) < self.max_lookahead and self._wants_more(batch):
            rec = next(self.timeline, None)
            if rec is None:
                break
            pending.append(rec)
            self.users.update(j.version for j in rec.started)
            batch += self._ready(rec)
        return batch

    def _ready(self, rec: clock.Version) -> list[clock.Job]:
        """The jobs of ``rec`` whose start version is already computed."""
        return [a.job for a in rec.applied if a.job.version <= self.w]

    def _wants_more(self, batch: list[clock.Job]) -> bool:
        """Whether :meth:`_look_ahead` should pull another record."""
        if not self.pending:
            return True
        newest = self.pending[-1].applied
        return all(a.job.version <= self.w for a in newest) or (
            len(batch) < self.concurrency
        )

    def _train(self, batch: list[clock.Job]) -> None:
        """Train ``batch`` in one executor call and keep the updates by job."""
        # The job index plays the round's part in the client's seed, so a
        # device's j-th job sees the minibatches of a synchronous round j.
        tasks = [Task(j.device, j.index, j.tau, j.version) for j in batch]
        states = self.run.server.client_states([t.client for t in tasks])
        kept, parcels = self.run.executor.train_apart(tasks, self.payloads, states)
        self.trained.update(zip(batch, zip(kept, parcels, strict=True), strict=True))

    def _apply(self, rec: clock.Version) -> None:
        """Apply version record ``rec`` (all its jobs trained), record its
        rows, let an adaptive selector observe it, checkpoint when due."""
        run = self.run
        held = [self.trained.pop(a.job) for a in rec.applied]
        ups, parcels = [k for k, _ in held], [p for _, p in held]
        starts = [self.payloads[a.job.version]["x"] for a in rec.applied]
        staleness = [int(a.staleness or 0) for a in rec.applied]
        # the jobs that ended in this version without an update, and why
        lost = [Failure(a.plan.client, a.plan.reason) for a in rec.ended if a.dropped]
        where = f"version {rec.version}"
        at = Step(where, rec.version, staleness, starts, failures=lost)
        applied = run.server.apply(parcels, at)
        trained = _pairs_in_end_order(rec, ups, applied)
        records = [ClientRecord.from_arrival(a) for a in rec.ended]
        artifact: list[Row] = []
        if self.adaptive:  # in arrival order: a device's later update wins
            self.sel_state, artifact = run.observe(
                run.selector, self.sel_state, rec.version, applied, trained
            )
        extra = _version_columns(rec, staleness)
        extra |= selector_columns(run.selector, self.sel_state, rec.version)
        if run.server_time is not None:
            extra |= run.server_time.version_columns(rec, self.server_s)
        run.record(rec.version, rec.t, records, trained, applied, extra, artifact)
        self.w += 1
        self._forget(rec)
        if run.due(self.w):
            state: SelectorState = self.sel_state
            if self.adaptive:
                state = {"state": state, "picks": self.picks}
            run.save_checkpoint(self.w, rec.t, state, self.payloads)

    def _forget(self, rec: clock.Version) -> None:
        """Keep the new version; drop versions no open job started from
        (and tell the executor, which frees its copy in the object store)."""
        w = self.w
        self.payloads[w] = self.run.server.payload()
        self.users.subtract(a.job.version for a in rec.ended)
        for v in [v for v in self.payloads if v < w and self.users[v] <= 0]:
            del self.payloads[v]
            self.users.pop(v, None)
            self.run.executor.forget(v)


def _pairs_in_end_order(
    rec: clock.Version, ups: Sequence[Kept], applied: Applied
) -> list[Pair]:
    """Each applied update (given in ``rec.applied`` order) with its weight,
    reordered as the non-dropped ends of ``rec.ended`` (the rows' order)."""
    jobs = [a.job for a in rec.applied]
    weights = dict(zip(jobs, applied.weights, strict=True))
    by_job = {j: Pair(u, weights[j]) for j, u in zip(jobs, ups, strict=True)}
    return [by_job[a.job] for a in rec.ended if not a.dropped]


def _version_columns(rec: clock.Version, staleness: Sequence[int]) -> Row:
    """The asynchronous columns of a version's row in rounds.parquet."""
    status = Counter(a.status for a in rec.ended)
    return {
        "staleness_mean": float(np.mean(staleness)),
        "staleness_max": int(max(staleness)),
        "n_stale": status["stale"],
        "n_offline": status["offline"],
        "n_started": len(rec.started),
        "in_flight": rec.in_flight,
    }
