"""What a worker is set up with once (:class:`WorkerSetup`), what it is
asked to train (a :class:`Task` and the round's :data:`Payload`), and what
the driver keeps of an update when the server is a Ray actor (an
:class:`UpdateSummary`).

Their own module, below :mod:`fedsim.workers` and :mod:`fedsim.batched`, so
both can name them without importing each other (tests/test_imports.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeAlias

import torch

from fedsim.algorithms.base import Algorithm, ClientUpdate
from fedsim.compression import Compressor
from fedsim.models import NetworkSetup
from fedsim.params import l2_norm
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
            l2_norm(u.delta),
        )


def update_norm(u: ClientUpdate | UpdateSummary) -> float:
    """||delta||_2 of an update, or the one its summary carries."""
    return u.update_norm if isinstance(u, UpdateSummary) else l2_norm(u.delta)
