"""A Flower strategy, unchanged, as fedsim's aggregator (issue 41).

Flower: A Friendly Federated Learning Research Framework. Daniel J. Beutel,
Taner Topal, Akhil Mathur, Xinchi Qiu, Javier Fernandez-Marques, Yan Gao,
Lorenzo Sani, Kwing Hei Li, Titouan Parcollet, Pedro Porto Buarque de
Gusmão, Nicholas D. Lane. arXiv:2007.14390.

``algorithm: {name: flower, strategy: FedAdam, options: {eta: 0.1}}`` runs
any strategy of Flower's message API (``flwr.serverapp.strategy.Strategy``:
``configure_train`` / ``aggregate_train``), built-in (a bare class name) or
the user's own (``module.path:Class``), under fedsim's fleets and clock.
docs/flower.md is the user's page; what a round does:

1. **Selection.** The strategy gets a grid (:class:`FleetGrid`) whose nodes
   are the round's candidates: every online device (``sample_by:
   strategy``, the default: the strategy's own sampling is the selection),
   or the scenario selector's picks (``sample_by: selector``). Its
   ``configure_train`` runs with Python's and NumPy's global generators
   seeded from the round's stream (Flower samples with ``random.sample``),
   so the choice is a pure function of (scenario, seed). Node ``i +
   NODE_BASE`` is device ``i``.
2. **Clock.** fedsim's clock plans the chosen devices (tau_i, arrival,
   drops) as for any algorithm.
3. **Local training.** fedsim's own (the scenario's ``client`` section,
   tau_i steps). Each message's ``ConfigRecord`` reaches its client
   (:func:`client_configs`): the keys local training honours are
   :data:`UNDERSTOOD` (``lr``: the client's learning rate, applied as a
   gradient scale lr / client.lr; ``proximal-mu``: FedProx's term, added to
   each gradient). Values every client got alike travel in the shared
   payload, differing ones as each client's own instructions
   (:meth:`Flower.instruct`); another key is ignored when alike and
   refused (the run fails, naming it) when it differs.
4. **Replies.** Each device that delivered an update replies as a Flower
   client would: ``ArrayRecord`` of its trained parameters (keyed and shaped
   as the model's named parameters) and ``MetricRecord`` with
   ``num-examples`` (its data weight n_i), ``train_loss`` and ``tau`` (the
   steps the clock granted). A device the strategy messaged that delivered
   nothing replies with a Flower error whose code and reason come from the
   round's ``RoundContext.failures`` (:data:`ERROR_CODE`: ``late`` is
   REPLY_MESSAGE_UNAVAILABLE, ``offline``/``dropout`` NODE_UNAVAILABLE), so
   fault-tolerant strategies see it and why.
5. **Aggregation.** ``aggregate_train``; its ``ArrayRecord`` becomes x and
   its ``MetricRecord`` the round's plug-in metrics (rounds.parquet columns
   ``alg_<key>``, :func:`plugin_metrics`).
6. **Federated evaluation** (rounds with ``eval.federated_every``; fedsim's
   runtime has the chosen clients evaluate x on their held-out rows):
   ``configure_evaluate`` picks among those clients and ``aggregate_evaluate``
   aggregates their replies (:meth:`Flower.aggregate_evaluation`).

State and checkpoints: the strategy object lives in the driver process (a
cache, :class:`_Live`), and after every round the adapter writes what it
holds into the server state (``flwr_state``: its instance attributes that a
freshly built strategy does not already hold, encoded exactly: numbers,
text, bytes, NumPy arrays and lists, tuples and dicts of them, and Flower's
records). ``--resume`` rebuilds the strategy from ``options`` and sets them
back. An attribute of another type (a ``random.Random``, an open file) is
refused when the scenario loads, naming it (``checkpoint.every_rounds: 0``
runs such a strategy without checkpoints).

Not supported, refused when the scenario loads: ``round.policy: async``
(Flower's API is a synchronous round: ``configure_train`` then
``aggregate_train`` of that round's replies; docs/flower.md says why
FedBuff's buffer cannot drive it), and ``resources.server.home: actor`` (the
strategy object lives in the driver). Without federated evaluation
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
import logging
import math
import os
import random
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from types import ModuleType
from typing import TYPE_CHECKING, ClassVar, Literal, NoReturn, Protocol

import numpy as np

import fedsim.algorithms.base as base
from fedsim import hooks
from fedsim.lazy import torch
from fedsim.spec import ClientSpec, Problem

if TYPE_CHECKING:
    from flwr.app import ArrayRecord, Error, Message, MetricRecord, RecordDict
    from flwr.serverapp.grid import Grid
    from flwr.serverapp.strategy import Strategy
    from flwr.supercore.run import Run

    from fedsim.facts import RunFacts
    from fedsim.selectors.base import Draw, Ints, Selector, SelectorState

# A model's named parameters (name, shape), in the flat vector's order.
Layout = list[tuple[str, tuple[int, ...]]]

EXTRA = "pip install 'fedsim[flower]'"
# Device i is Flower node i + NODE_BASE (node 1 is Flower's SuperLink).
NODE_BASE = 1_000_000
# ConfigRecord keys fedsim's local training honours, per client, and what
# each does; a strategy may send them alike to every node or differently.
UNDERSTOOD = {
    "lr": "the client's local learning rate, in place of client.lr",
    "proximal-mu": "FedProx's proximal term mu/2 ||x - x^t||^2",
}
# Their payload entries (shared, or the client's own through ``instruct``):
# ``lr`` travels as its ratio to the scenario's client.lr.
_ENTRY = {"lr": "flwr.lr_scale", "proximal-mu": "flwr.proximal_mu"}
# What a client lost to the clock replies, as Flower's ErrorCode: the node
# left (5, NODE_UNAVAILABLE), its reply came too late (4,
# REPLY_MESSAGE_UNAVAILABLE), or it had nothing to train (0, UNKNOWN).
ERROR_CODE = {
    "offline": 5,
    "dropout": 5,
    "late": 4,
    "surplus": 4,
    "stale": 4,
    "no_time": 0,
    "no_data": 0,
}
# clients.parquet's drop_reason, in words, for the error reply's reason
_WHY = {
    "offline": "went offline before its upload",
    "dropout": "dropped out before its upload",
    "late": "sent its update after the round's deadline",
    "surplus": "arrived after the round had its updates (over-selection)",
    "stale": "its update was too stale",
    "no_time": "had no time for a single local step",
    "no_data": "has no training data",
}
# Flower's wait for this many connected nodes means nothing in simulated time,
# where the fleet says who is online: 1 unless the options say otherwise.
_MIN_NODES = ("min_available_nodes", "min_train_nodes", "min_evaluate_nodes")


class FlowerError(ValueError):
    """A Flower strategy did something the adapter cannot carry out (the
    message names the field or the strategy's attribute)."""


def flwr() -> ModuleType:
    """Flower's ``flwr.app`` module, imported on first use (quietly: no
    telemetry, Flower's per-round INFO lines off).

    Raises:
        FlowerError: Flower is not installed (names the extra to install).
    """
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    try:
        app = importlib.import_module("flwr.app")
    except ImportError:
        raise FlowerError(
            f"algorithm.name 'flower' needs Flower (flwr), which is not installed: "
            f"{EXTRA}"
        ) from None
    logging.getLogger("flwr").setLevel(logging.WARNING)
    return app


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


# ------------------------------------------------------------ exact state codec


class NotCheckpointable(TypeError):
    """A strategy attribute whose value the codec cannot store exactly."""


def _enc(v: object, blobs: list[bytes], where: str) -> object:
    """``v`` as a JSON value, its arrays' bytes appended to ``blobs`` (exact)."""
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return {"f": repr(v)}  # repr round-trips, NaN and infinities included
    if isinstance(v, bytes):
        blobs.append(v)
        return {"bytes": len(blobs) - 1}
    if isinstance(v, np.generic):
        v = np.asarray(v)
        blobs.append(v.tobytes())
        return {"scalar": len(blobs) - 1, "dtype": v.dtype.str}
    if isinstance(v, np.ndarray) and v.dtype.kind in "biufc":
        blobs.append(np.ascontiguousarray(v).tobytes())
        return {"array": len(blobs) - 1, "dtype": v.dtype.str, "shape": v.shape}
    app = flwr()
    if isinstance(v, app.Array):
        return {"Array": _enc(v.numpy(), blobs, where)}
    for kind in ("ArrayRecord", "ConfigRecord", "MetricRecord"):
        if isinstance(v, getattr(app, kind)):
            return {kind: {k: _enc(x, blobs, f"{where}[{k!r}]") for k, x in v.items()}}
    if isinstance(v, (list, tuple)):
        items = [_enc(x, blobs, f"{where}[{i}]") for i, x in enumerate(v)]
        return {"tuple" if isinstance(v, tuple) else "list": items}
    if isinstance(v, dict) and all(isinstance(k, str) for k in v):
        return {"dict": {k: _enc(x, blobs, f"{where}[{k!r}]") for k, x in v.items()}}
    raise NotCheckpointable(f"{where} holds a {type(v).__module__}.{type(v).__name__}")


def _dec(j: object, blobs: list[bytes]) -> object:
    """Inverse of :func:`_enc`."""
    if not isinstance(j, dict):
        return j
    (kind, body), *_ = j.items()
    if kind == "f":
        return float(body)
    if kind == "bytes":
        return blobs[body]
    if kind == "scalar":
        return np.frombuffer(blobs[body], dtype=np.dtype(j["dtype"]))[0].copy()
    if kind == "array":
        a = np.frombuffer(blobs[body], dtype=np.dtype(j["dtype"]))
        return a.reshape(j["shape"]).copy()
    if kind in ("list", "tuple"):
        items = [_dec(x, blobs) for x in body]
        return items if kind == "list" else tuple(items)
    if kind == "dict":
        return {k: _dec(x, blobs) for k, x in body.items()}
    app = flwr()
    if kind == "Array":
        return app.Array(_dec(body, blobs))
    return getattr(app, kind)({k: _dec(x, blobs) for k, x in body.items()})


def encode_state(strategy: Strategy, fresh: Strategy) -> torch.Tensor:
    """What ``strategy`` holds beyond a freshly built ``fresh`` (its instance
    attributes that are not the very objects ``fresh`` holds), as a uint8
    tensor: a JSON header, a NUL, then the arrays' bytes.

    Raises:
        NotCheckpointable: an attribute of a type the codec cannot store.
    """
    blobs: list[bytes] = []
    attrs = {}
    made = vars(fresh)
    for k, v in vars(strategy).items():
        if k in made and made[k] is v:
            continue  # rebuilt by the constructor (options, helper functions)
        attrs[k] = _enc(v, blobs, f"{type(strategy).__name__}.{k}")
    head = {"attrs": attrs, "sizes": [len(b) for b in blobs]}
    raw = json.dumps(head, sort_keys=True).encode() + b"\0" + b"".join(blobs)
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8).clone()


