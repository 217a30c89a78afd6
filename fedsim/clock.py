"""Simulated time as SimPy processes (no torch, no Ray): before any training,
a synchronous round's plan or the asynchronous timeline decides each chosen
device's ``tau``, arrival and fate (docs/fleets.md, "The clock").
"""

from __future__ import annotations

import functools
import heapq
import math
from collections import Counter
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from typing import Annotated, ClassVar, Literal, NamedTuple, cast

import numpy as np
from numpy.typing import ArrayLike, NDArray
from pydantic import Field, model_validator

from fedsim.errors import RunError
from fedsim.fleet import Fleet
from fedsim.lazy import simpy
from fedsim.spec import PosFloat
from fedsim.spec import Spec as _Spec

# Arrays by what they hold: device ids, counts and bytes; times, rates and
# uniforms; local steps, whole (floor(E n / B)) or expected (float).
Ints = NDArray[np.int64]
Floats = NDArray[np.float64]
Steps = NDArray[np.int64 | np.float64]

# The relative slack of every decision the clock takes on a float: a step
# that ends within it of a whole step counts, an update within it after the
# deadline is on time, and job ends within it of each other arrive together
# (in device order). Float sums land a few ulps off the value they equal
# (compute_time * speed is 4.0 - 1e-15 for 2.0 / 0.5), and on which side
# depends on last bits that another CPU's exp or log rounds otherwise; 1e-9
# is far above such errors and far below any time the clock resolves.
_EPS = 1e-9


def _slack(x: float) -> float:
    """The slack of a decision on ``x`` (a time or a step count): ``_EPS``
    relative to it, absolute below 1."""
    return _EPS * max(1.0, abs(x))


def _whole_steps(x: ArrayLike) -> Floats:
    """floor(x) of step counts ``x``, a step within the slack counting whole."""
    steps = np.asarray(x, dtype=np.float64)
    return np.floor(steps + _EPS * np.maximum(1.0, steps))


class RoundSpec(_Spec):
    """How tau_i(t) arises: ``fixed_window``, ``fixed_epochs`` or ``async``
    (the fields under each: docs/architecture.md, "Round policies")."""

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

    # The fields each policy reads besides ``policy`` itself; ``fedsim
    # validate`` prints only these, so the knowledge lives with the schema.
    USES: ClassVar[dict[str, str]] = {
        "fixed_window": "window_s max_steps",
        "fixed_epochs": "epochs deadline_s over_select",
        "async": "concurrency max_staleness job_steps max_steps epochs",
    }

    @property
    def used_fields(self) -> str:
        """The fields this round's policy reads, space-separated.

        An asynchronous job does ``max_steps`` or ``epochs`` (``job_steps``
        says which), and an epoch range replaces ``epochs``; the other fields
        keep their defaults without effect, so a printout leaves them out.
        """
        used = ["policy", *self.USES[self.policy].split()]
        if self.policy == "async":
            used.remove("max_steps" if self.job_steps == "epochs" else "epochs")
        if "epochs" in used and self.epochs_low is not None:
            used[used.index("epochs")] = "epochs_low epochs_high"
        return " ".join(used)

    @model_validator(mode="after")
    def _epoch_range(self) -> RoundSpec:
        """An epoch range is given whole and in order, or not at all."""
        lo, hi = self.epochs_low, self.epochs_high
        if (lo is None) != (hi is None):
            raise ValueError("give both epochs_low and epochs_high, or neither")
        if lo is not None and hi is not None and hi < lo:
            raise ValueError(f"epochs_high ({hi}) must be >= epochs_low ({lo})")
        return self

    @model_validator(mode="after")
    def _consistent(self) -> RoundSpec:
        """Each policy's own fields appear only with that policy.

        Raises:
            ValueError: ``over_select`` outside ``fixed_epochs``, an asynchronous
                field (``concurrency``, ``max_staleness``) in a synchronous
                round, or a ``deadline_s`` under ``async``.
        """
        if self.over_select > 1 and self.policy != "fixed_epochs":
            raise ValueError(
                "over_select keeps the first k arrivals, so it needs policy "
                "'fixed_epochs' (under 'fixed_window' every update arrives at the "
                "end of the window; 'async' has concurrency instead)"
            )
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
class JobWork:
    """A job whose work is not local SGD steps (FedDM's matching): ``steps``
    units (exactly, or at most under ``fixed_window``), each costing
    ``unit_cost[i]`` local steps; ``bytes_up[i]`` uploaded, by client id."""

    steps: int
    unit_cost: Floats
    bytes_up: Ints


@dataclass(frozen=True)
class RunContext:
    """The constants of one run that every plan and the timeline charge for,
    built once by the runtime (the role of pfl's per-run context).

    Attributes:
        bytes_down: the payload a chosen device downloads, in bytes.
        bytes_up: the update it uploads, in bytes (``work.bytes_up`` replaces
            it, per client, when the algorithm says what it uploads).
        n_samples: training samples per client id (int64, ``[m]``): the
            ``fixed_epochs`` step counts and "no data" come from it.
        batch_size: the client minibatch size B in tau = floor(E n_i / B).
        work: the algorithm's own unit of work, or None for local steps.
        extra_s: seconds of compute a chosen device does in a round besides
            its local steps, times its straggler slowdown, before its
            training (secure aggregation's key agreement, secret sharing and
            masking: :mod:`fedsim.secagg`); 0: none.

    Example:
        >>> ctx = RunContext(1000, 500, np.array([10, 20]), batch_size=5)
        >>> ctx.up_bytes(np.array([1])), ctx.work is None
        (500, True)
    """

    bytes_down: int
    bytes_up: int
    n_samples: Ints
    batch_size: int
    work: JobWork | None = None
    extra_s: float = 0.0

    def up_bytes(self, ids: Ints) -> int | Ints:
        """What the devices ``ids`` upload: a scalar, or one size per device
        when the algorithm's work says (fleet.comm_time takes either)."""
        return self.bytes_up if self.work is None else self.work.bytes_up[ids]


