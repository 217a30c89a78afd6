"""What every aggregation algorithm shares: the update record and the interface.

An algorithm is a frozen dataclass of hyperparameters. Its state (server
state and per-client state) goes in and comes out, so the object pickles for
Ray and cannot drift (see docs/architecture.md, "Core interfaces"). The
dataclass *is* the scenario's ``algorithm`` section: pydantic validates its
fields (with their ``Annotated`` constraints) and runs ``__post_init__`` when a
scenario is loaded, so each hyperparameter is declared exactly once.

The client half and the server half of an algorithm live in the same module:

Server half:

- ``init(x0, num_clients)``: the server state (a dict of tensors).
- ``payload(state)``: what a client downloads (default: ``{"x": x}``).
- ``aggregate(state, updates)``: the new server state and what the round's
  aggregation did (effective weights, tau_eff, chi^2(p||w)).

Client half (run on a worker, per client, per round). Every hook receives
one :class:`ClientContext`: the client's :class:`ClientInfo`, the payload it
downloaded, its persistent state and what ``local_setup`` returned:

- ``solver(client_spec)``: the local solver.
- ``local_setup(client) -> local``: anything constant during the round
  (e.g. SCAFFOLD's correction c - c_i); it becomes ``client.local``.
- ``grad_hook(theta, grad, client)``: adjust the minibatch gradient in place
  before each solver step (e.g. add the correction, or a penalty's gradient).
- ``client_finish(delta, solver_state, client) -> (extras, new_state)``: the
  extras to upload and the client's new persistent state (None: unchanged).

A worker runs them as :meth:`Algorithm.start_client`, then per step the
gradient, ``grad_hook`` and the solver step, then ``client_finish``. A toy
algorithm whose clients are pulled back toward the downloaded model and
upload how far they moved:

>>> from dataclasses import dataclass
>>> from fedsim.solvers import SGD
>>> @dataclass(frozen=True)
... class Toy(Algorithm):
...     def local_setup(self, client):
...         return client.payload["x"]          # the anchor, constant in the round
...     def grad_hook(self, theta, grad, client):
...         grad.add_(theta - client.local)     # + gradient of ||theta - x||^2 / 2
...     def client_finish(self, delta, solver_state, client):
...         return {"moved": delta.abs().sum()}, None
>>> alg, solver = Toy(), SGD(lr=0.5)
>>> info = ClientInfo(client=0, n_samples=4, num_clients=1, relative_weight=1.0)
>>> client = alg.start_client(info, {"x": torch.zeros(1)}, {})
>>> theta, st = torch.zeros(1), solver.begin(torch.zeros(1))
>>> for _ in range(2):                          # local loss (theta - 1)^2 / 2
...     grad = theta - 1.0
...     alg.grad_hook(theta, grad, client)
...     solver.step(theta, grad, st)
>>> # theta: 0 -> 0.5 (gradient -1), then stays (gradient -0.5 + 0.5 = 0)
>>> alg.client_finish(theta - client.payload["x"], st, client)[0]["moved"]
tensor(0.5000)

Algorithms whose client work is not "tau steps of a solver" (FedDM learns a
synthetic set) override ``client_train(job)``, which receives a
:class:`LocalTraining` (the client's context, model, data rows, generator and
step budget) and returns the :class:`ClientUpdate`; algorithms whose server
needs the model or a validation loss (FedPNS's CHECK LOSS, FedDM's server
training) set ``needs_server = True`` and receive a :class:`ServerContext`
as ``aggregate(state, updates, server=ctx)``.

Persistent client state (``stateful = True``) is a dict of flat tensors kept
by the server's :class:`~fedsim.store.ClientStore`, keyed by client id; it
travels with the task, so a worker that dies loses nothing. A client that has
never trained has state ``{}``: read missing keys as zeros.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar

from fedsim.lazy import torch
from fedsim.params import chi2
from fedsim.solvers import make_solver
from fedsim.spec import PLUGIN_CONFIG, PosFloat

if TYPE_CHECKING:  # torch is imported when an algorithm first runs
    from fedsim.scenario import ClientSpec
    from fedsim.solvers import SGD, SolverState

__all__ = [
    "AggregateInfo",
    "Algorithm",
    "AsyncRule",
    "ClientContext",
    "ClientInfo",
    "ClientResult",
    "ClientState",
    "ClientUpdate",
    "LocalTraining",
    "ServerContext",
    "ServerState",
    "Updates",
    "meter_subset",
    "skip_empty_rounds",
]

# (strings: torch.Tensor would import torch when this module is imported)
ServerState = dict[str, "torch.Tensor"]
ClientState = dict[str, "torch.Tensor"]
# What client_finish returns: the extras to upload and the client's new
# persistent state (None: unchanged).
ClientResult = tuple[dict[str, "torch.Tensor"], ClientState | None]


@dataclass(frozen=True)
class ClientInfo:
    """Facts about a client that its local procedure may need."""

    client: int
    n_samples: int
    num_clients: int  # m
    relative_weight: float  # n_i m / n (1 for balanced data), as FedDyn/FedDC use


@dataclass(frozen=True)
class ClientContext:
    """What a client's local procedure knows during one round.

    Attributes:
        info: facts about the client.
        payload: what it downloaded (``x`` and, e.g., SCAFFOLD's ``c``).
        state: its persistent state before the round (``{}`` if it never
            trained or the algorithm keeps none; read missing keys as zeros).
        local: what the algorithm's ``local_setup`` returned (None before).
    """

    info: ClientInfo
    payload: dict[str, torch.Tensor]
    state: ClientState = field(default_factory=dict)
    local: Any = None


@dataclass(frozen=True)
class LocalTraining:
    """What an algorithm that replaces the solver loop (``client_train``) gets.

    Attributes:
        client: the client's context (``local`` is None: no ``local_setup``).
        model: the worker's model; its parameters are views of ``theta``.
        theta: the model's parameters as one flat vector (restore it to
            ``client.payload["x"]`` before returning).
        xs, ys: the client's samples and labels.
        gen: the client's generator for this round (all its randomness).
        weight: the client's data weight n_i (``ClientUpdate.weight``).
        step_budget: local steps the clock granted when it bounds the work
            (``round: fixed_window``), else None.
    """

    client: ClientContext
    model: torch.nn.Module
    theta: torch.Tensor
    xs: torch.Tensor
    ys: torch.Tensor
    gen: torch.Generator
    weight: float
    step_budget: int | None = None


@dataclass(frozen=True)
class ClientUpdate:
    """What one client sends back after a round of local training."""

    client: int
    delta: torch.Tensor  # x_i^{t,tau_i} - x^t
    weight: float  # data weight n_i (or p_i); normalised over the round's updates
    tau: int  # local steps taken
    norm_a: float  # ||a_i||_1 of the local solver
    train_loss: float  # mean minibatch loss during local training
    extras: dict[str, torch.Tensor] = field(default_factory=dict)
    new_state: ClientState | None = None  # stored by the server, never aggregated
    bytes_up: int | None = None  # real upload size when it is not up_factor * d


# A round's (or an async buffer's) updates, in order.
Updates = Sequence[ClientUpdate]


@dataclass(frozen=True)
class AggregateInfo:
    """What a round's aggregation did, for the objective-inconsistency meter."""

    weights: dict[int, float]  # effective weight w_i each update received
    tau_eff: float
    chi2_pw: float  # chi^2(p || w), with p the data weights of the round's updates
    # Extra per-client columns for clients.parquet (e.g. FedPNS's labeled and
    # removed flags): {client: {column: bool | int | float | str}}.
    flags: dict[int, dict[str, Any]] = field(default_factory=dict)
    # The weight each update's delta got in the server step, as applied and
    # not normalised (n_i / sum_S n_j, p_i m / q, k_i / q or 1 / |S|): what
    # the participation-bias meter sums. None: the algorithm has no sampling
    # weighting, and the meter uses ``weights``.
    shares: dict[int, float] | None = None