def decode_state(strategy: Strategy, blob: torch.Tensor) -> None:
    """Set back on ``strategy`` (freshly built) what :func:`encode_state` stored."""
    raw = bytes(blob.numpy().tobytes())
    if not raw:
        from fedsim.checkpoint import CheckpointError

        raise CheckpointError(
            f"{type(strategy).__name__}: its state was not recorded (a strategy "
            "fedsim cannot checkpoint, run with checkpoint.every_rounds: 0)"
        )
    cut = raw.index(b"\0")
    head = json.loads(raw[:cut])
    blobs, at = [], cut + 1
    for n in head["sizes"]:
        blobs.append(raw[at : at + n])
        at += n
    for k, j in head["attrs"].items():
        setattr(strategy, k, _dec(j, blobs))


# ----------------------------------------------------------------- the grid


def _grid_base() -> type[Grid]:
    """Flower's abstract ``Grid`` (imported with Flower)."""
    flwr()
    from flwr.serverapp.grid import Grid

    return Grid


class _Unsent(FlowerError):
    pass


def make_grid(nodes: Sequence[int]) -> Grid:
    """A Flower ``Grid`` whose nodes are ``nodes`` (Flower node ids).

    Only what ``configure_train`` needs works (``get_node_ids``,
    ``create_message``); sending and receiving is fedsim's clock, so
    ``push_messages``, ``pull_messages`` and ``send_and_receive`` raise.
    """
    Grid = _grid_base()
    app = flwr()

    class FleetGrid(Grid):  # type: ignore[misc, valid-type]
        """The round's candidate devices as Flower nodes."""

        def __init__(self) -> None:
            self._nodes = [int(n) for n in nodes]

        def set_run(self, run: Run) -> None:
            self._run = run

        @property
        def run(self) -> Run | None:
            return getattr(self, "_run", None)

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


