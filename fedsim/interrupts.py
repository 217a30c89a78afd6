"""Ctrl-C and SIGTERM that stop a run at a round's end, are never lost, and
never wait for ever.

Python turns SIGINT into a KeyboardInterrupt raised in whatever code runs
when the signal arrives. In a training loop that can be anywhere: inside
SimPy's scheduler, a Parquet or checkpoint write, or a finalizer. When it is
a finalizer (a SimPy process generator the garbage collector closes, an
object's ``__del__``), Python prints "Exception ignored in ..." and drops the
interrupt: the run goes on as if Ctrl-C had never been pressed. We saw that
about once in 150 Ctrl-Cs on a loaded machine.

So the ``fedsim`` command handles SIGINT and SIGTERM itself
(:func:`stop_at_round_ends`). While a run's round loop runs
(:func:`round_loop`), the first signal is only noted (with a line on
stderr) and the loop raises KeyboardInterrupt before it starts the next
round (:func:`before_round`): the round that was running is whole, its row
recorded and its checkpoint, if due, written. A second signal raises at
once, for a round that is stuck or too long to wait for. Outside a round
loop (set-up, writing the report) every signal raises at once, as Python's
own handler does; Ray's start is waited for like a round
(:func:`waiting_for`, used by :func:`fedsim.remote.ray_session.init_ray`), since a
KeyboardInterrupt inside ``ray.init`` can leave its processes half started.

A scheduler (Slurm, Kubernetes, ``ray job stop``) sends one SIGTERM, then
SIGKILL after its own grace period (30 s for Kubernetes and Slurm by
default). So a first SIGTERM waits for the round's end at most
``FEDSIM_SIGTERM_GRACE_S`` seconds (:data:`DEFAULT_GRACE_S` by default; 0:
stop at once; ``inf``: wait for the round however long it takes), then stops
as a second signal would: every row recorded so far and every checkpoint
written are kept, and the run says how to continue.

A signal that lands while a module is being imported (torch takes a second
or two) must not raise there: a KeyboardInterrupt inside an import leaves
the module half initialised in ``sys.modules`` ("partially initialized
module 'torch'"), and the interpreter has crashed importing it again. So
outside a wait the first signal during an import is only noted, and
raised once the import is over (:func:`_defer`); a second one during the
import stops the process at once with one line (:func:`_stop_now`), since
no Python code may safely run after it.

Code that runs fedsim as a library (a notebook, ``run_scenario``) keeps
Python's handlers: none of this is installed, and :func:`before_round` never
raises.
"""

from __future__ import annotations

import _thread
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

# The signals that stop a run: Ctrl-C, and a scheduler's stop (Kubernetes,
# Slurm, ``ray job stop``).
SIGNALS = (signal.SIGINT, signal.SIGTERM)
# How long a first SIGTERM waits for the round's end: 10 s below Kubernetes'
# and Slurm's default 30 s before SIGKILL, time enough for summary.json.
GRACE_ENV = "FEDSIM_SIGTERM_GRACE_S"
DEFAULT_GRACE_S = 20.0


class _State:
    """What the handler knows; one per process (signals are per process)."""

    def __init__(self) -> None:
        self.depth = 0  # nested stop_at_round_ends() blocks; the outermost installs
        # what a first signal waits for, innermost last ("this round", ...)
        self.waits: list[str] = []
        self.asked = 0  # signals received in the outermost block so far
        self.timer: threading.Timer | None = None  # a first SIGTERM's grace
        self.grace = 0.0  # its length, for the line that says it ran out
        self.expired = False  # the grace period ran out (the handler says so)
        self.deferred = False  # a signal waits for an import's end (_defer)
        self.redelivered = False  # _defer's thread hands that signal back


_state = _State()
# the timer thread against the main thread's cancel; reentrant: a handler that
# arms a timer may run in the main thread while it holds the lock
_lock = threading.RLock()


def sigterm_grace_s() -> float:
    """Seconds a first SIGTERM waits for the round's end: ``FEDSIM_SIGTERM_GRACE_S``,
    else :data:`DEFAULT_GRACE_S`.

    Raises:
        ValueError: the variable is not a number of seconds >= 0 (``inf``
            allowed), with a message naming it.
    """
    text = os.environ.get(GRACE_ENV, "").strip()
    if not text:
        return DEFAULT_GRACE_S
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not value >= 0:  # also NaN
        raise ValueError(
            f"{GRACE_ENV}={text!r}: expected seconds >= 0 (0: a SIGTERM stops at "
            f"once; inf: it waits for the round's end; default {DEFAULT_GRACE_S:g})"
        )
    return value


def _grace_or_default() -> float:
    """:func:`sigterm_grace_s`, or the default for a bad value (a signal
    handler must not raise an unrelated error; the CLI refuses the value
    before any run)."""
    try:
        return sigterm_grace_s()
    except ValueError:
        return DEFAULT_GRACE_S


