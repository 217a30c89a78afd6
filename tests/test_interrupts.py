"""Ctrl-C and SIGTERM in the round loop (fedsim/interrupts.py): the first
stops the run before the next round, a second at once, neither is lost to
a finalizer, and a SIGTERM waits for a stuck round only its grace period.
Real signals, sent to this process; the subprocess cases (a Ctrl-C after
the first rows, a signal in each part of set-up and in Ray's start, SIGTERM
to a run on Ray workers) are in test_cli_commands.py, test_robustness.py and
test_loopback.py.

Every test here leaves the process as it found it (:func:`_no_signal_leaks`):
a signal raised in a test and handled late would surface as a
KeyboardInterrupt in whatever runs next (Hypothesis's garbage-collector
callback, in one fresh-clone run)."""

from __future__ import annotations

import gc
import json
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from fedsim import interrupts
from fedsim.runtime import run_scenario
from fedsim.scenario import load_scenario

from .conftest import SCENARIOS, fedsim_here, time_limit

TINY = SCENARIOS / "ci" / "tiny-synthetic.yaml"


@pytest.fixture(autouse=True, scope="module")
def _collect_at_the_end():
    """A full collection once the module is done (:func:`_no_signal_leaks`
    collects the young generations after each test: a full one costs a
    quarter of a second with torch loaded)."""
    yield
    with _quiet_signals():
        gc.collect()


@pytest.fixture(autouse=True)
def _no_signal_leaks():
    """Around each test: the handlers it found are back afterwards, nothing
    of fedsim/interrupts.py's state is left (no block, no wait, no grace
    timer), and the objects a test left to the garbage collector (a
    finalizer that raises a signal) are collected here, under handlers that
    do nothing, so that no KeyboardInterrupt reaches the next test."""
    before = {s: signal.getsignal(s) for s in interrupts.SIGNALS}
    yield
    with _quiet_signals():
        gc.collect(1)
    assert {s: signal.getsignal(s) for s in interrupts.SIGNALS} == before
    state = interrupts._state
    assert (state.depth, state.waits, state.asked, state.timer) == (0, [], 0, None)
    assert not [t for t in threading.enumerate() if isinstance(t, threading.Timer)]


@contextmanager
def _quiet_signals() -> Iterator[None]:
    """SIGINT and SIGTERM handled by doing nothing, for a collection whose
    finalizers may raise them; a signal still pending is handled in here."""
    quiet = {s: signal.signal(s, lambda *_: None) for s in interrupts.SIGNALS}
    try:
        yield
        for _ in range(1000):  # bytecodes: a pending signal's handler runs here
            pass
    finally:
        for s, handler in quiet.items():
            signal.signal(s, handler)


class _SignalsWhenCollected:
    """Sends ``sig`` to this process from ``__del__``, then runs on for a
    while: Python calls the handler there, inside the finalizer, where a
    KeyboardInterrupt is printed as "Exception ignored in ..." and dropped
    (the way SimPy's process generators, closed by the garbage collector,
    lost about one Ctrl-C in 150)."""

    def __init__(self, sig: int) -> None:
        self.sig = sig

    def __del__(self) -> None:
        signal.raise_signal(self.sig)
        sum(range(10_000))  # bytecodes: the handler runs here, not after


def _tiny(rounds: int):
    return load_scenario(TINY, [f"rounds={rounds}"])


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_signal_a_finalizer_would_swallow_still_stops_the_run(sig):
    # Prepare: the signal is raised inside a finalizer during round 3
    def on_round(row, _clients):
        if row["round"] == 3:
            _SignalsWhenCollected(getattr(signal, sig))  # collected at once

    # Execute: as `fedsim run` does, with fedsim's handlers
    with interrupts.stop_at_round_ends():
        result = run_scenario(_tiny(50), workers=0, on_round=on_round)

    # Assert: the run stopped before round 4, with rounds 0..3 whole
    assert result.status == "interrupted", result.status
    assert [r["round"] for r in result.rows] == [0, 1, 2, 3]


