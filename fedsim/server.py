"""The server: the algorithm's state, per-client state, aggregation (one
:meth:`Server.apply` for both modes) and evaluation, in the driver process.

Example (the set-up records come from :func:`fedsim.runtime.run_setup`, the
one reader of the scenario):
    >>> from fedsim.scenario import load_scenario
    >>> from fedsim.data import build_data
    >>> from fedsim.runtime import run_setup
    >>> from fedsim.workers import Task, Worker
    >>> sc = load_scenario("scenarios/quickstart.yaml")
    >>> setup, data = run_setup(sc), build_data(sc.data, sc.num_clients, sc.seed)
    >>> server, worker = Server(setup.server, data), Worker(setup.worker, data)
    >>> ups = worker.train(server.payload(), [Task(0, 0, 3), Task(1, 0, 3)])
    >>> applied = server.apply(ups)
    >>> round(sum(applied.weights), 6)
    1.0
"""

from __future__ import annotations

import itertools
import math
import sys
from collections.abc import Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import NamedTuple, Protocol

import numpy as np
import torch
from numpy.typing import NDArray

from fedsim import checkpoint, hooks
from fedsim.algorithms.base import (
    AggregateInfo,
    Algorithm,
    ClientState,
    ClientUpdate,
    Failure,
    Flag,
    RoundContext,
    ServerContext,
    ServerWork,
)
from fedsim.data import FederatedData
from fedsim.data.base import as_tensor as _tensor
from fedsim.errors import LoadError, RunError
from fedsim.models import Loss, NetworkSetup, evaluate, make_model
from fedsim.params import flatten
from fedsim.privacy import CentralNoise
from fedsim.spec import EvalSpec
from fedsim.store import ClientStore
from fedsim.tasks import Parcel, UpdateSummary, update_norm

Payload = dict[str, torch.Tensor]
# Algorithm.instruct's result, checked: each training client's own entries
Instructions = dict[int, Payload]
Split = tuple[torch.Tensor, torch.Tensor]  # (inputs, targets)
# samples, targets and stored client vectors: floats, or class or token ids
Array = NDArray[np.float32 | np.float64 | np.int64]


class DivergenceError(RunError, RuntimeError):
    """The global model or the training loss became NaN or infinite."""


class ServerSetupError(LoadError, ValueError):
    """The server cannot be built for this data (an algorithm scores models
    on a validation split the dataset did not reserve)."""


@dataclass(frozen=True)
class ServerSetup:
    """What the server needs of the run, built once by the runtime (the same
    record for the driver's home and the server actor).

    Attributes:
        algorithm: the run's algorithm (its server half).
        network: how to build the network (the workers build the same).
        eval: the ``eval`` section: evaluation batch size and schedule.
        validation: the data server-side model choices score on:
            ``"validation"`` (the dataset's validation split), ``"test"``
            (the test set, an opt-in) or None (no choice looks at data);
            the algorithm's ``validation_use`` for the run's round size.
        residuals: compression with error feedback: each client's residual
            is kept in the client store (and checkpointed with it).
        noise: differential privacy's Gaussian noise on the rule's sum
            (``fedsim.privacy``; None: none added by the server).
    """

    algorithm: Algorithm
    network: NetworkSetup
    eval: EvalSpec
    validation: str | None = None
    residuals: bool = False
    noise: CentralNoise | None = None

    @property
    def keeps_states(self) -> bool:
        """Whether clients keep state between rounds: the algorithm's, or
        error feedback's residuals (``fedsim.compression``)."""
        return self.algorithm.stateful or self.residuals


def server_device(gpus_assigned: float, cuda_available: bool) -> torch.device:
    """The device the server's work (evaluation, the objective, an
    algorithm's server-side training and scoring) runs on, by the workers'
    rule: CUDA when the server was given a GPU share and torch sees a CUDA
    device, else the CPU.

    Guarantees: a pure function of its arguments; ``cuda:0`` for CUDA (a
    Ray actor sees only its assigned GPUs, the first of them as index 0).

    Args:
        gpus_assigned: the GPUs Ray assigned to the server (its actor's
            ``GPU`` resource; 0 in the driver, which stays on the CPU).
        cuda_available: ``torch.cuda.is_available()`` where the server runs.
    """
    use_gpu = gpus_assigned > 0 and cuda_available
    return torch.device("cuda", 0) if use_gpu else torch.device("cpu")