@dataclass(frozen=True)
class Plan:
    """What one chosen device does in a round (or how an async job ended):
    ``tau`` steps done (lost, if ``dropped``), ``t_arrive`` when the update
    arrives or the device dropped, ``reason`` why it dropped (``""`` if not;
    docs/results.md), ``epochs`` E_i under ``fixed_epochs``."""

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


def steps_for(epochs: ArrayLike, n_samples: ArrayLike, batch_size: int) -> Steps:
    """Local steps tau = floor(E n_i / B) of E epochs over n_i samples.

    A device with 0 < n_i < B does one step per epoch; one without samples
    none. Float ``epochs`` (an expected E) give E n_i / B without the floor.

    Args:
        epochs: E, an int or an array like ``n_samples`` (or float: expected).
        n_samples: n_i per device.
        batch_size: B.

    Example:
        >>> steps_for(2, np.array([0, 5, 20, 50]), 20).tolist()
        [0, 2, 2, 5]
        >>> steps_for(1.5, np.array([5, 50]), 20).tolist()
        [1.5, 3.75]
    """
    e = np.asarray(epochs)
    n = np.asarray(n_samples, dtype=np.int64)
    full = e * n / batch_size if e.dtype.kind == "f" else e * n // batch_size
    return np.where(n < batch_size, np.where(n > 0, e, 0), full)


def expected_steps(policy: RoundSpec, n_samples: ArrayLike, batch_size: int) -> Floats:
    """The local steps a device is expected to do per round (float64, [m]):
    ``max_steps``, or under ``fixed_epochs`` :func:`steps_for` in float with
    the mean epochs, counting a device without samples as one with one.

    Args:
        policy: the round spec.
        n_samples: n_i per device.
        batch_size: the client batch size B.
    """
    n = np.asarray(n_samples, dtype=np.int64)
    if policy.policy != "fixed_epochs":
        return np.full(n.shape, float(policy.max_steps))
    lo, hi = policy.epochs_low, policy.epochs_high
    epochs = (lo + hi) / 2.0 if lo is not None and hi is not None else policy.epochs
    assert epochs is not None  # RoundSpec: fixed_epochs has epochs or a range
    # float epochs give float64 steps: asarray only states it (no copy)
    steps = steps_for(float(epochs), np.maximum(n, 1), batch_size)
    return np.asarray(steps, dtype=np.float64)


def _draw_epochs(policy: RoundSpec, n: int, rng: np.random.Generator) -> Ints:
    """An asynchronous job's E (``n`` of them) from its own stream."""
    if policy.epochs_low is not None and policy.epochs_high is not None:
        return rng.integers(policy.epochs_low, policy.epochs_high + 1, size=n)
    return _fixed_epochs(policy, n)


def _epochs_from(policy: RoundSpec, u: Floats) -> Ints:
    """E_i of a round's devices from their uniforms: uniform on the whole
    numbers of ``[epochs_low, epochs_high]`` by the inverse CDF, or the
    fixed ``epochs``.

    Example:
        >>> r = RoundSpec(policy="fixed_epochs", epochs_low=2, epochs_high=5)
        >>> _epochs_from(r, np.array([0.0, 0.2499, 0.25, 0.999])).tolist()
        [2, 2, 3, 5]
    """
    lo, hi = policy.epochs_low, policy.epochs_high
    if lo is not None and hi is not None:
        # u < 1, so the floor never reaches hi + 1
        return lo + np.floor(u * (hi - lo + 1)).astype(np.int64)
    return _fixed_epochs(policy, u.size)


def _fixed_epochs(policy: RoundSpec, n: int) -> Ints:
    if policy.epochs is None:
        raise ValueError("fixed_epochs needs epochs, or epochs_low and epochs_high")
    return np.full(n, policy.epochs, dtype=np.int64)


@dataclass(frozen=True)
class _Work:
    """One device's job: download, ``tau`` steps at ``rate`` steps/s, upload."""

    t_start: float
    down: float
    tau: int
    rate: float
    up: float

    @property
    def compute_s(self) -> float:
        # A Pareto slowdown can overflow to inf, leaving a rate of 0.
        return self.tau / self.rate if self.rate > 0 else math.inf

    @property
    def busy_s(self) -> float:
        return self.down + self.compute_s + self.up

    @property
    def arrival(self) -> float:
        # The same additions SimPy makes, so "before arrival" is exact.
        return self.t_start + self.down + self.compute_s + self.up

    def steps_done(self, t: float) -> int:
        """Whole steps finished by time ``t`` (the work lost on leaving)."""
        computed_s = t - (self.t_start + self.down)
        done = int(_whole_steps(computed_s * self.rate))
        return min(self.tau, max(0, done))


class Leave(NamedTuple):
    """When a device leaves its job before arriving, and why
    (``"offline"`` or ``"dropout"``)."""

    at: float
    why: str


