"""Uniform selection without replacement among the devices online now.

This is what the FedProx reference code does (ALGORITHMS.md section 3, common
practice); with the data-weighted FedAvg server it is biased toward the
clients sampled, which is the usual trade-off.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np

from fedsim.spec import PLUGIN_CONFIG, PosInt

__all__ = ["Uniform"]


@dataclass(frozen=True)
class Uniform:
    """Pick ``min(k, #online)`` distinct online devices uniformly at random.

    Example:
        >>> import numpy as np
        >>> sel = Uniform(clients_per_round=2)
        >>> ids, _ = sel.select(sel.init(5), 0, np.array([0, 2, 4]),
        ...                     np.random.default_rng(0))
        >>> len(ids), set(ids) <= {0, 2, 4}
        (2, True)
    """

    __pydantic_config__: ClassVar = PLUGIN_CONFIG

    name: Literal["uniform"] = "uniform"
    clients_per_round: PosInt = 10

    def init(self, num_clients: int) -> dict[str, Any]:
        return {}

    def select(
        self,
        state: dict[str, Any],
        round_: int,
        candidates: np.ndarray,
        rng: np.random.Generator,
    ) -> tuple[np.ndarray, dict[str, Any]]:
        k = min(self.clients_per_round, len(candidates))
        chosen = rng.choice(candidates, size=k, replace=False)
        return np.sort(chosen).astype(np.int64), state

    def observe(self, state: dict[str, Any], round_: int, info: Any) -> dict[str, Any]:
        return state
