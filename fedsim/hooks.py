"""Calling plug-in code during a run: what it may raise, and what its
hooks must return: plug-in code is user code, and its answers are input.

Every hook a run calls on an algorithm or a selector goes through
:func:`call` (or, for the client hooks on a worker, the same wrapping), so
an exception in plug-in code reaches the runtime as one
:class:`PluginFailure` naming the plug-in, the hook and the exception, with
the full traceback as text (it crosses Ray's process boundary intact).
What a hook returns is checked here once per call, cheaply: a wrong
return value is a :class:`PluginFailure` too, whose message says what was
expected. The runtime ends such a run with ``status: failed`` in
summary.json, the rows already written kept, and the traceback in the run
folder's ``failure.txt`` (docs/extending.md, "Hooks").

Nothing here imports torch at module level: :func:`check_step` reads the
state's tensors through duck typing (``shape``, ``dtype``), and only when a
run is under way.
"""

from __future__ import annotations

import json
import numbers
import traceback
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, ParamSpec, TypeVar

import numpy as np

from fedsim.errors import RunError

_P = ParamSpec("_P")
_R = TypeVar("_R")

# How torch's and numpy's allocators word a refused allocation: such an
# error is the machine's, not the plug-in's (the CLI reports it as memory).
_NO_MEMORY = ("can't allocate memory", "not enough memory", "out of memory")


class PluginFailure(RunError, RuntimeError):
    """Plug-in code failed during a run: it raised, or one of its hooks
    returned something other than its contract promises.

    Attributes:
        plugin: who failed, as the scenario names it (e.g. ``"algorithm
            'mylab.algos:FedFoo'"``).
        hook: the hook that was running (``"aggregate"``, ``"select"``,
            ``"grad_hook"``, ...).
        error: the exception as ``"Type: message"``, or what the hook
            returned against what was expected.
        trace: the full traceback (the plug-in's own frames included); ""
            for a wrong return value, which has no exception.
    """

    # 3, not 1: a script tells a broken plug-in from a run that failed
    exit_code: ClassVar[int] = 3

    def __init__(self, plugin: str, hook: str, error: str, trace: str = "") -> None:
        super().__init__(f"{plugin} failed in {hook}: {error}")
        self.plugin, self.hook, self.error, self.trace = plugin, hook, error, trace

    def __reduce__(self) -> tuple[object, tuple[str, str, str, str]]:
        # rebuilt from its fields on the other side of a Ray call
        return (type(self), (self.plugin, self.hook, self.error, self.trace))

    def record(self) -> dict[str, str]:
        """summary.json's ``failure`` (without the traceback, which is a file)."""
        return {"plugin": self.plugin, "hook": self.hook, "error": self.error}


def is_memory_error(exc: BaseException) -> bool:
    """Whether ``exc`` is an allocation the system refused (never the
    plug-in's fault; the command line reports it as memory, exit 1).

    Python's refused allocation is a bare ``MemoryError()``, NumPy's and
    Arrow's are subclasses of it, torch's a RuntimeError in its allocator's
    words; a plain MemoryError with a message of its own is a plug-in's
    (``raise MemoryError("cache full")``), a failure of its code like any
    other.
    """
    if isinstance(exc, MemoryError):
        return type(exc) is not MemoryError or not exc.args
    return isinstance(exc, RuntimeError) and any(
        m in str(exc).lower() for m in _NO_MEMORY
    )


def failure(plugin: str, hook: str, exc: BaseException) -> PluginFailure:
    """The :class:`PluginFailure` of ``exc``, raised by ``plugin``'s ``hook``
    (call it inside the ``except`` block: the traceback is the current one).

    Args:
        plugin: as :attr:`PluginFailure.plugin`.
        hook: as :attr:`PluginFailure.hook`.
        exc: the exception the hook raised.
    """
    if isinstance(exc, PluginFailure):
        return exc
    if isinstance(exc, SystemExit):
        error = f"SystemExit({exc.code!r}): plug-in code called sys.exit"
    else:
        error = f"{type(exc).__name__}: {exc}"
    return PluginFailure(plugin, hook, error, traceback.format_exc())


