"""cluster/: the configs hold together, and `ray job submit` works for real.

The fast tests check the files in cluster/ (the cluster launcher config passes
Ray's own validation, every Ray container has token authentication on, the
runtime environment leaves results/ and .venv behind, submit.sh builds the
documented command). The slow one uses the session's multi-node cluster
(the ``cluster`` fixture of tests/conftest.py: a real Ray head on 127.0.0.1
with token authentication, a fresh token in a temporary file, never
~/.ray/auth_token), submits the quickstart through cluster/submit.sh, checks
the run directory, and checks that requests without the right token are
refused. The fixture stops the cluster by pid, never with `ray stop` (it
stops every Ray on the machine, other people's included).
"""

from __future__ import annotations

import copy
import json
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from .cluster_utils import Cluster, base_env, free_ports, is_loopback
from .conftest import ROOT, WAIT_S

CLUSTER = ROOT / "cluster"
BIN = Path(sys.executable).parent  # the venv's bin: ray, fedsim, python
RAY = BIN / "ray"
SUBMIT = CLUSTER / "submit.sh"


def _auth_env(env: dict[str, str]) -> list[str]:
    return [f"{k}={v}" for k, v in env.items() if k.startswith("RAY_AUTH")]


# --------------------------------------------------------------- the files


def test_free_ports_never_hands_out_a_port_twice():
    # The nodes' ports come from several calls, each probing with sockets it
    # closes again; a port released by one call must not come back from the
    # next (CI once gave a head the same port for its dashboard and its node
    # manager, and `ray start` refused).
    handed = [p for _ in range(40) for p in free_ports(3)]
    assert len(set(handed)) == len(handed) == 120


def test_runtime_env_excludes_results_and_venv():
    # What Ray matches `excludes` with (a copy of pathspec it ships).
    from ray._private.thirdparty.pathspec import PathSpec

    spec = yaml.safe_load((CLUSTER / "runtime_env.yaml").read_text())
    assert "working_dir" not in spec, "the working dir comes from --working-dir"
    excluded = PathSpec.from_lines("gitwildmatch", spec["excludes"]).match_file
    for path in ("results/quickstart-1/rounds.parquet", ".venv/bin/python"):
        assert excluded(path), path
    for path in (
        "fedsim/results.py",
        "fedsim/scenario.py",
        "scenarios/quickstart.yaml",
        "cluster/runtime_env.yaml",
        "tests/test_cluster.py",
    ):
        assert not excluded(path), path
    assert all(isinstance(v, str) for v in spec.get("env_vars", {}).values())


def test_aws_config_passes_ray_validation_with_token_auth():
    from ray.autoscaler._private.util import prepare_config, validate_config

    raw = yaml.safe_load((CLUSTER / "aws.yaml").read_text())
    config = prepare_config(copy.deepcopy(raw))
    validate_config(config)  # Ray's JSON schema and consistency checks

    types = config["available_node_types"]
    assert config["head_node_type"] in types
    gpu = [t for t in types.values() if t["node_config"]["InstanceType"][0] in "gp"]
    cpu = [t for t in types.values() if t["node_config"]["InstanceType"][0] in "cm"]
    assert gpu and len(cpu) >= 2, "head plus CPU and GPU worker types"

    assert "--env RAY_AUTH_MODE=token" in config["docker"]["run_options"]
    for cmds in ("head_start_ray_commands", "worker_start_ray_commands"):
        start = [c for c in config[cmds] if "ray start" in c]
        assert start and all("RAY_AUTH_MODE=token" in c for c in start), cmds
    head_start = " ".join(config["head_start_ray_commands"])
    assert "--dashboard-host=127.0.0.1" in head_start
    assert raw["file_mounts"]["/home/ray/.ray/auth_token"] == "~/.ray/auth_token"


def _containers(pod_template: dict) -> list[dict]:
    return pod_template["spec"]["containers"]


def _has_token_auth(env: list[dict]) -> bool:
    by_name = {e["name"]: e for e in env}
    mode = by_name.get("RAY_AUTH_MODE", {}).get("value")
    secret = by_name.get("RAY_AUTH_TOKEN", {}).get("valueFrom", {}).get("secretKeyRef")
    return mode == "token" and bool(secret and secret["name"] and secret["key"])


