"""FedProx.

Federated Optimization in Heterogeneous Networks. Tian Li, Anit Kumar Sahu,
Manzil Zaheer, Maziar Sanjabi, Ameet Talwalkar, Virginia Smith. MLSys 2020.
arXiv:1812.06127.

Clients run proximal SGD on F_i(x) + mu/2 ||x - x^t||^2 (docs/algorithms.md 4),
||a_i||_1 = (1 - (1 - lr mu)^tau) / (lr mu); the server is FedAvg's.
mu = 0 is exactly FedAvg.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from fedsim.algorithms.fedavg import FedAvg
from fedsim.solvers import SGD, make_solver
from fedsim.spec import NonNegFloat

if TYPE_CHECKING:
    from fedsim.spec import ClientSpec


@dataclass(frozen=True)
class FedProx(FedAvg):
    """FedAvg whose clients use the proximal solver with coefficient ``mu``.

    >>> from fedsim.scenario import ClientSpec
    >>> round(FedProx(mu=0.1).solver(ClientSpec(lr=0.1)).norm_a(2), 12)
    1.99
    """

    name: Literal["fedprox"] = "fedprox"  # type: ignore[assignment]
    mu: NonNegFloat = 0.01

    def solver(self, client: ClientSpec) -> SGD:
        return make_solver(client, mu=self.mu)
