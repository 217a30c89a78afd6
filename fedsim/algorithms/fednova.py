"""FedNova.

Tackling the Objective Inconsistency Problem in Heterogeneous Federated
Optimization. Jianyu Wang, Qinghua Liu, Hao Liang, Gauri Joshi, H. Vincent Poor.
NeurIPS 2020. arXiv:2007.07481.

Server (ALGORITHMS.md 5.1, 5.4):

    x^{t+1} = x^t + server_lr * tau_eff * sum_i p_i Delta_i / ||a_i||_1

Each update is first normalised by its solver's ||a_i||_1, so every client
gets weight w_i = p_i whatever its number of local steps: chi^2(p||w) = 0 and
the method converges to a stationary point of the true objective (up to an
O(lr) bias for finite lr, ALGORITHMS.md 6.3). tau_eff only scales the step:

- ``fedavg``: sum_i p_i ||a_i||_1 (the FedAvg-equivalent step, default),
- ``steps``: sum_i p_i tau_i ("FedNova-Prox", for proximal solvers),
- ``fixed``: a constant.
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
from fedsim.spec import PosFloat

__all__ = ["FedNova"]


@dataclass(frozen=True)
class FedNova(Algorithm):
    """Normalised averaging.

    Example:
        >>> import torch
        >>> from fedsim.algorithms.base import ClientUpdate
        >>> ups = [ClientUpdate(0, torch.tensor([2.0]), 1, 2, 2.0, 0.0),
        ...        ClientUpdate(1, torch.tensor([6.0]), 1, 6, 6.0, 0.0)]
        >>> state, info = FedNova().aggregate({"x": torch.zeros(1)}, ups)
        >>> state["x"], info.tau_eff, info.chi2_pw
        (tensor([4.]), 4.0, 0.0)
    """

    name: Literal["fednova"] = "fednova"
    tau_eff: Literal["fedavg", "steps", "fixed"] = "fedavg"
    tau_eff_value: PosFloat | None = None

    def __post_init__(self) -> None:
        if self.tau_eff == "fixed" and self.tau_eff_value is None:
            raise ValueError("tau_eff 'fixed' needs tau_eff_value")

    def effective_steps(
        self, p: Sequence[float], updates: Sequence[ClientUpdate]
    ) -> float:
        if self.tau_eff == "fedavg":
            return sum(pi * u.norm_a for pi, u in zip(p, updates, strict=True))
        if self.tau_eff == "steps":
            return sum(pi * u.tau for pi, u in zip(p, updates, strict=True))
        if self.tau_eff == "fixed" and self.tau_eff_value is not None:
            return float(self.tau_eff_value)
        raise ValueError(f"unknown tau_eff {self.tau_eff!r}")

    def aggregate(
        self, state: ServerState, updates: Sequence[ClientUpdate]
    ) -> tuple[ServerState, AggregateInfo]:
        if not updates:
            return state, empty_info()
        p = data_weights(updates)
        tau_eff = self.effective_steps(p, updates)
        coef = [pi / u.norm_a for pi, u in zip(p, updates, strict=True)]
        step = weighted_sum([u.delta for u in updates], coef)
        x = state["x"] + (self.server_lr * tau_eff) * step
        return {**state, "x": x}, meter(updates, p, p, tau_eff)
