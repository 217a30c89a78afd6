"""The Ray executor: ``n`` worker actors (:class:`RayWorker`) that train a
run's tasks, placed as ``resources`` asks (:mod:`fedsim.remote.placement`),
with the same results as the in-process executor (:mod:`fedsim.executors`)."""

from __future__ import annotations

import contextlib
import secrets
import sys
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, NamedTuple

from fedsim.algorithms.base import ClientEvaluation, ClientState, ClientUpdate
from fedsim.data import DataError, DataMissingError, FederatedData, build_data
from fedsim.errors import RunError
from fedsim.executors import (
    Apart,
    Batch,
    Calls,
    DataRecipe,
    Executor,
    ExecutorSetup,
    Payloads,
    States,
    _versions,
)
from fedsim.hooks import PluginFailure
from fedsim.remote.actors import (
    ActorShape,
    CallFailures,
    Handle,
    RetryPolicy,
    current_pool,
    kill,
)
from fedsim.remote.placement import custom_resources, placement_group_for
from fedsim.remote.wire import ship, ship_all, ship_update
from fedsim.tasks import Parcel, UpdateSummary, WorkerSetup
from fedsim.workers import Payload, Task, Worker, assign_lpt

if TYPE_CHECKING:
    import torch
    from ray import ObjectRef as Ref
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy


class _Call(NamedTuple):
    """One actor call: the positions of its tasks in the executor's batch,
    the actor, and the arguments of ``Worker.train`` (or of the worker
    method ``method`` names: ``evaluate_clients``)."""

    positions: list[int]
    actor: Handle
    args: tuple[object, ...]
    method: str = "train"


def _own(group: Sequence[Task], states: States) -> dict[int, ClientState]:
    """The client states (or instructions) of ``group``'s clients only:
    each actor call carries its own share, not the whole round's, its
    tensors as NumPy arrays (:mod:`fedsim.remote.wire`)."""
    return {t.client: ship_all(states[t.client]) for t in group if t.client in states}


class StaleWorkerError(RunError, RuntimeError):
    """A worker actor was asked to train for a run it is not set up for."""


class RayWorker(Worker):
    """The :class:`Worker` as a Ray actor of :class:`RayExecutor`: it knows
    the run it serves by a token, so it can be set up again for a later run
    (:func:`warm_workers`) and never trains for the wrong one.

    The actor is created with no arguments and set up by
    :meth:`setup_for`, which the executor calls right after creating it (or
    after taking it over from an earlier run). Constructor arguments would
    hold object references (the data's), and for an actor that may restart
    Ray logs an ERROR line on every run about such arguments.

    Ray restarts a dead actor by calling its constructor again, so a
    restarted actor serves no run: it holds no token, each call for the
    current run (which carries the current token) raises
    :class:`StaleWorkerError`, and the executor sets the actor up again and
    resends the call.
    """

    def __init__(self) -> None:
        self.token: str | None = None  # no run until setup_for

    def setup_for(
        self, setup: WorkerSetup, data: list[Ref], threads: int | None, token: str
    ) -> str:
        """Become the worker for this run: every attribute of an earlier
        run is dropped first, so nothing of it leaks into this one.

        Args:
            setup: as :class:`Worker`.
            data: as :class:`Worker` (the one-element list of the reference).
            threads: as :class:`Worker`.
            token: the run this actor trains for.

        Returns:
            The token (the executor waits on it).
        """
        self.__dict__.clear()
        Worker.__init__(self, setup, data, threads)
        self.token = token
        return token

    def park(self) -> None:
        """Drop the run's model and data while the actor waits for the next
        run (the process, with torch imported, is what is kept)."""
        token = self.token
        self.__dict__.clear()
        self.token = token

    def _check(self, token: str | None) -> None:
        if token is not None and token != self.token:
            raise StaleWorkerError(
                "this worker actor was restarted with an earlier run's arguments"
            )

    def train(
        self,
        payload: Payload,
        tasks: Sequence[Task],
        states: Mapping[int, ClientState] | None = None,
        instructions: Mapping[int, Payload] | None = None,
        token: str | None = None,
    ) -> list[ClientUpdate]:
        """:meth:`Worker.train`, refused (:class:`StaleWorkerError`) when
        ``token`` is not this actor's run; the updates' tensors travel as
        NumPy arrays (:mod:`fedsim.remote.wire`)."""
        self._check(token)
        ups = super().train(payload, tasks, states, instructions)
        return [ship_update(u) for u in ups]

    def train_apart(
        self,
        payload: Payload,
        tasks: Sequence[Task],
        states: Mapping[int, ClientState] | None = None,
        instructions: Mapping[int, Payload] | None = None,
        token: str | None = None,
    ) -> tuple[list[UpdateSummary] | ClientUpdate, ...]:
        """:meth:`train`, returned apart for a Ray call with ``num_returns =
        1 + len(tasks)``: the list of the updates' summaries first (what the
        driver fetches), then each update (what the server actor fetches);
        refused and shipped as :meth:`train` is.

        Returns:
            ``([UpdateSummary, ...], update_1, ..., update_n)``, in task order.
        """
        self._check(token)
        # Worker.train, not self.train: the summaries read the updates unshipped
        ups = super().train(payload, tasks, states, instructions)
        return ([UpdateSummary.of(u) for u in ups], *map(ship_update, ups))

    def evaluate_clients(
        self,
        x: torch.Tensor,
        clients: Sequence[int],
        batch_size: int,
        token: str | None = None,
    ) -> list[ClientEvaluation]:
        """:meth:`Worker.evaluate_clients`, refused as :meth:`train` is."""
        self._check(token)
        return super().evaluate_clients(x, clients, batch_size)


