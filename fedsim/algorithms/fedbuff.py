"""FedBuff.

Federated Learning with Buffered Asynchronous Aggregation. John Nguyen,
Kshitiz Malik, Hongyuan Zhan, Ashkan Yousefpour, Michael Rabbat, Mani Malek,
Dzmitry Huba. AISTATS 2022. arXiv:2106.06639.

Server (Algorithm 1): every K = ``buffer_size`` accepted arrivals (one clock
version) make one step, each weighted by a FedAsync staleness function S:

    x <- x + server_lr * (1/K) sum_k S(s_k) Delta_k

``normalize`` composes FedNova's normalisation over the buffer. In a
synchronous round FedBuff is FedAvg with equal weights 1/|S|.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import fedsim.algorithms.base as base
from fedsim.algorithms.fedasync import _Normalized
from fedsim.algorithms.weighting import updates_tau_eff
from fedsim.lazy import torch
from fedsim.params import weighted_sum
from fedsim.spec import PosInt


@dataclass(frozen=True)
class FedBuff(_Normalized):
    """Average a buffer of K staleness-weighted deltas, then take a server step.

    Example (K = 2, staleness 0 and 3, S = (1 + s)^-1/2):
        >>> from fedsim.algorithms.base import ClientUpdate
        >>> alg = FedBuff(buffer_size=2)
        >>> ups = [ClientUpdate(0, torch.tensor([1.0]), 1, 2, 2.0, 0.0),
        ...        ClientUpdate(1, torch.tensor([4.0]), 1, 2, 2.0, 0.0)]
        >>> state, info = alg.aggregate_async({"x": torch.zeros(1)}, ups, [0, 3],
        ...                                   [torch.zeros(1)] * 2)
        >>> state["x"], info.per_update      # (1 * 1 + 0.5 * 4) / 2
        (tensor([1.5000]), (0.6666666666666666, 0.3333333333333333))
    """

    name: Literal["fedbuff"] = "fedbuff"
    buffer_size: PosInt = 10

    @base.skip_empty_rounds
    def aggregate_async(
        self,
        state: base.ServerState,
        updates: base.Updates,
        staleness: Sequence[int],
        starts: Sequence[torch.Tensor] = (),
    ) -> tuple[base.ServerState, base.AggregateInfo]:
        """x <- x + server_lr (1/K) sum_k S(s_k) c_k Delta_k (``starts`` unused)."""
        k = len(updates)
        mean = updates_tau_eff(self.tau_eff, [1.0] * k, updates, self.tau_eff_value)
        scale, tau_eff = self.scales(updates, mean)
        s = [self.weight(si) for si in staleness]
        coef = [si * c / k for si, c in zip(s, scale, strict=True)]
        step = weighted_sum([u.delta for u in updates], coef)
        new = {**state, "x": state["x"] + self.server_lr * step}
        return new, self._meter(updates, [si / k for si in s], tau_eff)
