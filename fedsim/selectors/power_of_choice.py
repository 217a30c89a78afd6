"""Power-of-choice: the highest-loss clients of a random candidate set.

Client Selection in Federated Learning: Convergence Analysis and
Power-of-Choice Selection Strategies. Yae Jee Cho, Jianyu Wang, Gauri Joshi.
AISTATS 2022. arXiv:2010.01243.

The paper's ``rpow-d``: draw d = ``candidates`` online clients by p_i, keep
the ``clients_per_round`` with the highest last observed training loss
(+inf if never observed; ties at random). The updates get equal weights
(its eq. 3): the draw already favours p_i.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, ClassVar, Literal

import numpy as np

from fedsim.selectors.base import Selector, SelectorState, last_losses, weighted_pick
from fedsim.spec import PosInt

if TYPE_CHECKING:
    from fedsim.selectors.base import Draw, RoundResult, SelectorContext


@dataclass(frozen=True)
class PowerOfChoice(Selector):
    """rpow-d: power-of-choice with the last observed training losses;
    ``candidates`` is d (None: 2 ``clients_per_round``; at least that many).

    Example:
        >>> from fedsim.selectors.base import Draw, SelectorContext
        >>> sel = PowerOfChoice(clients_per_round=1, candidates=3)
        >>> ctx = SelectorContext.from_arrays([1, 1, 1])
        >>> st = {"ids": [0, 1, 2], "loss": [0.1, 0.9, 0.5]}
        >>> sel.select(st, Draw(1, np.arange(3), np.random.default_rng(0), ctx))[0]
        array([1])
    """

    name: Literal["power_of_choice"] = "power_of_choice"
    candidates: PosInt | None = None

    needs_context: ClassVar[bool] = True
    asynchronous: ClassVar[bool] = True  # adaptive: it observes applied updates
    initial_state: ClassVar[SelectorState] = {"ids": [], "loss": []}
    data_share_in_sample: ClassVar[bool] = True
    default_weighting: ClassVar[str | None] = "equal"

    def __post_init__(self) -> None:
        if self.candidates is not None and self.candidates < self.clients_per_round:
            raise ValueError(
                f"candidates (d = {self.candidates}) must be at least "
                f"clients_per_round ({self.clients_per_round})"
            )

    @property
    def d(self) -> int:
        return self.candidates or 2 * self.clients_per_round

    def with_slots(self, k: int) -> PowerOfChoice:
        """``k`` picks from d scaled as d / clients_per_round (at least k)."""
        d = None
        if self.candidates is not None:
            d = max(k, math.ceil(k * self.candidates / self.clients_per_round))
        return replace(self, clients_per_round=k, candidates=d)

    def select(
        self, state: SelectorState, draw: Draw
    ) -> tuple[np.ndarray, SelectorState]:
        cand, rng, k = draw.candidates, draw.rng, self.k(draw)
        if k == 0:
            return np.zeros(0, dtype=np.int64), state
        p = draw.ctx.data_weights[cand]
        pos = cand[p > 0]
        if len(pos) < k:  # too few clients with data weight: all, filled at random
            pool = weighted_pick(cand, p, k, rng)
        else:
            w = p[p > 0]
            d = min(self.d, len(pos))
            pool = rng.choice(pos, size=d, replace=False, p=w / w.sum())
        known = dict(zip(state["ids"], state["loss"], strict=True))
        loss = np.array([known.get(int(i), math.inf) for i in pool])
        # highest loss first; a random key breaks ties (unseen clients)
        order = np.lexsort((rng.random(len(pool)), -loss))
        return np.sort(pool[order[:k]]).astype(np.int64), state

    def observe(
        self, state: SelectorState, t: int, result: RoundResult, ctx: SelectorContext
    ) -> SelectorState:
        known = dict(zip(state["ids"], state["loss"], strict=True))
        known.update(last_losses(result))
        ids = sorted(known)
        return {"ids": ids, "loss": [known[i] for i in ids]}