def wraps_error(exc: BaseException) -> bool:
    """Whether :func:`call` turns ``exc`` into a :class:`PluginFailure`:
    every ``Exception`` except a refused allocation and one already wrapped,
    and ``SystemExit`` (plug-in code that calls ``sys.exit`` fails its run,
    exit 3 with failure.txt, rather than ending the process without a
    summary); KeyboardInterrupt passes through: it is a signal."""
    if isinstance(exc, SystemExit):
        return True
    return not is_memory_error(exc) and not isinstance(exc, PluginFailure)


def call(
    plugin: str, hook: str, fn: Callable[_P, _R], *args: _P.args, **kw: _P.kwargs
) -> _R:
    """``fn(*args, **kw)``, an exception from it raised as a
    :class:`PluginFailure` naming ``plugin`` and ``hook``.

    Args:
        plugin: who ``fn`` belongs to (``"selector 'oort'"``).
        hook: its name (``"select"``).
        fn: the hook.
        *args: its arguments.
        **kw: its keyword arguments.

    Returns:
        What ``fn`` returned.

    Raises:
        PluginFailure: ``fn`` raised or called ``sys.exit`` (refused
            allocations and signals pass as they are).

    >>> try:
    ...     call("selector 'x'", "select", int, "seven")
    ... except PluginFailure as exc:
    ...     print(exc.plugin, "|", exc.hook, "|", exc.error.split(":")[0])
    selector 'x' | select | ValueError
    """
    try:
        return fn(*args, **kw)
    except (Exception, SystemExit) as exc:
        if not wraps_error(exc):
            raise
        raise failure(plugin, hook, exc) from exc


def algorithm_label(name: str) -> str:
    """How messages name the run's algorithm: ``algorithm 'fedavg'``."""
    return f"algorithm {name!r}"


def selector_label(name: str) -> str:
    """How messages name the run's selector: ``selector 'uniform'``."""
    return f"selector {name!r}"


def _kind(value: object) -> str:
    """A value's type for a message (``list``, ``Tensor``)."""
    return type(value).__name__


def check_step(
    plugin: str, hook: str, result: object, before: Mapping[str, Any]
) -> tuple[dict[str, Any], Any]:
    """Check what an algorithm's ``aggregate`` returned, once per step.

    The contract (``Algorithm.aggregate``): a pair (state, AggregateInfo);
    the state has the keys of the state before the step, and every tensor
    in it stays a tensor of its dtype, ``x`` (the model: the wrong size
    would corrupt every later round, a checkpoint and the evaluation) and
    every tensor of the model's shape keeping that shape;
    ``info.metrics`` holds named scalars; every value is one a checkpoint
    keeps exactly (fedsim.checkpoint.state_value_problem).

    Args:
        plugin: the algorithm, as messages name it.
        hook: ``"aggregate"`` (or the older form the server called).
        result: what the hook returned.
        before: the state it was given.

    Returns:
        (state, info), with ``info.metrics`` as plain floats.

    Raises:
        PluginFailure: naming the first broken promise and what was expected.
    """
    from fedsim.algorithms.base import AggregateInfo  # (imports torch)

    def wrong(what: str) -> PluginFailure:
        return PluginFailure(plugin, hook, what)

    if not isinstance(result, tuple | list) or len(result) != 2:
        raise wrong(
            f"returned a {_kind(result)}, expected a pair (state, AggregateInfo)"
        )
    state, info = result
    if not isinstance(state, dict):
        raise wrong(f"returned a state of type {_kind(state)}, expected a dict")
    if not isinstance(info, AggregateInfo):
        raise wrong(
            f"returned {_kind(info)} beside the state, expected an AggregateInfo "
            "(fedsim.api.meter builds one)"
        )
    if set(state) != set(before):
        gone, new = sorted(set(before) - set(state)), sorted(set(state) - set(before))
        raise wrong(
            f"returned a state with keys {sorted(state)}, expected those of the "
            f"state it was given {sorted(before)} (missing {gone}, new {new})"
        )
    _check_tensors(plugin, hook, state, before)
    _check_keepable(plugin, hook, state)
    metrics = check_metrics(plugin, hook, info.metrics)
    if metrics is not info.metrics:
        from dataclasses import replace

        info = replace(info, metrics=metrics)
    return state, info


