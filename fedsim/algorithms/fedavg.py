"""FedAvg.

Communication-Efficient Learning of Deep Networks from Decentralized Data.
H. Brendan McMahan, Eider Moore, Daniel Ramage, Seth Hampson, Blaise Agüera y
Arcas. AISTATS 2017. arXiv:1602.05629.

x^{t+1} = x^t + server_lr * sum_{i in S} w_i Delta_i, w_i by ``sampling``
(docs/algorithms.md 3). Server optimizers (FedAvgM, FedAdam) override
:meth:`FedAvg.apply_step`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

import fedsim.algorithms.base as base
from fedsim.algorithms.base import PLAIN_ROUND, RoundContext, ServerState, Updates
from fedsim.algorithms.sampling import Sampled, sampling_weights
from fedsim.algorithms.weighting import weighted_steps
from fedsim.lazy import torch
from fedsim.params import weighted_sum


@dataclass(frozen=True)
class FedAvg(Sampled):
    """Weighted average of client deltas; the meter reports the effective
    weights p_i ||a_i||_1 (FedNova's view, docs/algorithms.md 5.1).

    >>> from fedsim.algorithms.base import ClientUpdate
    >>> ups = [ClientUpdate(0, torch.tensor([1.0]), 1, 2, 2.0, 0.0),
    ...        ClientUpdate(1, torch.tensor([3.0]), 3, 6, 6.0, 0.0)]
    >>> state, info = FedAvg().aggregate({"x": torch.zeros(1)}, ups)
    >>> state["x"], info.tau_eff
    (tensor([2.5000]), 5.0)
    """

    name: Literal["fedavg"] = "fedavg"
    # the step is sum_i w_i delta_i (a server optimiser may follow): DP may
    # clip and noise it (fedsim/privacy.py)
    sums_updates: ClassVar[bool] = True

    def step_weights(self, updates: Updates) -> list[float]:
        """w_i by ``sampling`` (the weights :meth:`aggregate` sums with)."""
        return sampling_weights(updates, self.sampling)

    def apply_step(self, state: ServerState, step: torch.Tensor) -> ServerState:
        """The new server state from the weighted average delta ``step``."""
        return {**state, "x": state["x"] + self.server_lr * step}

    @base.skip_empty_rounds
    def aggregate(
        self, state: ServerState, updates: Updates, ctx: RoundContext = PLAIN_ROUND
    ) -> tuple[ServerState, base.AggregateInfo]:
        wh = self.step_weights(updates)
        step = weighted_sum([u.delta for u in updates], wh)
        w = [wi * u.norm_a for wi, u in zip(wh, updates, strict=True)]
        tau_eff = weighted_steps(wh, [u.norm_a for u in updates])
        return self.apply_step(state, step), base.meter(updates, w, tau_eff, wh)
