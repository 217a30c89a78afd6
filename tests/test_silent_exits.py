"""Nothing ends without a word: an interrupt that no command caught, Ctrl-C
while ``fedsim report`` draws, Ctrl-C early in compare (whose empty runs/
once blocked the same command until --overwrite), and stress's exit code
for a plug-in's failure (3, as run and compare)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import SCENARIOS, WAIT_S, cli_run, fedsim_here

ROOT = Path(__file__).resolve().parents[1]
TINY = SCENARIOS / "ci" / "tiny-synthetic.yaml"
INTERRUPTS = "tests.hostile_plugins:Interrupts"


def _lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.strip()]


def test_stress_exits_3_with_one_line_when_an_arms_plugin_fails(tmp_path):
    p = fedsim_here(
        *("stress", str(TINY), "--sweep", "fleet.stragglers.p=0,0.2"),
        *("-a", "fedavg,tests.hook_plugins:Boom", "--seeds", "1"),
        *("--workers", "0", "--quiet", "--out", str(tmp_path / "s")),
        *("--set", "rounds=3"),
    )
    assert p.returncode == 3, p.stderr
    lines = _lines(p.stderr)
    assert lines[-1].startswith("error: algorithm 'tests.hook_plugins:Boom'"), lines
    assert "Traceback (most" not in p.stderr


def test_ctrl_c_while_fedsim_report_draws_says_so_and_how_to_draw_again(
    tmp_path, monkeypatch
):
    # Prepare: a finished run; a real SIGINT once the report starts drawing
    import fedsim.tools.report

    run_dir = cli_run(tmp_path / "run", "ci/tiny-synthetic.yaml", ["rounds=1"])

    def interrupted(*args, **kwargs):
        signal.raise_signal(signal.SIGINT)
        raise AssertionError("the signal did not stop the report")

    monkeypatch.setattr(fedsim.tools.report, "write_report", interrupted)

    # Execute
    done = fedsim_here("report", str(run_dir))

    # Assert: exit 130 and one line that says what is whole and what to do
    assert done.returncode == 130
    lines = _lines(done.stderr)
    assert len(lines) == 1, lines
    said = " ".join(done.stderr.split())
    assert f"the report of {run_dir} was not finished" in said
    assert f"draw it again with: fedsim report {run_dir}" in said


def test_an_interrupt_no_command_caught_is_one_line_not_a_silent_130(
    monkeypatch, capfd
):
    # Prepare: a real SIGINT while `validate` loads the scenario (validate
    # has no handler of its own; typer turns it into a silent exit 130)
    import fedsim.tools.cli as cli

    def interrupted(*args, **kwargs):
        signal.raise_signal(signal.SIGINT)
        raise AssertionError("the signal did not stop validate")

    monkeypatch.setattr(cli, "_load", interrupted)
    monkeypatch.setattr(sys, "argv", ["fedsim", "validate", str(TINY)])

    # Execute: the console script's entry point, with its handlers
    with pytest.raises(SystemExit) as info:
        cli.main()

    # Assert
    assert info.value.code == 130
    lines = _lines(capfd.readouterr().err)
    assert lines == ["interrupted: stopped; nothing was finished"]


@pytest.mark.slow
def test_ctrl_c_early_in_compare_says_so_and_leaves_nothing_in_the_way(tmp_path):
    # Prepare / Execute: Ctrl-C in the first run's first round
    out = tmp_path / "c"
    args = ["compare", str(TINY), "--seeds", "1", "--workers", "0", "--quiet"]
    args += ["--out", str(out), "--set", "rounds=3"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NO_COLOR": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "fedsim", *args, "-a", INTERRUPTS],
        env=env, capture_output=True, text=True, timeout=WAIT_S, cwd=tmp_path,
    )  # fmt: skip

    # Assert: exit 130, a line saying what is kept, no empty runs/ left to
    # block the same command, which then runs
    assert done.returncode == 130, done.stderr
    said = " ".join(done.stderr.split())
    assert "interrupted: compare stopped; 0 finished run(s) kept, no table" in said
    assert "Traceback" not in done.stderr
    assert not out.exists()
    fedsim_here(*args, "-a", "fedavg", check=True)
