"""Federated datasets: who holds which samples.

A :class:`FederatedData` keeps every client's training samples in one array,
sorted by client, so client i owns rows ``offsets[i]:offsets[i+1]``. Workers
receive it once (through the Ray object store, zero-copy for NumPy arrays)
and draw minibatches by index; nothing is pickled per task.

Adding a dataset: a module here with a :class:`~fedsim.spec.Spec` subclass
whose ``dataset`` field is a ``Literal`` tag and whose ``build(num_clients,
seed)`` returns a :class:`FederatedData`, plus a line in ``REGISTRY``.
"""

from __future__ import annotations

from fedsim.data.base import FederatedData, build_data
from fedsim.data.quadratic import QuadraticData
from fedsim.data.synthetic import SyntheticData

__all__ = ["FederatedData", "build_data", "REGISTRY"]

REGISTRY = {
    "synthetic": SyntheticData,
    "quadratic": QuadraticData,
}
