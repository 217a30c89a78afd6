"""What a worker is set up with once (:class:`WorkerSetup`), what it is
asked to train (a :class:`Task` and the round's :data:`Payload`), and what
the driver keeps of an update when the server is a Ray actor (an
:class:`UpdateSummary`).

Their own module, below :mod:`fedsim.workers` and :mod:`fedsim.batched`, so
both can name them without importing each other (tests/test_imports.py).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeAlias

import torch

from fedsim.algorithms.base import Algorithm, ClientUpdate
from fedsim.compression import Compressor
from fedsim.models import NetworkSetup
from fedsim.params import l2_norm
from fedsim.privacy import PrivacySpec
from fedsim.spec import ClientSpec

if TYPE_CHECKING:
    from ray import ObjectRef

# the server's tensors a round's clients start from (``x`` and any extras)
Payload = dict[str, torch.Tensor]
# What the round loops hand a server's apply: an update, or (to the server
# actor) a reference to one in the object store.
Parcel: TypeAlias = "ClientUpdate | ObjectRef"


@dataclass(frozen=True)
class WorkerSetup:
    """What a worker needs of the run, built once by the runtime and
    shipped to every worker actor (it pickles: frozen sections and the
    algorithm object).

    Attributes:
        algorithm: the run's algorithm (its client hooks and solver).
        network: how to build the network (the server builds the same).
        client: local training: solver, learning rate and its schedule,
            batch size.
        seed: the run's seed: every client's minibatches derive from
            (seed, round, client).
        rounds: the run's rounds, for ``client.lr_steps`` (fractions of it).
        gpus: GPUs per worker; > 0 trains on CUDA where torch sees one.
        vectorize: train a call's clients together (``fedsim.batched``)
            where that gives the sequential results.
        capped: the clock's tau caps an algorithm's own procedure
            (``round.policy: fixed_window``: ``LocalTraining.step_budget``).
        threads: torch's intra-op threads in a worker's process,
            ``max(1, int(cpus_per_worker))`` (the driver uses the same
            figure: a sum's split, so its floats, depend on it).
        compression: what each update goes through before it is sent
            (``fedsim.compression``; None: sent as it is).
        privacy: differential privacy's clipping (and local noise) of each
            update, after compression (``fedsim.privacy``; None: no DP).
    """

    algorithm: Algorithm
    network: NetworkSetup
    client: ClientSpec
    seed: int
    rounds: int
    gpus: float = 0.0
    vectorize: bool = False
    capped: bool = False
    threads: int = 1
    compression: Compressor | None = None
    privacy: PrivacySpec | None = None


@dataclass(frozen=True)
class Task:
    """Train ``client`` for ``tau`` local steps from server version
    ``version``; ``round`` seeds the client's randomness (asynchronous mode:
    the device's job index)."""

    client: int
    round: int
    tau: int
    version: int = 0


@dataclass(frozen=True)
class UpdateSummary:
    """A :class:`ClientUpdate` without its tensors: what the driver keeps for
    its rows and the selector when the server runs as a Ray actor, while the
    update itself goes from the worker to the server through the object
    store (docs/architecture.md, "Where the server runs").

    Guarantees: its fields equal the update's, and ``update_norm`` is
    ``l2_norm(delta)`` of the CPU delta, computed on the worker: a worker
    and the driver both run torch on ``max(1, int(cpus_per_worker))``
    threads (the sum's split depends on it), so the rows are bit-identical
    to those the driver computes from the update in its own home.
    """

    client: int
    weight: float
    tau: int
    norm_a: float
    train_loss: float
    bytes_up: int | None
    update_norm: float  # ||delta||_2, float64

    @classmethod
    def of(cls, u: ClientUpdate) -> UpdateSummary:
        """The summary of ``u`` (computes its norm, here).

        >>> u = ClientUpdate(3, torch.tensor([3.0, 4.0]), 1.0, 2, 0.0, 0.5)
        >>> UpdateSummary.of(u).update_norm
        5.0
        """
        return cls(
            u.client,
            u.weight,
            u.tau,
            u.norm_a,
            u.train_loss,
            u.bytes_up,
            update_norm(u),
        )


# ||delta||_2 of the updates in flight, by their delta's identity: the
# server's round result and the runtime's rows both ask for every update's
# norm (each a float64 pass over the model), and an update from a worker
# actor arrives with the norm the worker computed (fedsim.remote.wire), so
# the driver computes a norm at most once, and for Ray workers never. An
# entry holds the delta weakly (it goes with the delta) and its version
# counter: a delta changed in place is measured again.
_NORMS: dict[int, tuple[weakref.ref[torch.Tensor], int, float]] = {}


def remember_norm(delta: torch.Tensor, norm: float) -> None:
    """Note that ``||delta||_2`` is ``norm`` (:func:`update_norm` returns it
    while ``delta`` lives and is not changed in place).

    Args:
        delta: an update's delta.
        norm: ``l2_norm(delta)``, computed with the driver's thread count
            (a worker's is the same: :class:`WorkerSetup`), so the bits are
            those the driver would compute.
    """
    key = id(delta)

    def forget(ref: weakref.ref[torch.Tensor]) -> None:
        if _NORMS.get(key, (None,))[0] is ref:  # not a later delta's entry
            del _NORMS[key]

    _NORMS[key] = (weakref.ref(delta, forget), delta._version, norm)


def update_norm(u: ClientUpdate | UpdateSummary) -> float:
    """||delta||_2 of an update (computed once per delta, see
    :func:`remember_norm`), or the one its summary carries.

    >>> u = ClientUpdate(3, torch.tensor([3.0, 4.0]), 1.0, 2, 0.0, 0.5)
    >>> update_norm(u), update_norm(u)
    (5.0, 5.0)
    """
    if isinstance(u, UpdateSummary):
        return u.update_norm
    d = u.delta
    ref, version, norm = _NORMS.get(id(d), (None, -1, 0.0))
    if ref is None or ref() is not d or version != d._version:
        norm = l2_norm(d)
        remember_norm(d, norm)
    return norm
