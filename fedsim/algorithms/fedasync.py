"""FedAsync, and the staleness functions and interface shared by async servers.

Asynchronous Federated Optimization. Cong Xie, Sanmi Koyejo, Indranil Gupta.
arXiv:1903.03934, 2019 (OPT workshop, NeurIPS 2020).

Server (Algorithm 1): an update that started from version tau arrives at
version t, staleness s = t - tau; with S a staleness function (section 5.2:
``constant``, ``polynomial`` (1 + s)^(-a), ``hinge``),

    alpha_t = alpha * S(s),   x_{t+1} = (1 - alpha_t) x_t + alpha_t (x_tau + Delta)

Workers run proximal SGD on f(x) + (rho / 2) ||x - x_tau||^2 (FedProx's
solver, mu = rho). ``normalize`` replaces Delta by tau_eff Delta / ||a||_1
(FedNova, arXiv:2007.07481; tau_eff a running mean). In a synchronous round
the server mixes in the data-weighted mean of the round's models.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, ClassVar, Literal, cast

from pydantic import Field

import fedsim.algorithms.base as base
import fedsim.algorithms.weighting as weighting
from fedsim.algorithms.base import PLAIN_ROUND, RoundContext, ServerState, Updates
from fedsim.lazy import torch
from fedsim.params import chi2
from fedsim.solvers import SGD, make_solver
from fedsim.spec import NonNegFloat, PosFloat

if TYPE_CHECKING:
    from fedsim.spec import ClientSpec

Staleness = Literal["constant", "polynomial", "hinge"]


def staleness_weight(kind: Staleness, s: int, a: float = 0.5, b: float = 4) -> float:
    """S(s), the weight of an update of staleness ``s`` (FedAsync, section 5.2)."""
    if s < 0:
        raise ValueError(f"staleness must be >= 0, got {s}")
    if kind == "constant":
        return 1.0
    if kind == "polynomial":
        return float((1.0 + s) ** (-a))
    if kind == "hinge":
        return 1.0 if s <= b else 1.0 / (a * (s - b) + 1.0)
    raise ValueError(f"unknown staleness function {kind!r}")


@dataclass(frozen=True)
class _Normalized(base.Algorithm):
    """Hyperparameters both async rules share: S(s) and FedNova normalisation.
    Each subclass writes ``aggregate_async`` (a :class:`base.AsyncRule`),
    which :meth:`aggregate` calls with the version's staleness and starts."""

    staleness: Staleness = "polynomial"
    staleness_a: NonNegFloat = 0.5
    staleness_b: NonNegFloat = 4.0
    normalize: bool = False
    tau_eff: weighting.TauEff = "fedavg"
    tau_eff_value: PosFloat | None = None

    def __post_init__(self) -> None:
        if self.tau_eff == "fixed" and self.tau_eff_value is None:
            raise ValueError("tau_eff 'fixed' needs tau_eff_value")

    def weight(self, s: int) -> float:
        return staleness_weight(self.staleness, s, self.staleness_a, self.staleness_b)

    def scales(self, updates: Updates, tau_eff: float) -> tuple[list[float], float]:
        """Factor on each Delta (tau_eff / ||a_i||_1 under ``normalize``, else
        1) and the tau_eff to report (sum_i p_i ||a_i||_1 if not normalising)."""
        norm_a = [u.norm_a for u in updates]
        if self.normalize:
            return weighting.normalizers([tau_eff] * len(updates), norm_a), tau_eff
        p = base.data_weights(updates)
        return [1.0] * len(updates), weighting.weighted_steps(p, norm_a)

    def _meter(
        self, updates: Updates, coef: Sequence[float], tau_eff: float
    ) -> base.AggregateInfo:
        """Effective weights ``coef`` (times ||a_i||_1 unless normalising)."""
        steps = [1.0 if self.normalize else u.norm_a for u in updates]
        w = [c * a for c, a in zip(coef, steps, strict=True)]
        sw = float(sum(w))
        per = tuple(float(wi) / sw if sw > 0 else 0.0 for wi in w)
        weights: dict[int, float] = {}
        for u, wi in zip(updates, per, strict=True):
            weights[u.client] = weights.get(u.client, 0.0) + wi
        chi2_pw = chi2(base.data_weights(updates), w) if sw > 0 else float("nan")
        return base.AggregateInfo(weights, float(tau_eff), chi2_pw, per_update=per)

    def aggregate(
        self, state: ServerState, updates: Updates, ctx: RoundContext = PLAIN_ROUND
    ) -> tuple[ServerState, base.AggregateInfo]:
        """An asynchronous version (``ctx.staleness`` and ``ctx.starts``), or
        a synchronous round: staleness 0, every update started from x."""
        n = len(updates)
        staleness = ctx.staleness if ctx.staleness is not None else (0,) * n
        starts = ctx.starts if ctx.starts is not None else (state["x"],) * n
        # each subclass is a base.AsyncRule: it defines aggregate_async
        rule = cast(base.AsyncRule, self)
        return rule.aggregate_async(state, updates, staleness, starts)


