"""Simulated time: plan a synchronous round, or run the asynchronous timeline,
as SimPy processes.

This is the only module that knows about SimPy (and it imports no torch and no
Ray). A round is planned before any real training happens: for each chosen
device the clock decides how many local steps ``tau`` it completes, when its
update reaches the server, and whether it is dropped. Real compute then runs
exactly those steps, so the outcome never depends on how fast the host is.

Each device is a SimPy process (download, compute, upload), in the spirit of
SimPy's machine-shop example: going offline mid-round is an interrupt, and the
server is a process that waits for every device or for the deadline.

Asynchronous mode has no rounds: :class:`AsyncTimeline` runs one continuous
timeline of device loops and yields one :class:`Version` per server update.

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
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Annotated, Literal

import numpy as np
import simpy
from pydantic import Field, model_validator

from fedsim.fleet import Fleet
from fedsim.spec import PosFloat
from fedsim.spec import Spec as _Spec

__all__ = [
    "Arrival",
    "AsyncTimeline",
    "Job",
    "Plan",
    "RoundPlan",
    "RoundSpec",
    "Version",
    "plan_round",
]

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
    ``deadline_s`` (later arrivals are dropped). With ``over_select`` > 1
    the server selects ``ceil(over_select * k)`` devices and keeps the first
    k arrivals; the round ends at the k-th, later ones are dropped as
    ``surplus``.

    ``async``: no rounds; one continuous timeline (:class:`AsyncTimeline`).
    At most ``concurrency`` devices train at once (default: the selector's
    ``clients_per_round``). Each job computes ``max_steps`` local steps
    (``job_steps: max_steps``) or floor(E n_i / B) with E = ``epochs`` or
    drawn per job from ``[epochs_low, epochs_high]`` (``job_steps: epochs``).
    An update whose staleness exceeds ``max_staleness`` is dropped.
    ``window_s`` is not used.
    """

    policy: Literal["fixed_window", "fixed_epochs", "async"] = "fixed_window"
    window_s: PosFloat = 10.0
    max_steps: Annotated[int, Field(ge=1, le=10_000_000)] = 100
    epochs: Annotated[int, Field(ge=1, le=100_000)] | None = 1
    epochs_low: Annotated[int, Field(ge=1, le=100_000)] | None = None
    epochs_high: Annotated[int, Field(ge=1, le=100_000)] | None = None
    deadline_s: PosFloat | None = None
    concurrency: Annotated[int, Field(ge=1, le=10_000_000)] | None = None
    max_staleness: Annotated[int, Field(ge=0)] | None = None
    job_steps: Literal["max_steps", "epochs"] = "max_steps"
    over_select: Annotated[float, Field(ge=1, le=10)] = 1.0

    @model_validator(mode="after")
    def _epochs(self) -> RoundSpec:
        lo, hi = self.epochs_low, self.epochs_high
        if (lo is None) != (hi is None):
            raise ValueError("give both epochs_low and epochs_high, or neither")
        if lo is not None and hi is not None and hi < lo:
            raise ValueError(f"epochs_high ({hi}) must be >= epochs_low ({lo})")
        return self

    @model_validator(mode="after")
    def _over_select(self) -> RoundSpec:
        if self.over_select > 1 and self.policy != "fixed_epochs":
            raise ValueError(
                "over_select keeps the first k arrivals, so it needs policy "
                "'fixed_epochs' (under 'fixed_window' every update arrives at the "
                "end of the window; 'async' has concurrency instead)"
            )
        return self

    @model_validator(mode="after")
    def _async_fields(self) -> RoundSpec:
        if self.policy != "async":
            for name in ("concurrency", "max_staleness"):
                if getattr(self, name) is not None:
                    raise ValueError(f"{name} is only used with policy 'async'")
        elif self.deadline_s is not None:
            raise ValueError(
                "policy 'async' has no rounds, hence no deadline_s "
                "(max_staleness drops updates that come back too late)"
            )
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
            ``"offline"`` (went offline mid-round), ``"dropout"`` (dropped
            out mid-round, ``stragglers.dropout_p``), ``"late"`` (would arrive
            after the deadline) or ``"surplus"`` (arrived after the first
            ``keep``, under over-selection).
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
    keep: int | None = None,
) -> RoundPlan:
    """Plan one synchronous round starting at simulated time ``now``.

    Randomness is drawn in a fixed order, so the plan is a pure function of
    the arguments and the state of ``rng``: first the straggler slowdowns of
    all chosen devices in increasing id, then (``fixed_epochs`` with
    ``epochs_low``/``epochs_high``) one E_i per device in increasing id,
    then the dropouts (two uniforms per device, :meth:`Fleet.draw_dropouts`).

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
    before the deadline) is interrupted and dropped as ``offline``; one that
    drops out (with probability ``dropout_p``, at a time uniform within its
    download, compute and upload) is dropped as ``dropout``.

    With ``keep`` (over-selection, ``fixed_epochs``), the server stops
    waiting at the ``keep``-th arrival; arrivals after it (ties broken by
    client id) are dropped as ``surplus``.

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
        keep: keep only the first ``keep`` arrivals (None: all).

    Returns:
        A :class:`RoundPlan` with one plan per chosen device.
    """
    if policy.policy == "async":
        raise ValueError("policy 'async' has no rounds: use AsyncTimeline")
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
    with np.errstate(divide="ignore"):  # a rate of 0: an endless straggler
        work_s = down + np.where(rate > 0, tau / rate, np.inf) + up
    dropout_at = now + fleet.draw_dropouts(ids, rng, work_s)
    sim = _Round(now, deadline, wait_for_all=policy.policy == "fixed_epochs", keep=keep)
    for j in range(ids.size):
        if not skip[j]:
            sim.add_device(
                j,
                float(down[j]),
                int(tau[j]),
                float(rate[j]),
                float(up[j]),
                float(offline_at[j]),
                float(dropout_at[j]),
            )
    t_end = sim.run()
    if keep is not None:  # arrivals after the keep-th are surplus
        arrived = sorted((t, j) for j, (_, t, why) in sim.outcome.items() if not why)
        for _, j in arrived[keep:]:
            done, t_arrive, _ = sim.outcome[j]
            sim.outcome[j] = (done, t_arrive, "surplus")

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

    def __init__(
        self, now: float, deadline: float, wait_for_all: bool, keep: int | None = None
    ):
        self.env = simpy.Environment(initial_time=now)
        self.deadline = deadline
        self.wait_for_all = wait_for_all
        self.keep = keep
        self.arrived = 0
        self.enough = self.env.event()  # the keep-th arrival
        self.devices: list[simpy.Process] = []
        self.outcome: dict[int, tuple[int, float, str]] = {}
        self.t_end = now

    def add_device(
        self,
        j: int,
        down: float,
        tau: int,
        rate: float,
        up: float,
        offline_at: float,
        dropout_at: float = math.inf,
    ) -> None:
        env = self.env
        # A Pareto slowdown can overflow to inf, leaving a rate of 0.
        compute_s = tau / rate if rate > 0 else math.inf
        device = env.process(self._device(j, down, compute_s, tau, rate, up))
        self.devices.append(device)
        # The same additions SimPy makes, so "before arrival" is exact.
        arrival = env.now + down + compute_s + up
        leave_at, why = (
            (offline_at, "offline")
            if offline_at <= dropout_at
            else (dropout_at, "dropout")
        )
        if leave_at < min(arrival, self.deadline):
            env.process(self._go_offline(device, leave_at, why))

    def _device(
        self, j: int, down: float, compute_s: float, tau: int, rate: float, up: float
    ):
        env = self.env
        start = env.now
        try:
            yield env.timeout(down)
            yield env.timeout(compute_s)
            yield env.timeout(up)
        except simpy.Interrupt as stop:
            # Steps finished before leaving: lost work, kept for metrics.
            computed_s = env.now - (start + down)
            done = min(tau, max(0, math.floor(computed_s * rate + _EPS)))
            self.outcome[j] = (done, env.now, str(stop.cause))
            return
        late = self.wait_for_all and env.now > self.deadline
        self.outcome[j] = (tau, env.now, "late" if late else "")
        if not late and self.keep is not None:
            self.arrived += 1
            if self.arrived == self.keep:
                self.enough.succeed()

    def _go_offline(self, device: simpy.Process, at: float, why: str = "offline"):
        yield self.env.timeout(at - self.env.now)
        if device.is_alive:
            device.interrupt(why)

    def _server(self):
        env = self.env
        if not self.wait_for_all:
            yield env.timeout(self.deadline - env.now)
        else:
            wait = env.all_of(self.devices)
            if self.keep is not None:
                wait = wait | self.enough
            if self.deadline < math.inf:
                wait = wait | env.timeout(self.deadline - env.now)
            yield wait
        self.t_end = env.now

    def run(self) -> float:
        """Run every process to its end; return when the server stopped waiting."""
        self.env.process(self._server())
        self.env.run()
        return self.t_end