def evaluates(spec: EvalSpec, rounds: int, t: int) -> bool:
    """Whether round (or version) ``t`` ends with an evaluation.

    Every ``every_rounds``-th round is evaluated, and always the last, so a
    run's final accuracy is never missing.

    Args:
        spec: the scenario's ``eval`` section.
        rounds: the run's rounds (or versions).
        t: the 0-based round or version.
    """
    return (t + 1) % spec.every_rounds == 0 or t == rounds - 1


def objective_due(spec: EvalSpec, rounds: int, t: int) -> bool:
    """Whether round (or version) ``t`` ends with the global training
    objective F(x) (:meth:`Server.objective`).

    Never when ``objective_every`` is 0 (the default); otherwise every
    ``objective_every``-th round and always the last, as :func:`evaluates`.

    Args:
        spec: the scenario's ``eval`` section.
        rounds: the run's rounds (or versions).
        t: the 0-based round or version.
    """
    return _every(spec.objective_every, rounds, t)


def federated_due(spec: EvalSpec, rounds: int, t: int) -> bool:
    """Whether round ``t`` ends with a federated evaluation (the clients
    evaluate the global model on their own held-out rows).

    Never when ``federated_every`` is 0 (the default); otherwise every
    ``federated_every``-th round and always the last, as :func:`evaluates`.

    Args:
        spec: the scenario's ``eval`` section.
        rounds: the run's rounds.
        t: the 0-based round.

    >>> from fedsim.spec import EvalSpec
    >>> [t for t in range(5) if federated_due(EvalSpec(federated_every=2), 5, t)]
    [1, 3, 4]
    """
    return _every(spec.federated_every, rounds, t)


def _every(k: int, rounds: int, t: int) -> bool:
    """Every ``k``-th of ``rounds`` rounds (0-based ``t``) and always the
    last, so a run's final state is always measured; never when ``k`` is 0
    (a cadence that is off)."""
    return k > 0 and ((t + 1) % k == 0 or t == rounds - 1)


class Step(NamedTuple):
    """What a server step is told beside its updates (:meth:`Server.apply`).

    Attributes:
        where: "round 3" or "version 3", for error messages.
        round: the round (or version made), the context's ``round``.
        staleness: asynchronous mode: each update's staleness (None: the
            updates are a synchronous round's).
        starts: asynchronous mode: the parameters each update started from.
        multiplicity: how many times the selector drew each client
            (sampling with replacement), as each update's extra.
        failures: the step's clients whose updates did not arrive, with
            the reason (``RoundContext.failures``).
    """

    where: str = ""
    round: int = 0
    staleness: Sequence[int] | None = None
    starts: Sequence[torch.Tensor] | None = None
    multiplicity: Mapping[int, int] | None = None
    failures: Sequence[Failure] = ()