def _where(worker: Worker) -> tuple[str, dict[str, object]]:
    """This actor's Ray node, GPU share, GPU ids and the device it trains on
    (``cpu`` where GPUs are only declared, as in tests), via ``__ray_call__``."""
    import ray

    ctx = ray.get_runtime_context()
    gpus = ctx.get_assigned_resources().get("GPU", 0.0)
    share = {"gpus": gpus, "gpu_ids": [str(i) for i in ray.get_gpu_ids()]}
    return ctx.get_node_id(), {**share, "device": worker.device.type}


class _NodeLocalData:
    """The dataset as a recipe, built from each node's own data root.

    Ray pickles this instead of the arrays (``resources.data: per_node``);
    unpickling on an actor runs :meth:`DataRecipe.build` there, and since
    the dataset is a pure function of its section and the seed, every node
    builds the same clients.
    """

    def __init__(self, recipe: DataRecipe) -> None:
        self.recipe = recipe

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        r = self.recipe
        if r.links is None and not getattr(r.data, "client_test_fraction", 0.0):
            # the plain call, as before links and held-out rows
            return build_data, (r.data, r.num_clients, r.seed)
        return DataRecipe.build, (self.recipe,)


def _build_here(recipe: DataRecipe) -> str | None:
    """Build the dataset on this node: None, or why it cannot."""
    try:
        build_data(recipe.data, recipe.num_clients, recipe.seed)
    except (DataMissingError, DataError, OSError) as exc:
        return str(exc)
    return None


def check_data_on_nodes(recipe: DataRecipe) -> None:
    """Check that every live node with CPUs can build the dataset from its
    own disk (``resources.data: per_node``), before any actor starts.

    Args:
        recipe: how the run's data is built.

    Raises:
        DataMissingError: naming every node that cannot, and why.
    """
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = [n for n in ray.nodes() if n["Alive"] and n["Resources"].get("CPU")]
    check = ray.remote(_build_here)
    refs = [
        check.options(
            num_cpus=0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], False),
        ).remote(recipe)
        for n in nodes
    ]
    bad = [
        f"node {n['NodeID'][:12]} ({n['NodeManagerAddress']}, resources "
        f"{custom_resources(n['Resources'])}): {why}"
        for n, why in zip(nodes, ray.get(refs), strict=True)
        if why is not None
    ]
    if bad:
        raise DataMissingError(
            "resources.data per_node: every node that can host a worker must have "
            f"the data files; {len(bad)} of {len(nodes)} cannot build the dataset:\n"
            + "\n".join(bad)
        )


