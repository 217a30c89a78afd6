"""The server in its two homes (``resources.server.home``, issue 28): in the
driver or as a Ray actor, with bit-identical results, checkpoints in the run
directory, a lost actor stopping the run at its last checkpoint, and
summary.json saying where the server ran.

The ``cluster`` tests use the session fixture of the test-infrastructure
branch (tests/conftest.py ``cluster``: a head without CPUs running the job
drivers, nodes ``a`` (2 CPUs, 2 fake GPUs), ``b`` and ``c``, each naming
itself with a custom resource ``node_a``...), and submit jobs through
cluster/submit.sh as tests/test_multinode.py does.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from fedsim.runtime import run_setup

from .cluster_batch import SERVER, Batch
from .conftest import HAS_MNIST, WAIT_S, needs_mnist

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "scenarios" / "ci" / "tiny-synthetic.yaml"
# cpus 0: the embedded Ray of the tests has 2 CPUs, both the workers'
ACTOR = ["resources.server.home=actor", "resources.server.cpus=0"]


def _load(*overrides: str) -> Any:
    from fedsim.scenario import load_scenario

    return load_scenario(TINY, ["rounds=3", *overrides])


def _same(a: Any, b: Any) -> None:
    """Two runs' rows, client rows and final models are bit-identical."""
    drop = {"wall_time"}
    assert [{k: v for k, v in r.items() if k not in drop} for r in a.rows] == [
        {k: v for k, v in r.items() if k not in drop} for r in b.rows
    ]
    assert a.clients == b.clients
    assert torch.equal(a.final_params, b.final_params)


# ------------------------------------------------------------ no Ray needed


def test_old_server_fields_are_refused_and_name_the_new_section():
    from fedsim.scenario import ScenarioError

    for old in ("resources.server_node=any", "resources.server_cpus=1"):
        with pytest.raises(ScenarioError, match="use resources.server instead"):
            _load(old)


def test_a_driver_home_takes_no_gpus_or_node_resources():
    from fedsim.scenario import ScenarioError

    with pytest.raises(ScenarioError, match="set home: actor"):
        _load("resources.server={home: driver, gpus: 1}")
    sc = _load("resources.server={home: actor, cpus: 1, resources: {node_b: 0.01}}")
    assert sc.resources.server.resources == {"node_b": 0.01}


def test_the_server_actor_needs_ray_workers():
    from fedsim.runtime import SetupError, run_scenario

    with pytest.raises(SetupError, match="--workers >= 1"):
        run_scenario(_load(*ACTOR), workers=0)


def test_the_home_is_not_part_of_the_checkpoint_fingerprint():
    from fedsim.checkpoint import fingerprint

    assert fingerprint(_load()) == fingerprint(_load(*ACTOR))


# ----------------------------------------------------- one machine, embedded Ray


@pytest.mark.ray
@pytest.mark.parametrize(
    "algorithm", ["{name: fedavg}", "{name: scaffold}"], ids=["fedavg", "stateful"]
)
def test_driver_and_actor_homes_give_identical_results(ray_session, algorithm):
    from fedsim.runtime import run_scenario

    alg = f"algorithm={algorithm}"
    # The driver home in process: results do not depend on the workers
    # (test_determinism), so this asks the actor home on 2 Ray workers to
    # match it, and spares a Ray run.
    driver = run_scenario(_load(alg), workers=0)
    actor = run_scenario(_load(alg, *ACTOR), workers=2)
    _same(driver, actor)
    assert driver.placement["server"]["home"] == "driver"
    where = actor.placement["server"]
    assert where["home"] == "actor" and where["device"] == "cpu"
    assert where["node_id"] and where["address"] == "127.0.0.1"


