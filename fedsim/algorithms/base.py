"""What every aggregation algorithm shares: the update record and the interface.

An algorithm is a frozen dataclass of hyperparameters. Its state (server
state and per-client state) goes in and comes out, so the object pickles for
Ray and cannot drift (see docs/architecture.md, "Core interfaces"). The
dataclass *is* the scenario's ``algorithm`` section: pydantic validates its
fields (with their ``Annotated`` constraints) and runs ``__post_init__`` when a
scenario is loaded, so each hyperparameter is declared exactly once.

The client half and the server half of an algorithm live in the same module:

- ``init(x0)``: the server state (a dict of tensors) for initial parameters.
- ``solver(client)``: the local solver the clients use.
- ``aggregate(state, updates)``: the new server state and what the round's
  aggregation did (effective weights, tau_eff, chi^2(p||w)).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

import torch

from fedsim.params import chi2
from fedsim.solvers import SGD, make_solver
from fedsim.spec import PLUGIN_CONFIG, PosFloat

if TYPE_CHECKING:
    from fedsim.scenario import ClientSpec

__all__ = ["ClientUpdate", "AggregateInfo", "Algorithm", "ServerState"]

ServerState = dict[str, torch.Tensor]


@dataclass(frozen=True)
class ClientUpdate:
    """What one client sends back after a round of local training."""

    client: int
    delta: torch.Tensor  # x_i^{t,tau_i} - x^t
    weight: float  # data weight n_i (or p_i); normalised over the round's updates
    tau: int  # local steps taken
    norm_a: float  # ||a_i||_1 of the local solver
    train_loss: float  # mean minibatch loss during local training
    extras: dict[str, torch.Tensor] = field(default_factory=dict)


@dataclass(frozen=True)
class AggregateInfo:
    """What a round's aggregation did, for the objective-inconsistency meter."""

    weights: dict[int, float]  # effective weight w_i each update received
    tau_eff: float
    chi2_pw: float  # chi^2(p || w), with p the data weights of the round's updates


@dataclass(frozen=True)
class Algorithm:
    """Base class. Subclasses declare ``name: Literal["<name>"]`` and their
    hyperparameters as fields, and override ``aggregate`` (and ``solver`` when
    their clients solve differently)."""

    __pydantic_config__: ClassVar = PLUGIN_CONFIG

    name: str = "base"
    server_lr: PosFloat = 1.0

    def init(self, x0: torch.Tensor) -> ServerState:
        return {"x": x0.clone()}

    def solver(self, client: ClientSpec) -> SGD:
        return make_solver(client)

    def aggregate(
        self, state: ServerState, updates: Sequence[ClientUpdate]
    ) -> tuple[ServerState, AggregateInfo]:
        raise NotImplementedError


def data_weights(updates: Sequence[ClientUpdate]) -> list[float]:
    """p_i of the round's updates, normalised to sum to 1 (in update order)."""
    total = float(sum(u.weight for u in updates))
    return [u.weight / total for u in updates]


def meter(
    updates: Sequence[ClientUpdate],
    p: Sequence[float],
    w: Sequence[float],
    tau_eff: float,
) -> AggregateInfo:
    """Package effective weights ``w`` (normalised here) with chi^2(p || w)."""
    sw = float(sum(w))
    weights = {u.client: wi / sw for u, wi in zip(updates, w, strict=True)}
    return AggregateInfo(weights=weights, tau_eff=float(tau_eff), chi2_pw=chi2(p, w))


def empty_info() -> AggregateInfo:
    return AggregateInfo(weights={}, tau_eff=float("nan"), chi2_pw=float("nan"))
