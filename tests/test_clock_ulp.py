"""Decisions of the clock that a float's last bit must not flip: the
rounding SimPy makes when it adds a delay back to the current time, and the
slack with which deadlines are judged and ties ordered (docs/architecture.md,
"Determinism")."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fedsim.clock import AsyncTimeline, RunContext, plan_round
from fedsim.fleet import Fleet
from fedsim.scenario import FleetSpec, RoundSpec
from fedsim.traces import write_trace
from tests import test_clock_golden as golden
from tests.test_clock_golden import _dump


def trace_fleet(tmp_path: Path, availability: str) -> Fleet:
    """One phone at 1 step/s on 8 Mbit/s links, online as ``availability``."""
    row = {"device": "a", "speed_steps_per_s": 1.0, "down_mbps": 8, "up_mbps": 8}
    path = write_trace(
        tmp_path / "one.csv", [{**row, "latency_s": 0, "availability": availability}]
    )
    spec = {"groups": [{"name": "g", "trace": {"file": str(path)}}]}
    return Fleet.from_spec(FleetSpec.model_validate(spec), seed=0)


def test_a_wake_up_that_simpy_would_land_short_still_finds_the_device_online(
    tmp_path,
):
    # Prepare: the phone leaves its first job offline at 1.516 s and is back
    # at 20.541 s; SimPy's 1.516 + (20.541 - 1.516) is one ulp short of it
    left, back = 1.516, 20.541
    assert left + (back - left) < back
    fleet = trace_fleet(tmp_path, f"0-{left};{back}-inf")
    timeline = AsyncTimeline(
        fleet,
        RoundSpec(policy="async", max_steps=5),
        versions=1,
        buffer_size=1,
        concurrency=1,
        seed=0,
        ctx=RunContext(1000, 1000, np.array([50]), batch_size=10),
    )

    # Execute (before the fix: Stalled, the wake-up found the phone offline)
    (version,) = list(timeline)

    # Assert: the second job starts when the phone is back (or the float
    # after), and its update makes the version
    first, second = version.ended
    assert (first.status, first.t) == ("offline", left)
    assert second.status == "applied"
    assert back <= second.job.t_start <= math.nextafter(back, math.inf)


def two_devices() -> Fleet:
    """Two fixed devices whose jobs take 5 s, split alike only in sum:
    8/3 s down, 5/3 s compute, 2/3 s up; and 1 + 2 + 2 s."""
    groups = [
        {
            "name": name,
            "count": 1,
            "speed": {"dist": "fixed", "steps_per_s": speed},
            "network": {"down_mbps": down, "up_mbps": up},
        }
        for name, speed, down, up in (("a", 3.0, 3, 6), ("b", 2.5, 8, 2))
    ]
    return Fleet.from_spec(FleetSpec.model_validate({"groups": groups}), seed=0)


@pytest.mark.parametrize("now", [100.1, 33.7, 66000.7])
def test_equal_arrivals_tie_and_meet_their_deadline_whatever_the_last_bits(now):
    # Prepare: both jobs take 5 s and the deadline is 5 s; the float sums
    # land an ulp after, on, or before now + 5 depending on now's last bits
    # (here: after at 100.1, before at 33.7), as they may on another CPU
    policy = RoundSpec(policy="fixed_epochs", epochs=1, deadline_s=5, over_select=2)
    ctx = RunContext(1_000_000, 500_000, np.array([50, 50]), batch_size=10)

    # Execute: keep the first arrival of the two
    rp = plan_round(two_devices(), np.array([0, 1]), now, policy, 0, ctx, keep=1)

    # Assert: neither is late; the tie goes to the lower device id
    assert [(p.client, p.reason) for p in rp.plans] == [(0, ""), (1, "surplus")]
    assert all(math.isclose(p.t_arrive, now + 5, rel_tol=1e-15) for p in rp.plans)


def flaky_fixed_fleet(seed: int) -> Fleet:
    """Fixed speeds and links (jobs of equal sums; one device's job can end
    with another's two), online on and off: start times from a log."""
    groups = [
        {
            "name": f"g{i}",
            "count": 6,
            "speed": {"dist": "fixed", "steps_per_s": speed},
            "network": {"down_mbps": 3, "up_mbps": 6},
            "availability": {"kind": "on_off", "mean_on_s": 40.0, "mean_off_s": 20.0},
            "stragglers": {"p": 0.0, "dropout_p": 0.1},
        }
        for i, speed in enumerate([3.0, 6.0, 1.5])
    ]
    return Fleet.from_spec(FleetSpec.model_validate({"groups": groups}), seed)


def _timeline(seed: int) -> Any:
    fleet = flaky_fixed_fleet(seed)
    policy = RoundSpec(policy="async", max_steps=12, max_staleness=3)
    return json.loads(
        _dump(
            golden.async_case(
                fleet, policy, versions=12, buffer_size=2, concurrency=5, seed=seed
            )
        )
    )


@pytest.mark.parametrize(("seed", "mode"), [(16, "down"), (18, "up"), (19, "mixed")])
def test_async_ends_equal_but_for_last_bits_settle_alike(monkeypatch, seed, mode):
    # Prepare: the timeline as this CPU computes it; these seeds' timelines
    # hold ends equal but for their sums' last bits (which version an
    # update joins, and its staleness, followed SimPy's float order)
    want = _timeline(seed)
    golden.perturb_transcendentals(monkeypatch, mode)

    # Execute: the same with exp and log one ulp off
    got = _timeline(seed)

    # Assert: every discrete outcome alike, floats close
    assert golden.golden_differences(got, want) == []
