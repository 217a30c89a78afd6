"""A Flower strategy, unchanged, as fedsim's aggregator.

Flower: A Friendly Federated Learning Research Framework. Daniel J. Beutel,
Taner Topal, Akhil Mathur, Xinchi Qiu, Javier Fernandez-Marques, Yan Gao,
Lorenzo Sani, Kwing Hei Li, Titouan Parcollet, Pedro Porto Buarque de
Gusmão, Nicholas D. Lane. arXiv:2007.14390.

``algorithm: {name: flower, strategy: FedAdam, options: {eta: 0.1}}`` runs
any strategy of Flower's message API (``flwr.serverapp.strategy.Strategy``:
``configure_train`` / ``aggregate_train``), built-in (a bare class name) or
the user's own (``module.path:Class``), under fedsim's fleets and clock.
docs/flower.md is the user's page; what a round does:

1. **Selection** (:meth:`Flower.choose_clients`, the declared hook
   ``Algorithm.chooses``). The strategy gets a grid (:func:`make_grid`)
   whose nodes are the round's candidates: every online device
   (``sample_by: strategy``, the default: the strategy's own sampling is the
   selection), or the scenario selector's picks (``sample_by: selector``).
   Flower's node sampling draws from a generator seeded from the round's
   stream (:func:`_strategy_call`), never from the global ones, so the
   choice is a pure function of (scenario, seed). Node ``i + NODE_BASE`` is
   device ``i``.
2. **Clock.** fedsim's clock plans the chosen devices (tau_i, arrival,
   drops) as for any algorithm.
3. **Local training.** fedsim's own (the scenario's ``client`` section,
   tau_i steps). Each message's ``ConfigRecord`` reaches its client
   (:func:`~fedsim.algorithms.flower_records.client_configs`): the keys
   local training honours are ``UNDERSTOOD`` (``lr``: the client's learning
   rate, applied as a gradient scale lr / client.lr; ``proximal-mu``:
   FedProx's term, added to each gradient). Values every client got alike
   travel in the shared payload, differing ones as each client's own
   instructions (:meth:`Flower.instruct`); another key is ignored when
   alike and refused (the run fails, naming it) when it differs.
4. **Replies.** Each device that delivered an update replies as a Flower
   client would: ``ArrayRecord`` of its trained parameters (keyed and shaped
   as the model's named parameters) and ``MetricRecord`` with
   ``num-examples`` (its data weight n_i), ``train_loss`` and ``tau`` (the
   steps the clock granted). A device the strategy messaged that delivered
   nothing replies with a Flower error whose code and reason come from the
   round's ``RoundContext.failures`` (``ERROR_CODE``: ``late`` is
   REPLY_MESSAGE_UNAVAILABLE, ``offline``/``dropout`` NODE_UNAVAILABLE), so
   fault-tolerant strategies see it and why.
5. **Aggregation.** ``aggregate_train``; its ``ArrayRecord`` becomes x and
   its ``MetricRecord`` the round's plug-in metrics (rounds.parquet columns
   ``alg_<key>``). The meter reports fedsim's convention for a step along
   the data-weighted average (``meter_average``: w_i = p_i ||a_i||_1), so a
   FedAvg arm's chi^2 is fedsim's fedavg's; a robust rule's actual weights
   are the strategy's own and not measured.
6. **Federated evaluation** (rounds with ``eval.federated_every``; fedsim's
   runtime has the chosen clients evaluate x on their held-out rows):
   ``configure_evaluate`` picks among those clients and ``aggregate_evaluate``
   aggregates their replies (:meth:`Flower.aggregate_evaluation`).

Every call into the strategy runs through :func:`_strategy_call`: an
exception it raises names the strategy and the method, and a draw from
Python's or NumPy's global generator (which fedsim does not seed: results
would differ run to run) is refused, naming them.

State and checkpoints: the plug-in object holds only its fields. The live
strategy of a server state is kept with that state (:meth:`Flower.live`: found
through the state's ``flwr_state`` tensor, gone when the state is), and
``flwr_state`` holds what the strategy holds beyond a freshly built one,
encoded exactly (:func:`~fedsim.algorithms.flower_records.encode_state`).
``--resume`` rebuilds the strategy from ``options`` and sets it back. An
attribute of another type (a ``random.Random``, an open file) is refused
when the scenario loads, naming it (``checkpoint.every_rounds: 0`` runs
such a strategy without checkpoints).

Not supported, refused when the scenario loads: ``round.policy: async``
(Flower's API is a synchronous round: ``configure_train`` then
``aggregate_train`` of that round's replies; docs/flower.md says why
FedBuff's buffer cannot drive it), ``resources.server.home: actor`` (the
strategy object lives in the driver) and ``server_lr`` (the strategy's own
step decides; a value would do nothing). Without federated evaluation
(``eval.federated_every: 0``, the default) ``configure_evaluate`` and
``aggregate_evaluate`` are not called: fedsim evaluates the global model on
the server's test set (what Flower's centralised ``evaluate_fn`` does), and
a user's strategy that defines either gets a warning when the scenario
loads.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import inspect
import json
import random
import weakref
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import ModuleType
from typing import TYPE_CHECKING, ClassVar, Literal, NoReturn

import numpy as np

import fedsim.algorithms.base as base
from fedsim.algorithms.flower_records import (
    ENTRY,
    FROM_QUICKSTART,
    NODE_BASE,
    FlowerError,
    Layout,
    NotCheckpointable,
    by_client,
    client_configs,
    decode_state,
    encode_state,
    error_reply,
    evaluation_reply,
    flwr,
    from_arrays,
    layout_of,
    plugin_metrics,
    refusal,
    to_arrays,
    train_reply,
)
from fedsim.lazy import torch
from fedsim.spec import Problem

if TYPE_CHECKING:
    from flwr.app import Message, RecordDict
    from flwr.serverapp.grid import Grid
    from flwr.serverapp.strategy import Strategy
    from flwr.supercore.run import Run

    from fedsim.facts import RunFacts

# Flower's wait for this many connected nodes means nothing in simulated time,
# where the fleet says who is online: 1 unless the options say otherwise.
_MIN_NODES = ("min_available_nodes", "min_train_nodes", "min_evaluate_nodes")


def strategy_class(path: str) -> type[Strategy]:
    """The strategy class ``path`` names: a class of ``flwr.serverapp.strategy``
    (``FedAdam``) or an import path ``module.path:Class``.

    Raises:
        FlowerError: Flower is missing, the path does not import, or the
            class is not a ``flwr.serverapp.strategy.Strategy``.
    """
    flwr()
    from flwr.serverapp.strategy import Strategy

    module, _, name = path.rpartition(":") if ":" in path else ("", "", path)
    module = module or "flwr.serverapp.strategy"
    try:
        obj: object = importlib.import_module(module)
        for part in name.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise FlowerError(f"strategy {path!r} does not import: {exc}") from None
    if not (isinstance(obj, type) and issubclass(obj, Strategy)):
        raise FlowerError(
            f"strategy {path!r} is {obj!r}, not a Flower strategy (a subclass of "
            "flwr.serverapp.strategy.Strategy, Flower's message API)"
        )
    return obj


# ----------------------------------------------------------------- the grid
class _Unsent(FlowerError):
    pass


def make_grid(nodes: Sequence[int]) -> Grid:
    """A Flower ``Grid`` whose nodes are ``nodes`` (Flower node ids).

    Only what ``configure_train`` needs works (``get_node_ids``,
    ``create_message``); sending and receiving is fedsim's clock, so
    ``push_messages``, ``pull_messages`` and ``send_and_receive`` raise.
    """
    app = flwr()
    from flwr.serverapp.grid import Grid

    class FleetGrid(Grid):  # type: ignore[misc]
        """The round's candidate devices as Flower nodes."""

        def __init__(self) -> None:
            self._nodes = [int(n) for n in nodes]
            self._run: Run | None = None

        def set_run(self, run: Run) -> None:
            self._run = run

        @property
        def run(self) -> Run | None:  # type: ignore[override]  # None: not set
            return self._run

        def create_message(
            self,
            content: RecordDict,
            message_type: str,
            dst_node_id: int,
            group_id: str,
            ttl: float | None = None,
        ) -> Message:
            return app.Message(
                content=content,
                message_type=message_type,
                dst_node_id=dst_node_id,
                group_id=group_id,
                ttl=ttl,
            )

        def get_node_ids(self) -> list[int]:
            return list(self._nodes)

        def _clock(self, *args: object, **kwargs: object) -> NoReturn:
            raise _Unsent(
                "fedsim's clock delivers a round's messages: a strategy under "
                "fedsim returns them from configure_train and gets the replies "
                "in aggregate_train (no push_messages, pull_messages or "
                "send_and_receive)"
            )

        push_messages = pull_messages = send_and_receive = _clock

    return FleetGrid()


