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


def test_the_dropout_rate_counts_the_updates_whose_work_started():
    from fedsim.fleet import FleetSpec
    from fedsim.realised import realised_fleet

    # Prepare: seven selected updates of one group; three had no whole step
    # in the window and one no data, so their work never started (a dropout
    # could not happen to them): one dropout among the three that started
    spec = FleetSpec.model_validate({"groups": [{
        "name": "g", "count": 7, "speed": {"dist": "fixed", "steps_per_s": 1.0},
        "stragglers": {"p": 0.0, "dropout_p": 0.25},
    }]})  # fmt: skip
    fleet = Fleet.from_spec(spec, seed=0)
    reasons = ["", "dropout", "late", "no_time", "no_time", "no_time", "no_data"]
    clients = [
        {"device_group": "g", "slowdown": 1.0, "drop_reason": why, "t_start": 0.0}
        for why in reasons
    ]

    # Execute
    block = realised_fleet(fleet, spec, np.array([0.0]), clients, False)

    # Assert: 1 of 3, not 1 of the 7 selected
    (g,) = block["groups"]
    rate = g["dropout_rate"]
    assert (rate["realised"], rate["n"], rate["declared"]) == (1 / 3, 3, 0.25)
    half = Z * math.sqrt(0.25 * 0.75 / 3) + 0.5 / 3
    assert rate["interval"] == pytest.approx([0.0, min(1.0, 0.25 + half)])
    assert g["dropped"]["no_time"] == 3 / 7 and g["selected"] == 7


def test_a_flops_groups_declared_quantiles_are_in_steps_per_s():
    # Prepare: quickstart's low-end phones declared in FLOP/s (lognormal,
    # median 1.2 MFLOP/s, sigma 0.5) on the mlp 60 -> 20 -> 10 at batch 20,
    # 120,000 FLOPs a step: a median of 10 steps/s
    speed = "{dist: lognormal, median_flops_per_s: 1.2e6, sigma: 0.5}"
    over = ["rounds=2", "eval.every_rounds=2", "model={name: mlp, hidden: [20]}",
            "fleet.groups[0].count=400", f"fleet.groups[0].speed={speed}"]  # fmt: skip
    sc = load_scenario(QUICK, over)

    # Execute
    res = run_scenario(sc)

    # Assert: the declared quantiles converted with the model's count, so
    # the 400 devices drawn sit on them (no speed warning)
    block = res.summary()["fleet_realised"]
    low = block["groups"][0]["speed_steps_per_s"]
    z = 1.2815515655446004  # the normal 90% quantile
    want = [10.0 * math.exp(0.5 * s) for s in (-z, 0.0, z)]
    assert low["declared"] == pytest.approx(want, rel=1e-12)
    assert low["realised"] == pytest.approx(want, rel=0.15)
    assert not [w for w in block["warnings"] if "speed quantile" in w]
