"""The federated dataset container and the fields every dataset spec shares."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, ClassVar

import numpy as np
from pydantic import Field, model_validator

from fedsim.lazy import torch
from fedsim.spec import DataInfo, Spec

__all__ = [
    "DataInfo",
    "DatasetSpec",
    "Dataset",
    "FederatedData",
    "as_tensor",
    "file_bytes",
]


def as_tensor(a: np.ndarray) -> torch.Tensor:
    """A tensor view of a (possibly read-only, object-store) array, no copy;
    fedsim never writes to training data, so torch's warning is silenced."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(np.ascontiguousarray(a))


@dataclass(frozen=True, eq=False)
class FederatedData:
    """Training data of every client plus a shared test set.

    Client i owns rows ``offsets[i]:offsets[i+1]`` of ``x``, ``y``;
    ``weights`` are the data weights (n_i, or a given p_i); ``num_classes`` is
    0 for objectives without classes; ``val_x``, ``val_y`` the server's
    validation rows (``data.validation_fraction``), or None; ``heldout_x``,
    ``heldout_y`` each client's own held-out rows for federated evaluation
    (``data.client_test_fraction``, :mod:`fedsim.data.heldout`), client i
    owning ``heldout_offsets[i]:heldout_offsets[i+1]``, or None.
    """

    x: np.ndarray
    y: np.ndarray
    offsets: np.ndarray
    weights: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray
    num_classes: int
    test_weights: np.ndarray | None = None
    val_x: np.ndarray | None = None
    val_y: np.ndarray | None = None
    heldout_x: np.ndarray | None = None
    heldout_y: np.ndarray | None = None
    heldout_offsets: np.ndarray | None = None

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


class DatasetSpec(Spec):
    """Fields every dataset's spec (the ``data`` section) shares:
    ``validation_fraction`` (:mod:`fedsim.data.validation`) and
    ``client_test_fraction`` (:mod:`fedsim.data.heldout`)."""

    validation_fraction: Annotated[float, Field(ge=0, le=0.5)] = 0.0
    # each client's own held-out rows, for federated evaluation
    client_test_fraction: Annotated[float, Field(ge=0, le=0.5)] = 0.0

    # why a dataset cannot give up validation rows (None: it can)
    no_validation: ClassVar[str | None] = None
    # whether the float fields enter float32 training as they are (then the
    # checks before a run refuse a value float32 cannot represent)
    float32_fields: ClassVar[bool] = False

    @model_validator(mode="after")
    def _validation_possible(self) -> DatasetSpec:
        if self.validation_fraction > 0 and self.no_validation is not None:
            raise ValueError(
                f"validation_fraction must be 0 here: {self.no_validation}"
            )
        # the same reason keeps a client's own rows from being held out
        if self.client_test_fraction > 0 and self.no_validation is not None:
            raise ValueError(
                f"client_test_fraction must be 0 here: {self.no_validation}"
            )
        return self

    @property
    def start_value(self) -> float | None:
        """The value every model parameter starts at when the data fixes the
        start (an objective's x_0, as the quadratic problems do); None, the
        default: the model's own initialisation."""
        return None

    def build(self, num_clients: int, seed: int) -> FederatedData:
        """The federated dataset.

        Args:
            num_clients: the fleet's size, for a dataset whose client count
                follows it.
            seed: the run's seed: every random choice is drawn from it.

        Returns:
            Every client's rows and the test set, a pure function of the
            fields, ``seed`` and the files read.
        """
        raise NotImplementedError

    def info(self, num_clients: int) -> DataInfo | None:
        """What the samples will be, from the fields alone (no file read beyond a
        header, no tensor built): the checks before a run use it to count the
        model's parameters and the memory, so ``fedsim validate`` stays fast.

        Every built-in dataset answers; None (this default) means nothing is
        known before the data is built, and the checks that need it are skipped.

        Args:
            num_clients: The fleet size, for a dataset whose client count
                follows it.
        """
        return None


def file_bytes(locate: Callable[[], Path]) -> int | None:
    """The size of the file ``locate`` finds, or None where it finds none.

    Args:
        locate: A dataset spec's ``locate`` method.
    """
    try:
        return locate().stat().st_size
    except Exception:  # noqa: BLE001 - missing data is reported when it is built
        return None


class Dataset(DatasetSpec):
    """Base of a dataset plug-in (the scenario's ``data`` section): ``dataset``
    is the text the scenario wrote (a registered name or ``module:Class``),
    ``clients`` the client count if the section gives one (else the fleet's).

    Subclasses implement ``build(num_clients, seed) -> FederatedData`` (every
    random choice from ``seed``) and should implement :meth:`info`.
    """

    dataset: str = ""
    clients: Annotated[int, Field(ge=1)] | None = None
