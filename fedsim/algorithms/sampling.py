"""Aggregation weights under client sampling (ALGORITHMS.md sections 3 and 5.4).

Pure helpers shared by FedAvg-style and FedNova-style servers. A ``scheme``
names how the round's updates are weighted, given how the selector sampled:

- ``renormalized`` (default): p_i = n_i / sum_{j in S} n_j over the round's
  updates. What the reference codes do; biased under partial participation
  (it always sums to 1, so the server steps as if S were everyone).
- ``uniform``: scheme (ii), for a selector drawing q clients uniformly without
  replacement: weight p_i m / q, with p_i = n_i / n over *all* m clients. The
  weights do not sum to 1 in a round; E_S[sum_{i in S} w_i Delta_i] =
  sum_i p_i Delta_i. The client uploads p_i m (its ``relative_weight``) as the
  scalar extra ``p_m``, since the server does not know n. q is the number of
  updates received: drops make the estimate conditional on arrival, hence
  biased, like any drop.
- ``proportional``: scheme (i), for a selector drawing q indices i.i.d. with
  P(i) = p_i (with replacement): a client drawn k_i times gets k_i / q,
  q = sum k_i. The client trains once and its delta is reused k_i times (the
  [R] of section 3). **Needs the selector to report multiplicities**, which no
  selector does yet: the multiplicity k_i is read from the update (attribute
  ``multiplicity`` or the scalar extra ``multiplicity``).
- ``equal``: w_i = 1 / |S|, the plain mean of the round's updates. Unbiased
  for sum_i p_i Delta_i only when the selector already drew clients in
  proportion to p_i (the data share is then in the sample, not in the
  weights); this is what power-of-choice's paper does (Cho et al., AISTATS
  2022, eq. 3: the server averages the selected clients' updates).

Sampling and weighting are one decision (:data:`WEIGHTINGS` says what each
weighting assumes, the selector's ``inclusion`` what it does;
:func:`pairing` joins them): n_i weights on a sample already drawn in
proportion to p_i count the data share twice. With 30 clients of Zipf sizes
(largest p = 0.165) and 9 draws a round, the ``weighted`` selector with
``renormalized`` weights gives the largest client an expected weight of
0.33 and an L1 distance of 0.49 between expected weights and p; with
``proportional`` weights the distance is Monte Carlo noise (0.017 over
10^4 rounds; tests/test_pairing.py). The scenario check refuses the double
count; the table with every pair is in docs/scenarios.md.

Example:
    >>> uniform_weights([0.4, 1.2], q=2)
    [0.2, 0.6]
    >>> proportional_weights([2, 1])
    [0.6666666666666666, 0.3333333333333333]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, cast

import numpy as np
from numpy.typing import ArrayLike

from fedsim.algorithms.base import (
    AggregateInfo,
    Algorithm,
    ClientContext,
    ClientInfo,
    ClientResult,
    ClientUpdate,
    data_weights,
    meter,
)
from fedsim.algorithms.weighting import updates_tau_eff
from fedsim.lazy import torch

if TYPE_CHECKING:
    from fedsim.solvers import SolverState

__all__ = [
    "WEIGHTINGS",
    "Inclusion",
    "Pairing",
    "Sampled",
    "Scheme",
    "Verdict",
    "Weighting",
    "equal_weights",
    "pairing",
    "pairing_problem",
    "participation_bias",
    "weight_shares",
    "proportional_weights",
    "sampling_extras",
    "sampling_weights",
    "uniform_weights",
    "unweighted_meter",
]

Scheme = Literal["renormalized", "uniform", "proportional", "equal"]
# How a selector draws (``Selector.inclusion``): ``uniform`` (q/m each),
# ``proportional`` (in proportion to p_i) or ``adaptive`` (no closed form).
Inclusion = Literal["uniform", "proportional", "adaptive"]
Verdict = Literal["unbiased", "biased", "adaptive", "refused"]


@dataclass(frozen=True)
class Weighting:
    """What an aggregation weighting assumes about how clients were sampled.

    Attributes:
        scheme: the ``algorithm.sampling`` value.
        formula: w_i as a formula, for tables and messages.
        assumes: the selector ``inclusion`` under which E_S[sum_{i in S} w_i
            Delta_i] = sum_i p_i Delta_i (None: none: it is unbiased only
            under full participation).
        multiplicities: True when it reads how often each client was drawn
            (a selector drawing with replacement).
    """

    scheme: Scheme
    formula: str
    assumes: Inclusion | None
    multiplicities: bool = False


WEIGHTINGS: dict[str, Weighting] = {
    w.scheme: w
    for w in (
        Weighting("renormalized", "n_i / sum_{j in S} n_j", None),
        Weighting("uniform", "p_i m / q", "uniform"),
        Weighting("proportional", "k_i / q", "proportional", multiplicities=True),
        Weighting("equal", "1 / |S|", "proportional"),
    )
}


def uniform_weights(p_m: Sequence[float], q: int) -> list[float]:
    """Scheme (ii): w_i = p_i m / q for the q sampled clients (``p_m`` = p_i m)."""
    if q <= 0:
        raise ValueError("q must be positive")
    return [float(v) / q for v in p_m]


def proportional_weights(multiplicity: Sequence[int]) -> list[float]:
    """Scheme (i): a client drawn k_i times of q = sum k draws gets k_i / q."""
    q = int(sum(int(k) for k in multiplicity))
    if q <= 0 or any(int(k) < 1 for k in multiplicity):
        raise ValueError("every sampled client needs a multiplicity >= 1")
    return [int(k) / q for k in multiplicity]


def equal_weights(n: int) -> list[float]:
    """``equal``: w_i = 1 / n for each of the round's n updates."""
    if n <= 0:
        raise ValueError("n must be positive")
    return [1.0 / n] * n


