"""Starting or joining Ray: join the cluster of ``--address`` or
``RAY_ADDRESS`` (set by ``ray job submit``), else start an embedded local Ray
listening on 127.0.0.1 only.

Two things go wrong at start that the command line must say in one line:

- Ray's processes start more slowly than Ray waits for them (a loaded
  machine): :class:`RayStartError` names the wait and how to lengthen it,
  instead of Ray's 50-line traceback.
- A SIGTERM or Ctrl-C arrives while Ray starts: ``ray.init`` replaces the
  SIGTERM handler with one that exits the process (exit 15, nothing said),
  and its core worker installs a C++ handler that dumps a stack and aborts.
  Under the ``fedsim`` command's handlers (fedsim/interrupts.py) Ray is
  kept from both, the signal waits for the start's end like a round's, and
  the run ends as an interrupted set-up.

And one thing goes wrong after it, in the workers, unless the start
prevents it: Ray puts the driver's working folder first on every worker's
``sys.path``. Started from a folder that holds a fedsim checkout under the
name ``fedsim/`` (``fedsim/`` and ``mymethods/`` side by side), a worker
then imports ``fedsim`` as a namespace package rooted at the checkout
(``fedsim.results`` is its ``results/`` folder) wherever the installed
package is found by a finder that runs after Python's path search (an
editable install). :func:`worker_code_paths` gives the workers the folder
that holds the driver's own package, where a regular package beats the
namespace (:func:`init_ray` passes it in the job's config).
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from fedsim import interrupts
from fedsim.errors import RunError

_LOOPBACK = "127.0.0.1"
# Ray's wait for its GCS server (its port file, then its first answer), in
# seconds; Ray's default, and the variable that sets it.
GCS_WAIT_ENV = "RAY_gcs_server_port_wait_time_s"
_GCS_WAIT_DEFAULT_S = 30
# How Ray words a start that took longer than it waits for its GCS server
# (GCS_WAIT_ENV sets that wait), and for its node (a fixed 30 s in Ray).
_GCS_LATE = ("Timed out waiting for file", "Failed to start GCS")
_NODE_LATE = ("timed out during startup",)


# The logger of Ray's note that a new local cluster uses token authentication.
_TOKEN_LOGGER = "ray._private.authentication.authentication_token_setup"


class RayStartError(RunError, RuntimeError):
    """An embedded Ray did not start within Ray's waits; the message is one
    line for the user: how long, and how to give it longer (CLI exit 1)."""


def init_ray(address: str | None = None, num_cpus: int | None = None) -> bool:
    """Connect to Ray; return True if this call started an embedded local Ray.

    Raises:
        RayStartError: the embedded Ray did not start in time.
        KeyboardInterrupt: a signal arrived while Ray started, under the
            ``fedsim`` command's handlers (raised once Ray is up).
    """
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    address = address or os.environ.get("RAY_ADDRESS") or None
    if not address:
        # else Ray binds the interface address (read when ray is imported)
        os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    import ray
    from ray._private import ray_constants

    if ray.is_initialized():
        return False
    # every worker and server actor of this job imports the driver's fedsim
    job_config = ray.job_config.JobConfig(_py_driver_sys_path=worker_code_paths())
    # ray.init replaces the SIGTERM handler: `fedsim run` keeps its own
    with interrupts.kept(), _signals_wait_for_the_start():
        if address:
            ray.init(
                address=address,
                job_config=job_config,
                logging_level=logging.WARNING,
                log_to_driver=True,
            )
            return False
        # If ray was imported before the variable was set, its constant is stale.
        ray_constants.ENABLE_RAY_CLUSTER = False
        # Ray enables token authentication for a new local cluster and logs
        # a WARNING that it did (printed even under --quiet): nothing for the
        # user to act on for a loopback-only Ray that fedsim starts and
        # stops, so that one logger is quietened (Ray's errors still show).
        # Setting RAY_AUTH_MODE here instead would come after Ray read its
        # configuration at import, and the driver would then lack the token.
        logging.getLogger(_TOKEN_LOGGER).setLevel(logging.ERROR)
        start = time.monotonic()
        try:
            ray.init(
                address="local",
                job_config=job_config,
                num_cpus=num_cpus,
                include_dashboard=False,
                _node_ip_address=_LOOPBACK,
                logging_level=logging.WARNING,
                log_to_driver=True,
            )
        except Exception as exc:  # Ray raises RuntimeError or Exception itself
            _raise_if_slow_start(exc, time.monotonic() - start)
            raise
    return True


def worker_code_paths() -> list[str]:
    """The folders Ray must add to its workers' ``sys.path`` so that they
    import the same ``fedsim`` as this process: the folder holding the
    package, when this process does not find it through ``sys.path``
    itself (an editable install's import hook), else none.

    Why: Ray inserts the driver's working folder first on each worker's
    path. A ``fedsim/`` folder there without an ``__init__.py`` (a checkout
    next to the user's own package) is a namespace portion, and Python's
    path search returns a namespace package when it finds no regular one
    on the path, before an editable install's hook is asked. With the
    package's own folder on the path, the path search finds the regular
    package, which wins over namespace portions wherever they stand. A
    folder already on ``sys.path`` (site-packages, the checkout run from
    its root) is not added again: added in front, it would move installed
    packages ahead of the user's ``PYTHONPATH``.

    Returns:
        A list of zero or one absolute folder paths.
    """
    import fedsim

    home = Path(fedsim.__file__).resolve().parent.parent
    on_path = {Path(entry or os.curdir).resolve() for entry in sys.path}
    return [] if home in on_path else [str(home)]


def _raise_if_slow_start(exc: Exception, waited_s: float) -> None:
    """Raise :class:`RayStartError` when ``exc`` is Ray saying that a part
    of it did not start within its wait; else return (a real error keeps
    its traceback)."""
    text, after = str(exc), f"Ray did not start in {waited_s:.0f} s: "
    instead = "or train in-process with --workers 0"
    if any(words in text for words in _GCS_LATE):
        wait = os.environ.get(GCS_WAIT_ENV, str(_GCS_WAIT_DEFAULT_S))
        raise RayStartError(
            f"{after}its GCS server was not up within {GCS_WAIT_ENV} = {wait} s; "
            f"on a loaded machine give it longer (e.g. export {GCS_WAIT_ENV}=120), "
            f"{instead}"
        ) from None
    if any(words in text for words in _NODE_LATE):
        raise RayStartError(
            f"{after}its node did not register within Ray's fixed 30 s; on a "
            f"loaded machine try again when it is less busy, {instead}"
        ) from None


@contextmanager
def _signals_wait_for_the_start() -> Iterator[None]:
    """Under the ``fedsim`` command's handlers, a signal during ``ray.init``
    waits for the start's end (:func:`fedsim.interrupts.waiting_for`): Ray
    may not replace the SIGTERM handler (its own exits the process), nor
    install its C++ failure handler in this process (a stack dump and an
    abort on SIGTERM; the worker processes keep theirs). Library callers
    keep Ray's behaviour."""
    if not interrupts.installed():
        yield
        return
    from ray._private import ray_constants, utils

    set_handler = utils.set_sigterm_handler
    dump = ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER
    utils.set_sigterm_handler = lambda handler: None  # keep fedsim's
    ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER = True  # read by the driver
    try:
        with interrupts.waiting_for("Ray's start"):
            yield
    finally:
        utils.set_sigterm_handler = set_handler
        ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER = dump


def shutdown_ray() -> None:
    """Shut down this process's Ray session, if it has one (never a
    cluster's other processes)."""
    import ray

    from fedsim.remote.actors import release_parked

    if ray.is_initialized():
        release_parked()  # warm actors die with the session; forget them
        ray.shutdown()