@dataclass(frozen=True)
class Applied:
    """What one :meth:`Server.apply` did.

    Attributes:
        info: the algorithm's :class:`AggregateInfo` (tau_eff, chi^2, flags).
        weights: each update's effective weight w_i, in the order the
            updates were given (synchronous: client-id order).
        train_loss: the mean of the updates' training losses, each counted
            with its client's data weight (NaN without updates).
        shares: synchronous rounds: each client delta's unnormalised weight
            in the step (``AggregateInfo.shares``, else ``weights``);
            asynchronous versions: empty (rows use ``weights`` per job).
        clients: the updates' client ids in the order of ``weights``
            (synchronous: ascending, each once; asynchronous: arrival).
        server_work: the step's work on the server's network: the
            algorithm's ``AggregateInfo.server_work`` plus the samples its
            validation losses evaluated (billed at the ``server`` speed).
    """

    info: AggregateInfo
    weights: tuple[float, ...]
    train_loss: float
    shares: dict[int, float] = field(default_factory=dict)
    clients: tuple[int, ...] = ()
    server_work: ServerWork = ServerWork()

    def result(
        self, trained: Sequence[tuple[ClientUpdate | UpdateSummary, float]]
    ) -> RoundResult:
        """What a selector observes of this step.

        Args:
            trained: each aggregated update (or its summary, when the
                server is a Ray actor) with its effective weight; a client
                listed twice keeps its later entry.

        Returns:
            The round's result; test columns are NaN (a selector decides
            before the round's evaluation).
        """
        clients = {
            u.client: ClientStats(
                update_norm(u), u.train_loss, w, self.info.flags.get(u.client, {})
            )
            for u, w in trained
        }
        return RoundResult(self.info, clients, self.train_loss, math.nan, math.nan)


@dataclass(frozen=True)
class ClientStats:
    """One aggregated client's outcome, as selectors observe it."""

    update_norm: float
    train_loss: float
    weight: float  # effective aggregation weight w_i
    flags: dict[str, Flag]  # the algorithm's per-client columns (clients.parquet)


@dataclass(frozen=True)
class RoundResult:
    """A synchronous round's outcome: what ``Selector.observe`` reads."""

    info: AggregateInfo
    clients: dict[int, ClientStats]
    train_loss: float
    test_loss: float
    test_accuracy: float


def check_instructions(
    plugin: str, got: object, clients: Sequence[int], shared: set[str]
) -> Instructions:
    """What ``Algorithm.instruct`` returned, as ``{client: {name: tensor}}``.

    Args:
        plugin: the algorithm, as messages name it.
        got: what the hook returned.
        clients: the round's training clients.
        shared: the names of the shared payload's entries.

    Raises:
        PluginFailure: naming what was expected.
    """

    def wrong(what: str) -> hooks.PluginFailure:
        return hooks.PluginFailure(plugin, "instruct", what)

    if not isinstance(got, Mapping):
        raise wrong(
            f"returned a {type(got).__name__}, expected {{client: {{name: value}}}}"
        )
    allowed = {int(c) for c in clients}
    out: Instructions = {}
    for client, entries in got.items():
        if isinstance(client, bool) or not isinstance(client, int | np.integer):
            raise wrong(f"keyed instructions by {client!r}, expected int client ids")
        if int(client) not in allowed:
            raise wrong(
                f"gave instructions to client {int(client)}, which does not "
                "train this round (expected some of the ids it was given)"
            )
        if not isinstance(entries, Mapping):
            raise wrong(
                f"gave client {int(client)} a {type(entries).__name__}, expected "
                "a dict {name: tensor or number}"
            )
        mine: Payload = {}
        for name, value in entries.items():
            if not isinstance(name, str) or name in shared:
                raise wrong(
                    f"gave client {int(client)} the entry {name!r}, expected a "
                    f"name (str) other than the shared payload's {sorted(shared)}"
                )
            if isinstance(value, torch.Tensor):
                mine[name] = value.detach().cpu()
            elif isinstance(value, int | float) and not isinstance(value, bool):
                entry = f"client {int(client)}'s {name!r}"
                number = hooks.real(plugin, "instruct", entry, value)
                mine[name] = torch.tensor(number, dtype=torch.float64)
            else:
                raise wrong(
                    f"gave client {int(client)} {name!r} as a "
                    f"{type(value).__name__}, expected a tensor or a number"
                )
        out[int(client)] = mine
    return out


def _here(updates: Sequence[Parcel]) -> list[ClientUpdate]:
    """The updates, refusing object references (only the server actor,
    :meth:`fedsim.remote.server_actor.ServerActor.apply_refs`, fetches those)."""
    out = [u for u in updates if isinstance(u, ClientUpdate)]
    if len(out) != len(updates):
        raise TypeError("Server.apply takes updates; the server actor fetches refs")
    return out


