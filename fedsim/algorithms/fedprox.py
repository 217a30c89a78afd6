"""FedProx.

Federated Optimization in Heterogeneous Networks. Tian Li, Anit Kumar Sahu,
Manzil Zaheer, Maziar Sanjabi, Ameet Talwalkar, Virginia Smith. MLSys 2020.
arXiv:1812.06127.

Clients minimise h_i(x) = F_i(x) + mu/2 ||x - x^t||^2 with proximal SGD,
x <- x - lr (g + mu (x - x^t)) (ALGORITHMS.md section 4); its accumulation
vector has ||a_i||_1 = (1 - (1 - lr mu)^tau) / (lr mu). The server is FedAvg's
(with the same ``sampling`` choices). mu = 0 is exactly FedAvg: the client
then runs the plain solver of ``client.solver``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from fedsim.algorithms.fedavg import FedAvg
from fedsim.solvers import make_solver
from fedsim.spec import NonNegFloat

if TYPE_CHECKING:
    from fedsim.scenario import ClientSpec
    from fedsim.solvers import SGD

__all__ = ["FedProx"]


@dataclass(frozen=True)
class FedProx(FedAvg):
    """FedAvg whose clients use the proximal solver with coefficient ``mu``.

    Example:
        >>> from fedsim.scenario import ClientSpec
        >>> round(FedProx(mu=0.1).solver(ClientSpec(lr=0.1)).norm_a(2), 12)
        1.99
    """

    name: Literal["fedprox"] = "fedprox"  # type: ignore[assignment]
    mu: NonNegFloat = 0.01

    def solver(self, client: ClientSpec) -> SGD:
        return make_solver(client, mu=self.mu)