@dataclass(frozen=True)
class FedAsync(_Normalized):
    """Mix each arriving client model into the global one, x <- (1 - a) x + a x_i.

    Example (hinge staleness 6 > b = 4: S = 1/21):
        >>> alg = FedAsync(alpha=0.5, staleness="hinge", staleness_a=10)
        >>> state = alg.init(torch.zeros(1), 2)
        >>> from fedsim.algorithms.base import ClientUpdate
        >>> u = ClientUpdate(0, torch.tensor([2.1]), 1, 3, 3.0, 0.0)
        >>> state, info = alg.aggregate_async(state, [u], [6], [torch.ones(1)])
        >>> round(float(state["x"]), 6)     # 0.5/21 * (1 + 2.1 - 0)
        0.07381
    """

    name: Literal["fedasync"] = "fedasync"
    alpha: Annotated[float, Field(gt=0, le=1)] = 0.6
    rho: NonNegFloat = 0.005

    buffer_size: ClassVar[int] = 1

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.server_lr != 1.0:
            raise ValueError("FedAsync's step size is alpha; leave server_lr at 1")

    def solver(self, client: ClientSpec) -> SGD:
        return make_solver(client, mu=self.rho)

    def init(self, x0: torch.Tensor, num_clients: int) -> ServerState:
        zero = torch.zeros((), dtype=torch.float64)
        # Running sums for tau_eff under ``normalize``: sum ||a||_1, sum tau, count.
        return {"x": x0.clone(), "norm_a_sum": zero, "steps_sum": zero, "count": zero}

    @base.skip_empty_rounds
    def aggregate_async(
        self,
        state: ServerState,
        updates: Updates,
        staleness: Sequence[int],
        starts: Sequence[torch.Tensor],
    ) -> tuple[ServerState, base.AggregateInfo]:
        """x <- x + sum_i p_i alpha S(s_i) (x_start_i + c_i Delta_i - x)."""
        count = state["count"] + len(updates)
        norm_a_sum = state["norm_a_sum"] + sum(u.norm_a for u in updates)
        steps_sum = state["steps_sum"] + sum(u.tau for u in updates)
        means = [float(norm_a_sum / count)], [float(steps_sum / count)]
        fixed = self.tau_eff_value
        running = weighting.effective_steps(self.tau_eff, [1.0], *means, fixed)
        scale, tau_eff = self.scales(updates, running)
        weighted = zip(base.data_weights(updates), staleness, strict=True)
        mix = [pi * self.alpha * self.weight(s) for pi, s in weighted]
        x64 = state["x"].to(torch.float64)
        step = torch.zeros_like(x64)
        for u, start, c, m in zip(updates, starts, scale, mix, strict=True):
            client_model = start.to(torch.float64) + c * u.delta.to(torch.float64)
            step.add_(client_model - x64, alpha=m)
        x = (x64 + step).to(state["x"].dtype)
        sums = {"norm_a_sum": norm_a_sum, "steps_sum": steps_sum, "count": count}
        return {"x": x, **sums}, self._meter(updates, mix, tau_eff)
