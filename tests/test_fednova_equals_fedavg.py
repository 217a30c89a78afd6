"""Issue 2, must show 2: FedNova equals FedAvg when every tau_i is equal
(vanilla SGD), through the whole simulator on real training."""

from __future__ import annotations

import pytest
import torch

from fedsim.runtime import run_scenario
from fedsim.scenario import load_scenario

from .conftest import SCENARIOS

EQUAL_TAU = [
    "rounds=5",
    # every device identical, no stragglers, always online: tau_i = 20 for all
    "fleet.groups=[{name: same, count: 30, speed: {dist: fixed, steps_per_s: 2.0}}]",
    "round={policy: fixed_window, window_s: 10.5, max_steps: 20}",
]


def final(algorithm: str, *extra: str) -> tuple[torch.Tensor, list[dict]]:
    sc = load_scenario(
        SCENARIOS / "quickstart.yaml", [*EQUAL_TAU, f"algorithm={algorithm}", *extra]
    )
    sim = run_scenario(sc, workers=0)
    rows, clients = sim.rows, sim.clients
    assert {c["tau"] for c in clients} == {20}
    return sim.final_params, rows


def test_fednova_equals_fedavg_with_equal_steps():
    x_avg, rows_avg = final("{name: fedavg}")
    x_nova, rows_nova = final("{name: fednova}")
    torch.testing.assert_close(x_nova, x_avg, rtol=1e-5, atol=1e-6)
    for a, b in zip(rows_avg, rows_nova, strict=True):
        assert b["test_accuracy"] == a["test_accuracy"]
        assert a["chi2_pw"] == pytest.approx(0.0, abs=1e-12)
        assert b["chi2_pw"] == pytest.approx(0.0, abs=1e-12)
        assert a["tau_eff"] == pytest.approx(20.0) == b["tau_eff"]


def test_they_differ_when_steps_differ():
    hetero = ["fleet.groups[0].speed={dist: fixed, steps_per_s: 1.0}"]
    sc_args = [
        *EQUAL_TAU[:1],
        "round={policy: fixed_window, window_s: 10.5, max_steps: 20}",
    ]
    sc = load_scenario(
        SCENARIOS / "quickstart.yaml",
        [*sc_args, *hetero, "algorithm={name: fedavg}"],
    )
    res = run_scenario(sc, workers=0)
    rows, clients = res.rows, res.clients
    assert len({c["tau"] for c in clients}) > 1
    assert any(r["chi2_pw"] > 0 for r in rows)
