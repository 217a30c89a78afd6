"""FedPNS: Optimal Aggregation (the server half of FedPNS).

Node Selection Toward Faster Convergence for Federated Learning on Non-IID
Data. Hongda Wu, Ping Wang. IEEE Transactions on Network Science and
Engineering, 2022. arXiv:2105.07066.

docs/algorithms.md 11.2, as the reference code (``models/Fed.py``, ``Feddel``). With
g_i = -Delta_i / (lr ||a_i||_1) and E(S) = sum_{i in S} <g_i, mean_S g>, while
|S| > v: CHECK EXPECTATION labels the i* maximising E(S \\ {i}) if that exceeds
E(S), CHECK LOSS removes it unless S's mean model has the lower validation loss
(either failing stops). x <- x^t + server_lr mean_S Delta_i. The ``labeled`` and
``removed`` flags go to clients.parquet, and to the FedPNS selector as
:class:`Labels`; details: docs/fedpns-feddm.md.

:func:`optimal_aggregation` is the search on gradient estimates alone (no
model, no data); :meth:`FedPNS.aggregate` turns the updates into those
estimates and gives CHECK LOSS the server's validation loss. The client half,
choosing who trains, is :mod:`fedsim.selectors.fedpns`.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import ClassVar, Literal

import fedsim.algorithms.base as base
from fedsim.algorithms.base import AggregateInfo, ServerContext, ServerState, Updates
from fedsim.algorithms.weighting import lr_upload, updates_tau_eff
from fedsim.lazy import torch
from fedsim.params import weighted_sum
from fedsim.solvers import SolverState, average_gradient
from fedsim.spec import PosInt, Prob


@dataclass(frozen=True)
class Labels:
    """What a FedPNS round tells the FedPNS selector (``AggregateInfo.signal``):
    the client ids labeled adverse, and those of them removed."""

    labeled: frozenset[int] = frozenset()
    removed: frozenset[int] = frozenset()


def expectation(gram: torch.Tensor, members: Sequence[int]) -> float:
    """E(S) = ||sum_S g||^2 / |S|, from the gradients' Gram matrix (float64).

    Args:
        gram: ``gram[i, j] = <g_i, g_j>`` over every update of the round.
        members: The positions in S; E of the empty set is 0.
    """
    if not members:
        return 0.0
    idx = torch.as_tensor(list(members))
    return float(gram[idx][:, idx].sum()) / len(members)


def optimal_aggregation(
    grads: Sequence[torch.Tensor],
    v: int,
    check_loss: Callable[[list[int], int], bool] | None = None,
) -> tuple[list[int], list[int], list[int]]:
    """CHECK EXPECTATION / CHECK LOSS on the round's gradient estimates while
    more than ``v`` remain (the module docstring).

    Args:
        grads: One gradient estimate per update, in update order.
        v: The fewest updates kept.
        check_loss: ``check_loss(S, i)`` is True to remove i from S (positions);
            None labels at most one update and removes none.

    Returns:
        (kept, labeled, removed) positions into ``grads``, in order: an update
        labeled but kept is the one CHECK LOSS refused to remove.
    """
    if not grads:
        return [], [], []
    # float64: E(S) differences between candidates can be below float32's
    # resolution, and the search must not depend on the model dtype
    g = torch.stack([x.to(torch.float64).reshape(-1) for x in grads])
    gram = g @ g.T
    members = list(range(len(grads)))
    labeled, removed = [], []
    e_all = expectation(gram, members)
    while len(members) > v:
        best, e_best = _most_adverse(gram, members)
        if e_best <= e_all:
            break
        labeled.append(best)
        if check_loss is None or not check_loss(list(members), best):
            break
        removed.append(best)
        members.remove(best)
        e_all = e_best
    return members, labeled, removed


def _most_adverse(gram: torch.Tensor, members: list[int]) -> tuple[int, float]:
    """The member i whose removal gives the largest E(S \\ {i}), and that E;
    the first maximiser in update order wins a tie."""
    best, e_best = -1, -math.inf
    for i in members:
        e = expectation(gram, [j for j in members if j != i])
        if e > e_best:
            best, e_best = i, e
    return best, e_best


@dataclass(frozen=True)
class FedPNS(base.Algorithm):
    """Optimal Aggregation: drop updates that pull against the others.

    >>> from fedsim.algorithms.base import ClientUpdate
    >>> ups = [ClientUpdate(i, torch.tensor([-0.1]), 1.0, 1, 1.0, 0.0,
    ...        {"lr": torch.tensor(0.1)}) for i in range(3)]
    >>> state, info = FedPNS().aggregate({"x": torch.zeros(1)}, ups)
    >>> state["x"], info.flags[0]
    (tensor([-0.1000]), {'labeled': False, 'removed': False})
    """

    name: Literal["fedpns"] = "fedpns"
    v: PosInt | None = None  # keep at least v updates (None: v_fraction |S_t|)
    v_fraction: Prob = 0.8
    # CHECK LOSS on the validation split, or the test set (opt-in, optimistic)
    check_loss_data: Literal["validation", "test"] = "validation"

    # CHECK LOSS scores candidate aggregates on the server's validation data
    server_needs: ClassVar[frozenset[str]] = frozenset({"validation_loss"})

    def threshold(self, n: int) -> int:
        """The fewest updates kept out of ``n``: ``v``, else ``v_fraction`` n
        rounded down (at least 1)."""
        if self.v is not None:
            return int(self.v)
        return max(1, math.floor(self.v_fraction * n))

    def validation_use(self, clients_per_round: int) -> str | None:
        """CHECK LOSS data in rounds of <= ``clients_per_round`` (None: never)."""
        if all(self.threshold(n) >= n for n in range(1, clients_per_round + 1)):
            return None
        return self.check_loss_data

    def client_finish(
        self, delta: torch.Tensor, solver_state: SolverState, client: base.ClientContext
    ) -> base.ClientResult:
        """The update plus the client's learning rate: the server needs it to
        turn Delta_i into a gradient estimate g_i."""
        return lr_upload(solver_state), None

    def aggregate(
        self,
        state: ServerState,
        updates: Updates,
        ctx: base.RoundContext = base.PLAIN_ROUND,
    ) -> tuple[ServerState, AggregateInfo]:
        """Optimal Aggregation over the round's updates, then the mean step.

        Args:
            state: ``x``, the global model.
            updates: The round's updates; one with no steps (``norm_a`` 0) has
                no gradient estimate and is left out.
            ctx: ``ctx.server`` gives CHECK LOSS its validation loss; without
                it no update is removed (the first adverse one is only
                labeled).

        Returns:
            ``x`` moved by ``server_lr`` times the kept updates' plain mean, and
            the meter of the kept updates with per-client ``labeled`` /
            ``removed`` flags and :class:`Labels` as the selector's signal.
        """
        live = [u for u in updates if u.norm_a > 0]
        if not live:
            return state, base.empty_info()
        grads = [  # lr: the client's own (1 if it uploaded none)
            average_gradient(u.delta, float(u.extras.get("lr", 1.0)), u.norm_a)
            for u in live
        ]

        # cached: after a removal the next CHECK LOSS starts from the set scored
        @functools.cache
        def mean_model(members: tuple[int, ...]) -> torch.Tensor:
            n = len(members)
            step = weighted_sum([live[j].delta for j in members], [1.0 / n] * n)
            return state["x"] + self.server_lr * step

        server = ctx.server
        check = None if server is None else _loss_check(server, mean_model)
        v = self.threshold(len(live))
        kept, labeled, removed = optimal_aggregation(grads, v, check)
        ups = [live[j] for j in kept]
        ones = [1.0] * len(ups)
        info = base.meter(ups, ones, updates_tau_eff("fedavg", ones, ups))
        info = base.meter_subset(updates, info)
        flags, labels = _verdicts(live, labeled, removed)
        return {**state, "x": mean_model(tuple(kept))}, replace(
            info, flags=flags, signal=labels
        )


def _verdicts(
    live: Sequence[base.ClientUpdate], labeled: list[int], removed: list[int]
) -> tuple[dict[int, dict[str, base.Flag]], Labels]:
    """The round's verdicts by client id, from positions into ``live``: the
    per-client flags (clients.parquet) and the selector's :class:`Labels`."""
    # the round's clients are distinct (FedPNS has no async rule)
    flags: dict[int, dict[str, base.Flag]] = {
        u.client: {"labeled": j in labeled, "removed": j in removed}
        for j, u in enumerate(live)
    }
    labels = Labels(
        frozenset(live[j].client for j in labeled),
        frozenset(live[j].client for j in removed),
    )
    return flags, labels


def _loss_check(
    server: ServerContext, mean_model: Callable[[tuple[int, ...]], torch.Tensor]
) -> Callable[[list[int], int], bool]:
    """CHECK LOSS: remove i from S unless S's mean model (``mean_model``) has
    a lower validation loss than that of S without i. Each set's loss is
    computed once (the next check starts from the set just scored)."""

    @functools.cache
    def loss(members: tuple[int, ...]) -> float:
        return server.validation_loss(mean_model(members))

    def check(members: list[int], i: int) -> bool:
        rest = tuple(j for j in members if j != i)
        return not loss(tuple(members)) < loss(rest)

    return check