def _leaving(
    work: _Work,
    offline_at: float,
    dropout_at: float,
    tie: Literal["arrives", "leaves"],
    deadline: float = math.inf,
) -> Leave | None:
    """When and why a device leaves its job before arriving, or None.

    Args:
        work: the job, with its exact arrival time.
        offline_at: when the device's availability ends (inf: never).
        dropout_at: when its random dropout strikes (inf: never).
        tie: who wins when leaving and arriving fall on the same float:
            ``"arrives"`` (synchronous rounds count the update) or
            ``"leaves"`` (the timeline's interrupt is processed first).
        deadline: a synchronous round's deadline; leaving after it changes
            nothing (the update is late anyway).

    Returns:
        The earlier of the two ends (going offline wins a tie with a
        dropout), or None when the device stays until it arrives.
    """
    offline_first = offline_at <= dropout_at
    at, why = (offline_at, "offline") if offline_first else (dropout_at, "dropout")
    if tie == "arrives":
        leaves = at < min(work.arrival, deadline)
    else:
        # The timeline's leave process waits ``at - t_start`` from t_start,
        # and SimPy adds that delay back: compare the float SimPy will reach,
        # not ``at`` itself, or a leave 1 ulp after arrival could be missed.
        leaves = work.t_start + (at - work.t_start) <= work.arrival
    return Leave(at, why) if leaves and math.isfinite(at) else None


def _device(
    env: simpy.Environment,
    work: _Work,
    finish: Callable[[int, str], None],
    every_phase: bool,
) -> Generator[simpy.Event, object, None]:
    """One device's job as a SimPy process (SimPy's ``machine_shop`` shape).

    Args:
        env: the SimPy environment the job runs in.
        work: download, compute and upload durations.
        finish: called once, with ``(tau, "")`` on arrival or, when the
            leave process interrupts, ``(steps done, why)``.
        every_phase: rounds yield even empty phases (so an endless
            straggler "arrives" at t = inf and the round can see it); the
            timeline skips them and parks an endless straggler on an event
            that never fires, since only leaving can end it there.
    """
    try:
        for phase_s in (work.down, work.compute_s, work.up):
            if not every_phase and not math.isfinite(phase_s):
                yield env.event()
            elif every_phase or phase_s > 0:
                yield env.timeout(phase_s)
    except simpy.Interrupt as stop:
        finish(work.steps_done(env.now), str(stop.cause))
        return
    finish(work.tau, "")


def _delay_until(now: float, at: float) -> float:
    """The delay after which SimPy, adding it back to ``now``, is at ``at``
    or later (the float after it, at most).

    ``now + (at - now)`` falls one ulp short of ``at`` for some pairs (about
    3 in 100 when ``now`` is under half of ``at``), and which pairs do
    depends on their last bits: a wake-up that lands short would find the
    device still offline, on one CPU and not on another.
    """
    delay = at - now
    while now + delay < at:
        delay = math.nextafter(delay, math.inf)
    return delay


def _leave(
    env: simpy.Environment, device: simpy.Process, delay: float, why: str
) -> Generator[simpy.Event, object, None]:
    """Interrupt ``device`` with ``why`` after ``delay`` s, if still running."""
    yield env.timeout(delay)
    if device.is_alive:
        device.interrupt(why)


def _run_device(
    env: simpy.Environment,
    work: _Work,
    finish: Callable[[int, str], None],
    leave: Leave | None,
    every_phase: bool,
) -> simpy.Process:
    """Start a device's process, and its leave process when it leaves.

    The leave process is started second, so that at an equal instant the
    device's own events (scheduled first) are processed before the interrupt.
    """
    device = env.process(_device(env, work, finish, every_phase))
    if leave is not None:
        env.process(_leave(env, device, leave.at - work.t_start, leave.why))
    return device


class _Scheduled(NamedTuple):
    """A device of a round that does take part: its position, job, leave."""

    pos: int
    work: _Work
    leave: Leave | None


class _Outcome(NamedTuple):
    """How a device's part in a round ended: steps, when, why ("" arrived)."""

    steps: int
    t: float
    reason: str


class _RoundSteps(NamedTuple):
    """A round's step counts before SimPy runs (see :func:`_round_steps`)."""

    tau: Ints  # int64 steps per chosen device
    skip: NDArray[np.str_]  # why it sits the round out ("no_time", "no_data") or ""
    epochs: Ints | None  # E_i under fixed_epochs with local steps
    deadline: float  # when the server stops waiting (inf: never)


