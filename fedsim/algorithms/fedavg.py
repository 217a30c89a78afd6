"""FedAvg.

Communication-Efficient Learning of Deep Networks from Decentralized Data.
H. Brendan McMahan, Eider Moore, Daniel Ramage, Seth Hampson, Blaise Agüera y
Arcas. AISTATS 2017. arXiv:1602.05629.

Server: x^{t+1} = x^t + server_lr * sum_i p_i Delta_i, with p_i = n_i / sum_S n_j
over the round's completed updates (the reference codes' practice,
ALGORITHMS.md section 3). Seen through FedNova's lens (ALGORITHMS.md 5.1), the
update i effectively gets weight w_i proportional to p_i ||a_i||_1, so clients
that took more local steps pull the model toward their own objective.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from fedsim.algorithms.base import (
    AggregateInfo,
    Algorithm,
    ClientUpdate,
    ServerState,
    data_weights,
    empty_info,
    meter,
)
from fedsim.params import weighted_sum

__all__ = ["FedAvg"]


@dataclass(frozen=True)
class FedAvg(Algorithm):
    """Weighted average of client deltas.

    Example:
        >>> import torch
        >>> from fedsim.algorithms.base import ClientUpdate
        >>> ups = [ClientUpdate(0, torch.tensor([1.0]), 1, 2, 2.0, 0.0),
        ...        ClientUpdate(1, torch.tensor([3.0]), 3, 6, 6.0, 0.0)]
        >>> state, info = FedAvg().aggregate({"x": torch.zeros(1)}, ups)
        >>> state["x"], info.tau_eff
        (tensor([2.5000]), 5.0)
    """

    name: Literal["fedavg"] = "fedavg"

    def aggregate(
        self, state: ServerState, updates: Sequence[ClientUpdate]
    ) -> tuple[ServerState, AggregateInfo]:
        if not updates:
            return state, empty_info()
        p = data_weights(updates)
        step = weighted_sum([u.delta for u in updates], p)
        x = state["x"] + self.server_lr * step
        w = [pi * u.norm_a for pi, u in zip(p, updates, strict=True)]
        return {**state, "x": x}, meter(updates, p, w, tau_eff=sum(w))
