"""FedPNS: Optimal Aggregation (the server half of FedPNS).

Node Selection Toward Faster Convergence for Federated Learning on Non-IID
Data. Hongda Wu, Ping Wang. IEEE Transactions on Network Science and
Engineering, 2022. arXiv:2105.07066.

ALGORITHMS.md section 11.2, as the reference code (``models/Fed.py``,
``Feddel``) runs it. Clients run plain local SGD and upload their delta (and
their learning rate); the server estimates each node's average gradient
g_i = -Delta_i / (lr ||a_i||_1) (= (x^t - x_i^+) / (lr tau_i) for SGD) and,
starting from S = the round's updates, repeats while |S| > v:

1. CHECK EXPECTATION: E(S) = sum_{i in S} <g_i, mean_S g> = |S| ||mean_S g||^2.
   Let i* maximise E(S \\ {i}). If E(S \\ {i*}) <= E(S), stop: no adverse
   update remains. Otherwise i* is *labeled*.
2. CHECK LOSS: compare the validation loss of the unweighted average of the
   models in S with that of S \\ {i*} (``ServerContext.validation_loss``). If
   the full set is better, keep i* and stop; else *remove* i* and go on.

The new model is x^t + server_lr * mean_{i in S} Delta_i (unweighted, as
the code averages the retained models). At most |S_t| - v updates are
removed; v is ``v``, or floor(``v_fraction`` |S_t|) (8 of 10 as in the code).

Each update's ``labeled`` and ``removed`` flags go to ``clients.parquet``
(``AggregateInfo.flags``); the ``fedpns`` selector
(:mod:`fedsim.selectors.fedpns`) reads them to lower the selection
probability of nodes that are often labeled.

Differences from the reference code: inner products are exact (the code
rounds each to 2 decimals and E to 3, which makes tiny improvements count as
none); the two CHECK LOSS models are computed from pristine deltas (the
code's averaging helper mutates the first client's weights). The code's lr
decay across rounds, max(0.995^t, 0.01) lr, is the scenario's
``client.lr_decay`` / ``lr_min`` (set in the paper scenario); each client
uploads its round's lr, so g_i uses the lr it actually trained with.
Updates of clients that took no step carry no gradient: they are kept out of
the checks and the average (weight 0), and flagged neither labeled nor
removed. Called without a server (``server=None``), CHECK LOSS cannot run:
updates are labeled but never removed.

CHECK LOSS data: the server's validation split, rows taken from the
clients' training data (``data.validation_fraction``, see
:mod:`fedsim.data.validation`); a scenario whose CHECK LOSS can run without
one is refused. ``check_loss_data: test`` scores on the test set instead,
as the paper's code does (its first 2000 test images): the reported test
metrics are then optimistic, since the test set took part in choosing the
model, and summary.json's ``server_validation`` says so.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from fedsim.algorithms.base import (
    AggregateInfo,
    Algorithm,
    ClientContext,
    ClientResult,
    ClientUpdate,
    ServerContext,
    ServerState,
    Updates,
    empty_info,
    meter_subset,
)
from fedsim.algorithms.weighting import lr_upload, updates_tau_eff, uploaded_lr
from fedsim.lazy import torch
from fedsim.params import weighted_sum
from fedsim.solvers import average_gradient
from fedsim.spec import PosInt, Prob

if TYPE_CHECKING:
    from fedsim.solvers import SolverState

__all__ = ["FedPNS", "expectation", "optimal_aggregation"]


def expectation(gram: torch.Tensor, members: Sequence[int]) -> float:
    """E(S) = sum_{i in S} <g_i, mean_S g> = ||sum_S g||^2 / |S|, from the
    Gram matrix ``gram`` (float64) of the gradients.

    >>> g = torch.tensor([[1.0, 0.0], [1.0, 2.0]], dtype=torch.float64)
    >>> expectation(g @ g.T, [0, 1])   # 2 * ||(1, 1)||^2
    4.0
    """
    if not members:
        return 0.0
    idx = torch.as_tensor(list(members))
    return float(gram[idx][:, idx].sum()) / len(members)


def optimal_aggregation(
    grads: Sequence[torch.Tensor],
    v: int,
    check_loss: Any = None,
) -> tuple[list[int], list[int], list[int]]:
    """Run CHECK EXPECTATION / CHECK LOSS on gradient estimates.

    Args:
        grads: g_i of the round's updates (in update order).
        v: threshold; removals continue only while |S| > v.
        check_loss: ``check_loss(S, i)`` -> True to remove i from S (the
            validation loss of S \\ {i} is at most that of S); None never
            removes.

    Returns:
        (kept, labeled, removed): positions into ``grads``; ``labeled`` in
        the order they were labeled.

    Example:
        >>> g = [torch.tensor([1.0, 0.0])] * 3 + [torch.tensor([-1.0, 0.0])]
        >>> optimal_aggregation(g, v=2, check_loss=lambda s, i: True)
        ([0, 1, 2], [3], [3])
    """
    n = len(grads)
    if n == 0:
        return [], [], []
    g = torch.stack([x.to(torch.float64).reshape(-1) for x in grads])
    gram = g @ g.T
    members = list(range(n))
    labeled: list[int] = []
    removed: list[int] = []
    e_all = expectation(gram, members)
    while len(members) > v:
        # E(S \ {i}) for every i; the first maximiser in update order wins
        best, e_best = -1, -math.inf
        for i in members:
            e = expectation(gram, [j for j in members if j != i])
            if e > e_best:
                best, e_best = i, e
        if e_best <= e_all:
            break
        labeled.append(best)
        if check_loss is None or not check_loss(list(members), best):
            break
        removed.append(best)
        members.remove(best)
        e_all = e_best
    return members, labeled, removed


@dataclass(frozen=True)
class FedPNS(Algorithm):
    """Optimal Aggregation: drop updates that pull against the others.

    Attributes:
        v: keep at least this many updates (None: floor(v_fraction |S_t|),
            at least 1).
        v_fraction: v as a fraction of the round's updates (the code's 8 of 10).
        check_loss_data: the data CHECK LOSS scores on: ``validation`` (the
            server's validation split) or ``test`` (the test set: an opt-in,
            optimistic).

    Example:
        >>> ups = [ClientUpdate(i, torch.tensor([-0.1]), 1.0, 1, 1.0, 0.0,
        ...        {"lr": torch.tensor(0.1)}) for i in range(3)]
        >>> state, info = FedPNS().aggregate({"x": torch.zeros(1)}, ups)
        >>> state["x"], info.flags[0]
        (tensor([-0.1000]), {'labeled': False, 'removed': False})
    """

    name: Literal["fedpns"] = "fedpns"
    v: PosInt | None = None
    v_fraction: Prob = 0.8
    check_loss_data: Literal["validation", "test"] = "validation"

    needs_server: ClassVar[bool] = True

    def threshold(self, n: int) -> int:
        """v for a round with ``n`` updates."""
        if self.v is not None:
            return int(self.v)
        return max(1, math.floor(self.v_fraction * n))

    def validation_use(self, clients_per_round: int) -> str | None:
        """The data CHECK LOSS scores on in rounds of at most
        ``clients_per_round`` updates; None when it never runs (the
        threshold keeps every update of every such round).

        >>> FedPNS(v=8).validation_use(10), FedPNS(v=10).validation_use(10)
        ('validation', None)
        """
        if all(self.threshold(n) >= n for n in range(1, clients_per_round + 1)):
            return None
        return self.check_loss_data

    def client_finish(
        self, delta: torch.Tensor, solver_state: SolverState, client: ClientContext
    ) -> ClientResult:
        return lr_upload(solver_state), None

    def aggregate(
        self, state: ServerState, updates: Updates, server: ServerContext | None = None
    ) -> tuple[ServerState, AggregateInfo]:
        live = [u for u in updates if u.norm_a > 0]
        if not live:
            return state, empty_info()
        x = state["x"]
        grads = [average_gradient(u.delta, _lr(u), u.norm_a) for u in live]

        # a set's mean model and validation loss, computed once per aggregate:
        # after a removal the next CHECK LOSS starts from the set just scored
        models: dict[tuple[int, ...], torch.Tensor] = {}
        losses: dict[tuple[int, ...], float] = {}

        def mean_model(members: Sequence[int]) -> torch.Tensor:
            key = tuple(members)
            if key not in models:
                n = len(members)
                step = weighted_sum([live[j].delta for j in members], [1.0 / n] * n)
                models[key] = x + self.server_lr * step
            return models[key]

        check = None
        if server is not None:

            def loss(members: Sequence[int]) -> float:
                key = tuple(members)
                if key not in losses:
                    losses[key] = server.validation_loss(mean_model(members))
                return losses[key]

            def check(members: list[int], i: int) -> bool:
                rest = [j for j in members if j != i]
                return not loss(members) < loss(rest)

        kept, labeled, removed = optimal_aggregation(
            grads, self.threshold(len(live)), check
        )
        new_x = mean_model(kept)
        ups = [live[j] for j in kept]
        n = len(ups)
        tau_eff = updates_tau_eff("fedavg", [1.0] * n, ups)
        lab = {live[j].client for j in labeled}
        rem = {live[j].client for j in removed}
        flags = {
            u.client: {"labeled": u.client in lab, "removed": u.client in rem}
            for u in live
        }
        info = meter_subset(updates, ups, [1.0] * n, tau_eff, flags)
        return {**state, "x": new_x}, info


def _lr(u: ClientUpdate) -> float:
    lr = uploaded_lr(u)
    return 1.0 if lr is None else lr