def plan_round(
    fleet: Fleet,
    chosen: Ints,
    now: float,
    policy: RoundSpec,
    t: int,
    ctx: RunContext,
    keep: int | None = None,
) -> RoundPlan:
    """Plan synchronous round ``t``, starting at simulated time ``now``.

    Pure in the arguments. Each device's slowdown, epochs (with a range)
    and dropout come from its own uniforms of round ``t``
    (:meth:`Fleet.round_draws`, a function of (seed, device, t) only):
    common random numbers, so a device behaves alike in this round
    whichever other devices were chosen (docs/fleets.md, "Common random
    numbers"); what depends on the others is only when the round ends.

    Args:
        fleet: the devices (speed, network, availability, stragglers).
        chosen: the selected device ids; must be distinct, any order.
        now: the round's start, in simulated seconds.
        policy: ``fixed_window`` or ``fixed_epochs`` (``async`` is refused).
        t: the round (0, 1, ...): it numbers the devices' draws.
        ctx: the run's byte sizes, sample counts, batch size and work.
        keep: keep the first ``keep`` arrivals; later ones are ``surplus``.

    Returns:
        One :class:`Plan` per chosen device in increasing id, and the span.

    Raises:
        ValueError: ``policy`` is ``async`` or ``chosen`` repeats an id.

    Example:
        >>> from fedsim.fleet import Fleet, FleetSpec
        >>> fleet = Fleet.from_spec(FleetSpec.model_validate({"groups": [
        ...     {"name": "phones", "count": 2,
        ...      "speed": {"dist": "fixed", "steps_per_s": 4.0},
        ...      "network": {"down_mbps": 8, "up_mbps": 8}}]}), seed=0)
        >>> ctx = RunContext(1_000_000, 1_000_000, np.array([50, 50]), 10)
        >>> rp = plan_round(fleet, np.array([0, 1]), now=0.0,
        ...                 policy=RoundSpec(window_s=10, max_steps=1000),
        ...                 t=0, ctx=ctx)
        >>> [(p.tau, p.t_arrive) for p in rp.plans], rp.t_end
        ([(32, 10.0), (32, 10.0)], 10.0)
    """
    if policy.policy == "async":
        raise ValueError("policy 'async' has no rounds: use AsyncTimeline")
    ids = np.sort(np.asarray(chosen, dtype=np.int64).reshape(-1))
    if np.any(ids[1:] == ids[:-1]):
        raise ValueError("chosen devices must be distinct")
    now, work = float(now), ctx.work
    draws = fleet.round_draws(ids, t)
    slowdown = fleet.draw_slowdowns(ids, draws.slowdown)
    rate = fleet.speed[ids] / slowdown
    if work is not None:  # the algorithm's unit costs unit_cost local steps
        rate = rate / work.unit_cost[ids]
    down, up = fleet.comm_time(ids, ctx.bytes_down, ctx.up_bytes(ids))
    if ctx.extra_s:  # compute besides training, slowed as the device is
        down = down + ctx.extra_s * slowdown
    steps = _round_steps(policy, now, rate, down + up, draws.epochs, ctx, ids)
    offline_at = fleet.offline_time(ids, now)
    with np.errstate(divide="ignore"):  # a rate of 0: an endless straggler
        work_s = down + np.where(rate > 0, steps.tau / rate, np.inf) + up
    dropout_at = now + fleet.draw_dropouts(ids, draws.dropout, work_s)
    jobs = []
    for j in np.flatnonzero(steps.skip == "").tolist():
        job = _Work(
            now, float(down[j]), int(steps.tau[j]), float(rate[j]), float(up[j])
        )
        off, drop = float(offline_at[j]), float(dropout_at[j])
        jobs.append(
            _Scheduled(j, job, _leaving(job, off, drop, "arrives", steps.deadline))
        )
    wait_for_all = policy.policy == "fixed_epochs"
    outcome, t_end = _run_round(now, steps.deadline, wait_for_all, keep, jobs)
    plans = _plans(ids, now, policy, steps, slowdown, outcome)
    return RoundPlan(plans, now, t_end)


def _plans(
    ids: Ints,
    now: float,
    policy: RoundSpec,
    steps: _RoundSteps,
    slowdown: Floats,
    outcome: dict[int, _Outcome],
) -> tuple[Plan, ...]:
    """The round's :class:`Plan` per device, from SimPy's outcomes (devices
    that sat the round out get 0 steps and their ``skip`` reason)."""
    plans = []
    for j, client in enumerate(ids.tolist()):
        # a device without time "arrives" with nothing at the window's end
        t_skip = steps.deadline if steps.skip[j] == "no_time" else now
        done, t_arrive, reason = outcome.get(j, _Outcome(0, t_skip, str(steps.skip[j])))
        if policy.policy == "fixed_window":
            # the floor's _EPS slack may put an arrival a hair past W
            t_arrive = min(t_arrive, float(steps.deadline))
        e = None if steps.epochs is None else int(steps.epochs[j])
        s = float(slowdown[j])
        plans.append(Plan(client, done, now, t_arrive, reason != "", reason, s, e))
    return tuple(plans)


def _round_steps(
    policy: RoundSpec,
    now: float,
    rate: Floats,
    comm_s: Floats,
    epochs_u: Floats,
    ctx: RunContext,
    ids: Ints,
) -> _RoundSteps:
    """tau per device, why it skips the round ("" if not), epochs, deadline.

    Args:
        policy: the round policy (not ``async``).
        now: the round's start.
        rate: each chosen device's steps (or work units) per second.
        comm_s: each device's download plus upload time.
        epochs_u: each device's epochs uniform of the round (read only by
            ``fixed_epochs`` with an epoch range).
        ctx: the run's sample counts, batch size and work.
        ids: the chosen devices, sorted.
    """
    work = ctx.work
    if policy.policy == "fixed_window":
        cap = policy.max_steps if work is None else work.steps
        compute_s = policy.window_s - comm_s
        # A relative slack: 2.0 / 0.5 * 0.5 may land 1 ulp under a whole
        # step, and an absolute _EPS is lost once compute_s * rate is large.
        tau = np.clip(_whole_steps(compute_s * rate), 0, cap).astype(np.int64)
        skip = np.where(tau == 0, "no_time", "")
        return _RoundSteps(tau, skip, None, now + policy.window_s)
    n = np.asarray(ctx.n_samples, dtype=np.int64)[ids]
    epochs: Ints | None
    if work is None:
        epochs = _epochs_from(policy, epochs_u)
        # whole epochs give int64 steps: asarray only states it (no copy)
        tau = np.asarray(steps_for(epochs, n, ctx.batch_size), dtype=np.int64)
    else:  # the algorithm's own job size: epochs do not apply
        epochs, tau = None, np.where(n > 0, work.steps, 0).astype(np.int64)
    deadline = now + policy.deadline_s if policy.deadline_s else math.inf
    return _RoundSteps(tau, np.where(tau == 0, "no_data", ""), epochs, deadline)