# ==================================================================== async
# Tags separating the async timeline's random streams from the seed's others.
_TAG_JOB = 0xA5C10B  # a job's straggler factor and epochs: (seed, tag, device, job)
_TAG_DISPATCH = 0xD15C  # which idle devices take free slots: (seed, tag, n)


@dataclass(frozen=True)
class Job:
    """One pass of a device's loop: download a version, compute, upload.

    It holds only what is known when the job starts; when (and whether) it
    ends is not part of it.

    Attributes:
        device: the device (client) id.
        index: how many jobs the device started before this one (0, 1, ...);
            with the device id it seeds the job's straggler factor, its
            epochs and its minibatches.
        version: the server version the device downloaded.
        tau: local steps the job computes.
        t_start: when the download began.
        slowdown: the job's straggler factor (1.0 if not slowed).
        epochs: E of the job under ``job_steps: epochs``; None otherwise.
    """

    device: int
    index: int
    version: int
    tau: int
    t_start: float
    slowdown: float
    epochs: int | None


@dataclass(frozen=True)
class Arrival:
    """How a job ended, as the server saw it at simulated time ``t``.

    Attributes:
        job: the job.
        t: when the upload reached the server, or when the device went offline.
        version: the server version at ``t``; for an applied update, the
            version it was applied to.
        staleness: ``version - job.version``; None when the device went
            offline (nothing arrived).
        status: ``"applied"``, ``"stale"`` (staleness above ``max_staleness``:
            dropped), ``"offline"`` (the device went offline before its
            upload completed: dropped) or ``"dropout"`` (it dropped out,
            ``stragglers.dropout_p``: dropped).
        tau: local steps completed (fewer than ``job.tau`` when offline).
    """

    job: Job
    t: float
    version: int
    staleness: int | None
    status: Literal["applied", "stale", "offline", "dropout"]
    tau: int

    @property
    def dropped(self) -> bool:
        return self.status != "applied"


