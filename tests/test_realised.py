"""Declared against realised (fedsim.realised): summary.json's per-group
block recomputed from the run's own rows and fleet, no false alarm on an
ordinary run, and warnings where a scenario does not do what it says."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from fedsim.fleet import Fleet
from fedsim.runtime import run_scenario
from fedsim.scenario import load_scenario

from .conftest import SCENARIOS, fedsim_here

QUICK = SCENARIOS / "quickstart.yaml"
Z = 3.2905267314919255  # the 99.9% normal quantile


def test_the_block_is_what_the_run_did():
    # Execute: quickstart, 10 rounds (stragglers in two groups, on/off phones)
    sc = load_scenario(QUICK, ["rounds=10", "eval.every_rounds=5"])
    res = run_scenario(sc)
    block = res.summary()["fleet_realised"]

    # Assert: recomputed from the fleet and clients.parquet's rows
    fleet = Fleet.from_spec(sc.fleet, sc.seed)
    starts = sorted({c["t_start"] for c in res.clients})
    assert len(starts) == 10
    for gi, g in enumerate(block["groups"]):
        mine = [c for c in res.clients if c["device_group"] == g["group"]]
        devices = fleet.group == gi
        assert g["devices"] == devices.sum() and g["selected"] == len(mine)
        speed = g["speed_steps_per_s"]
        want = [np.quantile(fleet.speed[devices], q) for q in (0.1, 0.5, 0.9)]
        assert speed["realised"] == pytest.approx(want, rel=1e-15)
        spec = sc.fleet.groups[gi].speed
        z = 1.2815515655446004  # the normal 90% quantile
        assert speed["declared"] == pytest.approx(
            [spec.median * math.exp(spec.sigma * s) for s in (-z, 0.0, z)]
        )
        online = np.mean([fleet.online(t)[devices].mean() for t in starts])
        assert g["online_at_starts"]["realised"] == pytest.approx(online)
        rate = g["straggler_rate"]
        p = sc.fleet.stragglers_of(gi).p
        assert rate["realised"] == sum(c["slowdown"] > 1 for c in mine) / len(mine)
        half = Z * math.sqrt(p * (1 - p) / len(mine)) + 0.5 / len(mine)
        assert rate["interval"] == pytest.approx([max(0, p - half), p + half])
    on_off = block["groups"][0]["online_at_starts"]
    assert on_off["declared"] == 3600 / (3600 + 1200)
    assert [g["online_at_starts"]["declared"] for g in block["groups"][1:]] == [1, 1]
    # an ordinary run is within every sampling interval: no warning
    assert block["warnings"] == []
    # and it had stragglers to count
    assert block["groups"][0]["straggler_rate"]["realised"] > 0


def test_warnings_name_a_deadline_and_a_group_rounds_never_see(tmp_path):
    # Prepare: 200 mid-range phones online mostly around noon (daily, from
    # 0.1% at midnight to 20%) while every round runs just after midnight,
    # and a 3 s deadline that cuts most slow phones off
    over = [
        "rounds=6",
        "eval.every_rounds=6",
        "fleet.groups[1].count=200",
        "fleet.groups[1].availability={kind: daily, min_online: 0.001, "
        "max_online: 0.2, peak_hour: 12, mean_on_s: 60}",
        "round={policy: fixed_epochs, epochs: 1, deadline_s: 2}",
    ]
    args = ["run", str(QUICK), "--workers", "0", "--out", str(tmp_path / "r")]
    for o in over:
        args += ["--set", o]

    # Execute
    res = fedsim_here(*args, check=True)

    # Assert: printed, stored in summary.json and in report.md
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    warnings = summary["fleet_realised"]["warnings"]
    mid = next(g for g in summary["fleet_realised"]["groups"] if g["devices"] == 200)
    assert mid["online_at_starts"]["declared"] == pytest.approx(0.1005)
    assert mid["online_at_starts"]["realised"] < 0.03
    assert any(w.startswith("group mid-range-phones was online") for w in warnings)
    low = summary["fleet_realised"]["groups"][0]
    assert low["dropped"]["late"] >= 0.5
    assert any("low-end-phones" in w and "past the deadline" in w for w in warnings)
    for w in warnings:
        assert w in " ".join(res.stderr.split())  # the CLI says each one
    report = (tmp_path / "r" / "report.md").read_text()
    assert "## Declared against realised" in report
    assert f"> **Warning**: {warnings[0]}." in report