def _check_tensors(
    plugin: str, hook: str, state: Mapping[str, Any], before: Mapping[str, Any]
) -> None:
    """Refuse a state whose tensors changed type or dtype, or whose model
    (``x``) or model-shaped tensors changed shape, from the state before
    the step (``state`` has ``before``'s keys).

    Args:
        plugin: the algorithm, as messages name it.
        hook: the hook that returned ``state``.
        state: the state the step returned.
        before: the state it was given.

    Raises:
        PluginFailure: naming the key, what came back and what was expected.
    """
    model = tuple(getattr(before.get("x"), "shape", ()))
    for key, old in before.items():
        shape, dtype = getattr(old, "shape", None), getattr(old, "dtype", None)
        if shape is None or dtype is None or isinstance(old, np.ndarray):
            continue  # not a tensor: its own type is the plug-in's affair
        value = state[key]
        if _kind(value) != _kind(old) or not hasattr(value, "shape"):
            raise PluginFailure(
                plugin,
                hook,
                f"returned state[{key!r}] as a {_kind(value)}, expected a "
                f"{_kind(old)} of shape {tuple(shape)} and dtype {dtype}",
            )
        # the model, and every tensor shaped as the model (moments, control
        # variates), keep their shape; another tensor may change its size
        # (a serialised strategy's bytes: the flower algorithm)
        sized = key == "x" or tuple(shape) == model
        if (sized and tuple(value.shape) != tuple(shape)) or value.dtype != dtype:
            raise PluginFailure(
                plugin,
                hook,
                f"returned state[{key!r}] of shape {tuple(value.shape)} and dtype "
                f"{value.dtype}, expected shape {tuple(shape)} and dtype {dtype} "
                "(as the state it was given)",
            )


def _check_keepable(plugin: str, hook: str, state: Mapping[str, Any]) -> None:
    """Refuse a state value a checkpoint cannot keep at the step that made
    it, naming the key (not at the first checkpoint, rounds later, in an
    empty checkpoint folder).

    Raises:
        PluginFailure: naming the plug-in, the hook, the key and its type.
    """
    from fedsim.checkpoint import state_value_problem

    for key, value in state.items():
        if (problem := state_value_problem(key, value)) is not None:
            raise PluginFailure(plugin, hook, f"returned a state whose {problem}")


def check_metrics(plugin: str, hook: str, metrics: object) -> dict[str, float]:
    """Named scalars a hook reports (``AggregateInfo.metrics``,
    ``Selector.metrics``), as floats.

    Args:
        plugin: who reported them, as messages name it.
        hook: the hook.
        metrics: what it reported.

    Returns:
        ``{name: float}`` (the same dict when it already was one).

    Raises:
        PluginFailure: not a dict of identifier-like names to real numbers
            (an int, a float, a NumPy scalar or a one-element tensor).

    >>> check_metrics("algorithm 'a'", "aggregate", {"eta": 2})
    {'eta': 2.0}
    """
    if not isinstance(metrics, Mapping):
        raise PluginFailure(
            plugin, hook, f"reported metrics as a {_kind(metrics)}, expected a dict"
        )
    out: dict[str, float] = {}
    for name, value in metrics.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise PluginFailure(
                plugin,
                hook,
                f"reported a metric named {name!r}, expected a name of letters, "
                "digits and _ (it becomes a column of rounds.parquet)",
            )
        if isinstance(value, bool) or not _scalar(value):
            raise PluginFailure(
                plugin,
                hook,
                f"reported metric {name!r} as a {_kind(value)}, expected a real "
                "number (int, float, or a one-element tensor)",
            )
        out[name] = real(plugin, hook, f"metric {name!r}", value)
    if all(type(v) is float for v in metrics.values()):
        return metrics  # type: ignore[return-value]
    return out


