"""Workers: a model and the data, training many virtual clients for exactly
the ``tau_i(t)`` steps the clock decided; client state travels with the task
(docs/architecture.md). The example in :mod:`fedsim.server` trains with one."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import replace
from functools import partial
from itertools import islice
from typing import TYPE_CHECKING

import numpy as np
import torch

from fedsim import hooks
from fedsim.algorithms import ClientUpdate
from fedsim.algorithms.base import (
    Algorithm,
    ClientContext,
    ClientEvaluation,
    ClientInfo,
    ClientState,
    LocalTraining,
)
from fedsim.compression import Compressor, compress_update, compression_generator
from fedsim.data import FederatedData
from fedsim.data.base import as_tensor as _tensor
from fedsim.minibatches import batches, client_seed
from fedsim.models import batch_loss, evaluate, make_model
from fedsim.params import bind_flat
from fedsim.privacy import privatise
from fedsim.solvers import SGD, SolverState, step_factor
from fedsim.tasks import Payload, Task, WorkerSetup

if TYPE_CHECKING:
    from ray import ObjectRef

_log = logging.getLogger(__name__)


def assign_lpt(tasks: Sequence[Task], n: int) -> list[list[Task]]:
    """Longest-processing-time-first assignment of tasks to ``n`` workers.

    Tasks go, longest first (ties by client id), to the least loaded worker
    (ties by index), a task of 0 steps counting as 1: deterministic, and
    within 4/3 of the best makespan. Which worker trains a task never
    changes its update.

    Args:
        tasks: the tasks of one executor call.
        n: the number of workers (>= 1).

    Returns:
        ``n`` lists of tasks, some possibly empty.

    >>> [[t.tau for t in c] for c in assign_lpt([Task(i, 0, s) for i, s in
    ...     enumerate([1, 9, 4, 4, 2])], 2)]
    [[9, 1], [4, 4, 2]]
    """
    chunks: list[list[Task]] = [[] for _ in range(n)]
    load = [0] * n
    for t in sorted(tasks, key=lambda t: (-t.tau, t.client)):
        j = min(range(n), key=lambda j: (load[j], j))
        chunks[j].append(t)
        load[j] += max(t.tau, 1)
    return chunks


def worker_device(
    gpus_per_worker: float,
    algorithm: Algorithm | type[Algorithm],
    cuda: bool | None = None,
) -> torch.device:
    """Where a worker trains: CUDA when the scenario gives each worker a GPU
    share, the algorithm trains through the shared step loop, and CUDA is
    there; else the CPU. An algorithm with its own procedure
    (``client_train``: FedDM learns synthetic sets) stays on the CPU by
    design, GPU share or not; updates travel back on the CPU either way.

    Args:
        gpus_per_worker: ``resources.gpus_per_worker`` (the worker record's
            ``gpus``).
        algorithm: the run's algorithm, or its class (``client_train``).
        cuda: whether CUDA is available (None: ask torch).

    Returns:
        ``torch.device("cuda")`` or ``torch.device("cpu")``.
    """
    if cuda is None:
        cuda = torch.cuda.is_available()
    gpu = gpus_per_worker > 0 and algorithm.client_train is None
    return torch.device("cuda" if gpu and cuda else "cpu")


class Worker:
    """Holds a model and the data; trains virtual clients one after another
    (or many at once through :mod:`fedsim.batched`, chosen when built).

    Guarantees: an update is a pure function of (payload, task, client
    state): the client's minibatches come from its own generator seeded by
    (seed, round, client), and the worker keeps nothing between tasks, so
    an actor that Ray restarts computes the same updates.

    Args:
        setup: what the worker needs of the run (built once by the runtime).
        data: the dataset, or on a Ray actor a one-element list holding its
            object reference (a list, so a restarted actor fetches it again).
        threads: torch's intra-op threads for this process (None: as is).
    """

    def __init__(
        self,
        setup: WorkerSetup,
        data: FederatedData | list[ObjectRef],
        threads: int | None = None,
    ) -> None:
        if threads is not None:
            torch.set_num_threads(max(1, threads))
        data = _fetch(data)
        self.setup = setup
        # what the minibatch draws depend on (fedsim.batched reads them too)
        self.seed = setup.seed
        self.batch_size = setup.client.batch_size
        self.algorithm = setup.algorithm
        self.solver = self.algorithm.solver(setup.client)
        self.model = make_model(setup.network, data)
        # the model's own per-sample loss, or None: cross-entropy
        self.loss = setup.network.loss
        self.device = worker_device(setup.gpus, self.algorithm)
        self.model.to(self.device)
        self.theta, self.grad = bind_flat(self.model)
        dtype = self.theta.dtype
        self.x = _tensor(data.x).to(self.device, dtype)
        y = _tensor(data.y).to(self.device)
        self.y = y if data.num_classes else y.to(dtype)
        self.offsets = [int(o) for o in data.offsets]
        self._heldout(data, dtype)
        self.weights = data.weights
        self.num_clients = data.num_clients
        self.total = float(np.sum(data.weights))
        self._train_group = self.train_sequential
        self.batched = False
        if setup.vectorize:
            self._use_batched()

    def _heldout(self, data: FederatedData, dtype: torch.dtype) -> None:
        """The clients' own held-out rows on the worker's device, where
        federated evaluation reads them (none: empty)."""
        if data.heldout_offsets is None:
            self.heldout_offsets = [0] * (data.num_clients + 1)
            return
        self.heldout_offsets = [int(o) for o in data.heldout_offsets]
        assert data.heldout_x is not None and data.heldout_y is not None
        self.hx = _tensor(data.heldout_x).to(self.device, dtype)
        hy = _tensor(data.heldout_y).to(self.device)
        self.hy = hy if data.num_classes else hy.to(dtype)

    def evaluate_clients(
        self, x: torch.Tensor, clients: Sequence[int], batch_size: int
    ) -> list[ClientEvaluation]:
        """Federated evaluation: the global model ``x`` on each client's own
        held-out rows, a forward pass per batch, no training.

        Guarantees: each result is a pure function of (x, the client's rows,
        batch_size), so which worker evaluates a client never changes it.

        Args:
            x: the global model's flat parameters.
            clients: the clients to evaluate (each with held-out rows).
            batch_size: samples per forward pass (``eval.batch_size``).

        Returns:
            One :class:`ClientEvaluation` per client, in the order given.

        Raises:
            PluginFailure: the model's forward pass or loss raised, naming
                the model and ``federated evaluation``.
        """
        try:
            self.theta.copy_(x.to(self.device, self.theta.dtype))
            return [self._evaluate_one(i, batch_size) for i in clients]
        except Exception as exc:
            if not hooks.wraps_error(exc):
                raise
            who = f"model {self.setup.network.model.name!r}"
            raise hooks.failure(who, "federated evaluation", exc) from exc

    def _evaluate_one(self, i: int, batch_size: int) -> ClientEvaluation:
        """Client ``i``'s evaluation of the model now in ``theta``."""
        lo, hi = self.heldout_offsets[i], self.heldout_offsets[i + 1]
        loss, acc = evaluate(
            self.model, self.hx[lo:hi], self.hy[lo:hi], batch_size, loss=self.loss
        )
        return ClientEvaluation(i, hi - lo, loss, acc)

    def _use_batched(self) -> None:
        """Train many clients at once (fedsim.batched) where that gives the
        sequential results; otherwise say why, once, and stay sequential."""
        from fedsim.batched import train_batched, why_not_batched

        reason = why_not_batched(self)
        if reason is None and self.algorithm.instructs:
            # the batched path starts every client from the shared payload
            reason = (
                f"algorithm {self.algorithm.name!r} gives per-client "
                "instructions (instruct)"
            )
        if reason is not None:
            msg = "resources.vectorize: %s; training clients one at a time"
            _log.warning(msg, reason)
        else:
            self._train_group = partial(train_batched, self)
            self.batched = True

    def pid(self) -> int:
        """This worker's process id (tests check actors are distinct)."""
        return os.getpid()

    def solver_for(self, round_: int) -> SGD:
        """The local solver with round ``round_``'s learning rate: the decay
        ``lr_decay`` (floored at ``lr_min``) times the step schedule
        ``lr_steps`` (x0.1 at each fraction of the rounds)."""
        spec = self.setup.client
        factor = step_factor(spec.lr_steps, round_, self.setup.rounds)
        if spec.lr_decay == 1.0 and factor == 1.0:
            return self.solver
        lr = max(spec.lr * spec.lr_decay**round_, spec.lr_min) * factor
        return replace(self.solver, lr=lr)

    def client_info(self, i: int) -> ClientInfo:
        """What an algorithm may know about client ``i``: its sample count
        and its data weight relative to the mean client (1 on average)."""
        return ClientInfo(
            client=i,
            n_samples=self.offsets[i + 1] - self.offsets[i],
            num_clients=self.num_clients,
            relative_weight=float(self.weights[i]) * self.num_clients / self.total,
        )

    def train(
        self,
        payload: Payload,
        tasks: Sequence[Task],
        states: Mapping[int, ClientState] | None = None,
        instructions: Mapping[int, Payload] | None = None,
    ) -> list[ClientUpdate]:
        """One update per task, in task order, each trained from the payload's
        ``x``.

        Args:
            payload: what the clients download (one server version).
            tasks: the clients to train, each for its ``tau`` steps.
            states: persistent client states by id (absent: start at {}).
            instructions: per-client payload entries by id
                (``Algorithm.instruct``; absent: the shared payload only).

        Raises:
            PluginFailure: plug-in code failed while a client trained (a
                client hook, the model's forward pass or loss), naming the
                algorithm, the model and the hook; the traceback travels
                with it (also from a Ray worker).
        """
        if not tasks:
            return []
        try:
            if instructions:  # only the sequential path reads them
                return self.train_sequential(payload, tasks, states or {}, instructions)
            return self._train_group(payload, tasks, states or {})
        except Exception as exc:
            if not hooks.wraps_error(exc):
                raise
            # outside the hooks named below: the model's forward pass or
            # loss, or a hook on the batched path (fedsim.batched)
            who = (
                f"{hooks.algorithm_label(self.algorithm.name)} "
                f"(model {self.setup.network.model.name!r})"
            )
            raise hooks.failure(who, "client training", exc) from exc

    def train_sequential(
        self,
        payload: Payload,
        tasks: Sequence[Task],
        states: Mapping[int, ClientState],
        instructions: Mapping[int, Payload] | None = None,
    ) -> list[ClientUpdate]:
        """:meth:`train` one client after another, whatever the worker's mode
        (the reference batched training is checked against, and what it uses
        for a lone task).

        Args:
            payload: what the clients download (its ``x`` is the start).
            tasks: the clients to train, each for its ``tau`` steps.
            states: persistent client states by id (missing: ``{}``).
            instructions: per-client payload entries by id (missing: none).

        Returns:
            One update per task, in task order.
        """
        payload = _to(payload, self.device)  # once for every task of the call
        own = instructions or {}
        return [
            self._train_one(
                {**payload, **_to(own.get(t.client, {}), self.device)},
                t,
                states.get(t.client, {}),
            )
            for t in tasks
        ]

    def _train_one(
        self, payload: Payload, task: Task, client_state: ClientState
    ) -> ClientUpdate:
        """One client's round: ``task.tau`` steps of local SGD (start_client,
        then per step the gradient, ``grad_hook`` and the solver step, then
        client_finish), or the algorithm's own ``client_train``."""
        i = task.client
        lo, hi = self.offsets[i], self.offsets[i + 1]
        xs, ys = self.x[lo:hi], self.y[lo:hi]
        seed = client_seed(self.seed, task.round, i)
        gen = torch.Generator().manual_seed(seed)
        algo = self.algorithm
        plugin = hooks.algorithm_label(algo.name)
        info = self.client_info(i)
        if algo.client_train is not None:
            # under fixed_window the clock's tau caps the algorithm's work
            fixed = self.setup.capped
            job = LocalTraining(
                client=ClientContext(info, payload, client_state),
                model=self.model,
                theta=self.theta,
                xs=xs,
                ys=ys,
                gen=gen,
                weight=float(self.weights[i]),
                step_budget=int(task.tau) if fixed else None,
            )
            return hooks.call(plugin, "client_train", algo.client_train, job)
        client_state = _to(client_state, self.device)
        x_global = payload["x"]
        client = hooks.call(
            plugin, "local_setup", algo.start_client, info, payload, client_state
        )
        theta, grad = self.theta, self.grad
        theta.copy_(x_global)
        solver = self.solver_for(task.round)
        state = solver.begin(x_global)
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        size = self.batch_size
        for idx in islice(batches(hi - lo, size, gen, self.device), task.tau):
            xb, yb = (xs, ys) if idx is None else (xs[idx], ys[idx])
            grad.zero_()
            loss = batch_loss(self.model, xb, yb, self.loss)
            loss.backward()
            try:  # (a try costs nothing per step until it catches)
                algo.grad_hook(theta, grad, client)
            except Exception as exc:
                if not hooks.wraps_error(exc):
                    raise
                raise hooks.failure(plugin, "grad_hook", exc) from exc
            solver.step(theta, grad, state)
            loss_sum += loss.detach()
        return self.client_update(
            task, client, theta - x_global, state, float(loss_sum)
        )

    def client_update(
        self,
        task: Task,
        client: ClientContext,
        delta: torch.Tensor,
        done: SolverState,
        loss_sum: float,
    ) -> ClientUpdate:
        """The task's update after its steps (``client_finish``), on the CPU.

        Args:
            task: the task trained.
            client: its round context (from ``start_client``).
            delta: theta - x, the client's model change.
            done: the solver's state after the steps (||a_i||_1).
            loss_sum: the sum of its minibatch losses (mean = / tau).
        """
        plugin = hooks.algorithm_label(self.algorithm.name)
        finish = self.algorithm.client_finish
        extras, new_state = hooks.call(
            plugin, "client_finish", finish, delta, done, client
        )
        comp = self.setup.compression
        if comp is not None:  # the update as the server will decode it
            delta, new_state = self._compressed(comp, task, client, delta, new_state)
        priv = self.setup.privacy
        if priv is not None:  # DP: what is sent is clipped (local noise: noised)
            seed = client_seed(self.seed, task.round, task.client)
            delta = privatise(priv, delta, seed)
        cpu = torch.device("cpu")
        return ClientUpdate(
            client=task.client,
            delta=delta.to(cpu),
            weight=float(self.weights[task.client]),
            tau=task.tau,
            norm_a=done.norm_a,
            train_loss=loss_sum / max(task.tau, 1),
            extras=_to(extras, cpu),
            new_state=None if new_state is None else _to(new_state, cpu),
        )

    def _compressed(
        self,
        comp: Compressor,
        task: Task,
        client: ClientContext,
        delta: torch.Tensor,
        new_state: ClientState | None,
    ) -> tuple[torch.Tensor, ClientState | None]:
        """``delta`` through the scenario's compressor, after
        ``client_finish`` (the algorithm's own state sees the true change);
        with error feedback, the client's residual joins its new state.

        Random choices come from (seed, round, client) and a tag of their
        own, so any worker, batched or not, draws the same.
        """
        gen = compression_generator(client_seed(self.seed, task.round, task.client))
        residual = client.state.get(comp.RESIDUAL)
        out = compress_update(comp, delta, residual, gen)
        if out.residual is None:
            return out.delta, new_state
        return out.delta, {**(new_state or {}), comp.RESIDUAL: out.residual}


def _fetch(data: FederatedData | list[ObjectRef]) -> FederatedData:
    """The dataset itself; on a Ray actor, (re)started, from the object
    store through the reference in the one-element list."""
    if isinstance(data, list):
        import ray

        data = ray.get(data[0])
    assert isinstance(data, FederatedData)
    return data


def _to(tensors: Mapping[str, torch.Tensor], device: torch.device) -> dict:
    """A copy of the dict with every tensor on ``device``."""
    return {k: v.to(device) for k, v in tensors.items()}
