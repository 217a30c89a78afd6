"""FedNova-VR: FedNova with cross-client variance reduction (reconstructed).

Tackling the Objective Inconsistency Problem in Heterogeneous Federated
Optimization. Jianyu Wang, Qinghua Liu, Hao Liang, Gauri Joshi, H. Vincent Poor.
NeurIPS 2020. arXiv:2007.07481. Appendix H, Algorithm 2.

**Reconstructed** (ALGORITHMS.md 5.5, tagged [U] there): only the paper's
description was available, not its pseudo-code, and the official repository
has only a commented-out stub. This is SCAFFOLD option II written in
FedNova's normalised form:

- State: client control variates c_i (persistent, initially 0) and the
  server's c = sum_i p_i c_i over *all* clients (initially 0).
- Client step: g <- g - c_i + c before the local solver (momentum SGD in the
  paper), so u <- rho u + g - c_i + c, x <- x - lr u; ||a_i||_1 comes from the
  solver as for FedNova. The correction is constant within the round, hence
  d_i^corr = -Delta_i / (lr ||a_i||_1) = d_i^raw + (c - c_i) exactly.
- New control variate c_i^+ = d_i^raw = d_i^corr - c + c_i; the client
  uploads Delta_i and c_i^+ - c_i (2d up, x and c down: 2d).
- Server: x is FedNova's update of the corrected deltas; c <- c + sum_{i in S}
  p_i (c_i^+ - c_i), with p_i = n_i / n over all clients, which keeps
  c = sum_i p_i c_i for any participation. Under full participation the
  corrections cancel in the aggregate (sum_i p_i (c - c_i) = 0).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from fedsim.algorithms.base import (
    AggregateInfo,
    ClientContext,
    ClientResult,
    ClientUpdate,
    ServerState,
)
from fedsim.algorithms.control import (
    ControlVariates,
    control_aggregate,
    control_step,
)
from fedsim.algorithms.fednova import FedNova
from fedsim.lazy import torch

if TYPE_CHECKING:
    from fedsim.solvers import SolverState

__all__ = ["FedNovaVR"]


@dataclass(frozen=True)
class FedNovaVR(ControlVariates, FedNova):
    """FedNova whose local gradients carry SCAFFOLD-style corrections c - c_i.

    Example:
        >>> alg = FedNovaVR()
        >>> sorted(alg.init(torch.zeros(3), num_clients=4))
        ['c', 'mom', 'mom_lr', 'x']
    """

    name: Literal["fednova_vr"] = "fednova_vr"  # type: ignore[assignment]

    def client_finish(
        self, delta: torch.Tensor, solver_state: SolverState, client: ClientContext
    ) -> ClientResult:
        extras, _ = super().client_finish(delta, solver_state, client)
        # c_i^+ = d_i^corr - (c - c_i), with client.local = c - c_i
        c_i, c_new = control_step(delta, solver_state, client.local, client.state)
        extras["dc"] = c_new - c_i
        info = client.info
        extras["p"] = torch.tensor(
            info.relative_weight / info.num_clients, dtype=torch.float64
        )
        return extras, {"c": c_new}

    def aggregate(
        self, state: ServerState, updates: Sequence[ClientUpdate]
    ) -> tuple[ServerState, AggregateInfo]:
        new, info = super().aggregate(state, updates)
        if updates:  # c += sum_S p_i (c_i^+ - c_i), p_i = n_i / n
            p = [float(u.extras["p"]) for u in updates]
            new["c"] = control_aggregate(state, updates, p)
        return new, info
