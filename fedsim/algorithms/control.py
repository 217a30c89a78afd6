"""The client half shared by algorithms with SCAFFOLD-style control variates.

Clients download the server's control variate c with the model, and every
local gradient is corrected by c - c_i, a constant within the round
(SCAFFOLD, ALGORITHMS.md 7; FedNova-VR, 5.5). Used as a mixin next to the
algorithm's own base class; the subclass writes ``client_finish`` (its c_i
update) and ``aggregate``.
"""

from __future__ import annotations

from typing import Any

import torch

from fedsim.algorithms.base import ClientInfo, ClientState, ServerState

__all__ = ["ControlVariates"]


class ControlVariates:
    """payload (x, c), correction c - c_i, and the gradient hook adding it."""

    def payload(self, state: ServerState) -> dict[str, torch.Tensor]:
        return {"x": state["x"], "c": state["c"]}

    def local_setup(
        self,
        payload: dict[str, torch.Tensor],
        client_state: ClientState,
        info: ClientInfo,
    ) -> torch.Tensor:
        c = payload["c"]
        c_i = client_state.get("c")
        return c.clone() if c_i is None else c - c_i

    def grad_hook(self, theta: torch.Tensor, grad: torch.Tensor, ctx: Any) -> None:
        grad.add_(ctx)
