"""Asynchronous mode: FedAsync and FedBuff on one continuous SimPy timeline.

(docs/architecture.md, "Asynchronous mode".) The clock's
:class:`~fedsim.clock.AsyncTimeline` decides everything that happens in
simulated time: which device starts a job from which version, when its update
arrives, whether it is dropped (offline, stale) and which K arrivals make
each server version. This module does the real work, and reads like the
papers' pseudo-code::

    for each server version w, in order (a record of the timeline):
        updates = train(jobs applied at w, each from its *start* version x_v)
        x_{w+1} = algorithm.aggregate_async(x_w, updates, staleness, starts)
        record(version w)

Dispatch, and why causality holds exactly. A job's update depends only on
the parameters of the version it started from (and on its own seed), and the
timeline never depends on training results. So a job can be trained as soon
as its start version has been computed, whatever its arrival time:

1. Look ahead: pull version records from the timeline while the newest one
   needs only jobs that started from versions already computed (<= w), and
   past it while fewer than ``concurrency`` jobs are ready to train, up to
   ``max_lookahead`` records.
2. Train, in one pool call, every job of the pulled records whose start
   version is computed and that the server will apply. Dropped jobs (stale,
   offline) are never trained, as in synchronous mode.
3. Apply the pulled records in order while all their jobs are trained: each
   makes one version, which unblocks the next batch.

Every record pulled is a record of the past: the timeline emits a version
only once SimPy has reached the time of its last arrival, and training a job
early never changes what happens when. One pool call trains every job, in
the records held (a few job lifetimes ahead), whose start version is known,
stragglers that arrive many versions later included; a new call is needed
only when a record depends on a job that started from a version computed
since (typically a fast device that restarted from the newest version). The
result does not depend on how jobs are batched: ``max_lookahead=1`` trains
one version's jobs at a time and gives identical results (tests check it).

The parameters of a version are kept while any job that started from it has
not been applied or dropped (FedAsync mixes in x_start + Delta).

Checkpoints and resume. Every ``checkpoint.every_rounds`` versions the server
state and the parameters of every version still in use are saved (see
:mod:`fedsim.checkpoint`). Nothing else needs saving: the timeline is a pure
function of the scenario, so a resumed run replays its first w records
(simulated time only, no training) to rebuild which jobs are in flight, and
jobs trained ahead of the checkpoint are simply trained again, to the same
bits.

Example:
    >>> from fedsim.scenario import load_scenario
    >>> sc = load_scenario("scenarios/async-fedbuff.yaml", ["rounds=2"])
    >>> rows, clients = AsyncSimulation(sc, workers=0).run()
    >>> [r["round"] for r in rows]
    [0, 1]
"""

from __future__ import annotations

import math
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import torch

from fedsim.algorithms.base import ClientUpdate, ServerState
from fedsim.algorithms.fedasync import AsyncInfo
from fedsim.checkpoint import (
    CheckpointError,
    checkpoint_dir,
    commit_checkpoint,
    latest_checkpoint,
    load_tensors,
    save_tensors,
    write_meta,
)
from fedsim.clock import Arrival, AsyncTimeline, Job, Version
from fedsim.data import FederatedData, build_data
from fedsim.fleet import Fleet
from fedsim.models import make_model
from fedsim.params import l2_norm, num_params
from fedsim.results import CLIENT_SCHEMA, ROUND_SCHEMA, Recorder
from fedsim.scenario import Scenario
from fedsim.server import DivergenceError, ServerCore, evaluates, weighted_train_loss
from fedsim.workers import LocalPool, RayPool, Task, assign_lpt

__all__ = [
    "ASYNC_CLIENT_SCHEMA",
    "ASYNC_ROUND_SCHEMA",
    "AsyncRecorder",
    "AsyncRule",
    "AsyncSimulation",
]

# clients.parquet: one row per job the server saw end (arrived or dropped).
ASYNC_CLIENT_SCHEMA = pa.schema(
    [
        *CLIENT_SCHEMA,
        ("version_started", pa.int64()),  # the version the device downloaded
        ("version_applied", pa.int64()),  # null unless applied
        ("staleness", pa.int64()),  # version at arrival - version_started; null offline
        ("job", pa.int64()),  # the device's job index (0, 1, ...)
    ]
)

