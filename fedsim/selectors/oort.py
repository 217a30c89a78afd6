"""Oort-style guided participant selection.

Oort: Efficient Federated Learning via Guided Participant Selection. Fan Lai,
Xiangfeng Zhu, Harsha V. Madhyastha, Mosharaf Chowdhury. OSDI 2021.
arXiv:2010.06081.

    U_i = (u_i + sqrt(c log(t + 1) / (L_i + 1))) * (T / t_i)^(alpha * 1[t_i > T])

u_i: n_i times the last observed mean training loss, min-max normalised;
L_i: the last round (async: version) client i trained in; t_i its
:attr:`SelectorContext.round_time_s`, T the preferred duration. A decaying
fraction epsilon of the slots explores unseen clients (faster ones more
likely); the rest is drawn by U among the explored clients within ``cutoff``
of the k-th best. Not modelled: Oort's pacer, blacklist and outlier handling.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Literal

import numpy as np

from fedsim.selectors.base import Selector, SelectorState, last_losses, weighted_pick
from fedsim.spec import NonNegFloat, PosFloat, Prob

if TYPE_CHECKING:
    from fedsim.selectors.base import Draw, RoundResult, SelectorContext


def _known(state: SelectorState) -> dict[int, tuple[float, int]]:
    """Explored client id -> (utility, last round it trained in)."""
    rows = zip(state["ids"], state["util"], state["last"], strict=True)
    return {i: (u, last) for i, u, last in rows}


@dataclass(frozen=True)
class Oort(Selector):
    """Statistical utility times a system-speed penalty, with exploration."""

    name: Literal["oort"] = "oort"
    exploration: Prob = 0.9
    exploration_decay: Prob = 0.98
    exploration_min: Prob = 0.3
    penalty: NonNegFloat = 2.0
    preferred_duration_s: PosFloat | None = None
    duration_quantile: Prob = 0.5
    cutoff: Prob = 0.95
    uncertainty: NonNegFloat = 0.1

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
        known = _known(state)
        u = np.array([known[int(i)][0] for i in ids], dtype=np.float64)
        last = np.array([known[int(i)][1] for i in ids], dtype=np.float64)
        if u.size:
            lo, span = u.min(), u.max() - u.min()
            u = (u - lo) / span if span > 0 else np.zeros_like(u)
        u = u + np.sqrt(self.uncertainty * math.log(round_ + 1) / (last + 1.0))
        t, big_t = ctx.round_time_s[ids], self.preferred(ctx)
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
        picked = [np.zeros(0, dtype=np.int64)]
        if n_exploit:
            s = self.scores(state, draw.round, explored, c)
            order = np.argsort(-s, kind="stable")
            bar = self.cutoff * s[order[n_exploit - 1]]
            pool = order[s[order] >= bar] if bar > 0 else order
            picked.append(weighted_pick(explored[pool], s[pool], n_exploit, rng))
        if n_explore:
            speed = 1.0 / np.maximum(c.round_time_s[fresh], 1e-12)
            picked.append(weighted_pick(fresh, speed, n_explore, rng))
        return np.sort(np.concatenate(picked)).astype(np.int64), state

    def observe(
        self, state: SelectorState, t: int, result: RoundResult, ctx: SelectorContext
    ) -> SelectorState:
        known = _known(state)
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
