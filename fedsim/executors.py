"""Executors: where local training runs, chosen once per run: in this process
(``workers: 0``) or on ``n`` Ray worker actors (docs/architecture.md), with the
same results. A new executor subclasses :class:`Executor` with a ``_calls``.

Example:
    >>> from fedsim import data, runtime, scenario, server, workers
    >>> sc = scenario.load_scenario("scenarios/quickstart.yaml")
    >>> setup, fed = runtime.run_setup(sc), data.build_data(sc.data, 30, sc.seed)
    >>> ex = runtime.make_executor(setup.executor, fed, workers=0)
    >>> tasks = [workers.Task(3, 0, 5), workers.Task(1, 0, 2)]
    >>> ups = ex.train(tasks, {0: server.Server(setup.server, fed).payload()}, {})
    >>> [(u.client, u.tau) for u in ups]
    [(3, 5), (1, 2)]
    >>> ex.shutdown()
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from fedsim.algorithms.base import ClientEvaluation, ClientState, ClientUpdate
from fedsim.data import FederatedData, build_data
from fedsim.data.base import DatasetSpec
from fedsim.data.heldout import with_heldout
from fedsim.fleet import Fleet, FleetSpec
from fedsim.links import LinksSpec, apply_links
from fedsim.spec import ResourceSpec
from fedsim.tasks import Parcel, UpdateSummary, WorkerSetup
from fedsim.workers import Payload, Task, Worker

if TYPE_CHECKING:
    import torch

    from fedsim.server import RoundServer

Tasks = Sequence[Task]
Payloads = Mapping[int, Payload]  # by server version
States = Mapping[int, ClientState]  # by client id
# per-client payload entries by client id (Algorithm.instruct)
Instructions = Mapping[int, Payload]
Updates = list[ClientUpdate]
Calls = Iterator[tuple[list[int], Updates]]  # task positions, their updates


@dataclass(frozen=True)
class DataRecipe:
    """The run's training data as a pure function of these fields: what a
    node builds for itself with ``resources.data: per_node`` (the runtime
    builds the same in the driver).

    Attributes:
        data: the ``data`` section.
        num_clients: the fleet's size.
        seed: the run's seed.
        fleet: the fleet section (fleet-data links tie clients to devices).
        links: the ``links`` section, or None (the partitions as they are).
    """

    data: DatasetSpec
    num_clients: int
    seed: int
    fleet: FleetSpec
    links: LinksSpec | None = None

    def build(self) -> FederatedData:
        """The training data, tied to the fleet as ``links`` declares, then
        the clients' own held-out rows taken (``client_test_fraction``)."""
        data = build_data(self.data, self.num_clients, self.seed)
        if self.links is not None:
            fleet = Fleet.from_spec(self.fleet, self.seed)
            data = apply_links(self.links, fleet, data, self.seed, self.fleet)
        return with_heldout(self.data, data, self.seed)


@dataclass(frozen=True)
class ExecutorSetup:
    """What an executor needs of the run, built once by the runtime.

    Attributes:
        worker: what every worker is set up with.
        resources: the ``resources`` section (workers' CPUs and GPUs,
            placement, the data's transport, the server's home).
        recipe: how a node builds the data itself (``per_node``).
    """

    worker: WorkerSetup
    resources: ResourceSpec
    recipe: DataRecipe


class Apart(NamedTuple):
    """A batch's updates in task order, as the runtime uses them.

    Attributes:
        kept: what the driver reads for its rows and the selector: the
            updates themselves, or (server actor) their summaries.
        parcels: what the driver hands to the server's ``apply``: the same
            updates, or (server actor) Ray object references to them, which
            the actor fetches from the workers without the driver.
    """

    kept: list[ClientUpdate] | list[UpdateSummary]
    parcels: list[Parcel]


class Batch(NamedTuple):
    """One training call's arguments (:meth:`Executor.train`), as an
    executor hands them on to its own calls (instructions: {} for none)."""

    tasks: Tasks
    payloads: Payloads
    states: States
    instructions: Instructions


