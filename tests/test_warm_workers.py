"""Warm actors (``fedsim.remote.actors.warm_workers``): a run takes over the
idle Ray actors of the run before it instead of starting new processes, and
its results are those of new actors, also when Ray restarts a taken-over
actor with its first run's arguments."""

from __future__ import annotations

import os
import signal
from typing import Any

import pytest
import torch

from fedsim.data import build_data
from fedsim.executors import InProcessExecutor
from fedsim.remote import actors
from fedsim.remote.actors import current_pool, release_parked
from fedsim.remote.executor import RayExecutor
from fedsim.runtime import run_setup
from fedsim.scenario import load_scenario
from fedsim.server import Server
from fedsim.workers import Task

from .conftest import SCENARIOS, WAIT_S

QUICK = SCENARIOS / "quickstart.yaml"
TASKS = [Task(client=4, round=1, tau=7), Task(client=9, round=1, tau=3)]

pytestmark = pytest.mark.ray


def _setup(*overrides: str) -> tuple[Any, Any, dict, dict]:
    """A scenario, its data, a payload and the clients' states."""
    sc = load_scenario(QUICK, list(overrides))
    data = build_data(sc.data, sc.num_clients, sc.seed)
    server = Server(run_setup(sc).server, data)
    return sc, data, {0: server.payload()}, server.client_states([4, 9])


def _equal(a: list, b: list) -> None:
    for ua, ub in zip(a, b, strict=True):
        assert (ua.client, ua.tau) == (ub.client, ub.tau)
        assert torch.equal(ua.delta, ub.delta)
        assert ua.train_loss == ub.train_loss


# Two scenarios whose updates differ (another seed draws other data and
# minibatches, another algorithm another rule): an actor that kept anything
# of the first would not give the second's in-process updates.
FIRST = ("seed=5", "algorithm={name: fedprox, mu: 0.5}")
SECOND = ("seed=11",)


def test_a_run_takes_over_the_last_runs_actors_with_new_actors_results(
    ray_session,
):
    release_parked()
    sc1, data1, pay1, st1 = _setup(*FIRST)
    first = RayExecutor(run_setup(sc1).executor, data1, 2)
    pids = sorted(first.pids())
    first.train(TASKS, pay1, st1)
    first.shutdown()  # parked: the session's fixture keeps actors warm

    sc2, data2, pay2, st2 = _setup(*SECOND)
    second = RayExecutor(run_setup(sc2).executor, data2, 2)
    try:
        assert sorted(second.pids()) == pids  # the same processes
        want = InProcessExecutor(run_setup(sc2).worker, data2).train(TASKS, pay2, st2)
        _equal(second.train(TASKS, pay2, st2), want)
        assert second.tasks_retried == 0
    finally:
        second.shutdown()


def test_a_warm_actor_restarted_with_its_first_runs_arguments_is_set_up_again(
    ray_session,
):
    release_parked()
    sc1, data1, _, _ = _setup(*FIRST)
    first = RayExecutor(run_setup(sc1).executor, data1, 1)
    first.shutdown()
    sc2, data2, pay2, st2 = _setup(*SECOND)
    ex = RayExecutor(run_setup(sc2).executor, data2, 1)
    try:
        (pid,) = ex.pids()
        # Ray restarts the actor with the arguments it was created with
        # (FIRST's): its first call must be refused and resent after set-up.
        os.kill(pid, signal.SIGKILL)
        got = ex.train(TASKS, pay2, st2)
        assert ex.pids() != [pid]
        _equal(
            got, InProcessExecutor(run_setup(sc2).worker, data2).train(TASKS, pay2, st2)
        )
        assert ex.tasks_retried == len(TASKS)
    finally:
        ex.shutdown()


def test_another_shape_kills_the_parked_actors_and_starts_its_own(ray_session):
    release_parked()
    sc1, data1, _, _ = _setup()
    first = RayExecutor(run_setup(sc1).executor, data1, 2)
    old = set(first.pids())
    first.shutdown()
    # half a CPU per worker: another shape; the 2 parked 1-CPU actors hold
    # the session's 2 CPUs, so unless they go these could never be placed
    sc2, data2, pay2, st2 = _setup("resources.cpus_per_worker=0.5")
    second = RayExecutor(run_setup(sc2).executor, data2, 2)
    try:
        assert not old & set(second.pids())
        _equal(
            second.train(TASKS, pay2, st2),
            InProcessExecutor(run_setup(sc2).worker, data2).train(TASKS, pay2, st2),
        )
    finally:
        second.shutdown()
    release_parked()


def test_outside_warm_workers_a_runs_actors_are_killed(ray_session):
    import time

    import ray

    release_parked()
    pool = current_pool()
    token = actors._CURRENT.set(None)  # outside the session's warm block
    try:
        sc, data, _, _ = _setup()
        ex = RayExecutor(run_setup(sc).executor, data, 1)
        actor = ex.actors[0]
        ex.shutdown()
    finally:
        actors._CURRENT.reset(token)
    assert pool.idle() == 0
    # ray.kill is asynchronous: a call sent at once may still be answered
    deadline = time.monotonic() + WAIT_S
    with pytest.raises(ray.exceptions.RayActorError):
        while time.monotonic() < deadline:
            ray.get(actor.pid.remote(), timeout=WAIT_S)
            time.sleep(0.2)


def test_a_server_actor_is_taken_over_and_set_up_for_the_new_run(ray_session):
    from fedsim.remote.server_actor import RemoteServer

    release_parked()
    actor = ["resources.server.home=actor", "resources.server.cpus=0"]
    sc1, data1, _, _ = _setup(*actor, "model={name: mlp, hidden: [16]}")
    s1 = RemoteServer(run_setup(sc1).server, sc1.resources, data1, None, 1)
    handle = s1.actor
    s1.shutdown()
    sc2, data2, _, _ = _setup(*actor, "seed=3")
    s2 = RemoteServer(run_setup(sc2).server, sc2.resources, data2, None, 1)
    try:
        assert s2.actor._actor_id == handle._actor_id  # the same actor
        here = Server(run_setup(sc2).server, data2)
        assert s2.num_params == here.num_params != s1.num_params
        assert torch.equal(s2.params(), here.params())
    finally:
        s2.shutdown()
    # a server with cpus: 0 holds nothing: a run that needs only resources
    # leaves it parked; a release of everything kills it
    release_parked(everything=False)
    assert current_pool().idle() == 1
    release_parked()
    assert current_pool().idle() == 0


def test_a_server_actor_that_needs_no_placement_is_not_timed_out_while_it_starts(
    ray_session,
):
    """placement_timeout_s bounds placement, not a process's start: a server
    actor with cpus 0 is placed at once, and its start (Python, torch, the
    data: over 60 s on a loaded machine) must not fail the run as a
    placement that did not happen."""
    from fedsim.remote.server_actor import RemoteServer

    # Prepare: no parked actor to take over (a cold start), and a limit far
    # shorter than any process's start
    release_parked()
    sc, data, _, _ = _setup(
        "resources.server.home=actor",
        "resources.server.cpus=0",
        "resources.placement_timeout_s=0.001",
    )
    # Execute
    server = RemoteServer(run_setup(sc).server, sc.resources, data, None, 1)
    # Assert: started, and it is the in-process server's model
    try:
        assert server.num_params == Server(run_setup(sc).server, data).num_params
    finally:
        server.shutdown()
        release_parked()
