"""The `fedsim` command: exit codes, messages, run directories."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from fedsim.results import CLIENT_SCHEMA, ROUND_SCHEMA

from .conftest import ROOT, SCENARIOS, fedsim_here

FEDSIM = [sys.executable, "-m", "fedsim.tools.cli"]


def fedsim(*args: str, cwd: Path = ROOT, timeout: float = 300):
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "COLUMNS": "120"}
    return subprocess.run(
        [*FEDSIM, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "s.yaml"
    p.write_text(text)
    return p


QUICK = (SCENARIOS / "quickstart.yaml").read_text()


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        (QUICK.replace("rounds: 40", "rounds: 40\nbogus: 1"), "bogus: unknown key"),
        (QUICK.replace("rounds: 40", "rounds: forty"), "rounds"),
        (QUICK.replace("count: 12", "count: -12"), "fleet.groups[0].count"),
        (QUICK.replace("rounds: 40", ""), "rounds: required field is missing"),
        ("name: [unclosed\n", "malformed YAML"),
        ("!!python/object/apply:os.system ['true']\n", "malformed YAML"),
    ],
)
def test_invalid_scenarios_exit_2_without_traceback(tmp_path, text, needle):
    path = write(tmp_path, text)
    for cmd in (["validate", str(path)], ["run", str(path), "--workers", "0"]):
        r = fedsim(*cmd)
        assert r.returncode == 2, r.stderr
        assert "Traceback" not in r.stderr
        assert str(path) in r.stderr
        assert (
            needle in r.stderr.replace("\n", " ").replace("  ", " ")
            or needle in r.stderr
        )


def test_bad_arguments_exit_2(tmp_path):
    r = fedsim("run", str(SCENARIOS / "quickstart.yaml"), "--workers", "-1")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "Invalid value for '--workers'" in r.stderr, r.stderr
    r = fedsim("run", str(SCENARIOS / "quickstart.yaml"), "--set", "rounds")
    assert r.returncode == 2 and "path.to.key=value" in r.stderr
    r = fedsim("run", str(tmp_path / "missing.yaml"))
    assert r.returncode == 2 and "no such scenario file" in r.stderr


def test_validate_prints_the_resolved_scenario():
    r = fedsim("validate", str(SCENARIOS / "quickstart.yaml"), "--set", "rounds=7")
    assert r.returncode == 0, r.stderr
    assert "rounds: 7" in r.stdout
    assert "window_s: 10" in r.stdout  # defaults are filled in


def test_run_in_process_writes_a_complete_run_dir(tmp_path):
    out = tmp_path / "run"
    r = fedsim_here(
        "run",
        str(SCENARIOS / "quickstart.yaml"),
        "--workers",
        "0",
        "--out",
        str(out),
        "--set",
        "rounds=4",
        "--seed",
        "3",
    )
    assert r.returncode == 0, r.stderr
    # the summary is wrapped at the console's width, wherever it was measured
    assert f"results: {out}" in " ".join(r.stdout.split())
    rounds = pq.read_table(out / "rounds.parquet")
    clients = pq.read_table(out / "clients.parquet")
    assert rounds.schema.equals(ROUND_SCHEMA)
    assert clients.schema.equals(CLIENT_SCHEMA)
    assert rounds.num_rows == 4
    assert clients.num_rows == 4 * 10
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rounds"] == 4 and summary["fedsim_version"]
    assert 0.0 <= summary["final_test_accuracy"] <= 1.0
    resolved = (out / "scenario.yaml").read_text()
    assert "seed: 3" in resolved and "rounds: 4" in resolved
    # atomic writes leave no temporary files behind
    assert not [p for p in out.iterdir() if p.name.startswith(".")]


def test_default_run_dir_is_named_after_the_scenario(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = fedsim_here(
        "run",
        str(SCENARIOS / "quickstart.yaml"),
        "--workers",
        "0",
        "-q",
        "--set",
        "rounds=1",
    )
    assert r.returncode == 0, r.stderr
    (run_dir,) = (tmp_path / "results").iterdir()
    assert run_dir.name.startswith("quickstart-")
    assert (run_dir / "rounds.parquet").exists()


def test_unwritable_results_dir_fails_before_training(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a dir")
    r = fedsim(
        "run",
        str(SCENARIOS / "quickstart.yaml"),
        "--workers",
        "0",
        "--out",
        str(blocker / "run"),
    )
    assert r.returncode == 2
    assert "cannot write results" in r.stderr and "Traceback" not in r.stderr
    assert str(blocker) in " ".join(r.stderr.split()), r.stderr  # names the --out


def test_too_little_disk_for_checkpoints_fails_before_training(tmp_path, monkeypatch):
    # Prepare: a file system that reports 100 kB free; SCAFFOLD's checkpoints
    # hold a control variate per client (31 model-sized vectors, twice)
    import shutil

    from typer.testing import CliRunner

    from fedsim.tools.cli import app

    real = shutil.disk_usage
    monkeypatch.setattr(
        shutil, "disk_usage", lambda path: real(path)._replace(free=100_000)
    )
    args = ["run", str(SCENARIOS / "quickstart.yaml"), "--workers", "0", "-q"]
    args += ["--no-report", "--set", "algorithm={name: scaffold}"]

    # Execute
    r = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "run")])
    off = CliRunner().invoke(
        app,
        [*args, "--out", str(tmp_path / "off"), "--set", "checkpoint.every_rounds=0"]
        + ["--set", "rounds=3"],
    )

    # Assert: exit 2 before training, naming the sizes and the way out
    assert r.exit_code == 2, r.output
    assert "checkpoints need about 1.1 MiB of disk" in r.stderr
    assert "only 0.1 MiB are free" in r.stderr and "every_rounds: 0" in r.stderr
    assert not (tmp_path / "run" / "rounds.parquet").exists()
    assert off.exit_code == 0 and (tmp_path / "off" / "rounds.parquet").exists()


def test_out_holding_a_run_is_refused_and_overwrite_replaces_it(tmp_path):
    # Prepare: a finished run, and a file of the user's in the same folder
    out = tmp_path / "run"
    args = ["run", str(SCENARIOS / "quickstart.yaml"), "--workers", "0", "-q"]
    first = fedsim_here(*args, "--set", "rounds=3", "--out", str(out), "--no-report")
    assert first.returncode == 0, first.stderr
    (out / "notes.txt").write_text("mine")
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}

    # Execute: the same --out again, without and with --overwrite
    again = fedsim_here(*args, "--set", "rounds=2", "--out", str(out), "--no-report")
    kept = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    over = fedsim_here(*args, "--set", "rounds=2", "--out", str(out), "--overwrite")

    # Assert: refused with exit 2 and nothing touched; then replaced whole
    assert again.returncode == 2 and "--overwrite" in again.stderr
    assert kept == before
    assert over.returncode == 0, over.stderr
    assert pq.read_table(out / "rounds.parquet").num_rows == 2
    assert json.loads((out / "summary.json").read_text())["rounds"] == 2
    assert (out / "notes.txt").read_text() == "mine"  # not a result file
    assert (out / "report.md").exists()


def test_a_run_never_writes_over_its_own_scenario_file(tmp_path):
    src = tmp_path / "scenario.yaml"
    src.write_text((SCENARIOS / "ci" / "tiny-synthetic.yaml").read_text() + "# mine\n")
    p = fedsim("run", str(src), "--workers", "0", "--out", str(tmp_path), "-q")
    assert p.returncode == 2 and "its own scenario file" in p.stderr
    assert src.read_text().endswith("# mine\n")


def test_a_resume_may_move_the_work_but_not_change_the_experiment(tmp_path):
    # Prepare: a run stopped after 2 of 4 rounds (as if its server's node
    # was lost), its checkpoint at round 2
    out = tmp_path / "run"
    args = ["run", str(SCENARIOS / "ci" / "tiny-synthetic.yaml"), "-q"]
    args += ["--workers", "0", "--no-report", "--out", str(out)]
    first = fedsim_here(
        *args, "--set", "rounds=2", "--set", "checkpoint.every_rounds=1"
    )
    assert first.returncode == 0, first.stderr
    text = (out / "scenario.yaml").read_text().replace("rounds: 2", "rounds: 4")
    (out / "scenario.yaml").write_text(text)

    # Execute: a --set of the experiment, then one of where the work runs
    refused = fedsim_here("run", "--resume", str(out), "--set", "client.lr=0.5")
    moved = fedsim_here(
        *("run", "--resume", str(out), "-q", "--no-report"),
        *("--set", "resources.placement=pack"),
    )

    # Assert: the first refused, naming what a resume takes; the second
    # resumed, and the run directory's scenario says where it now runs
    assert refused.returncode == 2
    assert "--set resources." in " ".join(refused.stderr.split())
    assert moved.returncode == 0, moved.stderr
    assert pq.read_table(out / "rounds.parquet").num_rows == 4
    assert "placement: pack" in (out / "scenario.yaml").read_text()
