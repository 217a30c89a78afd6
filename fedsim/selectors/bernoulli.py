"""Independent participation: each online client is active with probability q.

The protocol of FedDyn (Acar et al., "Federated Learning Based on Dynamic
Regularization", ICLR 2021, arXiv:2111.04263) and FedDC (Gao et al.,
"FedDC: Federated Learning with Non-IID Data via Local Drift Decoupling and
Correction", CVPR 2022, arXiv:2203.11751): every round, every client draws
u_i ~ U(0, 1) and takes part when u_i <= q, so the number of clients varies
from round to round (Binomial(m, q)) and each has inclusion probability q.

No client drawn: both reference codes draw again (a fresh vector of u_i)
until at least one client is active, and so does :meth:`Bernoulli.select`:
a round is never empty while a device is online. The inclusion probability
is then q / (1 - (1 - q)^m), q up to a relative 1e-3 once (1 - q)^m is below
that (m = 100, q = 0.1: (0.9)^100 = 2.7e-5).

That takes 1 / (1 - (1 - q)^m) draws on average: about 1 / (q m) for a
small q, so ``q: 1e-300`` would redraw for ever. Two guards: a q for which
the whole fleet online needs more than :data:`MAX_MEAN_DRAWS` draws a round
is refused when the scenario is loaded (:meth:`Bernoulli.check`; nearly
every round would be one client, drawn again and again); and when few
devices are online, after :data:`REDRAWS` empty draws the round is drawn
from the same distribution directly (:func:`draw_nonempty`: the first
active client from its truncated geometric law, the others after it
independently), so no round draws more than ``REDRAWS + 1`` times.

``clients_per_round`` is a cap, not the count: when more than that many
clients are active, a uniformly random ``clients_per_round`` of them train.
Set it to the number of clients for the papers' protocol (no cap). The
papers weight by n_i among the active clients (``renormalized``);
``algorithm.sampling: uniform`` (p_i m / k, for a fixed count k) is refused.

Example (q = 0.5 over four clients):
    >>> from fedsim.selectors.base import Draw, SelectorContext
    >>> sel = Bernoulli(q=0.5, clients_per_round=4)
    >>> ids, _ = sel.select({}, Draw(0, [0, 1, 2, 3], np.random.default_rng(1),
    ...                              SelectorContext.uniform(4)))
    >>> ids.dtype, 1 <= len(ids) <= 4
    (dtype('int64'), True)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, ClassVar, Literal

import numpy as np
from pydantic import Field

from fedsim.facts import RunFacts
from fedsim.selectors.base import Draw, Selector, SelectorContext, SelectorState
from fedsim.spec import Problem

# A q whose whole fleet needs more draws a round than this is refused.
MAX_MEAN_DRAWS = 1000
# Empty draws redrawn as the reference codes do before the direct draw
# (every scenario shipped draws empty at most a few times in a run).
REDRAWS = 100


def mean_draws(q: float, m: int) -> float:
    """Draws until one of ``m`` clients is active: 1 / (1 - (1 - q)^m),
    computed without rounding (1 - q is 1.0 in floating point for q < 1e-16).

    >>> round(mean_draws(0.5, 1), 6), round(mean_draws(0.1, 100), 6)
    (2.0, 1.000027)
    """
    return 1.0 / -math.expm1(m * math.log1p(-q)) if q < 1 else 1.0


def draw_nonempty(q: float, m: int, rng: np.random.Generator) -> np.ndarray:
    """Which of ``m`` clients are active, each with probability ``q``,
    conditioned on at least one: the law of redrawing until one is active,
    in one draw.

    The first active client J has P(J = j) = q (1 - q)^j / (1 - (1 - q)^m),
    j = 0..m-1 (inverse CDF below); the clients after it are active
    independently with probability q, those before it are not.

    Args:
        q: the activity probability, in (0, 1].
        m: the candidates (>= 1).
        rng: the round's generator.

    Returns:
        A boolean mask of length ``m`` with at least one True.
    """
    active = np.zeros(m, dtype=bool)
    if q >= 1:
        active[:] = True
        return active
    log_stay = math.log1p(-q)  # log(1 - q) < 0
    reach = -math.expm1(m * log_stay)  # 1 - (1 - q)^m
    # smallest j with 1 - (1 - q)^(j + 1) >= u * reach
    x = math.log1p(-float(rng.random()) * reach) / log_stay
    first = min(max(math.ceil(x) - 1, 0), m - 1)
    active[first] = True
    active[first + 1 :] = rng.random(m - first - 1) <= q
    return active


@dataclass(frozen=True)
class Bernoulli(Selector):
    """Each online client independently with probability ``q`` (redrawn until
    at least one is active), at most ``clients_per_round`` of them."""

    name: Literal["bernoulli"] = "bernoulli"
    q: Annotated[float, Field(gt=0, le=1)] = 0.1

    asynchronous: ClassVar[bool] = False
    # equal inclusion q, but a random count: the pairing table's "uniform"
    # formula p_i m / k assumes k clients a round, so this declares no
    # closed form (``algorithm.sampling: uniform`` is then refused)
    inclusion: ClassVar[str] = "adaptive"
    fixed_count: ClassVar[bool] = False

    def check(self, scenario: RunFacts) -> list[Problem]:
        """Refuse a q so small that even with every device online a round
        would draw more than :data:`MAX_MEAN_DRAWS` times before one client
        is active (the protocol would train one client a round)."""
        found = super().check(scenario)
        m = scenario.num_clients
        draws = mean_draws(self.q, m)
        if draws <= MAX_MEAN_DRAWS:
            return found
        least = -math.expm1(math.log1p(-1 / MAX_MEAN_DRAWS) / m)
        return [
            *found,
            Problem(
                f"selector.q {self.q:g} with {m} clients: a round would draw on "
                f"average {draws:.3g} times (1 / (1 - (1 - q)^{m})) before one "
                "client is active, and nearly every round would train one "
                f"client; use q >= {least:.2g} (at most {MAX_MEAN_DRAWS} draws "
                "on average)"
            ),
        ]

    def expected_draws(self, ctx: SelectorContext) -> np.ndarray:
        """q for each client (the redraw of an empty round ignored).

        >>> Bernoulli(q=0.15).expected_draws(SelectorContext.uniform(3)).tolist()
        [0.15, 0.15, 0.15]
        """
        return np.full(ctx.num_clients, self.q)

    def select(
        self, state: SelectorState, draw: Draw
    ) -> tuple[np.ndarray, SelectorState]:
        """The active online clients, sorted; empty only when none is online.

        Args:
            state: unused (the selector keeps none).
            draw: the online clients and the generator of every choice.

        Returns:
            (sorted distinct int64 ids, the state unchanged).
        """
        cand = draw.candidates
        if len(cand) == 0:
            return np.zeros(0, dtype=np.int64), state
        active = cand[:0]
        for _ in range(REDRAWS):  # the reference codes redraw an empty round
            active = cand[draw.rng.random(len(cand)) <= self.q]
            if len(active):
                break
        else:  # few devices online and a small q: the same law, drawn directly
            active = cand[draw_nonempty(self.q, len(cand), draw.rng)]
        if len(active) > self.clients_per_round:
            active = draw.rng.choice(active, self.clients_per_round, replace=False)
        return np.sort(active).astype(np.int64), state