class ServerContext:
    """What the server offers algorithms with ``needs_server = True``.

    Attributes:
        model: the server's model instance (load parameters with
            :meth:`load`); the algorithm may train it (FedDM).
        num_classes: classes of the task (0 for objectives).
    """

    def __init__(self, model: torch.nn.Module, loss_fn: Any, num_classes: int) -> None:
        self.model = model
        self._loss_fn = loss_fn
        self.num_classes = num_classes

    def load(self, x: torch.Tensor) -> None:
        torch.nn.utils.vector_to_parameters(x, self.model.parameters())

    def validation_loss(self, x: torch.Tensor) -> float:
        """Mean loss of parameters ``x`` on the server's validation data."""
        return float(self._loss_fn(x))


@dataclass(frozen=True)
class Algorithm:
    """Base class. Subclasses declare ``name: Literal["<name>"]`` and their
    hyperparameters as fields, and override ``aggregate`` (and ``solver`` when
    their clients solve differently)."""

    __pydantic_config__: ClassVar = PLUGIN_CONFIG

    name: str = "base"
    server_lr: PosFloat = 1.0

    # True when clients keep persistent state between rounds.
    stateful: ClassVar[bool] = False
    # True when aggregate() takes a ``server=ServerContext`` keyword.
    needs_server: ClassVar[bool] = False
    # True when the server needs every individual update (not only their sum).
    needs_individual_updates: ClassVar[bool] = True
    # Floats each client downloads and uploads, in units of d (model size).
    down_factor: ClassVar[int] = 1
    up_factor: ClassVar[int] = 1

    # ---------------------------------------------------------------- server
    def init(self, x0: torch.Tensor, num_clients: int) -> ServerState:
        return {"x": x0.clone()}

    def payload(self, state: ServerState) -> dict[str, torch.Tensor]:
        return {"x": state["x"]}

    def aggregate(
        self, state: ServerState, updates: Sequence[ClientUpdate]
    ) -> tuple[ServerState, AggregateInfo]:
        raise NotImplementedError

    # ---------------------------------------------------------------- client
    def solver(self, client: ClientSpec) -> SGD:
        return make_solver(client)

    def start_client(
        self, info: ClientInfo, payload: dict[str, torch.Tensor], state: ClientState
    ) -> ClientContext:
        """The client's context for the round, with ``local_setup``'s result."""
        client = ClientContext(info, payload, state)
        return replace(client, local=self.local_setup(client))

    def local_setup(self, client: ClientContext) -> Any:
        return None

    def grad_hook(
        self, theta: torch.Tensor, grad: torch.Tensor, client: ClientContext
    ) -> None:
        return None

    # Set to a method ``client_train(job: LocalTraining) -> ClientUpdate`` to
    # replace the solver loop entirely.
    client_train: ClassVar[Any] = None

    def client_finish(
        self, delta: torch.Tensor, solver_state: SolverState, client: ClientContext
    ) -> ClientResult:
        return {}, None

    # ------------------------------------------------------------ pairing
    def weighting(self) -> str | None:
        """The aggregation weighting this algorithm applies to a round's
        updates: a key of :data:`fedsim.algorithms.sampling.WEIGHTINGS`,
        whose entry says what client sampling it assumes, so that the
        scenario check can refuse a selector it does not fit (FedAvg,
        FedNova and their descendants: their ``sampling`` field). None: the
        algorithm's weights are fixed by its paper (SCAFFOLD, FedDyn and
        FedDC average the updates; FedPNS averages those it keeps; the
        asynchronous rules weight by staleness) and are not checked; the
        participation-bias meter still shows what they do."""
        return None


