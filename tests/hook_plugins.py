"""Plug-ins for tests/test_hooks.py: ones that raise, ones that misuse a hook
(issue 39, "Misbehaving plug-ins"), and one that echoes its per-client
instructions. In a module of their own so that they pickle (Ray workers
import them by this path) and a scenario can name them
(``tests.hook_plugins:Boom``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from fedsim.algorithms.fedavg import FedAvg
from fedsim.api import (
    PLAIN_ROUND,
    AggregateInfo,
    ClientContext,
    RoundContext,
    ServerState,
    Updates,
    meter_average,
)
from fedsim.selectors.uniform import Uniform
from fedsim.solvers import SolverState

# Whether Boom raises: a test "fixes the plug-in" by setting it to False
# (the fix is in the code, not in the scenario, so a resume may follow it).
BROKEN = True


@dataclass(frozen=True)
class Boom(FedAvg):
    """FedAvg whose aggregate raises in round 2 while BROKEN."""

    def aggregate(
        self, state: ServerState, updates: Updates, ctx: RoundContext = PLAIN_ROUND
    ) -> tuple[ServerState, AggregateInfo]:
        if BROKEN and ctx.round == 2:
            raise ValueError("boom in round 2")
        return super().aggregate(state, updates, ctx)


@dataclass(frozen=True)
class WrongSize(FedAvg):
    """Returns the model with one parameter too few."""

    def aggregate(self, state, updates, ctx=PLAIN_ROUND):  # type: ignore[no-untyped-def]
        new, info = super().aggregate(state, updates, ctx)
        return {**new, "x": new["x"][:-1]}, info


@dataclass(frozen=True)
class AsList(FedAvg):
    """Returns the model as a list of floats."""

    def aggregate(self, state, updates, ctx=PLAIN_ROUND):  # type: ignore[no-untyped-def]
        new, info = super().aggregate(state, updates, ctx)
        return {**new, "x": new["x"].tolist()}, info


@dataclass(frozen=True)
class NoInfo(FedAvg):
    """Returns the state alone, without its AggregateInfo."""

    def aggregate(self, state, updates, ctx=PLAIN_ROUND):  # type: ignore[no-untyped-def]
        return super().aggregate(state, updates, ctx)[0]


@dataclass(frozen=True)
class WordMetric(FedAvg):
    """Reports a metric that is not a number."""

    def aggregate(self, state, updates, ctx=PLAIN_ROUND):  # type: ignore[no-untyped-def]
        new, _ = super().aggregate(state, updates, ctx)
        return new, meter_average(updates, metrics={"mood": "high"})  # type: ignore[dict-item]


@dataclass(frozen=True)
class GradBoom(FedAvg):
    """A client hook that raises on a worker."""

    def grad_hook(
        self, theta: torch.Tensor, grad: torch.Tensor, client: ClientContext
    ) -> None:
        raise ZeroDivisionError("grad_hook divides by zero")


@dataclass(frozen=True)
class StrayInstruction(FedAvg):
    """Instructs a client that does not train this round."""

    def instruct(
        self, state: ServerState, clients: Sequence[int], round: int
    ) -> Mapping[int, Mapping[str, torch.Tensor | float]]:
        return {10_000: {"lr_scale": 1.0}}


@dataclass(frozen=True)
class Echo(FedAvg):
    """Each client gets ``tag = 1000 round + client`` (instruct) and uploads
    it back (client_finish); aggregate reports how many tags came back
    right as the metric ``tags_ok`` (and, as ``lost``, how many failures
    the round's context listed)."""

    def instruct(
        self, state: ServerState, clients: Sequence[int], round: int
    ) -> Mapping[int, Mapping[str, torch.Tensor | float]]:
        return {c: {"tag": float(1000 * round + c)} for c in clients}

    def client_finish(
        self, delta: torch.Tensor, solver_state: SolverState, client: ClientContext
    ) -> tuple[dict[str, torch.Tensor], None]:
        return {"tag": client.payload["tag"].clone()}, None

    def aggregate(
        self, state: ServerState, updates: Updates, ctx: RoundContext = PLAIN_ROUND
    ) -> tuple[ServerState, AggregateInfo]:
        new, info = super().aggregate(state, updates, ctx)
        ok = sum(float(u.extras["tag"]) == 1000 * ctx.round + u.client for u in updates)
        lost = float(len(ctx.failures))
        return new, AggregateInfo(
            info.weights,
            info.tau_eff,
            info.chi2_pw,
            shares=info.shares,
            metrics={"tags_ok": float(ok), "lost": lost},
        )


@dataclass(frozen=True)
class Twice(Uniform):
    """Returns its first pick twice."""

    def select(self, state, draw):  # type: ignore[no-untyped-def]
        ids, state = super().select(state, draw)
        return np.concatenate([ids[:1], ids]), state


@dataclass(frozen=True)
class Outside(Uniform):
    """Returns an id that is not a candidate."""

    def select(self, state, draw):  # type: ignore[no-untyped-def]
        ids, state = super().select(state, draw)
        return np.append(ids, 10_000), state


@dataclass(frozen=True)
class FloatIds(Uniform):
    """Returns the ids as floats."""

    def select(self, state, draw):  # type: ignore[no-untyped-def]
        ids, state = super().select(state, draw)
        return ids.astype(np.float64), state


@dataclass(frozen=True)
class ArrayState(Uniform):
    """Keeps its state as a NumPy array (not JSON)."""

    def select(self, state, draw):  # type: ignore[no-untyped-def]
        ids, _ = super().select(state, draw)
        return ids, np.zeros(3)


@dataclass(frozen=True)
class Counting(Uniform):
    """Reports how many rounds it has seen as the metric ``seen``."""

    def observe(self, state, t, result, ctx):  # type: ignore[no-untyped-def]
        return {"seen": int((state or {}).get("seen", 0)) + 1}

    def metrics(self, state, round_):  # type: ignore[no-untyped-def]
        return {"seen": (state or {}).get("seen", 0)}
