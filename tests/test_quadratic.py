"""The quadratic reference numbers of docs/algorithms.md section 6.4, asserted to
1e-9 through the real code path: scenario -> fleet -> SimPy clock -> worker
(real local gradient steps) -> algorithm -> server."""

from __future__ import annotations

import pytest

from fedsim.runtime import run_scenario
from fedsim.scenario import load_scenario

from .conftest import SCENARIOS

QUAD = SCENARIOS / "quadratic-objective-inconsistency.yaml"
FEDAVG = "algorithm={name: fedavg}"


def final_x(*overrides: str) -> float:
    sc = load_scenario(QUAD, list(overrides))
    sim = run_scenario(sc, workers=0)
    rows, _ = sim.rows, sim.clients
    assert [r["tau_min"] for r in rows][:1] == [1.0]
    assert sim.final_params is not None
    return float(sim.final_params[0])


def fixed_point(*overrides: str) -> float:
    """Fixed point of the real one-round server map x -> a + b x (it is affine
    on this problem): run one round from x0 = 0 and from x0 = 1."""
    f0 = final_x("rounds=1", "data.x0=0.0", *overrides)
    f1 = final_x("rounds=1", "data.x0=1.0", *overrides)
    a, b = f0, f1 - f0
    return a / (1.0 - b)


def test_scenario_gives_heterogeneous_steps():
    sc = load_scenario(QUAD, ["rounds=1"])
    res = run_scenario(sc, workers=0)
    _, clients = res.rows, res.clients
    assert [c["tau"] for c in clients] == [1, 5, 10]


@pytest.mark.parametrize(
    ("rounds", "expected"), [(1, 0.64391024792), (10, 2.066907156956)]
)
def test_fedavg_trajectory(rounds, expected):
    assert final_x(FEDAVG, f"rounds={rounds}") == pytest.approx(expected, abs=1e-9)


@pytest.mark.parametrize(
    ("rounds", "expected"), [(1, 0.306705299168), (10, 0.863616008462)]
)
def test_fednova_trajectory_tau_eff_steps(rounds, expected):
    x = final_x("algorithm.tau_eff=steps", f"rounds={rounds}")
    assert x == pytest.approx(expected, abs=1e-9)


def test_long_runs_reach_the_fixed_points():
    assert final_x(FEDAVG, "rounds=120") == pytest.approx(2.124293870627, abs=1e-9)
    assert final_x("rounds=120") == pytest.approx(0.875330176644, abs=1e-9)


@pytest.mark.parametrize(
    ("lr", "mu", "fedavg", "fednova"),
    [
        (0.1, 0.0, 2.124293870627, 0.875330176644),
        (0.1, 0.1, 2.100871772382, 0.877452222963),
        (0.1, 1.0, 1.907031017474, 0.899407417964),
        (0.01, 0.0, 2.348838049733, 1.074807553839),
        (0.01, 0.1, 2.346231980927, 1.074829331758),
        (0.0001, 0.0, 2.374737508441, 1.099745030750),
    ],
)
def test_fixed_point_table(lr, mu, fedavg, fednova):
    lr_set = f"client.lr={lr}"
    if mu:
        avg = [f"algorithm={{name: fedprox, mu: {mu}}}", lr_set]
        nova = ["client.solver=prox", f"client.mu={mu}", lr_set]
    else:
        avg, nova = [FEDAVG, lr_set], [lr_set]
    assert fixed_point(*avg) == pytest.approx(fedavg, abs=1e-9)
    # FedNova's fixed point does not depend on tau_eff (docs/algorithms.md 6.3)
    for tau_eff in ("fedavg", "steps"):
        x = fixed_point(*nova, f"algorithm.tau_eff={tau_eff}")
        assert x == pytest.approx(fednova, abs=1e-9)


def test_fednova_prox_same_fixed_point_with_long_runs():
    common = ["client.solver=prox", "client.mu=0.1", "rounds=150"]
    for tau_eff in ("fedavg", "steps"):
        x = final_x(*common, f"algorithm.tau_eff={tau_eff}")
        assert x == pytest.approx(0.877452222963, abs=1e-9)


def test_momentum_example():
    mom = ["client.solver=momentum", "client.momentum=0.9", "client.lr=0.01"]
    assert fixed_point(FEDAVG, *mom) == pytest.approx(2.863904210833, abs=1e-9)
    assert fixed_point(*mom) == pytest.approx(1.050620943090, abs=1e-9)


def test_fedavg_and_fednova_fixed_points_bracket_the_optimum():
    # x* = 1.1: FedAvg overshoots toward the fast client, FedNova's bias is O(lr)
    biases = [abs(fixed_point(f"client.lr={lr}") - 1.1) for lr in (0.1, 0.01, 0.001)]
    assert biases[0] > biases[1] > biases[2]
    assert biases[1] / biases[2] == pytest.approx(10, rel=0.05)