@pytest.mark.ray
@pytest.mark.parametrize(
    "algorithm",
    ["{name: fedbuff, buffer_size: 2}", "{name: fedasync}"],
    ids=["fedbuff", "fedasync"],
)
def test_asynchronous_runs_are_identical_in_both_homes(ray_session, algorithm):
    # 8 versions: with 4, updates applied in another order inside the actor
    # went unnoticed (a broken copy, tests/broken_copies.sh server_order);
    # FedAsync applies each update alone, mixed by its own staleness
    from fedsim.runtime import run_scenario

    asyn = ["round={policy: async, job_steps: max_steps, max_steps: 5, concurrency: 3}"]
    asyn += [f"algorithm={algorithm}", "rounds=8"]
    driver = run_scenario(_load(*asyn), workers=0)  # in process, as above
    _same(driver, run_scenario(_load(*asyn, *ACTOR), workers=2))
    assert len(driver.rows) == 8


def _watch_the_driver(monkeypatch) -> dict[str, list]:
    """Record, in this (the driver's) process, what ``ray.get`` returned
    and what the runtime handed to the server actor's ``apply``.

    Returns:
        ``fetched``: the type name of every ClientUpdate or UpdateSummary
        found in a value ``ray.get`` returned here; ``handed``: the type
        names of the updates given to ``RemoteServer.apply``.
    """
    import ray

    from fedsim.algorithms.base import ClientUpdate
    from fedsim.remote.server_actor import RemoteServer
    from fedsim.tasks import UpdateSummary

    seen: dict[str, list] = {"fetched": [], "handed": []}

    def walk(x: Any) -> None:
        if isinstance(x, ClientUpdate | UpdateSummary):
            seen["fetched"].append(type(x).__name__)
        elif isinstance(x, list | tuple):
            for y in x:
                walk(y)
        elif isinstance(x, dict):
            for y in x.values():
                walk(y)

    get, apply = ray.get, RemoteServer.apply

    def watched_get(*args: Any, **kwargs: Any) -> Any:
        out = get(*args, **kwargs)
        walk(out)
        return out

    def watched_apply(self: Any, updates: Any, at: Any) -> Any:
        seen["handed"] += [type(u).__name__ for u in updates]
        return apply(self, updates, at)

    monkeypatch.setattr(ray, "get", watched_get)
    monkeypatch.setattr(RemoteServer, "apply", watched_apply)
    return seen


@pytest.mark.ray
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_updates_reach_the_server_actor_without_the_driver(
    ray_session, monkeypatch, mode
):
    from fedsim.runtime import run_scenario

    more = []
    if mode == "async":
        more = ["round={policy: async, job_steps: max_steps, max_steps: 5}"]
        more += ["algorithm={name: fedbuff, buffer_size: 2}"]
    seen = _watch_the_driver(monkeypatch)
    res = run_scenario(_load(*more, *ACTOR), workers=2)
    n = len([c for c in res.clients if not c["dropped"]])
    assert res.status == "completed" and n > 0
    # the driver fetched each update's summary, never an update ...
    assert "ClientUpdate" not in seen["fetched"]
    assert seen["fetched"].count("UpdateSummary") == n
    # ... and handed the server actor object references, one per update
    assert seen["handed"] == ["ObjectRef"] * n


@pytest.mark.ray
def test_the_update_watch_sees_updates_fetched_by_the_driver(ray_session, monkeypatch):
    # the same watch in the driver home, where the driver needs the updates
    from fedsim.runtime import run_scenario

    seen = _watch_the_driver(monkeypatch)
    res = run_scenario(_load(), workers=2)
    n = len([c for c in res.clients if not c["dropped"]])
    assert seen["fetched"] == ["ClientUpdate"] * n and seen["handed"] == []


@pytest.mark.ray
def test_a_lost_worker_call_is_resent_and_its_new_references_used(ray_session):
    import os
    import time

    import ray

    from fedsim.data import build_data
    from fedsim.runtime import make_executor
    from fedsim.server import Server
    from fedsim.workers import Task

    sc = _load(*ACTOR)
    data = build_data(sc.data, sc.num_clients, sc.seed)
    payloads = {0: Server(run_setup(sc).server, data).payload()}
    tasks = [Task(c, 0, 3 + c % 4) for c in range(6)]
    local = make_executor(run_setup(sc).executor, data, workers=0).train(
        tasks, payloads, {}
    )
    ex = make_executor(run_setup(sc).executor, data, workers=2)
    try:

        def die_soon(worker: Any) -> None:  # runs on the actor
            time.sleep(1.0)
            os._exit(1)

        # the actor dies with the executor's calls queued behind this one
        ex.actors[0].__ray_call__.remote(die_soon)
        kept, parcels = ex.train_apart(tasks, payloads, {})
        assert ex.tasks_retried >= 1
        ups = ray.get(parcels)  # what the server actor would fetch
    finally:
        ex.shutdown()
    for k, s, u, want in zip(tasks, kept, ups, local, strict=True):
        assert s.client == u.client == want.client == k.client
        assert torch.equal(u.delta, want.delta)
        assert (s.train_loss, s.tau) == (want.train_loss, want.tau)


