"""Deadline-aware selection: the k online devices expected to finish first.

A round lasts until its slowest chosen device reports (or its deadline), so
choosing the devices with the shortest expected round time (download, local
steps at the device's speed, upload: ``SelectorContext.round_time_s``) makes
rounds short, at the price of a biased sample; ``explore`` spends each slot,
with that probability, on a uniformly drawn other online device instead, so
slow devices still take part (the trade-off Oort, Lai et al. OSDI 2021,
makes with its own utility).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, ClassVar

import numpy as np
from pydantic import Field

from fedsim.api import Draw, Selector, SelectorState


@dataclass(frozen=True)
class FastestK(Selector):
    """The ``clients_per_round`` online devices of shortest expected round time
    (ties: the lower id), each slot explored with probability ``explore``.

    >>> from fedsim.api import SelectorContext
    >>> ctx = SelectorContext.from_arrays([1, 1, 1, 1],
    ...                                   round_time_s=[4.0, 1.0, 3.0, 2.0])
    >>> sel = FastestK(clients_per_round=2)
    >>> ids, _ = sel.select({}, Draw(0, [0, 2, 3], np.random.default_rng(0), ctx))
    >>> ids.tolist()
    [2, 3]
    """

    explore: Annotated[float, Field(ge=0, le=1)] = 0.0

    # it chooses from facts known before training: async free slots too
    asynchronous: ClassVar[bool] = True
    needs_context: ClassVar[bool] = True  # made-up unit round times say nothing

    def select(
        self, state: SelectorState, draw: Draw
    ) -> tuple[np.ndarray, SelectorState]:
        cand, k = draw.candidates, self.k(draw)
        # stable sort: equal round times keep the (sorted) id order
        by_time = cand[np.argsort(draw.ctx.round_time_s[cand], kind="stable")]
        # one uniform per slot, drawn even when explore = 0: the generator's
        # use does not depend on the hyperparameter
        explored = draw.rng.random(k) < self.explore
        chosen = list(by_time[: k - int(explored.sum())])
        rest = np.setdiff1d(cand, chosen)
        extra = draw.rng.choice(rest, size=k - len(chosen), replace=False)
        return np.sort(np.concatenate([chosen, extra])).astype(np.int64), state
