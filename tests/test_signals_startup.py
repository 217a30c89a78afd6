"""A Ctrl-C or SIGTERM at any moment of a command's start-up, imports
included, ends in exit 130 and one line (fedsim/interrupts.py: a signal
during an import waits for its end; fedsim/__main__.py: the handlers are in
place before the command line is imported). Real signals to real
processes: an interrupt inside ``import torch`` once left torch half
initialised (a traceback, or a crash with exit 139)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from .conftest import SCENARIOS, WAIT_S

ROOT = Path(__file__).resolve().parents[1]
TINY = SCENARIOS / "ci" / "tiny-synthetic.yaml"


def _env() -> dict[str, str]:
    """This checkout first on the path; no terminal colours."""
    return {**os.environ, "PYTHONPATH": str(ROOT), "NO_COLOR": "1", "TERM": "dumb"}


def _script(tmp_path: Path, body: str) -> subprocess.CompletedProcess[str]:
    """Run ``body`` as a Python program in tmp_path (which is on its path)."""
    (tmp_path / "main.py").write_text(textwrap.dedent(body))
    env = {**_env(), "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    return subprocess.run(
        [sys.executable, "main.py"], cwd=tmp_path, env=env, capture_output=True,
        text=True, timeout=WAIT_S,
    )  # fmt: skip


# A module that signals its own process while it is imported, then goes on
# running (a KeyboardInterrupt raised in its body would stop it half way).
_SELF_SIGNALLING = """
import os, signal
for _ in range({n}):
    os.kill(os.getpid(), signal.{sig})
    for _ in range(100_000):
        pass
WHOLE = True
"""


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_signal_during_an_import_is_raised_once_the_import_is_whole(tmp_path, sig):
    (tmp_path / "slowmod.py").write_text(_SELF_SIGNALLING.format(n=1, sig=sig))
    done = _script(
        tmp_path,
        """
        import sys, time
        from fedsim import interrupts
        with interrupts.stop_at_round_ends():
            try:
                import slowmod
                for _ in range(500):  # the held-back signal is raised here
                    time.sleep(0.01)
                print("no interrupt")
            except KeyboardInterrupt:
                print("interrupted after import:", sys.modules["slowmod"].WHOLE)
        """,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "interrupted after import: True"


def test_a_second_signal_during_an_import_stops_at_once_with_one_line(tmp_path):
    (tmp_path / "slowmod.py").write_text(_SELF_SIGNALLING.format(n=2, sig="SIGINT"))
    done = _script(
        tmp_path,
        """
        from fedsim import interrupts
        with interrupts.stop_at_round_ends():
            import slowmod
        print("imported")
        """,
    )
    assert done.returncode == 130
    assert done.stdout == ""
    line = "interrupted while slowmod was imported; stopped at once"
    assert done.stderr.strip() == line


def _interpreter_start_s() -> float:
    """Seconds this machine takes, now, to start an interpreter that runs
    nothing (site imports included): the longer of two tries."""
    took = []
    for _ in range(2):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], env=_env(), check=True)
        took.append(time.perf_counter() - t0)
    return max(took)


@pytest.mark.slow
def test_a_signal_at_any_moment_of_start_up_is_exit_130_and_one_line(tmp_path):
    """From Python's start to the rounds: the command line's import, torch's
    import, the scenario's set-up (a machine's speed moves each moment; the
    delays span them all on a slow and on a fast machine)."""
    seen = []
    # The moments start when the interpreter can run code: before that, no
    # program can handle a signal (CPython's own start-up dies on SIGINT with
    # "Fatal Python error: init_import_site", and SIGTERM's default kills
    # it), and on a loaded machine that start-up alone outlasts 0.15 s.
    ready = _interpreter_start_s()
    for i, delay in enumerate(ready + d for d in (0.15, 0.5, 1.0, 1.6, 2.3, 3.2)):
        sig = (signal.SIGINT, signal.SIGTERM)[i % 2]
        cmd = [sys.executable, "-m", "fedsim", "run", str(TINY), "--workers", "0"]
        cmd += ["--quiet", "--no-report", "--out", str(tmp_path / f"r{i}")]
        cmd += ["--set", "rounds=100000"]  # still running when the signal comes
        proc = subprocess.Popen(
            cmd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, cwd=tmp_path,
        )  # fmt: skip
        time.sleep(delay)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=WAIT_S)
        lines = [ln for ln in err.splitlines() if ln.strip()]
        seen.append((delay, sig.name, proc.returncode, lines))
        assert proc.returncode == 130, seen
        assert "Traceback" not in err and "Error" not in err, seen
        # one line, and in the round loop the line that the round ends first
        assert 1 <= len(lines) <= 2 and "interrupted" in lines[-1], seen
