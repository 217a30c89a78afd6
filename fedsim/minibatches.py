"""A client's randomness and minibatches, the same for :mod:`fedsim.workers`
and :mod:`fedsim.batched`."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch

_CLIENT_TAG = 0xC11E


def client_seed(seed: int, round_: int, client: int) -> int:
    """The seed of one client's randomness in one round: (seed, round, client).

    Args:
        seed: the scenario seed.
        round_: the round (asynchronous mode: the device's job index).
        client: the client id.

    Returns:
        A non-negative int below 2^63 (what ``torch.Generator.manual_seed``
        takes), the same whichever worker trains the client.

    >>> client_seed(0, 3, 7) == client_seed(0, 3, 7) != client_seed(0, 4, 7)
    True
    """
    ss = np.random.SeedSequence([seed, _CLIENT_TAG, round_, client])
    return int(ss.generate_state(1, np.uint64)[0] >> np.uint64(1))


def batches(
    n: int, batch: int, gen: torch.Generator, device: torch.device | None = None
) -> Iterator[torch.Tensor | None]:
    """Endless minibatch row indices: epochs of a fresh permutation, full
    batches only. ``None`` means "all rows" (a client with n <= batch).

    The permutation is drawn by ``gen`` on the CPU, so every device sees the
    same batches, and crosses to ``device`` once per epoch: indexing a GPU
    tensor with CPU indices would copy (and synchronise) at every step.

    Args:
        n: the client's number of rows.
        batch: the batch size B.
        gen: the client's generator (:func:`client_seed`).
        device: where the indices go (None: the CPU).

    >>> it = batches(5, 2, torch.Generator().manual_seed(0))
    >>> [len(next(it)) for _ in range(3)]
    [2, 2, 2]
    """
    if n <= batch:
        while True:
            yield None
    while True:
        perm = torch.randperm(n, generator=gen).to(device)
        yield from perm[: n // batch * batch].view(-1, batch)


def first_batches(n: int, batch: int, steps: int, gen: torch.Generator) -> torch.Tensor:
    """The first ``steps`` batches of :func:`batches` (n > batch) as one
    ``[steps, batch]`` tensor, drawn an epoch at a time (the same draws
    from ``gen``, so batched and sequential training see the same batches).

    Args:
        n: the client's number of rows (more than ``batch``).
        batch: the batch size B.
        steps: how many batches.
        gen: the client's generator, fresh.

    >>> it = batches(7, 2, torch.Generator().manual_seed(3))
    >>> one_by_one = torch.stack([next(it) for _ in range(5)])
    >>> at_once = first_batches(7, 2, 5, torch.Generator().manual_seed(3))
    >>> torch.equal(at_once, one_by_one)
    True
    """
    per_epoch = n // batch
    epochs = -(-steps // per_epoch)
    perms = [
        torch.randperm(n, generator=gen)[: per_epoch * batch] for _ in range(epochs)
    ]
    return torch.cat(perms).view(-1, batch)[:steps]
