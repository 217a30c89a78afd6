"""Aggregation algorithms, one module each, and their registry.

Each algorithm is the scenario's ``algorithm`` section itself: a spec whose
fields are its hyperparameters and whose methods (:class:`base.Algorithm`) say
what a client does around its local steps and how the server combines the
updates. The built-ins, by what they keep between rounds:

- none: ``fedavg``, ``fedprox`` (a proximal term), ``fednova`` and
  ``fednova_vr`` (updates normalised by the local steps taken);
- on the server: ``fedavgm`` (momentum), ``fedadam`` (Adam on the update);
- on every client and the server: ``scaffold`` (control variates),
  ``feddyn`` and ``feddc`` (dynamic regularisers, drift);
- their own procedure: ``feddm`` (clients send synthetic per-class sets the
  server trains on), ``fedpns`` (drops updates that pull against the others;
  its node selection is :mod:`fedsim.selectors.fedpns`);
- asynchronous: ``fedasync`` (each update on arrival), ``fedbuff`` (a buffer).

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
from fedsim.algorithms.flower import Flower
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
    "Flower",
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
    "flower": Flower,  # a Flower strategy (the optional extra fedsim[flower])
}


# A scenario's algorithm when its section names none.
DEFAULT = "fedavg"


def make_algorithm(spec: Algorithm) -> Algorithm:
    """The algorithm a worker or the server runs, for the scenario's section.

    The section is already the algorithm object (its fields are validated when
    the scenario loads), so this returns it unchanged; it stays the one place
    that turns a section into an algorithm.

    Args:
        spec: The scenario's ``algorithm`` section.
    """
    return spec