def test_kuberay_manifests_enable_token_auth_everywhere():
    docs = [d for d in yaml.safe_load_all((CLUSTER / "kuberay.yaml").read_text()) if d]
    by_kind = {d["kind"]: d for d in docs}
    assert {"RayCluster", "RayJob"} <= set(by_kind)
    cluster, job = by_kind["RayCluster"]["spec"], by_kind["RayJob"]["spec"]

    templates = [cluster["headGroupSpec"]["template"]]
    templates += [g["template"] for g in cluster["workerGroupSpecs"]]
    for template in templates:
        for container in _containers(template):
            assert _has_token_auth(container.get("env", [])), container["name"]
    assert _has_token_auth(cluster["autoscalerOptions"]["env"])
    for container in _containers(job["submitterPodTemplate"]):
        assert _has_token_auth(container["env"])

    groups = {g["groupName"]: g for g in cluster["workerGroupSpecs"]}
    gpu_limits = [
        c["resources"]["limits"].get("nvidia.com/gpu")
        for g in groups.values()
        for c in _containers(g["template"])
    ]
    assert any(gpu_limits) and not all(gpu_limits), "CPU and GPU worker groups"
    assert (
        job["clusterSelector"]["ray.io/cluster"]
        == by_kind["RayCluster"]["metadata"]["name"]
    )
    assert job["entrypoint"].startswith("fedsim run ")


def test_cluster_files_agree_on_the_ray_version():
    aws = yaml.safe_load((CLUSTER / "aws.yaml").read_text())
    kuberay = [d for d in yaml.safe_load_all((CLUSTER / "kuberay.yaml").read_text())]
    dockerfile = (CLUSTER / "Dockerfile").read_text()
    version = next(d for d in kuberay if d["kind"] == "RayCluster")["spec"][
        "rayVersion"
    ]
    assert aws["docker"]["image"].startswith(f"rayproject/ray:{version}-")
    assert f"FROM rayproject/ray:{version}-" in dockerfile


def _submit(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SUBMIT), *args],
        cwd=ROOT,
        env=base_env(**env),
        capture_output=True,
        text=True,
        timeout=WAIT_S,
    )


