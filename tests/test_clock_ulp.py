"""Decisions of the clock that a float's last bit must not flip: the
rounding SimPy makes when it adds a delay back to the current time, and
the slack with which times become whole steps and deadlines are judged
(docs/architecture.md, "Determinism")."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from fedsim.clock import AsyncTimeline, RunContext
from fedsim.fleet import Fleet
from fedsim.scenario import FleetSpec, RoundSpec
from fedsim.traces import write_trace


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