def _in_client_order(updates: Sequence[ClientUpdate], where: str) -> list[ClientUpdate]:
    """A synchronous round's updates sorted by client id (the order
    ``aggregate`` receives them in and ``Applied`` reports them in).

    Raises:
        ValueError: a client appears twice (a round trains each chosen
            client once; a selector drawing with replacement reports
            multiplicities instead).
    """
    ordered = sorted(updates, key=lambda u: u.client)
    twice = [a.client for a, b in itertools.pairwise(ordered) if a.client == b.client]
    if twice:
        raise ValueError(f"{where}: client {twice[0]} has two updates in one round")
    return ordered


def _check_weights(
    info: AggregateInfo, clients: Sequence[int], name: str, where: str
) -> None:
    """Refuse weights for clients that sent no update this round (a rule
    that keys its weights by anything but the updates' client ids)."""
    stray = sorted(set(info.weights) - set(clients))
    if stray:
        raise ValueError(
            f"{where}: algorithm {name!r} reported weights for clients "
            f"{stray[:5]} that sent no update this round"
        )


def _with_multiplicity(u: ClientUpdate, k: int) -> ClientUpdate:
    """The update with its ``multiplicity`` extra: how often its client was drawn."""
    k_t = torch.tensor(float(k), dtype=torch.float64)
    return replace(u, extras={**u.extras, "multiplicity": k_t})


class RoundServer(Protocol):
    """The server as the round loops see it, wherever it runs: the
    in-process :class:`Server` (in the driver, or inside the server actor)
    and :class:`fedsim.remote.server_actor.RemoteServer` (the driver's handle on
    the actor) both keep it, so the loops are written once for both homes.

    Guarantees of every implementation: the state changes only in
    :meth:`apply` and :meth:`load`; :meth:`payload` is a copy later steps
    never change; the same calls give the same bits in both homes.
    """

    @property
    def num_params(self) -> int:
        """d, the model's number of parameters."""

    def params(self) -> torch.Tensor:
        """The global model x (a copy, or the state's own tensor in process:
        clone it to keep it)."""

    def payload(self) -> Payload:
        """What a client downloads now (a copy)."""

    def client_states(self, clients: Sequence[int]) -> dict[int, ClientState]:
        """The persistent states of ``clients`` ({} for stateless algorithms)."""

    def apply(self, updates: Sequence[Parcel], at: Step) -> Applied:
        """One server step (:meth:`Server.apply`: the ordering contract).
        ``updates`` are :class:`ClientUpdate` objects, or for the actor
        their object references (fetched by the actor itself)."""

    def instructions(self, clients: Sequence[int], round: int) -> Instructions:
        """The algorithm's per-client payload entries for this round
        (:meth:`Server.instructions`)."""

    def evaluate(self) -> tuple[float, float]:
        """(test loss, test accuracy) of the current model."""

    def objective(self) -> float:
        """The global training objective F(x) of the current model."""

    def save(self, path: Path) -> None:
        """Write the state and the client store into checkpoint ``path``."""

    def load(self, path: Path) -> None:
        """Read them back (refusing another model's state)."""

    def report(self) -> dict[str, object]:
        """summary.json's ``server``: where it ran (never fails)."""

    def shutdown(self) -> None:
        """Release what it holds (an actor: killed or parked); idempotent."""


