"""Plug-ins for the hostile user's cases (tests/test_silent_exits.py,
tests/test_report.py, tests/test_plugin_edges.py): ones that report
thousands of metrics, exit, run out of memory or stop the process. In a
module of their own so that a scenario can name them
(``tests.hostile_plugins:ManyMetrics``) and Ray workers can import them.
"""

from __future__ import annotations

import os
import signal
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from fedsim.algorithms.fedavg import FedAvg
from fedsim.api import PLAIN_ROUND, meter_average
from fedsim.spec import Model


@dataclass(frozen=True)
class ManyMetrics(FedAvg):
    """Reports ``count`` metrics a round (``alg_m0000`` ...)."""

    count: int = 40

    def aggregate(self, state, updates, ctx=PLAIN_ROUND):  # type: ignore[no-untyped-def]
        new, _ = super().aggregate(state, updates, ctx)
        metrics = {f"m{i:04d}": float(i) for i in range(self.count)}
        return new, meter_average(updates, metrics=metrics)


@dataclass(frozen=True)
class Exits(FedAvg):
    """Calls ``sys.exit(5)`` in its first aggregate."""

    def aggregate(self, state, updates, ctx=PLAIN_ROUND):  # type: ignore[no-untyped-def]
        sys.exit(5)


@dataclass(frozen=True)
class OwnMemoryError(FedAvg):
    """Raises its own MemoryError in its first aggregate (a plug-in's bug,
    not the system refusing memory to the run)."""

    def aggregate(self, state, updates, ctx=PLAIN_ROUND):  # type: ignore[no-untyped-def]
        raise MemoryError("my cache is full")


@dataclass(frozen=True)
class Interrupts(FedAvg):
    """Sends SIGINT to its own process in its first aggregate (a Ctrl-C
    early in a comparison's first run)."""

    def aggregate(self, state, updates, ctx=PLAIN_ROUND):  # type: ignore[no-untyped-def]
        os.kill(os.getpid(), signal.SIGINT)
        return super().aggregate(state, updates, ctx)


@dataclass(frozen=True)
class GradExits(FedAvg):
    """A client hook that calls ``sys.exit(7)`` while a client trains."""

    def grad_hook(self, theta, grad, client):  # type: ignore[no-untyped-def]
        sys.exit(7)


class StatedFlops(Model):
    """A linear model that states its forward FLOPs per sample as
    ``declared``, whatever that is (0, 0.4, -5, "1000", 10**400, ...)."""

    declared: Any = 1000

    def build(self, input_shape, num_classes):  # type: ignore[no-untyped-def]
        import torch

        width = int(np.prod(input_shape))
        return torch.nn.Sequential(
            torch.nn.Flatten(), torch.nn.Linear(width, num_classes)
        )

    def flops(self, input_shape, num_classes):  # type: ignore[no-untyped-def]
        return self.declared


class _Scale(nn.Module):
    """The first ``classes`` inputs times a weight each: elementwise work,
    which torch's FLOP counter does not count (it counts products of
    matrices and convolutions)."""

    def __init__(self, classes: int) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(classes))
        self.classes = classes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.flatten(1)[:, : self.classes] * self.w


class Uncounted(Model):
    """A model in which torch counts no FLOPs (:class:`_Scale`)."""

    def build(self, input_shape, num_classes):  # type: ignore[no-untyped-def]
        return _Scale(num_classes)


@dataclass(frozen=True)
class HugeMetric(FedAvg):
    """Reports a metric of 10**400 (no float holds it)."""

    def aggregate(self, state, updates, ctx=PLAIN_ROUND):  # type: ignore[no-untyped-def]
        new, _ = super().aggregate(state, updates, ctx)
        return new, meter_average(updates, metrics={"huge": 10**400})


@dataclass(frozen=True)
class HugeInstruction(FedAvg):
    """Instructs each client with a number of 10**400."""

    def instruct(self, state, clients, round):  # type: ignore[no-untyped-def]
        return {int(c): {"huge": 10**400} for c in clients}


@dataclass(frozen=True)
class TextState(FedAvg):
    """Keeps a string in its server state (no checkpoint can keep it)."""

    def init(self, x0, num_clients):  # type: ignore[no-untyped-def]
        return {**super().init(x0, num_clients), "note": "hello"}
