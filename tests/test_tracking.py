"""Runs in TensorBoard and MLflow (fedsim/tools/tracking.py, issue 41), checked
against the real libraries: the event files read back with TensorBoard's
own reader, the MLflow store queried through MLflow's client, each value
equal to the run's rounds.parquet."""

from __future__ import annotations

import math
import os
import sys

import pyarrow.parquet as pq
import pytest

from fedsim.tools.tracking import round_metrics, rows_metrics

from .conftest import SCENARIOS, fedsim_here

TINY = SCENARIOS / "ci" / "tiny-synthetic.yaml"


def test_round_metrics_tags_every_finite_number_and_sums_the_bytes():
    row = {"round": 2, "test_accuracy": 0.25, "test_loss": math.nan, "n_stale": 3,
           "note": "x", "tau_max": 9}  # fmt: skip
    clients = [{"bytes_down": 8, "bytes_up": 4}, {"bytes_down": 8, "bytes_up": 0}]
    assert round_metrics(row, clients) == {
        "test/accuracy": 0.25,
        "fedsim/n_stale": 3.0,  # a column without a tag of its own keeps its name
        "tau/max": 9.0,
        "bytes/down": 16.0,
        "bytes/up": 4.0,
    }
    rows = [{"round": 0, "bytes_up_cum": 5}, {"round": 1, "bytes_up_cum": 12}]
    assert [m["bytes/up"] for _, m in rows_metrics(rows)] == [5.0, 7.0]


@pytest.fixture(scope="module")
def mlflow_store(tmp_path_factory):
    """One SQLite MLflow store for the module: creating one runs MLflow's
    schema migrations, seconds of CPU. Each test logs under its own
    scenario name (its own experiment)."""
    pytest.importorskip("mlflow", reason="MLflow is the optional extra fedsim[track]")
    db = tmp_path_factory.mktemp("mlflow") / "mlflow.db"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{db}")
        from fedsim.tools.tracking import mlflow_client

        yield mlflow_client()


def scalars(folder) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import (
        EventAccumulator,
    )

    ea = EventAccumulator(str(folder))
    ea.Reload()
    return {t: [(e.step, e.value) for e in ea.Scalars(t)] for t in ea.Tags()["scalars"]}


