"""Aggregation weights under client sampling (docs/algorithms.md sections 3 and 5.4).

A ``scheme`` (``algorithm.sampling``, :data:`WEIGHTINGS`) names how a round's
updates are weighted given how the selector sampled them: ``renormalized`` (the
default, biased under partial participation), ``uniform`` (scheme (ii)),
``proportional`` (scheme (i)) or ``equal``. :func:`pairing` judges a scheme
against a selector's draw; the table and measured biases: docs/scenarios.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, cast

import numpy as np
from numpy.typing import ArrayLike

import fedsim.algorithms.base as base
from fedsim.algorithms.weighting import updates_tau_eff
from fedsim.lazy import torch
from fedsim.solvers import SolverState


class Selector(Protocol):
    """What the pairing reads of a selector (``fedsim.selectors``, which
    imports this package, so it is not imported back): its name; its
    sampling traits by ``getattr`` with defaults (a plug-in may lack them)."""

    @property
    def name(self) -> str:
        """The scenario's ``selector.name``."""


Scheme = Literal["renormalized", "uniform", "proportional", "equal"]
# How a selector draws (``Selector.inclusion``): ``uniform`` (q/m each),
# ``proportional`` (in proportion to p_i) or ``adaptive`` (no closed form).
Inclusion = Literal["uniform", "proportional", "adaptive"]
Verdict = Literal["unbiased", "biased", "adaptive", "refused"]


@dataclass(frozen=True)
class Weighting:
    """What an aggregation weighting assumes about how clients were sampled."""

    scheme: Scheme
    formula: str  # w_i, for tables and messages
    assumes: Inclusion | None  # the inclusion it is unbiased for (None: none)
    multiplicities: bool = False  # reads how often each client was drawn


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
    """Scheme (ii): w_i = p_i m / q (``p_m`` = p_i m)."""
    if q <= 0:
        raise ValueError("q must be positive")
    return [float(v) / q for v in p_m]


def proportional_weights(multiplicity: Sequence[int]) -> list[float]:
    """Scheme (i): a client drawn k_i times of q = sum k gets k_i / q."""
    q = int(sum(int(k) for k in multiplicity))
    if q <= 0 or any(int(k) < 1 for k in multiplicity):
        raise ValueError("every sampled client needs a multiplicity >= 1")
    return [int(k) / q for k in multiplicity]


def equal_weights(n: int) -> list[float]:
    """``equal``: w_i = 1 / n."""
    if n <= 0:
        raise ValueError("n must be positive")
    return [1.0 / n] * n


def _scalars(updates: base.Updates, key: str, error: str) -> list[float]:
    """Each update's scalar extra ``key`` (else ``error``)."""
    if any(key not in u.extras for u in updates):
        raise ValueError(error)
    return [float(u.extras[key]) for u in updates]


def sampling_weights(updates: base.Updates, scheme: Scheme) -> list[float]:
    """Each update's weight in the server step (in update order)."""
    if scheme == "renormalized":
        return base.data_weights(updates)
    if scheme == "uniform":
        need = "sampling 'uniform' needs each update's p_m extra"
        return uniform_weights(_scalars(updates, "p_m", need), len(updates))
    if scheme == "proportional":
        need = (
            "sampling 'proportional' (scheme (i), with replacement) needs each "
            "update's multiplicity, which only a selector drawing with "
            "replacement can give; no selector does yet"
        )
        ks = _scalars(updates, "multiplicity", need)
        return proportional_weights([int(k) for k in ks])
    if scheme == "equal":
        return equal_weights(len(updates))
    raise ValueError(f"unknown sampling scheme {scheme!r}")


@dataclass(frozen=True)
class Pairing:
    """The verdict on a (selector, weighting) pair; all but ``refused`` are allowed."""

    verdict: Verdict
    reason: str  # one sentence on why
    use: Scheme | None = None  # the weighting to use instead (refused pairs)