def data_weights(updates: Sequence[ClientUpdate]) -> list[float]:
    """p_i of the round's updates, normalised to sum to 1 (in update order)."""
    total = float(sum(u.weight for u in updates))
    return [u.weight / total for u in updates]


def meter(
    updates: Sequence[ClientUpdate],
    p: Sequence[float],
    w: Sequence[float],
    tau_eff: float,
    shares: Sequence[float] | None = None,
) -> AggregateInfo:
    """Package effective weights ``w`` (normalised here) with chi^2(p || w),
    and the sampling weights ``shares`` the step applied (as they are)."""
    sw = float(sum(w))
    weights = {u.client: wi / sw for u, wi in zip(updates, w, strict=True)}
    share = None
    if shares is not None:
        share = {u.client: float(s) for u, s in zip(updates, shares, strict=True)}
    return AggregateInfo(
        weights=weights, tau_eff=float(tau_eff), chi2_pw=chi2(p, w), shares=share
    )


def meter_subset(
    updates: Updates,
    used: Updates,
    w: Sequence[float],
    tau_eff: float,
    flags: dict[int, dict[str, Any]] | None = None,
) -> AggregateInfo:
    """:func:`meter` over the updates the server ``used`` (effective weights
    ``w``), reporting weight 0 for every other update of the round (FedPNS's
    removed updates, FedDM's empty uploads)."""
    info = meter(used, data_weights(used), w, tau_eff)
    return AggregateInfo(
        weights={u.client: info.weights.get(u.client, 0.0) for u in updates},
        tau_eff=info.tau_eff,
        chi2_pw=info.chi2_pw,
        flags=flags or {},
    )


def empty_info() -> AggregateInfo:
    return AggregateInfo(weights={}, tau_eff=float("nan"), chi2_pw=float("nan"))


_Aggregate = TypeVar("_Aggregate", bound=Callable[..., Any])


def skip_empty_rounds(aggregate: _Aggregate) -> _Aggregate:
    """Decorate an ``aggregate`` method: a round without updates leaves the
    server state as it is and reports an empty meter (:func:`empty_info`)."""

    @functools.wraps(aggregate)
    def wrapper(
        self: Any, state: ServerState, updates: Sequence[ClientUpdate], *args: Any
    ) -> Any:
        if not updates:
            return state, empty_info()
        return aggregate(self, state, updates, *args)

    return wrapper  # type: ignore[return-value]


class AsyncRule(Protocol):
    """What an asynchronous server rule adds (FedAsync, FedBuff): every
    ``buffer_size`` accepted arrivals make one server version, applied by
    ``aggregate_async(state, updates, staleness, starts)`` with the updates in
    order of arrival, their staleness and the parameters of the version each
    one started from."""

    buffer_size: int
    aggregate_async: Callable[
        [ServerState, Updates, Sequence[int], Sequence[torch.Tensor]],
        tuple[ServerState, AggregateInfo],
    ]
