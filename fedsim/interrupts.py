"""Ctrl-C and SIGTERM that stop a run at a round's end, and are never lost.

Python turns SIGINT into a KeyboardInterrupt raised in whatever code runs
when the signal arrives. In a training loop that can be anywhere: inside
SimPy's scheduler, a Parquet or checkpoint write, or a finalizer. When it is
a finalizer (a SimPy process generator the garbage collector closes, an
object's ``__del__``), Python prints "Exception ignored in ..." and drops the
interrupt: the run goes on as if Ctrl-C had never been pressed. We saw that
about once in 150 Ctrl-Cs on a loaded machine (issue 23).

So the ``fedsim`` command handles SIGINT and SIGTERM itself
(:func:`stop_at_round_ends`). While a run's round loop runs
(:func:`round_loop`), the first signal is only noted (with a line on
stderr) and the loop raises KeyboardInterrupt before it starts the next
round (:func:`before_round`): the round that was running is whole, its row
recorded and its checkpoint, if due, written. A second signal raises at
once, for a round that is stuck or too long to wait for. Outside a round
loop (set-up, writing the report) every signal raises at once, as Python's
own handler does.

Code that runs fedsim as a library (a notebook, ``run_scenario``) keeps
Python's handlers: none of this is installed, and :func:`before_round` never
raises.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

# The signals that stop a run: Ctrl-C, and a scheduler's stop (Kubernetes,
# Slurm, ``ray job stop``).
SIGNALS = (signal.SIGINT, signal.SIGTERM)


class _State:
    """What the handler knows; one per process (signals are per process)."""

    depth = 0  # nested stop_at_round_ends() blocks; the outermost installs
    looping = 0  # nested round_loop() blocks: a signal waits for a round's end
    asked = 0  # signals received in the outermost block so far


_state = _State()


def _on_signal(signum: int, frame: FrameType | None) -> None:
    """The handler: note the signal; raise KeyboardInterrupt unless a round
    loop runs and this is the first signal (the loop then stops at the end
    of the round, :func:`before_round`)."""
    _state.asked += 1
    if _state.looping and _state.asked == 1:
        # os.write, not print: the handler may run inside a write to stderr,
        # and a buffered stream refuses a write reentering itself
        os.write(
            2, b"\nstopping at the end of this round (press Ctrl-C again to stop now)\n"
        )
        return
    raise KeyboardInterrupt


@contextmanager
def stop_at_round_ends() -> Iterator[None]:
    """Within the block SIGINT and SIGTERM are handled as the module says;
    the previous handlers are back afterwards (tests and notebooks run the
    CLI in their own process). Blocks may nest: the outermost installs.

    Raises:
        ValueError: not in the main thread (Python's rule for signal handlers).
    """
    if _state.depth:
        _state.depth += 1
        try:
            yield
        finally:
            _state.depth -= 1
        return
    previous = {s: signal.signal(s, _on_signal) for s in SIGNALS}
    _state.depth, _state.asked = 1, 0
    try:
        yield
    finally:
        _state.depth, _state.asked = 0, 0
        for s, handler in previous.items():
            signal.signal(s, handler)


@contextmanager
def kept() -> Iterator[None]:
    """Keep this module's handlers through the block, where they are
    installed: ``ray.init`` installs its own SIGTERM handler, which exits
    the process at once (no summary.json, no word on how to resume)."""
    try:
        yield
    finally:
        if _state.depth and threading.current_thread() is threading.main_thread():
            for s in SIGNALS:
                signal.signal(s, _on_signal)


@contextmanager
def round_loop() -> Iterator[None]:
    """Mark a run's round loop: inside it a first signal waits for
    :func:`before_round`. The runtime wraps its loop in this."""
    _state.looping += 1
    try:
        yield
    finally:
        _state.looping -= 1


def before_round() -> None:
    """Called by the round loop before each round (asynchronous: each
    training batch): every earlier round is whole, its row recorded and its
    checkpoint, if due, written. A stop asked during the last round (or a
    first interrupt that some finalizer swallowed) takes effect here.

    Raises:
        KeyboardInterrupt: a signal arrived inside :func:`stop_at_round_ends`.
    """
    if _state.asked:
        raise KeyboardInterrupt
