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

from dataclasses import dataclass
from typing import Annotated, ClassVar, Literal

import numpy as np
from pydantic import Field

from fedsim.selectors.base import Draw, Selector, SelectorContext, SelectorState


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
        while len(active) == 0:  # the reference codes redraw an empty round
            active = cand[draw.rng.random(len(cand)) <= self.q]
        if len(active) > self.clients_per_round:
            active = draw.rng.choice(active, self.clients_per_round, replace=False)
        return np.sort(active).astype(np.int64), state
