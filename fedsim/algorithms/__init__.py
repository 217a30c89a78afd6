"""Aggregation algorithms, one module each, and their registry.

``REGISTRY`` maps the built-in names to their classes; a scenario's
``algorithm.name`` is looked up there first, then among the entry points of
group ``fedsim.algorithms`` that installed packages declare, then as an import
path ``module:Class`` (:mod:`fedsim.plugins`). ``DEFAULT`` names the algorithm
of an ``algorithm`` section that gives no name. Adding a built-in: a module and
a ``REGISTRY`` line; adding one outside fedsim: docs/extending.md.
"""

from __future__ import annotations

from fedsim.algorithms.base import AggregateInfo, Algorithm, ClientUpdate
from fedsim.algorithms.fedadam import FedAdam
from fedsim.algorithms.fedasync import FedAsync
from fedsim.algorithms.fedavg import FedAvg
from fedsim.algorithms.fedavgm import FedAvgM
from fedsim.algorithms.fedbuff import FedBuff
from fedsim.algorithms.feddc import FedDC
from fedsim.algorithms.feddm import FedDM
from fedsim.algorithms.feddyn import FedDyn
from fedsim.algorithms.fednova import FedNova
from fedsim.algorithms.fednova_vr import FedNovaVR
from fedsim.algorithms.fedpns import FedPNS
from fedsim.algorithms.fedprox import FedProx
from fedsim.algorithms.scaffold import Scaffold

__all__ = [
    "AggregateInfo",
    "Algorithm",
    "ClientUpdate",
    "DEFAULT",
    "FedAdam",
    "FedAvg",
    "FedAsync",
    "FedAvgM",
    "FedBuff",
    "FedDC",
    "FedDM",
    "FedDyn",
    "FedNova",
    "FedNovaVR",
    "FedPNS",
    "FedProx",
    "REGISTRY",
    "Scaffold",
    "make_algorithm",
]

REGISTRY: dict[str, type[Algorithm]] = {
    "fedavg": FedAvg,
    "fedprox": FedProx,
    "fednova": FedNova,
    "fednova_vr": FedNovaVR,
    "scaffold": Scaffold,
    "feddyn": FedDyn,
    "feddc": FedDC,
    "fedavgm": FedAvgM,
    "fedadam": FedAdam,
    "fedasync": FedAsync,
    "fedbuff": FedBuff,
    "feddm": FedDM,
    "fedpns": FedPNS,
}


# A scenario's algorithm when its section names none.
DEFAULT = "fedavg"


def make_algorithm(spec: Algorithm) -> Algorithm:
    """The scenario's ``algorithm`` section is already the algorithm object."""
    return spec
