"""Exit codes of every ``fedsim`` subcommand, one parametrized test.

The contract (fedsim/tools/cli.py's docstring, docs/): 0 success; 1 a run that
failed (diverged); 2 bad input or missing data, with a message and no
traceback; 130 interrupted (Ctrl-C), with the rows written so far kept.

Cases run in-process through typer's CliRunner, except Ctrl-C, which sends
SIGINT to a ``python -m fedsim.tools.cli`` subprocess once its first rows are on
disk. Cases where today's CLI gives another code are ``xfail(strict=True)``
with the code it gives, so that a fix shows up as an XPASS.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from fedsim.tools.cli import app

from .conftest import SCENARIOS, WAIT_S

TINY = str(SCENARIOS / "ci" / "tiny-synthetic.yaml")
QUAD = str(SCENARIOS / "quadratic-objective-inconsistency.yaml")
# The quadratic objective with lr 100 blows up within ~10 rounds.
DIVERGE = ["--set", "client.lr=100", "--set", "rounds=30"]
# tiny-synthetic on MNIST read from an empty folder: DataMissingError
NO_DATA = "data={dataset: mnist, root: %s}"
SWEEP = ["--sweep", "fleet.stragglers.p=0,0.5"]


@dataclass
class Case:
    """One (subcommand, situation): the arguments (``{tmp}`` is the test's
    tmp_path), the code expected, and an optional check of what is on disk.
    Every exit 2 (bad input) names what is wrong: ``says``, a piece of its
    message that names the option, field or file (``{tmp}`` as in args)."""

    args: list[str]
    code: int
    check: Callable[[Path], None] | None = None
    sigint: str = ""  # SIGINT once a file matching this glob has rows
    xfail: str = ""
    marks: list = field(default_factory=list)
    says: str = ""


def rows_kept(name: str) -> Callable[[Path], None]:
    def check(tmp: Path) -> None:
        files = list((tmp / "out").glob(name))
        assert files, f"no {name} kept"
        assert all(pq.read_table(f).num_rows > 0 for f in files)

    return check


def run_rows_and_summary(tmp: Path) -> None:
    rows = pq.read_table(tmp / "out" / "rounds.parquet").num_rows
    assert rows > 0
    summary = json.loads((tmp / "out" / "summary.json").read_text())
    assert summary["rounds"] == rows


def diverged_run(tmp: Path) -> None:
    # the good rows before the divergence are kept, and summarised
    run_rows_and_summary(tmp)


def no_run_dir(tmp: Path) -> None:
    assert not (tmp / "out" / "rounds.parquet").exists()


def a_finished_run(tmp: Path) -> Path:
    r = CliRunner().invoke(
        app,
        ["run", TINY, "--workers", "0", "--out", str(tmp / "done"), "-q"],
    )
    assert r.exit_code == 0, r.output
    return tmp / "done"


CASES: dict[str, Case] = {
    # ------------------------------------------------------------------ run
    "run-ok": Case(
        ["run", TINY, "--workers", "0", "--out", "{tmp}/out", "-q"],
        0,
        run_rows_and_summary,
    ),
    "run-bad-input": Case(
        ["run", TINY, "--workers", "0", "--out", "{tmp}/out", "--set", "rounds=-3"],
        2,
        no_run_dir,
        says="--set rounds=-3: Input should be greater than or equal to 1",
    ),
    "run-sigint": Case(
        ["run", TINY, "--workers", "0", "--out", "{tmp}/out", "-q"]
        + ["--set", "rounds=100000"],
        130,
        run_rows_and_summary,
        sigint="rounds.parquet",
    ),
    "run-diverges": Case(
        ["run", QUAD, "--workers", "0", "--out", "{tmp}/out", "-q", *DIVERGE],
        1,
        diverged_run,
    ),
    "run-missing-data": Case(
        ["run", TINY, "--workers", "0", "--out", "{tmp}/out", "-q"]
        + ["--set", NO_DATA % "{tmp}"],
        2,
        no_run_dir,
        says="in {tmp}/mnist/",
    ),
    "run-resume-with-a-scenario": Case(
        ["run", TINY, "--resume", "{tmp}/done"],
        2,
        says="--resume RUN_DIR takes no scenario",
    ),
    "run-resume-not-a-run-dir": Case(
        ["run", "--resume", "{tmp}"], 2, says="{tmp}: not a run directory"
    ),
    "run-resume-a-finished-run": Case(
        # nothing left to do is not an error, but a resume of a run dir
        # without a checkpoint is: delete the checkpoints
        ["run", "--resume", "{tmp}/done-no-ckpt"],
        2,
        says="{tmp}/done-no-ckpt: no checkpoint to resume from",
    ),
    # ------------------------------------------------------------- validate
    "validate-ok": Case(["validate", TINY], 0),
    "validate-bad-input": Case(
        ["validate", TINY, "--set", "rounds=zero"], 2, says="--set rounds=zero:"
    ),
    "validate-missing-file": Case(
        ["validate", "{tmp}/nope.yaml"], 2, says="{tmp}/nope.yaml: no such"
    ),
    # --------------------------------------------------------------- report
    "report-ok": Case(["report", "{tmp}/done"], 0),
    "report-bad-input": Case(
        ["report", "{tmp}/done", "--timeline-rounds", "0"],
        2,
        says="Invalid value for '--timeline-rounds'",
    ),
    "report-missing-data": Case(  # no rounds.parquet
        ["report", "{tmp}"], 2, says="{tmp} is not a run directory: rounds.parquet"
    ),
    # -------------------------------------------------------------- compare
    "compare-ok": Case(
        ["compare", TINY, "-a", "fedavg,fednova", "--seeds", "1", "-q"]
        + ["--out", "{tmp}/out"],
        0,
        rows_kept("compare.parquet"),
    ),
    "compare-bad-input": Case(
        ["compare", TINY, "-a", "nosuchalgorithm", "--out", "{tmp}/out"],
        2,
        says="algorithm.name: unknown name 'nosuchalgorithm'",
    ),
    "compare-sigint": Case(
        ["compare", TINY, "-a", "fedavg,fednova", "--seeds", "3", "-q"]
        + ["--out", "{tmp}/out", "--set", "rounds=400"],
        130,
        rows_kept("compare.parquet"),
        sigint="compare.parquet",
    ),
    "compare-diverges": Case(
        ["compare", QUAD, "-a", "fedavg", "--seeds", "1", "--out", "{tmp}/out"]
        + DIVERGE,
        1,
        rows_kept("compare.parquet"),
    ),
    "compare-missing-data": Case(
        ["compare", TINY, "-a", "fedavg", "--seeds", "1", "--out", "{tmp}/out"]
        + ["--set", NO_DATA % "{tmp}"],
        2,
        says="in {tmp}/mnist/",
    ),
    # --------------------------------------------------------------- stress
    "stress-ok": Case(
        ["stress", TINY, *SWEEP, "--algorithms", "fedavg", "--seeds", "1"]
        + ["--workers", "0", "--set", "rounds=2", "--out", "{tmp}/out", "-q"],
        0,
        rows_kept("stress.parquet"),
    ),
    "stress-bad-input": Case(
        ["stress", TINY, "--sweep", "nonsense", "--algorithms", "fedavg"]
        + ["--workers", "0", "--out", "{tmp}/out"],
        2,
        says="--sweep 'nonsense': expected PATH=v1,v2",
    ),
    "stress-sigint": Case(
        ["stress", TINY, *SWEEP, "--algorithms", "fedavg,fednova", "--seeds", "3"]
        + ["--workers", "0", "--set", "rounds=400", "--out", "{tmp}/out", "-q"],
        130,
        rows_kept("runs/*.parquet"),
        sigint="runs/*.parquet",
    ),
    "stress-diverges": Case(
        ["stress", QUAD, *SWEEP, "--algorithms", "fedavg", "--seeds", "1"]
        + ["--workers", "0", "--out", "{tmp}/out", "-q", *DIVERGE],
        1,
        rows_kept("stress.parquet"),
    ),
    "stress-missing-data": Case(
        ["stress", TINY, *SWEEP, "--algorithms", "fedavg", "--seeds", "1"]
        + ["--workers", "0", "--out", "{tmp}/out", "-q", "--set", NO_DATA % "{tmp}"],
        2,
        says="in {tmp}/mnist/",
    ),
}


def _param(name: str, case: Case):
    marks = list(case.marks)
    if case.xfail:
        marks.append(pytest.mark.xfail(strict=True, reason=case.xfail))
    return pytest.param(name, id=name, marks=marks)


def _has_rows(out: Path, pattern: str) -> bool:
    for f in out.glob(pattern):
        try:
            if pq.read_table(f).num_rows:
                return True
        except OSError:  # not there any more, or being replaced
            pass
    return False


def _sigint_as_at_a_terminal() -> None:
    """In the child, before exec: SIGINT neither ignored nor blocked, whatever
    the test process inherited (a suite started in the background by a shell
    without job control ignores SIGINT, and so would every fedsim it starts)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def sigint_after_first_rows(
    args: list[str], out: Path, pattern: str, timeout: float = 120
) -> tuple[int, str]:
    """Run ``fedsim`` in a subprocess; SIGINT it once a file matching
    ``pattern`` in ``out`` holds rows; its exit code and its stderr."""
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "fedsim.tools.cli", *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_sigint_as_at_a_terminal,
    )
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and proc.poll() is None:
            if _has_rows(out, pattern):
                break
            time.sleep(0.2)
        assert proc.poll() is None, f"ended before any rows: {proc.stderr.read()}"
        assert _has_rows(out, pattern), "no rows on disk in time"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=WAIT_S)
        return proc.returncode, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("name", [_param(n, c) for n, c in CASES.items()])
