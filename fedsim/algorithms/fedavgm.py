"""FedAvgM: FedAvg with server momentum.

Measuring the Effects of Non-Identical Data Distribution for Federated Visual
Classification. Tzu-Ming Harry Hsu, Hang Qi, Matthew Brown. 2019.
arXiv:1909.06335.

Heavy-ball momentum on the averaged delta (v = 0 initially, beta =
``server_momentum``; beta = 0 is FedAvg):

    v <- beta v + sum_i w_i Delta_i,      x <- x + server_lr * v
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from fedsim.algorithms.base import ServerState
from fedsim.algorithms.fedavg import FedAvg
from fedsim.algorithms.weighting import Beta, momentum_buffer
from fedsim.lazy import torch


@dataclass(frozen=True)
class FedAvgM(FedAvg):
    """Server momentum on the averaged delta.

    >>> alg = FedAvgM(server_momentum=0.5)
    >>> s = alg.init(torch.zeros(1), num_clients=2)
    >>> s = alg.apply_step(s, torch.ones(1)); s = alg.apply_step(s, torch.ones(1))
    >>> s["x"], s["mom"]
    (tensor([2.5000]), tensor([1.5000]))
    """

    name: Literal["fedavgm"] = "fedavgm"  # type: ignore[assignment]
    server_momentum: Beta = 0.9

    def init(self, x0: torch.Tensor, num_clients: int) -> ServerState:
        return {"x": x0.clone(), "mom": torch.zeros_like(x0)}

    def apply_step(self, state: ServerState, step: torch.Tensor) -> ServerState:
        mom = momentum_buffer(state["mom"], step, self.server_momentum)
        return {**state, "x": state["x"] + self.server_lr * mom, "mom": mom}
