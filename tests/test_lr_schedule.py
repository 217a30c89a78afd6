"""Learning-rate decay across rounds: lr_t = max(lr * lr_decay^t, lr_min)."""

from __future__ import annotations

import pytest

from fedsim.data import build_data
from fedsim.runtime import run_scenario, run_setup
from fedsim.scenario import load_scenario
from fedsim.workers import Worker

from .conftest import SCENARIOS

QUAD = SCENARIOS / "quadratic-objective-inconsistency.yaml"


def test_solver_lr_follows_the_schedule():
    sc = load_scenario(QUAD, ["client.lr_decay=0.5", "client.lr_min=0.01"])
    w = Worker(run_setup(sc).worker, build_data(sc.data, sc.num_clients, sc.seed))
    assert [w.solver_for(t).lr for t in (0, 1, 2, 5)] == [0.1, 0.05, 0.025, 0.01]


def test_decayed_rounds_match_the_closed_form():
    # FedAvg on F_i = (x - e_i)^2 / 2: client i's round-t step scales x by
    # K_i = 1 - (1 - lr_t)^tau_i, so round 2 uses lr 0.05 (lr_decay 0.5).
    sc = load_scenario(
        QUAD, ["algorithm={name: fedavg}", "rounds=2", "client.lr_decay=0.5"]
    )
    sim = run_scenario(sc, workers=0)
    p, e, tau = (0.5, 0.3, 0.2), (0.0, 1.0, 4.0), (1, 5, 10)
    x = 0.0
    for lr in (0.1, 0.05):
        x += sum(
            pi * (1 - (1 - lr) ** ti) * (ei - x)
            for pi, ei, ti in zip(p, e, tau, strict=True)
        )
    assert float(sim.final_params[0]) == pytest.approx(x, abs=1e-12)
