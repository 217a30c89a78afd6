"""Never lose work: resume after a real kill, worker faults, divergence."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch

from fedsim.results import WALL_CLOCK_COLUMNS
from fedsim.runtime import run_scenario
from fedsim.scenario import load_scenario

from .conftest import ROOT, SCENARIOS, WAIT_S, fedsim_here

QUICK = SCENARIOS / "quickstart.yaml"
ENV = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}


def fedsim(*args: str, **kw):
    return subprocess.Popen(
        [sys.executable, "-m", "fedsim.tools.cli", *args],
        cwd=ROOT,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kw,
    )


def in_process(scenario: Path, *args: str, **kw):
    """`fedsim run SCENARIO --workers 0 -q ARGS...`, started, not waited for."""
    return fedsim("run", str(scenario), "--workers", "0", "-q", *args, **kw)


def comparable(rows: list[dict]) -> list[dict]:
    """Rows without wall-clock columns, NaN made comparable."""
    return [
        {
            k: ("nan" if isinstance(v, float) and math.isnan(v) else v)
            for k, v in r.items()
            if k not in WALL_CLOCK_COLUMNS
        }
        for r in rows
    ]


def table(run_dir: Path, name: str) -> list[dict]:
    return comparable(pq.read_table(run_dir / name).to_pylist())


def checkpoint_round(run_dir: Path) -> int:
    try:
        name = (run_dir / "LATEST").read_text().strip()
        return json.loads((run_dir / name / "meta.json").read_text())["next_round"]
    except (OSError, ValueError, KeyError):
        return 0


# Long enough that a write failing near round 50 (clients.parquet passing
# 28 kB) lands before the end, and that a kill after the checkpoint at round
# 20 leaves 40 rounds to run: a kill lands within a poll (20 ms) of the
# checkpoint, far less than 40 rounds take even on busy cores.
QUICK_ROUNDS = 60
# The kill lands once a checkpoint at or after this round exists.
KILL_AFTER = 20


def reference_run(scenario: Path, rounds: int, out: Path) -> Path:
    """An uninterrupted run (results do not depend on how often it saves),
    in this process."""
    args = ["--workers", "0", "-q", "--no-report", "--set", f"rounds={rounds}"]
    fedsim_here("run", str(scenario), *args, "--out", str(out), check=True)
    return out


@pytest.fixture(scope="module")
def quick_reference(tmp_path_factory) -> Path:
    return reference_run(QUICK, QUICK_ROUNDS, tmp_path_factory.mktemp("ref") / "ref")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("scenario", "rounds"),
    [
        (QUICK, QUICK_ROUNDS),
        # explore: the asynchronous repeat (CI runs it when its budget allows)
        pytest.param(SCENARIOS / "async-fedbuff.yaml", 120, marks=pytest.mark.explore),
    ],
    ids=["sync", "async"],
)
def test_resume_after_killing_the_driver_gives_identical_results(
    tmp_path, scenario, rounds, request
):
    args = ["--no-report", "--set", f"rounds={rounds}"]
    args += ["--set", "checkpoint.every_rounds=10"]
    # Prepare: an uninterrupted reference run
    if scenario == QUICK:
        ref_dir = request.getfixturevalue("quick_reference")
    else:
        ref_dir = reference_run(scenario, rounds, tmp_path / "ref")

    # Execute: start the same run, kill -9 the driver once a checkpoint exists
    run_dir = tmp_path / "killed"
    proc = in_process(scenario, *args, "--out", str(run_dir))
    deadline = time.monotonic() + WAIT_S
    while checkpoint_round(run_dir) < KILL_AFTER and proc.poll() is None:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the run finished before the kill"
    killed_at = checkpoint_round(run_dir)
    assert KILL_AFTER <= killed_at < rounds
    # In process, as the killed run was: the quickstart's `workers: auto`
    # would start an embedded Ray in this pytest process, kept (and
    # costing CPU) until its last test. A resume on Ray workers is
    # test_server_actor's and test_async_sim's.
    resume = ["--workers", "0", "-q", "--no-report"]
    fedsim_here("run", "--resume", str(run_dir), *resume, check=True)

    # Assert: the resumed run's results equal the uninterrupted run's
    assert table(run_dir, "rounds.parquet") == table(ref_dir, "rounds.parquet")
    assert table(run_dir, "clients.parquet") == table(ref_dir, "clients.parquet")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["rounds"] == rounds


def _limit_file_size(limit: int):
    def preexec():
        import resource

        # Python ignores SIGXFSZ, so an oversize write fails with EFBIG, as a
        # write to a full disk fails with ENOSPC
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return preexec


@pytest.mark.slow
def test_a_failing_write_loses_nothing_and_the_run_resumes(tmp_path, quick_reference):
    # Prepare: the same run as the reference in a process that cannot write a
    # file past 28 kB (clients.parquet outgrows that near round 50; the
    # files written before training, scenario.yaml and partition.parquet,
    # are about 3 and 5 kB)
    args = ["--no-report", "--set", f"rounds={QUICK_ROUNDS}"]
    args += ["--set", "checkpoint.every_rounds=5"]
    run_dir = tmp_path / "run"

    # Execute
    p = in_process(
        QUICK, *args, "--out", str(run_dir), preexec_fn=_limit_file_size(28_000)
    )
    assert p.wait(timeout=600) == 1
    err = " ".join(p.stderr.read().split())  # as one line, whatever the width

    # Assert: a clear message; every file on disk whole; then resume
    assert "cannot write results" in err and "Traceback" not in err, err
    assert "File too large" in err and "clients.parquet'" in err
    assert f"fedsim run --resume {run_dir}" in err
    assert not list(run_dir.rglob("*.tmp"))
    written = table(run_dir, "clients.parquet")
    reference = table(quick_reference, "clients.parquet")
    assert 0 < len(written) < len(reference)
    assert written == reference[: len(written)]
    stopped_at = checkpoint_round(run_dir)
    assert 0 < stopped_at < QUICK_ROUNDS
    # in process, as the failed run was (see the test above)
    resume = ["--workers", "0", "-q", "--no-report"]
    fedsim_here("run", "--resume", str(run_dir), *resume, check=True)
    assert table(run_dir, "rounds.parquet") == table(quick_reference, "rounds.parquet")
    assert table(run_dir, "clients.parquet") == reference


def test_a_write_failing_before_training_exits_2_without_traceback(tmp_path):
    # 4 kB: scenario.yaml fits, partition.parquet does not
    p = in_process(
        QUICK, "--out", str(tmp_path / "run"), preexec_fn=_limit_file_size(4_000)
    )
    assert p.wait(timeout=WAIT_S) == 2
    err = " ".join(p.stderr.read().split())
    assert "cannot write results" in err and "partition.parquet'" in err
    assert "Traceback" not in err
    assert not list((tmp_path / "run").glob("*.tmp"))


def test_resume_without_checkpoint_is_a_clear_error(tmp_path):
    run_dir = tmp_path / "run"
    p = in_process(
        QUICK,
        *["--no-report", "--out", str(run_dir), "--set", "rounds=2"],
        *["--set", "checkpoint.every_rounds=0"],
    )
    assert p.wait(timeout=WAIT_S) == 0
    before = table(run_dir, "rounds.parquet")
    p = fedsim("run", "--resume", str(run_dir))
    assert p.wait(timeout=WAIT_S) == 2
    err = p.stderr.read()
    assert "no checkpoint to resume from" in err and "Traceback" not in err
    # the failed resume left the results it found as they were
    assert table(run_dir, "rounds.parquet") == before and len(before) == 2


def test_divergence_stops_with_a_clear_message_and_keeps_the_checkpoint(tmp_path):
    run_dir = tmp_path / "run"
    p = in_process(
        QUICK,
        *["--out", str(run_dir), "--set", "rounds=30"],
        *["--set", "checkpoint.every_rounds=1", "--set", "client.lr=1e35"],
    )
    assert p.wait(timeout=WAIT_S) == 1
    err = p.stderr.read()
    assert "run diverged" in err and "Traceback" not in err
    # the last checkpoint is a good one: its parameters are finite
    import torch

    name = (run_dir / "LATEST").read_text().strip()
    state = torch.load(run_dir / name / "server.pt", weights_only=True)
    assert bool(torch.isfinite(state["x"]).all())


def kill_soon(pid: int) -> None:
    """SIGKILL ``pid`` in 5 ms: it lands while the next round (or batch) trains."""

    def later():
        time.sleep(0.005)
        os.kill(pid, signal.SIGKILL)

    threading.Thread(target=later).start()


def record_executors(monkeypatch) -> list:
    """The executors ``run_scenario`` makes from now on, in order: the tests
    read their own worker actors' process ids from them (``pids()``), never
    every ``ray::RayWorker`` on the machine (other runs', other people's)."""
    import fedsim.runtime

    made: list = []
    real = fedsim.runtime.make_executor

    def recording(*args, **kwargs):
        made.append(real(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(fedsim.runtime, "make_executor", recording)
    return made


def live_pids(executor) -> list[int]:
    """The executor's worker actors' process ids; each a live process."""
    import psutil

    pids = executor.pids()
    assert len(set(pids)) == len(pids), pids
    assert all(psutil.pid_exists(p) for p in pids), pids
    return pids


# How long a killed worker of the test below takes to come back: longer than
# the executor's count of attempts for a dead actor lasts (shrunk to 2 there,
# about 2 s of back-off), as a restart can on a loaded machine (a new process
# importing torch: it took over 45 s once, when the count was 8).
SLOW_RESTART_S = 6.0


def slow_to_restart(monkeypatch) -> None:
    """Make the executors' worker actors from now on slow to restart (their
    constructor sleeps ``SLOW_RESTART_S`` when Ray restarts them) and fresh
    (not warm ones taken over from earlier tests, nor parked after)."""
    import fedsim.remote.executor

    class SlowToRestart(fedsim.remote.executor.RayWorker):
        # defined in the function, so Ray ships the class itself to the actor
        def __init__(self, *args):
            import ray

            if ray.get_runtime_context().was_current_actor_reconstructed:
                time.sleep(SLOW_RESTART_S)
            super().__init__(*args)

    monkeypatch.setattr(
        fedsim.remote.executor.RayExecutor, "worker_class", SlowToRestart
    )
    never_parks = classmethod(lambda _cls, _resources: None)
    monkeypatch.setattr(fedsim.remote.executor.ActorShape, "of_workers", never_parks)
    fewer = fedsim.remote.executor.RetryPolicy(max_deaths=2)
    monkeypatch.setattr(fedsim.remote.executor.RayExecutor, "retry", fewer)


@pytest.mark.ray
@pytest.mark.slow
def test_killed_worker_is_replaced_and_results_are_identical(ray_session, monkeypatch):
    sc = load_scenario(QUICK, ["rounds=8", "client.batch_size=5"])
    # the reference in process: results do not depend on the workers
    # (test_determinism), so this also asks the killed run to match it
    clean = run_scenario(sc, workers=0)
    clean_rows, clean_clients = clean.rows, clean.clients
    made = record_executors(monkeypatch)
    # the executor waits for a restart by time, not by its count of attempts
    slow_to_restart(monkeypatch)

    killed: list[tuple[int, int]] = []
    later_pids: list[int] = []

    def kill_a_worker(row, _clients):
        if row["round"] == 6:
            later_pids.extend(live_pids(made[-1]))
        if row["round"] in (1, 4):  # each killed while the next round trains
            pids = live_pids(made[-1])
            assert len(pids) == 2
            pid = pids[row["round"] % 2]
            kill_soon(pid)
            killed.append((row["round"], pid))

    sim = run_scenario(sc, workers=2, on_round=kill_a_worker)
    rows, clients = sim.rows, sim.clients
    assert len(killed) == 2 and len(made) == 1 and len(later_pids) == 2
    # both killed processes were replaced by new ones (Ray restarted the actors)
    assert not {pid for _, pid in killed} & set(later_pids)
    assert made[-1].tasks_retried > 0

    assert comparable(rows) == comparable(clean_rows)
    assert comparable(clients) == comparable(clean_clients)
    assert bool((sim.final_params == clean.final_params).all())


# explore: the asynchronous twin of the test above (the same executor's
# retry; CI runs it after the suite when its budget allows)
@pytest.mark.explore
@pytest.mark.ray
@pytest.mark.slow
def test_a_worker_killed_in_an_async_run_is_replaced_with_identical_results(
    ray_session, monkeypatch
):
    sc = load_scenario(SCENARIOS / "async-fedbuff.yaml", ["rounds=40"])
    clean = run_scenario(sc, workers=0)  # in process, as above
    clean_rows, clean_clients = clean.rows, clean.clients
    made = record_executors(monkeypatch)
    killed: list[int] = []
    later_pids: list[int] = []

    def kill_a_worker(row, _clients):
        if row["round"] == 35:
            later_pids.extend(live_pids(made[-1]))
        if row["round"] in (5, 20):
            pids = live_pids(made[-1])
            assert len(pids) == 2
            pid = pids[len(killed) % 2]
            kill_soon(pid)
            killed.append(pid)

    sim = run_scenario(sc, workers=2, on_round=kill_a_worker)
    rows, clients = sim.rows, sim.clients
    assert len(killed) == 2 and len(later_pids) == 2 and len(made) == 1
    assert not set(killed) & set(later_pids)  # Ray restarted both actors
    assert comparable(rows) == comparable(clean_rows)
    assert comparable(clients) == comparable(clean_clients)
    assert torch.equal(sim.final_params, clean.final_params)


def test_a_restarting_actor_is_waited_for_by_time_and_a_dead_one_by_count():
    # The cases of RetryPolicy's table, each computed by hand (the executor
    # marks a failure ``restarting`` for ActorUnavailableError, a death for
    # RayActorError and StaleWorkerError: fedsim.remote.actors.CallFailures)
    from fedsim.remote.actors import Attempts, CallFailures, RetryPolicy

    policy = RetryPolicy()
    deaths, wait = policy.max_deaths, policy.restart_wait_s

    def restarting(n: int, waited: float) -> Attempts:
        return Attempts(n, 0, waited, restarting=True)

    # back-off 1, 2, 4, 8 s, then 10 s
    delays = [policy.after(restarting(n, 0.0)) for n in range(1, 8)]
    assert delays == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0, 10.0]
    # a restart is waited for well past the count, until the time budget
    assert policy.after(restarting(100, wait - 1)) == 10.0
    assert policy.after(restarting(100, wait)) is None
    # an actor that failed at once is resent max_deaths - 1 times, however soon
    assert policy.after(Attempts(deaths, deaths - 1, 0.0)) == 10.0
    assert policy.after(Attempts(deaths, deaths, 0.0)) is None
    # restarts in between do not use up a dead actor's attempts
    assert policy.after(Attempts(50, 2, 30.0)) == 10.0
    # the executor's count: two deaths and a restart of call 3, 5 s apart
    calls = CallFailures()
    calls.record(3, restarting=False, now=100.0)
    calls.record(3, restarting=True, now=102.0)
    assert calls.record(3, restarting=False, now=105.0) == Attempts(3, 2, 5.0)
