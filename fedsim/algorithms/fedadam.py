"""FedAdam: an adaptive server optimizer.

Adaptive Federated Optimization. Sashank J. Reddi, Zachary Charles, Manzil
Zaheer, Zachary Garrett, Keith Rush, Jakub Konečný, Sanjiv Kumar, H. Brendan
McMahan. ICLR 2021. arXiv:2003.00295.

FedAvg's averaged delta Delta is the pseudo-gradient (Algorithm 2):

    m <- beta1 m + (1 - beta1) Delta,   v <- beta2 v + (1 - beta2) Delta^2
    x <- x + server_lr * m / (sqrt(v) + tau)

with m = 0, v = tau^2 initially and no bias correction, as in the paper;
``adaptivity`` (tau) bounds the per-coordinate step by about server_lr / tau.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from fedsim.algorithms.base import ServerState
from fedsim.algorithms.fedavg import FedAvg
from fedsim.algorithms.weighting import Beta
from fedsim.lazy import torch
from fedsim.spec import PosFloat


@dataclass(frozen=True)
class FedAdam(FedAvg):
    """Adam on the server, clients as in FedAvg.

    >>> alg = FedAdam(server_lr=0.1, adaptivity=1e-3)
    >>> s = alg.init(torch.zeros(1), num_clients=2)
    >>> # first step: lr (1 - beta1) / (sqrt(1 - beta2) + tau) per coordinate
    >>> round(float(alg.apply_step(s, torch.ones(1))["x"]), 4)
    0.099
    """

    name: Literal["fedadam"] = "fedadam"  # type: ignore[assignment]
    server_lr: PosFloat = 0.1
    beta1: Beta = 0.9
    beta2: Beta = 0.99
    adaptivity: PosFloat = 1e-3

    def init(self, x0: torch.Tensor, num_clients: int) -> ServerState:
        v = torch.full_like(x0, self.adaptivity**2)
        return {"x": x0.clone(), "m": torch.zeros_like(x0), "v": v}

    def apply_step(self, state: ServerState, step: torch.Tensor) -> ServerState:
        m = self.beta1 * state["m"] + (1.0 - self.beta1) * step
        v = self.beta2 * state["v"] + (1.0 - self.beta2) * step.square()
        x = state["x"] + self.server_lr * m / (v.sqrt() + self.adaptivity)
        return {**state, "x": x, "m": m, "v": v}