@contextlib.contextmanager
def _seeded(rng: np.random.Generator) -> Iterator[None]:
    """Python's and NumPy's global generators seeded from ``rng`` (Flower's
    ``sample_nodes`` uses ``random.sample``), put back as they were after."""
    py, npy = random.getstate(), np.random.get_state()
    random.seed(int(rng.integers(2**63)))
    np.random.seed(int(rng.integers(2**32)))
    try:
        yield
    finally:
        random.setstate(py)
        np.random.set_state(npy)


@contextlib.contextmanager
def _as_node(node: int) -> Iterator[None]:
    """Flower's process identity (messages take their source from it) set to
    ``node``, as Flower's ServerApp (node 1) or a SuperNode would set it."""
    from flwr.supercore.task_identity import TaskIdentity as T

    old = (T._task_id, T._run_id, T._node_id)
    T.task_id, T.run_id, T.node_id = 1, 1, node
    try:
        yield
    finally:
        T._task_id, T._run_id, T._node_id = old


# -------------------------------------------------------- the live strategy


@dataclass
class _Live:
    """The strategy object of a run, in the driver: a cache of the server
    state's ``flwr_state`` (``token`` is that very tensor)."""

    strategy: Strategy
    token: torch.Tensor
    # the global model after the last server step: what federated
    # evaluation's messages carry (None before a round ran here)
    x: torch.Tensor | None = None
    layout: Layout | None = None
    round: int = -1  # the round whose messages are pending
    pending: dict[int, Message] = field(default_factory=dict)  # client -> message
    # the round's payload entries (_ENTRY's names): alike for every client,
    # and each client's own (its instructions)
    shared: dict[str, float] = field(default_factory=dict)
    own: dict[int, dict[str, float]] = field(default_factory=dict)


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

    def __post_init__(self) -> None:
        self.build()  # Flower installed, a strategy, its options accepted

    def __hash__(self) -> int:
        return hash((self.name, self.strategy, _canon(self.options), self.sample_by))

    def __getstate__(self) -> dict[str, object]:
        # the live strategy stays in the driver; workers get the fields
        return {f.name: getattr(self, f.name) for f in fields(self)}

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
            raise FlowerError(f"options: {cls.__name__} refuses them: {exc}") from None

    # ------------------------------------------------ what it says about itself

    def check(self, facts: RunFacts) -> list[Problem]:
        """Refuses asynchronous rounds, a server actor, and a strategy whose
        state cannot be checkpointed when checkpoints are on; warns that a
        strategy's own federated evaluation is not run when the scenario has
        none (``eval.federated_every: 0``). Keeps the
        scenario's ``client`` section: a config ``lr`` is honoured against
        it (:func:`client_configs`)."""
        object.__setattr__(self, "_client", facts.client)
        object.__setattr__(self, "_seed", facts.seed)  # configure_evaluate's
        found = self._evaluation_unused(facts)
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
        every = facts.checkpoint_every
        object.__setattr__(self, "_checkpoints", bool(every))
        if every:
            why = self._uncheckpointable(self.build())
            if why is not None:
                found.append(Problem(why))
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

    def _uncheckpointable(self, strategy: Strategy) -> str | None:
        """Why ``strategy``'s state cannot be checkpointed (None: it can)."""
        try:
            blobs: list[bytes] = []
            for k, v in vars(strategy).items():
                if not callable(v):  # the constructor's functions are rebuilt
                    _enc(v, blobs, f"{type(strategy).__name__}.{k}")
        except NotCheckpointable as exc:
            return _refusal(self.strategy, str(exc))
        return None

    # ---------------------------------------------------------- server half

    def init(self, x0: torch.Tensor, num_clients: int) -> base.ServerState:
        live = self.build()
        blob = self._export(live)
        object.__setattr__(self, "_live", _Live(live, blob, x=x0.clone()))
        return {"x": x0.clone(), "flwr_state": blob, "flwr_round": _count(0)}

    def payload(self, state: base.ServerState) -> dict[str, torch.Tensor]:
        """x, and the round's config values that every messaged client got
        alike (``flwr.lr_scale``, ``flwr.proximal_mu``: :func:`client_configs`)."""
        live = getattr(self, "_live", None)
        out = {"x": state["x"]}
        if live is not None and live.token is state["flwr_state"]:
            for k, v in live.shared.items():
                out[k] = torch.tensor(v, dtype=torch.float64)
        return out

    def instruct(
        self, state: base.ServerState, clients: Sequence[int], round: int
    ) -> dict[int, dict[str, float]]:
        """The config values the strategy gave these clients differently
        (their own ``lr``, ``proximal-mu``), as each one's payload entries.

        A pure function of (state, clients, round): ``configure_train`` ran
        this round on this state with the round's seeded stream (after a
        resume too), and its messages are what is read here.
        """
        live = getattr(self, "_live", None)
        if live is None or live.token is not state["flwr_state"]:
            return {}
        return {c: dict(live.own[c]) for c in clients if c in live.own}

    def live(self, state: base.ServerState) -> _Live:
        """The strategy object of ``state``: the cached one, or one rebuilt
        from ``options`` with the checkpointed attributes set back (a
        resumed run, or a state this process did not make)."""
        live = getattr(self, "_live", None)
        if live is None or live.token is not state["flwr_state"]:
            strategy = self.build()
            decode_state(strategy, state["flwr_state"])
            live = _Live(strategy, state["flwr_state"], x=state["x"])
            object.__setattr__(self, "_live", live)
        return live

    def current(self) -> Strategy | None:
        """The strategy object of the run this algorithm drives (its state
        after the last round; None before a run): for a look at what the
        user's strategy recorded, as after Flower's ``start``."""
        live = getattr(self, "_live", None)
        return None if live is None else live.strategy

    def configure(
        self,
        state: base.ServerState,
        t: int,
        nodes: Sequence[int],
        rng: np.random.Generator,
        layout: Layout,
    ) -> list[int]:
        """Round ``t``'s ``configure_train`` over a grid of devices ``nodes``
        (client ids); returns the clients it messaged, sorted.

        Raises:
            FlowerError: a message to a node not in the grid, two to one
                node, or a config the local training cannot honour
                (:func:`client_configs`).
        """
        app = flwr()
        live = self.live(state)
        live.layout = layout
        strategy = live.strategy
        need = _min_nodes(strategy, "min_train_nodes")
        live.round, live.pending, live.shared, live.own = t, {}, {}, {}
        if len(nodes) < need:
            return []  # Flower would wait for nodes; here the round trains nobody
        arrays = _arrays(app, state["x"], layout)
        grid = make_grid([int(i) + NODE_BASE for i in nodes])
        with _seeded(rng), _as_node(1):
            msgs = list(
                strategy.configure_train(t + 1, arrays, app.ConfigRecord(), grid)
            )
        live.pending = _by_client(msgs, nodes, t, strategy, "configure_train")
        live.shared, live.own = client_configs(
            {c: live.pending[c] for c in sorted(live.pending)},
            t,
            getattr(self, "_client", None),
        )
        return sorted(live.pending)

    def aggregate(
        self,
        state: base.ServerState,
        updates: base.Updates,
        ctx: base.RoundContext = base.PLAIN_ROUND,
    ) -> tuple[base.ServerState, base.AggregateInfo]:
        live = self.live(state)
        server = ctx.server
        if not updates and not live.pending:
            live.x = state["x"]
            return state, base.empty_info()  # nobody was messaged
        app = flwr()
        if live.layout is None:
            live.layout = _layout(server, state["x"])
        by = {u.client: u for u in updates}
        if live.round < 0 or not live.pending:  # called without a selection
            t = int(state["flwr_round"])
            self.configure(state, t, sorted(by), _rng(t), live.layout)
        t, x = live.round, state["x"]
        why = {f.client: f.reason for f in ctx.failures}
        replies = []
        for c in sorted(live.pending):
            msg = live.pending[c]
            with _as_node(c + NODE_BASE):
                u = by.get(c)
                if u is None:  # messaged, delivered nothing: a Flower error
                    replies.append(
                        app.Message(_error(app, c, why.get(c)), reply_to=msg)
                    )
                    continue
                replies.append(
                    app.Message(_reply(app, u, x, live.layout), reply_to=msg)
                )
        strategy = live.strategy
        with _as_node(1):
            arrays, metrics = strategy.aggregate_train(t + 1, replies)
        new_x = x if arrays is None else _flat(arrays, live.layout, x)
        blob = self._export(strategy)
        live.token, live.round, live.pending = blob, -1, {}
        live.shared, live.own, live.x = {}, {}, new_x
        state = {"x": new_x, "flwr_state": blob, "flwr_round": _count(t + 1)}
        info = _meter([by[c] for c in sorted(by) if c in by])
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
        those nodes, with Python's and NumPy's generators seeded by the run's
        seed and the round, from a stream of its own (its
        ``fraction_evaluate`` samples among them); each node it messaged
        replies what Flower's quickstart ClientApp sends: a ``MetricRecord``
        of ``eval_loss``, ``eval_acc`` (left out for targets without classes)
        and ``num-examples`` (its held-out rows). The ``MetricRecord``
        ``aggregate_evaluate`` returns gives the columns: ``eval_loss`` and
        ``eval_acc`` as ``fed_loss`` and ``fed_accuracy`` (the names fedsim's
        own rule writes and the report draws), another key as ``fed_<key>``
        (named as :func:`plugin_metrics` names). None, or fewer evaluating
        clients than the strategy's ``min_available_nodes`` or
        ``min_evaluate_nodes`` (Flower would wait for nodes), gives no column.

        Both calls run on a copy of the strategy as this round's
        ``aggregate_train`` left it, so what they change in it is dropped:
        the checkpointed state, and so a resumed run, never depend on
        evaluation. A pure function of (results, round, the strategy's
        state).

        Args:
            results: the clients' evaluations, in ascending client id.
            round: the 0-based round (Flower's ``server_round`` is round + 1).

        Raises:
            FlowerError: ``configure_evaluate`` messaged a node that is not
                evaluating, or one node twice; the strategy cannot be
                copied; two keys of the record give one column.
        """
        app = flwr()
        live = getattr(self, "_live", None)
        try:  # outside a run (a contract check): a fresh strategy
            strategy = self.build() if live is None else copy.deepcopy(live.strategy)
        except Exception as exc:  # deepcopy raises what the attribute raises
            raise FlowerError(
                f"algorithm.strategy {self.strategy!r}: federated evaluation "
                f"runs on a copy of the strategy, and copying it raised {exc!r}"
            ) from None
        by = {r.client: r for r in results}
        if len(by) < _min_nodes(strategy, "min_evaluate_nodes"):
            return {}
        x = torch.zeros(0) if live is None or live.x is None else live.x
        layout = (live and live.layout) or _layout_of(None, x)
        arrays = _arrays(app, x, layout)
        grid = make_grid([c + NODE_BASE for c in sorted(by)])
        rng = _evaluation_rng(getattr(self, "_seed", 0), round)
        with _seeded(rng), _as_node(1):
            msgs = list(
                strategy.configure_evaluate(round + 1, arrays, app.ConfigRecord(), grid)
            )
        sent = _by_client(msgs, sorted(by), round, strategy, "configure_evaluate")
        replies = []
        for c in sorted(sent):
            with _as_node(c + NODE_BASE):
                content = _evaluation_reply(app, by[c])
                replies.append(app.Message(content, reply_to=sent[c]))
        with _as_node(1):
            metrics = strategy.aggregate_evaluate(round + 1, replies)
        return plugin_metrics(
            metrics, round, "aggregate_evaluate", "fed_", _FROM_QUICKSTART
        )

    def _export(self, strategy: Strategy) -> torch.Tensor:
        """The strategy's state as ``flwr_state`` (a fresh tensor: the token).

        Raises:
            CheckpointError: it cannot be stored exactly and checkpoints
                are on (without them an empty record stands in).
        """
        from fedsim.checkpoint import CheckpointError

        try:
            return encode_state(strategy, self.build())
        except NotCheckpointable as exc:
            if getattr(self, "_checkpoints", True):
                raise CheckpointError(_refusal(self.strategy, str(exc))) from None
            return torch.zeros(0, dtype=torch.uint8)

    def wrap_selector(
        self, selector: Selector, server: DriverServer
    ) -> StrategySampling:
        """The runtime's hook: the selector a run asks, which lets the
        strategy's ``configure_train`` choose (:class:`StrategySampling`)."""
        return StrategySampling(self, selector, server)

    # ---------------------------------------------------------- client half

    def local_setup(self, client: base.ClientContext) -> _Local | None:
        """The client's ``proximal-mu`` and ``lr`` (as its ratio to
        client.lr) for the round, shared or its own; None: neither."""
        mu = client.payload.get(_ENTRY["proximal-mu"])
        scale = client.payload.get(_ENTRY["lr"])
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
        which :func:`client_configs` requires when an ``lr`` differs)."""
        local = client.local
        if local is None:
            return
        if local.mu:
            # the same floats as fedsim's proximal solver: g + mu (x - x^t)
            grad.add_(local.mu * (theta - local.x))
        if local.scale != 1.0:  # the scenario's lr: the bits of a plain run
            grad.mul_(local.scale)


class DriverServer(Protocol):
    """What :class:`StrategySampling` reads of the driver's server."""

    @property
    def model(self) -> torch.nn.Module | None:
        """The global model (its named parameters are the strategy's layout)."""

    @property
    def state(self) -> base.ServerState:
        """The server state (``x``, ``flwr_state``, ``flwr_round``)."""


