"""The one steps rule of the clock (fedsim.clock.steps_for, expected_steps)
and its users: plan_round, AsyncTimeline and SelectorContext.from_run."""

from __future__ import annotations

import numpy as np
import pytest

from fedsim.clock import (
    AsyncTimeline,
    RunContext,
    expected_steps,
    plan_round,
    steps_for,
)
from fedsim.fleet import Fleet
from fedsim.scenario import FleetSpec, RoundSpec
from fedsim.selectors.base import SelectorContext

MB = 1_000_000  # bytes: 1 s over an 8 Mbit/s link


def fleet_of(count: int, speed: float = 4.0) -> Fleet:
    group = {
        "name": "g",
        "count": count,
        "speed": {"dist": "fixed", "steps_per_s": speed},
        "network": {"down_mbps": 8, "up_mbps": 8},
    }
    return Fleet.from_spec(FleetSpec.model_validate({"groups": [group]}), seed=0)


# ---------------------------------------------------------------- steps_for
def test_steps_for_hand_computed():
    # Prepare: E = 3, B = 20
    n = np.array([0, 1, 19, 20, 39, 40, 100])

    # Execute
    tau = steps_for(3, n, 20)

    # Assert: 0 without data; E while n < B; floor(3 n / 20) from n = B on
    assert tau.tolist() == [0, 3, 3, 3, 5, 6, 15]
    assert tau.dtype == np.int64


def test_steps_for_epochs_per_device():
    # Execute: E = (1, 2, 3, 4), n = (10, 50, 0, 45), B = 20
    tau = steps_for(np.array([1, 2, 3, 4]), np.array([10, 50, 0, 45]), 20)

    # Assert: 1 (one batch), floor(100 / 20), 0 (no data), floor(180 / 20)
    assert tau.tolist() == [1, 5, 0, 9]


def test_steps_for_float_epochs_do_not_floor():
    # Execute: E = 2.5, B = 20
    tau = steps_for(2.5, np.array([0, 10, 30, 41]), 20)

    # Assert: 0, 2.5 (one batch per epoch), 2.5 * 30 / 20, 2.5 * 41 / 20
    assert tau.tolist() == [0.0, 2.5, 3.75, 5.125]
    assert tau.dtype == np.float64


# ----------------------------------------------------------- expected_steps
def test_expected_steps_use_the_mean_epochs():
    # Prepare: E uniform in {1, ..., 4}: mean 2.5
    policy = RoundSpec(policy="fixed_epochs", epochs_low=1, epochs_high=4)

    # Execute
    steps = expected_steps(policy, np.array([0, 10, 30]), 20)

    # Assert: an empty client counts one batch per epoch (as from_run always did)
    assert steps.tolist() == [2.5, 2.5, 3.75]


@pytest.mark.parametrize(
    "policy",
    [
        RoundSpec(policy="fixed_window", max_steps=7),
        RoundSpec(policy="async", max_steps=7, job_steps="epochs", epochs=3),
    ],
)
def test_expected_steps_are_max_steps_under_other_policies(policy):
    assert expected_steps(policy, np.array([0, 500]), 20).tolist() == [7.0, 7.0]


def test_from_run_round_times_hand_computed():
    # Prepare: 4 steps/s, 1 s down and up; E = 2, B = 20, n = (10, 100, 0)
    fleet = fleet_of(3)
    policy = RoundSpec(policy="fixed_epochs", epochs=2)

    # Execute
    ctx = SelectorContext.from_run(fleet, np.array([10, 100, 0]), policy, 20, MB, MB)

    # Assert: steps (2, 10, 2) -> 1 + steps / 4 + 1
    assert ctx.round_time_s.tolist() == [2.5, 4.5, 2.5]


# ------------------------------------------------------------------ its users
def test_plan_round_and_timeline_take_tau_from_steps_for():
    # Prepare: E = 2, B = 20, n = (5, 20, 50, 0)
    n = np.array([5, 20, 50, 0])
    fleet = fleet_of(4)
    want = steps_for(2, n, 20).tolist()  # [2, 2, 5, 0]

    # Execute
    rp = plan_round(
        fleet,
        np.arange(4),
        0.0,
        RoundSpec(policy="fixed_epochs", epochs=2),
        np.random.default_rng(0),
        RunContext(MB, MB, n, 20),
    )
    tl = AsyncTimeline(
        fleet,
        RoundSpec(policy="async", job_steps="epochs", epochs=2),
        versions=1,
        buffer_size=2,
        concurrency=4,
        seed=0,
        ctx=RunContext(MB, MB, n, 20),
    )
    (version,) = list(tl)

    # Assert: the device without data never trains in either mode (version 0
    # is made at t = 2.5 s, when devices 0 and 1 arrive)
    assert want == [2, 2, 5, 0]
    assert [p.tau for p in rp.plans] == want
    assert [p.reason for p in rp.plans] == ["", "", "", "no_data"]
    assert [(j.device, j.tau) for j in version.started] == [(0, 2), (1, 2), (2, 5)]


@pytest.mark.parametrize(
    ("epochs", "low", "high", "batch_size"),
    [(1, None, None, 20), (3, None, None, 7), (None, 1, 4, 32), (None, 2, 3, 1)],
)
def test_expected_steps_keep_the_numbers_from_run_had(epochs, low, high, batch_size):
    # Prepare: the rule SelectorContext.from_run had before it used the clock's
    policy = RoundSpec(
        policy="fixed_epochs", epochs=epochs, epochs_low=low, epochs_high=high
    )
    n = np.random.default_rng(0).integers(0, 200, size=500)
    n[:20] = 0
    mean = (low + high) / 2.0 if low is not None else float(epochs)
    before = np.where(n < batch_size, mean, mean * n / batch_size)

    # Execute
    steps = expected_steps(policy, n, batch_size)

    # Assert: bit for bit
    assert steps.tolist() == before.tolist()


# ------------------------------------------- fixed_window: a fractional count
def test_a_window_with_a_fractional_step_count_floors_it():
    # Prepare: W = 10 s, 1 s down and 1 s up (1 MB at 8 Mbit/s), so 8 s of
    # compute: at 4.7 steps/s that is 37.6 steps, at 4.3 steps/s 34.4. Only
    # floor gives (37, 34): round gives (38, 34), ceil (38, 35). (Every other
    # hand-computed case has a whole count.) No stragglers: no draw involved.
    groups = [
        {"name": f"g{i}", "count": 1,
         "speed": {"dist": "fixed", "steps_per_s": speed},
         "network": {"down_mbps": 8, "up_mbps": 8}}
        for i, speed in enumerate([4.7, 4.3])
    ]  # fmt: skip
    fleet = Fleet.from_spec(FleetSpec.model_validate({"groups": groups}), seed=0)

    # Execute
    rp = plan_round(
        fleet,
        np.arange(2),
        100.0,
        RoundSpec(window_s=10, max_steps=100),
        np.random.default_rng(0),
        RunContext(MB, MB, np.array([100, 100]), 20),
    )

    # Assert: tau floored; each arrives when its whole steps and upload are
    # done (1 + 37 / 4.7 + 1 = 9.8723 s, 1 + 34 / 4.3 + 1 = 9.9070 s), before
    # the window's end
    fast, slow = rp.plans
    assert (fast.tau, slow.tau) == (37, 34)
    assert fast.t_arrive == pytest.approx(100 + 2 + 37 / 4.7, abs=1e-9)
    assert slow.t_arrive == pytest.approx(100 + 2 + 34 / 4.3, abs=1e-9)
    assert not fast.dropped and not slow.dropped and rp.t_end == 110.0
