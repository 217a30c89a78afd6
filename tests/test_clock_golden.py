"""Golden outputs of the clock: every field of plan_round's plans and of
AsyncTimeline's versions, for varied cases, captured from the clock before
its device process was unified (issue 12). The refactored clock must
reproduce them exactly, float for float. The synchronous cases were
captured again when rounds moved to common random numbers (issue 36: each
device's draws of (seed, device, round)); the asynchronous ones are as
they were.

Regenerate (only when a change of the timeline is intended) with
``python tests/test_clock_golden.py`` from the repository root.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fedsim.clock import AsyncTimeline, RunContext, plan_round
from fedsim.fleet import Fleet
from fedsim.scenario import FleetSpec, RoundSpec, load_scenario

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = Path(__file__).with_name("data") / "clock_golden.json"
MB = 1_000_000


def mixed_fleet(
    dropout_p: float = 0.0, availability: dict | None = None, seed: int = 3
) -> Fleet:
    """Three groups of different speeds, links and stragglers (24 devices)."""
    on_off = availability if availability is not None else {}
    groups = [
        {
            "name": "fast",
            "count": 8,
            "speed": {"dist": "lognormal", "median_steps_per_s": 6.0, "sigma": 0.3},
            "network": {"down_mbps": 20, "up_mbps": 5, "latency_s": 0.05},
            "stragglers": {
                "p": 0.2,
                "slowdown": {"dist": "uniform", "low": 1.0, "high": 3.0},
                "dropout_p": dropout_p,
            },
            "availability": on_off,
        },
        {
            "name": "slow",
            "count": 8,
            "speed": {"dist": "fixed", "steps_per_s": 1.5},
            "network": {"down_mbps": 4, "up_mbps": 2},
            "stragglers": {
                "p": 0.4,
                "slowdown": {"dist": "pareto", "shape": 1.2, "max_factor": 50},
                "dropout_p": dropout_p,
            },
            "availability": on_off,
        },
        {
            "name": "steady",
            "count": 8,
            "speed": {"dist": "fixed", "steps_per_s": 3.0},
            "network": {"down_mbps": 8, "up_mbps": 8},
        },
    ]
    return Fleet.from_spec(FleetSpec.model_validate({"groups": groups}), seed)


def trace_fleet() -> Fleet:
    scenario = load_scenario(ROOT / "scenarios" / "fleets" / "phones-trace.yaml")
    return Fleet.from_spec(scenario.fleet, seed=0)


def n_samples_for(m: int, seed: int) -> np.ndarray:
    """Sample counts with some empty and some smaller than a batch."""
    n = np.random.default_rng(seed).integers(0, 300, size=m)
    n[::7] = 0
    n[1::5] = 7
    return n


def _plain(obj: Any) -> Any:
    """A dataclass tree as JSON-ready values (numpy scalars as Python ones)."""
    if dataclasses.is_dataclass(obj):
        return {f.name: _plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [_plain(x) for x in obj]
    if isinstance(obj, np.generic):
        return {"np": type(obj).__name__, "v": obj.item()}
    return obj


def sync_case(
    fleet: Fleet,
    policy: RoundSpec,
    *,
    rounds: int,
    k: int,
    seed: int,
    now: float = 0.0,
    gap_s: float = 0.0,
) -> list[Any]:
    """Several rounds in a row, as the server runs them (``seed`` the
    selection's generator; the devices' draws are the fleet's, per round)."""
    rng = np.random.default_rng(seed)
    n = n_samples_for(fleet.size, seed)
    asked = math.ceil(round(policy.over_select * k, 9))
    keep = k if policy.over_select > 1 else None
    out = []
    for t in range(rounds):
        chosen = rng.choice(fleet.size, size=asked, replace=False)
        rp = plan_round(
            fleet, chosen, now, policy, t, RunContext(MB, MB // 2, n, 20), keep
        )
        out.append(_plain(rp))
        now = rp.t_end + gap_s
    return out


def async_case(
    fleet: Fleet,
    policy: RoundSpec,
    *,
    versions: int,
    buffer_size: int,
    concurrency: int,
    seed: int,
) -> list[Any]:
    tl = AsyncTimeline(
        fleet,
        policy,
        versions=versions,
        buffer_size=buffer_size,
        concurrency=concurrency,
        seed=seed,
        ctx=RunContext(MB, MB // 2, n_samples_for(fleet.size, seed), 20),
    )
    return [_plain(v) for v in tl]


def cases() -> dict[str, Any]:
    """Every golden case, as a function computing it with the current clock."""
    flaky = {"kind": "on_off", "mean_on_s": 20.0, "mean_off_s": 10.0}
    return {
        "window_flaky_dropouts": lambda: sync_case(
            mixed_fleet(dropout_p=0.2, availability=flaky),
            RoundSpec(window_s=12, max_steps=40),
            rounds=8,
            k=10,
            seed=1,
            gap_s=0.5,
        ),
        "epochs_range_deadline": lambda: sync_case(
            mixed_fleet(dropout_p=0.15, availability=flaky),
            RoundSpec(
                policy="fixed_epochs", epochs_low=1, epochs_high=4, deadline_s=25
            ),
            rounds=8,
            k=12,
            seed=2,
        ),
        "epochs_no_deadline": lambda: sync_case(
            mixed_fleet(availability=flaky),
            RoundSpec(policy="fixed_epochs", epochs=2),
            rounds=6,
            k=9,
            seed=3,
        ),
        "epochs_over_select": lambda: sync_case(
            mixed_fleet(dropout_p=0.1, availability=flaky),
            RoundSpec(policy="fixed_epochs", epochs=1, deadline_s=40, over_select=1.5),
            rounds=8,
            k=8,
            seed=4,
        ),
        "epochs_trace": lambda: sync_case(
            trace_fleet(),
            RoundSpec(policy="fixed_epochs", epochs=1, deadline_s=600),
            rounds=6,
            k=6,
            seed=5,
            now=66_000.0,
            gap_s=900.0,
        ),
        "async_k1_flaky_dropouts": lambda: async_case(
            mixed_fleet(dropout_p=0.2, availability=flaky),
            RoundSpec(policy="async", max_steps=30, max_staleness=4),
            versions=40,
            buffer_size=1,
            concurrency=6,
            seed=6,
        ),
        "async_k3_epochs_range": lambda: async_case(
            mixed_fleet(dropout_p=0.1, availability=flaky),
            RoundSpec(policy="async", job_steps="epochs", epochs_low=1, epochs_high=3),
            versions=25,
            buffer_size=3,
            concurrency=9,
            seed=7,
        ),
        "async_k3_always_online": lambda: async_case(
            mixed_fleet(dropout_p=0.05),
            RoundSpec(policy="async", max_steps=20),
            versions=20,
            buffer_size=3,
            concurrency=5,
            seed=8,
        ),
        "async_trace": lambda: async_case(
            trace_fleet(),
            RoundSpec(policy="async", job_steps="epochs", epochs=1),
            versions=15,
            buffer_size=2,
            concurrency=4,
            seed=9,
        ),
    }


def _dump(obj: Any) -> str:
    return json.dumps(obj, indent=1, sort_keys=True)


@pytest.mark.parametrize("name", sorted(cases()))
def test_clock_reproduces_golden_outputs(name):
    # Prepare
    golden = json.loads(FIXTURE.read_text())[name]

    # Execute
    got = json.loads(_dump(cases()[name]()))

    # Assert: every field, every float, bit for bit (repr round-trips)
    assert _dump(got) == _dump(golden)


if __name__ == "__main__":
    FIXTURE.parent.mkdir(exist_ok=True)
    FIXTURE.write_text(_dump({k: f() for k, f in cases().items()}) + "\n")
    print(f"wrote {FIXTURE}")
