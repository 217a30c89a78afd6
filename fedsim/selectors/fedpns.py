"""FedPNS probabilistic node selection.

Node Selection Toward Faster Convergence for Federated Learning on Non-IID
Data. Hongda Wu, Ping Wang. IEEE Transactions on Network Science and
Engineering, 2022. arXiv:2105.07066.

docs/algorithms.md 11.3 (the reference code's ``probabilistic_selection``): each
node i that the ``fedpns`` algorithm labels this round loses
delta_i = P_i min((x_i + beta)^alpha, 1), x_i = labeled_i / selected_i, and
the other nodes share the total equally; ``clients_per_round`` distinct
online nodes are drawn by P (details: docs/fedpns-feddm.md). As in the
reference code, "selected" counts every selection, a dropped update's too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Literal

import numpy as np
from pydantic import Field

from fedsim.algorithms.fedpns import Labels
from fedsim.selectors.base import Selector, SelectorState, weighted_pick

if TYPE_CHECKING:
    from fedsim.selectors.base import Draw, RoundResult, SelectorContext

_COUNTS = ("selected", "labeled", "removed")


def update_probabilities(
    p: Sequence[float],
    selected: Sequence[int],
    labeled_total: Sequence[int],
    labeled_now: Sequence[int],
    alpha: float = 2.0,
    beta: float = 0.7,
) -> np.ndarray:
    """One FedPNS probability update (docs/algorithms.md 11.3): the new P (sum 1).

    ``selected`` and ``labeled_total`` are cumulative counts per node (this
    round's labels included); ``labeled_now`` the ids labeled this round.

    Example (the worked example of 11.3):
        >>> update_probabilities([0.2] * 5, [10, 1, 1, 1, 1], [1, 0, 0, 0, 0], [0])
        array([0.072, 0.232, 0.232, 0.232, 0.232])
    """
    q = np.array(p, dtype=np.float64)
    lab = sorted({int(i) for i in labeled_now})
    if not lab:
        return q
    sel, tot = (np.asarray(a, dtype=np.float64)[lab] for a in (selected, labeled_total))
    x = tot / np.maximum(sel, 1.0)
    delta = q[lab] * np.minimum((x + beta) ** alpha, 1.0)
    q[lab] -= delta
    rest = ~np.isin(np.arange(q.size), lab)
    if rest.any():
        q[rest] += delta.sum() / rest.sum()
    else:  # every node labeled: nowhere to move the mass, keep it
        q[lab] += delta
    return np.maximum(q, 0.0)


def _bump(counts: list[int], ids: Sequence[int] | np.ndarray) -> list[int]:
    """``counts`` with one added at each of the distinct ``ids``."""
    out = np.array(counts, dtype=np.int64)
    out[np.asarray(ids, dtype=np.int64)] += 1
    return out.tolist()


@dataclass(frozen=True)
class FedPNS(Selector):
    """Probabilistic node selection driven by Optimal Aggregation's labels."""

    name: Literal["fedpns"] = "fedpns"
    alpha: Annotated[float, Field(gt=0, le=100)] = 2.0
    beta: Annotated[float, Field(ge=0, le=1)] = 0.7

    def init(self, ctx: SelectorContext) -> SelectorState:
        m = ctx.num_clients
        return {"p": [1.0 / m] * m, **{k: [0] * m for k in _COUNTS}}

    def select(
        self, state: SelectorState, draw: Draw
    ) -> tuple[np.ndarray, SelectorState]:
        cand = draw.candidates
        p = np.asarray(state["p"], dtype=np.float64)[cand]
        ids = np.sort(weighted_pick(cand, p, self.k(draw), draw.rng)).astype(np.int64)
        return ids, {**state, "selected": _bump(state["selected"], ids)}

    def observe(
        self, state: SelectorState, t: int, result: RoundResult, ctx: SelectorContext
    ) -> SelectorState:
        # what the fedpns algorithm labeled (another algorithm labels nothing)
        labels = result.info.signal
        if not isinstance(labels, Labels):
            labels = Labels()
        labeled, removed_now = sorted(labels.labeled), sorted(labels.removed)
        total = _bump(state["labeled"], labeled)
        p = update_probabilities(
            state["p"], state["selected"], total, labeled, self.alpha, self.beta
        )
        removed = _bump(state["removed"], removed_now)
        return {**state, "p": p.tolist(), "labeled": total, "removed": removed}

    def artifact(self, state: SelectorState, round_: int) -> list[dict[str, object]]:
        return [
            {
                "client_id": i,
                "probability": float(p),
                **{k: int(state[k][i]) for k in _COUNTS},
            }
            for i, p in enumerate(state["p"])
        ]
