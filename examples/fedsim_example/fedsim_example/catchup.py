"""Catch-up learning rates: an illustration of fedsim's server hooks, not a
published method.

FedAvg whose server remembers which clients' updates it lost and gives
them a larger local step when they train again, so a client that is
often late or offline still moves the model when it does arrive. It uses
three hooks of ``fedsim.api`` (docs/extending.md, "Hooks"):

- ``RoundContext.failures`` (failures visible to the server rule): every
  round, ``aggregate`` adds one to ``lost[i]`` for each selected client i
  whose update did not arrive (late, offline, dropout, no_time, ...) and
  resets it for each client whose update did;
- ``Algorithm.instruct`` (per-client instructions): before training, each
  selected client gets its own ``lr_scale = 1 + gamma * min(lost[i], cap)``,
  which ``grad_hook`` applies by scaling its gradients (for SGD the same
  as scaling the learning rate); the clock still decides tau;
- ``AggregateInfo.metrics`` (plug-in metrics, through ``meter``): the
  share of the round's selected clients that were lost, and the mean lr
  scale of those that trained, as rounds.parquet columns
  ``alg_lost_share`` and ``alg_mean_lr_scale``.

Hand-computed case: clients 0 and 1 trained, client 2 was late; lost
becomes [0, 0, 1], and next round client 2 trains with 1 + 0.5 * 1 = 1.5:

>>> from fedsim.api import ClientUpdate, Failure, RoundContext
>>> alg = CatchUp(gamma=0.5)
>>> state = alg.init(torch.zeros(2), num_clients=3)
>>> ups = [ClientUpdate(c, torch.ones(2), 1, 1, 1.0, 0.0) for c in (0, 1)]
>>> ctx = RoundContext(round=0, failures=(Failure(2, "late"),))
>>> state, info = alg.aggregate(state, ups, ctx)
>>> state["lost"].tolist(), info.metrics["lost_share"]
([0.0, 0.0, 1.0], 0.3333333333333333)
>>> {c: float(v["lr_scale"]) for c, v in alg.instruct(state, [1, 2], 1).items()}
{1: 1.0, 2: 1.5}
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated

from pydantic import Field

from fedsim.api import (
    PLAIN_ROUND,
    AggregateInfo,
    Algorithm,
    ClientContext,
    RoundContext,
    ServerState,
    Updates,
    data_weights,
    meter,
)
from fedsim.lazy import torch


@dataclass(frozen=True)
class CatchUp(Algorithm):
    """FedAvg with a larger local step for clients whose updates were lost
    (module docstring). ``gamma``: the lr scale added per lost round;
    ``cap``: at most this many lost rounds count."""

    gamma: Annotated[float, Field(ge=0)] = 0.5
    cap: Annotated[int, Field(ge=0)] = 4

    def init(self, x0: torch.Tensor, num_clients: int) -> ServerState:
        # lost[i]: rounds in a row client i was selected and its update lost
        lost = torch.zeros(num_clients, dtype=torch.float64)
        return {"x": x0.clone(), "lost": lost}

    def instruct(
        self, state: ServerState, clients: Sequence[int], round: int
    ) -> Mapping[int, Mapping[str, torch.Tensor | float]]:
        lost = state["lost"].clamp(max=float(self.cap))
        return {c: {"lr_scale": 1.0 + self.gamma * float(lost[c])} for c in clients}

    def grad_hook(
        self, theta: torch.Tensor, grad: torch.Tensor, client: ClientContext
    ) -> None:
        # every instructed client has its entry; a notebook call may not
        scale = client.payload.get("lr_scale")
        if scale is not None:
            grad.mul_(scale.to(grad.dtype))

    def aggregate(
        self, state: ServerState, updates: Updates, ctx: RoundContext = PLAIN_ROUND
    ) -> tuple[ServerState, AggregateInfo]:
        lost = state["lost"].clone()
        for f in ctx.failures:
            lost[f.client] += 1.0
        for u in updates:
            lost[u.client] = 0.0
        selected = len(updates) + len(ctx.failures)
        share = len(ctx.failures) / selected if selected else 0.0
        if not updates:  # nothing arrived: the model stays, the memory moves
            info = AggregateInfo({}, float("nan"), float("nan"))
            return {**state, "lost": lost}, info
        scales = [
            1.0 + self.gamma * min(float(state["lost"][u.client]), self.cap)
            for u in updates
        ]
        p = data_weights(updates)
        # float64 sums in update order, as fedsim's built-ins do
        step = sum(
            (pi * u.delta.double() for pi, u in zip(p, updates, strict=True)),
            torch.zeros_like(state["x"], dtype=torch.float64),
        )
        x = state["x"] + (self.server_lr * step).to(state["x"].dtype)
        metrics = {"lost_share": share, "mean_lr_scale": sum(scales) / len(scales)}
        # the scale multiplied the client's steps, so its ||a_i||_1 too:
        # w_i = p_i scale_i ||a_i||_1 (fedsim's convention, meter_average's)
        w = [pi * si * u.norm_a for pi, si, u in zip(p, scales, updates, strict=True)]
        return {"x": x, "lost": lost}, meter(updates, w, sum(w), p, metrics)