class StrategySampling:
    """The scenario's selector with the strategy's ``configure_train`` on
    top: it sees a grid of every online device (``sample_by: strategy``) or
    of the selector's picks (``selector``), and its messages are the
    selection. Everything else is the selector's.

    Args:
        alg: the Flower algorithm.
        inner: the scenario's selector.
        server: the driver's ``Server`` (its state and model, read only).
    """

    def __init__(self, alg: Flower, inner: Selector, server: DriverServer) -> None:
        self.alg, self.inner, self.server = alg, inner, server

    def __getattr__(self, name: str) -> object:
        # everything but the selection is the inner selector's (its context,
        # artifact, state hooks), whatever its type is
        return getattr(self.inner, name)

    def with_slots(self, k: int) -> StrategySampling:
        return StrategySampling(self.alg, self.inner.with_slots(k), self.server)

    def select(self, state: SelectorState, draw: Draw) -> tuple[Ints, SelectorState]:
        """The inner selector's picks (``sample_by: selector``) or every
        candidate, then the strategy's ``configure_train`` over them.

        Raises:
            PluginFailure: ``configure_train`` raised, or its messages
                cannot be carried out (:meth:`Flower.configure`), named as
                the algorithm's strategy, not as the selector the run
                wraps.
        """
        nodes = draw.candidates
        if self.alg.sample_by == "selector":
            nodes, state = self.inner.select(state, draw)
        layout = _layout_of(self.server.model, self.server.state["x"])
        chosen = hooks.call(
            f"{hooks.algorithm_label(self.alg.name)} (strategy {self.alg.strategy!r})",
            "configure_train",
            self.alg.configure,
            self.server.state,
            draw.round,
            [int(i) for i in nodes],
            draw.rng,
            layout,
        )
        return np.asarray(chosen, dtype=np.int64), state


