"""BN2 (FedPNS's baseline): the clients with the largest last update norm."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedsim.selectors import BN2, REGISTRY, Draw, SelectorContext

CTX = SelectorContext.uniform(6)


@dataclass
class Outcome:
    update_norm: float
    train_loss: float = 1.0
    weight: float = 0.5
    flags: dict[str, Any] = field(default_factory=dict)


@dataclass
class Result:
    clients: dict[int, Outcome]
    info: Any = None


def pick(sel: BN2, state: dict, cand, seed: int = 0) -> list[int]:
    ids, _ = sel.select(
        state, Draw(0, np.asarray(cand), np.random.default_rng(seed), CTX)
    )
    return ids.tolist()


def test_it_is_registered():
    assert REGISTRY["bn2"] is BN2


def test_it_takes_the_largest_observed_norms_among_the_online():
    # Prepare: six clients observed with norms 0.3, 2.0, 0.1, 1.5, nan, 0.7
    # over two rounds (client 3 first 0.2, then 1.5: the last one counts)
    sel = BN2(clients_per_round=2)
    state = sel.init(CTX)
    state = sel.observe(state, 0, Result({0: Outcome(0.3), 3: Outcome(0.2)}), CTX)
    norms = {1: 2.0, 2: 0.1, 3: 1.5, 4: math.nan, 5: 0.7}
    state = sel.observe(
        state, 1, Result({c: Outcome(n) for c, n in norms.items()}), CTX
    )
    # Execute / Assert: 1 (2.0) and 3 (1.5); client 4's NaN is not remembered,
    # so it counts as unseen (+inf) and goes first
    assert state == {"ids": [0, 1, 2, 3, 5], "norm": [0.3, 2.0, 0.1, 1.5, 0.7]}
    assert pick(sel, state, [0, 1, 2, 3, 5]) == [1, 3]
    assert pick(sel, state, [0, 2, 5]) == [0, 5]  # 1 and 3 offline: 0.7, 0.3
    assert pick(sel, state, [1, 2, 4]) == [1, 4]


def test_unseen_clients_come_first_ties_at_random():
    sel = BN2(clients_per_round=2)
    state = {"ids": [0], "norm": [5.0]}
    # three unseen clients tie at +inf: two of them, chosen by the generator
    seen = {tuple(pick(sel, state, [0, 1, 2, 3], seed)) for seed in range(20)}
    assert all(0 not in s for s in seen) and len(seen) > 1