def _run_round(
    now: float,
    deadline: float,
    wait_for_all: bool,
    keep: int | None,
    jobs: list[_Scheduled],
) -> tuple[dict[int, _Outcome], float]:
    """One round on a SimPy timeline.

    Args:
        now: the round's start.
        deadline: when the server stops waiting (inf: never).
        wait_for_all: ``fixed_epochs``: the server waits for every device, or
            the ``keep``-th arrival, or the deadline, whichever comes first;
            otherwise (``fixed_window``) exactly until ``deadline``.
        keep: arrivals kept; later ones are marked ``surplus``.
        jobs: the devices taking part.

    Returns:
        Each job's :class:`_Outcome` by index, and the round's end. Late
        devices still run to their would-be arrival, so a late update's
        ``t`` is when it would have arrived.
    """
    env = simpy.Environment(initial_time=now)
    enough = env.event()  # the keep-th arrival
    outcome: dict[int, _Outcome] = {}
    arrived: list[int] = []

    def finish(j: int, done: int, reason: str) -> None:
        if not reason and wait_for_all and env.now > deadline + _slack(deadline):
            reason = "late"
        outcome[j] = _Outcome(done, env.now, reason)
        if not reason:
            arrived.append(j)
            if len(arrived) == keep:
                enough.succeed()

    devices = [
        _run_device(env, job.work, functools.partial(finish, job.pos), job.leave, True)
        for job in jobs
    ]
    end = env.process(_round_server(env, deadline, wait_for_all, keep, devices, enough))
    env.run()
    if keep is not None:
        _mark_surplus(outcome, arrived, keep)
    return outcome, cast(float, end.value)


def _round_server(
    env: simpy.Environment,
    deadline: float,
    wait_for_all: bool,
    keep: int | None,
    devices: list[simpy.Process],
    enough: simpy.Event,
) -> Generator[simpy.Event, object, float]:
    """The server's wait in a round (see :func:`_run_round`); returns t_end.

    Whether an update is late is judged by time (``env.now`` past the
    deadline and its slack, in ``finish``), not by which of two events at the
    deadline's instant SimPy processes first, so an arrival at the deadline
    counts, also when its float sum lands a few ulps past it.
    """
    if not wait_for_all:
        yield env.timeout(deadline - env.now)
    else:
        wait: simpy.Event = env.all_of(devices)
        if keep is not None:
            wait = wait | enough
        if deadline < math.inf:
            wait = wait | env.timeout(deadline - env.now)
        yield wait
    return float(env.now)


def _mark_surplus(outcome: dict[int, _Outcome], arrived: list[int], keep: int) -> None:
    """Mark every arrival after the first ``keep`` ``surplus`` (in place);
    arrival times equal within the slack are ordered by device, not by
    SimPy's event order nor by the last bits of their sums."""
    by_time = sorted((outcome[j].t, j) for j in arrived)
    ties, first = [], by_time[0][0] if by_time else 0.0
    for t, j in by_time:
        if t > first + _slack(first):  # a new instant of arrivals
            first = t
        ties.append((first, j))
    for _, j in sorted(ties)[keep:]:
        outcome[j] = outcome[j]._replace(reason="surplus")


# Tags separating the async timeline's random streams from the seed's others.
_TAG_JOB = 0xA5C10B  # a job's straggler factor and epochs: (seed, tag, device, job)
_TAG_DISPATCH = 0xD15C  # which idle devices take free slots: (seed, tag, n)

_Status = Literal["applied", "stale", "offline", "dropout"]


class Stalled(RunError, RuntimeError):
    """An asynchronous timeline that can make no further server version."""


@dataclass(frozen=True)
class Job:
    """One pass of a device's loop, as known when it starts: it downloads
    ``version`` at ``t_start`` and computes ``tau`` steps. ``index`` counts
    the device's earlier jobs; with the device id it seeds the job's
    slowdown, ``epochs`` (None unless ``job_steps: epochs``) and batches."""

    device: int
    index: int
    version: int
    tau: int
    t_start: float
    slowdown: float
    epochs: int | None


@dataclass(frozen=True)
class Arrival:
    """How a job ended, as the server saw it at simulated time ``t`` (the
    arrival, or when the device left) and server ``version``. ``status``:
    ``"applied"``, or dropped as ``"stale"`` (staleness above ``max_staleness``),
    ``"offline"`` or ``"dropout"`` (``staleness`` None; ``tau`` the steps done)."""

    job: Job
    t: float
    version: int
    staleness: int | None
    status: _Status
    tau: int

    @property
    def dropped(self) -> bool:
        return self.status != "applied"

    @property
    def plan(self) -> Plan:
        """The job's end as a :class:`Plan` (``reason``: a drop's status)."""
        j, why = self.job, self.status if self.dropped else ""
        return Plan(
            j.device, self.tau, j.t_start, self.t, bool(why), why, j.slowdown, j.epochs
        )


@dataclass(frozen=True)
class Version:
    """One server update: the ``applied`` arrivals (in arrival order) turn
    ``version`` w into w + 1 at time ``t``. ``ended`` and ``started`` are
    the job ends (applied and dropped) and starts since w was made;
    ``in_flight`` the jobs still out after the update."""

    version: int
    t: float
    applied: tuple[Arrival, ...]
    ended: tuple[Arrival, ...]
    started: tuple[Job, ...]
    in_flight: int


