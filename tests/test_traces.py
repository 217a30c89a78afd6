"""Trace files: measured devices as a fleet group (fedsim.traces)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedsim import presets
from fedsim.fleet import Fleet, FleetSpec
from fedsim.scenario import ScenarioError, load_scenario
from fedsim.traces import (
    TraceError,
    format_intervals,
    load_trace,
    parse_intervals,
    write_trace,
)

from .conftest import SCENARIOS

FLASH = Path(__file__).resolve().parents[2] / "shared" / "data" / "flash-device-traces"
HEADER = "device,speed_steps_per_s,down_mbps,up_mbps,latency_s,availability\n"


def flash_rows() -> list[dict]:
    """One device per AI-Benchmark phone of FLASH: speed from its score (the
    power law of fedsim.presets, anchored at its tier's reference phone), WiFi
    of the 19 measured users in turn, and a made-up evening session."""
    scores = json.loads((FLASH / "benchmark2score.json").read_text())
    users = list(json.loads((FLASH / "speed_distri.json").read_text()).values())
    ref = np.array(presets.FLASH_REFERENCE_SCORES)
    b = presets.FLASH_ELASTICITY["femnist-cnn"]
    rows = []
    for i, (name, score) in enumerate(scores.items()):
        tier = int(np.argmin(np.abs(score - ref)))
        median = 1000.0 / presets.FLASH_TRAIN_MS["femnist-cnn"][tier]
        user = users[i % len(users)]
        start = 60_000.0 + 50.0 * i
        rows.append(
            {
                "device": name,
                "speed_steps_per_s": median * (score / ref[tier]) ** b,
                "down_mbps": user["down_u"] * 8 / 1000,
                "up_mbps": user["up_u"] * 8 / 1000,
                "latency_s": 0.05,
                "availability": [(start, start + 3600.0)],
            }
        )
    return rows


def fleet_of(trace: dict | str, seed: int = 0, **fleet: object) -> Fleet:
    s = FleetSpec.model_validate({"groups": [{"name": "t", "trace": trace}], **fleet})
    return Fleet.from_spec(s, seed)


def write(tmp_path: Path, text: str, name: str = "t.csv") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


# ------------------------------------------------------------- FLASH traces
@pytest.mark.skipif(not FLASH.is_dir(), reason="shared FLASH data not present")
@pytest.mark.parametrize("suffix", ["csv", "parquet"])
def test_a_trace_written_from_the_flash_data_becomes_a_fleet_group(
    tmp_path: Path, suffix: str
):
    # Prepare
    rows = flash_rows()
    path = write_trace(tmp_path / f"flash.{suffix}", rows)

    # Execute
    fleet = fleet_of({"file": str(path), "period_s": 86400})

    # Assert: one device per row, values as written
    assert fleet.size == len(rows) == 307
    np.testing.assert_allclose(fleet.speed, [r["speed_steps_per_s"] for r in rows])
    np.testing.assert_allclose(fleet.down_bps, [r["down_mbps"] * 1e6 for r in rows])
    down, up = fleet.comm_time([0], bytes_down=1_000_000, bytes_up=1_000_000)
    assert down[0] == pytest.approx(8e6 / (rows[0]["down_mbps"] * 1e6) + 0.05)
    # the sessions: device i online on [60000 + 50 i, +3600), every day
    on = fleet.online(60_000.0 + 25.0)
    assert on[0] and not on[1]
    assert fleet.online(86_400 + 60_000.0 + 75.0)[1]
    assert fleet.offline_time([0], 60_000.0)[0] == pytest.approx(63_600.0)


@pytest.mark.skipif(not FLASH.is_dir(), reason="shared FLASH data not present")
def test_flash_trace_speeds_follow_the_preset_tiers(tmp_path: Path):
    # Prepare
    path = write_trace(tmp_path / "flash.csv", flash_rows())

    # Execute
    speed = fleet_of(str(path)).speed

    # Assert: the reference phones' own rows have exactly the tier medians
    names = [r["device"] for r in flash_rows()]
    for phone, tier in zip(
        presets.FLASH_REFERENCE_PHONES, presets.phone_tiers(), strict=True
    ):
        assert speed[names.index(phone)] == pytest.approx(tier.median_steps_per_s)


# ---------------------------------------------------------------- semantics
def test_intervals_with_and_without_a_period(tmp_path: Path):
    # Prepare: a: 0-10, 20-30; b: always; c: 30-40 wrapping into 0-10
    text = HEADER + "a,1,10,5,0,0-10;20-30\nb,1,10,5,0,\nc,1,10,5,0,0-10;30-40\n"
    path = write(tmp_path, text)

    # Execute
    once = fleet_of(str(path))
    daily = fleet_of({"file": str(path), "period_s": 40})
    grid = np.arange(0.0, 90.0, 5.0)
    a_once = [bool(once.online(t)[0]) for t in grid]
    c_daily = [bool(daily.online(t)[2]) for t in grid]

    # Assert
    assert a_once == [t < 10 or 20 <= t < 30 for t in grid]
    assert c_daily == [(t % 40) < 10 or (t % 40) >= 30 for t in grid]
    assert once.online(1e6).tolist() == [False, True, False]
    assert np.isinf(once.online_time([0], 31.0)[0])  # never back without a period
    assert daily.online_time([0], 31.0)[0] == 40.0
    assert np.isinf(daily.offline_time([1], 5.0)[0])
    assert daily.offline_time([2], 35.0)[0] == 50.0  # on across the wrap


def test_without_an_availability_column_devices_are_always_on(tmp_path: Path):
    path = write(tmp_path, "speed_steps_per_s,down_mbps,up_mbps\n2,10,5\n3,10,5\n")
    fleet = fleet_of(str(path))
    assert fleet.online(12345.0).all() and fleet.latency_s.tolist() == [0.0, 0.0]


def test_group_availability_applies_when_the_trace_has_none(tmp_path: Path):
    path = write(tmp_path, "speed_steps_per_s,down_mbps,up_mbps\n" + "2,10,5\n" * 400)
    s = FleetSpec.model_validate(
        {
            "groups": [
                {
                    "name": "t",
                    "trace": str(path),
                    "availability": {
                        "kind": "on_off",
                        "mean_on_s": 60,
                        "mean_off_s": 60,
                    },
                }
            ]
        }
    )
    assert 0.4 < Fleet.from_spec(s, 0).online(1000.0).mean() < 0.6


def test_touching_intervals_merge(tmp_path: Path):
    path = write(tmp_path, HEADER + "a,1,10,5,0,0-10;10-20\n")
    assert load_trace(path).availability.of(0) == [(0.0, 20.0)]


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(0, 10**6), min_size=0, max_size=12, unique=True))
def test_format_and_parse_intervals_round_trip(points: list[int]):
    # Prepare: sorted distinct points paired into disjoint intervals
    pts = sorted(p / 8 for p in points)
    pairs = list(zip(pts[0::2], pts[1::2], strict=False))

    # Execute / Assert
    assert parse_intervals(format_intervals(pairs)) == pairs


# ------------------------------------------------------------------- errors
@pytest.mark.parametrize(
    "text, message",
    [
        ("", "empty file"),
        ("speed_steps_per_s,down_mbps\n1,2\n", "missing column 'up_mbps'"),
        (
            "speed_steps_per_s,down_mbps,up_mbps,down_mpbs\n1,2,3,4\n",
            "unknown column 'down_mpbs'",
        ),
        ("speed_steps_per_s,down_mbps,up_mbps\n", "no rows"),
        (
            "speed_steps_per_s,down_mbps,up_mbps\n1,2,3\n1,x,3\n",
            r"row 2 \(line 3\), column 'down_mbps': expected a positive number, "
            r"got 'x'",
        ),
        (
            "speed_steps_per_s,down_mbps,up_mbps\n1,2,3\n0,2,3\n",
            r"row 2 \(line 3\), column 'speed_steps_per_s'",
        ),
        (
            "speed_steps_per_s,down_mbps,up_mbps,latency_s\n1,2,3,-1\n",
            r"row 1 \(line 2\), column 'latency_s': expected a number >= 0",
        ),
        ("speed_steps_per_s,down_mbps,up_mbps\n1,2\n", r"row 1 \(line 2\): 2 fields"),
        (HEADER + "a,1,2,3,0,10-5\n", "must end after it starts"),
        (HEADER + "a,1,2,3,0,0-10;5-20\n", "must not overlap"),
        (HEADER + "a,1,2,3,0,0-10;abc\n", "column 'availability': expected intervals"),
        (HEADER + "a,1,2,3,0,0-nan\n", "column 'availability'"),
    ],
)
def test_errors_name_the_file_row_and_column(tmp_path: Path, text: str, message: str):
    path = write(tmp_path, text)
    with pytest.raises(TraceError, match=message) as exc:
        load_trace(path)
    assert str(exc.value).startswith(str(path))


def test_interval_past_the_period_is_an_error(tmp_path: Path):
    path = write(tmp_path, HEADER + "a,1,2,3,0,0-10\nb,1,2,3,0,80000-90000\n")
    with pytest.raises(TraceError, match=r"row 2 \(line 3\).*past period_s"):
        load_trace(path, period_s=86400)


def test_parquet_errors_name_the_row(tmp_path: Path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "t.parquet"
    pq.write_table(
        pa.table(
            {
                "speed_steps_per_s": [1.0, None],
                "down_mbps": [1.0, 2.0],
                "up_mbps": [1.0, 2.0],
            }
        ),
        path,
    )
    with pytest.raises(
        TraceError, match=r"t.parquet: row 2, column 'speed_steps_per_s'"
    ):
        load_trace(path)


def test_scenario_errors_for_trace_groups(tmp_path: Path):
    path = write(tmp_path, HEADER + "a,1,10,5,0,\nb,1,10,5,0,\nc,1,10,5,0,\n")
    base = "scenarios/quickstart.yaml"

    def error(group: str) -> str:
        with pytest.raises(ScenarioError) as exc:
            load_scenario(
                base, [f"fleet={{groups: [{group}]}}", "selector.clients_per_round=2"]
            )
        return str(exc.value)

    assert "no such trace file" in error("{name: t, trace: nowhere.csv}")
    assert "count is 5 but the trace" in error(f"{{name: t, trace: {path}, count: 5}}")
    assert "takes speed and network from its trace" in error(
        f"{{name: t, trace: {path}, speed: {{steps_per_s: 1}}}}"
    )
    assert "drop the group's availability" in error(
        f"{{name: t, trace: {path}, availability: {{kind: on_off}}}}"
    )


def test_relative_paths_are_found_next_to_the_scenario(tmp_path: Path, monkeypatch):
    # Prepare: the trace next to a (pretend) scenario file, run from elsewhere
    write(tmp_path, HEADER + "a,1,10,5,0,\n", "devices.csv")
    monkeypatch.chdir(Path(__file__).parent)
    raw = {"groups": [{"name": "t", "trace": "devices.csv"}]}

    # Execute
    s = FleetSpec.model_validate(raw, context={"base_dir": tmp_path})

    # Assert: stored resolved, so a run directory's scenario.yaml finds it too
    assert s.groups[0].trace.file == str((tmp_path / "devices.csv").resolve())
    assert s.groups[0].count == 1


def test_the_shipped_trace_scenario_runs(tmp_path: Path, monkeypatch):
    # Prepare: shipped scenarios give paths from the repository root
    monkeypatch.chdir(SCENARIOS.parent)
    sc = load_scenario(SCENARIOS / "fleets" / "phones-trace.yaml", ["rounds=2"])
    from fedsim.runtime import run_scenario

    # Execute
    res = run_scenario(sc, workers=0)
    rows, clients = res.rows, res.clients

    # Assert: at midnight few phones are online, so few are chosen (measured:
    # 1 of the 5 asked for, in both rounds)
    assert sc.fleet.size == 24
    assert all(1 <= r["n_selected"] <= 2 < sc.selector.clients_per_round for r in rows)
    assert len(clients) == sum(r["n_selected"] for r in rows)
    assert [r["round"] for r in rows] == [0, 1]
    assert all(c["device_group"] == "measured-phones" for c in clients)
    assert all(math.isfinite(r["sim_time"]) for r in rows)


@pytest.mark.parametrize(
    "trace",
    [
        {"file": "a\x00b.csv"},
        {"file": "x" * 5000 + ".csv"},
        {"file": "/dev/null"},
        {"file": ".", "period_s": 10},
        {"file": "t.csv", "period_s": "daily"},
        {"file": 5},
        7,
    ],
)
def test_odd_trace_fields_give_validation_errors_only(tmp_path: Path, trace: object):
    from pydantic import ValidationError

    write(tmp_path, HEADER + "a,1,10,5,0,\n")
    with pytest.raises(ValidationError):
        FleetSpec.model_validate(
            {"groups": [{"name": "t", "trace": trace}]}, context={"base_dir": tmp_path}
        )


def test_docstring_examples_run():
    import doctest

    import fedsim.presets
    import fedsim.traces

    for module in (fedsim.traces, fedsim.presets):
        assert doctest.testmod(module).failed == 0, module.__name__
