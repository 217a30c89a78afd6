""".ci/watch: a suite that hangs past CI's limit says which test and where.

CI kills a job past its time without a word (the stop of 2026-12-07: pytest
at 99 % for an hour, nothing printed). The watchdog must name the test each
pytest process is running and show its threads' stacks, then stop it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

HANGS = """
import time


def stuck_here():
    time.sleep(120)


def test_stuck():
    stuck_here()
"""


@pytest.mark.slow
def test_watch_names_the_stuck_test_and_its_stack_then_stops_it(tmp_path):
    # Arrange: a test that sleeps far past the watchdog's 4 s, with this
    # suite's conftest (which registers the stack dump) as a plugin
    (tmp_path / "test_hangs.py").write_text(HANGS)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("FEDSIM_STACKS_DIR", None)
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "tests.conftest",
        "-p",
        "no:timeout",
        "-p",
        "no:cacheprovider",
        "test_hangs.py",
    ]
    # Act
    out = subprocess.run(
        [str(ROOT / ".ci" / "watch"), "4", *cmd],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=110,
    )
    # Assert: the test named, its frame in the stack, stopped with 124
    text = out.stdout + out.stderr
    assert out.returncode == 124, text
    assert "running: test_hangs.py::test_stuck" in text, text
    assert "in stuck_here" in text, text
    assert "the process tree" in text, text
    assert "KeyboardInterrupt" in text, text  # pytest summed up its run
