"""How tensors cross Ray's object store between the driver and the worker
actors: as NumPy arrays in pickle 5's out-of-band buffers, not through
torch's own pickling.

Torch pickles a tensor by writing its storage into a bytes object in its
file format, which Ray then copies into the object store inside the
pickle stream; the reader copies the bytes out and parses them into a new
storage. For a client update of the 1.66M-parameter CNN that was about
10 ms of the worker's CPU and a few ms of the driver's, per update
(benchmarks/results.md, "The Ray path's cost per update"). A NumPy array
of the same bytes is written once, straight into the object store, and
read once, straight out of it.

Guarantees: what arrives is the same bits as what was sent, as writable
CPU tensors of the receiver's own (a copy out of the store: the store's
buffer is shared by every reader and must never be written to); tensors
that NumPy cannot hold (bfloat16, a gradient-tracking or a CUDA tensor, a
Parameter or another subclass) travel as torch pickles them.

Nothing here reads a user's file: the only bytes unpickled are those
fedsim's own driver and workers put in Ray's object store (Ray itself
deserialises them), and in the example below those made on the line before.

Example (no Ray needed: pickle 5 does what Ray does):
    >>> import pickle, torch
    >>> t = torch.arange(4.0)
    >>> buffers = []
    >>> stream = pickle.dumps(ship(t), protocol=5, buffer_callback=buffers.append)
    >>> len(buffers)  # the tensor's bytes, out of band
    1
    >>> back = pickle.loads(stream, buffers=buffers)
    >>> back.tolist(), back.data_ptr() != t.data_ptr()
    ([0.0, 1.0, 2.0, 3.0], True)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, cast

import numpy as np
import torch

from fedsim.tasks import remember_norm, update_norm

if TYPE_CHECKING:
    from fedsim.algorithms.base import ClientUpdate


class _AsArray:
    """Stands in for a tensor while it is pickled: it reduces to the tensor's
    NumPy view (out of band under pickle 5), rebuilt by :func:`_tensor`, or
    for a delta with its norm by :func:`_delta`."""

    __slots__ = ("array", "norm")

    def __init__(self, array: np.ndarray, norm: float | None = None) -> None:
        self.array, self.norm = array, norm

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        if self.norm is None:
            return _tensor, (self.array,)
        return _delta, (self.array, self.norm)


def _tensor(array: np.ndarray) -> torch.Tensor:
    """The tensor of an array that arrived (a view of the object store when
    Ray read it): copied, so it is the receiver's own and writable."""
    return torch.from_numpy(array.copy())


def _delta(array: np.ndarray, norm: float) -> torch.Tensor:
    """An update's delta that arrived with the norm its worker computed
    (:func:`fedsim.tasks.remember_norm`: the receiver does not compute it)."""
    delta = _tensor(array)
    remember_norm(delta, norm)
    return delta


def ship(t: torch.Tensor, norm: float | None = None) -> torch.Tensor:
    """``t``, to be pickled as a NumPy array (see the module docstring).

    Args:
        t: a tensor about to be put in the object store or returned by an
            actor method.
        norm: ``||t||_2`` when ``t`` is an update's delta: it travels with
            the tensor (:func:`_delta`).

    Returns:
        A stand-in that unpickles as a copy of ``t`` (typed as the tensor it
        becomes: it is meant only to be pickled), or ``t`` itself when NumPy
        cannot hold it.
    """
    if type(t) is not torch.Tensor or t.requires_grad or t.device.type != "cpu":
        return t
    try:
        array = t.numpy()  # a view: nothing is copied here
    except (TypeError, RuntimeError):  # bfloat16, a conjugate or negated view
        return t
    return cast(torch.Tensor, _AsArray(array, norm))


def ship_all(tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A dict's tensors to be pickled as NumPy arrays (:func:`ship`; other
    values as they are): a payload, a client state or an update's extras.

    Args:
        tensors: values by name.
    """
    return {k: ship(v) for k, v in tensors.items()}


def ship_update(u: ClientUpdate) -> ClientUpdate:
    """A client update to be returned by a worker actor, its delta, extras
    and new state pickled as NumPy arrays (:func:`ship`), the delta with its
    norm, computed here on the worker, in parallel with the other workers
    (the driver's rows and the server's round result read it).

    Args:
        u: the update.

    Returns:
        An update that unpickles as ``u`` (equal bits, tensors of their own).
    """
    state = None if u.new_state is None else ship_all(u.new_state)
    delta = ship(u.delta, update_norm(u))
    return replace(u, delta=delta, extras=ship_all(u.extras), new_state=state)