def test_submit_sh_builds_the_documented_command():
    # `echo` stands in for the ray CLI: the command line is the output.
    r = _submit(
        "scenarios/quickstart.yaml",
        "--set",
        "algorithm={name: fedavg}",
        RAY="echo",
        RAY_ADDRESS="http://127.0.0.1:1",
        FEDSIM_VALIDATE="0",
        FEDSIM_RESULTS="/shared/runs",
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(
        "job submit --address http://127.0.0.1:1 --working-dir . "
        "--runtime-env cluster/runtime_env.yaml -- fedsim run "
        "scenarios/quickstart.yaml --set algorithm={name: fedavg} "
        "--out /shared/runs/quickstart-"
    ), r.stdout
    assert "results: /shared/runs/quickstart-" in r.stderr
    assert "ray rsync-down" in r.stderr and "kubectl cp" in r.stderr


@pytest.mark.parametrize(
    ("args", "env", "needle"),
    [
        (["scenarios/quickstart.yaml"], {}, "RAY_ADDRESS"),
        (["scenarios/nope.yaml"], {"RAY_ADDRESS": "x"}, "no such scenario"),
        (["/etc/hostname"], {"RAY_ADDRESS": "x"}, "outside the repository"),
        (["/etc/hostname"], {"RAY_ADDRESS": "x"}, "submit it with: ray job submit "),
        (
            ["scenarios/quickstart.yaml", "--out", "runs/a"],
            {"RAY_ADDRESS": "x"},
            "absolute path",
        ),
    ],
)
def test_submit_sh_refuses_what_cannot_work(args, env, needle):
    r = _submit(*args, RAY="echo", FEDSIM_VALIDATE="0", **env)
    assert r.returncode == 2 and needle in r.stderr, r.stderr
    assert "job submit" not in r.stdout


def test_submit_sh_validates_the_scenario_before_submitting():
    r = _submit(
        "scenarios/quickstart.yaml",
        "--set",
        "rounds=-1",
        RAY="echo",
        RAY_ADDRESS="http://127.0.0.1:1",
    )
    assert r.returncode == 2, r.stderr
    assert "rounds" in r.stderr and "Traceback" not in r.stderr
    assert "job submit" not in r.stdout


# ------------------------------------------------- a real head, a real job


def _ray(
    cluster: Cluster, *args: str, env: dict[str, str] | None = None, timeout=WAIT_S
):
    return subprocess.run(
        [str(RAY), *args],
        cwd=ROOT,
        env=cluster.env if env is None else env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.cluster
@pytest.mark.slow
def test_ray_job_submit_with_token_auth(cluster: Cluster, tmp_path: Path):
    import pyarrow.parquet as pq

    head = cluster
    # Every port the cluster opened is on loopback.
    listening = head.listening()
    assert listening, "found none of the cluster's listening sockets"
    assert all(is_loopback(a.ip) for a in listening), listening
    code, text = head.http("GET", "/api/jobs/")
    assert code == 200
    before = {j["submission_id"] for j in json.loads(text)}

    # Submit the quickstart the documented way: cluster/submit.sh, which runs
    # the venv's `ray job submit --working-dir . --runtime-env ...` and waits.
    out = tmp_path / "run"
    job_id = f"fedsim-test-{secrets.token_hex(4)}"
    r = subprocess.run(
        [str(SUBMIT), "scenarios/quickstart.yaml", "--set", "rounds=3"]
        + ["--out", str(out), "--quiet"],
        cwd=ROOT,
        env={
            **head.env,
            "RAY": str(RAY),
            "RAY_ADDRESS": head.dashboard,
            "RAY_JOB_OPTS": f"--submission-id {job_id}",
        },
        capture_output=True,
        text=True,
        timeout=WAIT_S,
    )
    code, text = head.http("GET", f"/api/jobs/{job_id}")
    status = json.loads(text).get("status") if code == 200 else f"HTTP {code}"
    if r.returncode != 0 or status != "SUCCEEDED":
        logs = _ray(head, "job", "logs", "--address", head.dashboard, job_id)
        pytest.fail(
            f"job {job_id}: {status} (submit.sh exit {r.returncode})\n"
            f"--- submit.sh stdout\n{r.stdout[-4000:]}\n"
            f"--- submit.sh stderr\n{r.stderr[-4000:]}\n"
            f"--- ray job logs\n{logs.stdout[-6000:]}{logs.stderr[-2000:]}\n"
            f"--- nodes\n{head.log_tail(20)}"
        )
    assert f"results: {out}" in r.stderr
    assert pq.read_table(out / "rounds.parquet").num_rows == 3
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rounds"] == 3

    # Refused: a submission with a wrong token (403) ...
    wrong = {**head.env, "RAY_AUTH_TOKEN": secrets.token_hex(32)}
    r = _ray(
        head,
        *("job", "submit", "--address", head.dashboard, "--no-wait"),
        *("--", "echo", "intruder"),
        env=wrong,
    )
    assert r.returncode != 0
    assert "Invalid authentication token" in r.stderr, r.stderr[-2000:]
    # ... and one with no token at all (401), from a client that knows nothing
    # of token auth (no RAY_AUTH_* at all, an empty HOME: no ~/.ray/auth_token).
    home = tmp_path / "home"
    home.mkdir()
    bare = {k: v for k, v in head.env.items() if not k.startswith("RAY_AUTH")}
    bare.update(HOME=str(home), RAY_AUTH_MODE="disabled")
    r = _ray(
        head,
        *("job", "submit", "--address", head.dashboard, "--no-wait"),
        *("--", "echo", "intruder"),
        env=bare,
    )
    assert r.returncode != 0
    assert "Missing authentication token" in r.stderr, r.stderr[-2000:]
    # The job API itself, whatever the client: 401 without, 403 with a wrong
    # token; the GCS refuses a wrong token too.
    body = {"entrypoint": "echo intruder"}
    assert head.http("POST", "/api/jobs/", None, body)[0] == 401
    assert head.http("POST", "/api/jobs/", "not-the-token", body)[0] == 403
    r = _ray(head, "status", "--address", head.gcs, env=wrong, timeout=60)
    assert r.returncode != 0 and "auth" in r.stderr.lower(), r.stderr[-2000:]
    r = _ray(head, "status", "--address", head.gcs, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]

    # No rejected request left a job behind, nor did submit.sh's check job:
    # this test added one job (the cluster is shared: compare with before).
    code, text = head.http("GET", "/api/jobs/")
    assert code == 200
    jobs = json.loads(text)
    assert {j["submission_id"] for j in jobs} - before == {job_id}
    assert not any("intruder" in j["entrypoint"] for j in jobs)
