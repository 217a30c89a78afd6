"""FedAvg.

Communication-Efficient Learning of Deep Networks from Decentralized Data.
H. Brendan McMahan, Eider Moore, Daniel Ramage, Seth Hampson, Blaise Agüera y
Arcas. AISTATS 2017. arXiv:1602.05629.

Server: x^{t+1} = x^t + server_lr * sum_{i in S} w_i Delta_i. The weights w_i
depend on how the selector sampled S (``sampling``, see
:mod:`fedsim.algorithms.sampling` and ALGORITHMS.md section 3):
``renormalized`` p_i = n_i / sum_S n_j (the reference codes' practice, the
default), ``uniform`` p_i m / q (unbiased scheme (ii)) or ``proportional``
k_i / q (unbiased scheme (i); needs a selector with replacement).

Seen through FedNova's lens (ALGORITHMS.md 5.1), update i effectively gets
weight proportional to p_i ||a_i||_1, so clients that took more local steps
pull the model toward their own objective; the meter reports that weight and
chi^2(p || w).

Server optimizers (FedAvgM, FedAdam) derive from this class and override
only :meth:`FedAvg.apply_step`, which turns the averaged delta into the new
server state.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from fedsim.algorithms.base import (
    AggregateInfo,
    ClientUpdate,
    ServerState,
    data_weights,
    meter,
    skip_empty_rounds,
)
from fedsim.algorithms.sampling import Sampled, sampling_weights
from fedsim.algorithms.weighting import weighted_steps
from fedsim.lazy import torch
from fedsim.params import weighted_sum

__all__ = ["FedAvg"]


@dataclass(frozen=True)
class FedAvg(Sampled):
    """Weighted average of client deltas.

    Attributes:
        sampling: how the round's updates are weighted given how the selector
            sampled them (``renormalized``, ``uniform``, ``proportional``).

    Example:
        >>> ups = [ClientUpdate(0, torch.tensor([1.0]), 1, 2, 2.0, 0.0),
        ...        ClientUpdate(1, torch.tensor([3.0]), 3, 6, 6.0, 0.0)]
        >>> state, info = FedAvg().aggregate({"x": torch.zeros(1)}, ups)
        >>> state["x"], info.tau_eff
        (tensor([2.5000]), 5.0)
    """

    name: Literal["fedavg"] = "fedavg"

    def apply_step(self, state: ServerState, step: torch.Tensor) -> ServerState:
        """The new server state from the weighted average delta ``step``."""
        return {**state, "x": state["x"] + self.server_lr * step}

    @skip_empty_rounds
    def aggregate(
        self, state: ServerState, updates: Sequence[ClientUpdate]
    ) -> tuple[ServerState, AggregateInfo]:
        p = data_weights(updates)
        wh = sampling_weights(updates, self.sampling)
        step = weighted_sum([u.delta for u in updates], wh)
        w = [wi * u.norm_a for wi, u in zip(wh, updates, strict=True)]
        tau_eff = weighted_steps(wh, [u.norm_a for u in updates])
        return self.apply_step(state, step), meter(updates, p, w, tau_eff, wh)
