"""FedNova.

Tackling the Objective Inconsistency Problem in Heterogeneous Federated
Optimization. Jianyu Wang, Qinghua Liu, Hao Liang, Gauri Joshi, H. Vincent Poor.
NeurIPS 2020. arXiv:2007.07481.

Server (docs/algorithms.md 5.1, 5.4), w_i the round's sampling weights:

    x^{t+1} = x^t + server_lr * tau_eff * sum_i w_i Delta_i / ||a_i||_1

so every client gets weight w_i whatever its local steps (chi^2(p||w) = 0);
``tau_eff`` (``fedavg``, ``steps`` or ``fixed``) only scales the step. Server
momentum ``gmf`` (5.3) is kept in parameter units, m <- gmf (lr_t / lr_{t-1})
m + s, x <- x + m, so it follows a decaying client lr (uploaded as ``lr``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import fedsim.algorithms.base as base
import fedsim.algorithms.weighting as weighting
from fedsim.algorithms.base import PLAIN_ROUND, RoundContext, ServerState, Updates
from fedsim.algorithms.sampling import Sampled, sampling_weights
from fedsim.lazy import torch
from fedsim.params import weighted_sum
from fedsim.solvers import SolverState
from fedsim.spec import PosFloat


@dataclass(frozen=True)
class FedNova(Sampled):
    """Normalised averaging.

    >>> from fedsim.algorithms.base import ClientUpdate
    >>> ups = [ClientUpdate(0, torch.tensor([2.0]), 1, 2, 2.0, 0.0),
    ...        ClientUpdate(1, torch.tensor([6.0]), 1, 6, 6.0, 0.0)]
    >>> state, info = FedNova().aggregate(FedNova().init(torch.zeros(1), 2), ups)
    >>> state["x"], info.tau_eff, info.chi2_pw
    (tensor([4.]), 4.0, 0.0)
    """

    name: Literal["fednova"] = "fednova"
    tau_eff: weighting.TauEff = "fedavg"
    tau_eff_value: PosFloat | None = None  # tau_eff of ``fixed``
    gmf: weighting.Beta = 0.0  # server momentum, 0: none

    def __post_init__(self) -> None:
        if self.tau_eff == "fixed" and self.tau_eff_value is None:
            raise ValueError("tau_eff 'fixed' needs tau_eff_value")

    def init(self, x0: torch.Tensor, num_clients: int) -> ServerState:
        mom_lr = torch.zeros((), dtype=torch.float64)  # 0: no round yet
        return {"x": x0.clone(), "mom": torch.zeros_like(x0), "mom_lr": mom_lr}

    def client_finish(
        self, delta: torch.Tensor, solver_state: SolverState, client: base.ClientContext
    ) -> base.ClientResult:
        extras, _ = super().client_finish(delta, solver_state, client)
        if self.gmf:  # the server momentum follows the client lr
            extras.update(weighting.lr_upload(solver_state))
        return extras, None

    @base.skip_empty_rounds
    def aggregate(
        self, state: ServerState, updates: Updates, ctx: RoundContext = PLAIN_ROUND
    ) -> tuple[ServerState, base.AggregateInfo]:
        wh = sampling_weights(updates, self.sampling)
        fixed = self.tau_eff_value
        tau_eff = weighting.updates_tau_eff(self.tau_eff, wh, updates, fixed)
        coef = weighting.normalizers(wh, [u.norm_a for u in updates])
        deltas = [u.delta for u in updates]
        step = (self.server_lr * tau_eff) * weighted_sum(deltas, coef)
        # every client of a round trains with that round's lr
        lrs = [lr for lr in map(weighting.uploaded_lr, updates) if lr is not None]
        last = float(state.get("mom_lr", 0.0))
        rescale = lrs[0] / last if lrs and last > 0 else 1.0
        mom = weighting.momentum_buffer(state["mom"], step, self.gmf, rescale)
        new = {**state, "x": state["x"] + mom, "mom": mom}
        if lrs:
            new["mom_lr"] = torch.tensor(lrs[0], dtype=torch.float64)
        return new, base.meter(updates, wh, tau_eff, wh)
