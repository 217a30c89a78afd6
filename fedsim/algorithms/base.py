"""What every aggregation algorithm shares: the update record and the interface.

An algorithm is a frozen dataclass of hyperparameters (the scenario's
``algorithm`` section); state goes in and comes out. See docs/extending.md.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar

from fedsim.lazy import torch
from fedsim.params import chi2
from fedsim.solvers import SGD, SolverState, make_solver
from fedsim.spec import PLUGIN_CONFIG, PosFloat, Problem

if TYPE_CHECKING:
    from fedsim.clock import JobWork
    from fedsim.data.base import DataInfo, FederatedData
    from fedsim.spec import ClientSpec, ScenarioView

# (strings: torch.Tensor would import torch when this module is imported)
ServerState = dict[str, "torch.Tensor"]
ClientState = dict[str, "torch.Tensor"]
# client_finish's (extras to upload, new persistent state or None: unchanged)
ClientResult = tuple[dict[str, "torch.Tensor"], ClientState | None]
# A gradient hook on a stack of clients (fedsim.batched): (n, the first n
# rows' parameters, their gradients), adjusting the gradients in place.
StackedHook = Callable[[int, "torch.Tensor", "torch.Tensor"], None]


@dataclass(frozen=True)
class ClientInfo:
    """Facts about a client that its local procedure may need."""

    client: int
    n_samples: int
    num_clients: int  # m
    relative_weight: float  # n_i m / n (1 for balanced data), as FedDyn/FedDC use


@dataclass(frozen=True)
class ClientContext:
    """What a client's local procedure knows during one round."""

    info: ClientInfo
    payload: dict[str, torch.Tensor]  # what it downloaded (x, SCAFFOLD's c, ...)
    state: ClientState = field(default_factory=dict)  # before the round; {}: none
    local: Any = None  # what the algorithm's local_setup returned


@dataclass(frozen=True)
class LocalTraining:
    """What an algorithm that replaces the solver loop (``client_train``) gets."""

    client: ClientContext  # its ``local`` is None: no local_setup
    model: torch.nn.Module  # parameters are views of theta
    theta: torch.Tensor  # flat; restore it to client.payload["x"] before returning
    xs: torch.Tensor
    ys: torch.Tensor
    gen: torch.Generator  # all of the client's randomness this round
    weight: float  # data weight n_i (ClientUpdate.weight)
    step_budget: int | None = None  # steps the clock granted (fixed_window)


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
    # extra clients.parquet columns, {client: {column: value}} (FedPNS's flags)
    flags: dict[int, dict[str, Any]] = field(default_factory=dict)
    # each delta's weight in the server step as applied, not normalised, for
    # the participation-bias meter (None: it uses ``weights``)
    shares: dict[int, float] | None = None
    # async rules: each update's normalised weight, by position (one device can
    # land twice in a FedBuff buffer)
    per_update: tuple[float, ...] = ()
    # a typed value for a selector that works with this algorithm (its own
    # class, e.g. FedPNS's Labels): what the round taught the selector
    signal: Any = None


@dataclass(frozen=True)
class ServerContext:
    """What the server offers algorithms with ``needs_server = True``: its
    ``model`` (the algorithm may train it), ``num_classes`` (0: objectives)."""

    model: torch.nn.Module
    loss_fn: Any  # parameters -> mean validation loss
    num_classes: int

    def validation_loss(self, x: torch.Tensor) -> float:
        """Mean loss of parameters ``x`` on the server's validation data."""
        return float(self.loss_fn(x))


