"""What the Flower adapter (:mod:`fedsim.algorithms.flower`) exchanges with a
strategy: Flower's records and messages built from fedsim's updates and
evaluations, the strategy's configs read back as payload entries, its
metrics as columns, and its state as one exact record.

Nothing here runs a strategy: these are pure functions of their arguments
(Flower imported on first use), so each is tested by hand.
"""

from __future__ import annotations

import importlib
import json
import logging
import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from fedsim.errors import LoadError
from fedsim.lazy import torch

if TYPE_CHECKING:
    from flwr.app import ArrayRecord, Error, Message, MetricRecord, RecordDict
    from flwr.serverapp.strategy import Strategy

    from fedsim.algorithms.base import ClientEvaluation, ClientUpdate
    from fedsim.spec import ClientSpec

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
ENTRY = {"lr": "flwr.lr_scale", "proximal-mu": "flwr.proximal_mu"}
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


class FlowerError(LoadError, ValueError):
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
        _place(key, nums, shared, own)
    return shared, {c: e for c, e in own.items() if e}


def _place(
    key: str,
    nums: Mapping[int, float],
    shared: dict[str, float],
    own: dict[int, dict[str, float]],
) -> None:
    """An honoured key's values as entries: one shared entry when every
    client got the same value, else each client's own; a client given the
    scenario's own value (``_NEUTRAL``) gets no entry, so it trains with
    the bits of a run without the key."""
    if len(set(nums.values())) == 1:
        (v, *_) = nums.values()
        if v != _NEUTRAL[key]:
            shared[ENTRY[key]] = v
        return
    for c, v in nums.items():
        if v != _NEUTRAL[key]:
            own[c][ENTRY[key]] = v


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


def error_reply(app: ModuleType, c: int, reason: str | None) -> Error:
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


def refusal(path: str, why: str) -> str:
    return (
        f"algorithm.strategy {path!r}: {why}, which fedsim cannot checkpoint "
        "exactly (it stores numbers, text, bytes, NumPy arrays, Flower records "
        "and lists, tuples and str-keyed dicts of them); set "
        "checkpoint.every_rounds: 0 to run it without checkpoints"
    )


# aggregate_evaluate's keys that name fedsim's own federated columns: the
# record of Flower's quickstart ClientApp (eval_loss, eval_acc) becomes
# fed_loss and fed_accuracy, as fedsim's own rule writes them
FROM_QUICKSTART = {"eval_loss": "loss", "eval_acc": "accuracy"}


