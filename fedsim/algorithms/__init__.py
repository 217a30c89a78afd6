"""Aggregation algorithms, one module each, and the registry that builds them
from a scenario's ``algorithm`` section.

Adding an algorithm: write ``fedsim/algorithms/<name>.py`` with a frozen
dataclass deriving from :class:`~fedsim.algorithms.base.Algorithm`, add its
spec to ``fedsim/scenario.py`` and a line to ``REGISTRY`` below.
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


def make_algorithm(spec) -> Algorithm:  # noqa: ANN001 - any AlgorithmSpec
    """Build the algorithm a scenario's ``algorithm`` section describes."""
    fields = spec.model_dump()
    cls = REGISTRY[fields.pop("name")]
    return cls(**fields)
