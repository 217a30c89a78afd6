"""Uniform selection without replacement among the devices online now.

What the FedProx reference code does (docs/algorithms.md section 3): inclusion
q/m each; with ``algorithm.sampling: uniform`` (weights p_i m / q) it is the
unbiased scheme (ii) when every device is online and all q updates arrive.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

import numpy as np

from fedsim.selectors.base import Draw, Selector, SelectorContext, SelectorState


@dataclass(frozen=True)
class Uniform(Selector):
    """Pick ``min(k, #online)`` distinct online devices uniformly at random."""

    name: Literal["uniform"] = "uniform"

    asynchronous: ClassVar[bool] = True
    sampling_scheme: ClassVar[str | None] = "uniform"
    inclusion: ClassVar[str] = "uniform"

    def expected_draws(self, ctx: SelectorContext) -> np.ndarray:
        """q/m for each of the m clients (q = ``clients_per_round``).

        >>> Uniform(clients_per_round=2).expected_draws(
        ...     SelectorContext.uniform(4)).tolist()
        [0.5, 0.5, 0.5, 0.5]
        """
        m = ctx.num_clients
        return np.full(m, min(self.clients_per_round, m) / m)

    def select(
        self, state: SelectorState, draw: Draw
    ) -> tuple[np.ndarray, SelectorState]:
        chosen = draw.rng.choice(draw.candidates, size=self.k(draw), replace=False)
        return np.sort(chosen).astype(np.int64), state