def pairing(selector: Selector, scheme: str) -> Pairing:
    """Whether weighting ``scheme`` fits how ``selector`` samples (its
    ``inclusion``, ``with_replacement`` and ``data_share_in_sample``).

    Args:
        selector: The scenario's selector; one without those attributes is
            taken as adaptive, drawing without replacement.
        scheme: A key of :data:`WEIGHTINGS`.

    Returns:
        ``unbiased``: the weighted mean's expectation is the full-participation
        one; ``biased``: allowed, the bias documented; ``adaptive``: no closed
        form to judge by; ``refused``: the scenario is rejected, ``use`` naming
        the weighting that fits (the selector's own, else its inclusion's).

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
    replacement = getattr(selector, "with_replacement", False)
    use = _preferred(selector, inclusion)

    if (why := _refusal(selector, w, inclusion, replacement)) is not None:
        return Pairing("refused", why, use)
    # the refusals above hold whatever the draw; an adaptive draw's bias
    # beyond them has no closed form to judge
    if inclusion == "adaptive":
        return Pairing("adaptive", "selection probabilities have no closed form")
    if w.assumes == inclusion and (w.multiplicities or not replacement):
        return Pairing("unbiased", f"w_i = {w.formula} matches the draw")
    if inclusion == "proportional":
        why = "clients drawn twice count once: large clients lose weight"
        return Pairing("refused", why, use)
    if scheme == "equal":
        return Pairing("biased", "targets the unweighted mean (1/m) sum_i f_i")
    return Pairing(
        "biased", "common practice: sampled clients' weights always sum to 1"
    )


def _preferred(selector: Selector, inclusion: str) -> Scheme | None:
    """The weighting a refused pairing suggests: the selector's own
    (``default_weighting``, e.g. the paper's), else the unbiased one for its
    inclusion; None for an adaptive selector that names none."""
    fit = inclusion if inclusion in ("uniform", "proportional") else None
    return cast(Scheme | None, getattr(selector, "default_weighting", None) or fit)


def _refusal(
    selector: Selector, w: Weighting, inclusion: str, replacement: bool
) -> str | None:
    """Why weighting ``w`` cannot fit a selector of this kind at all, whatever
    its draw's bias; None when nothing rules it out."""
    twice = w.scheme in ("renormalized", "uniform")
    if twice and getattr(selector, "data_share_in_sample", False):
        return "the data share counts twice: in the draw and in w_i"
    if w.multiplicities and not replacement:
        return "k_i / q needs a selector drawing with replacement"
    if w.scheme == "uniform" and inclusion != "uniform":
        return "p_i m / q assumes a uniform draw"
    return None


def pairing_problem(selector: Selector, algorithm: base.Algorithm) -> str | None:
    """The scenario error for a refused pairing, naming both fields and the
    unbiased choice; None when allowed or ``algorithm.weighting()`` is None."""
    scheme = algorithm.weighting()
    if scheme is None:  # weights fixed by the paper: unchecked
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


@dataclass(frozen=True)
class Sampled(base.Algorithm):
    """Base of servers weighting updates by a ``sampling`` scheme (FedAvg, FedNova)."""

    sampling: Scheme = "renormalized"

    def weighting(self) -> str | None:
        return self.sampling

    def client_finish(
        self, delta: torch.Tensor, solver_state: SolverState, client: base.ClientContext
    ) -> base.ClientResult:
        if self.sampling == "uniform":  # the server does not know n: upload p_i m
            p_m = torch.tensor(client.info.relative_weight, dtype=torch.float64)
            return {"p_m": p_m}, None
        return {}, None


def unweighted_meter(updates: base.Updates) -> base.AggregateInfo:
    """Meter of an unweighted server mean: w_i = 1/|S|, tau_eff mean ||a_i||_1."""
    n = len(updates)
    tau_eff = updates_tau_eff("fedavg", [1.0] * n, updates)
    return base.meter(updates, [1.0 / n] * n, tau_eff)


def weight_shares(
    num_clients: int, client_ids: ArrayLike, weights: ArrayLike, rounds: int
) -> np.ndarray:
    """Each client's share of the aggregation weight over a run, float64 [m]:
    the weights its deltas got in the server step as applied (one entry per
    client row), summed and divided by the ``rounds`` that applied an update."""
    total = np.zeros(int(num_clients), dtype=np.float64)
    ids = np.asarray(client_ids, dtype=np.int64)
    w = np.nan_to_num(np.asarray(weights, dtype=np.float64), nan=0.0)
    np.add.at(total, ids, w)
    return total / rounds if rounds > 0 else total


def participation_bias(
    shares: np.ndarray, data_share: np.ndarray, top: int = 5
) -> dict[str, object]:
    """summary.json's ``participation_bias``: L1 distance between weight
    shares and data shares p_i, and the ``top`` most overweighted clients."""
    s = np.asarray(shares, dtype=np.float64)
    p = np.asarray(data_share, dtype=np.float64)
    over = s - p
    # largest excess first; equal excesses by client id (a stable sort)
    order = np.argsort(-over, kind="stable")[:top]
    return {
        "l1": float(np.abs(over).sum()),
        "top_overweighted": [
            {"client": int(i), "weight_share": float(s[i]), "data_share": float(p[i])}
            for i in order
            if over[i] > 0
        ],
    }
