"""The quadratic objectives of the FedNova paper (docs/algorithms.md section 6).

Client i: F_i(x) = h_i/2 ||x - e_i||^2 with deterministic gradients (its one
"sample" is e_i, its target h_i); the test "set" is every e_i weighted by
p_i, so the reported test loss is F(x) = sum_i p_i F_i(x).

F's minimiser is known in closed form, sum_i p_i h_i e_i / sum_i p_i h_i,
so how far a run ends from it (the FedNova paper's objective inconsistency
under heterogeneous local steps) can be read off exactly. There is no
randomness: the seed is unused.
"""

from __future__ import annotations

from typing import ClassVar, Literal

import numpy as np
from pydantic import Field, model_validator

from fedsim.data.base import DataInfo, DatasetSpec, FederatedData
from fedsim.spec import PosFloat


class QuadraticData(DatasetSpec):
    """The FedNova paper's quadratic objectives: ``centers`` e_i (scalars, or
    vectors of length ``dim``), ``weights`` p_i (normalised; default equal),
    ``curvatures`` h_i (default 1).

    One client per center: the client count is fixed by the scenario, not
    the fleet. ``x0`` is the initial model's value in every coordinate.
    """

    dataset: Literal["quadratic"]
    centers: list[float | list[float]] = Field(min_length=1)
    weights: list[PosFloat] | None = None
    curvatures: list[PosFloat] | None = None
    x0: float = 0.0

    # a validation split would take a client's only row, its whole objective
    no_validation: ClassVar[str | None] = (
        "each quadratic client's single row is its objective"
    )
    # the centers, curvatures and x0 are the objective and the model's start
    float32_fields: ClassVar[bool] = True

    @model_validator(mode="after")
    def _lengths(self) -> QuadraticData:
        """One weight and curvature per center; centers of one length > 0."""
        m = len(self.centers)
        for name in ("weights", "curvatures"):
            value = getattr(self, name)
            if value is not None and len(value) != m:
                raise ValueError(
                    f"{name} has {len(value)} entries but centers has {m}; "
                    "give one per client"
                )
        # a scalar center is a vector of length 1
        dims = {1 if isinstance(c, float | int) else len(c) for c in self.centers}
        if len(dims) != 1 or 0 in dims:
            raise ValueError("centers must all have the same (non-zero) length")
        return self

    @property
    def start_value(self) -> float:
        """``x0``: the objective's starting point, in every coordinate."""
        return self.x0

    @property
    def clients(self) -> int:
        """One client per center."""
        return len(self.centers)

    def info(self, num_clients: int) -> DataInfo:
        """One row per center, as long as a center; no classes (an objective).

        Args:
            num_clients: Unused: the centers fix the clients.
        """
        first = self.centers[0]
        dim = len(first) if isinstance(first, list) else 1
        return DataInfo("vector", (dim,), 0, len(self.centers))

    def build(self, num_clients: int, seed: int) -> FederatedData:
        """The objectives as a FederatedData of one row per client.

        Args:
            num_clients: Unused: the centers fix the clients.
            seed: Unused: nothing here is random.

        Returns:
            x: the centers e_i [m, dim]; y: the curvatures h_i (the
            quadratic loss takes them in the targets' place); weights and
            test_weights: p_i, summing to 1; ``num_classes`` 0 (no classes).
        """
        m = self.clients
        e = np.array([np.ravel(c) for c in self.centers], dtype=np.float64)
        h = np.array(self.curvatures or [1.0] * m, dtype=np.float64)
        p = np.array(self.weights or [1.0] * m, dtype=np.float64)
        p = p / p.sum()
        # copies, so the test set never aliases the training rows
        return FederatedData(
            x=e,
            y=h,
            offsets=np.arange(m + 1, dtype=np.int64),
            weights=p,
            test_x=e.copy(),
            test_y=h.copy(),
            num_classes=0,
            test_weights=p.copy(),
        )
