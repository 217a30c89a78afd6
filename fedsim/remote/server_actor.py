"""The server as a Ray actor (``resources.server.home: actor``).

The actor runs the same :class:`fedsim.server.Server` code as the driver
does; :class:`RemoteServer` is the driver's handle on it and offers the
methods the runtime calls on a ``Server`` (``payload``, ``client_states``,
``apply``, ``evaluate``, ``params``, ``save``, ``load``), so both loops are
written once for both homes (docs/architecture.md, "Where the server runs").

Guarantees: the same scenario and seed give bit-identical results in both
homes (the actor uses the driver's thread count and the same code); the
actor is never restarted, since a fresh one would have lost the state, so
its loss raises :class:`ServerLost` and the run stops at its last
checkpoint. Checkpoints are written by the driver from the snapshot the
actor returns, so they land in the driver's run directory wherever the
actor runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import torch

from fedsim.algorithms.base import ClientState, ClientUpdate
from fedsim.data import FederatedData
from fedsim.errors import RunError
from fedsim.executors import ExecutorSetup, Placement
from fedsim.remote.actors import ActorShape, Handle, current_pool, kill
from fedsim.remote.executor import RayExecutor
from fedsim.remote.placement import PlacementError
from fedsim.server import (
    Applied,
    Instructions,
    Payload,
    Server,
    ServerSetup,
    Step,
    read_state,
    server_device,
    write_state,
)
from fedsim.spec import ResourceSpec

if TYPE_CHECKING:
    from ray import ObjectRef as Ref
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    Strategy = PlacementGroupSchedulingStrategy

_T = TypeVar("_T")


class ServerLost(RunError, RuntimeError):
    """The server actor died (its node was lost); the run cannot go on."""


class UpdatesLost(ServerLost):
    """An update the server actor was to fetch is gone (the node that held
    it was lost after its worker's call ended): the round cannot be applied,
    and the run stops at its last checkpoint as when the actor is lost."""


class ServerActor(Server):
    """The body of the Ray actor: the :class:`Server` itself, whose methods
    the driver's :class:`RemoteServer` calls, and a few of the actor's own.

    The server's work runs on CUDA when Ray assigned the actor a GPU
    (``resources.server.gpus > 0``) and torch sees one
    (:func:`fedsim.server.server_device`), else on the CPU; its state stays
    on the CPU either way.

    Args:
        setup: the server's set-up record (built by the driver's runtime).
        data: the federated dataset (Ray resolves the driver's reference).
        threads: torch's intra-op threads, the driver's figure (the same
            reductions, so the same floats).
    """

    def __init__(self, setup: ServerSetup, data: FederatedData, threads: int) -> None:
        import ray

        torch.set_num_threads(threads)
        res = ray.get_runtime_context().get_assigned_resources()
        gpus = res.get("GPU", 0.0) if ray.get_gpu_ids() else 0.0
        super().__init__(setup, data, server_device(gpus, torch.cuda.is_available()))

    def setup_for(self, setup: ServerSetup, data: FederatedData, threads: int) -> int:
        """Become the server a new actor for this run would be (a warm actor
        taken over by a later run, :func:`fedsim.executors.warm_workers`):
        a new :class:`Server`, nothing kept. Returns d."""
        self.__dict__.clear()
        ServerActor.__init__(self, setup, data, threads)
        return self.num_params

    def park(self) -> None:
        """Drop the run's server while the actor waits for the next run."""
        self.__dict__.clear()

    def d(self) -> int:
        """d, the model's number of parameters (a method: an actor's
        properties cannot be called remotely)."""
        return self.num_params

    def apply_refs(self, updates: Sequence[ClientUpdate | Ref], at: Step) -> Applied:
        """:meth:`Server.apply` on updates given as object references.

        Args:
            updates: each a reference to one :class:`ClientUpdate` (a
                worker's return value: it goes worker -> object store ->
                here, not via the driver) or an update itself, in the order
                ``Server.apply`` takes them.
            at: as :meth:`Server.apply`.

        Raises:
            UpdatesLost: an update's object is gone (the driver's
                :meth:`RemoteServer.apply` raises it as itself).
        """
        import ray

        refs = [u for u in updates if isinstance(u, ray.ObjectRef)]
        try:  # all at once: Ray pulls them in parallel
            fetched = iter(ray.get(refs))
        except ray.exceptions.ObjectLostError as exc:
            raise UpdatesLost(
                f"not all {len(refs)} updates could be fetched "
                f"({type(exc).__name__}): "
                "a worker's node was lost before the server actor read its update"
            ) from None
        ups: list[ClientUpdate] = [
            next(fetched) if isinstance(u, ray.ObjectRef) else u for u in updates
        ]
        return self.apply(ups, at)

    def where(self) -> dict[str, object]:
        """This actor's node, address, CPU/GPU share and device."""
        import ray

        ctx = ray.get_runtime_context()
        res = ctx.get_assigned_resources()
        return {
            "node_id": ctx.get_node_id(),
            "address": ray.util.get_node_ip_address(),
            "cpus": res.get("CPU", 0.0),
            "gpus": res.get("GPU", 0.0),
            "gpu_ids": [str(i) for i in ray.get_gpu_ids()],
            "resources": {
                k: v for k, v in res.items() if k not in ("CPU", "GPU", "memory")
            },
            # where the server's work ran (its state stays on the CPU)
            "device": str(self.device),
        }


class RemoteServer:
    """The driver's handle on a :class:`ServerActor`: the
    :class:`~fedsim.server.RoundServer` methods, each a call of the actor's
    method of the same name, waited for.

    Args:
        setup: the server's set-up record.
        resources: the ``resources`` section (``server`` places the actor,
            ``placement_timeout_s`` bounds the wait for its placement when
            it asks for resources of its own outside a bundle).
        data: the dataset, or a reference to it already in the object store.
        strategy: the scheduling strategy (a placement group bundle) or None
            to place the actor by its resources alone.
        threads: torch's intra-op threads in the actor.

    Raises:
        PlacementError: Ray could not place the actor within
            ``resources.placement_timeout_s``.
    """

    def __init__(
        self,
        setup: ServerSetup,
        resources: ResourceSpec,
        data: FederatedData | Ref,
        strategy: Strategy | None,
        threads: int,
    ) -> None:
        import ray

        spec = resources.server
        opts: dict[str, object] = {
            "num_cpus": spec.cpus,
            "num_gpus": spec.gpus,
            "resources": dict(spec.resources),
            "max_restarts": 0,  # a new actor would have lost the state
        }
        if strategy is not None:
            opts["scheduling_strategy"] = strategy
        ref = data if isinstance(data, ray.ObjectRef) else ray.put(data)
        # a warm actor parked by the last run, if any (never in a bundle)
        self._pool = current_pool()
        self._shape = ActorShape.of_server(resources) if strategy is None else None
        pool, args = self._pool, (setup, ref, threads)
        warm = pool.adopt(self._shape, 1, args) if pool is not None else []
        remote: Handle = ray.remote(ServerActor)  # Ray's stubs type it as the class
        self.actor: Handle | None = (
            warm[0] if warm else remote.options(**opts).remote(*args)
        )
        # The first call waits for the placement and the process's start.
        # Placement is bounded by placement_timeout_s; a start is not, as
        # the workers' is not (on a machine loaded beyond its cores, Python,
        # torch and the data took over 60 s to start, and a run failed
        # blaming placement): an actor in a bundle of the run's placement
        # group, which was placed before it (placement.py), or one that asks
        # for no resources has nothing to wait for but its start (Ray
        # reports a process that dies as RayActorError).
        placed = strategy is not None or not (spec.cpus or spec.gpus or spec.resources)
        limit = None if placed else resources.placement_timeout_s
        try:
            d = ray.get(self._actor.d.remote(), timeout=limit)
        except ray.exceptions.GetTimeoutError:
            kill(self._actor)
            raise PlacementError(
                f"resources.server {spec.model_dump()}: the server actor was "
                "not placed and started within resources.placement_timeout_s = "
                f"{resources.placement_timeout_s:g}s; the cluster has "
                f"{ray.cluster_resources()} in all, the workers included (ask "
                "for fewer server CPUs, or cpus: 0 to share a worker's; on a "
                "busy machine its process may only be slow to start: raise "
                "resources.placement_timeout_s)"
            ) from None
        self.num_params = int(d)
        self.algorithm = setup.algorithm
        self._where: dict[str, object] = {}

    @property
    def _actor(self) -> Handle:
        """The actor (RuntimeError once shut down)."""
        if self.actor is None:
            raise RuntimeError("the server actor was shut down")
        return self.actor

    def _get(self, ref: Ref[_T]) -> _T:
        """``ray.get(ref)``; the actor's own errors as themselves.

        Raises:
            ServerLost: the actor (or its node) is gone.
        """
        import ray

        try:
            return ray.get(ref)
        except ray.exceptions.RayActorError as exc:
            raise ServerLost(
                f"the server actor died ({type(exc).__name__}); its node may "
                "have been lost (a resume can place it elsewhere: --set "
                "resources.server.resources={node_x: 0.01})"
            ) from None
        except ray.exceptions.RayTaskError as exc:
            raise exc.cause from None  # e.g. DivergenceError, CheckpointError

    def evaluate(self) -> tuple[float, float]:
        """:meth:`Server.evaluate` on the actor."""
        return self._get(self._actor.evaluate.remote())

    def objective(self) -> float:
        """:meth:`Server.objective` on the actor."""
        return self._get(self._actor.objective.remote())

    def payload(self) -> Payload:
        """:meth:`Server.payload` on the actor (a copy, as there)."""
        return self._get(self._actor.payload.remote())

    def params(self) -> torch.Tensor:
        """:meth:`Server.params` on the actor (a copy)."""
        return self._get(self._actor.params.remote())

    def client_states(self, clients: Sequence[int]) -> dict[int, ClientState]:
        """:meth:`Server.client_states` on the actor."""
        return self._get(self._actor.client_states.remote(list(clients)))

    def apply(self, updates: Sequence[ClientUpdate | Ref], at: Step) -> Applied:
        """:meth:`Server.apply` on the actor.

        Args:
            updates: the updates, or object references to them (each the
                return value of a worker call, see
                :meth:`fedsim.remote.executor.RayExecutor.train_apart`): Ray
                passes references inside a list as they are, so the actor
                fetches the updates from the workers, not from the driver.
            at: as :meth:`Server.apply`.
        """
        parcels = list(updates)  # nested in a list: Ray does not resolve them here
        return self._get(self._actor.apply_refs.remote(parcels, at))

    def instructions(self, clients: Sequence[int], round: int) -> Instructions:
        """:meth:`Server.instructions` on the actor."""
        return self._get(self._actor.instructions.remote(list(clients), round))

    def save(self, path: Path) -> None:
        """Write the actor's snapshot into ``path`` from this process, so the
        checkpoint lands in the driver's run directory."""
        write_state(path, self._get(self._actor.export_state.remote()))

    def load(self, path: Path) -> None:
        """Send the checkpoint in ``path`` to the actor."""
        self._get(self._actor.import_state.remote(read_state(path), str(path)))

    def report(self) -> dict[str, object]:
        """summary.json's ``server``: where the actor runs (its last known
        place once it is gone)."""
        import contextlib

        with contextlib.suppress(Exception):  # a report must not fail the run
            self._where = self._get(self._actor.where.remote())
        return {"home": "actor", **self._where}

    def shutdown(self) -> None:
        """Kill the actor, or inside a warm pool's block park it for the
        next run (idempotent)."""
        if self.actor is None:
            return
        pool, shape = self._pool, self._shape
        if pool is not None and shape is not None and not pool.closed:
            pool.park(shape, [self.actor], pin=None)  # never restarted: no pin
        else:
            kill(self.actor)
        self.actor = None


def on_actor(
    setup: ExecutorSetup,
    server: ServerSetup,
    data: FederatedData,
    workers: int,
    threads: int,
) -> Placement:
    """The remote side's placement (``resources.server.home: actor``): the
    Ray workers first, then the server actor placed with them, in their
    placement group when they have one, sharing their copy of the data.

    Args:
        setup: the executor's set-up record (its ``resources`` place both).
        server: the server's set-up record.
        data: the federated dataset.
        workers: the number of Ray worker actors (at least 1).
        threads: torch's threads in the actor, the driver's figure, so the
            server's reductions (and floats) are the driver's.

    Raises:
        PlacementError: the workers or the actor cannot be placed in time.
    """
    ex = RayExecutor(setup, data, workers)
    strategy = ex.server_strategy()
    actor = RemoteServer(server, setup.resources, ex.data_ref, strategy, threads)
    return Placement(actor, ex)