@dataclass(frozen=True)
class ServedVersion(Version):
    """A :class:`Version` made by a server that takes time (``server_s``):
    ``ended`` closes when the server takes the full buffer, ``started`` and
    ``t`` when it is done; ``queued`` applied updates were waiting then,
    and the server had been busy ``busy_s`` seconds since t = 0."""

    queued: int
    busy_s: float


class _Closed(NamedTuple):
    """A full buffer handed to the server: its applied arrivals and the job
    ends since the last buffer was closed."""

    applied: tuple[Arrival, ...]
    ended: tuple[Arrival, ...]


Chooser = Callable[[Ints, int, int], Ints]
"""``choose(candidates, free, n)``: at most ``free`` distinct ids among the
sorted int64 ``candidates`` (more than ``free``), ``n`` the count of earlier
choices: which idle online devices take the timeline's free slots. Called
only once every version made so far is yielded (docs/fleets.md)."""


def uniform_choice(seed: int) -> Chooser:
    """The default chooser: ``free`` candidates uniformly at random, sorted,
    from a generator seeded by (``seed``, choice counter ``n``).

    Example:
        >>> choose = uniform_choice(0)
        >>> picked = choose(np.arange(10), 3, 0)
        >>> again = choose(np.arange(10), 3, 0)
        >>> len(set(picked.tolist())), bool((picked == again).all())
        (3, True)
    """

    def choose(candidates: Ints, free: int, n: int) -> Ints:
        rng = np.random.default_rng(np.random.SeedSequence([seed, _TAG_DISPATCH, n]))
        return np.sort(rng.choice(candidates, size=free, replace=False))

    return choose


def _checked_choice(choose: Chooser, candidates: Ints, free: int, n: int) -> Ints:
    """``choose``'s pick, sorted, after checking it is a valid one."""
    picked = np.asarray(choose(candidates.copy(), free, n))
    ints = picked.ndim == 1 and (picked.size == 0 or picked.dtype.kind in "iu")
    ids = np.sort(picked).astype(np.int64) if ints else np.zeros(0, dtype=np.int64)
    valid = (
        ids.size == picked.size
        and ids.size <= free
        and not np.any(ids[1:] == ids[:-1])
        and bool(np.isin(ids, candidates).all())
    )
    if not valid:
        name = getattr(choose, "__qualname__", None) or repr(choose)
        raise ValueError(
            f"the async chooser {name} picked {picked.tolist()!r}: it must "
            f"return at most {free} distinct ids (int) among the "
            f"{candidates.size} candidates it was given"
        )
    return ids


class _Ended(NamedTuple):
    """A job end reported by its device process, waiting to be settled."""

    job: Job
    reason: str  # "" arrived, else "offline" or "dropout"
    steps: int  # steps done (all of tau when it arrived)
    t: float  # when the device reported it


