"""Starting or joining Ray: join the cluster of ``--address`` or
``RAY_ADDRESS`` (set by ``ray job submit``), else start an embedded local Ray
listening on 127.0.0.1 only."""

from __future__ import annotations

import logging
import os

from fedsim import interrupts

_LOOPBACK = "127.0.0.1"


def init_ray(address: str | None = None, num_cpus: int | None = None) -> bool:
    """Connect to Ray; return True if this call started an embedded local Ray."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    address = address or os.environ.get("RAY_ADDRESS") or None
    if not address:
        # else Ray binds the interface address (read when ray is imported)
        os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    import ray
    from ray._private import ray_constants

    if ray.is_initialized():
        return False
    # ray.init replaces the SIGTERM handler: `fedsim run` keeps its own
    with interrupts.kept():
        if address:
            ray.init(address=address, logging_level=logging.WARNING, log_to_driver=True)
            return False
        # If ray was imported before the variable was set, its constant is stale.
        ray_constants.ENABLE_RAY_CLUSTER = False
        ray.init(
            address="local",
            num_cpus=num_cpus,
            include_dashboard=False,
            _node_ip_address=_LOOPBACK,
            logging_level=logging.WARNING,
            log_to_driver=True,
        )
    return True


def shutdown_ray() -> None:
    """Shut down this process's Ray session, if it has one (never a
    cluster's other processes)."""
    import ray

    from fedsim.executors import release_parked

    if ray.is_initialized():
        release_parked()  # warm actors die with the session; forget them
        ray.shutdown()
