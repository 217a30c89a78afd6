"""The clock's device process and the race that ends a job early
(fedsim.clock._Work, _leaving): the tie rules of each mode, by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedsim.clock import AsyncTimeline, RunContext, _leaving, _Work, plan_round
from fedsim.fleet import Fleet
from fedsim.scenario import FleetSpec, RoundSpec

# Starts at t = 10: 1 s down, 8 steps at 4 steps/s (2 s), 1 s up: arrives at 14
WORK = _Work(t_start=10.0, down=1.0, tau=8, rate=4.0, up=1.0)
INF = math.inf


def test_work_hand_computed():
    assert (WORK.compute_s, WORK.busy_s, WORK.arrival) == (2.0, 4.0, 14.0)
    # 0.6 s of compute at 4 steps/s: 2 whole steps; never more than tau
    assert [WORK.steps_done(t) for t in (10.5, 11.6, 12.0, 13.5)] == [0, 2, 4, 8]


def test_a_rate_of_zero_is_an_endless_job():
    endless = _Work(0.0, 1.0, 8, 0.0, 1.0)
    assert (endless.compute_s, endless.arrival) == (INF, INF)
    assert endless.steps_done(100.0) == 0


@pytest.mark.parametrize("tie", ["arrives", "leaves"])
def test_going_offline_wins_a_tie_with_dropping_out(tie):
    assert _leaving(WORK, 12.0, 12.0, tie) == (12.0, "offline")
    assert _leaving(WORK, 12.5, 12.0, tie) == (12.0, "dropout")
    assert _leaving(WORK, 12.0, 12.5, tie) == (12.0, "offline")


@pytest.mark.parametrize("tie", ["arrives", "leaves"])
def test_never_leaving_or_leaving_after_arrival(tie):
    assert _leaving(WORK, INF, INF, tie) is None
    assert _leaving(WORK, 14.5, INF, tie) is None
    assert _leaving(WORK, INF, 14.5, tie) is None


def test_a_round_counts_an_arrival_at_the_instant_of_leaving():
    # Synchronous rounds: leaving strictly before the arrival (and deadline)
    assert _leaving(WORK, 14.0, INF, "arrives") is None
    assert _leaving(WORK, INF, 14.0, "arrives") is None
    assert _leaving(WORK, 13.0, INF, "arrives", deadline=13.0) is None
    assert _leaving(WORK, 12.9, INF, "arrives", deadline=13.0) == (12.9, "offline")


def test_the_timeline_interrupts_an_arrival_at_the_instant_of_leaving():
    # Asynchronous timeline: the leave timeout fires first on a tie
    assert _leaving(WORK, 14.0, INF, "leaves") == (14.0, "offline")
    assert _leaving(WORK, INF, 14.0, "leaves") == (14.0, "dropout")


def test_an_endless_job_leaves_whenever_the_device_does():
    endless = _Work(0.0, 1.0, 8, 0.0, 1.0)
    for tie in ("arrives", "leaves"):
        assert _leaving(endless, 1e9, INF, tie) == (1e9, "offline")
        assert _leaving(endless, INF, INF, tie) is None


# ------------------------------------------------ endless stragglers, by mode
MB = 1_000_000  # bytes: 1 s over an 8 Mbit/s link


class EndlessFleet:
    """A fleet whose devices in ``endless`` are slowed by an infinite factor
    (what a Pareto slowdown overflowing to inf gives; tests only)."""

    def __init__(self, count: int, endless: set[int]):
        group = {
            "name": "g",
            "count": count,
            "speed": {"dist": "fixed", "steps_per_s": 4.0},
            "network": {"down_mbps": 8, "up_mbps": 8},
        }
        spec = FleetSpec.model_validate({"groups": [group]})
        self.base = Fleet.from_spec(spec, seed=0)
        self.endless = endless

    def __getattr__(self, name):  # size, speed, comm_time, offline_time, ...
        return getattr(self.base, name)

    def draw_slowdowns(self, devices, u):
        factor = self.base.draw_slowdowns(devices, u)
        slow = np.isin(np.asarray(devices), list(self.endless))
        return np.where(slow, np.inf, factor)


def test_a_round_with_a_deadline_drops_an_endless_straggler_as_late():
    # Prepare: device 1 never finishes its 5 steps; deadline 30 s
    fleet = EndlessFleet(2, {1})
    policy = RoundSpec(policy="fixed_epochs", epochs=1, deadline_s=30)

    # Execute
    rp = plan_round(
        fleet,
        np.array([0, 1]),
        0.0,
        policy,
        0,
        RunContext(MB, MB, np.array([100, 100]), 20),
    )

    # Assert: it would "arrive" at t = inf, after the deadline
    fast, endless = rp.plans
    assert (fast.tau, fast.t_arrive, fast.reason) == (5, 3.25, "")
    assert (endless.tau, endless.t_arrive, endless.reason) == (5, INF, "late")
    assert rp.t_end == 30.0


def test_the_timeline_never_sees_an_endless_job_arrive():
    # Prepare: the only device never finishes a job
    fleet = EndlessFleet(1, {0})
    tl = AsyncTimeline(
        fleet,
        RoundSpec(policy="async", max_steps=8),
        versions=1,
        buffer_size=1,
        concurrency=1,
        seed=0,
        ctx=RunContext(MB, MB, np.array([100]), 20),
    )

    # Execute / Assert: nothing ends, so the timeline stalls (no arrival at inf)
    with pytest.raises(RuntimeError, match="stalled"):
        list(tl)
