"""Executors: where local training runs, chosen once per run.

An executor trains a batch of tasks and returns one
:class:`~fedsim.algorithms.base.ClientUpdate` per task, in task order. Each
task names the server version it starts from (``Task.version``), the key of
its payload in ``payloads``; a synchronous round has one version, an
asynchronous batch several. Both modes, and every test, go through the same
:meth:`Executor.train`:

- :class:`InProcessExecutor`: one :class:`~fedsim.workers.Worker` in this
  process (``workers: 0``; the path unit tests take).
- :class:`RayExecutor`: ``n`` long-lived Ray worker actors; tasks are spread
  longest-tau first, each version's payload goes into the object store once,
  and each actor receives only its own share of the client states.

Whether a worker trains its clients one after another or many at once
(``resources.vectorize``, :mod:`fedsim.vectorized`) is decided when the worker
is built; the executor does not know. Results do not depend on the executor
(nor on the number of actors): a client's update is a pure function of its
payload, task and state (``tests/test_executors.py``).

Adding an executor means subclassing :class:`Executor` with a ``_calls``
method (and ``forget``/``shutdown`` where it holds resources).

Example:
    >>> from fedsim import data, scenario, server, workers
    >>> sc = scenario.load_scenario("scenarios/quickstart.yaml")
    >>> fed = data.build_data(sc.data, sc.num_clients, sc.seed)
    >>> ex = make_executor(sc, fed, workers=0)
    >>> tasks = [workers.Task(3, 0, 5), workers.Task(1, 0, 2)]
    >>> ups = ex.train(tasks, {0: server.Server(sc, fed).payload()}, {})
    >>> [(u.client, u.tau) for u in ups]
    [(3, 5), (1, 2)]
    >>> ex.shutdown()
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, cast

import torch

from fedsim.algorithms.base import ClientState, ClientUpdate
from fedsim.data import FederatedData
from fedsim.scenario import Scenario
from fedsim.workers import Task, Worker, assign_lpt

__all__ = [
    "Executor",
    "InProcessExecutor",
    "RayExecutor",
    "make_executor",
    "resolve_workers",
]

Payload = dict[str, torch.Tensor]
Tasks = Sequence[Task]
Payloads = Mapping[int, Payload]  # by server version
States = Mapping[int, ClientState]  # by client id
Updates = list[ClientUpdate]
Calls = Iterator[tuple[list[int], Updates]]  # task positions, their updates


class Executor(ABC):
    """Trains tasks; chosen once per run by :func:`make_executor`.

    An implementation says how its calls run (:meth:`_calls`); the base
    puts their updates back in task order.
    """

    size: int  # workers (1 in-process)

    def train(self, tasks: Tasks, payloads: Payloads, states: States) -> Updates:
        """One update per task, in task order.

        Args:
            tasks: what to train; ``task.version`` keys ``payloads``.
            payloads: what clients download, per server version.
            states: persistent client state by client id (stateful
                algorithms; a missing client starts from ``{}``).
        """
        out: list[ClientUpdate | None] = [None] * len(tasks)
        for idx, ups in self._calls(tasks, payloads, states):
            for j, u in zip(idx, ups, strict=True):
                out[j] = u
        assert all(u is not None for u in out)
        return cast(Updates, out)

    @abstractmethod
    def _calls(self, tasks: Tasks, payloads: Payloads, states: States) -> Calls:
        """Train ``tasks``; yield (positions in ``tasks``, their updates)."""

    def forget(self, version: int) -> None:  # noqa: B027 - most hold nothing
        """No task will start from ``version`` again (free its payload)."""

    def shutdown(self) -> None:  # noqa: B027
        """Release the workers."""


def _versions(tasks: Tasks) -> dict[int, list[int]]:
    """Task positions grouped by start version, versions in increasing order."""
    groups: dict[int, list[int]] = {}
    for j, t in sorted(enumerate(tasks), key=lambda jt: jt[1].version):
        groups.setdefault(t.version, []).append(j)
    return groups


class InProcessExecutor(Executor):
    """One worker in this process."""

    size = 1

    def __init__(self, scenario: Scenario, data: FederatedData) -> None:
        threads = max(1, int(scenario.resources.cpus_per_worker))
        self.worker = Worker(scenario, data, threads=threads)

    def _calls(self, tasks: Tasks, payloads: Payloads, states: States) -> Calls:
        for v, idx in _versions(tasks).items():
            yield idx, self.worker.train(payloads[v], [tasks[j] for j in idx], states)


class RayExecutor(Executor):
    """``n`` long-lived Ray worker actors sharing one copy of the data.

    The data goes into the object store once; each actor receives its
    reference inside a list (so Ray hands the reference itself to the
    constructor, and an actor that Ray restarts after a crash fetches the
    same copy again). Actors restart without limit and retry their tasks:
    an update is a pure function of payload, task and state, so a retried
    task gives the same bits.
    """

    def __init__(self, scenario: Scenario, data: FederatedData, n: int) -> None:
        import ray

        res = scenario.resources
        remote: Any = ray.remote(Worker).options(
            num_cpus=res.cpus_per_worker,
            num_gpus=res.gpus_per_worker,
            max_restarts=-1,
            max_task_retries=3,
            scheduling_strategy="SPREAD",
        )
        self._data = [ray.put(data)]
        threads = max(1, int(res.cpus_per_worker))
        self.actors: list[Any] = [
            remote.remote(scenario, self._data, threads) for _ in range(n)
        ]
        self.size = n
        self._refs: dict[int, Any] = {}

    def _calls(self, tasks: Tasks, payloads: Payloads, states: States) -> Calls:
        import ray

        where = {id(t): j for j, t in enumerate(tasks)}
        calls: list[tuple[list[int], Any]] = []
        # Longest first across the whole batch; each actor then gets one call
        # per start version in its share (calls on one actor run in order).
        for actor, chunk in zip(self.actors, assign_lpt(tasks, self.size), strict=True):
            for v, idx in _versions(chunk).items():
                if v not in self._refs:
                    self._refs[v] = ray.put(payloads[v])
                group = [chunk[j] for j in idx]
                mine = {t.client: states[t.client] for t in group if t.client in states}
                ref = actor.train.remote(self._refs[v], group, mine)
                calls.append(([where[id(t)] for t in group], ref))
        results = ray.get([ref for _, ref in calls])
        yield from zip((idx for idx, _ in calls), results, strict=True)

    def forget(self, version: int) -> None:
        self._refs.pop(version, None)

    def pids(self) -> list[int]:
        """The actors' process ids."""
        import ray

        return ray.get([a.pid.remote() for a in self.actors])

    def shutdown(self) -> None:
        import ray

        for a in self.actors:
            ray.kill(a)
        self.actors = []
        self._refs.clear()


def resolve_workers(scenario: Scenario, override: int | None) -> int:
    """Number of worker actors: the override, the scenario, or one per CPU of
    the Ray cluster (0 means in-process)."""
    if override is not None:
        return override
    w = scenario.resources.workers
    if w != "auto":
        return int(w)
    import ray

    cpus = ray.cluster_resources().get("CPU", 1.0) if ray.is_initialized() else 1.0
    return max(1, int(cpus // scenario.resources.cpus_per_worker))


def make_executor(scenario: Scenario, data: FederatedData, workers: int) -> Executor:
    """The run's executor: in-process for ``workers == 0``, else ``workers``
    Ray actors (Ray must be initialised)."""
    if workers == 0:
        return InProcessExecutor(scenario, data)
    return RayExecutor(scenario, data, workers)