def _act_as(node: int) -> None:
    """Flower's process identity set to ``node`` through its public setters
    (messages take their source from it), as Flower's ServerApp (node 1) or
    a SuperNode sets it. Not put back: in a fedsim process Flower runs only
    as fedsim's driver, which sets it before every message it builds."""
    from flwr.supercore.task_identity import TaskIdentity

    TaskIdentity.task_id = 1
    TaskIdentity.run_id = 1
    TaskIdentity.node_id = node


def _global_draws() -> tuple[object, bytes, int]:
    """Where Python's and NumPy's global generators stand (read, not set)."""
    mt = np.random.get_state(legacy=False)["state"]  # MT19937: key, pos
    return random.getstate(), mt["key"].tobytes(), int(mt["pos"])


@contextlib.contextmanager
def _strategy_call(
    path: str, hook: str, rng: np.random.Generator | None = None
) -> Iterator[None]:
    """Run one of the strategy's methods, with Flower's node sampling
    drawing from a generator seeded from ``rng`` (Flower's ``sample_nodes``
    draws with ``random.sample`` of its module's ``random``, which is
    that generator for the call), as Flower's ServerApp (node 1).

    Raises:
        FlowerError: the strategy raised (naming it and ``hook``), or drew
            from Python's or NumPy's global generator, which fedsim does not
            seed (the run would not be a function of its seed).
    """
    from unittest import mock

    from flwr.serverapp.strategy import strategy_utils

    seed = 0 if rng is None else int(rng.integers(2**63))
    before = _global_draws()
    _act_as(1)
    try:
        # (a Flower release without it raises here: fedsim could not seed it)
        with mock.patch.object(strategy_utils, "random", random.Random(seed)):
            yield
    except FlowerError:
        raise
    except Exception as exc:  # noqa: BLE001 - the strategy's own code
        raise FlowerError(
            f"algorithm.strategy {path!r}: its {hook} raised "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    if _global_draws() != before:
        raise FlowerError(
            f"algorithm.strategy {path!r}: its {hook} drew from Python's or "
            "NumPy's global random generator, which fedsim does not seed (the "
            "results would differ from run to run); sample nodes with Flower's "
            "sample_nodes, or keep a generator seeded from the options"
        )


# -------------------------------------------------------- the live strategy
@dataclass(eq=False)
class _Live:
    """The strategy object of one server state, and the round pending on
    it (set by the selection, read by the payload, the instructions and the
    step)."""

    strategy: Strategy
    x: torch.Tensor  # the state's global model (federated evaluation's)
    facts: RunFacts | None = None  # known once a selection ran (None: tests)
    layout: Layout | None = None
    round: int = -1  # the round whose messages are pending
    pending: dict[int, Message] = field(default_factory=dict)  # client -> message
    # the round's payload entries (ENTRY's names): alike for every client,
    # and each client's own (its instructions)
    shared: dict[str, float] = field(default_factory=dict)
    own: dict[int, dict[str, float]] = field(default_factory=dict)


# A state's live strategy, by the identity of the very ``flwr_state`` tensor
# the state holds (weakly: the entry goes with the tensor; a tensor's ``==``
# is elementwise, so it cannot be a weak dictionary's key). A state this
# process did not make (a checkpoint's) rebuilds it (Flower.live).
_BY_STATE: dict[int, tuple[weakref.ref[torch.Tensor], _Live]] = {}


def _kept(blob: torch.Tensor) -> _Live | None:
    """The live strategy kept with ``blob`` (None: none)."""
    got = _BY_STATE.get(id(blob))
    return got[1] if got is not None and got[0]() is blob else None


# The live strategy of the newest state each algorithm made (weakly: the
# entry above holds it), for the hook without a state, federated evaluation.
_NEWEST: weakref.WeakValueDictionary[Flower, _Live] = weakref.WeakValueDictionary()


@dataclass(frozen=True)
class Flower(base.Algorithm):
    """A Flower strategy as fedsim's aggregator (module docstring).

    Fields:
        strategy: ``FedAvg``, ``FedAdam``, ... (``flwr.serverapp.strategy``)
            or ``module.path:Class`` (the user's subclass).
        options: the strategy's constructor arguments (``{eta: 0.1}``);
            ``min_available_nodes``, ``min_train_nodes`` and
            ``min_evaluate_nodes`` default to 1 (the fleet says who is
            online; Flower's wait for nodes to connect has no simulated
            counterpart).
        sample_by: ``strategy`` (its sampling over every online device is
            the selection) or ``selector`` (the scenario's selector picks,
            and the strategy's grid holds only its picks).
    """

    name: Literal["flower"] = "flower"
    strategy: str = "FedAvg"
    options: dict[str, object] = field(default_factory=dict)  # YAML values
    sample_by: Literal["strategy", "selector"] = "strategy"

    # aggregate reads the model's layout (its named parameters)
    server_needs: ClassVar[frozenset[str]] = frozenset({"model"})
    unread: ClassVar[frozenset[str]] = frozenset({"server_lr"})  # its own step

    def __post_init__(self) -> None:
        self.build()  # Flower installed, a strategy, its options accepted

    def __hash__(self) -> int:
        canon = json.dumps(self.options, sort_keys=True, default=repr)
        return hash((self.name, self.strategy, canon, self.sample_by))

    def build(self) -> Strategy:
        """A fresh strategy from ``strategy`` and ``options``.

        Raises:
            FlowerError: Flower missing, not a strategy, options refused.
        """
        cls = strategy_class(self.strategy)
        opts = dict(self.options)
        params = inspect.signature(cls).parameters
        for k in _MIN_NODES:
            if k in params and k not in opts:
                opts[k] = 1
        try:
            return cls(**opts)
        except TypeError as exc:
            raise FlowerError(
                f"algorithm.options: strategy {cls.__name__} refuses them: {exc}"
            ) from None

    # ------------------------------------------------ what it says about itself
    def check(self, facts: RunFacts) -> list[Problem]:
        """Refuses asynchronous rounds, a server actor, a ``server_lr`` (the
        base), and a strategy whose state cannot be checkpointed when
        checkpoints are on; warns that a strategy's own federated evaluation
        is not run when the scenario has none (``eval.federated_every: 0``)."""
        # the base's unread fields; its async refusal is said below for Flower
        found = self._unread_set() + self._evaluation_unused(facts)
        if facts.round.policy == "async":
            found.append(
                Problem(
                    "round.policy 'async' cannot drive algorithm.name 'flower': "
                    "Flower's strategy API is a synchronous round "
                    "(configure_train, then aggregate_train of that round's "
                    "replies); docs/flower.md says why"
                )
            )
        if facts.server_home != "driver":
            found.append(
                Problem(
                    "resources.server.home must be 'driver' with algorithm.name "
                    "'flower' (the Flower strategy object lives in the driver)"
                )
            )
        if facts.checkpoint_every:
            strategy = self.build()
            try:
                encode_state(_own_attrs(strategy), type(strategy).__name__)
            except NotCheckpointable as exc:
                found.append(Problem(refusal(self.strategy, str(exc))))
        return found

    def _evaluation_unused(self, facts: RunFacts) -> list[Problem]:
        """A warning when the strategy defines its own federated evaluation
        and the scenario has none, so it would never be called."""
        own = _own_evaluation(strategy_class(self.strategy))
        if not own or facts.federated_every:
            return []
        return [
            Problem(
                f"algorithm.strategy {self.strategy!r} defines "
                f"{' and '.join(own)}, which fedsim calls only with federated "
                "evaluation (eval.federated_every and "
                "data.client_test_fraction); without it fedsim evaluates the "
                "global model on the server's test set (eval.every_rounds); "
                'docs/flower.md, "Evaluation"',
                warning=True,
            )
        ]

    # ---------------------------------------------------------- server half
    def init(self, x0: torch.Tensor, num_clients: int) -> base.ServerState:
        """x0, the fresh strategy's record and round 0; the strategy is kept
        with the state (:meth:`live`)."""
        strategy = self.build()
        # not refused here: check refused it when the run has checkpoints
        blob = self._export(strategy, checkpoints=False)
        self._keep(blob, _Live(strategy, x=x0.clone()))
        return {"x": x0.clone(), "flwr_state": blob, "flwr_round": _count(0)}

    def _keep(self, blob: torch.Tensor, live: _Live) -> None:
        """``live`` as the strategy of the state holding ``blob``, and as
        this algorithm's newest."""
        _BY_STATE[id(blob)] = (weakref.ref(blob), live)
        weakref.finalize(blob, _BY_STATE.pop, id(blob), None)
        _NEWEST[self] = live

    def live(self, state: base.ServerState) -> _Live:
        """The strategy of ``state``: the one kept with it, or one rebuilt
        from ``options`` with the recorded attributes set back (a resumed
        run, or a state this process did not make).

        Raises:
            CheckpointError: the state's record is empty (a strategy fedsim
                cannot checkpoint).
        """
        blob = state["flwr_state"]
        live = _kept(blob)
        if live is None:
            strategy = self.build()
            if blob.numel() == 0:
                from fedsim.checkpoint import CheckpointError

                raise CheckpointError(
                    f"{type(strategy).__name__}: its state was not recorded (a "
                    "strategy fedsim cannot checkpoint, run with "
                    "checkpoint.every_rounds: 0)"
                )
            for k, v in decode_state(blob).items():
                setattr(strategy, k, v)
            live = _Live(strategy, x=state["x"])
            self._keep(blob, live)
        return live

    def payload(self, state: base.ServerState) -> dict[str, torch.Tensor]:
        """x, and the round's config values that every messaged client got
        alike (``flwr.lr_scale``, ``flwr.proximal_mu``: ``client_configs``)."""
        live = _kept(state["flwr_state"])
        out = {"x": state["x"]}
        for k, v in ({} if live is None else live.shared).items():
            out[k] = torch.tensor(v, dtype=torch.float64)
        return out

    def instruct(
        self, state: base.ServerState, clients: Sequence[int], round: int
    ) -> dict[int, dict[str, float]]:
        """The config values the strategy gave these clients differently
        (their own ``lr``, ``proximal-mu``), as each one's payload entries.

        A pure function of (state, clients, round): ``configure_train`` ran
        this round on this state with the round's stream (after a resume
        too), and its messages are what is read here.
        """
        live = _kept(state["flwr_state"])
        if live is None:
            return {}
        return {c: dict(live.own[c]) for c in clients if c in live.own}

    @property
    def chooses(self) -> Literal["candidates", "picks"]:
        """The strategy chooses the round's clients: among every online
        device (``sample_by: strategy``) or the selector's picks."""
        return "candidates" if self.sample_by == "strategy" else "picks"

    def choose_clients(
        self, state: base.ServerState, choice: base.ClientChoice
    ) -> list[int]:
        """Round ``choice.round``'s ``configure_train`` over a grid of
        ``choice.nodes``; the clients it messaged, sorted.

        Raises:
            FlowerError: the strategy raised; a message to a node not in the
                grid, two to one node, or a config the local training cannot
                honour (``client_configs``).
        """
        live = self.live(state)
        live.facts = choice.facts
        live.layout = layout_of(choice.model, state["x"])
        return self._configure(state, live, choice.round, choice.nodes, choice.rng)

    def _configure(
        self,
        state: base.ServerState,
        live: _Live,
        t: int,
        nodes: Sequence[int],
        rng: np.random.Generator,
    ) -> list[int]:
        """``configure_train`` of round ``t`` (:meth:`choose_clients`); its
        messages and their configs kept in ``live``."""
        app = flwr()
        strategy = live.strategy
        need = _min_nodes(strategy, "min_train_nodes")
        live.round, live.pending, live.shared, live.own = t, {}, {}, {}
        if len(nodes) < need:
            return []  # Flower would wait for nodes; here the round trains nobody
        assert live.layout is not None
        arrays = to_arrays(app, state["x"], live.layout)
        grid = make_grid([int(i) + NODE_BASE for i in nodes])
        with _strategy_call(self.strategy, "configure_train", rng):
            msgs = list(
                strategy.configure_train(t + 1, arrays, app.ConfigRecord(), grid)
            )
        live.pending = by_client(msgs, nodes, t, strategy, "configure_train")
        client = None if live.facts is None else live.facts.client
        live.shared, live.own = client_configs(
            {c: live.pending[c] for c in sorted(live.pending)}, t, client
        )
        return sorted(live.pending)

    def aggregate(
        self,
        state: base.ServerState,
        updates: base.Updates,
        ctx: base.RoundContext = base.PLAIN_ROUND,
    ) -> tuple[base.ServerState, base.AggregateInfo]:
        """``aggregate_train`` of the round's replies (module docstring, 4
        and 5); without a selection first (a test), the updates' clients
        are messaged with a fixed stream."""
        live = self.live(state)
        if not updates and not live.pending:
            return state, base.empty_info()  # nobody was messaged
        app = flwr()
        if live.layout is None:
            live.layout = layout_of(
                None if ctx.server is None else ctx.server.model, state["x"]
            )
        by = {u.client: u for u in updates}
        if live.round < 0 or not live.pending:  # called without a selection
            t = int(state["flwr_round"])
            self._configure(state, live, t, sorted(by), _rng(t))
        t, x, layout = live.round, state["x"], live.layout
        replies = _replies(app, live, by, ctx.failures, x)
        strategy = live.strategy
        with _strategy_call(self.strategy, "aggregate_train"):
            arrays, metrics = strategy.aggregate_train(t + 1, replies)
        new_x = x if arrays is None else from_arrays(arrays, layout, x)
        blob = self._export(
            strategy, live.facts is None or bool(live.facts.checkpoint_every)
        )
        self._keep(blob, _Live(strategy, new_x, live.facts, layout))
        state = {"x": new_x, "flwr_state": blob, "flwr_round": _count(t + 1)}
        info = base.meter_average(updates) if updates else base.empty_info()
        named = plugin_metrics(metrics, t)
        return state, replace(info, metrics=named) if named else info

    def aggregate_evaluation(
        self, results: Sequence[base.ClientEvaluation], round: int
    ) -> Mapping[str, float]:
        """Federated evaluation through the strategy's own
        ``configure_evaluate`` and ``aggregate_evaluate`` (docs/flower.md,
        "Evaluation").

        fedsim chose the evaluating clients (all with held-out rows, or
        ``eval.federated_clients`` of them) and they have evaluated the
        model of this round's step. ``configure_evaluate`` gets a grid of just
        those nodes, sampling from a stream of the run's seed and the round,
        its own (its ``fraction_evaluate`` samples among them); each node it
        messaged replies what Flower's quickstart ClientApp sends: a
        ``MetricRecord`` of ``eval_loss``, ``eval_acc`` (left out for targets
        without classes) and ``num-examples`` (its held-out rows). The
        ``MetricRecord`` ``aggregate_evaluate`` returns gives the columns:
        ``eval_loss`` and ``eval_acc`` as ``fed_loss`` and ``fed_accuracy``
        (the names fedsim's own rule writes and the report draws), another
        key as ``fed_<key>``. None, or fewer evaluating clients than the
        strategy's ``min_available_nodes`` or ``min_evaluate_nodes`` (Flower
        would wait for nodes), gives no column.

        Both calls run on a copy of the strategy of the newest state, so
        what they change in it is dropped: the checkpointed state, and so a
        resumed run, never depend on evaluation. A pure function of
        (results, round, the strategy's state).

        Args:
            results: the clients' evaluations, in ascending client id.
            round: the 0-based round (Flower's ``server_round`` is round + 1).

        Raises:
            FlowerError: ``configure_evaluate`` messaged a node that is not
                evaluating, or one node twice; the strategy raised or cannot
                be copied; two keys of the record give one column.
        """
        app = flwr()
        live = _NEWEST.get(self)
        strategy = self._copy(live)
        by = {r.client: r for r in results}
        if len(by) < _min_nodes(strategy, "min_evaluate_nodes"):
            return {}
        x = torch.zeros(0) if live is None else live.x
        layout = (live and live.layout) or layout_of(None, x)
        arrays = to_arrays(app, x, layout)
        grid = make_grid([c + NODE_BASE for c in sorted(by)])
        seed = 0 if live is None or live.facts is None else live.facts.seed
        with _strategy_call(
            self.strategy, "configure_evaluate", _evaluation_rng(seed, round)
        ):
            msgs = list(
                strategy.configure_evaluate(round + 1, arrays, app.ConfigRecord(), grid)
            )
        sent = by_client(msgs, sorted(by), round, strategy, "configure_evaluate")
        replies = []
        for c in sorted(sent):
            _act_as(c + NODE_BASE)
            replies.append(app.Message(evaluation_reply(app, by[c]), reply_to=sent[c]))
        with _strategy_call(self.strategy, "aggregate_evaluate"):
            metrics = strategy.aggregate_evaluate(round + 1, replies)
        return plugin_metrics(
            metrics, round, "aggregate_evaluate", "fed_", FROM_QUICKSTART
        )

    def _copy(self, live: _Live | None) -> Strategy:
        """A copy of ``live``'s strategy (a fresh one outside a run).

        Raises:
            FlowerError: copying it raised.
        """
        try:
            return self.build() if live is None else copy.deepcopy(live.strategy)
        except Exception as exc:  # noqa: BLE001 - deepcopy raises what the attribute raises
            raise FlowerError(
                f"algorithm.strategy {self.strategy!r}: federated evaluation "
                f"runs on a copy of the strategy, and copying it raised {exc!r}"
            ) from None

    def _export(self, strategy: Strategy, checkpoints: bool) -> torch.Tensor:
        """The strategy's record as ``flwr_state`` (a fresh tensor: the key
        its live strategy is kept under).

        Raises:
            CheckpointError: it cannot be stored exactly and ``checkpoints``
                (the run has them); otherwise an empty record stands in.
        """
        from fedsim.checkpoint import CheckpointError

        try:
            return encode_state(
                _own_attrs(strategy, self.build()), type(strategy).__name__
            )
        except NotCheckpointable as exc:
            if checkpoints:
                raise CheckpointError(refusal(self.strategy, str(exc))) from None
            return torch.zeros(0, dtype=torch.uint8)

    # ---------------------------------------------------------- client half
    def local_setup(self, client: base.ClientContext) -> _Local | None:
        """The client's ``proximal-mu`` and ``lr`` (as its ratio to
        client.lr) for the round, shared or its own; None: neither."""
        mu = client.payload.get(ENTRY["proximal-mu"])
        scale = client.payload.get(ENTRY["lr"])
        if mu is None and scale is None:
            return None
        return _Local(
            0.0 if mu is None else float(mu),
            client.payload["x"],
            1.0 if scale is None else float(scale),
        )

    def grad_hook(
        self, theta: torch.Tensor, grad: torch.Tensor, client: base.ClientContext
    ) -> None:
        """FedProx's term, then the client's learning-rate ratio: the
        solver's step lr * (r (g + mu (theta - x^t))) is a step of lr r on
        the proximal objective, as a Flower client with that lr takes it
        (solvers sgd, momentum and decay without weight decay or clipping,
        which ``client_configs`` requires when an ``lr`` differs)."""
        local = client.local
        if local is None:
            return
        if local.mu:
            # the same floats as fedsim's proximal solver: g + mu (x - x^t)
            grad.add_(local.mu * (theta - local.x))
        if local.scale != 1.0:  # the scenario's lr: the bits of a plain run
            grad.mul_(local.scale)


def _replies(
    app: ModuleType,
    live: _Live,
    by: Mapping[int, base.ClientUpdate],
    failures: Sequence[base.Failure],
    x: torch.Tensor,
) -> list[Message]:
    """The replies to the round's pending messages, in client-id order: a
    client's update (:func:`train_reply`) or, messaged and delivered
    nothing, a Flower error with the clock's reason (``failures``)."""
    why = {f.client: f.reason for f in failures}
    layout = live.layout or layout_of(None, x)
    out = []
    for c in sorted(live.pending):
        _act_as(c + NODE_BASE)
        u = by.get(c)
        body = (
            error_reply(app, c, why.get(c))
            if u is None
            else train_reply(app, u, x, layout)
        )
        out.append(app.Message(body, reply_to=live.pending[c]))
    return out


@dataclass(frozen=True)
class _Local:
    """A client's round constants (``client.local``): FedProx's ``mu``
    (0: none) with the model ``x`` it pulls towards, and ``scale``, its
    ``lr`` over the scenario's client.lr (1: the scenario's)."""

    mu: float
    x: torch.Tensor
    scale: float


def _own_attrs(strategy: Strategy, fresh: Strategy | None = None) -> dict[str, object]:
    """The strategy's instance attributes that are state: not the very
    objects a freshly built ``fresh`` holds (options, helper functions), and
    (without ``fresh``) not callables, which the constructor rebuilds."""
    made = {} if fresh is None else vars(fresh)
    return {
        k: v
        for k, v in vars(strategy).items()
        if not (k in made and made[k] is v) and (fresh is not None or not callable(v))
    }


def _own_evaluation(cls: type[Strategy]) -> list[str]:
    """The federated-evaluation methods ``cls`` defines outside Flower's
    own package (a user's ``configure_evaluate``/``aggregate_evaluate``)."""
    out = []
    for name in ("configure_evaluate", "aggregate_evaluate"):
        owner = next(k for k in cls.__mro__ if name in vars(k))
        if not owner.__module__.startswith("flwr."):
            out.append(name)
    return out


def _count(t: int) -> torch.Tensor:
    return torch.tensor(t, dtype=torch.int64)


def _rng(t: int) -> np.random.Generator:
    """A fixed stream for a round aggregated without a selection (tests)."""
    return np.random.default_rng(np.random.SeedSequence([0xF10, t]))


def _evaluation_rng(seed: int, t: int) -> np.random.Generator:
    """``configure_evaluate``'s stream in round ``t`` of a run with ``seed``:
    its own (a tag no other stream uses), so sampling evaluators moves no
    stream the training reads, and a resumed run draws the same."""
    return np.random.default_rng(np.random.SeedSequence([0xF10, 0xE7A1, seed, t]))


def _min_nodes(strategy: Strategy, phase: str) -> int:
    """The nodes ``strategy`` waits for before it samples for ``phase``
    (``min_train_nodes`` or ``min_evaluate_nodes``), with its
    ``min_available_nodes``; at least 1."""
    keys = (_MIN_NODES[0], phase)
    return max([1, *(int(getattr(strategy, k, 1) or 1) for k in keys)])