class RayExecutor(Executor):
    """``n`` long-lived Ray worker actors sharing one copy of the data, placed
    as ``resources.placement`` says; a call whose actor died is sent again.

    Actors restart without limit but Ray retries no task: this executor
    resends a dead actor's call itself, as :attr:`retry` says
    (:class:`fedsim.remote.actors.RetryPolicy`), so it can count the retried tasks
    and note lost nodes. A resent call recomputes the same update (it is a
    pure function of its arguments). Inside a warm pool's block
    (:func:`fedsim.remote.actors.warm_workers`) it takes over parked actors of its
    shape and parks its own when it shuts down.

    With the server as an actor (``resources.server.home: actor``),
    :meth:`train_apart` fetches only each update's :class:`UpdateSummary`
    into this process; the updates stay in the object store, as references
    the runtime hands to the server actor (the driver never fetches them).

    Args:
        setup: the executor's set-up record (the workers', the resources,
            the data's recipe).
        data: the dataset, put in the object store once (or, with
            ``resources.data: per_node``, a recipe each node builds from).
        n: the number of worker actors.

    Raises:
        PlacementError: the actors cannot be placed as asked.
        DataMissingError: a node cannot build the dataset (``per_node``).
    """

    # The class of the actors this executor starts (a test swaps in one that
    # is slow to restart: tests/test_faults.py).
    worker_class: type[RayWorker] = RayWorker
    # When a failed call is sent again (a test lowers its counts).
    retry: RetryPolicy = RetryPolicy()

    def __init__(self, setup: ExecutorSetup, data: FederatedData, n: int) -> None:
        import ray

        res = setup.resources
        self.placement = res.placement
        # the server actor fetches the updates itself (train_apart)
        self.apart = res.server.home == "actor"
        # Warm actors of this run's shapes are taken over below; every other
        # parked actor is killed first: its resources may be this run's.
        self._pool = current_pool()
        self._shape = ActorShape.of_workers(res)
        if self._pool is not None:
            keep = {self._shape, ActorShape.of_server(res)}
            self._pool.release(keep=keep, everything=False)
        self._token = secrets.token_hex(8)  # this run's (RayWorker)
        self._pg = None if res.placement == "spread" else placement_group_for(res, n)
        if res.data == "per_node":
            check_data_on_nodes(setup.recipe)
        # a list: Ray hands the reference itself to a (re)started actor
        shared = _NodeLocalData(setup.recipe) if res.data == "per_node" else data
        self._data: list[Ref] = [ray.put(shared)]
        # torch's threads in each actor: the worker record's figure
        threads = setup.worker.threads
        self._setup = (setup.worker, self._data, threads, self._token)
        pool = self._pool
        self.actors: list[Handle] = (
            pool.adopt(self._shape, n, self._setup) if pool else []
        )
        new: list[Handle] = [
            ray.remote(self.worker_class)
            .options(
                num_cpus=res.cpus_per_worker,
                num_gpus=res.gpus_per_worker,
                max_restarts=-1,
                max_task_retries=0,  # retried here, and counted
                scheduling_strategy=self._strategy(i),
            )
            .remote()  # no arguments: set up by a call (RayWorker)
            for i in range(len(self.actors), n)
        ]
        ray.get([a.setup_for.remote(*self._setup) for a in new])
        self.actors += new
        self._refs: dict[int, Ref] = {}
        self.tasks_retried = 0
        self._nodes: list[list[str]] = [[] for _ in range(n)]  # node ids, in order
        self._lost: dict[str, str] = {}  # node id -> its address
        self._known: dict[str, dict[str, object]] = {}
        self._locate()
        self._check_nodes()  # the nodes' resources, while they are alive

    def server_strategy(self) -> PlacementGroupSchedulingStrategy | None:
        """The server actor's scheduling strategy: the placement group's last
        bundle when it has one for the server, else None (placed by its
        resources alone)."""
        if self._pg is None or len(self._pg.bundle_specs) == len(self.actors):
            return None
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        return PlacementGroupSchedulingStrategy(self._pg, len(self.actors))

    @property
    def data_ref(self) -> Ref:
        """The dataset's reference in the object store (or its recipe's)."""
        return self._data[0]

    def _strategy(self, i: int) -> str | PlacementGroupSchedulingStrategy:
        """Actor ``i``'s scheduling strategy: SPREAD, or bundle i of the
        placement group."""
        if self._pg is None:
            return "SPREAD"
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        return PlacementGroupSchedulingStrategy(self._pg, i)  # bundle i

    def _apart(self, batch: Batch) -> Apart:
        """:meth:`Executor.train_apart`; for a server actor, each update's
        summary (fetched here) and an object reference to the update (not
        fetched: each worker call returns them as separate objects)."""
        if not self.apart:
            return super()._apart(batch)
        kept: dict[int, UpdateSummary] = {}
        parcels: dict[int, Parcel] = {}
        calls = self._plan(batch)
        for c, (summaries, refs) in zip(calls, self._gather(calls, True), strict=True):
            kept.update(zip(c.positions, summaries, strict=True))
            parcels.update(zip(c.positions, refs, strict=True))
        order = range(len(batch.tasks))
        return Apart([kept[j] for j in order], [parcels[j] for j in order])

    def _calls(self, batch: Batch) -> Calls:
        calls = self._plan(batch)
        yield from zip((c.positions for c in calls), self._gather(calls), strict=True)

    def _plan(self, batch: Batch) -> list[_Call]:
        """The actor calls that train ``batch.tasks``."""
        tasks, payloads, states, instructions = batch
        where = {id(t): j for j, t in enumerate(tasks)}
        calls: list[_Call] = []
        # Longest first across the whole batch; each actor then gets one call
        # per start version in its share (calls on one actor run in order).
        chunks = assign_lpt(tasks, len(self.actors))
        for actor, chunk in zip(self.actors, chunks, strict=True):
            for v, idx in _versions(chunk).items():
                group = [chunk[j] for j in idx]
                args = (
                    self._payload_ref(v, payloads),
                    group,
                    _own(group, states),
                    _own(group, instructions),
                )
                calls.append(_Call([where[id(t)] for t in group], actor, args))
        return calls

    def _evaluations(
        self, x: torch.Tensor, clients: list[int], batch_size: int
    ) -> list[ClientEvaluation]:
        """The clients dealt round-robin over the actors, one call each,
        gathered (and resent when an actor dies) as training calls are."""
        import ray

        ref = ray.put(ship(x))  # one copy, read by every call
        n = len(self.actors)
        calls = [
            _Call(
                list(range(j, len(clients), n)),
                actor,
                (ref, clients[j::n], batch_size),
                "evaluate_clients",
            )
            for j, actor in enumerate(self.actors)
            if clients[j::n]
        ]
        return [r for res in self._gather(calls) for r in res]

    def _payload_ref(self, version: int, payloads: Payloads) -> Ref:
        """``version``'s payload in the object store, put there once and kept
        until :meth:`forget` (every actor call reads the same copy)."""
        if version not in self._refs:
            import ray

            self._refs[version] = ray.put(ship_all(payloads[version]))
        return self._refs[version]

    def _send(self, call: _Call, split: bool) -> list[Ref]:
        """Send ``call`` to its actor, for this run (its token); its object
        references: ``[updates]``, or with ``split`` ``[summaries, update_1,
        ..., update_n]``."""
        if not split:
            method = getattr(call.actor, call.method)
            return [method.remote(*call.args, token=self._token)]
        method = call.actor.train_apart.options(num_returns=1 + len(call.positions))
        return list(method.remote(*call.args, token=self._token))

    def _gather(self, calls: list[_Call], split: bool = False) -> list:
        """Every call's result, in call order, retrying dead actors' calls.

        Results are taken as they finish (``ray.wait``), so a slow actor
        does not hold up collecting the others; a call whose actor died or
        is restarting is resent as :attr:`retry` says (its docstring has the
        table of cases), its tasks counted once in ``tasks_retried``.

        Args:
            calls: the actor calls.
            split: call ``RayWorker.train_apart`` and fetch only the summaries:
                each result is then (summaries, references to the updates),
                the references of the call's last, successful attempt.

        Raises:
            RayActorError: a call failed for good (see above).
            StaleWorkerError: an actor could not be set up for this run.
        """
        import ray

        results: list[object] = [None] * len(calls)
        sent = [self._send(c, split) for c in calls]
        pending = {refs[0]: k for k, refs in enumerate(sent)}
        failed = CallFailures()
        while pending:
            (ref,), _ = ray.wait(list(pending), num_returns=1)
            k = pending.pop(ref)
            try:
                first = ray.get(ref)  # with split, the summaries alone
                results[k] = (first, sent[k][1:]) if split else first
                continue
            except (ray.exceptions.RayActorError, StaleWorkerError) as error:
                # an actor Ray restarted comes back serving no run: being set
                # up again is part of its restart, not another death
                restarting = isinstance(
                    error, (ray.exceptions.ActorUnavailableError, StaleWorkerError)
                )
                attempts = failed.record(k, restarting, time.monotonic())
                delay = self.retry.after(attempts)
                if delay is None:
                    raise
                if attempts.failures == 1:  # the call's tasks count once
                    self.tasks_retried += len(calls[k].positions)
                if isinstance(error, StaleWorkerError):
                    self._set_up_again(calls[k].actor)
            except ray.exceptions.RayTaskError as error:
                # (after the clause above: a StaleWorkerError arrives as a
                # RayTaskError too) plug-in code failed on the worker: the
                # same error as in process, never retried (it would fail again)
                if isinstance(error.cause, PluginFailure):
                    raise error.cause from None
                raise
            self._check_nodes()
            time.sleep(delay)  # while Ray restarts the actor
            sent[k] = self._send(calls[k], split)  # new references replace the lost
            pending[sent[k][0]] = k
        return results

    def _set_up_again(self, actor: Handle) -> None:
        """Set up for this run an actor Ray restarted (it serves no run), and
        wait for it: a set-up that fails raises its own error (a RayTaskError
        whose cause is the worker's), which no resend would cure; an actor
        that died again meanwhile is left to the resend's retry.

        Raises:
            RayTaskError: the worker's set-up raised.
        """
        import ray

        with contextlib.suppress(ray.exceptions.RayActorError):
            ray.get(actor.setup_for.remote(*self._setup))

    def _locate(self, timeout: float | None = None) -> list[dict[str, object]]:
        """Add each actor's current node to its history; their GPU shares."""
        import ray

        refs = [a.__ray_call__.remote(_where) for a in self.actors]
        now = ray.get(refs, timeout=timeout)
        for hist, (node, _) in zip(self._nodes, now, strict=True):
            if not hist or hist[-1] != node:
                hist.append(node)
        return [gpus for _, gpus in now]

    def _check_nodes(self) -> None:
        """Note, and say, which nodes that ran a worker are gone."""
        import ray

        for node in ray.nodes():
            nid = node["NodeID"]
            if node["Alive"] or nid not in self._known:  # dead: lists no resources
                self._known[nid] = {
                    "node_id": nid,
                    "address": node["NodeManagerAddress"],
                    "resources": custom_resources(node.get("Resources", {})),
                }
            ran_here = any(nid in hist for hist in self._nodes)
            if ran_here and not node["Alive"] and nid not in self._lost:
                self._lost[nid] = node["NodeManagerAddress"]
                print(
                    f"warning: Ray node {nid[:12]} ({self._lost[nid]}) was lost; "
                    f"its workers restart on the remaining nodes "
                    f"({self.tasks_retried} tasks retried so far)",
                    file=sys.stderr,
                    flush=True,
                )

    def report(self) -> dict[str, object]:
        """summary.json's ``placement``, ``workers_nodes`` (per worker, the
        nodes it ran on), ``workers_gpus`` (per worker, :func:`_where`),
        ``nodes_lost`` and ``tasks_retried``."""
        self._check_nodes()
        gpus: list[dict[str, object]] = []
        with contextlib.suppress(Exception):  # a report must not fail the run
            gpus = self._locate(timeout=30)
        self._check_nodes()
        unknown: dict[str, object] = {"address": None, "resources": {}}
        return {
            "workers_gpus": gpus,
            "placement": self.placement,
            "workers_nodes": [
                [self._known.get(n, {"node_id": n, **unknown}) for n in hist]
                for hist in self._nodes
            ],
            "nodes_lost": len(self._lost),
            "tasks_retried": self.tasks_retried,
        }

    def forget(self, version: int) -> None:
        """Drop this executor's reference to ``version``'s payload, so Ray
        frees it once no running call holds it."""
        self._refs.pop(version, None)

    def pids(self) -> list[int]:
        """The actors' process ids."""
        import ray

        return ray.get([a.pid.remote() for a in self.actors])

    def shutdown(self) -> None:
        """Kill the actors, or inside a warm pool's block park them for the
        next run, and remove the placement group (idempotent)."""
        import ray

        pool, shape = self._pool, self._shape
        if pool is not None and shape is not None and not pool.closed:
            pool.park(shape, self.actors, self._data)
        else:
            for a in self.actors:
                kill(a)
        self.actors = []
        self._refs.clear()
        if self._pg is not None:
            ray.util.remove_placement_group(self._pg)
            self._pg = None