def test_without_fedsims_handlers_the_finalizer_loses_the_interrupt(monkeypatch):
    # The reason for the module: Python's own handler raises in the
    # finalizer, which drops the KeyboardInterrupt; the run goes on.
    dropped: list = []  # what Python prints as "Exception ignored in ..."
    monkeypatch.setattr(sys, "unraisablehook", dropped.append)

    def on_round(row, _clients):
        if row["round"] == 3:
            _SignalsWhenCollected(signal.SIGINT)

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        result = run_scenario(_tiny(8), workers=0, on_round=on_round)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert result.status == "completed" and len(result.rows) == 8
    assert [d.exc_type for d in dropped] == [KeyboardInterrupt]


def test_the_first_signal_waits_for_the_round_and_a_second_stops_at_once(capfd):
    with interrupts.stop_at_round_ends(), interrupts.round_loop():
        signal.raise_signal(signal.SIGINT)  # noted, the round goes on
        assert "stopping at the end of this round" in capfd.readouterr().err
        with pytest.raises(KeyboardInterrupt):
            interrupts.before_round()
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)  # the second: at once
            sum(range(10_000))


def test_outside_the_round_loop_a_signal_raises_at_once():
    with interrupts.stop_at_round_ends():
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGTERM)
            sum(range(10_000))
        # a signal set-up caught (and maybe a finalizer dropped) still stops
        # the loop before its first round
        with pytest.raises(KeyboardInterrupt):
            interrupts.before_round()
    interrupts.before_round()  # outside: nothing asked, nothing raised


def test_handlers_are_kept_through_ray_init_and_restored_after():
    before = {s: signal.getsignal(s) for s in interrupts.SIGNALS}
    with interrupts.stop_at_round_ends():
        with interrupts.kept():
            # what ray.init does to the driver (ray/_private/worker.py)
            signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(signum))
        assert signal.getsignal(signal.SIGTERM) is interrupts._on_signal
        with interrupts.stop_at_round_ends():  # nested (main() around run)
            pass
        assert signal.getsignal(signal.SIGINT) is interrupts._on_signal
    assert {s: signal.getsignal(s) for s in interrupts.SIGNALS} == before


# ----------------------------------------------------- a SIGTERM's grace period


def _stuck_in(monkeypatch, where: str, sig: int = signal.SIGTERM) -> None:
    """``sig`` arrives while the server applies ``where`` ("round 1"), and
    that round never ends (a worker or server that hangs)."""
    from fedsim.server import Server

    apply = Server.apply

    def stuck(self, updates, at):
        if at.where == where:
            signal.raise_signal(sig)
            while True:  # bytecodes: the grace period's stop lands here
                time.sleep(0.01)
        return apply(self, updates, at)

    monkeypatch.setattr(Server, "apply", stuck)


def test_one_sigterm_ends_a_round_that_never_ends_after_its_grace(
    tmp_path, monkeypatch, capfd
):
    # Prepare: round 1 hangs once a SIGTERM (one, as a scheduler sends) is
    # in; checkpoints after every round; a grace period of 0.3 s
    monkeypatch.setenv(interrupts.GRACE_ENV, "0.3")
    _stuck_in(monkeypatch, "round 1")
    out = tmp_path / "run"
    args = ["run", str(TINY), "--workers", "0", "--out", str(out), "-q"]
    args += ["--no-report", "--set", "rounds=4", "--set", "checkpoint.every_rounds=1"]

    # Execute: `fedsim run` in this process, with its handlers
    start = time.monotonic()
    with time_limit(20):  # a broken grace period: Hang, not a hung suite
        done = fedsim_here(*args)
    took = time.monotonic() - start

    # Assert: stopped as by a second signal, round 0's row and checkpoint
    # kept; the lines speak of SIGTERM and its grace, never of Ctrl-C
    said = capfd.readouterr().err + done.stderr + done.stdout
    assert done.returncode == 130, said[-2000:]
    assert took < 30, took
    assert "SIGTERM: stopping at the end of this round, or in 0.3 s" in said, said
    assert "SIGTERM: this round did not end within 0.3 s" in said, said
    assert "Ctrl-C" not in said, said
    assert f"fedsim run --resume {out}" in " ".join(said.split()), said
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["status"], summary["rounds"]) == ("interrupted", 1), summary
    assert (out / "LATEST").read_text().strip() == "ckpt-00000001"