class Server:
    """Server state, per-client state, aggregation and evaluation.

    Guarantees: the state changes only in :meth:`apply` and :meth:`load`;
    :meth:`payload` returns a copy that later steps never change, so jobs in
    flight keep the version they downloaded. The state (``x``, control
    variates, client store) stays on the CPU whatever ``device`` is, so
    aggregation and checkpoints do not depend on it; the forward and
    backward work (:meth:`evaluate`, :meth:`objective`, the models of
    :meth:`context`) runs on ``device``. On the CPU that is the same code and
    the same floats as before the device existed.

    Args:
        setup: what the server needs of the run (built once by the runtime).
        data: the federated dataset (test and validation splits).
        device: where the server's forward/backward work runs
            (:func:`server_device` chooses it for a server actor).

    Raises:
        ServerSetupError: the algorithm scores server-side model choices
            on a validation split the dataset was built without.
    """

    def __init__(
        self,
        setup: ServerSetup,
        data: FederatedData,
        device: torch.device | str = "cpu",
    ) -> None:
        self.setup = setup
        self.algorithm = setup.algorithm
        self.device = _resolved(torch.device(device))
        self.model = make_model(setup.network, data)
        x0 = flatten(self.model)
        self.model.to(self.device)
        self.state = self.algorithm.init(x0, data.num_clients)
        self.store = ClientStore(data.num_clients, x0.numel(), x0.dtype)
        test = _split(data.test_x, data.test_y, x0.dtype, data.num_classes)
        self.test = _on(test, self.device)
        self.test_weights = data.test_weights
        # What server-side model choices score on (an algorithm's check
        # loss): the validation split, the test set where the scenario opts
        # in, or None. (A scenario asking for a split with none reserved is
        # refused when it loads; a dataset built without one is caught here.)
        use = setup.validation
        self.val = self.test if use == "test" else None
        self.val_weights = self.test_weights if use == "test" else None
        if use == "validation":
            if data.val_x is None:
                raise ServerSetupError(
                    f"algorithm {self.algorithm.name!r} scores models on the "
                    "server's validation split, but the dataset was built "
                    "without one (data.validation_fraction)"
                )
            val = _split(data.val_x, data.val_y, x0.dtype, data.num_classes)
            self.val = _on(val, self.device)
        self._data = data
        self._context: ServerContext | None = None
        # samples the rule's validation losses evaluated in the current step:
        # evaluation that gates the next round, billed on the server's clock
        self._val_samples = 0

    @property
    def num_params(self) -> int:
        """d, the model's number of parameters."""
        return int(self.state["x"].numel())

    def params(self) -> torch.Tensor:
        """The global model x (the state's own tensor: clone to keep it)."""
        return self.state["x"]

    def payload(self) -> Payload:
        """What a client downloads (a copy: later updates never change it)."""
        plugin = hooks.algorithm_label(self.algorithm.name)
        return dict(hooks.call(plugin, "payload", self.algorithm.payload, self.state))

    def instructions(self, clients: Sequence[int], round: int) -> Instructions:
        """The algorithm's per-client payload entries for round ``round``
        (``Algorithm.instruct``), checked: keys among ``clients``, names
        not the payload's own, values tensors or numbers (numbers become
        float64 scalar tensors). {} for an algorithm without the hook.

        Args:
            clients: the ids that will train this round, ascending.
            round: the 0-based round.

        Raises:
            PluginFailure: the hook raised or returned something else.
        """
        alg = self.algorithm
        if not alg.instructs:
            return {}
        plugin = hooks.algorithm_label(alg.name)
        got = hooks.call(plugin, "instruct", alg.instruct, self.state, clients, round)
        return check_instructions(plugin, got, clients, set(self.payload()))

    def client_states(self, clients: Sequence[int]) -> dict[int, ClientState]:
        """The persistent states of these clients ({} for stateless algorithms)."""
        return self.store.get(clients) if self.setup.keeps_states else {}

    def apply(self, updates: Sequence[Parcel], at: Step | None = None) -> Applied:
        """Aggregate ``updates`` into the server state.

        Both modes share this one entry point and the algorithm's one hook,
        ``aggregate(state, updates, ctx)``: without ``staleness`` the
        updates are a synchronous round's, with it an asynchronous
        version's (``ctx.staleness`` and ``ctx.starts`` set). New client
        states are stored after the step either way.

        The ordering contract: a synchronous round's updates reach the
        algorithm sorted by client id, each client once (checked here:
        :class:`ValueError` otherwise), and ``Applied.clients`` /
        ``Applied.weights`` follow that order; an asynchronous version's
        keep their arrival order (a device may arrive twice).

        Args:
            updates: a synchronous round's (in any order), or an
                asynchronous version's, in order of arrival: the updates
                themselves (object references are for the server actor).
            at: the step's round or version, where it is, and in
                asynchronous mode each update's staleness and start
                (:class:`Step`; None: round 0, synchronous).

        Returns:
            What the step did (:class:`Applied`).

        Raises:
            DivergenceError: the model or the training loss is not finite.
            PluginFailure: the algorithm's ``aggregate`` raised, or returned
                something else than (state of the same keys, shapes and
                dtypes, AggregateInfo with scalar metrics): checked here,
                once per step, so both server homes refuse it alike.
            ValueError: a synchronous round holds a client twice, or the
                algorithm reported weights for clients not in the round.
            TypeError: an update is an object reference.
        """
        ups = _here(updates)
        server = self.context() if self.algorithm.wants_server else None
        where, round, staleness, starts, multiplicity, failures = at or Step()
        lost = tuple(failures)
        if staleness is None:
            ups = _in_client_order(ups, where)
            if multiplicity:
                m = multiplicity
                ups = [_with_multiplicity(u, m.get(u.client, 1)) for u in ups]
            ctx = RoundContext(round=round, server=server, failures=lost)
        else:
            assert starts is not None, "asynchronous updates need their starts"
            ctx = RoundContext(round, tuple(staleness), tuple(starts), server, lost)
        plugin = hooks.algorithm_label(self.algorithm.name)
        self._val_samples = 0
        noise = self.setup.noise  # DP: Gaussian noise on the sum the rule steps by
        summed = ups if noise is None else noise.add(self.algorithm, ups, round)
        step = hooks.call(
            plugin, "aggregate", self.algorithm.server_step, self.state, summed, ctx
        )
        self.state, info = hooks.check_step(plugin, "aggregate", step, self.state)
        work = info.server_work + ServerWork(eval_samples=self._val_samples)
        clients = tuple(u.client for u in ups)
        weights, shares = self._weights(info, clients, ctx.asynchronous, where)
        for u in ups:
            if u.new_state is not None:
                self.store.put(u.client, u.new_state)
        loss = self._train_loss(ups, where)
        return Applied(info, weights, loss, shares, clients, work)

    def _weights(
        self,
        info: AggregateInfo,
        clients: tuple[int, ...],
        asynchronous: bool,
        where: str,
    ) -> tuple[tuple[float, ...], dict[int, float]]:
        """``Applied.weights`` and ``Applied.shares`` of a step (the weights
        checked to name only the round's clients, synchronous rounds)."""
        if asynchronous:  # async: the normalised weights, per job
            return info.per_update, {}
        _check_weights(info, clients, self.algorithm.name, where)
        weights = tuple(info.weights.get(c, 0.0) for c in clients)
        shares = dict(zip(clients, weights, strict=True))
        # an algorithm that scales deltas apart from w_i says so in shares
        shares.update(info.shares or {})
        return weights, shares

    def _train_loss(self, updates: Sequence[ClientUpdate], where: str) -> float:
        """The updates' mean training loss, each with its client's data
        weight, after checking the new model is finite.

        Raises:
            DivergenceError: the model or that loss is NaN or infinite.
        """
        if not bool(torch.isfinite(self.state["x"]).all()):
            raise DivergenceError(
                f"{where}: the global model has NaN or infinite parameters"
            )
        total = sum(u.weight for u in updates)
        losses = sum(u.weight * u.train_loss for u in updates)
        train_loss = losses / total if updates else math.nan
        if updates and not math.isfinite(train_loss):
            raise DivergenceError(f"{where}: the training loss is {train_loss}")
        return train_loss

    def context(self) -> ServerContext:
        """The server's model and validation loss, for algorithms that declare
        ``server_needs``; built once, on first use, with models of
        its own so that scoring never disturbs the evaluation model. Both
        models live on the server's device (a server-side algorithm trains there;
        the loss scores a CPU vector there and returns a float)."""
        if self._context is None:
            val, val_w = self.val, self.val_weights
            batch = self.setup.eval.batch_size
            device = self.device
            own = self.setup.network.loss
            eval_model = make_model(self.setup.network, self._data).to(device)

            def loss(x: torch.Tensor) -> float:
                if val is None:
                    # the scenario check (validation_use) says this never runs
                    raise RuntimeError(
                        f"{self.algorithm.name} asked for a validation loss, but "
                        "it declared no use of server-side data"
                    )
                params = eval_model.parameters()
                torch.nn.utils.vector_to_parameters(x.to(device), params)
                self._val_samples += len(val[1])
                return evaluate(eval_model, *val, batch, val_w, own)[0]

            train_model = make_model(self.setup.network, self._data).to(device)
            self._context = ServerContext(train_model, loss, self._data.num_classes)
        return self._context

    def evaluate(self) -> tuple[float, float]:
        """Test loss and accuracy of the current model.

        Computed on the server's device (a copy of ``x`` there; on the CPU
        the model views ``x`` itself, as it always did).

        Returns:
            (loss, accuracy) over the test set, with the test weights; NaN
            for an empty test set.
        """
        x = self.state["x"].to(self.device)
        torch.nn.utils.vector_to_parameters(x, self.model.parameters())
        batch, own = self.setup.eval.batch_size, self.setup.network.loss
        return evaluate(self.model, *self.test, batch, self.test_weights, own)

    @torch.no_grad()
    def objective(self) -> float:
        """The global training objective F(x) = sum_i p_i F_i(x) of the
        current model.

        F_i is the mean loss of the model over client i's training rows (the
        model's own ``loss``: cross-entropy by default, a quadratic client's
        h_i/2 ||x - e_i||^2; no algorithm's proximal or dynamic regulariser)
        and p_i its data weight (``FederatedData.weights`` normalised: n_i / n,
        or the quadratic problem's given p_i), the weights the server
        aggregates with. Computed in eval mode on the
        server's model, on its device, in batches of ``eval.batch_size``
        rows, in row order: the same floats on every call and, on the CPU,
        in both server homes.

        Clients without training rows are left out and the other weights
        renormalised (with p_i = n_i / n they weigh 0 anyway).

        Returns:
            F(x) as a float (summed in float64); NaN when no client has a
            training row.
        """
        data = self._data
        n = data.n_samples
        p = torch.as_tensor(data.weights, dtype=torch.float64)
        held = torch.as_tensor(n > 0)
        if not bool(held.any()):
            return math.nan
        x0 = self.state["x"]
        torch.nn.utils.vector_to_parameters(x0.to(self.device), self.model.parameters())
        self.model.eval()
        try:
            losses = _row_losses(
                self.model,
                self.setup.network.model.loss,
                data,
                x0.dtype,
                self.setup.eval.batch_size,
                self.device,
            ).cpu()
        finally:
            self.model.train()
        bounds = data.offsets.tolist()
        f_i = torch.stack(
            [
                losses[a:b].mean() if b > a else losses.new_zeros(())
                for a, b in zip(bounds[:-1], bounds[1:], strict=True)
            ]
        )
        p = torch.where(held, p, torch.zeros_like(p))
        return float((p * f_i).sum() / p.sum())

    def save(self, path: Path) -> None:
        """Write the server state and per-client state into folder ``path``."""
        write_state(path, self.export_state())

    def load(self, path: Path) -> None:
        """Inverse of :meth:`save` (refusing another model's state)."""
        self.import_state(read_state(path), path)

    def export_state(self) -> ServerSnapshot:
        """What a checkpoint holds of the server: its state and the client
        store's arrays (the store's own arrays: write them, do not keep them)."""
        return ServerSnapshot(self.state, self.store.export())

    def import_state(self, snap: ServerSnapshot, where: Path | str = "") -> None:
        """Inverse of :meth:`export_state`.

        Args:
            snap: a snapshot of a server of this scenario.
            where: the checkpoint it came from, for the error message.

        Raises:
            CheckpointError: the snapshot is another model's.
        """
        state = snap.state
        if set(state) != set(self.state) or state["x"].shape != self.state["x"].shape:
            raise checkpoint.CheckpointError(
                f"{where}: server state does not match this scenario's model"
            )
        self.state = dict(state)
        self.store.restore(snap.store)

    def report(self) -> dict[str, object]:
        """summary.json's ``server`` for the driver's home: ``home``,
        ``device`` and, with Ray, the node id and address (never fails)."""
        here: dict[str, object] = {"home": "driver", "device": str(self.device)}
        # a run without Ray never imported it: importing it only to learn that
        # would cost a process without Ray almost half a second of CPU
        ray = sys.modules.get("ray")
        with suppress(Exception):  # a report must not fail the run
            if ray is not None and ray.is_initialized():
                ctx = ray.get_runtime_context()
                here |= {"node_id": ctx.get_node_id()}
                here |= {"address": ray.util.get_node_ip_address()}
        return here

    def shutdown(self) -> None:
        """Nothing to release in this process."""