def _scalar(u: ClientUpdate, key: str) -> float | None:
    value = getattr(u, key, None)
    if value is None:
        value = u.extras.get(key)
    return None if value is None else float(value)


def sampling_weights(updates: Sequence[ClientUpdate], scheme: Scheme) -> list[float]:
    """The weight each update gets in the server step (in update order)."""
    if scheme == "renormalized":
        return data_weights(updates)
    if scheme == "uniform":
        p_m = [_scalar(u, "p_m") for u in updates]
        if any(v is None for v in p_m):
            raise ValueError("sampling 'uniform' needs each update's p_m extra")
        return uniform_weights([float(v) for v in p_m if v is not None], len(updates))
    if scheme == "proportional":
        ks = [_scalar(u, "multiplicity") for u in updates]
        if any(k is None for k in ks):
            raise ValueError(
                "sampling 'proportional' (scheme (i), with replacement) needs each "
                "update's multiplicity, which only a selector drawing with "
                "replacement can give; no selector does yet"
            )
        return proportional_weights([int(k) for k in ks if k is not None])
    if scheme == "equal":
        return equal_weights(len(updates))
    raise ValueError(f"unknown sampling scheme {scheme!r}")


@dataclass(frozen=True)
class Pairing:
    """The verdict on one (selector, weighting) pair.

    Attributes:
        verdict: ``unbiased`` (E_S of the step is the full-participation
            step), ``biased`` (allowed: common practice, or another
            objective), ``adaptive`` (the selector's probabilities have no
            closed form; allowed where the weighting matches what its paper
            does) or ``refused``.
        reason: one sentence on why.
        use: the weighting to use instead (refused pairs), else None.
    """

    verdict: Verdict
    reason: str
    use: Scheme | None = None


def _unbiased_for(selector: Any) -> Scheme | None:
    """The weighting that is unbiased (or the paper's) for this selector."""
    default = getattr(selector, "default_weighting", None)
    if default is not None:
        return cast(Scheme, default)
    inclusion = getattr(selector, "inclusion", "adaptive")
    fit = {"uniform": "uniform", "proportional": "proportional"}.get(inclusion)
    return cast(Scheme | None, fit)


def pairing(selector: Any, scheme: str) -> Pairing:
    """Whether weighting ``scheme`` fits how ``selector`` samples.

    The selector declares ``inclusion`` (``uniform``, ``proportional`` or
    ``adaptive``), ``with_replacement`` and ``data_share_in_sample`` (its
    draws already favour clients in proportion to p_i); the weighting's
    :class:`Weighting` declares what it assumes.

    >>> from fedsim.selectors import PowerOfChoice, Uniform, Weighted
    >>> pairing(Weighted(), "proportional").verdict
    'unbiased'
    >>> pairing(Weighted(), "renormalized").use
    'proportional'
    >>> pairing(PowerOfChoice(), "equal").verdict, pairing(Uniform(), "equal").verdict
    ('adaptive', 'biased')
    """
    w = WEIGHTINGS[scheme]
    inclusion = getattr(selector, "inclusion", "adaptive")
    use = _unbiased_for(selector)
    if getattr(selector, "data_share_in_sample", False) and scheme in (
        "renormalized",
        "uniform",
    ):
        return Pairing(
            "refused", "the data share counts twice: in the draw and in w_i", use
        )
    if w.multiplicities and not getattr(selector, "with_replacement", False):
        return Pairing(
            "refused", "k_i / q needs a selector drawing with replacement", use
        )
    if w.scheme == "uniform" and inclusion != "uniform":
        return Pairing("refused", "p_i m / q assumes a uniform draw", use)
    if inclusion == "adaptive":
        return Pairing("adaptive", "selection probabilities have no closed form")
    if w.assumes == inclusion and (
        w.multiplicities or not getattr(selector, "with_replacement", False)
    ):
        return Pairing("unbiased", f"w_i = {w.formula} matches the draw")
    if inclusion == "proportional":
        return Pairing(
            "refused", "clients drawn twice count once: large clients lose weight", use
        )
    if scheme == "equal":
        return Pairing("biased", "targets the unweighted mean (1/m) sum_i f_i")
    return Pairing(
        "biased", "common practice: sampled clients' weights always sum to 1"
    )


