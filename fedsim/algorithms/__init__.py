"""Aggregation algorithms, one module each, and the registry that builds them
from a scenario's ``algorithm`` section.

Adding an algorithm: write ``fedsim/algorithms/<name>.py`` with a frozen
dataclass deriving from :class:`~fedsim.algorithms.base.Algorithm` (its fields
are its hyperparameters, validated when a scenario is loaded), and add a line
to ``REGISTRY`` below. Nothing else changes.
"""

from __future__ import annotations

from fedsim.algorithms.base import AggregateInfo, Algorithm, ClientUpdate
from fedsim.algorithms.fedavg import FedAvg
from fedsim.algorithms.fednova import FedNova
from fedsim.algorithms.fedprox import FedProx

__all__ = [
    "AggregateInfo",
    "Algorithm",
    "ClientUpdate",
    "FedAvg",
    "FedNova",
    "FedProx",
    "REGISTRY",
    "make_algorithm",
]

REGISTRY: dict[str, type[Algorithm]] = {
    "fedavg": FedAvg,
    "fedprox": FedProx,
    "fednova": FedNova,
}


def make_algorithm(spec: Algorithm) -> Algorithm:
    """The scenario's ``algorithm`` section is already the algorithm object."""
    return spec
