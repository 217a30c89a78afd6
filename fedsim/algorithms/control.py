"""The client half shared by algorithms with SCAFFOLD-style control variates.

Clients download the server's control variate c with the model, and every
local gradient is corrected by c - c_i, a constant within the round
(SCAFFOLD, ALGORITHMS.md 7; FedNova-VR, 5.5). :class:`ControlVariates` is
the base class (first in the bases, before the algorithm's own server class):
it adds c to the server state and the payload, the correction and its
gradient hook; the subclass writes ``client_finish`` (its c_i update, with
:func:`control_step`) and ``aggregate`` (with :func:`control_aggregate`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from fedsim.algorithms.base import (
    Algorithm,
    ClientContext,
    ClientState,
    ClientUpdate,
    ServerState,
)
from fedsim.lazy import torch
from fedsim.params import weighted_sum
from fedsim.solvers import normalized_gradient

if TYPE_CHECKING:
    from fedsim.solvers import SolverState

__all__ = ["ControlVariates", "control_aggregate", "control_step", "control_update"]


def control_update(
    delta: torch.Tensor,
    solver_state: SolverState,
    correction: torch.Tensor,
    c_i: torch.Tensor,
) -> torch.Tensor:
    """The new control variate c_i^+ = -Delta_i / (lr ||a_i||_1) - correction.

    ``correction`` is the round's gradient correction (SCAFFOLD and
    FedNova-VR: c - c_i; FedDC: c / w_i - c_i). A client that took no step
    (||a_i||_1 = 0) has no gradient estimate and keeps c_i (a copy).

    >>> from fedsim.solvers import SolverState
    >>> st = SolverState(x0=torch.zeros(1), lr=0.5, steps=2, norm_a=2.0)
    >>> control_update(torch.tensor([-3.0]), st, torch.tensor([1.0]),
    ...                torch.tensor([4.0]))
    tensor([2.])
    """
    if solver_state.norm_a > 0:
        return normalized_gradient(delta, solver_state) - correction
    return c_i.clone()


def control_step(
    delta: torch.Tensor,
    solver_state: SolverState,
    correction: torch.Tensor,
    state: ClientState,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(c_i, c_i^+): the client's control variate before the round (from its
    persistent ``state``, zeros if it has none) and after it."""
    c_i = state.get("c", torch.zeros_like(delta))
    return c_i, control_update(delta, solver_state, correction, c_i)


def control_aggregate(
    state: ServerState, updates: Sequence[ClientUpdate], weights: Sequence[float]
) -> torch.Tensor:
    """The server's new c = c + sum_i weights_i dc_i over the round's uploads."""
    return state["c"] + weighted_sum([u.extras["dc"] for u in updates], weights)


@dataclass(frozen=True)
class ControlVariates(Algorithm):
    """State c (2d down, 2d up), payload (x, c), correction c - c_i, and the
    gradient hook adding it."""

    stateful: ClassVar[bool] = True
    down_factor: ClassVar[int] = 2
    up_factor: ClassVar[int] = 2

    def init(self, x0: torch.Tensor, num_clients: int) -> ServerState:
        return {**super().init(x0, num_clients), "c": torch.zeros_like(x0)}

    def payload(self, state: ServerState) -> dict[str, torch.Tensor]:
        return {"x": state["x"], "c": state["c"]}

    def local_setup(self, client: ClientContext) -> torch.Tensor:
        c = client.payload["c"]
        c_i = client.state.get("c")
        return c if c_i is None else c - c_i  # never mutated: no copy

    def grad_hook(
        self, theta: torch.Tensor, grad: torch.Tensor, client: ClientContext
    ) -> None:
        grad.add_(client.local)
