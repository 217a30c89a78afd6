"""Shared fixtures. Ray-starting tests share one local Ray session (ray.init
takes seconds) and are marked ``ray``; ``make test-quick`` skips them."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = ROOT / "scenarios"
SHARED = ROOT.parent / "shared"


@pytest.fixture(scope="session")
def ray_session():
    """One embedded local Ray for every test that needs it."""
    from fedsim.ray_session import init_ray, shutdown_ray

    init_ray(num_cpus=2)
    yield
    shutdown_ray()


def cli_run(out: Path, scenario: str, overrides: list[str]) -> Path:
    """``fedsim run SCENARIO --workers 0 --out OUT --set ...`` in this process
    (typer's CliRunner); it must succeed. Returns ``out``."""
    from typer.testing import CliRunner

    from fedsim.cli import app

    args = ["run", str(SCENARIOS / scenario), "--workers", "0", "--out", str(out)]
    for o in overrides:
        args += ["--set", o]
    result = CliRunner().invoke(app, [*args, "--quiet"])
    assert result.exit_code == 0, result.output
    return out


class Hang(BaseException):
    """Raised when a bounded call runs past its time (BaseException: no
    ``except Exception`` in the code under test can swallow it)."""


@contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise :class:`Hang` in this thread after ``seconds`` (SIGALRM; no
    bound where the platform has no interval timer)."""
    if not hasattr(signal, "setitimer"):
        yield
        return

    def on_alarm(signum: int, frame: Any) -> None:
        raise Hang(f"still running after {seconds} s")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