def test_a_sigint_still_waits_for_the_round_without_a_grace(monkeypatch, capfd):
    # Ctrl-C is a person at the terminal, who can press it again: no timer
    monkeypatch.setenv(interrupts.GRACE_ENV, "0.01")
    with interrupts.stop_at_round_ends(), interrupts.round_loop():
        signal.raise_signal(signal.SIGINT)
        time.sleep(0.1)  # ten grace periods: nothing raised
        assert interrupts._state.timer is None
        assert "press Ctrl-C again" in capfd.readouterr().err
        with pytest.raises(KeyboardInterrupt):
            interrupts.before_round()


@pytest.mark.parametrize("value", ["0", "inf"])
def test_a_grace_of_0_stops_at_once_and_inf_waits_for_the_round(
    monkeypatch, capfd, value
):
    monkeypatch.setenv(interrupts.GRACE_ENV, value)
    with interrupts.stop_at_round_ends(), interrupts.round_loop():
        if value == "0":  # as a second signal
            with pytest.raises(KeyboardInterrupt):
                signal.raise_signal(signal.SIGTERM)
                sum(range(10_000))
        else:  # noted; the round goes on, with no timer
            signal.raise_signal(signal.SIGTERM)
            assert interrupts._state.timer is None
            err = capfd.readouterr().err
            assert "at the end of this round (FEDSIM_SIGTERM_GRACE_S)" in err, err
        with pytest.raises(KeyboardInterrupt):
            interrupts.before_round()


@pytest.mark.parametrize("value", ["-1", "soon", "nan"])
def test_a_bad_grace_is_refused_by_name(monkeypatch, value):
    monkeypatch.setenv(interrupts.GRACE_ENV, value)
    done = fedsim_here("validate", str(TINY))
    assert done.returncode == 2, done.stderr
    assert f"FEDSIM_SIGTERM_GRACE_S={value!r}: expected seconds >= 0" in done.stderr


def test_the_grace_ends_with_its_round(monkeypatch):
    # a round that ends in time cancels the timer: nothing fires later
    monkeypatch.setenv(interrupts.GRACE_ENV, "0.2")
    with interrupts.stop_at_round_ends():
        with interrupts.round_loop():
            signal.raise_signal(signal.SIGTERM)
            assert interrupts._state.timer is not None
        assert interrupts._state.timer is None
        time.sleep(0.4)  # twice the grace period, outside the loop: no raise
        with pytest.raises(KeyboardInterrupt):
            interrupts.before_round()


# ------------------------------------------------ Ctrl-C while the report is drawn


def test_ctrl_c_while_the_report_is_drawn_says_how_to_draw_it(tmp_path, monkeypatch):
    # Prepare: a real SIGINT once the report starts (the run is complete)
    import fedsim.tools.report

    def interrupted(run_dir, *args, **kwargs):
        signal.raise_signal(signal.SIGINT)
        raise AssertionError("the signal did not stop the report")

    monkeypatch.setattr(fedsim.tools.report, "write_report", interrupted)
    out = tmp_path / "run"

    # Execute
    done = fedsim_here("run", str(TINY), "--workers", "0", "--out", str(out), "-q",
                       "--set", "rounds=2")  # fmt: skip

    # Assert: exit 130, the results whole, and how to draw the report
    said = " ".join(done.stderr.split())
    assert done.returncode == 130, done.stderr
    assert "the run completed and its results are whole" in said, said
    assert "the report was interrupted" in said
    assert f"draw it with: fedsim report {out}" in said
    assert json.loads((out / "summary.json").read_text())["status"] == "completed"
    assert not (out / "report.md").exists()
