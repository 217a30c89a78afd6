"""Placement of the Ray actors: the placement group of a run's workers,
the server actor's bundle, and how many workers a run uses (``resources``
in the scenario). The shapes under which workers and the server actor park
are :class:`fedsim.remote.actors.ActorShape`'s."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from fedsim.errors import LoadError
from fedsim.spec import ResourceSpec

if TYPE_CHECKING:
    from ray.util.placement_group import PlacementGroup


class PlacementError(LoadError, RuntimeError):
    """The worker actors cannot be placed as ``resources.placement`` asks."""


# Ray's own resource names; the others a node declares are its custom ones.
_BUILTIN = ("CPU", "GPU", "memory", "object_store_memory")


def custom_resources(resources: Mapping[str, float]) -> dict[str, float]:
    """A node's custom resources (what cluster configs add to place work):
    Ray's built-in ones and per-node markers left out."""
    return {
        k: v
        for k, v in resources.items()
        if k not in _BUILTIN and not k.startswith(("node:", "accelerator_type:"))
    }


def server_bundle(res: ResourceSpec) -> dict[str, float] | None:
    """The server actor's bundle (its positive resources), or None when the
    server runs in the driver or asks for nothing a bundle can hold."""
    spec = res.server
    if spec.home != "actor":
        return None
    asked = {"CPU": spec.cpus, "GPU": spec.gpus, **spec.resources}
    return {k: float(v) for k, v in asked.items() if v > 0} or None


def placement_group_for(res: ResourceSpec, n: int) -> PlacementGroup:
    """A placement group of ``n`` bundles for ``res.placement``, once placed,
    plus a last one for the server actor when it asks for resources.

    Args:
        res: the scenario's ``resources`` section.
        n: the number of worker actors (one bundle each).

    Raises:
        PlacementError: Ray could not place the bundles within
            ``placement_timeout_s``; the group is removed first.
    """
    import ray

    bundle: dict[str, float] = {"CPU": res.cpus_per_worker}
    if res.gpus_per_worker:
        bundle["GPU"] = res.gpus_per_worker
    bundles = [dict(bundle) for _ in range(n)]
    server = server_bundle(res)
    if server is not None:
        bundles.append(server)
    pg = ray.util.placement_group(bundles, res.placement.upper())
    try:
        ray.get(pg.ready(), timeout=res.placement_timeout_s)
    except ray.exceptions.GetTimeoutError:
        ray.util.remove_placement_group(pg)
        raise PlacementError(
            f"resources.placement {res.placement}: Ray could not place {n} "
            f"workers of {bundle} within resources.placement_timeout_s = "
            f"{res.placement_timeout_s:g}s (server bundle: {server}); the cluster has "
            f"{len([x for x in ray.nodes() if x['Alive']])} live nodes and "
            f"{ray.cluster_resources()} in all (strict_spread needs a node per "
            "worker, strict_pack one node with room for all)"
        ) from None
    return pg


def resolve_workers(res: ResourceSpec, override: int | None) -> int:
    """How many worker actors a run uses.

    Args:
        res: the ``resources`` section (``workers``: a count or ``auto``).
        override: the command line's ``--workers``, which wins when given.

    Returns:
        The override, the scenario's count, or for ``auto`` the cluster's
        CPUs over ``cpus_per_worker`` (at least 1; 1 without Ray), less
        those of a server actor (``resources.server.cpus``).
    """
    if override is not None:
        return override
    if res.workers != "auto":
        return int(res.workers)
    import ray

    cpus = ray.cluster_resources().get("CPU", 1.0) if ray.is_initialized() else 1.0
    if res.server.home == "actor":  # room for the server actor too
        cpus -= res.server.cpus
    return max(1, int(cpus // res.cpus_per_worker))
