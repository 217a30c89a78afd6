"""FedProx.

Federated Optimization in Heterogeneous Networks. Tian Li, Anit Kumar Sahu,
Manzil Zaheer, Maziar Sanjabi, Ameet Talwalkar, Virginia Smith. MLSys 2020.
arXiv:1812.06127.

Clients minimise h_i(x) = F_i(x) + mu/2 ||x - x^t||^2 with proximal SGD
(ALGORITHMS.md section 4); the server is FedAvg's. mu = 0 is exactly FedAvg.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from fedsim.algorithms.fedavg import FedAvg
from fedsim.solvers import SGD, make_solver
from fedsim.spec import PosFloat

if TYPE_CHECKING:
    from fedsim.scenario import ClientSpec

__all__ = ["FedProx"]


@dataclass(frozen=True)
class FedProx(FedAvg):
    """FedAvg whose clients use the proximal solver with coefficient ``mu``."""

    name: Literal["fedprox"] = "fedprox"  # type: ignore[assignment]
    mu: PosFloat = 0.01

    def solver(self, client: ClientSpec) -> SGD:
        return make_solver(client, mu=self.mu)
