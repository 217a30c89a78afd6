"""The executor contract: the same tasks give the same updates whichever
executor trains them (in-process, Ray with one or two actors), in task
order, with tasks from several versions in one call and per-client state
travelling with the task; the batched worker (fedsim.batched) agrees within
float tolerance."""

from __future__ import annotations

import pytest
import torch

from fedsim.data import build_data
from fedsim.executors import InProcessExecutor
from fedsim.remote.executor import RayExecutor
from fedsim.runtime import make_executor, run_setup
from fedsim.scenario import load_scenario
from fedsim.server import Server
from fedsim.workers import Task

from .conftest import SCENARIOS

QUICK = SCENARIOS / "quickstart.yaml"

# Two versions in one call (asynchronous batches), unsorted, uneven steps.
TASKS = [
    Task(client=7, round=2, tau=9, version=1),
    Task(client=3, round=0, tau=4, version=0),
    Task(client=11, round=1, tau=1, version=1),
    Task(client=0, round=0, tau=6, version=0),
]


def setup(*overrides: str):
    sc = load_scenario(QUICK, list(overrides))
    data = build_data(sc.data, sc.num_clients, sc.seed)
    server = Server(run_setup(sc).server, data)
    x0 = server.payload()
    x1 = {k: v + 0.01 for k, v in x0.items()}
    states = server.client_states([t.client for t in TASKS])
    if sc.algorithm.stateful:  # clients that have trained before: nonzero state
        states[7] = {"c": torch.full_like(x0["x"], 0.003)}
        states[3] = {"c": torch.full_like(x0["x"], -0.002)}
    return sc, data, {0: x0, 1: x1}, states


def check_same(a, b, exact=True):
    assert [(u.client, u.tau) for u in a] == [(t.client, t.tau) for t in TASKS]
    for ua, ub in zip(a, b, strict=True):
        assert (ua.client, ua.tau, ua.weight) == (ub.client, ub.tau, ub.weight)
        if exact:
            assert torch.equal(ua.delta, ub.delta)
            assert ua.train_loss == ub.train_loss
            for k in ua.extras:
                assert torch.equal(ua.extras[k], ub.extras[k])
        else:
            torch.testing.assert_close(ub.delta, ua.delta, rtol=1e-4, atol=1e-6)
            for k in ua.extras:  # e.g. SCAFFOLD's dc = delta / (lr K) terms
                torch.testing.assert_close(
                    ub.extras[k], ua.extras[k], rtol=1e-4, atol=1e-5
                )


@pytest.mark.parametrize("algorithm", ["fedavg", "scaffold"])
def test_in_process_results_are_per_task_and_repeat(algorithm):
    sc, data, payloads, states = setup(f"algorithm={{name: {algorithm}}}")
    ex = make_executor(run_setup(sc).executor, data, workers=0)
    assert isinstance(ex, InProcessExecutor)
    first = ex.train(TASKS, payloads, states)
    # one task at a time gives the same update: nothing leaks between tasks
    alone = [ex.train([t], payloads, states)[0] for t in TASKS]
    check_same(first, alone)
    # the version's payload is the one trained from
    assert not torch.equal(first[0].delta, ex.train(
        [Task(7, 2, 9, version=0)], payloads, states)[0].delta)  # fmt: skip


@pytest.mark.parametrize("algorithm", ["fednova", "scaffold"])
def test_the_batched_worker_matches_within_float_tolerance(algorithm):
    sc, data, payloads, states = setup(f"algorithm={{name: {algorithm}}}")
    plain = make_executor(run_setup(sc).executor, data, workers=0).train(
        TASKS, payloads, states
    )
    scb, datab, _, _ = setup(
        f"algorithm={{name: {algorithm}}}", "resources.vectorize=true"
    )
    batched = make_executor(run_setup(scb).executor, datab, workers=0)
    assert batched.worker.batched
    check_same(plain, batched.train(TASKS, payloads, states), exact=False)


@pytest.mark.ray
@pytest.mark.parametrize("algorithm", ["fedavg", "scaffold"])
def test_ray_executors_equal_the_in_process_one(ray_session, algorithm):
    sc, data, payloads, states = setup(f"algorithm={{name: {algorithm}}}")
    local = make_executor(run_setup(sc).executor, data, workers=0).train(
        TASKS, payloads, states
    )
    for n in (1, 2):
        ex = make_executor(run_setup(sc).executor, data, workers=n)
        assert isinstance(ex, RayExecutor) and len(ex.pids()) == n
        try:
            check_same(local, ex.train(TASKS, payloads, states))
            ex.forget(0)  # a forgotten version is put in the store again
            check_same(local, ex.train(TASKS, payloads, states))
        finally:
            ex.shutdown()
