"""Weight decay, gradient clipping (client.clip_norm) and the step schedule
(client.lr_steps) of the local solvers, each checked on one step by hand."""

from __future__ import annotations

import pytest
import torch

from fedsim.batched import train_batched, why_not_batched
from fedsim.data import build_data
from fedsim.runtime import run_setup
from fedsim.scenario import load_scenario
from fedsim.solvers import clip_gradient, make_solver, step_factor
from fedsim.spec import ClientSpec
from fedsim.workers import Task, Worker

from .conftest import SCENARIOS

QUICK = SCENARIOS / "quickstart.yaml"
QUAD = SCENARIOS / "quadratic-objective-inconsistency.yaml"
KINDS = {
    "sgd": {},
    "momentum": {"solver": "momentum"},
    "prox": {"solver": "prox", "mu": 0.5},
    "decay": {"solver": "decay", "step_decay": 0.5},
}


def one_step(spec: ClientSpec, x: list[float], g: list[float]) -> list[float]:
    """x after the first step of ``spec``'s solver from x (= x0) with gradient g."""
    solver = make_solver(spec)
    theta = torch.tensor(x, dtype=torch.float64)
    st = solver.begin(theta.clone())
    solver.step(theta, torch.tensor(g, dtype=torch.float64), st)
    return theta.tolist()


@pytest.mark.parametrize("kind", list(KINDS))
def test_weight_decay_one_step_every_solver(kind):
    # Prepare: x = [1, -2], g = [0.5, 0.5], lr 0.1, wd 0.2; on the first step
    # momentum's buffer is the direction, prox's x - x0 is 0, decay's factor 1
    spec = ClientSpec(lr=0.1, weight_decay=0.2, **KINDS[kind])
    # Execute
    x = one_step(spec, [1.0, -2.0], [0.5, 0.5])
    # Assert: x - lr (g + wd x) = [1 - 0.1 (0.5 + 0.2), -2 - 0.1 (0.5 - 0.4)]
    assert x == pytest.approx([0.93, -2.01], abs=1e-15)


@pytest.mark.parametrize("kind", list(KINDS))
def test_clip_norm_one_step_every_solver(kind):
    # Prepare: g = [30, 40] (norm 50) clipped to 10: g' = [6, 8] (the 1e-6 of
    # clip_grad_norm_ moves it by 2e-7 relative); lr 0.1, x = 0
    spec = ClientSpec(lr=0.1, clip_norm=10.0, **KINDS[kind])
    # Execute
    x = one_step(spec, [0.0, 0.0], [30.0, 40.0])
    # Assert
    assert x == pytest.approx([-0.6, -0.8], rel=1e-6)


def test_clip_is_applied_before_weight_decay_and_only_above_the_norm():
    # x = [1, 0], g = [3, 4]: clip 1 gives [0.6, 0.8], then + wd x = [0.7, 0.8]
    spec = ClientSpec(lr=1.0, clip_norm=1.0, weight_decay=0.1)
    assert one_step(spec, [1.0, 0.0], [3.0, 4.0]) == pytest.approx(
        [0.3, -0.8], rel=1e-6
    )
    g = torch.tensor([3.0, 4.0])
    assert clip_gradient(g, 5.1) is g  # within the bound: untouched
    assert torch.equal(clip_gradient(g, 5.1), torch.tensor([3.0, 4.0]))


def test_clip_agrees_with_torch_clip_grad_norm():
    p = torch.nn.Parameter(torch.zeros(3))
    p.grad = torch.tensor([1.0, -7.0, 2.5])
    ours = clip_gradient(p.grad.clone(), 2.0)
    torch.nn.utils.clip_grad_norm_([p], max_norm=2.0)
    torch.testing.assert_close(ours, p.grad, rtol=1e-7, atol=0)


def test_step_schedule_values():
    # lr_steps [0.5, 0.75] over 200 rounds (FedNova's CIFAR protocol): x0.1
    # from round 100, x0.01 from round 150
    fr = [0.5, 0.75]
    got = [step_factor(fr, t, 200) for t in (0, 99, 100, 149, 150, 199)]
    assert got == pytest.approx([1.0, 1.0, 0.1, 0.1, 0.01, 0.01], rel=1e-15)
    assert step_factor([], 7, 10) == 1.0


def test_worker_lr_follows_the_steps_and_the_decay():
    # Prepare: lr 0.1, rounds 4, steps at 1/2: rounds 2 and 3 use 0.01; with
    # lr_decay 0.5 too, round 3: 0.1 * 0.5^3 * 0.1 = 0.00125
    over = ["rounds=4", "client.lr_steps=[0.5]"]
    sc = load_scenario(QUAD, over)
    w = Worker(run_setup(sc).worker, build_data(sc.data, sc.num_clients, sc.seed))
    assert [w.solver_for(t).lr for t in range(4)] == pytest.approx(
        [0.1, 0.1, 0.01, 0.01], rel=1e-15
    )
    sc = load_scenario(QUAD, [*over, "client.lr_decay=0.5"])
    w = Worker(run_setup(sc).worker, build_data(sc.data, sc.num_clients, sc.seed))
    assert w.solver_for(3).lr == pytest.approx(0.00125, rel=1e-15)


def test_defaults_keep_the_solver_unchanged():
    spec = ClientSpec()
    assert spec.clip_norm is None and spec.lr_steps == []
    assert make_solver(spec).clip_norm is None


def test_the_step_schedule_is_batched_and_equals_the_sequential_path():
    # Prepare: float64, round 3 of 4 with a step at 1/2 (lr x0.1)
    sc = load_scenario(
        QUICK,
        [
            "rounds=4",
            "client.lr_steps=[0.5]",
            "model={name: logreg, dtype: float64}",
            "resources.vectorize=true",
        ],
    )
    w = Worker(
        run_setup(sc).worker, build_data(sc.data, sc.num_clients, sc.seed), threads=1
    )
    assert w.batched
    x = torch.zeros_like(w.theta)
    tasks = [Task(0, 3, 3), Task(4, 3, 1), Task(9, 3, 5)]
    # Execute
    seq = w.train_sequential({"x": x}, tasks, {})
    bat = train_batched(w, {"x": x}, tasks, {})
    # Assert
    for a, b in zip(seq, bat, strict=True):
        torch.testing.assert_close(b.delta, a.delta, rtol=1e-9, atol=1e-10)
    assert w.solver_for(3).lr == pytest.approx(0.1 * sc.client.lr, rel=1e-15)


def test_a_clipped_run_is_stacked():
    # each client's gradient is clipped by its own norm inside the stack
    # (issue 40; tests/test_batched_clip.py checks it equals one at a time)
    sc = load_scenario(QUICK, ["client.clip_norm=10", "resources.vectorize=true"])
    w = Worker(
        run_setup(sc).worker, build_data(sc.data, sc.num_clients, sc.seed), threads=1
    )
    assert w.batched
    assert why_not_batched(w) is None