@dataclass(frozen=True)
class _Local:
    """A client's round constants (``client.local``): FedProx's ``mu``
    (0: none) with the model ``x`` it pulls towards, and ``scale``, its
    ``lr`` over the scenario's client.lr (1: the scenario's)."""

    mu: float
    x: torch.Tensor
    scale: float


_MISSING = object()  # a key a client's message does not carry
# what a client whose message lacks an honoured key trains with
_NEUTRAL = {"lr": 1.0, "proximal-mu": 0.0}
# solvers whose step is lr times a linear function of the gradients only:
# scaling every gradient by r is then a learning rate of r lr, exactly
_LR_SOLVERS = ("sgd", "momentum", "decay")


def client_configs(
    messages: Mapping[int, Message], t: int, client: ClientSpec | None
) -> tuple[dict[str, float], dict[int, dict[str, float]]]:
    """The round's ``ConfigRecord`` values as payload entries: those every
    messaged client got alike (the shared payload), and each client's own
    (its instructions, :meth:`Flower.instruct`).

    Honoured (:data:`UNDERSTOOD`): ``lr``, a positive number, which becomes
    ``flwr.lr_scale`` = lr / client.lr (the scenario's lr schedule still
    multiplies it, as it does client.lr), and ``proximal-mu``, a number >=
    0 (``flwr.proximal_mu``). A client whose message lacks one trains with
    the scenario's lr and no proximal term; a value equal to those adds no
    entry, so such a client trains with the bits of a run without it.
    Any other key is ignored when every message carries the same value
    (Flower's ``server-round``; ``local-epochs``: the clock decides the
    steps) and refused when the values differ (a per-client setting the
    local training would silently not apply).

    Args:
        messages: the round's messages by client id, ascending.
        t: the 0-based round (for messages).
        client: the scenario's ``client`` section (None: not known, as in
            a test that never loaded a scenario; an ``lr`` other than 1x
            is then refused).

    Returns:
        (shared entries, {client: its own entries}), clients without
        entries of their own left out.

    Raises:
        FlowerError: naming the round, the key, the node and the value:
            an honoured key that is not such a number, an ``lr`` that
            differs from client.lr with a solver where a gradient scale is
            not a learning rate, or an ignored key whose values differ.
    """
    configs = {c: _config_of(m, t, c) for c, m in messages.items()}
    shared: dict[str, float] = {}
    own: dict[int, dict[str, float]] = {c: {} for c in configs}
    for key in sorted({k for cfg in configs.values() for k in cfg}):
        values = {c: cfg.get(key, _MISSING) for c, cfg in configs.items()}
        if key not in UNDERSTOOD:
            _alike_or_refuse(key, values, t)
            continue
        nums = {c: _honoured(key, v, t, c, client) for c, v in values.items()}
        if len(set(nums.values())) == 1:
            (v, *_) = nums.values()
            if v != _NEUTRAL[key]:
                shared[_ENTRY[key]] = v
            continue
        for c, v in nums.items():
            if v != _NEUTRAL[key]:  # the scenario's own: no entry, same bits
                own[c][_ENTRY[key]] = v
    return shared, {c: e for c, e in own.items() if e}