@pytest.mark.slow  # MLflow's import and store: seconds of CPU
def test_run_logs_every_round_to_tensorboard_and_mlflow(tmp_path, mlflow_store):
    pytest.importorskip("tensorboard")
    out = tmp_path / "run"
    args = ["run", str(TINY), "--workers", "0", "--out", str(out), "-q"]
    fedsim_here(*args, "--set", "rounds=3", "--set", "name=tracked", "--log",
                "tensorboard", "--log", "mlflow", check=True)  # fmt: skip
    rows = pq.read_table(out / "rounds.parquet").to_pylist()
    clients = pq.read_table(out / "clients.parquet").to_pylist()
    # TensorBoard: the event files in the run folder, read back
    tb = scalars(out / "tensorboard")
    assert [s for s, _ in tb["test/accuracy"]] == [0, 1, 2]
    for (_, value), row in zip(tb["test/accuracy"], rows, strict=True):
        assert value == pytest.approx(row["test_accuracy"], rel=1e-6)  # float32
    up = [sum(c["bytes_up"] for c in clients if c["round"] == r) for r in range(3)]
    assert [v for _, v in tb["bytes/up"]] == up
    assert [v for _, v in tb["participation/selected"]] == [3.0] * 3
    # MLflow: one run, the scenario as parameters, the same metrics (float64)
    run_id = (out / "mlflow_run_id").read_text().strip()
    run = mlflow_store.get_run(run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "run"
    assert run.data.params["seed"] == "0" and run.data.params["rounds"] == "3"
    assert run.data.params["fleet.groups.0.count"] == "6"
    hist = mlflow_store.get_metric_history(run_id, "test/loss")
    assert [(m.step, m.value) for m in hist] == [
        (r["round"], r["test_loss"]) for r in rows
    ]
    assert mlflow_store.get_experiment(run.info.experiment_id).name == "tracked"


def interrupt_after_round(monkeypatch, last: int) -> None:
    """Stop the next in-process run once round ``last`` is recorded (its
    row sent to the trackers), as Ctrl-C at that moment would."""
    import fedsim.runtime

    record = fedsim.runtime._Run.record

    def record_then_stop(self, t, *args, **kwargs):
        record(self, t, *args, **kwargs)
        if t == last:
            raise KeyboardInterrupt

    monkeypatch.setattr(fedsim.runtime._Run, "record", record_then_stop)


@pytest.mark.slow  # MLflow's import and store: seconds of CPU
def test_a_resume_logs_into_the_runs_it_started_each_round_once(
    tmp_path, mlflow_store, monkeypatch
):
    pytest.importorskip("tensorboard")
    # Prepare: 4 rounds, a checkpoint every 2, interrupted after round 2
    # (so the resume starts from round 2's checkpoint: round 2 runs again)
    out = tmp_path / "run"
    log = ["--log", "mlflow", "--log", "tensorboard"]
    args = ["run", str(TINY), "--workers", "0", "--out", str(out), "-q", *log,
            "--set", "checkpoint.every_rounds=2", "--set", "rounds=4",
            "--set", "name=resumed", "--no-report"]  # fmt: skip
    with monkeypatch.context() as mp:
        interrupt_after_round(mp, 2)
        assert fedsim_here(*args).returncode == 130
    run_id = (out / "mlflow_run_id").read_text().strip()
    assert mlflow_store.get_run(run_id).info.status == "KILLED"
    logged = mlflow_store.get_metric_history(run_id, "time/sim_s")
    assert [m.step for m in logged] == [0, 1, 2]  # round 2 was logged

    # Execute
    fedsim_here("run", "--resume", str(out), "-q", *log, check=True)

    # Assert: the same MLflow run, finished, holding every round once, as
    # rounds.parquet has it
    assert (out / "mlflow_run_id").read_text().strip() == run_id
    run = mlflow_store.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert len(mlflow_store.search_runs([run.info.experiment_id])) == 1
    rows = pq.read_table(out / "rounds.parquet").to_pylist()
    for tag, key in (("time/sim_s", "sim_time"), ("test/loss", "test_loss")):
        hist = mlflow_store.get_metric_history(run_id, tag)
        assert [(m.step, m.value) for m in hist] == [
            (r["round"], r[key]) for r in rows
        ], tag
    # ... and TensorBoard's event files (both attempts' files) each round once
    tb = scalars(out / "tensorboard")
    assert [s for s, _ in tb["time/sim_s"]] == [0, 1, 2, 3]
    assert len(list((out / "tensorboard").glob("events.out.tfevents.*"))) == 2


@pytest.mark.slow  # MLflow's import and store: seconds of CPU
def test_an_overwritten_run_starts_new_tracker_runs(tmp_path, mlflow_store):
    pytest.importorskip("tensorboard")
    # Prepare: a finished run in the folder
    out = tmp_path / "run"
    args = ["run", str(TINY), "--workers", "0", "--out", str(out), "-q", "--log",
            "mlflow", "--log", "tensorboard", "--set", "name=overwritten",
            "--no-report"]  # fmt: skip
    fedsim_here(*args, check=True)
    first = (out / "mlflow_run_id").read_text().strip()

    # Execute: the same folder, --overwrite
    fedsim_here(*args, "--overwrite", check=True)

    # Assert: a new MLflow run beside the old one (both finished, each with
    # its own rounds), and only the new run's event files
    second = (out / "mlflow_run_id").read_text().strip()
    assert second != first
    for run_id in (first, second):
        assert mlflow_store.get_run(run_id).info.status == "FINISHED"
        steps = [m.step for m in mlflow_store.get_metric_history(run_id, "time/sim_s")]
        assert steps == [0, 1]
    assert [s for s, _ in scalars(out / "tensorboard")["time/sim_s"]] == [0, 1]


@pytest.mark.slow  # MLflow's import and store: seconds of CPU
def test_a_failed_run_ends_its_mlflow_run_as_failed(tmp_path, mlflow_store):
    # Execute: a learning rate that diverges in the first round (exit 1)
    out = tmp_path / "run"
    res = fedsim_here("run", str(TINY), "--workers", "0", "--out", str(out), "-q",
                      "--log", "mlflow", "--set", "client.lr=1e20", "--set",
                      "rounds=2", "--set", "name=failing", "--no-report")  # fmt: skip

    # Assert: the run diverged, and MLflow says it failed
    assert res.returncode == 1, res.stdout + res.stderr
    run = mlflow_store.get_run((out / "mlflow_run_id").read_text().strip())
    assert run.info.status == "FAILED"
    assert mlflow_store.get_metric_history(run.info.run_id, "time/sim_s")


@pytest.mark.slow  # MLflow's import and store: seconds of CPU
def test_compare_logs_one_run_per_arm_and_seed_grouped(tmp_path, mlflow_store):
    pytest.importorskip("tensorboard")
    from fedsim.tools.compare import compare

    arms = ["fedavg", "fedprox:mu=0.1"]
    compare(TINY, arms, seeds=2, overrides=["rounds=2", "name=compared"],
            out_dir=tmp_path, log=["tensorboard", "mlflow"])  # fmt: skip
    folders = sorted(p.name for p in (tmp_path / "tensorboard").iterdir())
    assert len(folders) == 4 and folders[0].endswith("seed0")
    sums = []
    for f in folders:
        tb = scalars(tmp_path / "tensorboard" / f)
        assert [s for s, _ in tb["test/loss"]] == [0, 1]
        assert [s for s, _ in tb["bytes/down"]] == [0, 1]
        sums.append(tuple(sum(v for _, v in tb[k]) for k in ("bytes/down", "bytes/up")))
    # each run's bytes down and up per round add up to its totals
    runs = pq.read_table(tmp_path / "compare.parquet").to_pylist()
    assert sorted(sums) == sorted((r["bytes_down"], r["bytes_up"]) for r in runs)
    assert all(down > 0 for down, _ in sums)
    exp = mlflow_store.get_experiment_by_name("compare-compared")
    runs = mlflow_store.search_runs([exp.experiment_id])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(parents) == 1 and len(children) == 4
    assert {r.data.tags["mlflow.parentRunId"] for r in children} == {
        parents[0].info.run_id
    }
    assert sorted((r.data.tags["fedsim.arm"], r.data.tags["fedsim.seed"])
                  for r in children) == sorted(
        (a, str(s)) for a in arms for s in (0, 1)
    )  # fmt: skip


def test_a_missing_tracker_library_exits_2_naming_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "mlflow", None)  # import fails
    r = fedsim_here("run", str(TINY), "--workers", "0", "--out", str(tmp_path / "r"),
                    "--log", "mlflow")  # fmt: skip
    assert r.returncode == 2
    assert "fedsim[track]" in r.stderr and "--log mlflow" in r.stderr
    assert not (tmp_path / "r").exists(), "refused before anything was written"
    r = fedsim_here("run", str(TINY), "--log", "wandb")
    assert r.returncode == 2 and "expected one of tensorboard, mlflow" in r.stderr