def _on_signal(signum: int, frame: FrameType | None) -> None:
    """The handler: note the signal; raise KeyboardInterrupt unless something
    is waited for (a round, Ray's start) and this is the first signal (the
    wait then ends as its block says, :func:`before_round`). A first SIGTERM
    waits at most its grace period (:func:`_expire` raises then)."""
    if _state.redelivered:  # the signal _defer held back, not a new one
        _state.redelivered = False
    else:
        _state.asked += 1
    # os.write, not print: the handler may run inside a write to stderr, and
    # a buffered stream refuses a write reentering itself
    if _state.expired:
        what = _state.waits[-1] if _state.waits else "the run"
        late = f"{what} did not end within {_state.grace:g} s ({GRACE_ENV})"
        os.write(2, f"\nSIGTERM: {late}; stopping now\n".encode())
    elif _state.waits and _state.asked == 1:
        what = _state.waits[-1]
        if signum != signal.SIGTERM:
            line = f"\nstopping at the end of {what} (press Ctrl-C again to stop now)\n"
            os.write(2, line.encode())
            return
        grace = _grace_or_default()
        if grace > 0:
            os.write(2, _waiting_line(what, grace).encode())
            _arm(grace)
            return
    _raise(signum)


def _raise(signum: int) -> None:
    """Raise KeyboardInterrupt, unless a module is being imported: a first
    signal then waits for the import's end (:func:`_defer`), a later one
    stops the process (:func:`_stop_now`)."""
    module = _importing()
    if module is None:
        _state.deferred = False
        raise KeyboardInterrupt
    if _state.asked > 1 or _state.expired:
        _stop_now(module)
    # the first signal, or the one handed back while another import began
    _state.deferred = True
    threading.Thread(target=_redeliver, args=(signum,), daemon=True).start()


def _importing() -> str | None:
    """The name of a module whose import is under way (any thread), else
    None: importlib marks a module's spec ``_initializing`` while its code
    runs."""
    for _ in range(10):  # another thread may import meanwhile: look again
        try:
            modules = list(sys.modules.items())
        except RuntimeError:
            continue
        for name, module in modules:
            if getattr(getattr(module, "__spec__", None), "_initializing", False):
                return name
        return None
    return None


def _redeliver(signum: int) -> None:
    """The thread of a signal held back by :func:`_raise`: once no import is
    under way, hand the signal back to the main thread's handler, which
    raises it there. Ends without a word once the handlers are gone (the
    block ended) or the signal was raised meanwhile."""
    while _state.deferred and _state.depth:
        if _importing() is None:
            _state.redelivered = True
            _thread.interrupt_main(signal.Signals(signum))
            return
        time.sleep(0.02)


def _stop_now(module: str) -> None:
    """A second signal while ``module`` is imported: one line and exit 130
    at once. Raising would leave the module half initialised, and neither
    the except clauses nor the interpreter's exit can be trusted to run
    after that; whatever was written so far was written atomically."""
    line = f"\ninterrupted while {module} was imported; stopped at once\n"
    os.write(2, line.encode())
    os._exit(130)


def _waiting_line(what: str, grace: float) -> str:
    """What a first SIGTERM prints: no word of Ctrl-C (a scheduler sent it)."""
    limit = "" if math.isinf(grace) else f", or in {grace:g} s at the latest"
    return (
        f"\nSIGTERM: stopping at the end of {what}{limit} ({GRACE_ENV}); "
        "a second SIGTERM stops now\n"
    )


def _arm(grace: float) -> None:
    """Start the grace period of a first SIGTERM (none for ``inf``)."""
    if math.isinf(grace):
        return
    timer = threading.Timer(grace, _expire)
    timer.daemon = True  # never holds the process at exit
    with _lock:
        _state.timer, _state.grace = timer, grace
    timer.start()


def _expire() -> None:
    """The grace period ran out (timer thread): act as a second SIGTERM in
    the main thread. ``interrupt_main`` calls the Python handler there, and
    does nothing once Python's own (or no) handler is back."""
    with _lock:
        if _state.timer is None or _state.timer is not threading.current_thread():
            return  # cancelled meanwhile
        _state.timer, _state.expired = None, True
    _thread.interrupt_main(signal.SIGTERM)


def _cancel() -> None:
    """Stop a grace period that is running (the wait it was for is over)."""
    with _lock:
        timer, _state.timer = _state.timer, None
    if timer is not None:
        timer.cancel()
        timer.join()  # at once: its thread only waits (or found no timer)


def installed() -> bool:
    """Whether fedsim's handlers are in place (inside :func:`stop_at_round_ends`)."""
    return _state.depth > 0


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
    _state.depth, _state.asked, _state.expired = 1, 0, False
    try:
        yield
    finally:
        _cancel()
        _state.depth, _state.asked, _state.expired = 0, 0, False
        _state.deferred = _state.redelivered = False
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
def waiting_for(what: str) -> Iterator[None]:
    """Inside the block a first signal waits for the block's end (a second,
    or a SIGTERM's grace period, raises at once); at the end it raises.

    Args:
        what: what is waited for, as the waiting line says it ("Ray's start").

    Raises:
        KeyboardInterrupt: on leaving the block, when a signal arrived
            inside :func:`stop_at_round_ends`.
    """
    _state.waits.append(what)
    try:
        yield
    finally:
        _state.waits.pop()
        _cancel()
    before_round()


@contextmanager
def round_loop() -> Iterator[None]:
    """Mark a run's round loop: inside it a first signal waits for
    :func:`before_round`. The runtime wraps its loop in this."""
    _state.waits.append("this round")
    try:
        yield
    finally:
        _state.waits.pop()
        _cancel()


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
