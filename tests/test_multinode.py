"""fedsim on a multi-node Ray cluster, through `ray job submit` only.

The slow tests share the session's one cluster on this machine (the
``cluster`` fixture of tests/conftest.py, built by tests/cluster_utils.py):
a head that offers no CPUs (it runs the job drivers) and three worker nodes,
node ``a`` with 2 CPUs and 2 fake GPUs, nodes ``b`` and ``c`` with 1 CPU
each; each names itself with a custom resource (``node_a``, ...). The
node-loss tests (``cluster(kills_nodes=True)``) run after every other
cluster test. Everything listens
on 127.0.0.1 and needs the cluster's token. Jobs go in through
cluster/submit.sh, as a user's would, through `ray job submit
--working-dir` from a user's own package folder, or, where tests need runs
that differ only in their settings (placements, per-node data, the server
actor's home), as one `ray job submit` of a driver in tests/cluster_utils.py
that runs them all in turn (the session's ``cluster_batch``,
tests/cluster_batch.py); a run that must be acted on (node loss) has a job
of its own. The tests look only at what Ray's job and state APIs say, the
job's logs and the files a run writes.

Data lives on the driver's node only: the head has FEDSIM_DATA_ROOT (the
shared MNIST test set); the worker nodes have an empty data root and an empty
HOME, so their worker actors can train only on the copy the driver puts in
the object store.

The fast tests drive submit.sh with a fake ray CLI: it waits for the job
agent, and stops when the head has no fedsim.
"""

from __future__ import annotations

import json
import secrets
import shlex
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from .cluster_batch import MNIST_ARGS, PER_NODE_DATA, PLACEMENT, Batch
from .cluster_utils import RAY, Cluster, NodeSpec, base_env, is_loopback
from .conftest import MNIST, ROOT, WAIT_S, needs_mnist

SUBMIT = ROOT / "cluster" / "submit.sh"
EXAMPLE = ROOT / "examples" / "fedsim_example"
WORKER_NODES = ["node_a", "node_b", "node_c"]

# ------------------------------------------------ submit.sh, with a fake ray


def _fake_ray(tmp_path: Path, busy: int, fedsim: str) -> Path:
    """A ray CLI whose job server says "No available agent" ``busy`` times,
    then runs the check job on a head whose ``command -v fedsim`` is
    ``fedsim``; it logs every call to calls.log."""
    script = tmp_path / "ray"
    script.write_text(
        f"""#!/usr/bin/env bash
echo "$*" >> {tmp_path}/calls.log
n=$(grep -c 'job submit' {tmp_path}/calls.log)
case "$*" in
  *"job submit"*"fedsim-check"*)
    if [ "$n" -le {busy} ]; then
      echo "RuntimeError: Request failed with status code 500: No available"\\
" agent to submit job, please try again later." >&2
      exit 1
    fi
    echo "fedsim-check: {fedsim} PATH=/x"; echo "Job succeeded" ;;
  *"job submit"*) echo "THE JOB RAN" ;;
esac
"""
    )
    script.chmod(0o755)
    return script


def _submit_fake(tmp_path: Path, busy: int, fedsim: str, **env: str):
    ray = _fake_ray(tmp_path, busy, fedsim)
    return subprocess.run(
        [str(SUBMIT), "scenarios/quickstart.yaml", "--out", "/r/q"],
        cwd=ROOT,
        env=base_env(
            RAY=str(ray),
            RAY_ADDRESS="http://127.0.0.1:1",
            FEDSIM_VALIDATE="0",
            FEDSIM_AGENT_POLL_S="0.1",
            **env,
        ),
        capture_output=True,
        text=True,
        timeout=WAIT_S,
    )


def test_submit_sh_waits_for_the_job_agent(tmp_path: Path):
    r = _submit_fake(tmp_path, busy=2, fedsim="/venv/bin/fedsim")

    assert r.returncode == 0, r.stderr
    assert "waiting up to 120s for the head's job agent" in r.stderr
    assert r.stdout.strip() == "THE JOB RAN"
    calls = (tmp_path / "calls.log").read_text().splitlines()
    # three check jobs (two refused), the check job deleted, then the job
    assert [c.split()[:2] for c in calls] == [["job", "submit"]] * 3 + [
        ["job", "delete"],
        ["job", "submit"],
    ]
    assert "fedsim run scenarios/quickstart.yaml --out /r/q" in calls[-1]