def test_exit_code(name, tmp_path):
    # Prepare
    case = CASES[name]
    if any("{tmp}/done" in a for a in case.args):
        done = a_finished_run(tmp_path)
        if any("done-no-ckpt" in a for a in case.args):
            no_ckpt = tmp_path / "done-no-ckpt"
            no_ckpt.mkdir()
            for f in ("scenario.yaml", "rounds.parquet", "clients.parquet"):
                (no_ckpt / f).write_bytes((done / f).read_bytes())
    args = [a.replace("{tmp}", str(tmp_path)) for a in case.args]

    # Execute
    if case.sigint:
        code, output = sigint_after_first_rows(args, tmp_path / "out", case.sigint)
    else:
        result = CliRunner().invoke(app, args)
        code, output = result.exit_code, result.output
        # bad input is a message, not a traceback
        assert result.exception is None or isinstance(result.exception, SystemExit), (
            repr(result.exception)
        )

    # Assert
    assert code == case.code, output[-2000:]
    if code == 2 and not case.sigint:
        # the message names the option, field or file at fault (the panel
        # typer draws for a bad option wraps it: compare on one line)
        says = case.says.replace("{tmp}", str(tmp_path))
        assert says, f"{name}: an exit-2 case must say what its message names"
        flat = " ".join(output.replace("│", " ").split())
        assert " ".join(says.split()) in flat, output[-2000:]
    if case.check is not None:
        case.check(tmp_path)