class AsyncTimeline:
    """The asynchronous mode's one continuous SimPy timeline.

    Devices loop (wait for a free slot of ``concurrency`` while online,
    download, compute ``tau`` steps, upload); every ``buffer_size`` accepted
    arrivals make a version. Iterating (once) yields each :class:`Version`,
    advancing SimPy only that far. Rules: docs/fleets.md, "The clock".

    Guarantees: the timeline is a pure function of (fleet, policy, ctx,
    seed, the chooser's picks); it never depends on training results, which
    is what lets the runtime train ahead of it. Everything that ends at one
    simulated instant is settled together, in device order, after every
    other event of that instant (see :meth:`_request_settle`).

    Args:
        fleet: the devices.
        policy: the round spec; must be ``async``.
        versions: how many versions to yield.
        buffer_size: accepted arrivals per version (FedBuff's K; 1: each
            arrival is a version).
        concurrency: at most this many jobs in flight.
        seed: the scenario seed (jobs' slowdowns, epochs and dropouts).
        ctx: the run's byte sizes, sample counts and batch size.
        choose: which idle online devices take free slots when there are
            more than slots (default :func:`uniform_choice`).
        stall_s: simulated seconds without a version before :class:`Stalled`.
        stall_jobs: job ends without a version before :class:`Stalled`
            (default max(1000, 20 concurrency buffer_size)).
        server_s: the server's seconds per version (0: a free server, each
            version made the instant its buffer fills). Above 0, a full
            buffer waits in the server's queue while the server is busy,
            arrivals queue behind it, and a job's staleness counts the
            versions the queue will make before its own.

    Raises:
        ValueError: a non-``async`` policy, a count below 1, or sample
            counts that do not match the fleet.

    Example (two devices, K = 2, each 1 s down + 2 s compute + 1 s up):
        >>> from fedsim.fleet import Fleet, FleetSpec
        >>> fleet = Fleet.from_spec(FleetSpec.model_validate({"groups": [
        ...     {"name": "phones", "count": 2,
        ...      "speed": {"dist": "fixed", "steps_per_s": 4.0},
        ...      "network": {"down_mbps": 8, "up_mbps": 8}}]}), seed=0)
        >>> tl = AsyncTimeline(fleet, RoundSpec(policy="async", max_steps=8),
        ...     versions=2, buffer_size=2, concurrency=2, seed=0,
        ...     ctx=RunContext(1_000_000, 1_000_000, np.array([50, 50]), 10))
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
        ctx: RunContext,
        choose: Chooser | None = None,
        stall_s: float = 365 * 86400.0,
        stall_jobs: int | None = None,
        server_s: float = 0.0,
    ) -> None:
        if policy.policy != "async":
            raise ValueError(
                f"AsyncTimeline needs policy 'async', not {policy.policy!r}"
            )
        if versions < 1 or buffer_size < 1 or concurrency < 1:
            raise ValueError("versions, buffer_size and concurrency must be >= 1")
        m = fleet.size
        self.n_samples = np.asarray(ctx.n_samples, dtype=np.int64).reshape(-1)
        if self.n_samples.size != m:
            raise ValueError(f"n_samples has {self.n_samples.size} entries, fleet {m}")
        self.fleet = fleet
        self.policy = policy
        self.versions = versions
        self.buffer_size = buffer_size
        self.concurrency = concurrency
        self.seed = seed
        self.batch_size = ctx.batch_size
        self.choose = uniform_choice(seed) if choose is None else choose
        # Asynchronous rules train local steps: ctx.work is for rounds only.
        self.down, self.up = fleet.comm_time(np.arange(m), ctx.bytes_down, ctx.bytes_up)
        self.env = simpy.Environment()
        self.version = 0
        # No version after this many job ends or simulated seconds: stalled.
        self.stall_jobs = stall_jobs or max(1000, 20 * concurrency * buffer_size)
        self.stall_s = stall_s
        self._last_version_t = 0.0
        self.idle = self.n_samples > 0  # free to take a slot (never, without data)
        self.jobs_started = np.zeros(m, dtype=np.int64)
        self.in_flight: dict[int, Job] = {}
        self._buffer: list[Arrival] = []
        self._ended: list[Arrival] = []
        self._started: list[Job] = []
        self._inbox: list[_Ended] = []
        self._settling = False
        self._wake_at = math.inf
        self._choices = 0
        self._dispatch_due = False
        self._made: list[Version] = []
        self._ends_ahead: list[float] = []  # a heap of in-flight jobs' end times
        # full buffers (applied, ended, started) the server has not finished
        self.server_s = server_s
        self._queue: list[_Closed] = []
        self._busy_s = 0.0
        self._request_settle()  # the first slots are handed out at t = 0

    def __iter__(self) -> Iterator[Version]:
        """Yield versions 0, 1, ... ``versions - 1``, stepping SimPy lazily.

        Raises:
            Stalled: no device can start or finish a job any more, or no
                version came for ``stall_jobs`` job ends or ``stall_s`` s.
        """
        for _ in range(self.versions):
            while not self._made:
                if self._dispatch_due:  # slots freed when the last version was made
                    self._dispatch_due = False
                    self._dispatch()
                try:
                    self.env.step()
                except simpy.core.EmptySchedule:
                    raise Stalled(
                        f"the async timeline stalled at t = {self.env.now:g} s "
                        f"after {self.version} versions: no device can start or "
                        "finish a job (never online again, no data, or endless "
                        "stragglers holding every slot)"
                    ) from None
                self._check_progress()
            yield self._made.pop(0)

    def _check_progress(self) -> None:
        """Raise Stalled after ``stall_jobs`` ends or ``stall_s`` s with no version."""
        ended = len(self._ended) + len(self._inbox)
        idle_s = self.env.now - self._last_version_t
        if ended > self.stall_jobs or idle_s > self.stall_s:
            reasons = Counter(a.status for a in self._ended)
            seen = ", ".join(f"{n} {why}" for why, n in sorted(reasons.items()))
            raise Stalled(
                f"no server version for {idle_s:,.0f} simulated s and {ended} "
                f"job ends ({seen or 'none'}) after version {self.version}: "
                "the fleet never completes enough accepted updates (devices "
                "leave or drop out before uploading, or every update is stale)"
            )

    def _request_settle(self) -> None:
        """Settle the job ends of this instant once, after all its events.

        A zero-delay timeout queues behind every event already due now, so
        ends that SimPy reports at the same float time in any event order
        are settled together, sorted by device: the result does not depend
        on SimPy's tie order. ``_settling`` keeps it to one per instant.
        """
        if not self._settling:
            self._settling = True
            self.env.timeout(0).callbacks.append(self._settle)

    def _settle(self, _event: simpy.Event) -> None:
        """Turn this instant's job ends into arrivals, make every version
        that fills the buffer, then hand out the freed slots."""
        self._settling = False
        # done (the queued buffers will make the last versions), or a job
        # ends within the slack of now: settle once, with it
        if self.version + len(self._queue) >= self.versions or self._tie_ahead():
            return
        inbox, self._inbox = sorted(self._inbox, key=lambda e: e.job.device), []
        for end in inbox:
            arrival = self._arrival(end)
            if arrival.status == "applied":
                self._buffer.append(arrival)
            self._ended.append(arrival)
            if len(self._buffer) == self.buffer_size:
                self._close_buffer()
                if self.version + len(self._queue) >= self.versions:
                    return
        if self._made:
            # Hand out the slots once the new version is yielded, so the chooser
            # sees it applied; nothing is scheduled in between: the same events.
            self._dispatch_due = True
        else:
            self._dispatch()

    def _tie_ahead(self) -> bool:
        """Whether another job ends within the slack of the first end waiting
        to be settled; if so, settle when it has ended instead (and say so).

        Ends equal but for their sums' last bits (two jobs of whole-second
        phases, started at a time an exp or log drew) then settle together,
        in device order, whichever of them SimPy meets first on this CPU.
        """
        if not self._inbox:
            return False
        now, ahead = self.env.now, self._ends_ahead
        while ahead and ahead[0] <= now:  # reported by now: SimPy ran them
            heapq.heappop(ahead)
        first = min(e.t for e in self._inbox)
        if not ahead or ahead[0] > first + _slack(first):
            return False
        self._settling = True
        self.env.timeout(_delay_until(now, ahead[0])).callbacks.append(self._settle)
        return True

    def _arrival(self, end: _Ended) -> Arrival:
        """Free the job's device and say how the job ended, now."""
        job = end.job
        del self.in_flight[job.device]
        self.idle[job.device] = True
        # staleness is counted against the version being filled right now
        # (behind the full buffers waiting for a busy server)
        filling = self.version + len(self._queue)
        s = None if end.reason else filling - job.version  # None: it left
        max_s = self.policy.max_staleness
        stale = s is not None and max_s is not None and s > max_s
        status = cast(_Status, end.reason or ("stale" if stale else "applied"))
        return Arrival(job, self.env.now, self.version, s, status, end.steps)

    def _close_buffer(self) -> None:
        """Hand the full buffer to the server: the next :class:`Version` now
        (a free server), or once the server has worked through the queue."""
        made = _Closed(tuple(self._buffer), tuple(self._ended))
        self._buffer, self._ended = [], []
        if self.server_s <= 0:
            self._make_version(made)
            return
        self._queue.append(made)
        if len(self._queue) == 1:  # the server was idle: it starts now
            self._serve()

    def _serve(self) -> None:
        """Work ``server_s`` on the queue's first buffer, then make it."""
        self._busy_s += self.server_s
        self.env.timeout(self.server_s).callbacks.append(self._served)

    def _served(self, _event: simpy.Event) -> None:
        """The server is done with the queue's first buffer: make its
        version, and start on the next buffer if one waits."""
        if self.version >= self.versions:
            return
        made = self._queue.pop(0)
        self._make_version(made)
        if self._queue:
            self._serve()

    def _make_version(self, made: _Closed) -> None:
        """The next :class:`Version` from a closed buffer, made now: with the
        jobs started since the last version (those started while the server
        worked download the older version, and are listed with this one)."""
        now = self.env.now
        contents = (*made, tuple(self._started), len(self.in_flight))
        self._started = []
        v: Version
        if self.server_s > 0:
            queued = self.buffer_size * len(self._queue) + len(self._buffer)
            v = ServedVersion(self.version, now, *contents, queued, self._busy_s)
        else:
            v = Version(self.version, now, *contents)
        self._made.append(v)
        self.version += 1
        self._last_version_t = now

    def _dispatch(self) -> None:
        """Start jobs on idle online devices while slots are free; if slots
        stay free, wake up when the next idle offline device comes online."""
        free = self.concurrency - len(self.in_flight)
        if free <= 0:
            return
        now = self.env.now
        online = self.fleet.online(now)
        chosen = np.flatnonzero(self.idle & online)
        if chosen.size > free:
            chosen = _checked_choice(self.choose, chosen, free, self._choices)
            self._choices += 1
        for d in chosen.tolist():
            self._start(d)
        if chosen.size < free:
            waiting = np.flatnonzero(self.idle & ~online)
            if waiting.size:
                wake = float(np.min(self.fleet.online_time(waiting, now)))
                # one pending wake-up at a time: an earlier one replaces it
                if math.isfinite(wake) and wake < self._wake_at:
                    self._wake_at = wake
                    self.env.timeout(_delay_until(now, wake)).callbacks.append(
                        self._wake
                    )

    def _wake(self, _event: simpy.Event) -> None:
        """A device may have come online: settle (and dispatch) now."""
        if self.env.now >= self._wake_at:
            self._wake_at = math.inf
        self._request_settle()

    def _start(self, d: int) -> None:
        """Start device ``d``'s next job at the current version.

        Every random draw of the job comes from the stream (seed, device,
        job index), so a job is the same whatever else the fleet does.
        """
        now = self.env.now
        k = int(self.jobs_started[d])
        self.jobs_started[d] += 1
        rng = np.random.default_rng(np.random.SeedSequence([self.seed, _TAG_JOB, d, k]))
        # drawn in this order: slowdown, epochs (a range), dropout
        slowdown = float(self.fleet.draw_slowdowns([d], rng.random((1, 2)))[0])
        if self.policy.job_steps == "max_steps":
            tau, epochs = self.policy.max_steps, None
        else:
            epochs = int(_draw_epochs(self.policy, 1, rng)[0])
            tau = int(steps_for(epochs, self.n_samples[d], self.batch_size))
        rate = float(self.fleet.speed[d]) / slowdown
        work = _Work(now, float(self.down[d]), tau, rate, float(self.up[d]))
        job = Job(d, k, self.version, tau, now, slowdown, epochs)
        self.idle[d] = False
        self.in_flight[d] = job
        self._started.append(job)
        offline = float(self.fleet.offline_time(np.array([d]), now)[0])
        drop = float(self.fleet.draw_dropouts([d], rng.random((1, 2)), work.busy_s)[0])
        leave = _leaving(work, offline, now + drop, "leaves")
        # the float SimPy will end the job at (the leave's as _leaving reckons)
        end = work.arrival if leave is None else now + (leave.at - now)
        if math.isfinite(end):
            heapq.heappush(self._ends_ahead, end)

        def finish(done: int, reason: str) -> None:
            self._inbox.append(_Ended(job, reason, done, self.env.now))
            self._request_settle()

        _run_device(self.env, work, finish, leave, every_phase=False)
