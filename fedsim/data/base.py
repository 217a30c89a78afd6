"""The federated dataset container and the factory that builds one from a scenario."""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["FederatedData", "build_data", "as_tensor"]


def as_tensor(a: np.ndarray) -> torch.Tensor:
    """A tensor view of a (possibly read-only, object-store) array, no copy.

    Arrays from the Ray object store are read-only; fedsim never writes to
    training data, so torch's warning about that is silenced here.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(np.ascontiguousarray(a))


@dataclass(frozen=True, eq=False)
class FederatedData:
    """Training data of every client plus a shared test set.

    Attributes:
        x: training inputs of all clients, client 0's rows first.
        y: training targets (int64 class labels, or float targets).
        offsets: int64 [m + 1]; client i owns rows ``offsets[i]:offsets[i+1]``.
        weights: float64 [m]; the data weight of each client (n_i, or the p_i
            a scenario gives). Aggregators normalise it over a round's updates.
        test_x, test_y: the test set the server evaluates on.
        test_weights: optional per-sample weights of the test loss.
        num_classes: number of classes (0 for objectives without classes).
    """

    x: np.ndarray
    y: np.ndarray
    offsets: np.ndarray
    weights: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray
    num_classes: int
    test_weights: np.ndarray | None = None
    # Optional server-side validation set (FedPNS's CHECK LOSS); the test set
    # stands in when absent.
    val_x: np.ndarray | None = None
    val_y: np.ndarray | None = None

    @property
    def num_clients(self) -> int:
        return len(self.offsets) - 1

    @property
    def n_samples(self) -> np.ndarray:
        return np.diff(self.offsets)

    @property
    def input_dim(self) -> int:
        return int(np.prod(self.x.shape[1:]))

    def client_rows(self, i: int) -> slice:
        return slice(int(self.offsets[i]), int(self.offsets[i + 1]))


def build_data(spec, num_clients: int, seed: int) -> FederatedData:  # noqa: ANN001
    """Build the dataset a scenario's ``data`` section describes."""
    return spec.build(num_clients, seed)
