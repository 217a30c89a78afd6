"""SCAFFOLD, option II.

SCAFFOLD: Stochastic Controlled Averaging for Federated Learning. Sai Praneeth
Karimireddy, Satyen Kale, Mehryar Mohri, Sashank J. Reddi, Sebastian U. Stich,
Ananda Theertha Suresh. ICML 2020. arXiv:1910.06378.

ALGORITHMS.md section 7. Server state x and c; client state c_i (persistent
in the server's client store, initially 0, kept however long the client sits
out). Each selected client:

1. y <- x; tau local steps on g_i(y) - c_i + c (the correction is added to the
   minibatch gradient before the local solver);
2. c_i^+ = c_i - c + (x - y) / (lr ||a_i||_1)   (option II; ||a_i||_1 = K for
   plain SGD, so this is the paper's 1 / (K lr) with the client's own K);
3. uploads (Delta y_i, Delta c_i) = (y - x, c_i^+ - c_i).

Server: x <- x + server_lr * (1/|S|) sum_S Delta y_i and c <- c + (1/m) sum_S
Delta c_i, so c = (1/m) sum_i c_i after every round, for any participation.

Differences from the reference code (FedDyn/FedDC repositories): the code
uses the average client's K and the initial lr in step 2, scales c by the
client's relative data weight n_i m / n, and clips gradients at norm 10; with
balanced data and equal K these are the same algorithm (clipping aside).

Meter: the server mean is unweighted, and the control variates make SCAFFOLD
converge to the minimiser of the unweighted mean (1/|S|) sum F_i whatever the
local steps, so each update's effective weight is w_i = 1/|S|; tau_eff is the
mean ||a_i||_1.

Communication: 2d down (x, c), 2d up.
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
    skip_empty_rounds,
)
from fedsim.algorithms.control import (
    ControlVariates,
    control_aggregate,
    control_step,
)
from fedsim.algorithms.sampling import unweighted_meter
from fedsim.lazy import torch
from fedsim.params import weighted_sum

if TYPE_CHECKING:
    from fedsim.solvers import SolverState

__all__ = ["Scaffold"]


@dataclass(frozen=True)
class Scaffold(ControlVariates):
    """Stochastic controlled averaging (option II).

    Attributes:
        server_lr: the server's step on the unweighted mean delta.

    Example:
        >>> alg = Scaffold()
        >>> state = alg.init(torch.zeros(2), num_clients=10)
        >>> sorted(state), alg.stateful, alg.up_factor
        (['c', 'm', 'x'], True, 2)
    """

    name: Literal["scaffold"] = "scaffold"

    def init(self, x0: torch.Tensor, num_clients: int) -> ServerState:
        m = torch.tensor(float(num_clients), dtype=torch.float64)
        return {**super().init(x0, num_clients), "m": m}

    def client_finish(
        self, delta: torch.Tensor, solver_state: SolverState, client: ClientContext
    ) -> ClientResult:
        # c_i - c + (x - y)/(K lr), with client.local = c - c_i
        c_i, c_new = control_step(delta, solver_state, client.local, client.state)
        return {"dc": c_new - c_i}, {"c": c_new}

    @skip_empty_rounds
    def aggregate(
        self, state: ServerState, updates: Sequence[ClientUpdate]
    ) -> tuple[ServerState, AggregateInfo]:
        n = len(updates)
        step = weighted_sum([u.delta for u in updates], [1.0 / n] * n)
        m = float(state["m"])
        new = {
            **state,
            "x": state["x"] + self.server_lr * step,
            "c": control_aggregate(state, updates, [1.0 / m] * n),
        }
        return new, unweighted_meter(updates)