# ------------------------------------------------ trackers checked up front
def closed_port() -> int:
    """A loopback port nothing listens on (bound, then let go)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_file_where_the_tensorboard_folder_goes_is_refused_before_training(
    tmp_path,
):
    pytest.importorskip("tensorboard")
    # Prepare: the run folder holds a file named tensorboard
    out = tmp_path / "run"
    out.mkdir()
    (out / "tensorboard").write_text("mine")

    # Execute
    r = fedsim_here("run", str(TINY), "--workers", "0", "--out", str(out),
                    "--log", "tensorboard")  # fmt: skip

    # Assert: exit 2, one line naming the file, nothing run or written
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert f"--log tensorboard: {out / 'tensorboard'} is a file" in r.stderr
    assert sorted(p.name for p in out.iterdir()) == ["tensorboard"]
    assert (out / "tensorboard").read_text() == "mine"


@pytest.mark.parametrize(
    "uri, why",
    [
        ("garbage://x", "unsupported URI 'garbage://x'"),
        ("http://127.0.0.1:{port}", "Connection refused"),
        ("sqlite:////proc/fedsim-nowhere/mlflow.db", "No such file or directory"),
        ("sqlite:///{tmp}/a-file/mlflow.db", "File exists"),  # mkdir says
    ],
    ids=["garbage", "closed-port", "unwritable", "under-a-file"],
)
@pytest.mark.parametrize("command", ["run", "compare"])
def test_an_mlflow_store_that_cannot_be_used_is_refused_before_training(
    command, uri, why, tmp_path, monkeypatch
):
    pytest.importorskip("mlflow", reason="MLflow is the optional extra fedsim[track]")
    # Prepare: the store MLFLOW_TRACKING_URI names cannot take a run (a
    # closed port: MLflow alone retries it silently for about 4 minutes)
    (tmp_path / "a-file").write_text("")
    uri = uri.format(port=closed_port(), tmp=tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    args = [command, str(TINY), "--workers", "0", "--out", str(out)]
    if command == "compare":
        args += ["-a", "fedavg,fedprox:mu=0.1"]

    # Execute
    r = fedsim_here(*args, "--log", "mlflow")

    # Assert: exit 2, one line naming the tracker, the store and why; the
    # user's MLflow environment as it was; nothing run or written
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    line = r.stderr.strip()
    assert line.startswith(
        f"error: --log mlflow: cannot use the MLflow tracking store {uri}"
    ), line
    assert why in line, line
    assert "MLFLOW_HTTP_REQUEST_MAX_RETRIES" not in os.environ
    assert not out.exists()


@pytest.mark.slow  # a stress grid of two cells
def test_stress_logs_the_bytes_down_and_up_of_every_round(tmp_path):
    pytest.importorskip("tensorboard")
    from fedsim.runtime import run_scenario
    from fedsim.tools.compare import load_variant
    from fedsim.tools.stress import run_stress

    # Execute: two cells, one arm, one seed, in this process
    sweep = {"fleet.groups[0].stragglers.p": [0.0, 0.5]}
    run_stress(TINY, sweep, ["fedavg"], seeds=1, out_dir=tmp_path, workers=0,
               overrides=["rounds=2"], log=["tensorboard"])  # fmt: skip

    # Assert: each run's sums per round, as its own client rows give them
    folders = sorted((tmp_path / "tensorboard").iterdir())
    assert [f.name for f in folders] == ["00-fedavg-seed0", "01-fedavg-seed0"]
    for ci, folder in enumerate(folders):
        cell = {
            "fleet.groups[0].stragglers.p": sweep["fleet.groups[0].stragglers.p"][ci]
        }
        sc = load_variant(str(TINY), "fedavg", 0, ["rounds=2"], cell)[0]
        clients = run_scenario(sc).clients
        tb = scalars(folder)
        for key in ("bytes_down", "bytes_up"):
            want = [sum(c[key] for c in clients if c["round"] == r) for r in (0, 1)]
            assert [v for _, v in tb[key.replace("_", "/")]] == want, key
            assert min(want) > 0
