"""The one runtime: both modes share the selector, the bytes rule, the
divergence handling, compare and stress (each of these drifted between the
synchronous and the asynchronous copies of the loop before they were one)."""

from __future__ import annotations

import json
import math

import numpy as np
import pyarrow.parquet as pq
import pytest

from fedsim.runtime import run_scenario
from fedsim.scenario import load_scenario
from fedsim.tools.compare import compare
from fedsim.tools.stress import run_stress

from .conftest import SCENARIOS, WAIT_S, assert_figure

FEDBUFF = SCENARIOS / "async-fedbuff.yaml"
QUICK = SCENARIOS / "quickstart.yaml"


def jobs_per_client(clients: list[dict]) -> np.ndarray:
    counts = np.zeros(30, dtype=np.int64)
    for c in clients:
        counts[c["client_id"]] += 1
    return counts


# ------------------------------------------------- the selector, async too
def test_the_selector_decides_which_device_starts_an_async_job():
    # Prepare: always-online devices and very uneven data shares, so a
    # data-weighted selector must favour the big clients
    base = [
        "rounds=40",
        "data.size_sigma=2.0",
        "fleet.groups[0].availability={kind: always}",
    ]
    uniform = load_scenario(FEDBUFF, base)
    weighted = load_scenario(
        FEDBUFF, [*base, "selector={name: weighted, clients_per_round: 15}"]
    )

    # Execute
    ru = run_scenario(uniform)
    rw = run_scenario(weighted)

    # Assert: with the weighted selector the big clients start more jobs
    # (a selector that was ignored would give identical runs)
    assert [c["client_id"] for c in ru.clients] != [c["client_id"] for c in rw.clients]
    n = ru.data.n_samples
    big = np.argsort(-n)[:5]
    assert (
        jobs_per_client(rw.clients)[big].sum() > jobs_per_client(ru.clients)[big].sum()
    )


def test_the_uniform_selector_keeps_the_timelines_own_uniform_stream():
    # The uniform selector, asked through the chooser, reproduces the
    # timeline's default choice (pinned by tests/data/clock_golden.json).
    from fedsim.clock import AsyncTimeline
    from fedsim.runtime import _Run, async_timeline

    sc = load_scenario(FEDBUFF, ["rounds=25"])
    run = _Run(sc, None, None)
    plain = AsyncTimeline(
        run.fleet,
        sc.round,
        versions=sc.rounds,
        buffer_size=sc.algorithm.buffer_size,
        concurrency=sc.round.concurrency,
        seed=sc.seed,
        ctx=run.ctx,
    )
    assert list(async_timeline(sc)) == list(plain)


# ------------------------------------------------------------ bytes
def test_sync_bills_the_upload_of_late_updates_and_not_of_dropouts():
    # Prepare: a deadline that some devices miss, and mid-round dropouts
    sc = load_scenario(
        SCENARIOS / "fleets" / "edge-boxes.yaml",
        ["rounds=6", "round.deadline_s=40", "fleet.groups[0].stragglers.dropout_p=0.3"],
    )

    # Execute
    clients = run_scenario(sc).clients

    # Assert
    full = max(c["bytes_up"] for c in clients)
    by_reason: dict[str, set[int]] = {}
    for c in clients:
        by_reason.setdefault(c["drop_reason"], set()).add(c["bytes_up"])
    assert by_reason[""] == {full} and full > 0
    assert by_reason["late"] == {full}  # it was sent; the server had stopped
    assert by_reason["dropout"] == {0}  # it never finished uploading


def test_async_bills_stale_uploads_and_not_dropouts():
    sc = load_scenario(
        FEDBUFF,
        [
            "rounds=60",
            "round.max_staleness=2",
            "fleet.groups[1].stragglers.dropout_p=0.3",
        ],
    )
    clients = run_scenario(sc).clients
    full = max(c["bytes_up"] for c in clients)
    by_reason: dict[str, set[int]] = {}
    for c in clients:
        by_reason.setdefault(c["drop_reason"], set()).add(c["bytes_up"])
    assert by_reason[""] == {full} and by_reason["stale"] == {full}
    assert by_reason["dropout"] == {0}
    assert by_reason.get("offline", {0}) == {0}


# ------------------------------------------------------- divergence
@pytest.mark.parametrize("scenario", [QUICK, FEDBUFF], ids=["sync", "async"])
def test_a_diverging_run_returns_its_rows_and_says_where(scenario):
    sc = load_scenario(scenario, ["rounds=20", "client.lr=1e37"])
    res = run_scenario(sc)
    assert res.status == "diverged" and res.final_params is None
    assert ("round" if scenario == QUICK else "version") in res.message
    assert len(res.rows) < 20


def test_stress_records_a_diverging_async_run(tmp_path):
    out = run_stress(
        FEDBUFF,
        {"client.lr": [0.05, 1e37]},
        ["fedbuff"],
        seeds=1,
        out_dir=tmp_path,
        workers=0,
        overrides=["rounds=6"],
    )
    table = pq.read_table(out / "stress.parquet").to_pylist()
    assert [r["diverged"] for r in table] == [False, True]
    assert {r["mode"] for r in table} == {"async"}


def test_compare_runs_an_async_scenario(tmp_path):
    rows = compare(
        FEDBUFF,
        ["fedbuff", "fedasync:alpha=0.5"],
        seeds=1,
        overrides=["rounds=4"],
        out_dir=tmp_path,
    )
    assert [r["algorithm"] for r in rows] == ["fedbuff", "fedasync:alpha=0.5"]
    assert {r["mode"] for r in rows} == {"async"}
    runs = pq.read_table(tmp_path / "compare.parquet").to_pylist()
    assert all(math.isfinite(r["final_accuracy"]) for r in runs)
    assert "(async)" in (tmp_path / "compare.md").read_text()
    assert_figure(tmp_path / "compare.png", (16, 4.2))


