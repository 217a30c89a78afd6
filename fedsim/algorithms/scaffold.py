"""SCAFFOLD, option II.

SCAFFOLD: Stochastic Controlled Averaging for Federated Learning. Sai Praneeth
Karimireddy, Satyen Kale, Mehryar Mohri, Sashank J. Reddi, Sebastian U. Stich,
Ananda Theertha Suresh. ICML 2020. arXiv:1910.06378.

docs/algorithms.md section 7. Client i runs tau steps on g_i(y) - c_i + c, sets
c_i^+ = c_i - c + (x - y) / (lr ||a_i||_1) and uploads (y - x, c_i^+ - c_i).
Server: x <- x + server_lr mean_S Delta y_i, c <- c + (1/m) sum_S Delta c_i.
Meter: w_i = 1/|S| (SCAFFOLD targets the unweighted mean).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import fedsim.algorithms.base as base
from fedsim.algorithms.base import PLAIN_ROUND, RoundContext, ServerState, Updates
from fedsim.algorithms.control import ControlVariates, control_aggregate
from fedsim.algorithms.sampling import unweighted_meter
from fedsim.lazy import torch
from fedsim.params import weighted_sum


@dataclass(frozen=True)
class Scaffold(ControlVariates):
    """Stochastic controlled averaging (option II): the server steps on the
    unweighted mean delta and keeps c = (1/m) sum_i c_i.

    >>> alg = Scaffold()
    >>> state = alg.init(torch.zeros(2), num_clients=10)
    >>> sorted(state), alg.stateful, alg.up_factor
    (['c', 'm', 'x'], True, 2)
    """

    name: Literal["scaffold"] = "scaffold"

    def init(self, x0: torch.Tensor, num_clients: int) -> ServerState:
        m = torch.tensor(float(num_clients), dtype=torch.float64)
        return {**super().init(x0, num_clients), "m": m}

    @base.skip_empty_rounds
    def aggregate(
        self, state: ServerState, updates: Updates, ctx: RoundContext = PLAIN_ROUND
    ) -> tuple[ServerState, base.AggregateInfo]:
        n = len(updates)
        step = weighted_sum([u.delta for u in updates], [1.0 / n] * n)
        c = control_aggregate(state, updates, [1.0 / float(state["m"])] * n)
        new = {**state, "x": state["x"] + self.server_lr * step, "c": c}
        return new, unweighted_meter(updates)
