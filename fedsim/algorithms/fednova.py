"""FedNova.

Tackling the Objective Inconsistency Problem in Heterogeneous Federated
Optimization. Jianyu Wang, Qinghua Liu, Hao Liang, Gauri Joshi, H. Vincent Poor.
NeurIPS 2020. arXiv:2007.07481.

Server (ALGORITHMS.md 5.1, 5.4), with w_i the sampling weights of the round
(``sampling``, as for FedAvg; p_i under full participation):

    x^{t+1} = x^t + server_lr * tau_eff * sum_i w_i Delta_i / ||a_i||_1

Each update is first normalised by its solver's ||a_i||_1 (sgd, momentum,
prox or decayed lr: see :mod:`fedsim.solvers`), so every client gets weight
w_i = p_i whatever its number of local steps: chi^2(p||w) = 0 and the method
converges to a stationary point of the true objective (up to an O(lr) bias
for finite lr, ALGORITHMS.md 6.3). tau_eff only scales the step:

- ``fedavg``: sum_i w_i ||a_i||_1 / sum_i w_i (FedAvg-equivalent, default),
- ``steps``: sum_i w_i tau_i / sum_i w_i ("FedNova-Prox", for proximal solvers),
- ``fixed``: the constant ``tau_eff_value``.

Under sampling this is the recommendation [R] of ALGORITHMS.md 5.4: one
unbiased weight vector for both the sum and tau_eff, so FedNova equals FedAvg
under the same sampling whenever all ||a_i||_1 are equal.

Server momentum (``gmf``, the "slow momentum" of the official code, 5.3): the
buffer keeps the server step in parameter units, m <- gmf m + s, x <- x + m,
where s is the step above. The code keeps v = -m / lr with the current client
lr; with a constant lr (fedsim's) the two are identical, and m = s in the
first round. gmf = 0 gives x + s exactly. Local momentum buffers are reset
every round by the solver (``begin``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Literal

import torch
from pydantic import Field

from fedsim.algorithms.base import (
    AggregateInfo,
    ClientUpdate,
    ServerState,
    data_weights,
    empty_info,
    meter,
)
from fedsim.algorithms.sampling import Sampled, sampling_weights
from fedsim.algorithms.weighting import (
    TauEff,
    momentum_buffer,
    normalizers,
    updates_tau_eff,
)
from fedsim.params import weighted_sum
from fedsim.spec import PosFloat

__all__ = ["FedNova"]


@dataclass(frozen=True)
class FedNova(Sampled):
    """Normalised averaging.

    Example:
        >>> import torch
        >>> from fedsim.algorithms.base import ClientUpdate
        >>> ups = [ClientUpdate(0, torch.tensor([2.0]), 1, 2, 2.0, 0.0),
        ...        ClientUpdate(1, torch.tensor([6.0]), 1, 6, 6.0, 0.0)]
        >>> alg = FedNova()
        >>> state, info = alg.aggregate(alg.init(torch.zeros(1), 2), ups)
        >>> state["x"], info.tau_eff, info.chi2_pw
        (tensor([4.]), 4.0, 0.0)
    """

    name: Literal["fednova"] = "fednova"
    tau_eff: TauEff = "fedavg"
    tau_eff_value: PosFloat | None = None
    gmf: Annotated[float, Field(ge=0, lt=1)] = 0.0

    def __post_init__(self) -> None:
        if self.tau_eff == "fixed" and self.tau_eff_value is None:
            raise ValueError("tau_eff 'fixed' needs tau_eff_value")

    def init(self, x0: torch.Tensor, num_clients: int) -> ServerState:
        return {"x": x0.clone(), "mom": torch.zeros_like(x0)}

    def effective_steps(
        self, w: Sequence[float], updates: Sequence[ClientUpdate]
    ) -> float:
        """tau_eff for sampling weights ``w`` (normalised here)."""
        return updates_tau_eff(self.tau_eff, w, updates, self.tau_eff_value)

    def normalized_step(
        self, updates: Sequence[ClientUpdate]
    ) -> tuple[torch.Tensor, AggregateInfo]:
        """s = server_lr tau_eff sum_i w_i Delta_i / ||a_i||_1, and the meter."""
        p = data_weights(updates)
        wh = sampling_weights(updates, self.sampling)
        tau_eff = self.effective_steps(wh, updates)
        coef = normalizers(wh, [u.norm_a for u in updates])
        step = weighted_sum([u.delta for u in updates], coef)
        return (self.server_lr * tau_eff) * step, meter(updates, p, wh, tau_eff)

    def aggregate(
        self, state: ServerState, updates: Sequence[ClientUpdate]
    ) -> tuple[ServerState, AggregateInfo]:
        if not updates:
            return state, empty_info()
        step, info = self.normalized_step(updates)
        mom = momentum_buffer(state["mom"], step, self.gmf)
        return {**state, "x": state["x"] + mom, "mom": mom}, info
