"""FedDyn.

Federated Learning Based on Dynamic Regularization. Durmus Alp Emre Acar,
Yue Zhao, Ramon Matas Navarro, Matthew Mattina, Paul N. Whatmough, Venkatesh
Saligrama. ICLR 2021. arXiv:2111.04263.

The code form of docs/algorithms.md section 8. Client i keeps hist_i (initially 0)
and runs its solver on F_i(theta) + (alpha_i / 2) ||theta - (w - hist_i)||^2,
alpha_i = alpha / (n_i m / n), then hist_i <- hist_i + (theta_i^+ - w).
Server: w <- mean_{i in S} theta_i^+ + (1/m) sum_{all i} hist_i, with the
float64 running sum of all hist_i, stale ones included, as the reference code.
Meter: w_i = 1/|S|.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Literal, NamedTuple

import fedsim.algorithms.base as base
from fedsim.algorithms.base import PLAIN_ROUND, RoundContext, ServerState, Updates
from fedsim.algorithms.sampling import unweighted_meter
from fedsim.lazy import torch
from fedsim.params import weighted_sum
from fedsim.solvers import SolverState
from fedsim.spec import NonNegFloat


class DynContext(NamedTuple):
    """What a FedDyn-family client keeps constant during its round."""

    alpha_i: float
    anchor: torch.Tensor  # w - hist_i: where the penalty pulls theta
    hist: torch.Tensor  # hist_i before the round
    correction: torch.Tensor | None  # FedDC's r_i = c / w_i - c_i (else None)


@dataclass(frozen=True)
class FedDyn(base.Algorithm):
    """Dynamic regularisation (code form); ``alpha`` is the penalty coefficient.

    >>> alg = FedDyn(alpha=0.1)
    >>> state = alg.init(torch.zeros(2), num_clients=4)
    >>> sorted(state), state["hist_sum"].dtype
    (['hist_sum', 'm', 'x'], torch.float64)
    """

    name: Literal["feddyn"] = "feddyn"
    alpha: NonNegFloat = 0.01  # 0 only for checks: h then acts as unit momentum

    stateful: ClassVar[bool] = True

    def __post_init__(self) -> None:
        if self.server_lr != 1.0:
            raise ValueError(
                f"{self.name}'s server rule has no server learning rate; "
                "leave server_lr at 1"
            )

    def init(self, x0: torch.Tensor, num_clients: int) -> ServerState:
        hist_sum = torch.zeros(x0.shape, dtype=torch.float64)
        m = torch.tensor(float(num_clients), dtype=torch.float64)
        return {"x": x0.clone(), "hist_sum": hist_sum, "m": m}

    @base.skip_empty_rounds
    def aggregate(
        self, state: ServerState, updates: Updates, ctx: RoundContext = PLAIN_ROUND
    ) -> tuple[ServerState, base.AggregateInfo]:
        n, deltas = len(updates), [u.delta for u in updates]
        ones = [1.0] * n
        hist_sum = state["hist_sum"] + weighted_sum(deltas, ones, dtype=torch.float64)
        mean_delta = weighted_sum(deltas, [1.0 / n] * n)
        x = state["x"]
        x_new = (x + mean_delta).to(torch.float64) + hist_sum / state["m"]
        new = {**state, "x": x_new.to(x.dtype), "hist_sum": hist_sum}
        return new, unweighted_meter(updates)

    def local_setup(self, client: base.ClientContext) -> DynContext:
        w = client.payload["x"]
        hist = client.state.get("hist", torch.zeros_like(w))
        alpha_i = self.alpha / client.info.relative_weight
        return DynContext(alpha_i, w - hist, hist, None)

    def grad_hook(
        self, theta: torch.Tensor, grad: torch.Tensor, client: base.ClientContext
    ) -> None:
        ctx: DynContext = client.local
        grad.add_(theta - ctx.anchor, alpha=ctx.alpha_i)
        if ctx.correction is not None:
            grad.add_(ctx.correction)

    def stacked_grad_hook(
        self, clients: Sequence[base.ClientContext]
    ) -> base.StackedHook:
        """+ alpha_i (theta - anchor_i) (+ r_i) on every row at once."""
        ctx: list[DynContext] = [c.local for c in clients]
        anchor = torch.stack([c.anchor for c in ctx])
        alpha = torch.tensor([c.alpha_i for c in ctx], dtype=anchor.dtype)
        alpha = alpha.to(anchor.device).unsqueeze(1)
        has_r = ctx[0].correction is not None
        r = torch.stack([c.correction for c in ctx]) if has_r else None  # type: ignore[misc]

        def dyn(n: int, theta: torch.Tensor, g: torch.Tensor) -> None:
            g.add_(alpha[:n] * (theta - anchor[:n]))
            if r is not None:
                g.add_(r[:n])

        return dyn

    def client_finish(
        self, delta: torch.Tensor, solver_state: SolverState, client: base.ClientContext
    ) -> base.ClientResult:
        return {}, {"hist": client.local.hist + delta}
