"""What a worker is asked to train: a :class:`Task` and the round's
:data:`Payload`.

Their own module, below :mod:`fedsim.workers` and :mod:`fedsim.batched`, so
both can name them without importing each other (tests/test_imports.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# the server's tensors a round's clients start from (``x`` and any extras)
Payload = dict[str, torch.Tensor]


@dataclass(frozen=True)
class Task:
    """Train ``client`` for ``tau`` local steps from server version
    ``version``; ``round`` seeds the client's randomness (asynchronous mode:
    the device's job index)."""

    client: int
    round: int
    tau: int
    version: int = 0