def _config_of(m: Message, t: int, c: int) -> dict[str, object]:
    """The values of all the ConfigRecords of a message, merged.

    Raises:
        FlowerError: two of its records give one key different values.
    """
    out: dict[str, object] = {}
    for rec in m.content.config_records.values():
        for k, v in rec.items():
            if k in out and not _same(out[k], v):
                raise FlowerError(
                    f"round {t}: the message to node {c + NODE_BASE} carries "
                    f"config {k!r} twice, as {out[k]!r} and {v!r}"
                )
            out[k] = v
    return out


def _same(a: object, b: object) -> bool:
    """Equal values of one type (1, 1.0 and True are three values)."""
    return type(a) is type(b) and bool(a == b)


def _alike_or_refuse(key: str, values: Mapping[int, object], t: int) -> None:
    """An ignored key must carry one value for every client.

    Raises:
        FlowerError: two clients got different values (or one none).
    """
    (c0, v0), *rest = values.items()
    for c, v in rest:
        if not _same(v, v0):
            shown = ["(none)" if x is _MISSING else repr(x) for x in (v0, v)]
            raise FlowerError(
                f"round {t}: the strategy's config {key!r} differs between "
                f"node {c0 + NODE_BASE} ({shown[0]}) and node {c + NODE_BASE} "
                f"({shown[1]}); fedsim's local training honours per client "
                f"only {', '.join(map(repr, UNDERSTOOD))} (docs/flower.md, "
                "'Per-client configuration'), so it would not apply this one"
            )


