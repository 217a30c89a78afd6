"""What every aggregation algorithm shares: the update record and the interface.

An algorithm is a frozen dataclass of hyperparameters (the scenario's
``algorithm`` section); state goes in and comes out. See docs/extending.md.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import (
    TYPE_CHECKING,
    Any,
    ClassVar,
    Concatenate,
    Literal,
    ParamSpec,
    Protocol,
    TypeVar,
)

from fedsim.lazy import torch
from fedsim.params import chi2
from fedsim.solvers import SGD, SolverState, make_solver
from fedsim.spec import PLUGIN_CONFIG, PosFloat, Problem

if TYPE_CHECKING:
    import numpy as np

    from fedsim.clock import JobWork
    from fedsim.data.base import DataInfo, FederatedData
    from fedsim.facts import RunFacts
    from fedsim.spec import ClientSpec

# (strings: torch.Tensor would import torch when this module is imported)
ServerState = dict[str, "torch.Tensor"]
ClientState = dict[str, "torch.Tensor"]
# client_finish's (extras to upload, new persistent state or None: unchanged)
ClientResult = tuple[dict[str, "torch.Tensor"], ClientState | None]
# A gradient hook on a stack of clients (fedsim.batched): (n, the first n
# rows' parameters, their gradients), adjusting the gradients in place.
StackedHook = Callable[[int, "torch.Tensor", "torch.Tensor"], None]
# One cell of an algorithm's own clients.parquet column (FedPNS's flags).
Flag = bool | int | float | str


@dataclass(frozen=True)
class ClientInfo:
    """Facts about a client that its local procedure may need."""

    client: int
    n_samples: int
    num_clients: int  # m
    relative_weight: float  # n_i m / n (1 for balanced data), as FedDyn/FedDC use


@dataclass(frozen=True)
class ClientContext:  # type: ignore[explicit-any]  # its ``local`` (below)
    """What a client's local procedure knows during one round."""

    info: ClientInfo
    payload: dict[str, torch.Tensor]  # what it downloaded (x, SCAFFOLD's c, ...)
    state: ClientState = field(default_factory=dict)  # before the round; {}: none
    # what the algorithm's local_setup returned: only its own hooks read it,
    # each knowing its type (a tensor, a record), so it is typed loosely here
    local: Any = None  # type: ignore[explicit-any]


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
class ServerWork:
    """Work a server step did on the server's own network, which the clock
    bills at the scenario's ``server`` speed (docs/fleets.md, "The
    server's clock"): samples trained (forward and backward) and samples
    evaluated (forward only), each priced at the model's counted FLOPs per
    sample, and any other ``flops``. Zero: nothing beyond the rule's sum."""

    train_samples: float = 0.0
    eval_samples: float = 0.0
    flops: float = 0.0

    def __add__(self, other: ServerWork) -> ServerWork:
        return ServerWork(
            self.train_samples + other.train_samples,
            self.eval_samples + other.eval_samples,
            self.flops + other.flops,
        )


@dataclass(frozen=True)
class AggregateInfo:
    """What a round's aggregation did, for the objective-inconsistency meter."""

    weights: dict[int, float]  # effective weight w_i each update received
    tau_eff: float
    chi2_pw: float  # chi^2(p || w), with p the data weights of the round's updates
    # extra clients.parquet columns, {client: {column: value}} (FedPNS's flags)
    flags: dict[int, dict[str, Flag]] = field(default_factory=dict)
    # each delta's weight in the server step as applied, not normalised, for
    # the participation-bias meter (None: it uses ``weights``)
    shares: dict[int, float] | None = None
    # async rules: each update's normalised weight, by position (one device can
    # land twice in a FedBuff buffer)
    per_update: tuple[float, ...] = ()
    # a typed value for a selector that works with this algorithm (its own
    # class, e.g. FedPNS's Labels, which the selector checks with isinstance):
    # what the round taught the selector
    signal: object = None
    # the plug-in's own named scalars for this step (FedExP's step size):
    # each becomes the rounds.parquet column ``alg_<name>`` (docs/extending.md,
    # "Hooks"); the server checks they are real numbers
    metrics: dict[str, float] = field(default_factory=dict)
    # the step's own work on the server's network (FedDM's server epochs),
    # billed at the server's speed in synchronous rounds
    server_work: ServerWork = ServerWork()


