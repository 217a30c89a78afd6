"""The quadratic objectives of the FedNova paper (ALGORITHMS.md section 6).

Client i: F_i(x) = h_i/2 ||x - e_i||^2, with deterministic gradients (each
client's single "sample" is its centre e_i; its target is the curvature h_i).
The global objective is F(x) = sum_i p_i F_i(x), minimised at
x* = sum_i p_i h_i e_i / sum_i p_i h_i. The test "set" is every client's
centre weighted by p_i, so the reported test loss is F(x).
"""

from __future__ import annotations

import numpy as np

from fedsim.data.base import FederatedData

__all__ = ["quadratic"]


def quadratic(spec) -> FederatedData:  # noqa: ANN001
    m, dim = spec.clients, spec.dim
    e = np.array(
        [[c] * dim if isinstance(c, float | int) else c for c in spec.centers],
        dtype=np.float64,
    ).reshape(m, dim)
    h = np.array(spec.curvatures or [1.0] * m, dtype=np.float64)
    p = np.array(spec.weights or [1.0] * m, dtype=np.float64)
    p = p / p.sum()
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
