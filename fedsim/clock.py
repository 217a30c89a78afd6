"""Simulated time: plan a synchronous round as SimPy processes.

This is the only module that knows about SimPy (and it imports no torch and no
Ray). A round is planned before any real training happens: for each chosen
device the clock decides how many local steps ``tau`` it completes, when its
update reaches the server, and whether it is dropped. Real compute then runs
exactly those steps, so the outcome never depends on how fast the host is.

Each device is a SimPy process (download, compute, upload), in the spirit of
SimPy's machine-shop example: going offline mid-round is an interrupt, and the
server is a process that waits for every device or for the deadline.

Example:
    >>> import numpy as np
    >>> from fedsim.fleet import Fleet
    >>> from fedsim.fleet import FleetSpec
    >>> fleet = Fleet.from_spec(FleetSpec.model_validate({"groups": [
    ...     {"name": "phones", "count": 2,
    ...      "speed": {"dist": "fixed", "steps_per_s": 4.0},
    ...      "network": {"down_mbps": 8, "up_mbps": 8}}]}), seed=0)
    >>> rp = plan_round(fleet, np.array([0, 1]), now=0.0,
    ...                 policy=RoundSpec(window_s=10, max_steps=1000),
    ...                 rng=np.random.default_rng(0), bytes_down=1_000_000,
    ...                 bytes_up=1_000_000, n_samples=np.array([50, 50]),
    ...                 batch_size=10)
    >>> [(p.tau, p.t_arrive) for p in rp.plans], rp.t_end
    ([(32, 10.0), (32, 10.0)], 10.0)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Literal

import numpy as np
import simpy
from pydantic import Field, model_validator

from fedsim.fleet import Fleet
from fedsim.spec import PosFloat
from fedsim.spec import Spec as _Spec

__all__ = ["Plan", "RoundPlan", "plan_round"]

# Slack for floor(): compute_time * speed is 4.0 - 1e-15 more often than one
# would like (2.0 / 0.5 in floats), and a step must not be lost to rounding.
_EPS = 1e-9


class RoundSpec(_Spec):
    """How tau_i(t) arises (see docs/architecture.md, "Round policies").

    ``fixed_window``: the round lasts ``window_s``; a device computes in the
    time left after download and upload, tau = floor(time * speed) clipped to
    [0, max_steps]. ``fixed_epochs``: tau = floor(E_i * n_i / B) with E_i =
    ``epochs`` or drawn uniformly from ``[epochs_low, epochs_high]`` each
    round; the round ends when the slowest device arrives or at
    ``deadline_s`` (later arrivals are dropped).
    """

    policy: Literal["fixed_window", "fixed_epochs"] = "fixed_window"
    window_s: PosFloat = 10.0
    max_steps: Annotated[int, Field(ge=1, le=10_000_000)] = 100
    epochs: Annotated[int, Field(ge=1, le=100_000)] | None = 1
    epochs_low: Annotated[int, Field(ge=1, le=100_000)] | None = None
    epochs_high: Annotated[int, Field(ge=1, le=100_000)] | None = None
    deadline_s: PosFloat | None = None

    @model_validator(mode="after")
    def _epochs(self) -> RoundSpec:
        lo, hi = self.epochs_low, self.epochs_high
        if (lo is None) != (hi is None):
            raise ValueError("give both epochs_low and epochs_high, or neither")
        if lo is not None and hi is not None and hi < lo:
            raise ValueError(f"epochs_high ({hi}) must be >= epochs_low ({lo})")
        return self


@dataclass(frozen=True)
class Plan:
    """What one chosen device does in a round.

    Attributes:
        client: the device (client) id.
        tau: local steps the device completes. For a dropped device this is
            the work done and lost (0 for ``no_time``); it contributes nothing.
        t_start: when the round started (download begins).
        t_arrive: when the update reaches the server; for a dropped device,
            when it dropped (``offline``), gave up (``no_time``: the end of
            the window; ``no_data``: the round start) or would have arrived
            (``late``).
        dropped: True when the update does not count.
        reason: ``""``, ``"no_time"`` (no step fits in the window after
            communication), ``"no_data"`` (the device holds no samples),
            ``"offline"`` (went offline mid-round) or ``"late"`` (would arrive
            after the deadline).
        slowdown: this round's straggler factor (1.0 if not slowed).
        epochs: E_i under ``fixed_epochs``; None under ``fixed_window``.
    """

    client: int
    tau: int
    t_start: float
    t_arrive: float
    dropped: bool
    reason: str
    slowdown: float
    epochs: int | None

    @property
    def contributes(self) -> bool:
        """Whether the server aggregates this update."""
        return not self.dropped and self.tau > 0


@dataclass(frozen=True)
class RoundPlan:
    """The plans of one round, in increasing client id, and its time span."""

    plans: tuple[Plan, ...]
    t_start: float
    t_end: float

    @property
    def arrived(self) -> tuple[Plan, ...]:
        """The plans whose updates the server aggregates."""
        return tuple(p for p in self.plans if p.contributes)


def plan_round(
    fleet: Fleet,
    chosen: np.ndarray,
    now: float,
    policy: RoundSpec,
    rng: np.random.Generator,
    bytes_down: int,
    bytes_up: int,
    n_samples: np.ndarray,
    batch_size: int,
) -> RoundPlan:
    """Plan one synchronous round starting at simulated time ``now``.

    Randomness is drawn in a fixed order, so the plan is a pure function of
    the arguments and the state of ``rng``: first the straggler slowdowns of
    all chosen devices in increasing id, then (``fixed_epochs`` with
    ``epochs_low``/``epochs_high``) one E_i per device in increasing id.

    ``fixed_window`` (W = ``window_s``): a device computes for
    ``W - download - upload`` seconds at ``speed / slowdown`` steps per
    second; tau is the floor of that, clipped to ``[0, max_steps]``, and the
    round ends at ``now + W``. A device with no whole step to do is dropped as
    ``no_time``.

    ``fixed_epochs``: tau = floor(E_i * n_i / B), except that a device with
    fewer samples than a batch (0 < n_i < B) does one step per epoch, since
    one batch holds all its data. With ``deadline_s``, a device arriving after
    ``now + deadline_s`` is dropped as ``late``. The server waits until every
    device has arrived or dropped, but not past the deadline.

    Under both policies, a device that goes offline before it arrives (and
    before the deadline) is interrupted and dropped as ``offline``.

    Args:
        fleet: the devices.
        chosen: ids of the devices selected this round (distinct).
        now: simulated time at which the round starts.
        policy: the round policy.
        rng: generator for this round's stragglers and epochs.
        bytes_down: size of what each device downloads.
        bytes_up: size of what each device uploads.
        n_samples: training samples per device, indexed by client id.
        batch_size: B, samples per local step.

    Returns:
        A :class:`RoundPlan` with one plan per chosen device.
    """
    ids = np.sort(np.asarray(chosen, dtype=np.int64).reshape(-1))
    if np.any(ids[1:] == ids[:-1]):
        raise ValueError("chosen devices must be distinct")
    now = float(now)
    slowdown = fleet.draw_slowdowns(ids, rng)
    rate = fleet.speed[ids] / slowdown  # steps per simulated second this round
    down, up = fleet.comm_time(ids, bytes_down, bytes_up)

    if policy.policy == "fixed_window":
        epochs = None
        compute_s = policy.window_s - (down + up)
        tau = np.floor(compute_s * rate + _EPS * np.maximum(1.0, compute_s * rate))
        tau = np.clip(tau, 0, policy.max_steps).astype(np.int64)
        skip = np.where(tau == 0, "no_time", "")
        deadline = now + policy.window_s
    else:
        epochs = _draw_epochs(policy, ids.size, rng)
        n = np.asarray(n_samples, dtype=np.int64)[ids]
        tau = np.where(
            n < batch_size, np.where(n > 0, epochs, 0), epochs * n // batch_size
        )
        skip = np.where(tau == 0, "no_data", "")
        deadline = now + policy.deadline_s if policy.deadline_s else math.inf

    offline_at = fleet.offline_time(ids, now)
    sim = _Round(now, deadline, wait_for_all=policy.policy == "fixed_epochs")
    for j in range(ids.size):
        if not skip[j]:
            sim.add_device(
                j,
                float(down[j]),
                int(tau[j]),
                float(rate[j]),
                float(up[j]),
                float(offline_at[j]),
            )
    t_end = sim.run()

    plans = []
    for j, client in enumerate(ids.tolist()):
        if skip[j]:
            t_drop = deadline if skip[j] == "no_time" else now
            done, t_arrive, reason = 0, t_drop, str(skip[j])
        else:
            done, t_arrive, reason = sim.outcome[j]
            if policy.policy == "fixed_window":
                t_arrive = min(t_arrive, float(deadline))  # undo the floor's slack
        plans.append(
            Plan(
                client=client,
                tau=done,
                t_start=now,
                t_arrive=t_arrive,
                dropped=reason != "",
                reason=reason,
                slowdown=float(slowdown[j]),
                epochs=None if epochs is None else int(epochs[j]),
            )
        )
    return RoundPlan(plans=tuple(plans), t_start=now, t_end=t_end)


def _draw_epochs(policy: RoundSpec, n: int, rng: np.random.Generator) -> np.ndarray:
    if policy.epochs_low is not None and policy.epochs_high is not None:
        return rng.integers(policy.epochs_low, policy.epochs_high + 1, size=n)
    if policy.epochs is None:
        raise ValueError("fixed_epochs needs epochs, or epochs_low and epochs_high")
    return np.full(n, policy.epochs, dtype=np.int64)


class _Round:
    """One round on a SimPy timeline: device processes and a waiting server.

    The server stops waiting at ``deadline``, or (``wait_for_all``) as soon
    as every device has arrived or dropped. Devices still run to their
    would-be arrival, so a late device's plan records when that would be.
    """

    def __init__(self, now: float, deadline: float, wait_for_all: bool):
        self.env = simpy.Environment(initial_time=now)
        self.deadline = deadline
        self.wait_for_all = wait_for_all
        self.devices: list[simpy.Process] = []
        self.outcome: dict[int, tuple[int, float, str]] = {}
        self.t_end = now

    def add_device(
        self, j: int, down: float, tau: int, rate: float, up: float, offline_at: float
    ) -> None:
        env = self.env
        # A Pareto slowdown can overflow to inf, leaving a rate of 0.
        compute_s = tau / rate if rate > 0 else math.inf
        device = env.process(self._device(j, down, compute_s, tau, rate, up))
        self.devices.append(device)
        # The same additions SimPy makes, so "before arrival" is exact.
        arrival = env.now + down + compute_s + up
        if offline_at < min(arrival, self.deadline):
            env.process(self._go_offline(device, offline_at))

    def _device(
        self, j: int, down: float, compute_s: float, tau: int, rate: float, up: float
    ):
        env = self.env
        start = env.now
        try:
            yield env.timeout(down)
            yield env.timeout(compute_s)
            yield env.timeout(up)
        except simpy.Interrupt:
            # Steps finished before going offline: lost work, kept for metrics.
            computed_s = env.now - (start + down)
            done = min(tau, max(0, math.floor(computed_s * rate + _EPS)))
            self.outcome[j] = (done, env.now, "offline")
            return
        late = self.wait_for_all and env.now > self.deadline
        self.outcome[j] = (tau, env.now, "late" if late else "")

    def _go_offline(self, device: simpy.Process, at: float):
        yield self.env.timeout(at - self.env.now)
        if device.is_alive:
            device.interrupt("offline")

    def _server(self):
        env = self.env
        if not self.wait_for_all:
            yield env.timeout(self.deadline - env.now)
        elif self.deadline < math.inf:
            yield env.all_of(self.devices) | env.timeout(self.deadline - env.now)
        else:
            yield env.all_of(self.devices)
        self.t_end = env.now

    def run(self) -> float:
        """Run every process to its end; return when the server stopped waiting."""
        self.env.process(self._server())
        self.env.run()
        return self.t_end