# rounds.parquet: one row per server version (``round`` = the version w the
# updates were applied to; the metrics are those of w + 1).
ASYNC_ROUND_SCHEMA = pa.schema(
    [
        *ROUND_SCHEMA,
        ("staleness_mean", pa.float64()),
        ("staleness_max", pa.int64()),
        ("n_stale", pa.int64()),
        ("n_offline", pa.int64()),
        ("n_started", pa.int64()),
        ("in_flight", pa.int64()),
    ]
)

Payload = dict[str, torch.Tensor]
JobKey = tuple[int, int]  # (device, job index): Task(client, round=index)
RoundCallback = Callable[[dict[str, Any], list[dict[str, Any]]], None]


class AsyncRecorder(Recorder):
    """The run's rows, written with the async schemas (as the run goes)."""

    def write(self, run_dir: Path) -> None:
        self._write(run_dir / "rounds.parquet", self.rows, ASYNC_ROUND_SCHEMA)
        self._write(run_dir / "clients.parquet", self.clients, ASYNC_CLIENT_SCHEMA)


class AsyncRule(Protocol):
    """What an asynchronous server rule provides (FedAsync, FedBuff)."""

    buffer_size: int

    def aggregate_async(
        self,
        state: ServerState,
        updates: Sequence[ClientUpdate],
        staleness: Sequence[int],
        starts: Sequence[torch.Tensor],
    ) -> tuple[ServerState, AsyncInfo]: ...


def _key(job: Job) -> JobKey:
    return (job.device, job.index)


def _task(job: Job) -> Task:
    # The job index plays the round's part in the client's seed, so the
    # device's j-th job sees the minibatches of a synchronous round j.
    return Task(client=job.device, round=job.index, tau=job.tau)


class _LocalRunner:
    """Trains in this process: the path unit tests take."""

    def __init__(self, scenario: Scenario, data: FederatedData) -> None:
        self.pool = LocalPool(scenario, data)

    def train(
        self, jobs: Sequence[Job], payloads: dict[int, Payload]
    ) -> dict[JobKey, ClientUpdate]:
        out: dict[JobKey, ClientUpdate] = {}
        for v in sorted({j.version for j in jobs}):
            group = [j for j in jobs if j.version == v]
            ups = self.pool.worker.train(payloads[v], [_task(j) for j in group])
            out.update(zip(map(_key, group), ups, strict=True))
        return out

    def forget(self, version: int) -> None:
        pass

    def shutdown(self) -> None:
        pass


class _DataHolder:
    """A named actor that hands worker actors the shared dataset's reference."""

    def __init__(self, refs: list[Any]) -> None:
        self._refs = refs

    def data_ref(self) -> list[Any]:
        return self._refs


class _RayRunner:
    """Ray worker actors; each version's parameters go in the object store once."""

    def __init__(self, scenario: Scenario, data: FederatedData, workers: int) -> None:
        import ray

        res = scenario.resources
        name = f"fedsim-async-data-{uuid.uuid4().hex[:12]}"
        self.holder = (
            ray.remote(_DataHolder)
            .options(num_cpus=0, name=name)
            .remote([ray.put(data)])
        )
        self.pool = RayPool(
            scenario, name, workers, res.cpus_per_worker, res.gpus_per_worker
        )
        self.refs: dict[int, Any] = {}

    def train(
        self, jobs: Sequence[Job], payloads: dict[int, Payload]
    ) -> dict[JobKey, ClientUpdate]:
        import ray

        by_key = {_key(j): j for j in jobs}
        calls: list[tuple[list[Job], Any]] = []
        # Longest first across the whole batch; each actor then gets one call
        # per start version in its share (calls on an actor run in order).
        chunks = assign_lpt([_task(j) for j in jobs], self.pool.size)
        for actor, chunk in zip(self.pool.actors, chunks, strict=True):
            mine = [by_key[(t.client, t.round)] for t in chunk]
            for v in sorted({j.version for j in mine}):
                if v not in self.refs:
                    self.refs[v] = ray.put(payloads[v])
                group = [j for j in mine if j.version == v]
                tasks = [_task(j) for j in group]
                calls.append((group, actor.train.remote(self.refs[v], tasks, None)))
        out: dict[JobKey, ClientUpdate] = {}
        for (group, _), ups in zip(calls, ray.get([c for _, c in calls]), strict=True):
            out.update(zip(map(_key, group), ups, strict=True))
        return out

    def forget(self, version: int) -> None:
        self.refs.pop(version, None)

    def shutdown(self) -> None:
        import ray

        self.pool.shutdown()
        ray.kill(self.holder)