def test_submit_sh_gives_up_waiting_for_the_agent(tmp_path: Path):
    start = time.monotonic()
    r = _submit_fake(tmp_path, busy=1000, fedsim="/x", FEDSIM_AGENT_WAIT_S="2")

    assert r.returncode == 3, r.stderr
    assert "took no job within 2s" in r.stderr
    assert "THE JOB RAN" not in r.stdout
    assert time.monotonic() - start < 30


def test_submit_sh_stops_when_the_head_has_no_fedsim(tmp_path: Path):
    r = _submit_fake(tmp_path, busy=0, fedsim="MISSING")

    assert r.returncode == 2, r.stderr
    assert "no `fedsim` command on its PATH" in r.stderr
    assert "fedsim: not found" in r.stderr and "What the nodes need" in r.stderr
    assert "THE JOB RAN" not in r.stdout


# --------------------------------------------------- a real multi-node cluster


def _submit(
    cluster: Cluster,
    *args: str,
    job_opts: str = "",
    check: bool = False,
    timeout=WAIT_S,
):
    """cluster/submit.sh ARGS with the cluster's token; (job id, result).
    ``check``: let submit.sh validate the scenario and run its check job
    first (the first submission does; it costs a few seconds a job on busy
    cores)."""
    job_id = f"fedsim-test-{secrets.token_hex(4)}"
    start = time.monotonic()
    r = subprocess.run(
        [str(SUBMIT), *args, "--quiet"],
        cwd=ROOT,
        env={
            **cluster.env,
            "RAY": str(RAY),
            "RAY_ADDRESS": cluster.dashboard,
            "RAY_JOB_OPTS": f"--submission-id {job_id} {job_opts}".strip(),
            "FEDSIM_CHECK_HEAD": "1" if check else "0",
            # submit.sh's local `fedsim validate` (a Python start-up) with
            # the check job only: the other submissions' files are valid
            "FEDSIM_VALIDATE": "1" if check else "0",
        },
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    print(f"{args[0]}: {time.monotonic() - start:.1f}s (check job: {check})")
    return job_id, r


def _expect_success(cluster: Cluster, job_id: str, r) -> dict:
    job = cluster.job(job_id)
    if r.returncode != 0 or job.get("status") != "SUCCEEDED":
        pytest.fail(
            f"job {job_id}: {job.get('status')} (submit.sh exit {r.returncode})\n"
            f"--- submit.sh stderr\n{r.stderr[-3000:]}\n"
            f"--- job logs\n{cluster.job_logs(job_id)[-6000:]}\n"
            f"--- nodes\n{cluster.log_tail(20)}"
        )
    return job


def _job_ids(cluster: Cluster) -> set[str]:
    """The submission ids of every job the cluster lists (the cluster is
    shared: other tests' jobs are there too)."""
    code, text = cluster.http("GET", "/api/jobs/")
    assert code == 200, text[-2000:]
    return {j["submission_id"] for j in json.loads(text)}


def _rows(run: Path) -> int:
    import pyarrow.parquet as pq

    return pq.read_table(run / "rounds.parquet").num_rows


def _own_package(tmp_path: Path) -> Path:
    """A user's folder as docs/extending.md's "Submitting from your own
    package" has it: the example package under a name no environment has
    (``mylab``, so it imports only from the uploaded folder) and a scenario
    naming its classes by import path, 2 rounds."""
    folder = tmp_path / "mylab-work"
    shutil.copytree(EXAMPLE / "fedsim_example", folder / "mylab")
    text = (EXAMPLE / "scenario.yaml").read_text(encoding="utf-8")
    text = text.replace("fedsim_example.", "mylab.").replace("rounds: 4", "rounds: 2")
    assert "mylab.fedexp:FedExP" in text
    (folder / "scenario.yaml").write_text(text, encoding="utf-8")
    return folder


# The asynchronous variant of the example's scenario: FedBuff with the
# package's model and selector (FastestK chooses from facts known before
# training, so it fills asynchronous slots too).
ASYNC_SETS = [
    *(
        "--set",
        "round={policy: async, job_steps: max_steps, max_steps: 5, "
        "concurrency: 3, max_staleness: 10}",
    ),
    *("--set", "algorithm={name: fedbuff, buffer_size: 2}"),
    *("--set", "rounds=3"),
]


@pytest.mark.cluster
@pytest.mark.slow
def test_jobs_from_the_users_own_package_run_on_the_multinode_cluster(
    cluster: Cluster, tmp_path: Path
):
    # The cluster's shape, and every port it opened is on loopback.
    nodes = cluster.alive_nodes()
    head = [n for n in nodes if n["is_head_node"]]
    assert len(nodes) == 4 and len(head) == 1
    assert head[0]["resources_total"].get("CPU", 0) == 0
    totals = [n["resources_total"] for n in nodes if not n["is_head_node"]]
    assert sorted(t["CPU"] for t in totals) == [1, 1, 2]
    assert sorted(t.get("GPU", 0) for t in totals) == [0, 0, 2]
    assert {k for t in totals for k in t if k.startswith("node_")} == set(WORKER_NODES)
    listening = cluster.listening()
    assert len(listening) > 10, listening
    assert all(is_loopback(a.ip) for a in listening), listening
    jobs_before = _job_ids(cluster)

    # Prepare: the user's folder, outside the checkout (issue 37: submit.sh
    # refuses such a scenario and prints the command below instead)
    folder = _own_package(tmp_path)
    sync, fedbuff = tmp_path / "mylab-run", tmp_path / "mylab-fedbuff"
    job_id = f"fedsim-mylab-{secrets.token_hex(4)}"
    common = ["--workers", "2", "--no-report", "--quiet"]

    # Execute: the documented command from the user's folder, and in the same
    # job (one submission, one upload) an asynchronous run of the package's
    # model and selector. Ray quotes each word of the entrypoint, so the two
    # commands go to a shell as one word (`bash -c`).
    first = ["fedsim", "run", "scenario.yaml", *common, "--out", str(sync)]
    second = ["fedsim", "run", "scenario.yaml", *common, "--out", str(fedbuff)]
    both = f"{shlex.join(first)} && {shlex.join([*second, *ASYNC_SETS])}"
    r = subprocess.run(
        [str(RAY), "job", "submit", "--address", cluster.dashboard]
        + ["--submission-id", job_id, "--working-dir", "."]
        + ["--", "bash", "-c", both],
        cwd=folder,
        env=cluster.env,
        capture_output=True,
        text=True,
        timeout=WAIT_S,
    )

    # Assert: the job ran the plug-ins from the upload on worker actors
    job = _expect_success(cluster, job_id, r)
    assert "mylab.fedexp:FedExP" in (sync / "scenario.yaml").read_text()
    summary = json.loads((sync / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["rounds"] == 2, summary
    # FedExP's own metric (a hook column) came from the uploaded package
    assert "alg_eta_g" in _columns(sync), _columns(sync)
    summary = json.loads((fedbuff / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["rounds"] == 3, summary
    assert "mylab.tiny_mlp:TinyMLP" in (fedbuff / "scenario.yaml").read_text()
    assert _rows(fedbuff) == 3 and "staleness_max" in _columns(fedbuff)
    actors = cluster.state("actors", job_id=job["job_id"])
    trainers = [a for a in actors if a.get("required_resources", {}).get("CPU")]
    workers = {n["node_id"] for n in nodes if not n["is_head_node"]}
    assert len(trainers) >= 2 and {a["node_id"] for a in trainers} <= workers
    # only this job was added
    assert _job_ids(cluster) - jobs_before == {job_id}


def _columns(run: Path) -> list[str]:
    import pyarrow.parquet as pq

    return pq.read_schema(run / "rounds.parquet").names


@pytest.mark.cluster
@pytest.mark.slow
@needs_mnist
def test_real_data_reaches_worker_nodes_through_the_object_store(
    cluster: Cluster, cluster_batch: Batch, tmp_path: Path
):
    # Prepare: the data exists on the head only.
    assert (MNIST / "mnist-test" / "t10k-images-idx3-ubyte.gz").is_file()

    # Execute: MNIST on 2 worker actors; the driver (on the head) reads it
    # (the batch's `mnist` run, tests/cluster_batch.py).
    out = cluster_batch.out / "mnist"
    codes = cluster_batch.codes_of(("mnist",))
    assert codes == {"mnist": 0}, f"exit codes {codes}\n{cluster_batch.logs[-6000:]}"

    # Assert: it ran, and its worker actors ran on the worker nodes.
    assert _rows(out) == 3
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rounds"] == 3
    nodes = cluster.alive_nodes()
    workers = {n["node_id"] for n in nodes if not n["is_head_node"]}
    # the server lives in the driver, on the head (a job's driver runs
    # there unless it asks for resources, as the control below does)
    assert summary["server"]["home"] == "driver"
    # spread: on two different worker nodes, never the head
    trainers = {n["node_id"] for n in _nodes_of(summary)}
    assert trainers <= workers and len(trainers) == 2, summary["workers_nodes"]

    # The control: the same run with its driver pinned to worker node a
    # (`--entrypoint-resources`) finds no data there, and says so.
    out = tmp_path / "mnist-on-a"
    job_id, r = _submit(
        cluster,
        *MNIST_ARGS,
        *("--out", str(out)),
        job_opts='--entrypoint-resources {"node_a":1}',
    )
    assert r.returncode != 0
    job = cluster.job(job_id)
    assert job["status"] == "FAILED"
    (node_a,) = {n["node_id"] for n in nodes if "node_a" in n["resources_total"]}
    assert job["driver_node_id"] == node_a  # hence the server too
    # The message ends with the driver's last lines of output.
    assert "MNIST: data not found" in job["message"], job["message"][-3000:]
    assert not (out / "rounds.parquet").exists()


# ------------------------------------------------- placement across nodes


def _nodes_of(summary: dict) -> list[dict]:
    """The node each worker ran on (none moved: one node each)."""
    assert all(len(h) == 1 for h in summary["workers_nodes"]), summary
    return [h[0] for h in summary["workers_nodes"]]


@pytest.mark.cluster
@pytest.mark.slow
def test_workers_are_placed_as_the_scenario_says(
    cluster: Cluster, cluster_batch: Batch
):
    # The runs (tests/cluster_batch.py, one job for the batch): spread (the
    # default), pack with half a (fake) GPU each, strict_pack, and
    # strict_spread of 4 workers on 3 worker nodes (the head has no CPU)
    ids = {
        n["node_id"]: name
        for n in cluster.alive_nodes()
        for name in WORKER_NODES
        if name in n["resources_total"]
    }
    logs, codes = cluster_batch.logs, cluster_batch.codes_of(PLACEMENT)
    expected = {"spread": 0, "pack": 0, "strict_pack": 0, "strict_spread": 2}
    assert codes == expected, f"exit codes {codes}\n{logs[-6000:]}"
    out = cluster_batch.out

    def summary(name: str) -> dict:
        return json.loads((out / name / "summary.json").read_text())

    # spread: the two workers on two different worker nodes.
    s = summary("spread")
    nodes = _nodes_of(s)
    assert s["placement"] == "spread"
    names = [ids[n["node_id"]] for n in nodes]
    assert len(set(names)) == 2 and set(names) <= set(WORKER_NODES), names
    assert sorted(tuple(n["resources"]) for n in nodes) == [(m,) for m in sorted(names)]
    assert all(is_loopback(n["address"]) for n in nodes)
    assert s["nodes_lost"] == 0 and s["tasks_retried"] == 0
    assert [g["gpus"] for g in s["workers_gpus"]] == [0, 0]

    # pack: both on node a, the one with GPUs.
    s = summary("pack")
    assert [ids[n["node_id"]] for n in _nodes_of(s)] == ["node_a", "node_a"]
    # counted as asked: half a GPU each, of node a's two (declared, so the
    # workers train on the CPU)
    shares = s["workers_gpus"]
    assert [g["gpus"] for g in shares] == [0.5, 0.5], shares
    assert all(len(g["gpu_ids"]) == 1 and g["gpu_ids"][0] in "01" for g in shares)
    assert all(g["device"] == "cpu" for g in shares)

    # strict_pack: one node, the only one with 2 CPUs.
    s = summary("strict_pack")
    assert [ids[n["node_id"]] for n in _nodes_of(s)] == ["node_a", "node_a"]

    # strict_spread: refused (exit 2), naming the field; nothing written.
    assert "resources.placement strict_spread: Ray could not place 4" in logs, logs[
        -3000:
    ]
    assert not (out / "strict_spread" / "rounds.parquet").exists()


# ------------------------------------------------------- per-node data root


@pytest.mark.cluster
@pytest.mark.slow
@needs_mnist
def test_per_node_data_is_checked_on_every_node(cluster_batch: Batch):
    # The runs (tests/cluster_batch.py): `missing`, per-node data where the
    # worker nodes' data root is empty (refused, naming them), and `root`,
    # with data.root naming files every node has (one machine): it runs,
    # each worker reading its own copy.
    logs, codes = cluster_batch.logs, cluster_batch.codes_of(PER_NODE_DATA)
    assert codes == {"missing": 2, "root": 0}, f"exit codes {codes}\n{logs[-6000:]}"
    assert "resources.data per_node: every node that can host a worker" in logs, logs[
        -3000:
    ]
    assert "3 of 3 cannot build the dataset" in logs, logs[-3000:]
    assert all(f"'{n}': 1.0" in logs for n in WORKER_NODES), logs[-3000:]
    assert not (cluster_batch.out / "missing" / "rounds.parquet").exists()
    assert _rows(cluster_batch.out / "root") == 3


# ------------------------------------------------------------ node loss


def _table(path: Path) -> str:
    """A Parquet file's rows but the wall-clock columns, exactly (repr
    round-trips floats, and shows NaN, which ``Table.equals`` finds unequal
    to itself)."""
    import pyarrow.parquet as pq

    t = pq.read_table(path)
    return repr(t.drop([c for c in t.column_names if "wall" in c]).to_pylist())


def _lose_a_node(cluster: Cluster, tmp_path: Path, scenario: str, sets, most: int):
    """Run ``scenario`` on 2 workers, killing after round (version) 2 one of
    nodes b and c still alive that hosts a worker (never node a: the moved
    worker needs its free CPU); assert it finished with the results of an
    undisturbed in-process run. ``most``: the most tasks that can be in
    flight on one worker (the retried ones)."""
    from fedsim.runtime import run_scenario
    from fedsim.scenario import load_scenario

    ids = {
        name: n["node_id"]
        for n in cluster.alive_nodes()
        for name in ("b", "c")
        if f"node_{name}" in n["resources_total"]
    }
    candidates = [
        dict(
            name=name,
            node_dir=str(cluster.node(name).dir),
            node_sid=cluster.node(name).proc.pid,
            node_id=ids[name],
        )
        for name in ("b", "c")
        if name in ids and cluster.node(name).proc.poll() is None
    ]
    assert candidates, "nodes b and c are both gone"
    out = tmp_path / "lost"
    cfg = dict(
        scenario=scenario,
        sets=list(sets),
        out=str(out),
        workers=2,
        kill_at=2,
        candidates=candidates,
    )
    start = time.monotonic()
    status, logs = cluster.drive("drive", cfg)
    assert status == "SUCCEEDED", logs[-6000:]
    assert "killed node" in logs and "status completed" in logs, logs[-3000:]
    (victim,) = [c["name"] for c in candidates if f"killed node {c['name']} " in logs]
    print(f"{scenario} losing node {victim}: {time.monotonic() - start:.1f}s")
    assert cluster.node(victim).proc.poll() is not None  # its `ray start` went too

    summary = json.loads((out / "summary.json").read_text())
    assert summary["nodes_lost"] == 1, summary
    # The victim's worker was training (or about to) when its node went: its
    # call failed and was sent again, its tasks counted once; the other
    # worker's calls never failed.
    assert 1 <= summary["tasks_retried"] <= most, summary
    assert "was lost" in logs, logs[-3000:]
    moved = [h for h in summary["workers_nodes"] if len(h) == 2]
    assert len(moved) == 1, summary["workers_nodes"]  # the victim's worker
    assert f"node_{victim}" in moved[0][0]["resources"], moved
    assert f"node_{victim}" not in moved[0][1]["resources"], moved
    print("tasks retried:", summary["tasks_retried"], "moved:", moved)

    ref = tmp_path / "ref"
    ref.mkdir()
    run_scenario(load_scenario(ROOT / scenario, list(sets)), workers=0, run_dir=ref)
    for name in ("rounds.parquet", "clients.parquet"):
        assert _table(out / name) == _table(ref / name), name


@pytest.mark.cluster(kills_nodes=True)
@pytest.mark.slow
def test_a_node_lost_in_a_sync_run_changes_nothing(cluster: Cluster, tmp_path: Path):
    # 10 clients a round on 2 workers: the victim's share is 1 to 9 tasks.
    _lose_a_node(cluster, tmp_path, "scenarios/quickstart.yaml", ["rounds=8"], most=9)


# explore: the asynchronous repeat of test_a_node_lost_in_a_sync_run_changes_
# nothing (the same retry path; CI runs it when its budget allows)
@pytest.mark.explore
@pytest.mark.cluster(kills_nodes=True)
@pytest.mark.slow
def test_a_node_lost_in_an_async_run_changes_nothing(cluster: Cluster, tmp_path: Path):
    # At most 15 jobs train at once (`concurrency`), on 2 workers.
    _lose_a_node(
        cluster, tmp_path, "scenarios/async-fedbuff.yaml", ["rounds=8"], most=15
    )


def _a_node_to_lose(cluster: Cluster, tmp_path: Path) -> dict:
    """One node the run can lose, as cluster_utils' ``_drive`` names its
    candidates: node b or c while one is alive, else (the node-loss tests
    before took both) a new node d like them."""

    def alive() -> list[dict]:
        ids = {
            name: n["node_id"]
            for n in cluster.alive_nodes()
            for name in ("b", "c", "d")
            if f"node_{name}" in n["resources_total"]
        }
        return [
            dict(
                name=name,
                node_dir=str(cluster.node(name).dir),
                node_sid=cluster.node(name).proc.pid,
                node_id=ids[name],
            )
            for name in ids
            if cluster.node(name).proc.poll() is None
        ]

    if not alive():
        empty = tmp_path / "nodata"
        empty.mkdir()
        no_data = {"FEDSIM_DATA_ROOT": str(empty), "HOME": str(empty)}
        cluster.add_node(NodeSpec("d", resources={"node_d": 1}, env=no_data))
    (node, *_) = alive()
    return node


@pytest.mark.cluster(kills_nodes=True)
@pytest.mark.slow
def test_losing_the_server_actors_node_stops_the_run_and_resume_is_identical(
    cluster: Cluster, tmp_path: Path
):
    from fedsim.checkpoint import check_resumable
    from fedsim.runtime import run_scenario
    from fedsim.scenario import load_scenario

    # Prepare: the server actor pinned to a node the run will lose.
    scenario = "scenarios/ci/tiny-synthetic.yaml"
    sets = ["rounds=6", "checkpoint.every_rounds=1"]
    victim = _a_node_to_lose(cluster, tmp_path)
    pin = "resources.server={home: actor, cpus: 0, resources: {%s: 0.01}}"
    out = tmp_path / "cut"
    cfg = dict(
        scenario=scenario,
        sets=[*sets, pin % f"node_{victim['name']}"],
        out=str(out),
        workers=2,
        kill_at=2,
        kill="server",
        candidates=[victim],
    )

    # Execute: the server's node is killed just after round 2's row.
    start = time.monotonic()
    status, logs = cluster.drive("drive", cfg)
    print(f"losing the server's node {victim['name']}: {time.monotonic() - start:.1f}s")

    # Assert: the run stopped, interrupted, at its last checkpoint, and says
    # how to continue.
    assert status == "SUCCEEDED", logs[-6000:]
    assert f"killed node {victim['name']} " in logs, logs[-3000:]
    assert "status interrupted" in logs, logs[-3000:]
    assert cluster.node(victim["name"]).proc.poll() is not None
    assert "the server actor died" in logs, logs[-3000:]
    assert f"continue with: fedsim run --resume {out}" in logs, logs[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "interrupted", summary
    assert summary["server"]["node_id"] == victim["node_id"], summary["server"]
    ck = check_resumable(out)  # LATEST names a whole checkpoint
    assert 1 <= ck.next_round <= 3, ck

    # Resume, the server placed on node a now (resources.server is not part
    # of the checkpoint's fingerprint; the driver checks it).
    start = time.monotonic()
    cfg.update(resume=True, kill_at=None, resume_sets=[pin % "node_a"])
    status, logs = cluster.drive("drive", cfg)
    print(f"resumed from round {ck.next_round}: {time.monotonic() - start:.1f}s")
    assert status == "SUCCEEDED" and "status completed" in logs, logs[-6000:]
    assert "killed node" not in logs
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["rounds"] == 6, summary
    assert summary["server"]["resources"] == {"node_a": pytest.approx(0.01)}

    # The same rows as an undisturbed in-process run.
    ref = tmp_path / "ref"
    ref.mkdir()
    run_scenario(load_scenario(ROOT / scenario, sets), workers=0, run_dir=ref)
    for name in ("rounds.parquet", "clients.parquet"):
        assert _table(out / name) == _table(ref / name), name


# ------------------------------------------------ the scenario's fields


@pytest.mark.parametrize(
    "override, refused",
    [
        ("resources.server_node=any", "server_node 'any'"),
        ("resources.server_cpus=2", "server_cpus 2"),
    ],
)
def test_old_server_placement_fields_are_refused_with_the_new_section(
    override: str, refused: str
):
    from fedsim.scenario import ScenarioError, load_scenario

    with pytest.raises(ScenarioError) as err:
        load_scenario(ROOT / "scenarios/quickstart.yaml", [override])

    assert refused in str(err.value)
    assert "use resources.server instead" in str(err.value)
    assert "--entrypoint-resources" in str(err.value)


def test_placement_defaults_to_spread_and_takes_rays_strategies():
    from fedsim.scenario import ScenarioError, load_scenario

    quick = ROOT / "scenarios/quickstart.yaml"
    assert load_scenario(quick).resources.placement == "spread"
    for p in ("pack", "strict_pack", "strict_spread"):
        sc = load_scenario(quick, [f"resources.placement={p}"])
        assert sc.resources.placement == p
    with pytest.raises(ScenarioError, match="placement"):
        load_scenario(quick, ["resources.placement=PACK_TIGHT"])


# ------------------------------------------ placement on one local Ray node


# explore: the one-node repeat of the cluster batch's placement runs (pack's
# summary, strict_spread refused), which test_workers_are_placed_as_the_
# scenario_says checks on three nodes (CI runs it when its budget allows)
@pytest.mark.explore
@pytest.mark.ray
def test_summary_says_where_workers_ran_and_an_impossible_group_is_refused(
    ray_session,
):
    from fedsim.remote.placement import PlacementError
    from fedsim.runtime import run_scenario
    from fedsim.scenario import load_scenario

    quick = ROOT / "scenarios/quickstart.yaml"

    # pack: both workers on the one local node, nothing lost or retried.
    sc = load_scenario(quick, ["rounds=2", "resources.placement=pack"])
    summary = run_scenario(sc, workers=2).summary()
    assert summary["placement"] == "pack"
    assert summary["nodes_lost"] == 0 and summary["tasks_retried"] == 0
    (node,) = {h[0]["node_id"] for h in summary["workers_nodes"]}
    assert [len(h) for h in summary["workers_nodes"]] == [1, 1]
    assert len(node) == 56  # a Ray node id, in hex

    # strict_spread: 2 workers need 2 nodes; refused after the timeout.
    sc = load_scenario(
        quick,
        ["resources.placement=strict_spread", "resources.placement_timeout_s=2"],
    )
    with pytest.raises(PlacementError, match="resources.placement strict_spread"):
        run_scenario(sc, workers=2)