@dataclass(frozen=True)
class Version:
    """One server update: the buffered arrivals applied to ``version``.

    Attributes:
        version: w; the applied updates turn version w into w + 1.
        t: when version w + 1 was made (the time of the last applied arrival).
        applied: the ``buffer_size`` accepted arrivals, in order of arrival.
        ended: every job the server saw end since version w was made
            (the applied ones and the drops), in the order it saw them.
        started: the jobs started since version w was made (all from w).
        in_flight: jobs started whose end the server had not seen yet, right
            after the update.
    """

    version: int
    t: float
    applied: tuple[Arrival, ...]
    ended: tuple[Arrival, ...]
    started: tuple[Job, ...]
    in_flight: int


class AsyncTimeline:
    """The asynchronous mode's one continuous SimPy timeline.

    Every device loops: wait until it is online and one of ``concurrency``
    training slots is free, download the current version, compute ``tau``
    local steps, upload, arrive. The server sees each arrival at its simulated
    time, and every ``buffer_size`` accepted arrivals make a new version
    (``buffer_size = 1`` is FedAsync, K is FedBuff). Iterating yields one
    :class:`Version` per server update, advancing SimPy only as far as that
    update, until ``versions`` updates exist. Iterate once.

    The rules, in simulated time:

    - **Slots.** When slots are free, idle online devices take them, chosen
      uniformly at random (one generator per choice, seeded by the scenario
      seed and a counter) and started in increasing id. With none online, the
      server waits for the first idle device to come online. A device with no
      training samples never trains.
    - **A job.** tau is ``max_steps``, or floor(E n_i / B) under ``job_steps:
      epochs`` (one step per epoch when 0 < n_i < B). Compute runs at speed /
      slowdown, the straggler factor drawn for this job from a generator
      seeded by (seed, device, job index), so a job's fate does not depend on
      what other devices did. Download and upload times come from the link.
    - **Offline.** A device that goes offline before its upload completes is
      interrupted (SimPy's machine-shop idiom): its job is dropped
      (``offline``); it takes a slot again once online.
    - **The server.** Jobs that end at the same instant are handled in
      increasing device id, all before any job starts at that instant (so
      devices arriving together restart from the version they made). An
      arrival's staleness is the current version minus the version it
      started from; above ``max_staleness`` it is dropped (``stale``), else
      buffered.

    No clairvoyance: the server handles an arrival only when SimPy reaches
    its time, so the decision to apply an update at time t uses only events
    at times <= t; a job's end is an event, not a field of :class:`Job`.
    The timeline never depends on training results, which is what lets
    :mod:`fedsim.asynchronous` train jobs in batches ahead of their turn.

    Example (two identical devices, K = 2: versions like synchronous rounds,
    each 1 s download + 8 steps at 4 steps/s + 1 s upload = 4 s):
        >>> from fedsim.fleet import Fleet, FleetSpec
        >>> fleet = Fleet.from_spec(FleetSpec.model_validate({"groups": [
        ...     {"name": "phones", "count": 2,
        ...      "speed": {"dist": "fixed", "steps_per_s": 4.0},
        ...      "network": {"down_mbps": 8, "up_mbps": 8}}]}), seed=0)
        >>> tl = AsyncTimeline(fleet, RoundSpec(policy="async", max_steps=8),
        ...     versions=2, buffer_size=2, concurrency=2, seed=0,
        ...     bytes_down=1_000_000, bytes_up=1_000_000,
        ...     n_samples=np.array([50, 50]), batch_size=10)
        >>> [(v.version, v.t, [(a.job.device, a.staleness) for a in v.applied])
        ...  for v in tl]
        [(0, 4.0, [(0, 0), (1, 0)]), (1, 8.0, [(0, 0), (1, 0)])]
    """

    def __init__(
        self,
        fleet: Fleet,
        policy: RoundSpec,
        *,
        versions: int,
        buffer_size: int,
        concurrency: int,
        seed: int,
        bytes_down: int,
        bytes_up: int,
        n_samples: np.ndarray,
        batch_size: int,
    ) -> None:
        if policy.policy != "async":
            raise ValueError(
                f"AsyncTimeline needs policy 'async', not {policy.policy!r}"
            )
        if versions < 1 or buffer_size < 1 or concurrency < 1:
            raise ValueError("versions, buffer_size and concurrency must be >= 1")
        m = fleet.size
        self.n_samples = np.asarray(n_samples, dtype=np.int64).reshape(-1)
        if self.n_samples.size != m:
            raise ValueError(f"n_samples has {self.n_samples.size} entries, fleet {m}")
        self.fleet = fleet
        self.policy = policy
        self.versions = versions
        self.buffer_size = buffer_size
        self.concurrency = concurrency
        self.seed = seed
        self.batch_size = batch_size
        self.down, self.up = fleet.comm_time(np.arange(m), bytes_down, bytes_up)
        self.env = simpy.Environment()
        self.version = 0
        self.idle = self.n_samples > 0  # free to take a slot (never, without data)
        self.jobs_started = np.zeros(m, dtype=np.int64)
        self.in_flight: dict[int, Job] = {}
        self._buffer: list[Arrival] = []
        self._ended: list[Arrival] = []
        self._started: list[Job] = []
        self._inbox: list[tuple[Job, str, int]] = []
        self._settling = False
        self._wake_at = math.inf
        self._choices = 0
        self._made: list[Version] = []
        self._request_settle()  # the first slots are handed out at t = 0

    def __iter__(self) -> Iterator[Version]:
        made = 0
        while made < self.versions:
            while not self._made:
                try:
                    self.env.step()
                except simpy.core.EmptySchedule:
                    raise RuntimeError(
                        f"the async timeline stalled at t = {self.env.now:g} s "
                        f"after {self.version} versions: no device can start or "
                        "finish a job (never online again, no data, or endless "
                        "stragglers holding every slot)"
                    ) from None
            yield self._made.pop(0)
            made += 1

    # ----------------------------------------------------------- the server
    def _request_settle(self) -> None:
        """Handle this instant's ends, then hand out slots, after every other
        event already due now (a zero delay queues behind them)."""
        if not self._settling:
            self._settling = True
            self.env.timeout(0).callbacks.append(self._settle)

    def _settle(self, _event: simpy.Event) -> None:
        self._settling = False
        if self.version >= self.versions:
            return
        now = self.env.now
        inbox, self._inbox = sorted(self._inbox, key=lambda e: e[0].device), []
        max_s = self.policy.max_staleness
        for job, reason, done in inbox:
            del self.in_flight[job.device]
            self.idle[job.device] = True
            if reason in ("offline", "dropout"):
                arrival = Arrival(job, now, self.version, None, reason, done)
            else:
                s = self.version - job.version
                status = "stale" if max_s is not None and s > max_s else "applied"
                arrival = Arrival(job, now, self.version, s, status, job.tau)
                if status == "applied":
                    self._buffer.append(arrival)
            self._ended.append(arrival)
            if len(self._buffer) == self.buffer_size:
                self._made.append(
                    Version(
                        version=self.version,
                        t=now,
                        applied=tuple(self._buffer),
                        ended=tuple(self._ended),
                        started=tuple(self._started),
                        in_flight=len(self.in_flight),
                    )
                )
                self.version += 1
                self._buffer, self._ended, self._started = [], [], []
                if self.version >= self.versions:
                    return
        self._dispatch()

    def _dispatch(self) -> None:
        free = self.concurrency - len(self.in_flight)
        if free <= 0:
            return
        now = self.env.now
        online = self.fleet.online(now)
        chosen = np.flatnonzero(self.idle & online)
        if chosen.size > free:
            rng = np.random.default_rng(
                np.random.SeedSequence([self.seed, _TAG_DISPATCH, self._choices])
            )
            self._choices += 1
            chosen = np.sort(rng.choice(chosen, size=free, replace=False))
        for d in chosen.tolist():
            self._start(d)
        if chosen.size < free:
            waiting = np.flatnonzero(self.idle & ~online)
            if waiting.size:
                wake = float(np.min(self.fleet.online_time(waiting, now)))
                if math.isfinite(wake) and wake < self._wake_at:
                    self._wake_at = wake
                    self.env.timeout(wake - now).callbacks.append(self._wake)

    def _wake(self, _event: simpy.Event) -> None:
        if self.env.now >= self._wake_at:
            self._wake_at = math.inf
        self._request_settle()

    # ------------------------------------------------------------ a device
    def _start(self, d: int) -> None:
        env, now = self.env, self.env.now
        k = int(self.jobs_started[d])
        self.jobs_started[d] += 1
        rng = np.random.default_rng(np.random.SeedSequence([self.seed, _TAG_JOB, d, k]))
        slowdown = float(self.fleet.draw_slowdowns(np.array([d]), rng)[0])
        if self.policy.job_steps == "max_steps":
            tau, epochs = self.policy.max_steps, None
        else:
            epochs = int(_draw_epochs(self.policy, 1, rng)[0])
            n = int(self.n_samples[d])
            tau = epochs if n < self.batch_size else epochs * n // self.batch_size
        rate = float(self.fleet.speed[d]) / slowdown
        # A Pareto slowdown can overflow to inf, leaving a rate of 0.
        compute_s = tau / rate if rate > 0 else math.inf
        down, up = float(self.down[d]), float(self.up[d])
        job = Job(d, k, self.version, int(tau), now, slowdown, epochs)
        self.idle[d] = False
        self.in_flight[d] = job
        self._started.append(job)
        device = env.process(self._job(job, down, compute_s, up, rate))
        # When SimPy reaches the arrival (the same additions as its timeouts)
        # and when a timeout of (offline - now) fires: on a tie the interrupt
        # comes first (it is queued earlier, then as an urgent event).
        arrival = now + down + compute_s + up
        offline = float(self.fleet.offline_time(np.array([d]), now)[0])
        why = "offline"
        drop = float(
            self.fleet.draw_dropouts(np.array([d]), rng, down + compute_s + up)[0]
        )
        if now + drop < offline:
            offline, why = now + drop, "dropout"
        if math.isfinite(offline) and now + (offline - now) <= arrival:
            env.process(self._go_offline(device, offline - now, why))

    def _job(self, job: Job, down: float, compute_s: float, up: float, rate: float):
        env = self.env
        try:
            if down > 0:
                yield env.timeout(down)
            if not math.isfinite(compute_s):
                yield env.event()  # an endless straggler: only going offline ends it
            elif compute_s > 0:
                yield env.timeout(compute_s)
            if up > 0:
                yield env.timeout(up)
        except simpy.Interrupt as stop:
            # Steps finished before leaving: lost work, kept for metrics.
            computed_s = env.now - (job.t_start + down)
            done = min(job.tau, max(0, math.floor(computed_s * rate + _EPS)))
            self._end(job, str(stop.cause), done)
            return
        self._end(job, "", job.tau)

    def _go_offline(self, device: simpy.Process, delay: float, why: str = "offline"):
        yield self.env.timeout(delay)
        if device.is_alive:
            device.interrupt(why)

    def _end(self, job: Job, reason: str, done: int) -> None:
        self._inbox.append((job, reason, done))
        self._request_settle()
