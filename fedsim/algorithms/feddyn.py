"""FedDyn.

Federated Learning Based on Dynamic Regularization. Durmus Alp Emre Acar,
Yue Zhao, Ramon Matas Navarro, Matthew Mattina, Paul N. Whatmough, Venkatesh
Saligrama. ICLR 2021. arXiv:2111.04263.

The code form of ALGORITHMS.md section 8. Client i keeps hist_i = -grad
L_i / alpha (persistent, initially 0) and, from the global model w, runs its
local solver on

    F_i(theta) + alpha_i <theta, hist_i - w> + (alpha_i / 2) ||theta||^2
      = F_i(theta) + (alpha_i / 2) ||theta - (w - hist_i)||^2 + const,

with alpha_i = alpha / (n_i m / n) (``relative_weight``; alpha_i = alpha for
balanced data). The penalty's gradient alpha_i (theta - w + hist_i) is added
to each minibatch gradient before the solver step. Afterwards
hist_i <- hist_i + (theta_i^+ - w).

Server ("cloud model"): w <- mean_{i in S} theta_i^+ + (1/m) sum_{all i} hist_i.
It keeps the running sum of *all* clients' hist_i (``hist_sum``, float64),
so the stale hist of clients that sat out still counts, as in the reference
code. Delta hist_i = theta_i^+ - w is the uploaded delta, so nothing else
goes up (d down, d up). With h = -alpha (1/m) sum hist_i this is the paper's
form h^t = h^{t-1} - alpha (1/m) sum_S (theta_i - w), w = mean_S theta_i -
h / alpha.

Not modelled: the reference code's gradient clipping (norm 10) and lr decay
across rounds. alpha = 0 is accepted for checks only: hist then accumulates
every update with no penalty to balance it, a unit "momentum" on past
updates that is unstable (ALGORITHMS.md 9.2).

Fixed point [D, checked in the tests]: at a steady state every delta is 0,
so grad F_i(w) = -alpha_i hist_i and sum_i hist_i = 0, hence
sum_i (n_i / n) grad F_i(w) = 0: with alpha_i = alpha / (n_i m / n) FedDyn
converges (under full participation) to the minimiser of the *data-weighted*
objective, which is the unweighted mean of the F_i for balanced data.

Meter: the server averages theta_i^+ unweighted, so each update's weight is
w_i = 1/|S| and tau_eff the mean ||a_i||_1 (chi^2 then measures the server
mean's weights, not the fixed point above).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Literal, NamedTuple

from fedsim.algorithms.base import (
    AggregateInfo,
    Algorithm,
    ClientContext,
    ClientResult,
    ClientUpdate,
    ServerState,
    skip_empty_rounds,
)
from fedsim.algorithms.sampling import unweighted_meter
from fedsim.lazy import torch
from fedsim.params import weighted_sum
from fedsim.spec import NonNegFloat

if TYPE_CHECKING:
    from fedsim.solvers import SolverState

__all__ = ["FedDyn", "DynContext"]


class DynContext(NamedTuple):
    """What a FedDyn-family client keeps constant during its round."""

    alpha_i: float
    anchor: torch.Tensor  # w - hist_i: where the penalty pulls theta
    hist: torch.Tensor  # hist_i before the round
    correction: torch.Tensor | None  # FedDC's r_i = c / w_i - c_i (else None)


@dataclass(frozen=True)
class FedDyn(Algorithm):
    """Dynamic regularisation (code form).

    Attributes:
        alpha: the penalty coefficient (alpha_i = alpha / w_i per client).

    Example:
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

    # ---------------------------------------------------------------- server
    def init(self, x0: torch.Tensor, num_clients: int) -> ServerState:
        return {
            "x": x0.clone(),
            "hist_sum": torch.zeros(x0.shape, dtype=torch.float64),
            "m": torch.tensor(float(num_clients), dtype=torch.float64),
        }

    @skip_empty_rounds
    def aggregate(
        self, state: ServerState, updates: Sequence[ClientUpdate]
    ) -> tuple[ServerState, AggregateInfo]:
        n = len(updates)
        hist_sum = state["hist_sum"] + weighted_sum(
            [u.delta for u in updates], [1.0] * n, dtype=torch.float64
        )
        mean_delta = weighted_sum([u.delta for u in updates], [1.0 / n] * n)
        x = state["x"]
        x_new = (x + mean_delta).to(torch.float64) + hist_sum / state["m"]
        new = {**state, "x": x_new.to(x.dtype), "hist_sum": hist_sum}
        return new, unweighted_meter(updates)

    # ---------------------------------------------------------------- client
    def local_setup(self, client: ClientContext) -> DynContext:
        w = client.payload["x"]
        hist = client.state.get("hist", torch.zeros_like(w))
        alpha_i = self.alpha / client.info.relative_weight
        return DynContext(alpha_i, w - hist, hist, None)

    def grad_hook(
        self, theta: torch.Tensor, grad: torch.Tensor, client: ClientContext
    ) -> None:
        ctx: DynContext = client.local
        grad.add_(theta - ctx.anchor, alpha=ctx.alpha_i)
        if ctx.correction is not None:
            grad.add_(ctx.correction)

    def client_finish(
        self, delta: torch.Tensor, solver_state: SolverState, client: ClientContext
    ) -> ClientResult:
        return {}, {"hist": client.local.hist + delta}