def pairing_problem(selector: Any, algorithm: Any) -> str | None:
    """The scenario error for a refused pairing of ``selector`` and the
    algorithm's weighting, naming both fields and the unbiased choice; None
    when the pair is allowed or the algorithm's weights are its own
    (``Algorithm.weighting()`` is None)."""
    scheme = algorithm.weighting()
    if scheme is None:
        return None
    verdict = pairing(selector, scheme)
    if verdict.verdict != "refused":
        return None
    name = selector.name
    fix = (
        f"use algorithm.sampling '{verdict.use}' (w_i = "
        f"{WEIGHTINGS[verdict.use].formula}) with selector '{name}'"
        if verdict.use is not None
        else "use algorithm.sampling 'renormalized' or 'equal'"
    )
    return (
        f"selector.name '{name}' with algorithm.sampling '{scheme}' "
        f"(w_i = {WEIGHTINGS[scheme].formula}) is biased: {verdict.reason}; "
        f"{fix}, or selector 'uniform' with algorithm.sampling 'uniform' "
        "(the pairing table is in docs/scenarios.md)"
    )


def sampling_extras(scheme: Scheme, info: ClientInfo) -> dict[str, torch.Tensor]:
    """What a client uploads so that the server can weight it under ``scheme``."""
    if scheme == "uniform":
        return {"p_m": torch.tensor(info.relative_weight, dtype=torch.float64)}
    return {}


@dataclass(frozen=True)
class Sampled(Algorithm):
    """Base of servers that weight updates by a sampling ``scheme`` (FedAvg,
    FedNova and their descendants): the field and the client's upload."""

    sampling: Scheme = "renormalized"

    def weighting(self) -> str | None:
        """The weighting is ``sampling`` (see :data:`WEIGHTINGS`)."""
        return self.sampling

    def client_finish(
        self, delta: torch.Tensor, solver_state: SolverState, client: ClientContext
    ) -> ClientResult:
        return sampling_extras(self.sampling, client.info), None


def unweighted_meter(updates: Sequence[ClientUpdate]) -> AggregateInfo:
    """The meter of a server that averages unweighted (SCAFFOLD, FedDyn, FedDC
    code form): w_i = 1/|S|, tau_eff the mean ||a_i||_1."""
    n = len(updates)
    tau_eff = updates_tau_eff("fedavg", [1.0] * n, updates)
    return meter(updates, data_weights(updates), [1.0 / n] * n, tau_eff)


def weight_shares(
    num_clients: int,
    client_ids: ArrayLike,
    weights: ArrayLike,
    rounds: int,
) -> np.ndarray:
    """Each client's share of the aggregation weight over a run.

    Args:
        num_clients: m.
        client_ids, weights: one entry per client row of the run (a client of
            a round, or an update of an asynchronous version): the client and
            the weight its delta got in the server step as applied (0 for a
            dropped or removed update): normalised for renormalized and
            equal weights, p_i m / q or k_i / q for the unbiased schemes,
            whose weights sum to 1 only in expectation.
        rounds: the rounds (or server versions) that applied at least one
            update.

    Returns:
        float64 [m]: sum over rounds of the client's weight, divided by
        ``rounds`` (sums to 1, exactly or in expectation; all zeros when no
        round applied anything).

    >>> weight_shares(3, [0, 1, 0, 2], [0.5, 0.5, 1.0, 0.0], rounds=2).tolist()
    [0.75, 0.25, 0.0]
    """
    total = np.zeros(int(num_clients), dtype=np.float64)
    ids = np.asarray(client_ids, dtype=np.int64)
    w = np.nan_to_num(np.asarray(weights, dtype=np.float64), nan=0.0)
    np.add.at(total, ids, w)
    return total / rounds if rounds > 0 else total


def participation_bias(
    shares: np.ndarray, data_share: np.ndarray, top: int = 5
) -> dict[str, Any]:
    """summary.json's ``participation_bias``: the L1 distance between the
    clients' weight shares and their data shares p_i (over all clients), and
    the ``top`` clients whose weight share exceeds p_i the most.

    >>> out = participation_bias(np.array([0.7, 0.3]), np.array([0.5, 0.5]), 1)
    >>> round(out["l1"], 6), out["top_overweighted"][0]["client"]
    (0.4, 0)
    """
    s = np.asarray(shares, dtype=np.float64)
    p = np.asarray(data_share, dtype=np.float64)
    over = s - p
    # largest excess first; equal excesses by client id (a stable sort)
    order = np.argsort(-over, kind="stable")[:top]
    return {
        "l1": float(np.abs(over).sum()),
        "top_overweighted": [
            {
                "client": int(i),
                "weight_share": float(s[i]),
                "data_share": float(p[i]),
            }
            for i in order
            if over[i] > 0
        ],
    }