class ServerSnapshot(NamedTuple):
    """A server's checkpointed part: its state and its client store's arrays."""

    state: dict[str, torch.Tensor]
    store: dict[str, Array]


def write_state(path: Path, snap: ServerSnapshot) -> None:
    """Write ``snap`` into checkpoint folder ``path`` (each file atomically).

    Args:
        path: the checkpoint folder (created if missing).
        snap: what :meth:`Server.export_state` returned.
    """
    path.mkdir(parents=True, exist_ok=True)
    checkpoint.save_tensors(path / "server.pt", snap.state)
    checkpoint.save_arrays(path, snap.store)


def read_state(path: Path) -> ServerSnapshot:
    """The snapshot :func:`write_state` wrote into ``path``.

    Args:
        path: the checkpoint folder.
    """
    return ServerSnapshot(
        checkpoint.load_tensors(path / "server.pt"), checkpoint.load_arrays(path)
    )


def _row_losses(
    model: torch.nn.Module,
    loss: Loss,
    data: FederatedData,
    dtype: torch.dtype,
    batch: int,
    device: torch.device,
) -> torch.Tensor:
    """The model's loss on each training row of ``data``, in row order, as
    float64 on ``device``: the model's ``loss`` per row,
    computed in batches of ``batch`` rows (copied, as :func:`_split` does,
    so both server homes compute the same floats; then moved to ``device``,
    the model's)."""
    out = []
    for start in range(0, len(data.x), batch):
        xb, yb = _on(
            _split(
                data.x[start : start + batch],
                data.y[start : start + batch],
                dtype,
                data.num_classes,
            ),
            device,
        )
        # the model's loss per sample (Model.loss: by default cross-entropy,
        # a sequence's the mean over its positions)
        out.append(loss(model(xb), yb).double())
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.float64)


def _on(split: Split, device: torch.device) -> Split:
    """``split`` on ``device`` (the same tensors when already there)."""
    return split[0].to(device), split[1].to(device)


def _resolved(device: torch.device) -> torch.device:
    """``device`` with its index: plain ``cuda`` names the current CUDA
    device, so reports say ``cuda:0`` as the tensors' own device does."""
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def _split(
    x: Array | None,
    y: Array | None,
    dtype: torch.dtype,
    num_classes: int,
) -> Split:
    """(inputs, targets) as tensors of their own; regression targets take the
    model's dtype.

    Copied into torch's 64-byte aligned memory: BLAS kernels may sum in
    another order on differently aligned inputs, and arrays from Ray's object
    store (a server actor's) are aligned otherwise than the driver's, so the
    copy makes evaluation the same floats in both homes.
    """
    assert x is not None and y is not None, "a split of both inputs and targets"
    ty = _tensor(y)
    tx = _tensor(x).to(dtype).clone()
    return tx, ty.clone() if num_classes else ty.to(dtype).clone()