def by_client(
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


def evaluation_reply(app: ModuleType, r: ClientEvaluation) -> RecordDict:
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


def layout_of(model: torch.nn.Module | None, x: torch.Tensor) -> Layout:
    if model is None:
        return [("x", tuple(x.shape))]
    return [(n, tuple(p.shape)) for n, p in model.named_parameters()]


def to_arrays(app: ModuleType, x: torch.Tensor, layout: Layout) -> ArrayRecord:
    """Flat ``x`` as an ``ArrayRecord`` of the model's named parameters."""
    out, at = {}, 0
    flat = x.detach().cpu().numpy()
    for name, shape in layout:
        n = int(np.prod(shape))
        out[name] = app.Array(flat[at : at + n].reshape(shape).copy())
        at += n
    return app.ArrayRecord(out)


def from_arrays(
    arrays: ArrayRecord, layout: Layout, like: torch.Tensor
) -> torch.Tensor:
    """An ``ArrayRecord`` back into a flat vector of ``like``'s dtype."""
    parts = [np.asarray(arrays[name].numpy()).reshape(-1) for name, _ in layout]
    return torch.from_numpy(np.concatenate(parts)).to(like.dtype).clone()


def train_reply(
    app: ModuleType, u: ClientUpdate, x: torch.Tensor, layout: Layout
) -> RecordDict:
    """A client's reply content, as a Flower ClientApp sends it."""
    n = int(u.weight) if float(u.weight).is_integer() else float(u.weight)
    metrics = app.MetricRecord(
        {"num-examples": n, "train_loss": float(u.train_loss), "tau": int(u.tau)}
    )
    arrays = to_arrays(app, x + u.delta, layout)
    return app.RecordDict({"arrays": arrays, "metrics": metrics})


# ------------------------------------------------------------ exact state codec
class NotCheckpointable(LoadError, TypeError):
    """A strategy attribute whose value the codec cannot store exactly."""


_Enc = Callable[["_Codec", object, str], object]
_Dec = Callable[["_Codec", object], object]


def _array(c: _Codec, v: object, where: str) -> object:
    """A NumPy array or scalar (or Flower's ``Array``) as its bytes (a blob),
    dtype and shape."""
    a = np.asarray(v.numpy() if isinstance(v, flwr().Array) else v)
    if a.dtype.kind not in "biufc":
        raise NotCheckpointable(f"{where} holds an array of dtype {a.dtype}")
    c.blobs.append(np.ascontiguousarray(a).tobytes())
    return [len(c.blobs) - 1, a.dtype.str, list(a.shape)]


def _unarray(c: _Codec, j: object) -> np.ndarray:
    """Inverse of :func:`_array` (a fresh, writable array)."""
    i, dtype, shape = cast(list[Any], j)  # type: ignore[explicit-any]
    return np.frombuffer(c.blobs[i], dtype=np.dtype(dtype)).reshape(shape).copy()


def _items(c: _Codec, v: object, where: str) -> object:
    """A mapping with text keys, item by item."""
    items = cast(Mapping[object, object], v).items()
    if not all(isinstance(k, str) for k, _ in items):
        raise NotCheckpointable(f"{where} holds a dict with keys other than text")
    return {k: c.enc(x, f"{where}[{k!r}]") for k, x in items}


def _seq(c: _Codec, v: object, where: str) -> object:
    """A list or tuple, item by item."""
    return [c.enc(x, f"{where}[{i}]") for i, x in enumerate(cast(list[object], v))]


def _table(app: ModuleType) -> dict[str, tuple[type, _Enc, _Dec]]:
    """The codec's table: by the tag a kind is stored under, its type, its
    encoder (to JSON, arrays' bytes as blobs) and its decoder. The first row
    whose type takes a value encodes it (None, booleans, ints and text are
    JSON themselves), so NumPy's float64 stays one. Flower's records have no
    serialisation for the nested values a strategy keeps (tuples, dicts of
    arrays), so they are rows here too."""

    def values(c: _Codec, j: object) -> dict[str, object]:
        return {k: c.dec(x) for k, x in cast(dict[str, object], j).items()}

    def items(c: _Codec, j: object) -> list[object]:
        return [c.dec(x) for x in cast(list[object], j)]

    def record(kind: type) -> tuple[type, _Enc, _Dec]:
        # a Flower record: its str-keyed values, rebuilt as that record type
        return kind, _items, lambda c, j: kind(values(c, j))

    return {
        "scalar": (np.generic, _array, lambda c, j: _unarray(c, j)[()]),
        "float": (float, lambda c, v, w: repr(v), lambda c, j: float(str(j))),
        "bytes": (bytes, _bytes_enc, lambda c, j: _unarray(c, j).tobytes()),
        "array": (np.ndarray, _array, _unarray),
        "Array": (app.Array, _array, lambda c, j: app.Array(_unarray(c, j))),
        "ArrayRecord": record(app.ArrayRecord),
        "ConfigRecord": record(app.ConfigRecord),
        "MetricRecord": record(app.MetricRecord),
        "list": (list, _seq, items),
        "tuple": (tuple, _seq, lambda c, j: tuple(items(c, j))),
        "dict": (dict, _items, values),
    }


def _bytes_enc(c: _Codec, v: object, where: str) -> object:
    """Bytes as an array of uint8 (decoded with ``tobytes``)."""
    return _array(c, np.frombuffer(cast(bytes, v), dtype=np.uint8), where)


class _Codec:
    """Values as JSON with their arrays' bytes aside (``blobs``), exactly:
    each value is ``{tag: body}`` by the first row of :func:`_table` whose
    type takes it."""

    def __init__(self, blobs: list[bytes] | None = None) -> None:
        self.blobs = [] if blobs is None else blobs
        self.table = _table(flwr())

    def enc(self, v: object, where: str) -> object:
        """``v`` as JSON; ``where`` names it in the refusal.

        Raises:
            NotCheckpointable: no row takes ``v`` (or a value inside it).
        """
        if v is None or isinstance(v, (bool, int, str)):
            return v
        for tag, (kind, enc, _) in self.table.items():
            if isinstance(v, kind):
                return {tag: enc(self, v, where)}
        raise NotCheckpointable(
            f"{where} holds a {type(v).__module__}.{type(v).__name__}"
        )

    def dec(self, j: object) -> object:
        """Inverse of :meth:`enc`."""
        if not isinstance(j, dict):
            return j
        ((tag, body),) = j.items()
        return self.table[tag][2](self, body)


def encode_state(attrs: Mapping[str, object], owner: str) -> torch.Tensor:
    """``attrs`` (a strategy's attributes) as a uint8 tensor: a JSON header,
    a NUL, then the arrays' bytes.

    Raises:
        NotCheckpointable: an attribute of a type the codec cannot store.
    """
    codec = _Codec()
    head = {
        "attrs": {k: codec.enc(v, f"{owner}.{k}") for k, v in attrs.items()},
        "sizes": [len(b) for b in codec.blobs],
    }
    raw = json.dumps(head, sort_keys=True).encode() + b"\0" + b"".join(codec.blobs)
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8).clone()


def decode_state(blob: torch.Tensor) -> dict[str, object]:
    """Inverse of :func:`encode_state` (an empty dict for an empty blob)."""
    raw = bytes(blob.numpy().tobytes())
    if not raw:
        return {}
    cut = raw.index(b"\0")
    head = json.loads(raw[:cut])
    blobs, at = [], cut + 1
    for n in head["sizes"]:
        blobs.append(raw[at : at + n])
        at += n
    codec = _Codec(blobs)
    return {k: codec.dec(j) for k, j in head["attrs"].items()}
