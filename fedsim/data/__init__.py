"""Federated datasets: who holds which samples (docs/datasets.md).

A scenario's ``data`` section is a dataset spec (:class:`base.DatasetSpec`),
picked by its ``dataset`` field: its fields say what to load or generate and
how to split it over the clients, and two methods answer:

- ``build(num_clients, seed)``: the :class:`FederatedData` (every client's
  rows and the test set), a pure function of the fields, the seed and the
  files; :func:`build_data` adds the server's validation rows.
- ``info(num_clients)``: the sample kind, shape, classes and count from the
  fields alone, so ``fedsim validate`` checks the model and the memory without
  building anything.

The modules: ``synthetic``, ``feddyn_synthetic`` and ``quadratic`` generate
their data; ``images``, ``shakespeare`` and ``tabular`` read files (a missing
one raises :class:`DataMissingError` saying where to get it); ``partition``
splits labels over clients; ``validation`` holds out the server's rows.

Adding a dataset: a module here with a :class:`~fedsim.spec.Spec` subclass
tagged by a ``Literal`` ``dataset`` field whose ``build(num_clients, seed)``
returns a :class:`FederatedData` and whose ``info`` states its samples, plus
a line in ``REGISTRY``; one outside fedsim: docs/extending.md.
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

# the built-in datasets by their ``dataset`` name
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