class Executor(ABC):
    """Trains tasks; chosen once per run by :func:`fedsim.runtime.make_executor`.

    Guarantees (every executor, checked by one contract test): an update is
    a pure function of (payload, task, client state), so the result does
    not depend on the executor, the number of workers, which worker trained
    which task, or the order results came back in.
    """

    def train(
        self,
        tasks: Tasks,
        payloads: Payloads,
        states: States,
        instructions: Instructions | None = None,
    ) -> Updates:
        """One update per task, in task order.

        Args:
            tasks: what to train; ``task.version`` keys ``payloads``.
            payloads: what clients download, per server version.
            states: persistent client state by client id (missing: ``{}``).
            instructions: per-client payload entries by client id
                (``Algorithm.instruct``; missing: none), carried with the
                client's task as its state is.

        Returns:
            One :class:`ClientUpdate` per task, on the CPU, in task order
            (whatever order the executor's calls finished in).
        """
        batch = Batch(tasks, payloads, states, instructions or {})
        out: dict[int, ClientUpdate] = {}
        for idx, ups in self._calls(batch):
            out.update(zip(idx, ups, strict=True))
        return [out[j] for j in range(len(tasks))]

    def train_apart(
        self,
        tasks: Tasks,
        payloads: Payloads,
        states: States,
        instructions: Instructions | None = None,
    ) -> Apart:
        """:meth:`train`, with the updates split between driver and server
        (the arguments are :meth:`train`'s).

        Returns:
            One entry per task in each half, in task order.
        """
        return self._apart(Batch(tasks, payloads, states, instructions or {}))

    def _apart(self, batch: Batch) -> Apart:
        """:meth:`train_apart`: here (the server in the driver, or no Ray)
        both halves are the :meth:`train` list itself; a
        :class:`~fedsim.remote.executor.RayExecutor` for a server actor
        returns summaries and object references instead."""
        ups = self.train(*batch)
        return Apart(ups, list[Parcel](ups))

    @abstractmethod
    def _calls(self, batch: Batch) -> Calls:
        """Train ``batch.tasks``; yield (positions in them, their updates)."""

    def evaluate(
        self, x: torch.Tensor, clients: Sequence[int], batch_size: int
    ) -> list[ClientEvaluation]:
        """Federated evaluation: the global model ``x`` on each client's own
        held-out rows, where the clients' data lives (the workers), by
        forward passes only.

        Args:
            x: the global model's flat parameters.
            clients: the evaluating clients (each with held-out rows).
            batch_size: samples per forward pass (``eval.batch_size``).

        Returns:
            One :class:`ClientEvaluation` per client, in ascending client
            id, whichever worker evaluated which client.
        """
        ids = sorted(int(c) for c in clients)
        if not ids:
            return []
        results = self._evaluations(x, ids, batch_size)
        return sorted(results, key=lambda r: r.client)

    @abstractmethod
    def _evaluations(
        self, x: torch.Tensor, clients: list[int], batch_size: int
    ) -> list[ClientEvaluation]:
        """Evaluate ``clients`` (ascending); their results, in any order."""

    def forget(self, version: int) -> None:  # noqa: B027 - most hold nothing
        """No task will start from ``version`` again (free its payload).

        Args:
            version: a server version the runtime will not train from again.
        """

    def shutdown(self) -> None:  # noqa: B027
        """Release the workers (the executor cannot train afterwards)."""

    def report(self) -> dict[str, object]:
        """Fields for summary.json about where the work ran ({} in-process)."""
        return {}


class Placement(NamedTuple):
    """Where a run's server and training live, chosen together once per run
    (:func:`fedsim.runtime.place`): the loops call both alike wherever
    ``resources.server.home`` and the worker count put them.

    Attributes:
        server: the :class:`~fedsim.server.Server` in the driver, or the
            driver's handle on the server actor.
        executor: in-process, or the Ray workers (beside the server actor).
    """

    server: RoundServer
    executor: Executor


def _versions(tasks: Tasks) -> dict[int, list[int]]:
    """Task positions grouped by start version, versions in increasing order."""
    groups: dict[int, list[int]] = {}
    for j, t in sorted(enumerate(tasks), key=lambda jt: jt[1].version):
        groups.setdefault(t.version, []).append(j)
    return groups


class InProcessExecutor(Executor):
    """One worker in this process (``workers: 0``): no Ray, same results.

    Args:
        setup: the worker's set-up record (it builds model and solver, and
            sets torch's threads to ``setup.threads``).
        data: the federated dataset, shared with the server (not copied).
    """

    def __init__(self, setup: WorkerSetup, data: FederatedData) -> None:
        self.worker = Worker(setup, data, setup.threads)

    def _calls(self, batch: Batch) -> Calls:
        # one worker call per start version: a call trains from one payload
        tasks, payloads, states, instructions = batch
        for v, idx in _versions(tasks).items():
            group = [tasks[j] for j in idx]
            yield idx, self.worker.train(payloads[v], group, states, instructions)

    def _evaluations(
        self, x: torch.Tensor, clients: list[int], batch_size: int
    ) -> list[ClientEvaluation]:
        return self.worker.evaluate_clients(x, clients, batch_size)
