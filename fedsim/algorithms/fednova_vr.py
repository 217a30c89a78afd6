"""FedNova-VR: FedNova with cross-client variance reduction (reconstructed).

Tackling the Objective Inconsistency Problem in Heterogeneous Federated
Optimization. Jianyu Wang, Qinghua Liu, Hao Liang, Gauri Joshi, H. Vincent Poor.
NeurIPS 2020. arXiv:2007.07481. Appendix H, Algorithm 2.

**Reconstructed** (docs/algorithms.md 5.5, [U]; no pseudo-code was published):
SCAFFOLD option II in FedNova's normalised form. Local gradients g - c_i + c;
c_i^+ = -Delta_i / (lr ||a_i||_1) - (c - c_i); x takes FedNova's step and
c <- c + sum_S p_i (c_i^+ - c_i), p_i = n_i / n, so c = sum_i p_i c_i.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import fedsim.algorithms.base as base
from fedsim.algorithms.base import PLAIN_ROUND, RoundContext, ServerState, Updates
from fedsim.algorithms.control import ControlVariates, control_aggregate
from fedsim.algorithms.fednova import FedNova
from fedsim.lazy import torch
from fedsim.solvers import SolverState


@dataclass(frozen=True)
class FedNovaVR(ControlVariates, FedNova):
    """FedNova whose local gradients carry SCAFFOLD-style corrections c - c_i.

    >>> alg = FedNovaVR()
    >>> sorted(alg.init(torch.zeros(3), num_clients=4))
    ['c', 'mom', 'mom_lr', 'x']
    """

    name: Literal["fednova_vr"] = "fednova_vr"  # type: ignore[assignment]

    def client_finish(
        self, delta: torch.Tensor, solver_state: SolverState, client: base.ClientContext
    ) -> base.ClientResult:
        extras, new_state = super().client_finish(delta, solver_state, client)
        p = client.info.relative_weight / client.info.num_clients
        extras["p"] = torch.tensor(p, dtype=torch.float64)
        return extras, new_state

    @base.skip_empty_rounds
    def aggregate(
        self, state: ServerState, updates: Updates, ctx: RoundContext = PLAIN_ROUND
    ) -> tuple[ServerState, base.AggregateInfo]:
        new, info = super().aggregate(state, updates, ctx)
        p = [float(u.extras["p"]) for u in updates]  # c += sum_S p_i (c_i^+ - c_i)
        new["c"] = control_aggregate(state, updates, p)
        return new, info