def _honoured(key: str, v: object, t: int, c: int, client: ClientSpec | None) -> float:
    """Client ``c``'s value of an honoured key, as its payload entry's
    value (``lr``: its ratio to client.lr).

    Raises:
        FlowerError: not a finite number in range, or an ``lr`` the
            scenario's solver cannot apply (:func:`client_configs`).
    """
    if v is _MISSING:
        return _NEUTRAL[key]
    where = f"round {t}: the strategy's config {key!r} for node {c + NODE_BASE}"
    low = "a number > 0" if key == "lr" else "a number >= 0"
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise FlowerError(f"{where} is {v!r}, expected {low}")
    x = float(v)
    if not math.isfinite(x) or x < 0 or (key == "lr" and x == 0):
        raise FlowerError(f"{where} is {v!r}, expected {low}")
    if key != "lr":
        return x
    if client is None:
        if x == 1.0:
            return 1.0
        raise FlowerError(
            f"{where} is {v!r}, but the scenario's client.lr is not known here "
            "(a Flower algorithm outside a loaded scenario)"
        )
    scale = x / client.lr
    blocked = _lr_blocked(client)
    if scale != 1.0 and blocked:
        raise FlowerError(
            f"{where} is {v!r}: fedsim applies a client's own lr by scaling "
            f"its gradients (by lr / client.lr), which is that learning rate "
            f"only for client.solver sgd, momentum or decay without weight "
            f"decay or clipping; here {blocked} (send no 'lr', or the "
            f"scenario's client.lr {client.lr!r})"
        )
    return scale


def _lr_blocked(client: ClientSpec) -> str:
    """Why a gradient scale is not a learning rate under ``client``
    ("": it is)."""
    if client.solver not in _LR_SOLVERS:
        return f"client.solver is {client.solver!r}"
    if client.weight_decay:
        return f"client.weight_decay is {client.weight_decay!r}"
    if client.clip_norm is not None:
        return f"client.clip_norm is {client.clip_norm!r}"
    return ""


def plugin_metrics(
    metrics: MetricRecord | None,
    t: int,
    hook: str = "aggregate_train",
    prefix: str = "alg_",
    renamed: Mapping[str, str] | None = None,
) -> dict[str, float]:
    """The strategy's aggregated ``MetricRecord`` (from ``aggregate_train``:
    plug-in metrics, rounds.parquet columns ``alg_<name>``; from
    ``aggregate_evaluate``: ``fed_<name>``) as named scalars: a key's
    characters other than letters, digits and ``_`` become ``_``
    (``num-examples``: ``alg_num_examples``), a leading digit gets ``m_``,
    and a list value gives one column per element (``<name>_0``, ...).

    Args:
        metrics: the record (None: no columns).
        t: the 0-based round, for messages.
        hook: the strategy method that returned it, for messages.
        prefix: the columns' prefix, for messages (the runtime adds it).
        renamed: keys given another name first (``eval_acc``: ``accuracy``).

    Raises:
        FlowerError: two keys give one column name.
    """
    if metrics is None:
        return {}
    out: dict[str, float] = {}
    seen: dict[str, str] = {}
    for key, value in metrics.items():
        for name, x in _entries((renamed or {}).get(key, key), value):
            col = _column(name)
            if col in seen:
                raise FlowerError(
                    f"round {t}: {hook}'s MetricRecord has {seen[col]!r} "
                    f"and {name!r}, which both become the column {prefix}{col}"
                )
            seen[col] = name
            out[col] = float(x)
    return out


def _entries(key: str, value: float | Sequence[float]) -> list[tuple[str, float]]:
    """A MetricRecord's item as (name, value) pairs: itself, or for a list
    value one pair per element (``<key>_0``, ``<key>_1``, ...)."""
    if isinstance(value, Sequence):
        return [(f"{key}_{i}", x) for i, x in enumerate(value)]
    return [(key, value)]


def _column(name: str) -> str:
    """A metric's name as a column name: characters other than letters,
    digits and ``_`` become ``_``, and a name that is empty or starts with a
    digit gets ``m_`` in front (``num-examples``: ``num_examples``)."""
    col = re.sub(r"[^0-9A-Za-z_]", "_", name)
    return "m_" + col if not col or col[0].isdigit() else col


def _error(app: ModuleType, c: int, reason: str | None) -> Error:
    """The Flower error a messaged device that delivered nothing replies:
    its code from :data:`ERROR_CODE`, its reason text starting with
    clients.parquet's ``drop_reason`` (``"late: device 3 sent ..."``), as
    ``RoundContext.failures`` gives it."""
    if reason is None:  # not among the failures: nothing is known of why
        return app.Error(code=0, reason=f"device {c} delivered no update")
    why = _WHY.get(reason, "delivered no update")
    return app.Error(
        code=ERROR_CODE.get(reason, 0), reason=f"{reason}: device {c} {why}"
    )


