"""Federated datasets: who holds which samples (docs/datasets.md).

Adding a dataset: a module here with a :class:`~fedsim.spec.Spec` subclass
tagged by a ``Literal`` ``dataset`` field whose ``build(num_clients, seed)``
returns a :class:`FederatedData`, plus a line in ``REGISTRY``.
"""

from __future__ import annotations

from fedsim.data.base import FederatedData
from fedsim.data.errors import DataError, DataMissingError
from fedsim.data.feddyn_synthetic import FedDynSyntheticData
from fedsim.data.fedpns_synthetic import FedPNSSyntheticData
from fedsim.data.images import (
    Cifar10Data,
    Cifar100Data,
    EmnistData,
    FashionMnistData,
    MnistData,
)
from fedsim.data.quadratic import QuadraticData
from fedsim.data.shakespeare import ShakespeareData
from fedsim.data.synthetic import SyntheticData
from fedsim.data.tabular import TabularData
from fedsim.data.validation import build_data

__all__ = ["FederatedData", "DataError", "DataMissingError", "build_data", "REGISTRY"]

REGISTRY = {
    "synthetic": SyntheticData,
    "quadratic": QuadraticData,
    "mnist": MnistData,
    "fashion_mnist": FashionMnistData,
    "emnist": EmnistData,
    "cifar10": Cifar10Data,
    "cifar100": Cifar100Data,
    "shakespeare": ShakespeareData,
    "tabular": TabularData,
    "feddyn_synthetic": FedDynSyntheticData,
    "fedpns_synthetic": FedPNSSyntheticData,
}
