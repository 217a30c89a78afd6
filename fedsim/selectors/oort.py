"""Oort-style guided participant selection.

Oort: Efficient Federated Learning via Guided Participant Selection. Fan Lai,
Xiangfeng Zhu, Harsha V. Madhyastha, Mosharaf Chowdhury. OSDI 2021.
arXiv:2010.06081.

A client's utility is its *statistical utility* (how much its data would
teach the model now) times a *system penalty* for being slow:

    U_i = (u_i + sqrt(c log(t + 1) / (L_i + 1))) * (T / t_i)^(alpha * 1[t_i > T])

- u_i: the statistical utility |B_i| sqrt(mean loss^2), approximated here by
  n_i times the client's last observed mean training loss (the server sees
  one mean loss per client and round), min-max normalised over the explored
  online clients, as Oort's code does;
- the square root: Oort's bonus for clients not seen for a while (t is the
  round, L_i the last round the client trained in, c = ``uncertainty``);
- t_i: the client's expected round duration from the fleet's simulated
  speed and bandwidth (:attr:`SelectorContext.round_time_s`); T the
  preferred duration (``preferred_duration_s``, or the ``duration_quantile``
  of t_i over the fleet); alpha = ``penalty``.

Each round, a fraction epsilon (``exploration``, decayed by
``exploration_decay`` per round down to ``exploration_min``) of the slots
explores clients never seen, faster ones more likely (probability
proportional to 1/t_i); the rest exploits: among the explored online clients,
those whose utility is at least ``cutoff`` times the k-th best are sampled
with probability proportional to utility.

Asynchronously (``round.policy: async``) t and L_i count server versions:
each choice fills free training slots at version t, L_i is the version an
update of client i was last applied to, and epsilon decays per version.

Not modelled: Oort's pacer (which moves T when the accuracy stalls), its
blacklist of over-selected clients and its robustness to outlier losses.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, ClassVar, Literal

import numpy as np
from pydantic import Field

from fedsim.selectors.base import (
    Draw,
    Selector,
    SelectorContext,
    SelectorState,
    last_losses,
    weighted_pick,
)
from fedsim.spec import NonNegFloat, PosFloat, Prob

if TYPE_CHECKING:
    from fedsim.server import RoundResult

__all__ = ["Oort", "weighted_pick"]


@dataclass(frozen=True)
class Oort(Selector):
    """Statistical utility times a system-speed penalty, with exploration.

    Example:
        >>> import numpy as np
        >>> from fedsim.selectors.base import Draw, SelectorContext
        >>> ctx = SelectorContext.from_arrays([10] * 4, round_time_s=[1, 1, 1, 9])
        >>> sel = Oort(clients_per_round=2)
        >>> draw = Draw(0, np.arange(4), np.random.default_rng(0), ctx)
        >>> ids, st = sel.select(sel.init(ctx), draw)
        >>> len(ids)
        2
    """

    name: Literal["oort"] = "oort"
    exploration: Prob = 0.9
    exploration_decay: Prob = 0.98
    exploration_min: Prob = 0.3
    penalty: NonNegFloat = 2.0
    preferred_duration_s: PosFloat | None = None
    duration_quantile: Prob = 0.5
    cutoff: Prob = 0.95
    uncertainty: Annotated[float, Field(ge=0)] = 0.1

    needs_context: ClassVar[bool] = True
    asynchronous: ClassVar[bool] = True  # adaptive: it observes applied updates
    initial_state: ClassVar[SelectorState] = {"ids": [], "util": [], "last": []}

    def init(self, ctx: SelectorContext) -> SelectorState:
        return {**super().init(ctx), "epsilon": float(self.exploration)}

    def preferred(self, ctx: SelectorContext) -> float:
        """T, the preferred round duration in simulated seconds."""
        if self.preferred_duration_s is not None:
            return float(self.preferred_duration_s)
        if ctx.num_clients == 0:
            return 1.0
        return float(np.quantile(ctx.round_time_s, self.duration_quantile))

    def scores(
        self, state: SelectorState, round_: int, ids: np.ndarray, ctx: SelectorContext
    ) -> np.ndarray:
        """Oort's utility of explored clients ``ids`` (in that order)."""
        known = {
            i: (u, last)
            for i, u, last in zip(
                state["ids"], state["util"], state["last"], strict=True
            )
        }
        u = np.array([known[int(i)][0] for i in ids], dtype=np.float64)
        last = np.array([known[int(i)][1] for i in ids], dtype=np.float64)
        if u.size:
            lo, span = u.min(), u.max() - u.min()
            u = (u - lo) / span if span > 0 else np.zeros_like(u)
        u = u + np.sqrt(self.uncertainty * math.log(round_ + 1) / (last + 1.0))
        t = ctx.round_time_s[ids]
        big_t = self.preferred(ctx)
        slow = t > big_t
        u[slow] *= (big_t / t[slow]) ** self.penalty
        return u

    def select(
        self, state: SelectorState, draw: Draw
    ) -> tuple[np.ndarray, SelectorState]:
        c, cand, rng, k = draw.ctx, draw.candidates, draw.rng, self.k(draw)
        seen = np.isin(cand, np.asarray(state["ids"], dtype=np.int64))
        explored, fresh = cand[seen], cand[~seen]
        n_explore = min(len(fresh), int(round(state["epsilon"] * k)))
        n_exploit = min(len(explored), k - n_explore)
        n_explore = min(len(fresh), k - n_exploit)
        picked = []
        if n_exploit:
            s = self.scores(state, draw.round, explored, c)
            order = np.argsort(-s, kind="stable")
            bar = self.cutoff * s[order[n_exploit - 1]]
            pool = order[s[order] >= bar] if bar > 0 else order
            picked.append(weighted_pick(explored[pool], s[pool], n_exploit, rng))
        if n_explore:
            speed = 1.0 / np.maximum(c.round_time_s[fresh], 1e-12)
            picked.append(weighted_pick(fresh, speed, n_explore, rng))
        ids = np.concatenate(picked) if picked else np.zeros(0, dtype=np.int64)
        return np.sort(ids).astype(np.int64), state

    def observe(
        self, state: SelectorState, t: int, result: RoundResult, ctx: SelectorContext
    ) -> SelectorState:
        known = {
            i: (u, last)
            for i, u, last in zip(
                state["ids"], state["util"], state["last"], strict=True
            )
        }
        for cid, loss in last_losses(result):
            known[cid] = (float(ctx.n_samples[cid]) * loss, int(t))
        ids = sorted(known)
        eps = max(self.exploration_min, state["epsilon"] * self.exploration_decay)
        return {
            "ids": ids,
            "util": [known[i][0] for i in ids],
            "last": [known[i][1] for i in ids],
            "epsilon": float(eps),
        }
