"""Tests for fedsim.clock: hand-computed round plans."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from fedsim.clock import Plan, RoundPlan, RunContext, plan_round
from fedsim.fleet import Fleet
from fedsim.scenario import FleetSpec, RoundSpec

MB = 1_000_000  # bytes; 8 Mbit, i.e. 1 s over an 8 Mbit/s link
NOW = 100.0


def fleet_of(*groups: dict, seed: int = 0) -> Fleet:
    """Groups given as {count, speed, down, up, latency, p, slowdown, availability}."""
    specs = []
    for i, g in enumerate(groups):
        specs.append(
            {
                "name": f"g{i}",
                "count": g.get("count", 1),
                "speed": {"dist": "fixed", "steps_per_s": g.get("speed", 4.0)},
                "network": {
                    "down_mbps": g.get("down", 8.0),
                    "up_mbps": g.get("up", 8.0),
                    "latency_s": g.get("latency", 0.0),
                },
                "stragglers": {"p": g.get("p", 0.0), "slowdown": g.get("slowdown", {})},
                "availability": g.get("availability", {}),
            }
        )
    return Fleet.from_spec(FleetSpec.model_validate({"groups": specs}), seed)


def plan(
    fleet: Fleet,
    policy: RoundSpec,
    chosen: list[int] | None = None,
    t: int = 0,
    n_samples: list[int] | None = None,
    batch_size: int = 20,
    now: float = NOW,
) -> RoundPlan:
    ids = np.arange(fleet.size) if chosen is None else np.array(chosen)
    n = np.full(fleet.size, 100) if n_samples is None else np.array(n_samples)
    return plan_round(
        fleet,
        ids,
        now,
        policy,
        t,
        RunContext(MB, MB, n, batch_size),
    )


# ------------------------------------------------------------- fixed_window
def test_window_hand_computed():
    # Prepare: W = 10 s, 1 s down, 1 s up, 4 steps/s -> 8 s of compute = 32 steps
    fleet = fleet_of({"count": 2})

    # Execute
    rp = plan(fleet, RoundSpec(window_s=10, max_steps=100))

    # Assert
    assert rp.t_start == NOW and rp.t_end == NOW + 10
    assert rp.plans[0] == Plan(
        client=0,
        tau=32,
        t_start=NOW,
        t_arrive=NOW + 10,
        dropped=False,
        reason="",
        slowdown=1.0,
        epochs=None,
    )
    assert [p.client for p in rp.plans] == [0, 1]
    assert len(rp.arrived) == 2


def test_window_max_steps_clips_and_arrives_early():
    # Prepare
    fleet = fleet_of({})

    # Execute: 32 steps fit, only 20 allowed: 1 s + 20 / 4 s + 1 s = 7 s
    (p,) = plan(fleet, RoundSpec(window_s=10, max_steps=20)).plans

    # Assert
    assert p.tau == 20
    assert p.t_arrive == pytest.approx(NOW + 7)


def test_window_too_short_for_communication():
    # Prepare: 8 Mbit at 0.5 Mbit/s = 16 s of download, more than W
    fleet = fleet_of({"down": 0.5}, {})

    # Execute
    rp = plan(fleet, RoundSpec(window_s=10))

    # Assert
    slow, ok = rp.plans
    assert (slow.tau, slow.dropped, slow.reason) == (0, True, "no_time")
    assert slow.t_arrive == NOW + 10
    assert not slow.contributes
    assert (ok.tau, ok.dropped) == (32, False)
    assert rp.t_end == NOW + 10


def test_window_floor_is_not_lost_to_rounding():
    # Prepare: 0.3 - (0.05 + 0.05) is 0.19999999999999998 in floats; at 10
    # steps/s that is 2 steps, not 1. Zero bytes leave only the latency.
    fleet = fleet_of({"speed": 10.0, "latency": 0.05})

    # Execute
    rp = plan_round(
        fleet,
        np.array([0]),
        0.0,
        RoundSpec(window_s=0.3),
        0,
        RunContext(0, 0, np.array([10]), 10),
    )

    # Assert
    assert rp.plans[0].tau == 2
    assert rp.plans[0].t_arrive <= 0.3


def test_straggler_divides_tau():
    # Prepare: every device slowed by 4: 8 s of compute at 1 step/s
    fleet = fleet_of({"p": 1.0, "slowdown": {"dist": "fixed", "factor": 4.0}})

    # Execute
    (p,) = plan(fleet, RoundSpec(window_s=10)).plans

    # Assert
    assert p.slowdown == 4.0
    assert p.tau == 8
    assert p.t_arrive == pytest.approx(NOW + 10)


# ------------------------------------------------------------- fixed_epochs
def test_epochs_hand_computed():
    # Prepare: n = 100, B = 20, E = 2 -> 10 steps; 10 / 4 steps/s = 2.5 s
    fleet = fleet_of({})

    # Execute
    rp = plan(fleet, RoundSpec(policy="fixed_epochs", epochs=2))

    # Assert
    (p,) = rp.plans
    assert (p.tau, p.epochs, p.dropped) == (10, 2, False)
    assert p.t_arrive == pytest.approx(NOW + 1 + 2.5 + 1)
    assert rp.t_end == p.t_arrive


def test_epochs_small_and_empty_clients():
    # Prepare: 5 samples < B = 20 -> one step per epoch; 0 samples -> nothing
    fleet = fleet_of({"count": 3})

    # Execute
    rp = plan(fleet, RoundSpec(policy="fixed_epochs", epochs=3), n_samples=[5, 0, 45])

    # Assert
    small, empty, big = rp.plans
    assert (small.tau, small.dropped) == (3, False)
    assert (empty.tau, empty.dropped, empty.reason, empty.t_arrive) == (
        0,
        True,
        "no_data",
        NOW,
    )
    assert big.tau == 6  # floor(3 * 45 / 20)
    assert rp.t_end == pytest.approx(NOW + 1 + 6 / 4 + 1)


def test_epochs_drawn_per_device_in_id_order():
    # Prepare
    fleet = fleet_of({"count": 6})
    policy = RoundSpec(policy="fixed_epochs", epochs_low=2, epochs_high=5)
    u = fleet.round_draws(np.arange(6), 42).epochs  # device i's own uniform
    expected = 2 + np.floor(u * 4).astype(int)  # inverse CDF on 2..5

    # Execute
    rp = plan(fleet, policy, chosen=[5, 3, 1, 0, 2, 4], t=42)

    # Assert
    assert [p.epochs for p in rp.plans] == expected.tolist()
    assert [p.tau for p in rp.plans] == (expected * 100 // 20).tolist()


def test_deadline_drops_the_slow_device():
    # Prepare: 10 steps at 4/s -> arrives at +4.5 s; at 1/s -> at +12 s
    fleet = fleet_of({"speed": 4.0}, {"speed": 1.0})

    # Execute
    rp = plan(fleet, RoundSpec(policy="fixed_epochs", epochs=2, deadline_s=8))

    # Assert
    fast, slow = rp.plans
    assert (fast.dropped, fast.t_arrive) == (False, pytest.approx(NOW + 4.5))
    assert (slow.dropped, slow.reason, slow.tau) == (True, "late", 10)
    assert slow.t_arrive == pytest.approx(NOW + 12)  # when it would have arrived
    assert rp.t_end == NOW + 8
    assert [p.client for p in rp.arrived] == [0]


def test_deadline_not_reached_ends_at_last_arrival():
    fleet = fleet_of({"speed": 4.0}, {"speed": 2.0})
    rp = plan(fleet, RoundSpec(policy="fixed_epochs", epochs=2, deadline_s=60))
    assert rp.t_end == pytest.approx(NOW + 1 + 10 / 2 + 1)


# ---------------------------------------------------------------- offline
def flaky_fleet() -> Fleet:
    on_off = {"kind": "on_off", "mean_on_s": 6.0, "mean_off_s": 6.0}
    return fleet_of({"count": 200, "availability": on_off}, seed=1)


def test_device_going_offline_mid_compute_is_dropped():
    # Prepare: find a device online at NOW that goes offline while computing
    # (after its 1 s download, before the 32 steps end at +9 s)
    fleet = flaky_fleet()
    online = np.flatnonzero(fleet.online(NOW))
    t_off = fleet.offline_time(online, NOW)
    d = online[(t_off > NOW + 2) & (t_off < NOW + 8)][0]
    off = fleet.offline_time(np.array([d]), NOW)[0]

    # Execute
    (p,) = plan(fleet, RoundSpec(window_s=10), chosen=[d]).plans

    # Assert: it worked floor((off - NOW - 1) * 4) steps, all lost
    assert (p.dropped, p.reason) == (True, "offline")
    assert p.t_arrive == off
    assert p.tau == int((off - NOW - 1) * 4)
    assert not p.contributes


def test_offline_matches_fleet_for_every_device():
    # Prepare
    fleet = flaky_fleet()
    ids = np.arange(fleet.size)
    off = fleet.offline_time(ids, NOW)

    # Execute
    rp = plan(fleet, RoundSpec(window_s=10))

    # Assert: dropped exactly when offline before the planned arrival at +10 s
    for p, t_off in zip(rp.plans, off, strict=True):
        if t_off < NOW + 10:
            assert (p.reason, p.t_arrive) == ("offline", t_off)
        else:
            assert (p.reason, p.tau, p.t_arrive) == ("", 32, NOW + 10)
    assert {p.reason for p in rp.plans} == {"", "offline"}
    assert rp.t_end == NOW + 10


def test_server_waits_for_a_device_that_drops_late_in_the_round():
    # Prepare: under fixed_epochs the server cannot know that a device will
    # drop, so the round lasts until the last device has arrived or dropped.
    # Device 0 arrives at +4.5 s; a slow flaky device would arrive at +102 s.
    on_off = {"kind": "on_off", "mean_on_s": 30.0, "mean_off_s": 6.0}
    fleet = fleet_of({}, {"count": 50, "speed": 0.1, "availability": on_off})
    flaky = np.arange(1, 51)
    t_off = fleet.offline_time(flaky, NOW)
    d = flaky[(t_off > NOW + 4.5) & (t_off < NOW + 102)][0]
    off = fleet.offline_time(np.array([d]), NOW)[0]

    # Execute
    rp = plan(fleet, RoundSpec(policy="fixed_epochs", epochs=2), chosen=[0, d])

    # Assert
    fast, dropped = rp.plans
    assert fast.t_arrive == pytest.approx(NOW + 4.5)
    assert (dropped.reason, dropped.t_arrive) == ("offline", off)
    assert rp.t_end == off


# ------------------------------------------------------------ general
def test_same_seed_same_plan():
    # Prepare
    fleet = fleet_of(
        {"count": 30, "p": 0.5, "slowdown": {"dist": "pareto", "shape": 1.5}},
        {"count": 30, "availability": {"kind": "on_off", "mean_on_s": 30}},
    )
    policy = RoundSpec(
        policy="fixed_epochs", epochs_low=1, epochs_high=4, deadline_s=30
    )

    # Execute
    a, b = (plan(fleet, policy, chosen=list(range(0, 60, 3)), t=9) for _ in "ab")
    c = plan(fleet, policy, chosen=list(range(0, 60, 3)), t=10)

    # Assert
    assert a == b
    assert a != c


def test_chosen_must_be_distinct():
    with pytest.raises(ValueError, match="distinct"):
        plan(fleet_of({"count": 3}), RoundSpec(), chosen=[1, 1])


def test_clock_imports_no_torch_and_no_ray():
    code = (
        "import sys, fedsim.clock, fedsim.fleet; "
        "assert not {'torch', 'ray'} & set(sys.modules)"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_docstring_example_runs():
    import doctest

    import fedsim.clock

    assert doctest.testmod(fedsim.clock).failed == 0
