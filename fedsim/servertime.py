"""The server as a device: its speed, and what its work costs on the clock.

A scenario's ``server`` section gives the server's speed in FLOP/s (or a
preset); the clock then bills each server step: the aggregation rule's
arithmetic (:meth:`Algorithm.server_flops`, 2 FLOPs per multiply-add as
client FLOPs are counted), and the work a step reports in
``AggregateInfo.server_work``: samples trained on the server's network
(FedDM's server epochs) and samples evaluated where the evaluation gates the
next round (a rule's validation loss: FedPNS's CHECK LOSS), each priced at
the model's FLOPs per sample as :mod:`fedsim.flops` counts them for the
clients. The default, ``flops_per_s: inf``, bills nothing and keeps every
result as it was, bit for bit (docs/fleets.md, "The server's clock").

Imports no torch: the FLOPs per sample are counted by the runtime and
handed in.

Example:
    >>> spec = ServerSpec(preset="a100")
    >>> spec.rate
    19500000000000.0
    >>> clock = ServerClock(spec.rate, train_flops=3e6, forward_flops=1e6)
    >>> clock.seconds(2.0 * 10 * 1_000_000, ServerWork(train_samples=1000))
    0.00015487179487179488
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from pydantic import ConfigDict, field_serializer, field_validator, model_validator

from fedsim.algorithms.base import ServerWork
from fedsim.clock import ServedVersion, Version
from fedsim.rows import Row, number
from fedsim.spec import Spec

# Peak FP32 rates of common server parts, from the makers' data sheets; a
# real aggregation reaches a fraction of peak, so a preset is a lower bound
# on the server's time (state a measured rate as flops_per_s instead).
SERVER_PRESETS: dict[str, float] = {
    # AMD EPYC 7763 (one socket): 64 cores x 2.45 GHz base x 32 FP32 FLOP a
    # cycle (two 256-bit FMA units): 5.0e12
    "cpu-socket": 64 * 2.45e9 * 32,
    # NVIDIA A100 (SXM or PCIe), FP32 without tensor cores: 19.5 TFLOP/s
    "a100": 19.5e12,
    # NVIDIA H100 SXM, FP32 without tensor cores: 67 TFLOP/s
    "h100": 67.0e12,
}

# A forward pass costs about a third of a training step (the backward pass
# computes two products per forward product: fedsim/flops.py's rule for a
# model that declares its forward FLOPs).
FORWARD_SHARE = 1.0 / 3.0


class ServerSpec(Spec):
    """The scenario's ``server`` section: the server's speed.

    Give ``flops_per_s`` (a number, or ``inf``: the server's work takes no
    simulated time, today's behaviour) or a ``preset`` of
    :data:`SERVER_PRESETS`, not both.
    """

    # inf is this section's one meaningful non-finite value
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=True)

    flops_per_s: float | None = None
    preset: Literal["cpu-socket", "a100", "h100"] | None = None

    @field_validator("flops_per_s")
    @classmethod
    def _positive(cls, v: float | None) -> float | None:
        """A speed above 0 (NaN refused; ``inf`` allowed)."""
        if v is not None and not v > 0:
            raise ValueError("must be a number above 0 (or inf: a free server)")
        return v

    @field_serializer("flops_per_s")
    def _word(self, v: float | None) -> float | str | None:
        """``inf`` is written as the word (the form a scenario file takes:
        the loader refuses YAML's non-finite floats), so every run folder's
        scenario.yaml loads again."""
        return "inf" if v is not None and math.isinf(v) else v

    @model_validator(mode="after")
    def _one(self) -> ServerSpec:
        """A speed is given once: as a number or as a preset."""
        if self.flops_per_s is not None and self.preset is not None:
            raise ValueError("give flops_per_s or preset, not both")
        return self

    @property
    def rate(self) -> float:
        """The server's FLOP/s (inf when neither field is given)."""
        if self.preset is not None:
            return SERVER_PRESETS[self.preset]
        return math.inf if self.flops_per_s is None else float(self.flops_per_s)

    @property
    def free(self) -> bool:
        """Whether the server's work costs no simulated time."""
        return math.isinf(self.rate)


@dataclass(frozen=True)
class ServerClock:
    """What one server step costs, in simulated seconds.

    Attributes:
        flops_per_s: the server's speed (finite).
        train_flops: FLOPs of training on one sample (forward and backward),
            counted by :func:`fedsim.flops.step_flops` divided by the batch.
        forward_flops: FLOPs of evaluating one sample (forward only).
    """

    flops_per_s: float
    train_flops: float
    forward_flops: float

    def seconds(self, rule_flops: float, work: ServerWork) -> float:
        """Seconds of a step: the rule's FLOPs plus the step's reported work.

        Args:
            rule_flops: :meth:`Algorithm.server_flops` for the step.
            work: what the step reported (and the server counted).
        """
        flops = (
            rule_flops
            + work.flops
            + work.train_samples * self.train_flops
            + work.eval_samples * self.forward_flops
        )
        return flops / self.flops_per_s


def server_clock(
    spec: ServerSpec | None, step_flops: Callable[[], float], batch_size: int
) -> ServerClock | None:
    """The run's :class:`ServerClock`, or None for a free server (nothing
    billed: the loops then take exactly today's path).

    Args:
        spec: the scenario's ``server`` section (None: free).
        step_flops: counts the FLOPs of one local training step of the
            model (called only for a server that takes time).
        batch_size: the batch that step is of.
    """
    if spec is None or spec.free:
        return None
    per_sample = step_flops() / batch_size
    return ServerClock(spec.rate, per_sample, per_sample * FORWARD_SHARE)


class _Rule(Protocol):
    """What the server's clock asks of the algorithm."""

    def server_flops(self, n_updates: int, d: int) -> float:
        """FLOPs of the rule's arithmetic on ``n_updates`` updates."""


class ServerTimer:
    """The server's time over one run: each step's seconds, the server's
    busy seconds so far, and the rounds.parquet columns that show them.

    Guarantees: a step's seconds are a pure function of (the scenario, the
    step's update count and reported work), so they are the same with any
    number of workers and after a resume (:meth:`restore` sums the kept
    rows' ``server_s``).

    Args:
        clock: the server's speed and the model's FLOPs per sample.
        rule: the algorithm (its :meth:`server_flops`).
        d: the model's parameter count.
    """

    def __init__(self, clock: ServerClock, rule: _Rule, d: int) -> None:
        self.clock = clock
        self.rule = rule
        self.d = d
        self.busy_s = 0.0

    def step_s(self, n_updates: int, work: ServerWork | None = None) -> float:
        """Seconds of one step on ``n_updates`` updates with ``work``."""
        rule_flops = self.rule.server_flops(n_updates, self.d)
        return self.clock.seconds(rule_flops, work or _NO_WORK)

    def round_end(
        self, t_end: float, n_updates: int, work: ServerWork
    ) -> tuple[float, dict[str, float]]:
        """When a synchronous round's server step ends (the next round
        starts then), and the round's ``server_s`` and ``server_busy``
        (busy seconds so far over the time so far) columns.

        Args:
            t_end: when the round's last awaited update arrived.
            n_updates: the updates the step aggregated.
            work: what the step reported on the server's network.
        """
        busy = self.step_s(n_updates, work)
        self.busy_s += busy
        end = t_end + busy
        return end, {"server_s": busy, "server_busy": _share(self.busy_s, end)}

    def version_columns(self, version: Version, server_s: float) -> dict[str, float]:
        """An asynchronous version's ``server_s``, ``server_queue`` (applied
        updates waiting when it was made) and ``server_busy`` columns."""
        if not isinstance(version, ServedVersion):
            return {}
        return {
            "server_s": server_s,
            "server_queue": float(version.queued),
            "server_busy": _share(version.busy_s, version.t),
        }

    def restore(self, rows: Sequence[Row]) -> None:
        """Busy seconds so far from a resumed run's kept rows."""
        self.busy_s = sum(number(r["server_s"], "server_s") for r in rows)


_NO_WORK = ServerWork()


def _share(busy_s: float, t: float) -> float:
    """Busy seconds over elapsed seconds (0 at t = 0)."""
    return busy_s / t if t > 0 else 0.0


def server_summary(rows: Sequence[Row]) -> dict[str, float] | None:
    """summary.json's ``server`` entry of the realised block: the server's
    busy share over the run, its total seconds, and the queue's mean and
    largest length (asynchronous runs); None for a free server (no
    ``server_s`` column).

    Example:
        >>> server_summary([{"sim_time": 10.0, "server_s": 1.0, "server_busy": 0.1},
        ...                 {"sim_time": 20.0, "server_s": 3.0, "server_busy": 0.2}])
        {'busy_share': 0.2, 'busy_s': 4.0}
    """
    if not rows or "server_s" not in rows[-1]:
        return None
    out = {
        "busy_share": number(rows[-1]["server_busy"], "server_busy"),
        "busy_s": sum(number(r["server_s"], "server_s") for r in rows),
    }
    if "server_queue" in rows[-1]:
        queue = [number(r["server_queue"], "server_queue") for r in rows]
        out |= {"queue_mean": sum(queue) / len(queue), "queue_max": max(queue)}
    return out