@dataclass(frozen=True)
class ClientEvaluation:
    """One client's evaluation of the global model on its own held-out rows
    (federated evaluation: ``eval.federated_every``), as
    :meth:`Algorithm.aggregate_evaluation` receives it.

    Attributes:
        client: its id.
        n_samples: its held-out rows (at least 1).
        loss: the mean loss of the global model on them (the model's loss:
            cross-entropy, or the model's own).
        accuracy: the share of them classified right (NaN for targets that
            are no class labels).
    """

    client: int
    n_samples: int
    loss: float
    accuracy: float


def weighted_evaluation(results: Sequence[ClientEvaluation]) -> dict[str, float]:
    """The sample-weighted means of the clients' loss and accuracy (Flower's
    weighted average), summed in float64 in the order given (the runtime
    gives client-id order, so the bits never depend on the workers).

    Args:
        results: the clients' evaluations (at least one).

    Returns:
        ``{"loss": ..., "accuracy": ...}``; ``accuracy`` left out when it is
        NaN (data without classes).

    >>> weighted_evaluation([ClientEvaluation(0, 1, 2.0, 0.0),
    ...                      ClientEvaluation(1, 3, 1.0, 1.0)])
    {'loss': 1.25, 'accuracy': 0.75}
    """
    n = sum(r.n_samples for r in results)
    loss = sum(r.n_samples * r.loss for r in results) / n
    acc = sum(r.n_samples * r.accuracy for r in results) / n
    out = {"loss": float(loss)}
    if acc == acc:  # not NaN: the targets are class labels
        out["accuracy"] = float(acc)
    return out


# Why a selected client's update did not reach this step (clients.parquet's
# drop_reason): late, offline, dropout, no_time, no_data, surplus, stale.
DropReason = str


@dataclass(frozen=True)
class Failure:
    """A client that was asked to train in this step but whose update the
    step does not have (Flower's ``failures``).

    Attributes:
        client: its id.
        reason: why (clients.parquet's ``drop_reason``): ``late`` (sent
            after the deadline), ``surplus`` (over-selection's extra
            arrivals), ``offline`` or ``dropout`` (left before its upload),
            ``no_time`` or ``no_data`` (no step to do), and in
            asynchronous mode ``stale`` (refused for its staleness).
    """

    client: int
    reason: DropReason


@dataclass(frozen=True)
class ServerContext:
    """What the server offers an algorithm that declares ``server_needs``:
    its ``model`` (a network of the run's architecture the algorithm may
    train: FedDM), a validation loss (FedPNS's CHECK LOSS) and
    ``num_classes`` (0: an objective without classes).

    Built once per run by the server, on first use, with networks of its
    own, so scoring or training here never disturbs the evaluation model.
    """

    model: torch.nn.Module
    loss_fn: Callable[[torch.Tensor], float]  # parameters -> mean validation loss
    num_classes: int

    def validation_loss(self, x: torch.Tensor) -> float:
        """Mean loss of parameters ``x`` on the server's validation data.

        Args:
            x: flat parameters of the run's model (any device; the loss is
                computed on the server's).

        Returns:
            The loss, weighted as the server's evaluation weighs it.
        """
        return float(self.loss_fn(x))


@dataclass(frozen=True)
class RoundContext:
    """What one server step knows besides the state and the updates: the
    one extra argument of :meth:`Algorithm.aggregate`, for every rule.

    Synchronous rounds and asynchronous versions differ only in what is
    filled in here, never in the signature; fields are added (with
    defaults) as the server learns to tell an algorithm more, so a plug-in
    written against this record keeps working.

    Attributes:
        round: the 0-based round, or in asynchronous mode the version this
            step makes.
        staleness: asynchronous versions: each update's staleness (versions
            made while it trained), in arrival order; None in a synchronous
            round.
        starts: asynchronous versions: the parameters each update started
            from, in arrival order; None in a synchronous round.
        server: the server's :class:`ServerContext` when the algorithm
            declares ``server_needs``; None otherwise.
        failures: the clients of this step whose updates it does not have,
            with the reason (a :class:`Failure` each, in client-id order in
            a synchronous round, in order of their end in an asynchronous
            version; a device dropped twice in one version is listed
            twice). A pure function of the scenario and seed (the clock
            decides them), the same with any number of workers and after
            a resume. Empty when every selected client's update arrived.
    """

    round: int = 0
    staleness: tuple[int, ...] | None = None
    starts: tuple[torch.Tensor, ...] | None = None
    server: ServerContext | None = None
    failures: tuple[Failure, ...] = ()

    @property
    def asynchronous(self) -> bool:
        """Whether this step is an asynchronous version (updates in arrival
        order, with their staleness and start models)."""
        return self.staleness is not None


