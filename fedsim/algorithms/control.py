"""The client half shared by algorithms with SCAFFOLD-style control variates.

Clients download c and correct every local gradient by c - c_i (SCAFFOLD,
docs/algorithms.md 7; FedNova-VR, 5.5). :class:`ControlVariates` goes first in the
bases; the subclass's ``aggregate`` updates c with :func:`control_aggregate`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import fedsim.algorithms.base as base
from fedsim.lazy import torch
from fedsim.params import weighted_sum
from fedsim.solvers import SolverState, normalized_gradient


def control_step(
    delta: torch.Tensor,
    solver_state: SolverState,
    correction: torch.Tensor,
    state: base.ClientState,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(c_i^+ - c_i, c_i^+) with c_i^+ = -Delta_i / (lr ||a_i||_1) - correction.

    ``correction`` is the round's c - c_i (FedDC: c / w_i - c_i); c_i comes
    from ``state`` (else 0) and a client that took no step keeps it.

    >>> from fedsim.solvers import SolverState
    >>> st = SolverState(x0=torch.zeros(1), lr=0.5, steps=2, norm_a=2.0)
    >>> control_step(torch.tensor([-3.0]), st, torch.tensor([1.0]),
    ...              {"c": torch.tensor([4.0])})
    (tensor([-2.]), tensor([2.]))
    """
    c_i = state.get("c", torch.zeros_like(delta))
    if solver_state.norm_a > 0:
        c_new = normalized_gradient(delta, solver_state) - correction
    else:
        c_new = c_i.clone()
    return c_new - c_i, c_new


def control_aggregate(
    state: base.ServerState, updates: base.Updates, weights: Sequence[float]
) -> torch.Tensor:
    """The server's new c = c + sum_i weights_i dc_i over the round's uploads."""
    return state["c"] + weighted_sum([u.extras["dc"] for u in updates], weights)


@dataclass(frozen=True)
class ControlVariates(base.Algorithm):
    """State c (2d down, 2d up), payload (x, c), the correction c - c_i added
    to every gradient, and the upload dc = c_i^+ - c_i."""

    stateful: ClassVar[bool] = True
    down_factor: ClassVar[int] = 2
    up_factor: ClassVar[int] = 2

    def init(self, x0: torch.Tensor, num_clients: int) -> base.ServerState:
        return {**super().init(x0, num_clients), "c": torch.zeros_like(x0)}

    def payload(self, state: base.ServerState) -> dict[str, torch.Tensor]:
        return {"x": state["x"], "c": state["c"]}

    def local_setup(self, client: base.ClientContext) -> torch.Tensor:
        c = client.payload["c"]
        c_i = client.state.get("c")
        return c if c_i is None else c - c_i  # never mutated: no copy

    def grad_hook(
        self, theta: torch.Tensor, grad: torch.Tensor, client: base.ClientContext
    ) -> None:
        grad.add_(client.local)

    def stacked_grad_hook(
        self, clients: Sequence[base.ClientContext]
    ) -> base.StackedHook:
        """+ (c - c_i) on every row at once."""
        corr = torch.stack([c.local for c in clients])

        def control(n: int, theta: torch.Tensor, g: torch.Tensor) -> None:
            g.add_(corr[:n])

        return control

    def client_finish(
        self, delta: torch.Tensor, solver_state: SolverState, client: base.ClientContext
    ) -> base.ClientResult:
        extras, _ = super().client_finish(delta, solver_state, client)
        dc, c_new = control_step(delta, solver_state, client.local, client.state)
        return {**extras, "dc": dc}, {"c": c_new}