@dataclass(frozen=True)
class Algorithm:
    """Base class: subclasses declare ``name: Literal["<name>"]`` and their
    hyperparameters as fields, and override ``aggregate``.

    Server half: ``init``, ``payload`` (what a client downloads),
    ``aggregate``. Client half, per client and round on a worker:
    :meth:`start_client` (runs ``local_setup``: round constants, which become
    ``client.local``), per step the gradient, ``grad_hook`` (adjusts it in
    place) and the ``solver`` step, then ``client_finish`` (extras to upload,
    new persistent state). docs/extending.md says what else an algorithm may
    set. A toy whose clients are pulled back toward the downloaded model and
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
    >>> alg.client_finish(theta - client.payload["x"], st, client)[0]["moved"]
    tensor(0.5000)
    """

    __pydantic_config__: ClassVar = PLUGIN_CONFIG

    name: str = "base"
    server_lr: PosFloat = 1.0

    stateful: ClassVar[bool] = False  # clients keep state between rounds
    needs_server: ClassVar[bool] = False  # aggregate() takes server=ServerContext
    down_factor: ClassVar[int] = 1  # floats downloaded, in units of d
    up_factor: ClassVar[int] = 1  # floats uploaded, in units of d

    def init(self, x0: torch.Tensor, num_clients: int) -> ServerState:
        return {"x": x0.clone()}

    def payload(self, state: ServerState) -> dict[str, torch.Tensor]:
        return {"x": state["x"]}

    def aggregate(
        self, state: ServerState, updates: Updates
    ) -> tuple[ServerState, AggregateInfo]:
        raise NotImplementedError

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

    def stacked_grad_hook(self, clients: Sequence[ClientContext]) -> StackedHook | None:
        """``grad_hook`` for a stack of ``clients`` trained together (row j:
        ``clients[j]``); None when the algorithm adjusts no gradient.

        The default applies ``grad_hook`` row by row; an algorithm whose hook
        is vector math overrides this with the stacked form (one tensor op
        for all rows), which must equal the row-by-row result.
        """
        if type(self).grad_hook is Algorithm.grad_hook:
            return None  # the base hook does nothing: no per-row loop

        def each(n: int, theta: torch.Tensor, grad: torch.Tensor) -> None:
            for j in range(n):  # row views: in-place hooks work
                self.grad_hook(theta[j], grad[j], clients[j])

        return each

    client_train: ClassVar[Any] = None  # (job: LocalTraining) -> ClientUpdate

    def client_finish(
        self, delta: torch.Tensor, solver_state: SolverState, client: ClientContext
    ) -> ClientResult:
        return {}, None

    def weighting(self) -> str | None:
        """Its ``sampling.WEIGHTINGS`` key, checked against the selector (None:
        weights fixed by the paper, unchecked)."""
        return None

    # ------------------------------------------------ what it says about itself
    # The runtime, the clock and the checks before a run ask the algorithm
    # these questions instead of knowing any algorithm by name.

    def check(self, scenario: ScenarioView) -> list[Problem]:
        """What is wrong with this algorithm in ``scenario`` (errors refuse the
        file when it is loaded, warnings are printed); each message leads with
        the field path it is about. Overrides add to ``super().check``.

        The base refuses ``round.policy: async`` without an asynchronous server
        rule (``aggregate_async``, the :class:`AsyncRule` protocol).
        """
        if scenario.round.policy != "async" or hasattr(self, "aggregate_async"):
            return []
        from fedsim.plugins import builtins  # (imports every built-in)

        rules = [
            n for n, c in builtins("algorithm").items() if hasattr(c, "aggregate_async")
        ]
        return [
            Problem(
                "round.policy 'async' needs an asynchronous server rule "
                f"(algorithm {' or '.join(rules)}), not {self.name!r}"
            )
        ]

    def clock_work(self, scenario: ScenarioView, data: FederatedData) -> JobWork | None:
        """What the clock charges for a client's job when it is not local solver
        steps (units of work, each unit's cost in local steps, bytes uploaded
        per client); None: ``tau`` solver steps and ``up_factor`` x the model."""
        return None

    def memory(
        self, scenario: ScenarioView, params: int, data: DataInfo
    ) -> tuple[int, str] | None:
        """Bytes the algorithm keeps beyond the models (a lower estimate, for
        the memory check before a run) and what they are, as the field that
        sets them; None: nothing worth counting. ``params`` is the model's
        parameter count (0: unknown), ``data`` what the dataset's spec says.

        The base counts one model-sized vector per client for ``stateful``
        algorithms.
        """
        if not self.stateful:
            return None
        n = scenario.num_clients
        what = (
            f"algorithm.name {self.name!r} keeps {n} client vectors of "
            f"{params:,} parameters"
        )
        return n * params * scenario.model.elem_bytes, what

    def bytes_per_client(self, scenario: ScenarioView, d: int) -> tuple[int, int]:
        """(download, upload) bytes of one client's round for a model of ``d``
        parameters: ``down_factor`` and ``up_factor`` model vectors."""
        elem = scenario.model.elem_bytes
        return self.down_factor * d * elem, self.up_factor * d * elem


def data_weights(updates: Updates) -> list[float]:
    """p_i of the round's updates, normalised to sum to 1 (in update order)."""
    total = float(sum(u.weight for u in updates))
    return [u.weight / total for u in updates]


def meter(
    updates: Updates, w: list[float], tau_eff: float, shares: list[float] | None = None
) -> AggregateInfo:
    """Effective weights ``w`` (normalised here) with chi^2(p || w), p the data
    weights, and the sampling weights ``shares`` the step applied (as they are)."""
    sw = float(sum(w))
    weights = {u.client: wi / sw for u, wi in zip(updates, w, strict=True)}
    chi2_pw = chi2(data_weights(updates), w)
    share = None
    if shares is not None:
        share = {u.client: float(s) for u, s in zip(updates, shares, strict=True)}
    return AggregateInfo(weights, float(tau_eff), chi2_pw, shares=share)


def meter_subset(updates: Updates, info: AggregateInfo) -> AggregateInfo:
    """``info``, the :func:`meter` of the updates the server used, with weight 0
    for the round's others (FedPNS's removed updates, FedDM's empty uploads)."""
    weights = {u.client: info.weights.get(u.client, 0.0) for u in updates}
    return replace(info, weights=weights)


def empty_info() -> AggregateInfo:
    return AggregateInfo(weights={}, tau_eff=float("nan"), chi2_pw=float("nan"))


_Aggregate = TypeVar("_Aggregate", bound=Callable[..., Any])


def skip_empty_rounds(aggregate: _Aggregate) -> _Aggregate:
    """Decorate ``aggregate(_async)``: an empty round keeps the state, reporting
    :func:`empty_info`."""

    @functools.wraps(aggregate)
    def wrapper(self: Any, state: ServerState, updates: Updates, *args: Any) -> Any:
        if not updates:
            return state, empty_info()
        return aggregate(self, state, updates, *args)

    return wrapper  # type: ignore[return-value]


class AsyncRule(Protocol):
    """An asynchronous server rule: every ``buffer_size`` arrivals make one
    version (updates in arrival order, their staleness, their start models)."""

    buffer_size: int
    aggregate_async: Callable[
        [ServerState, Updates, Sequence[int], Sequence[torch.Tensor]],
        tuple[ServerState, AggregateInfo],
    ]
