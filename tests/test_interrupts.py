"""Ctrl-C and SIGTERM in the round loop (fedsim/interrupts.py): the first
stops the run before the next round, a second at once, and neither is lost
to a finalizer. Real signals, sent to this process; the subprocess cases
(a Ctrl-C after the first rows, a signal in each part of set-up, SIGTERM
to a run on Ray workers) are in test_cli_commands.py, test_robustness.py and
test_loopback.py."""

from __future__ import annotations

import signal
import sys

import pytest

from fedsim import interrupts
from fedsim.runtime import run_scenario
from fedsim.scenario import load_scenario

from .conftest import SCENARIOS

TINY = SCENARIOS / "ci" / "tiny-synthetic.yaml"


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