def real(plugin: str, hook: str, what: str, value: object) -> float:
    """``float(value)`` of a number a hook gave, refused as a failure of the
    hook when a float cannot hold it (an int of 10**400 overflows).

    Args:
        plugin: who gave it, as messages name it.
        hook: the hook.
        what: the value, as the message names it ("metric 'eta'").
        value: a real number (checked by the caller).

    Raises:
        PluginFailure: naming ``what`` and the range a float holds.
    """
    try:
        return float(value)  # type: ignore[arg-type]
    except OverflowError:
        digits = len(str(abs(int(value))))  # type: ignore[call-overload]
        raise PluginFailure(
            plugin,
            hook,
            f"gave {what} as an integer of {digits} digits, which a float "
            "cannot hold (at most about 1.8e308)",
        ) from None


def _scalar(value: object) -> bool:
    """Whether ``value`` is one real number (a 0-d or 1-element tensor too)."""
    if isinstance(value, numbers.Real):
        return True
    numel = getattr(value, "numel", None)
    if callable(numel) and numel() == 1 and getattr(value, "is_complex", None):
        return not value.is_complex()  # type: ignore[attr-defined]
    return False


def check_selection(
    plugin: str, hook: str, ids: object, state: object, candidates: np.ndarray
) -> None:
    """Check what a selector's ``select`` returned, once per call.

    Args:
        plugin: the selector, as messages name it.
        hook: ``"select"``.
        ids: the ids it returned.
        state: the state it returned (a JSON value: checkpoints keep it).
        candidates: the ids it was offered.

    Raises:
        PluginFailure: the ids are not integers, repeat, or are not among
            the candidates, or the state is not a JSON value.
    """
    arr = np.asarray(ids)
    if arr.ndim != 1 or arr.dtype.kind not in "iu":
        raise PluginFailure(
            plugin,
            hook,
            f"returned ids {_show(ids)} ({arr.dtype}, {arr.ndim}-d), expected a "
            "1-d array of integer client ids (int64)",
        )
    values, counts = np.unique(arr, return_counts=True)
    if (counts > 1).any():
        raise PluginFailure(
            plugin,
            hook,
            f"returned client {int(values[counts > 1][0])} twice, expected "
            "distinct ids (a selector drawing with replacement reports "
            "multiplicity())",
        )
    outside = values[~_among(values, np.asarray(candidates))]
    if outside.size:
        raise PluginFailure(
            plugin,
            hook,
            f"returned client {int(outside[0])}, which is not among this draw's "
            f"{len(candidates)} candidates (online and idle devices)",
        )
    check_json(plugin, hook, state)


def _among(values: np.ndarray, candidates: np.ndarray) -> np.ndarray:
    """Which of ``values`` are in ``candidates``: a binary search in the
    (usually sorted) candidates, k log m, since ``np.isin`` sorts a
    million-device fleet's candidates every round (25 ms against 0.1)."""
    if candidates.size == 0:
        return np.zeros(values.shape, dtype=bool)
    if candidates.size > 1 and not bool((candidates[1:] > candidates[:-1]).all()):
        candidates = np.sort(candidates)
    at = np.minimum(np.searchsorted(candidates, values), candidates.size - 1)
    return candidates[at] == values


def check_json(plugin: str, hook: str, state: object) -> None:
    """Refuse a selector state that is not a JSON value (a checkpoint keeps
    it as JSON: a NumPy array would fail at the first checkpoint).

    Raises:
        PluginFailure: naming the value's type.
    """
    try:
        json.dumps(state)
    except (TypeError, ValueError) as exc:
        raise PluginFailure(
            plugin,
            hook,
            f"returned a state that is not a JSON value ({exc}), expected dicts, "
            "lists, strings, numbers, booleans and None (checkpoints keep it "
            "as JSON; use .tolist() for an array)",
        ) from None


def _show(ids: object) -> str:
    """The first ids, for a message."""
    text = repr(ids if not isinstance(ids, np.ndarray) else ids.tolist())
    return text if len(text) <= 40 else text[:37] + "..."
