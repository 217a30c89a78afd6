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

Example:
    >>> uniform_weights([0.4, 1.2], q=2)
    [0.2, 0.6]
    >>> proportional_weights([2, 1])
    [0.6666666666666666, 0.3333333333333333]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

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
from fedsim.lazy import lazy_import

if TYPE_CHECKING:
    import torch

    from fedsim.solvers import SolverState
else:  # imported on first use: validating a scenario needs no torch
    torch = lazy_import("torch")

__all__ = [
    "Sampled",
    "Scheme",
    "proportional_weights",
    "sampling_extras",
    "sampling_weights",
    "uniform_weights",
    "unweighted_meter",
]

Scheme = Literal["renormalized", "uniform", "proportional"]


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
    raise ValueError(f"unknown sampling scheme {scheme!r}")


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
