"""FedDC.

FedDC: Federated Learning with Non-IID Data via Local Drift Decoupling and
Correction. Liang Gao, Huazhu Fu, Li Li, Yingwen Chen, Ming Xu, Cheng-Zhong Xu.
CVPR 2022. arXiv:2203.11751.

docs/algorithms.md 9.2, as the official code: FedDyn's drift h_i plus a control
variate c_i. With w_i = n_i m / n, client i runs its solver on

    F_i(theta) + (alpha / 2 w_i) ||theta - (w - h_i)||^2 + <theta, c / w_i - c_i>,

then h_i <- h_i + delta_i, c_i^+ = c_i - c / w_i - delta_i / (lr ||a_i||_1),
uploading w_i (c_i^+ - c_i); c <- c + (1/m) sum_S Delta c_i. ``aggregation``:
``code`` is FedDyn's server rule, ``paper`` (Eq. 7) w <- sum_S p_i (theta_i^+
+ h_i^+). ``correction: false`` is exactly FedDyn.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import fedsim.algorithms.base as base
from fedsim.algorithms.base import PLAIN_ROUND, RoundContext, ServerState, Updates
from fedsim.algorithms.control import control_aggregate, control_step
from fedsim.algorithms.feddyn import DynContext, FedDyn
from fedsim.lazy import torch
from fedsim.params import weighted_sum
from fedsim.solvers import SolverState


@dataclass(frozen=True)
class FedDC(FedDyn):
    """FedDyn's drift plus gradient correction (c, c_i).

    >>> alg = FedDC(alpha=0.01)
    >>> sorted(alg.init(torch.zeros(2), num_clients=4))
    ['c', 'hist_sum', 'm', 'x']
    """

    name: Literal["feddc"] = "feddc"  # type: ignore[assignment]
    correction: bool = True  # False: exactly FedDyn
    aggregation: Literal["code", "paper"] = "code"

    @property
    def down_factor(self) -> int:  # type: ignore[override]
        """x, and c with the correction (without it, FedDyn's x alone)."""
        return 2 if self.correction else 1

    @property
    def up_factor(self) -> int:  # type: ignore[override]
        """delta; dc with the correction; the drift h_i under ``paper``
        aggregation (the server averages theta_i + h_i).

        >>> FedDC(correction=False).up_factor, FedDC().up_factor
        (1, 2)
        >>> FedDC(aggregation="paper").up_factor
        3
        """
        return 1 + int(self.correction) + int(self.aggregation == "paper")

    def init(self, x0: torch.Tensor, num_clients: int) -> ServerState:
        state = super().init(x0, num_clients)
        if self.correction:
            state["c"] = torch.zeros_like(x0)
        return state

    def payload(self, state: ServerState) -> dict[str, torch.Tensor]:
        return {k: state[k] for k in (("x", "c") if self.correction else ("x",))}

    @base.skip_empty_rounds
    def aggregate(
        self, state: ServerState, updates: Updates, ctx: RoundContext = PLAIN_ROUND
    ) -> tuple[ServerState, base.AggregateInfo]:
        new, info = super().aggregate(state, updates, ctx)
        if self.aggregation == "paper":
            p = base.data_weights(updates)
            models = [state["x"] + u.delta + u.extras["drift"] for u in updates]
            new["x"] = weighted_sum(models, p)
            info = base.meter(updates, p, info.tau_eff)
        if self.correction:
            m = float(state["m"])
            new["c"] = control_aggregate(state, updates, [1.0 / m] * len(updates))
        return new, info

    def local_setup(self, client: base.ClientContext) -> DynContext:
        ctx = super().local_setup(client)
        if not self.correction:
            return ctx
        c = client.payload["c"]
        c_i = client.state.get("c", torch.zeros_like(c))
        return ctx._replace(correction=c / client.info.relative_weight - c_i)

    def client_finish(
        self, delta: torch.Tensor, solver_state: SolverState, client: base.ClientContext
    ) -> base.ClientResult:
        extras, new_state = super().client_finish(delta, solver_state, client)
        assert new_state is not None
        if self.aggregation == "paper":
            extras["drift"] = new_state["hist"]
        if self.correction:
            correction = client.local.correction  # c / w_i - c_i
            dc, c_new = control_step(delta, solver_state, correction, client.state)
            extras["dc"] = client.info.relative_weight * dc
            new_state["c"] = c_new
        return extras, new_state
