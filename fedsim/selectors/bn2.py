"""BN2: the clients whose updates were largest, FedPNS's norm-based baseline.

Wu and Wang, "Node Selection Toward Faster Convergence for Federated Learning
on Non-IID Data" (FedPNS), IEEE TNSE 2022, arXiv:2105.07066, compare against
selecting the nodes with the larger gradient norm ("BN2"; docs/algorithms.md
14, FedPNS: it does worse than FedPNS). A selector chooses before the round
trains, so this one ranks each online client by the L2 norm of its last
observed update ||Delta_i|| (+inf for a client never observed, so every
client is tried once; ties broken at random) and takes the
``clients_per_round`` largest. With the same lr and local steps for every
client (FedPNS's setting: E epochs of n samples each) the update norm ranks
clients as the norm of their average gradient ||Delta_i|| / (lr ||a_i||_1)
does. Non-finite norms (a diverged client) are not remembered.

Example (client 1's last update was the largest):
    >>> from fedsim.selectors.base import Draw, SelectorContext
    >>> sel = BN2(clients_per_round=1)
    >>> st = {"ids": [0, 1, 2], "norm": [0.1, 0.9, 0.5]}
    >>> sel.select(st, Draw(1, np.arange(3), np.random.default_rng(0),
    ...                     SelectorContext.uniform(3)))[0]
    array([1])
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Literal

import numpy as np

from fedsim.selectors.base import Selector, SelectorState

if TYPE_CHECKING:
    from fedsim.selectors.base import Draw, RoundResult, SelectorContext


@dataclass(frozen=True)
class BN2(Selector):
    """The ``clients_per_round`` online clients with the largest last observed
    update norm (unseen clients first, ties at random); the state holds the
    last norm of every client observed so far."""

    name: Literal["bn2"] = "bn2"

    asynchronous: ClassVar[bool] = True  # adaptive: it observes applied updates
    initial_state: ClassVar[SelectorState] = {"ids": [], "norm": []}

    def select(
        self, state: SelectorState, draw: Draw
    ) -> tuple[np.ndarray, SelectorState]:
        """The largest last update norms among ``draw.candidates``.

        Args:
            state: ``ids`` and their last ``norm``, as :meth:`observe` keeps.
            draw: the online clients and the generator that breaks ties.

        Returns:
            (sorted distinct int64 ids, the state unchanged).
        """
        cand, k = draw.candidates, self.k(draw)
        known = dict(zip(state["ids"], state["norm"], strict=True))
        norm = np.array([known.get(int(i), math.inf) for i in cand])
        # largest norm first; a random key breaks ties (unseen clients)
        order = np.lexsort((draw.rng.random(len(cand)), -norm))
        return np.sort(cand[order[:k]]).astype(np.int64), state

    def observe(
        self, state: SelectorState, t: int, result: RoundResult, ctx: SelectorContext
    ) -> SelectorState:
        """Remember the round's finite update norms, replacing older ones.

        Args:
            state: the norms known before the round.
            t: the round (unused).
            result: the round's aggregated clients and their ``update_norm``.
            ctx: the run's context (unused).

        Returns:
            The norms known after it, by client id.
        """
        known = dict(zip(state["ids"], state["norm"], strict=True))
        for c, outcome in result.clients.items():
            if math.isfinite(float(outcome.update_norm)):
                known[int(c)] = float(outcome.update_norm)
        ids = sorted(known)
        return {"ids": ids, "norm": [known[i] for i in ids]}