def test_compare_moves_an_async_rule_to_the_async_timeline_and_refuses_twins():
    rows = compare(QUICK, ["fedavg", "fedbuff"], seeds=1, overrides=["rounds=2"])
    assert [r["mode"] for r in rows] == ["sync", "async"]
    with pytest.raises(ValueError, match="fedavg given twice"):
        compare(QUICK, ["fedavg", "fedavg"], seeds=1, overrides=["rounds=2"])


# ------------------------------------------------------ no run can hang
def test_an_async_run_where_no_job_can_finish_stops_with_a_message(tmp_path):
    # Prepare: every device drops out of every job (the run used to loop
    # forever with no output while memory grew)
    import subprocess
    import sys

    over = [f"fleet.groups[{g}].stragglers.dropout_p=1.0" for g in range(3)]
    args = [a for o in over for a in ("--set", o)]
    cmd = [
        sys.executable,
        "-m",
        "fedsim.tools.cli",
        "run",
        str(FEDBUFF),
        "--workers",
        "0",
    ]
    cmd += [*args, "--out", str(tmp_path / "run"), "--no-report", "--quiet"]

    # Execute, with a time bound
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=WAIT_S)

    # Assert
    assert p.returncode == 1, p.stderr
    assert "run stalled" in p.stderr and "dropout" in p.stderr
    assert "Traceback" not in p.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "stalled" and summary["rounds"] == 0


def test_a_run_where_no_update_arrives_is_flagged_degenerate():
    drop = [f"fleet.groups[{g}].stragglers.dropout_p=1.0" for g in range(3)]
    res = run_scenario(load_scenario(QUICK, ["rounds=3", *drop]))
    assert res.status == "completed"
    assert res.summary()["degenerate"] == "no update ever reached the server"
    assert run_scenario(load_scenario(QUICK, ["rounds=2"])).degenerate() is None


# ------------------------------------------------------------ batch use
def _cli(*args: str) -> list[str]:
    import sys

    return [sys.executable, "-m", "fedsim.tools.cli", "run", *args]


def test_without_a_terminal_progress_is_plain_lines(tmp_path):
    import subprocess

    out = tmp_path / "run"
    # --no-report: the figures would cost seconds of CPU and show nothing here
    args = ["--workers", "0", "--set", "rounds=20", "--out", str(out), "--no-report"]
    p = subprocess.run(
        _cli(str(QUICK), *args),
        capture_output=True,
        text=True,
        timeout=WAIT_S,
    )
    assert p.returncode == 0, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if " rounds done " in ln]
    # every 10% of the rounds (and the last), however fast the run
    assert [ln.split()[1] for ln in lines] == [f"{k}/20" for k in range(2, 21, 2)]


def test_sigterm_stops_a_run_like_ctrl_c(tmp_path):
    import signal
    import subprocess
    import time

    out = tmp_path / "run"
    args = ["--workers", "0", "--set", "rounds=3000", "--out", str(out)]
    p = subprocess.Popen(
        _cli(str(QUICK), *args, "--set", "checkpoint.every_rounds=5"),
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + WAIT_S
    while not (out / "LATEST").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    p.send_signal(signal.SIGTERM)
    code = p.wait(timeout=WAIT_S)
    err = p.stderr.read() if p.stderr else ""
    assert code == 130, err
    assert f"fedsim run --resume {out}" in err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "interrupted" and 5 <= summary["rounds"] < 3000


def test_compare_bands_are_mean_min_max_over_the_seeds_that_reach():
    import numpy as np

    from fedsim.tools.compare import _band

    # two seeds, evaluated at rounds 0..2 and 0..1 (rounds count from 1)
    a = [{"round": r, "test_accuracy": acc} for r, acc in enumerate([0.2, 0.4, 0.6])]
    b = [{"round": r, "test_accuracy": acc} for r, acc in enumerate([0.4, 0.8])]
    grid = np.array([1.0, 1.5, 2.0, 3.0])
    mean, low, high = _band([a, b], "round", grid)
    np.testing.assert_allclose(mean[:3], [0.3, 0.45, 0.6])
    np.testing.assert_allclose(low[:3], [0.2, 0.3, 0.4])
    np.testing.assert_allclose(high[:3], [0.4, 0.6, 0.8])
    assert np.isnan(mean[3])  # only one seed reaches round 3: no band there


@pytest.mark.ray
def test_compare_on_ray_tasks_equals_in_process(ray_session):
    over = ["rounds=3"]
    local = compare(QUICK, ["fedavg"], seeds=2, overrides=over)
    remote = compare(QUICK, ["fedavg"], seeds=2, overrides=over, workers=2)
    for key in ("final_accuracy", "best_accuracy", "sim_time_s"):
        assert local[0][key] == remote[0][key]


# ------------------------------------------------------------ placement
def test_the_run_knows_d_before_placing_the_server_and_it_is_the_servers():
    # Prepare: d is needed for the bytes and the server's clock before
    # start() asks for the placement, so the run counts it from the model
    from fedsim.executors import InProcessExecutor
    from fedsim.runtime import _Run
    from fedsim.server import Server

    run = _Run(load_scenario(QUICK, ["rounds=1"]), None, None)
    d = run.num_params

    # Execute: the driver side's placement
    run.start(0, False)

    # Assert: the placed server's d is the one every byte count used
    assert isinstance(run.server, Server)
    assert isinstance(run.executor, InProcessExecutor)
    assert run.server.num_params == d