def _own_evaluation(cls: type[Strategy]) -> list[str]:
    """The federated-evaluation methods ``cls`` defines outside Flower's
    own package (a user's ``configure_evaluate``/``aggregate_evaluate``)."""
    out = []
    for name in ("configure_evaluate", "aggregate_evaluate"):
        owner = next(k for k in cls.__mro__ if name in vars(k))
        if not owner.__module__.startswith("flwr."):
            out.append(name)
    return out


def _refusal(path: str, why: str) -> str:
    return (
        f"algorithm.strategy {path!r}: {why}, which fedsim cannot checkpoint "
        "exactly (it stores numbers, text, bytes, NumPy arrays, Flower records "
        "and lists, tuples and str-keyed dicts of them); set "
        "checkpoint.every_rounds: 0 to run it without checkpoints"
    )


def _canon(options: Mapping[str, object]) -> str:
    return json.dumps(options, sort_keys=True, default=repr)


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


# aggregate_evaluate's keys that name fedsim's own federated columns: the
# record of Flower's quickstart ClientApp (eval_loss, eval_acc) becomes
# fed_loss and fed_accuracy, as fedsim's own rule writes them
_FROM_QUICKSTART = {"eval_loss": "loss", "eval_acc": "accuracy"}


def _min_nodes(strategy: Strategy, phase: str) -> int:
    """The nodes ``strategy`` waits for before it samples for ``phase``
    (``min_train_nodes`` or ``min_evaluate_nodes``), with its
    ``min_available_nodes``; at least 1."""
    keys = (_MIN_NODES[0], phase)
    return max([1, *(int(getattr(strategy, k, 1) or 1) for k in keys)])


def _by_client(
    msgs: Sequence[Message],
    nodes: Sequence[int],
    t: int,
    strategy: Strategy,
    hook: str,
) -> dict[int, Message]:
    """``hook``'s messages by client id (node - :data:`NODE_BASE`).

    Raises:
        FlowerError: a message to a node not among ``nodes`` (client ids),
            or a second message to one node.
    """
    allowed = {int(i) for i in nodes}
    out: dict[int, Message] = {}
    for m in msgs:
        c = int(m.metadata.dst_node_id) - NODE_BASE
        if c not in allowed or c in out:
            sent, why = (
                ("a second message", "twice")
                if c in out
                else ("a message", "not in the grid")
            )
            raise FlowerError(
                f"round {t}: {type(strategy).__name__}.{hook} sent {sent} to "
                f"node {m.metadata.dst_node_id}, {why}"
            )
        out[c] = m
    return out


def _evaluation_reply(app: ModuleType, r: base.ClientEvaluation) -> RecordDict:
    """A client's evaluation reply, as Flower's quickstart ClientApp sends it:
    ``eval_loss``, ``eval_acc`` (left out when NaN: targets without classes)
    and ``num-examples``."""
    values: dict[str, float | int] = {
        "eval_loss": float(r.loss),
        "num-examples": int(r.n_samples),
    }
    if r.accuracy == r.accuracy:  # not NaN
        values["eval_acc"] = float(r.accuracy)
    return app.RecordDict({"metrics": app.MetricRecord(values)})


def _layout(server: base.ServerContext | None, x: torch.Tensor) -> Layout:
    """The model's named parameters (name, shape), in the flat vector's
    order; one array ``x`` when there is no model (unit tests)."""
    return _layout_of(None if server is None else server.model, x)


def _layout_of(model: torch.nn.Module | None, x: torch.Tensor) -> Layout:
    if model is None:
        return [("x", tuple(x.shape))]
    return [(n, tuple(p.shape)) for n, p in model.named_parameters()]


def _arrays(app: ModuleType, x: torch.Tensor, layout: Layout) -> ArrayRecord:
    """Flat ``x`` as an ``ArrayRecord`` of the model's named parameters."""
    out, at = {}, 0
    flat = x.detach().cpu().numpy()
    for name, shape in layout:
        n = int(np.prod(shape))
        out[name] = app.Array(flat[at : at + n].reshape(shape).copy())
        at += n
    return app.ArrayRecord(out)


def _flat(arrays: ArrayRecord, layout: Layout, like: torch.Tensor) -> torch.Tensor:
    """An ``ArrayRecord`` back into a flat vector of ``like``'s dtype."""
    parts = [np.asarray(arrays[name].numpy()).reshape(-1) for name, _ in layout]
    return torch.from_numpy(np.concatenate(parts)).to(like.dtype).clone()


def _reply(
    app: ModuleType, u: base.ClientUpdate, x: torch.Tensor, layout: Layout
) -> RecordDict:
    """A client's reply content, as a Flower ClientApp sends it."""
    n = int(u.weight) if float(u.weight).is_integer() else float(u.weight)
    metrics = app.MetricRecord(
        {"num-examples": n, "train_loss": float(u.train_loss), "tau": int(u.tau)}
    )
    arrays = _arrays(app, x + u.delta, layout)
    return app.RecordDict({"arrays": arrays, "metrics": metrics})


def _meter(updates: Sequence[base.ClientUpdate]) -> base.AggregateInfo:
    """The meter's figures: the data weights the strategy was given (its
    actual influence per update is the strategy's own: a robust rule's is
    not measured), tau_eff their weighted mean of tau."""
    if not updates:
        return base.empty_info()
    p = base.data_weights(updates)
    tau_eff = float(sum(w * u.tau for w, u in zip(p, updates, strict=True)))
    return base.meter(updates, p, tau_eff)
