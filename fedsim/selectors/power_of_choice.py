"""Power-of-choice: the highest-loss clients of a random candidate set.

Client Selection in Federated Learning: Convergence Analysis and
Power-of-Choice Selection Strategies. Yae Jee Cho, Jianyu Wang, Gauri Joshi.
AISTATS 2022. arXiv:2010.01243.

Each round: draw a candidate set A of ``candidates`` (d) distinct online
clients without replacement with probabilities p_i (the data weights), then
select the ``clients_per_round`` (m) clients of A with the highest local
loss. Biasing toward high-loss clients speeds up convergence; d = m is
random selection, larger d is more greedy.

The paper's ``pow-d`` asks every candidate to evaluate its loss at the
current global model (an extra round trip), and ``cpow-d`` to estimate it on
a minibatch (still a round trip). This is the paper's ``rpow-d``, which needs
no extra messages: the loss of a client is its *last observed* mean
training loss (``result.clients[i].train_loss`` of the last round it
trained in). A client never observed has loss +inf, so every client is
tried once before the greedy choice kicks in; ties are broken at random.

Aggregation: the paper averages the selected clients' updates with equal
weights (its eq. 3), since the candidate draw already favours clients in
proportion to p_i; n_i weights on top would count the data share twice.
A scenario that names no ``algorithm.sampling`` gets ``equal`` with this
selector, and ``renormalized`` is refused. The inclusion probabilities
depend on the losses (``inclusion = "adaptive"``): no closed form.

Asynchronously (``round.policy: async``) each choice fills free training
slots, with the losses of the updates applied to the server so far.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, ClassVar, Literal

import numpy as np

from fedsim.selectors.base import Selector, SelectorState, last_losses, weighted_pick
from fedsim.spec import PosInt

if TYPE_CHECKING:  # annotations only
    from fedsim.selectors.base import Draw, SelectorContext
    from fedsim.server import RoundResult

__all__ = ["PowerOfChoice"]


@dataclass(frozen=True)
class PowerOfChoice(Selector):
    """rpow-d: power-of-choice with the last observed training losses.

    Attributes:
        candidates: d, the size of the random candidate set (None: twice
            ``clients_per_round``); at least ``clients_per_round``.

    Example:
        >>> import numpy as np
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
    # candidates drawn in proportion to p_i, then the highest losses: no
    # closed form, and the data share is already in the sample
    inclusion: ClassVar[str] = "adaptive"
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