class AsyncSimulation:
    """One asynchronous run: fleet, timeline, workers, server.

    Args:
        scenario: a validated scenario with ``round.policy: async`` and an
            asynchronous server rule (``fedasync`` or ``fedbuff``).
        workers: 0 trains in this process without Ray; ``n >= 1`` uses ``n``
            Ray worker actors (Ray must be initialised).
        on_round: called with each version's row and client rows as soon as
            they are known.
        run_dir: if given, rows are written there as ``rounds.parquet`` and
            ``clients.parquet`` (with the async schemas), as the run goes;
            ``recorder.rows`` and ``recorder.clients`` hold them.
        max_lookahead: at most this many version records are held ahead of
            the model (default: 4 ceil(concurrency / buffer_size) + 4, about
            four times the versions a job lives through). 1 trains one
            version's jobs at a time; the results are the same.
        resume: continue from ``run_dir``'s latest checkpoint (written every
            ``checkpoint.every_rounds`` versions).

    ``rounds`` of the scenario is the number of server versions; row
    ``round`` w reports the update that made version w + 1.

    Attributes:
        final_params: the model after the run.
    """

    def __init__(
        self,
        scenario: Scenario,
        workers: int = 0,
        on_round: RoundCallback | None = None,
        run_dir: Path | None = None,
        max_lookahead: int | None = None,
        resume: bool = False,
    ) -> None:
        alg = scenario.algorithm
        if scenario.round.policy != "async":
            raise ValueError("AsyncSimulation needs round.policy 'async'")
        if not hasattr(alg, "aggregate_async"):
            raise ValueError(
                f"round.policy 'async' needs an asynchronous server rule "
                f"(fedasync or fedbuff), not {alg.name!r}"
            )
        if alg.stateful:
            raise ValueError(
                f"{alg.name!r} keeps per-client state, which asynchronous mode "
                "does not support yet"
            )
        self.scenario = scenario
        self.workers = workers
        self.on_round = on_round
        self.run_dir = Path(run_dir) if run_dir is not None else None
        if resume and self.run_dir is None:
            raise ValueError("resume needs the run directory")
        self.resume = resume
        self.fleet = Fleet.from_spec(scenario.fleet, scenario.seed)
        self.data = build_data(scenario.data, scenario.num_clients, scenario.seed)
        self.concurrency = scenario.round.concurrency or (
            scenario.selector.clients_per_round
        )
        per_version = alg.buffer_size  # type: ignore[attr-defined]
        self.max_lookahead = (
            max_lookahead or 4 * math.ceil(self.concurrency / per_version) + 4
        )
        elem = scenario.model.elem_bytes
        d = num_params(make_model(scenario, self.data))
        self.bytes_down = alg.down_factor * d * elem
        self.bytes_up = alg.up_factor * d * elem
        self.group_names = list(self.fleet.group_names)
        self.recorder = AsyncRecorder(self.run_dir)
        self.final_params: torch.Tensor | None = None

    def timeline(self) -> AsyncTimeline:
        """A fresh timeline of this run (a pure function of the scenario)."""
        sc = self.scenario
        rule: AsyncRule = sc.algorithm  # type: ignore[assignment]
        return AsyncTimeline(
            self.fleet,
            sc.round,
            versions=sc.rounds,
            buffer_size=rule.buffer_size,
            concurrency=self.concurrency,
            seed=sc.seed,
            bytes_down=self.bytes_down,
            bytes_up=self.bytes_up,
            n_samples=self.data.n_samples,
            batch_size=sc.client.batch_size,
        )

    def run(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """Make every version; return (version rows, client rows)."""
        sc = self.scenario
        threads = max(1, int(sc.resources.cpus_per_worker))
        server = ServerCore(sc, self.data, threads=threads)
        runner: _LocalRunner | _RayRunner
        if self.workers == 0:
            runner = _LocalRunner(sc, self.data)
        else:
            runner = _RayRunner(sc, self.data, self.workers)
        self.runner = runner
        try:
            self._loop(server, runner)
            self.final_params = server.params().clone()
            return self.recorder.rows, self.recorder.clients
        finally:
            runner.shutdown()
            self.recorder.flush()

    # ------------------------------------------------------------ the loop
    def _loop(self, server: ServerCore, runner: _LocalRunner | _RayRunner) -> None:
        sc = self.scenario
        rounds = sc.rounds
        every = sc.checkpoint.every_rounds if self.run_dir is not None else 0
        timeline = iter(self.timeline())
        payloads: dict[int, Payload] = {0: dict(server.payload())}
        users: Counter[int] = Counter()  # version -> its jobs not yet applied/dropped
        pending: deque[Version] = deque()
        trained: dict[JobKey, ClientUpdate] = {}
        w = 0  # the newest computed version
        if self.resume:
            w, payloads = self._restore(server, timeline, users)
        wall0 = time.perf_counter()
        while w < rounds:
            # 1. look ahead: while the newest record needs only computed
            # versions, and then while fewer than `concurrency` jobs are ready
            ready = [a.job for r in pending for a in r.applied if a.job.version <= w]
            batch = [j for j in ready if _key(j) not in trained]
            while len(pending) < self.max_lookahead and (
                not pending
                or all(a.job.version <= w for a in pending[-1].applied)
                or len(batch) < self.concurrency
            ):
                rec = next(timeline, None)
                if rec is None:
                    break
                pending.append(rec)
                users.update(j.version for j in rec.started)
                batch += [a.job for a in rec.applied if a.job.version <= w]
            # 2. train every job whose start version is known, in one call
            if batch:
                trained.update(runner.train(batch, payloads))
            # 3. apply records in order while their jobs are trained
            while pending and all(_key(a.job) in trained for a in pending[0].applied):
                rec = pending.popleft()
                ups = [trained.pop(_key(a.job)) for a in rec.applied]
                starts = [payloads[a.job.version]["x"] for a in rec.applied]
                self._apply(server, rec, ups, starts, wall0)
                w += 1
                payloads[w] = dict(server.payload())
                for a in rec.ended:
                    users[a.job.version] -= 1
                for v in [v for v in payloads if v < w and users[v] <= 0]:
                    del payloads[v]
                    users.pop(v, None)
                    runner.forget(v)
                if every and (w % every == 0 or w == rounds):
                    self._checkpoint(server, w, rec.t, payloads)

    # ----------------------------------------------------- checkpoints
    def _checkpoint(
        self, server: ServerCore, w: int, sim_time: float, payloads: dict[int, Payload]
    ) -> None:
        """Save version w: the server state (whose payload is version w's)
        and every older version still in use."""
        assert self.run_dir is not None
        self.recorder.flush()
        ckpt = checkpoint_dir(self.run_dir, w)
        server.save(str(ckpt))
        for v, payload in payloads.items():
            if v < w:
                save_tensors(ckpt / f"payload-{v:08d}.pt", payload)
        write_meta(
            ckpt,
            {
                "next_round": w,
                "sim_time": sim_time,
                "payload_versions": sorted(v for v in payloads if v < w),
                "n_rows": len(self.recorder.rows),
                "n_client_rows": len(self.recorder.clients),
            },
        )
        commit_checkpoint(self.run_dir, ckpt)

    def _restore(
        self, server: ServerCore, timeline: Any, users: Counter[int]
    ) -> tuple[int, dict[int, Payload]]:
        """Load the latest checkpoint and replay the timeline up to it.

        Returns the checkpoint's version w and the parameters of the versions
        in use; ``users`` is filled as the uninterrupted run had it, and
        ``timeline`` is left at record w.
        """
        assert self.run_dir is not None
        ck = latest_checkpoint(self.run_dir)
        w = ck.next_round
        if not 0 < w <= self.scenario.rounds:
            raise CheckpointError(f"{ck.path}: version {w} is not in this run")
        server.load(str(ck.path))
        for _ in range(w):
            rec = next(timeline)
            users.update(j.version for j in rec.started)
            for a in rec.ended:
                users[a.job.version] -= 1
        in_use = [v for v in range(w) if users[v] > 0]
        try:
            payloads = {
                v: load_tensors(ck.path / f"payload-{v:08d}.pt") for v in in_use
            }
        except OSError as exc:
            raise CheckpointError(
                f"{ck.path}: missing version parameters ({exc})"
            ) from None
        payloads[w] = dict(server.payload())
        for v in [v for v in users if users[v] <= 0 and v < w]:
            users.pop(v)
        self.recorder.load(ck.n_rows, ck.n_client_rows)
        return w, payloads

    def _apply(
        self,
        server: ServerCore,
        rec: Version,
        ups: list[ClientUpdate],
        starts: list[torch.Tensor],
        wall0: float,
    ) -> None:
        sc = self.scenario
        rule: AsyncRule = sc.algorithm  # type: ignore[assignment]
        w = rec.version
        staleness = [int(a.staleness or 0) for a in rec.applied]
        server.state, info = rule.aggregate_async(server.state, ups, staleness, starts)
        if not bool(torch.isfinite(server.state["x"]).all()):
            raise DivergenceError(
                f"version {w}: the global model has NaN or infinite parameters"
            )
        train_loss = weighted_train_loss(ups)
        if not math.isfinite(train_loss):
            raise DivergenceError(f"version {w}: the training loss is {train_loss}")
        do_eval = evaluates(sc, w)
        test_loss, test_acc = server.evaluate() if do_eval else (math.nan, math.nan)
        taus = np.array([a.tau for a in rec.applied], dtype=np.float64)
        status = Counter(a.status for a in rec.ended)
        row = {
            "round": w,
            "sim_time": rec.t,
            "wall_time": time.perf_counter() - wall0,
            "test_loss": test_loss,
            "test_accuracy": test_acc,
            "train_loss": train_loss,
            "n_selected": len(rec.ended),
            "n_completed": len(rec.applied),
            "n_dropped": len(rec.ended) - len(rec.applied),
            "tau_mean": float(taus.mean()),
            "tau_min": float(taus.min()),
            "tau_max": float(taus.max()),
            "tau_eff": info.tau_eff,
            "chi2_pw": info.chi2_pw,
            "staleness_mean": float(np.mean(staleness)),
            "staleness_max": int(max(staleness)),
            "n_stale": status["stale"],
            "n_offline": status["offline"],
            "n_started": len(rec.started),
            "in_flight": rec.in_flight,
        }
        applied = {
            _key(a.job): (u, wt)
            for a, u, wt in zip(rec.applied, ups, info.per_update, strict=True)
        }
        these = [self._client_row(a, applied.get(_key(a.job))) for a in rec.ended]
        self.recorder.add(row, these)
        if self.on_round is not None:
            self.on_round(row, these)

    def _client_row(
        self, a: Arrival, applied: tuple[ClientUpdate, float] | None
    ) -> dict[str, Any]:
        job = a.job
        u, weight = applied if applied is not None else (None, 0.0)
        return {
            "round": a.version,
            "client_id": job.device,
            "device_group": self.group_names[int(self.fleet.group[job.device])],
            "tau": a.tau,
            "t_start": job.t_start,
            "t_arrive": a.t,
            "dropped": a.dropped,
            "drop_reason": "" if not a.dropped else a.status,
            "slowdown": job.slowdown,
            "weight": weight,
            "update_norm": l2_norm(u.delta) if u is not None else math.nan,
            "train_loss": u.train_loss if u is not None else math.nan,
            "bytes_down": self.bytes_down,
            "bytes_up": 0 if a.status == "offline" else self.bytes_up,
            "version_started": job.version,
            "version_applied": a.version if not a.dropped else None,
            "staleness": a.staleness,
            "job": job.index,
        }
