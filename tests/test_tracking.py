"""Runs in TensorBoard and MLflow (fedsim/tools/tracking.py, issue 41), checked
against the real libraries: the event files read back with TensorBoard's
own reader, the MLflow store queried through MLflow's client, each value
equal to the run's rounds.parquet."""

from __future__ import annotations

import math
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
def test_a_resume_logs_into_the_mlflow_run_it_started(
    tmp_path, mlflow_store, monkeypatch
):
    # Prepare: 4 rounds, a checkpoint every 2, interrupted after round 2
    # (so the resume starts from round 2's checkpoint: round 2 runs again)
    out = tmp_path / "run"
    args = ["run", str(TINY), "--workers", "0", "--out", str(out), "-q", "--log",
            "mlflow", "--set", "checkpoint.every_rounds=2", "--set", "rounds=4",
            "--set", "name=resumed", "--no-report"]  # fmt: skip
    with monkeypatch.context() as mp:
        interrupt_after_round(mp, 2)
        assert fedsim_here(*args).returncode == 130
    run_id = (out / "mlflow_run_id").read_text().strip()
    assert mlflow_store.get_run(run_id).info.status == "KILLED"

    # Execute
    fedsim_here("run", "--resume", str(out), "-q", "--log", "mlflow", check=True)

    # Assert: the same MLflow run, finished, holding every round
    assert (out / "mlflow_run_id").read_text().strip() == run_id
    run = mlflow_store.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert len(mlflow_store.search_runs([run.info.experiment_id])) == 1
    hist = mlflow_store.get_metric_history(run_id, "time/sim_s")
    assert sorted({m.step for m in hist}) == [0, 1, 2, 3]


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
    for f in folders:
        assert [s for s, _ in scalars(tmp_path / "tensorboard" / f)["test/loss"]] == [
            0,
            1,
        ]
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