# A synchronous round 0 with nothing from the server: aggregate's default, so
# that a test or notebook may call ``alg.aggregate(state, updates)``.
PLAIN_ROUND = RoundContext()


@dataclass(frozen=True)
class ClientChoice:
    """What an algorithm that chooses the round's clients itself is given
    (:meth:`Algorithm.choose_clients`), on the driver, once per round."""

    round: int  # 0-based
    # the client ids it chooses among, ascending: every online device, or
    # the scenario selector's picks (:attr:`Algorithm.chooses`)
    nodes: tuple[int, ...]
    rng: np.random.Generator  # the round's selection stream: its only randomness
    facts: RunFacts  # the run as plug-ins see it
    # the server's global model (its named parameters give the layout of
    # x); None where there is none at hand
    model: torch.nn.Module | None = None


@dataclass(frozen=True)
class Algorithm:
    """Base class: subclasses declare ``name: Literal["<name>"]`` and their
    hyperparameters as fields, and override :meth:`aggregate`.

    Server half: :meth:`init`, :meth:`payload` (what a client downloads),
    :meth:`aggregate` (one signature for synchronous rounds and
    asynchronous versions). Client half, per client and round on a worker:
    :meth:`start_client` (runs :meth:`local_setup`: round constants, which
    become ``client.local``), per step the gradient, :meth:`grad_hook`
    (adjusts it in place) and the :meth:`solver` step, then
    :meth:`client_finish` (extras to upload, new persistent state), or the
    algorithm's own :attr:`client_train` instead of the step loop.

    Every hook is a pure function of its arguments and the hyperparameters:
    objects hold no state (they are frozen and pickled to Ray workers), so
    the same inputs give the same bits on any worker and after a resume.
    docs/extending.md says what else an algorithm may set. A toy whose
    clients are pulled back toward the downloaded model and upload how far
    they moved:

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
    # What aggregate needs of the server in ``ctx.server`` (a ServerContext):
    # "model" (a network to train) and/or "validation_loss" (to score
    # parameters). Empty: ``ctx.server`` is None and nothing is built for it.
    server_needs: ClassVar[frozenset[str]] = frozenset()
    # fields of the base this rule never reads (``server_lr`` of a rule with
    # a step of its own): set to anything but the default they are refused
    unread: ClassVar[frozenset[str]] = frozenset()
    down_factor: ClassVar[int] = 1  # floats downloaded, in units of d
    # its clients upload a model update a compressor may compress (False:
    # what they send is not a delta, e.g. FedDM's synthetic sets)
    compressible: ClassVar[bool] = True
    up_factor: ClassVar[int] = 1  # floats uploaded, in units of d
    # its server step is a weighted sum of the updates' deltas (then at most
    # a server optimiser on that sum), with the weights :meth:`step_weights`
    # gives: differential privacy (fedsim/privacy.py) clips and noises only
    # such rules, its noise calibrated to those weights
    sums_updates: ClassVar[bool] = False

    # ------------------------------------------------------------ server half
    def init(self, x0: torch.Tensor, num_clients: int) -> ServerState:
        """The server state before the first round.

        Args:
            x0: the initial model's flat parameters (on the CPU), a pure
                function of the scenario and seed.
            num_clients: m, the federation's size (for per-client sums).

        Returns:
            A dict of tensors holding at least ``x`` (the global model, a
            copy of ``x0``: the caller's tensor is never aliased). The keys,
            shapes and dtypes it has now are kept by every later step
            (checkpoints are written and read by key).
        """
        return {"x": x0.clone()}

    def payload(self, state: ServerState) -> dict[str, torch.Tensor]:
        """What every selected client downloads from the server state.

        Args:
            state: the current server state.

        Returns:
            Tensors by name, at least ``x`` (the model the client starts
            from), ``down_factor`` model-sized vectors in all (the bytes
            rule bills them). The server copies the dict; the tensors must
            not be changed in place by later steps (aggregate returns new
            tensors), so jobs still in flight keep what they downloaded.
        """
        return {"x": state["x"]}

    def step_weights(self, updates: Updates) -> list[float]:
        """The weights w_i of a step that moves along ``sum_i w_i delta_i``
        (a rule declaring :attr:`sums_updates` says them here; differential
        privacy scales its noise to the largest and adds it to that sum).

        Args:
            updates: the step's updates, in the order ``aggregate`` gets them.

        Returns:
            One weight per update, in update order.
        """
        raise NotImplementedError(f"{self.name!r} declares no weighted sum")

    def instruct(
        self, state: ServerState, clients: Sequence[int], round: int
    ) -> Mapping[int, Mapping[str, torch.Tensor | float]]:
        """Per-client instructions: entries the server adds to one selected
        client's payload (a per-client learning rate, a mask), as Flower's
        ``configure_fit`` does. Synchronous rounds only; the clock still
        decides each client's tau.

        Called once per round on the server (driver or actor), after the
        selection and before training, with the state the clients
        download. A client's hooks read its entries in
        ``client.payload[name]`` (``ClientContext.payload``), beside
        :meth:`payload`'s.

        Args:
            state: the server state the round's clients start from.
            clients: the ids of the clients that will train this round
                (dropped ones left out), ascending.
            round: the 0-based round.

        Returns:
            ``{client: {name: value}}`` for some of ``clients`` (others get
            the shared payload only); a value is a tensor or a number (a
            number travels as a float64 scalar tensor). Names must not be
            :meth:`payload`'s own (the shared model is never replaced per
            client). The base returns {} (no instructions).

        Guarantees to keep: a pure function of (state, clients, round,
        hyperparameters), so that a resumed run and any number of workers
        give the same bits (the state is checkpointed; nothing else is).
        """
        return {}

    @property
    def chooses(self) -> Literal["candidates", "picks"] | None:
        """Whether it chooses the round's clients itself (Flower's strategies
        sample their own), through :meth:`choose_clients`: among every
        online device (``"candidates"``) or among the scenario selector's
        picks (``"picks"``); None (the base): the selector's picks train.
        Synchronous rounds with the server in the driver only."""
        return None

    def choose_clients(self, state: ServerState, choice: ClientChoice) -> list[int]:
        """The clients that train this round, chosen by the algorithm (only
        called when :attr:`chooses` is set).

        Args:
            state: the server state the round starts from (the clients
                download it).
            choice: the round, the ids to choose among, the round's
                generator, the run's facts and the server's model.

        Returns:
            Client ids among ``choice.nodes``, each once, ascending.

        Guarantees to keep: a pure function of (state, choice,
        hyperparameters), drawing only from ``choice.rng``.
        """
        raise NotImplementedError

    @property
    def instructs(self) -> bool:
        """Whether it overrides :meth:`instruct` (per-client payload entries)."""
        return type(self).instruct is not Algorithm.instruct

    def aggregate_evaluation(
        self, results: Sequence[ClientEvaluation], round: int
    ) -> Mapping[str, float]:
        """Federated evaluation's rule: one round's client evaluations of the
        global model on their own held-out rows, as named scalars (the
        rounds.parquet columns ``fed_<name>``). Optional: the base is the
        sample-weighted mean of loss and accuracy
        (:func:`weighted_evaluation`: ``fed_loss``, ``fed_accuracy``).

        Called on the driver in rounds with federated evaluation
        (``eval.federated_every``), after the round's server step and its
        central test evaluation, with the model that step made.

        Args:
            results: one :class:`ClientEvaluation` per evaluating client,
                in ascending client id (never empty).
            round: the 0-based round.

        Returns:
            ``{name: value}``: names of letters, digits and ``_``, values
            real numbers (checked: a :class:`~fedsim.hooks.PluginFailure`
            naming the algorithm and ``aggregate_evaluation`` otherwise).

        Guarantees to keep: a pure function of (results, round,
        hyperparameters), so the columns are the same with any number of
        workers and after a resume.
        """
        return weighted_evaluation(results)

    def aggregate(
        self, state: ServerState, updates: Updates, ctx: RoundContext = PLAIN_ROUND
    ) -> tuple[ServerState, AggregateInfo]:
        """The server's step: the new state from the round's (or the
        asynchronous version's) updates. The one hook every algorithm
        writes, and the only one the server calls to move the model.

        Args:
            state: the server state before the step (do not change it in
                place: return a new dict; it may be a checkpoint's).
            updates: a synchronous round's updates in ascending client id,
                each client at most once (the server sorts and checks
                them), or an asynchronous version's in order of simulated
                arrival (a device may appear twice). Empty when nothing
                reached the server: return ``state`` unchanged
                (:func:`skip_empty_rounds` does it).
            ctx: the step's :class:`RoundContext`: the round or version,
                the staleness and start models of asynchronous updates,
                and the server's model and validation loss when
                ``server_needs`` asks for them.

        Returns:
            (new state, :class:`AggregateInfo`). The state keeps the keys,
            shapes and dtypes of :meth:`init`'s and stays on the CPU. The
            info's ``weights`` hold each update's effective weight w_i by
            client id, only for clients among ``updates`` (0 for an update
            left out), with ``tau_eff`` and chi^2(p||w) for the
            objective-inconsistency meter (:func:`meter` computes them).

        Guarantees the server relies on: the result is a pure function of
        (state, updates, ctx, hyperparameters), summed in a fixed order
        (float64 sums in update order are the built-ins' rule), so two runs
        give the same bits whatever worker trained which update.
        """
        raise NotImplementedError

    def server_step(
        self, state: ServerState, updates: Updates, ctx: RoundContext
    ) -> tuple[ServerState, AggregateInfo]:
        """What the server calls: :meth:`aggregate` with ``ctx`` (the one
        form of the hook; :func:`outdated_form` refuses the older ones when
        a plug-in loads). Not meant to be overridden.

        Args:
            state: as :meth:`aggregate`.
            updates: as :meth:`aggregate`.
            ctx: as :meth:`aggregate`.

        Returns:
            What :meth:`aggregate` returns.
        """
        return self.aggregate(state, updates, ctx)

    @property
    def wants_server(self) -> bool:
        """Whether :meth:`aggregate` reads ``ctx.server`` (``server_needs``)."""
        return bool(self.server_needs)

    @property
    def asynchronous(self) -> bool:
        """Whether it has an asynchronous server rule: a ``buffer_size``
        (arrivals per version; :class:`AsyncRule`), so that
        ``round.policy: async`` may use it."""
        return hasattr(self, "buffer_size")

    # ------------------------------------------------------------ client half
    def solver(self, client: ClientSpec) -> SGD:
        """The local optimizer of every client (on a worker, once per run).

        Args:
            client: the scenario's ``client`` section (solver, lr, batch size).

        Returns:
            The solver; it reports ||a_i||_1 for the server's weighting.

        Raises:
            ValueError: the algorithm refuses that solver (checked when the
                scenario loads, so never during a run).
        """
        return make_solver(client)

    def start_client(
        self, info: ClientInfo, payload: dict[str, torch.Tensor], state: ClientState
    ) -> ClientContext:
        """The client's context for the round, with ``local_setup``'s result.

        Args:
            info: the client's facts (id, samples, relative weight).
            payload: what it downloaded.
            state: its persistent state ({} the first time).

        Returns:
            The :class:`ClientContext` every later client hook receives.
        """
        client = ClientContext(info, payload, state)
        return replace(client, local=self.local_setup(client))

    # returns what its own hooks read: typed loosely, as ClientContext.local
    def local_setup(self, client: ClientContext) -> Any:  # type: ignore[explicit-any]
        """Constants a client computes once per round before its steps (e.g.
        SCAFFOLD's correction c - c_i), kept as ``client.local``.

        Args:
            client: the round's context (``local`` still None).

        Returns:
            Anything the algorithm's own hooks read; None by default.
        """
        return None

    def grad_hook(
        self, theta: torch.Tensor, grad: torch.Tensor, client: ClientContext
    ) -> None:
        """Adjust one minibatch gradient in place before the solver's step.

        Args:
            theta: the client's current parameters (flat; do not change).
            grad: their gradient on this step's minibatch (flat; changed in
                place, e.g. + c - c_i).
            client: the round's context.

        Guarantees to keep: a pure function of (theta, grad, client); the
        batched path calls :meth:`stacked_grad_hook` instead, which must give
        the same rows.
        """
        return None

    def stacked_grad_hook(self, clients: Sequence[ClientContext]) -> StackedHook | None:
        """``grad_hook`` for a stack of ``clients`` trained together (row j:
        ``clients[j]``); None when the algorithm adjusts no gradient.

        The default applies ``grad_hook`` row by row; an algorithm whose hook
        is vector math overrides this with the stacked form (one tensor op
        for all rows), which must equal the row-by-row result.

        Args:
            clients: the stacked clients' contexts, in row order.

        Returns:
            ``hook(n, theta, grad)`` adjusting the first ``n`` rows of the
            ``[K, d]`` gradient stack in place, or None.
        """
        if type(self).grad_hook is Algorithm.grad_hook:
            return None  # the base hook does nothing: no per-row loop

        def each(n: int, theta: torch.Tensor, grad: torch.Tensor) -> None:
            for j in range(n):  # row views: in-place hooks work
                self.grad_hook(theta[j], grad[j], clients[j])

        return each

    # An algorithm with its own local procedure (FedDM) sets this to a method
    # ``client_train(job: LocalTraining) -> ClientUpdate``, which then runs
    # instead of the solver loop; None: the solver's tau steps. (A method in
    # one class and None in another: no annotation states both.)
    client_train: ClassVar[Any] = None  # type: ignore[explicit-any]

    def client_finish(
        self, delta: torch.Tensor, solver_state: SolverState, client: ClientContext
    ) -> ClientResult:
        """What a client uploads besides its delta, and its new state.

        Args:
            delta: x_i^{t,tau_i} - x^t, the client's model change.
            solver_state: the solver after the steps (lr, steps, ||a_i||_1).
            client: the round's context.

        Returns:
            (extras to upload by name, new persistent state or None to keep
            the old one). Only ``stateful`` algorithms return a state; the
            server stores it after the step and never aggregates it.
        """
        return {}, None

    def weighting(self) -> str | None:
        """Its ``sampling.WEIGHTINGS`` key, checked against the selector.

        Returns:
            The key, or None: weights fixed by the paper, unchecked.
        """
        return None

    # ------------------------------------------------ what it says about itself
    # The runtime, the clock and the checks before a run ask the algorithm
    # these questions instead of knowing any algorithm by name; each gets the
    # run's RunFacts (a small typed record), never the whole scenario.

    def check(self, facts: RunFacts) -> list[Problem]:
        """What is wrong with this algorithm in the run (asked when the
        scenario loads). Overrides add to ``super().check(facts)``.

        The base refuses a field of :attr:`unread` set away from its
        default (it would do nothing), and ``round.policy: async`` without
        an asynchronous server rule (a ``buffer_size``: :attr:`asynchronous`).

        Args:
            facts: the run as plug-ins see it (round policy, fleet, data,
                model, local training).

        Returns:
            Problems, each message leading with the field path it is about;
            an error refuses the file, a ``warning`` is printed.
        """
        return self._unread_set() + self._round_problems(facts)

    def _unread_set(self) -> list[Problem]:
        """The fields of :attr:`unread` set away from their defaults."""
        defaults = {f.name: f.default for f in fields(self)}
        return [
            Problem(
                f"algorithm.{name}: algorithm.name {self.name!r} does not read "
                f"it (set to {getattr(self, name)!r}, it would do nothing); "
                "leave it out"
            )
            for name in sorted(self.unread)
            if getattr(self, name) != defaults[name]
        ]

    def _round_problems(self, facts: RunFacts) -> list[Problem]:
        """What the base refuses of the round policy (:meth:`check`)."""
        if facts.round.policy == "async" and self.instructs:
            return [
                Problem(
                    f"algorithm.name {self.name!r} gives per-client instructions "
                    "(instruct), a hook of synchronous rounds; round.policy "
                    "'async' has none (use fixed_epochs or fixed_window)"
                )
            ]
        if facts.round.policy != "async" or self.asynchronous:
            return []
        from fedsim.plugins import builtins  # (imports every built-in)

        rules = [
            n for n, c in builtins("algorithm").items() if hasattr(c, "buffer_size")
        ]
        return [
            Problem(
                "round.policy 'async' needs an asynchronous server rule "
                f"(algorithm {' or '.join(rules)}), not {self.name!r}; a "
                "plug-in becomes one by declaring buffer_size and reading "
                "ctx.staleness in aggregate (docs/extending.md)"
            )
        ]

    def clock_work(self, facts: RunFacts, data: FederatedData) -> JobWork | None:
        """What the clock charges for a client's job when it is not local
        solver steps (asked once per run, at set-up).

        Args:
            facts: the run as plug-ins see it.
            data: the run's data (class counts, sample shape).

        Returns:
            The job's units of work, each unit's cost in local steps and the
            bytes each client uploads; None: ``tau`` solver steps and
            ``up_factor`` times the model.
        """
        return None

    def memory(
        self, facts: RunFacts, params: int, data: DataInfo
    ) -> tuple[int, str] | None:
        """What the algorithm keeps beyond the models, for the memory check
        before a run (a lower estimate).

        The base counts one model-sized vector per client for ``stateful``
        algorithms.

        Args:
            facts: the run as plug-ins see it.
            params: the model's parameter count (0: unknown).
            data: what the dataset's spec says of its samples.

        Returns:
            (bytes, what they are, naming the field that sets them), or
            None: nothing worth counting.
        """
        if not self.stateful:
            return None
        n = facts.num_clients
        what = (
            f"algorithm.name {self.name!r} keeps {n} client vectors of "
            f"{params:,} parameters"
        )
        return n * params * facts.elem_bytes, what

    def bytes_per_client(self, facts: RunFacts, d: int) -> tuple[int, int]:
        """What one client's round costs on the network (asked once per run;
        the clock charges it and clients.parquet bills it).

        Args:
            facts: the run as plug-ins see it (``elem_bytes``).
            d: the model's parameter count.

        Returns:
            (download, upload) bytes: ``down_factor`` and ``up_factor``
            model vectors.
        """
        elem = facts.elem_bytes
        return self.down_factor * d * elem, self.up_factor * d * elem

    def server_flops(self, n_updates: int, d: int) -> float:
        """FLOPs of the server rule's arithmetic on ``n_updates`` updates of
        ``d`` parameters, which the clock bills at the scenario's ``server``
        speed (asked every step, synchronous and asynchronous, before the
        step runs, so it must depend on these two numbers only).

        Counted as client FLOPs are (fedsim/flops.py): 2 per multiply-add.
        The default is the weighted sum, one multiply-add per parameter and
        update; a rule with more arithmetic per parameter declares it here,
        and work on the server's network goes in ``AggregateInfo.server_work``.
        """
        return 2.0 * n_updates * d


def outdated_form(cls: type[Algorithm]) -> str | None:
    """What is left of an older form of the algorithm interface in ``cls``,
    said in one line with the form that replaced it; None: nothing.

    Asked by :func:`fedsim.plugins.resolve` when a plug-in loads, so that a
    plug-in written for an earlier fedsim stops with that line before any
    training instead of failing inside a round.

    Args:
        cls: the plug-in's class.

    Returns:
        The line, or None.
    """
    new = (
        "define aggregate(self, state, updates, ctx) and read ctx.server "
        "(declared by server_needs = frozenset({'model'}) or "
        "{'validation_loss'}), ctx.staleness and ctx.starts (RoundContext)"
    )
    if "needs_server" in dir(cls):
        return f"{cls.__qualname__}.needs_server is no longer read: {new}"
    params = inspect.signature(cls.aggregate).parameters
    positional = [
        p
        for p in params.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    if "server" in params or ("ctx" not in params and len(positional) < 4):
        sig = ", ".join(params)
        return f"{cls.__qualname__}.aggregate({sig}) is an older form: {new}"
    return None


def data_weights(updates: Updates) -> list[float]:
    """p_i of the round's updates, normalised to sum to 1.

    Args:
        updates: the round's updates (their ``weight``: n_i or a given p_i).

    Returns:
        One weight per update, in update order.
    """
    total = float(sum(u.weight for u in updates))
    return [u.weight / total for u in updates]


def meter(
    updates: Updates,
    w: list[float],
    tau_eff: float,
    shares: list[float] | None = None,
    metrics: Mapping[str, float] | None = None,
) -> AggregateInfo:
    """What an aggregate reports: the effective weights with chi^2(p || w).

    Args:
        updates: the updates the step used, in the order of ``w``.
        w: each update's effective weight w_i (normalised here).
        tau_eff: the effective local steps of the step.
        shares: each delta's weight in the step as applied, not normalised
            (the participation-bias meter); None: ``w`` tells.
        metrics: the plug-in's own named scalars for this step
            (:attr:`AggregateInfo.metrics`: rounds.parquet columns
            ``alg_<name>``); None: none.

    Returns:
        The :class:`AggregateInfo`, chi^2 against the updates' data weights.
    """
    sw = float(sum(w))
    weights = {u.client: wi / sw for u, wi in zip(updates, w, strict=True)}
    chi2_pw = chi2(data_weights(updates), w)
    share = None
    if shares is not None:
        share = {u.client: float(s) for u, s in zip(updates, shares, strict=True)}
    info = AggregateInfo(weights, float(tau_eff), chi2_pw, shares=share)
    return replace(info, metrics=dict(metrics)) if metrics else info


def meter_average(
    updates: Updates,
    p: Sequence[float] | None = None,
    metrics: Mapping[str, float] | None = None,
) -> AggregateInfo:
    """The meter of a server step that moves along the ``p``-weighted
    average of the deltas (FedAvg, FedAdam, FedExP, FedAvgM, ...), by
    fedsim's convention: w_i = p_i ||a_i||_1 and tau_eff = sum_i w_i.

    A delta is ||a_i||_1 times the client's average normalised gradient
    (the local solver reports ||a_i||_1: the sum of its step sizes, tau_i
    lr for plain SGD), so a client that took more steps pulls the average
    toward its own objective in proportion: that is the weight the
    objective-inconsistency meter chi^2(p||w) measures. Weighting by p_i
    alone (the natural wrong choice) reports chi^2 = 0 on any run; the
    built-in ``fedadam`` reports the same figure as this helper.

    Args:
        updates: the step's updates.
        p: each update's weight in the average (None: the data weights,
            :func:`data_weights`).
        metrics: as :func:`meter`.

    Returns:
        The :class:`AggregateInfo`, with ``shares`` = ``p``.
    """
    p = list(p) if p is not None else data_weights(updates)
    w = [pi * u.norm_a for pi, u in zip(p, updates, strict=True)]
    return meter(updates, w, sum(w), p, metrics)


def meter_subset(updates: Updates, info: AggregateInfo) -> AggregateInfo:
    """``info`` extended to every update of the round.

    Args:
        updates: all of the round's updates.
        info: the :func:`meter` of those the step used.

    Returns:
        ``info`` with weight 0 for the round's other clients (FedPNS's
        removed updates, FedDM's empty uploads).
    """
    weights = {u.client: info.weights.get(u.client, 0.0) for u in updates}
    return replace(info, weights=weights)


def empty_info() -> AggregateInfo:
    """What a step without updates reports: no weights, NaN figures."""
    return AggregateInfo(weights={}, tau_eff=float("nan"), chi2_pw=float("nan"))


_Step = tuple[ServerState, AggregateInfo]
_Self = TypeVar("_Self")
_Rest = ParamSpec("_Rest")
# aggregate (or aggregate_async): (self, state, updates, ...) -> the step
_Rule = Callable[Concatenate[_Self, ServerState, Updates, _Rest], _Step]


def skip_empty_rounds(aggregate: _Rule[_Self, _Rest]) -> _Rule[_Self, _Rest]:
    """Decorate ``aggregate`` (or ``aggregate_async``): an empty round keeps
    the state, reporting :func:`empty_info`, so the rule itself never sees
    an empty list (a division by the number of updates would give NaN).

    Args:
        aggregate: the method to wrap (its signature stays visible).

    Returns:
        The wrapped method.
    """

    @functools.wraps(aggregate)
    def wrapper(
        self: _Self,
        state: ServerState,
        updates: Updates,
        *args: _Rest.args,
        **kwargs: _Rest.kwargs,
    ) -> _Step:
        if not updates:
            return state, empty_info()
        return aggregate(self, state, updates, *args, **kwargs)

    return wrapper


class AsyncRule(Protocol):
    """An asynchronous server rule: every ``buffer_size`` arrivals make one
    version (updates in arrival order, their staleness, their start models).

    The server calls ``aggregate(state, updates, ctx)`` with
    ``ctx.staleness`` and ``ctx.starts`` set; ``aggregate_async`` is the
    same step with those as arguments (the built-ins keep it for tests).
    """

    buffer_size: int
    aggregate_async: Callable[
        [ServerState, Updates, Sequence[int], Sequence[torch.Tensor]],
        tuple[ServerState, AggregateInfo],
    ]