class _Holder:
    """An actor that owns one object (the test kills it)."""

    def hold(self) -> list[Any]:
        import ray

        return [ray.put(1)]  # in a list: the caller gets the reference


@pytest.mark.ray
def test_an_update_lost_before_the_server_read_it_stops_the_run(
    ray_session, monkeypatch
):
    import ray

    from fedsim.remote.server_actor import RemoteServer
    from fedsim.runtime import run_scenario

    # an object whose owner is gone, as an update is once its node is lost
    holder = ray.remote(num_cpus=0)(_Holder).remote()
    (gone,) = ray.get(holder.hold.remote())
    ray.kill(holder)
    # ray.kill returns at once, and the object outlives its owner a moment:
    # wait until it is gone (a warm run reaches round 1 in a fraction of a
    # second)
    deadline = time.monotonic() + WAIT_S
    while True:
        try:
            ray.get(gone, timeout=10)
        except ray.exceptions.ObjectLostError:
            break
        assert time.monotonic() < deadline, "the killed actor's object is still there"
        time.sleep(0.1)
    apply = RemoteServer.apply

    def lose_round_1(self: Any, updates: Any, at: Any) -> Any:
        if at.where == "round 1":
            updates = [gone, *updates[1:]]
        return apply(self, updates, at)

    monkeypatch.setattr(RemoteServer, "apply", lose_round_1)
    res = run_scenario(_load(*ACTOR), workers=2)
    assert res.status == "interrupted"
    assert "before the server actor read its update" in res.message
    assert [r["round"] for r in res.rows] == [0]


@pytest.mark.ray
def test_auto_workers_leave_the_server_actor_its_cpus(ray_session):
    from fedsim.remote.placement import resolve_workers

    auto = "resources.workers=auto"  # the embedded Ray has 2 CPUs
    assert resolve_workers(_load(auto).resources, None) == 2
    assert (
        resolve_workers(_load(auto, "resources.server.home=actor").resources, None) == 1
    )
    assert resolve_workers(_load(auto, *ACTOR).resources, None) == 2  # cpus 0: shares


@pytest.mark.ray
def test_the_server_actor_takes_the_last_bundle_of_the_placement_group(ray_session):
    from fedsim.runtime import run_scenario

    # 2 workers of half a CPU and the server's whole one: the 2 CPUs, packed
    pack = ["resources.placement=pack", "resources.cpus_per_worker=0.5"]
    res = run_scenario(_load(*pack, "resources.server.home=actor"), workers=2)
    assert res.status == "completed"
    assert res.placement["server"]["cpus"] == 1.0
    _same(run_scenario(_load(*pack), workers=2), res)


