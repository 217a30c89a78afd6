"""The clock's device process and the race that ends a job early
(fedsim.clock._Work, _leaving): the tie rules of each mode, by hand."""

from __future__ import annotations

import math

import pytest

from fedsim.clock import _leaving, _Work

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
