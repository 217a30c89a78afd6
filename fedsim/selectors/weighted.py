"""Sampling with replacement, proportional to the data weights p_i.

Scheme (i) of docs/algorithms.md section 3 (Li et al., "On the Convergence of
FedAvg on Non-IID Data", ICLR 2020, arXiv:1907.02189): q =
``clients_per_round`` i.i.d. draws with P(l = i) = p_i among the online
devices; :meth:`select` returns the distinct ids and :meth:`multiplicity`
the k_i, which ``algorithm.sampling: proportional`` (the default here) turns
into weights k_i / q, an unbiased estimate of sum_i p_i Delta_i.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

import numpy as np

from fedsim.selectors.base import Draw, Selector, SelectorContext, SelectorState


@dataclass(frozen=True)
class Weighted(Selector):
    """q i.i.d. draws proportional to p_i among the online devices; the state
    holds the last draw's distinct ids and how often each was drawn."""

    name: Literal["weighted"] = "weighted"

    asynchronous: ClassVar[bool] = True
    sampling_scheme: ClassVar[str | None] = "proportional"
    inclusion: ClassVar[str] = "proportional"
    with_replacement: ClassVar[bool] = True
    data_share_in_sample: ClassVar[bool] = True
    default_weighting: ClassVar[str | None] = "proportional"
    needs_context: ClassVar[bool] = True
    initial_state: ClassVar[SelectorState] = {"ids": [], "counts": []}

    def select(
        self, state: SelectorState, draw: Draw
    ) -> tuple[np.ndarray, SelectorState]:
        cand = draw.candidates
        p = draw.ctx.data_weights[cand]
        if len(cand) == 0 or p.sum() <= 0:
            return np.zeros(0, dtype=np.int64), {"ids": [], "counts": []}
        draws = draw.rng.choice(cand, size=self.clients_per_round, p=p / p.sum())
        ids, counts = np.unique(draws, return_counts=True)
        return ids.astype(np.int64), {"ids": ids.tolist(), "counts": counts.tolist()}

    def expected_draws(self, ctx: SelectorContext) -> np.ndarray:
        """q p_i: each of the q draws picks client i with probability p_i
        (its inclusion probability is 1 - (1 - p_i)^q).

        >>> ctx = SelectorContext(2, [0.25, 0.75], [1, 3], [1, 1], [1, 1])
        >>> Weighted(clients_per_round=4).expected_draws(ctx).tolist()
        [1.0, 3.0]
        """
        return self.clients_per_round * ctx.data_weights / ctx.data_weights.sum()

    def multiplicity(
        self, state: SelectorState, ids: np.ndarray
    ) -> dict[int, int] | None:
        k = dict(zip(state["ids"], state["counts"], strict=True))
        return {int(i): int(k.get(int(i), 1)) for i in np.asarray(ids).tolist()}