@pytest.mark.ray
def test_checkpoints_land_in_the_run_dir_and_resume_identically(
    ray_session, tmp_path: Path, monkeypatch
):
    import ray

    from fedsim.remote import server_actor
    from fedsim.runtime import run_scenario

    every = [*ACTOR, "checkpoint.every_rounds=1", "rounds=4"]
    for name in ("whole", "cut"):
        (tmp_path / name).mkdir()
    # the undisturbed reference in process (the driver's home), as above
    whole = run_scenario(_load(*every[2:]), workers=0, run_dir=tmp_path / "whole")

    # The server actor dies after round 1 (as when its node is lost).
    made: list[Any] = []
    init = server_actor.RemoteServer.__init__

    def keep(self, *args, **kwargs):
        init(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(server_actor.RemoteServer, "__init__", keep)

    def kill_after_round_1(row, clients):
        if row["round"] == 1:
            ray.kill(made[-1].actor, no_restart=True)

    run = tmp_path / "cut"
    cut = run_scenario(
        _load(*every), workers=2, run_dir=run, on_round=kill_after_round_1
    )
    assert cut.status == "interrupted"
    assert "server actor died" in cut.message
    assert (run / "LATEST").exists()  # written by the driver from the actor
    again = run_scenario(_load(*every), workers=2, run_dir=run, resume=True)
    assert again.status == "completed"
    _same(whole, again)


@pytest.mark.ray
def test_the_command_line_prints_the_resume_command_when_the_server_is_lost(
    ray_session, tmp_path: Path, monkeypatch
):
    from typer.testing import CliRunner

    from fedsim import runtime
    from fedsim.remote.server_actor import ServerLost
    from fedsim.tools.cli import app

    def lost(run, resume):  # the server's node went away mid-run
        raise ServerLost("the server actor died (ActorDiedError)")

    monkeypatch.setattr(runtime, "_run_rounds", lost)
    out = tmp_path / "run"
    args = ["run", str(TINY), "--workers", "2", "--out", str(out), "--quiet"]
    for o in ACTOR:
        args += ["--set", o]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 130, result.output
    assert "server actor died" in result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["server"]["home"] == "actor"


# ------------------------------------------------- the multi-node test cluster


# The runs (tests/cluster_batch.py, one job shared with other cluster
# tests): ``driver`` (the server in the driver), ``actor`` (the same run, the
# server an actor pinned to node b) and ``pns`` (FedPNS, the server an actor
# with a GPU on node a; only where the shared MNIST test set is, else its
# test skips).
@pytest.fixture(scope="module")
def cluster_runs(cluster_batch: Batch) -> Path:
    """The folder holding the server runs; each must have exited 0."""
    codes = cluster_batch.codes_of(SERVER)
    expected = dict.fromkeys(SERVER if HAS_MNIST else SERVER[:2], 0)
    assert codes == expected, f"exit codes {codes}\n{cluster_batch.logs[-6000:]}"
    return cluster_batch.out


def _summary(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())


def _digest(run: Path) -> dict[str, list]:
    import pyarrow.parquet as pq

    out = {}
    for name in ("rounds", "clients"):
        table = pq.read_table(run / f"{name}.parquet").to_pydict()
        out |= {f"{name}.{k}": v for k, v in table.items() if k != "wall_time"}
    return out


def _node(cluster: Any, resource: str) -> str:
    """The node id of the node that declares ``resource``."""
    (nid,) = [
        n["node_id"] for n in cluster.alive_nodes() if resource in n["resources_total"]
    ]
    return nid


@pytest.mark.ray
@pytest.mark.cluster
@pytest.mark.slow
def test_a_server_on_another_node_gives_the_drivers_results(cluster, cluster_runs):
    driver, actor = _summary(cluster_runs / "driver"), _summary(cluster_runs / "actor")
    assert _digest(cluster_runs / "driver") == _digest(cluster_runs / "actor")
    assert driver["server"]["home"] == "driver"
    assert actor["server"]["home"] == "actor"
    # the driver runs on the head; the server on node b
    assert actor["server"]["node_id"] == _node(cluster, "node_b")
    assert actor["server"]["node_id"] != driver["server"]["node_id"]
    assert actor["server"]["resources"].get("node_b") == pytest.approx(0.01)


@pytest.mark.ray
@pytest.mark.cluster
@pytest.mark.slow
@needs_mnist
def test_a_server_with_server_side_compute_on_a_gpu_node(cluster, cluster_runs):
    s = _summary(cluster_runs / "pns")
    assert s["status"] == "completed"
    where = s["server"]
    assert where["home"] == "actor" and where["gpus"] == 1.0
    assert len(where["gpu_ids"]) == 1
    assert where["node_id"] == _node(cluster, "node_a")
    # fake GPUs: the server's model stays on the CPU, and says so
    assert where["device"] == "cpu"
