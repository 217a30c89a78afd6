"""The FedDyn/FedDC synthetic logistic-regression data (docs/algorithms.md 2.2).

Federated Learning Based on Dynamic Regularization (Acar et al., ICLR 2021,
arXiv:2111.04263) and FedDC (Gao et al., CVPR 2022, arXiv:2203.11751): the
generator behind FedDC's Table 3. Per client i: mean_W_i ~ N(0, alpha),
B_i ~ N(0, beta); x ~ N(mu_i, diag(j^-1.2)) with mu_i ~ N(B_i, 1) (0 if
``iid_data``); y = argmax(x W_i + b_i), entries ~ N(mean_W_i, 1) (one shared
W, b ~ N(0, 1) if ``iid_sol``). As in the papers, **the test set is the union
of the clients' training data**. Deviations and flag settings: docs/datasets.md.
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

import numpy as np
from pydantic import Field

from fedsim.data.base import DataInfo, DatasetSpec, FederatedData
from fedsim.spec import NonNegFloat

_TAG = 0xFDD5  # this generator's stream of the scenario seed


class FedDynSyntheticData(DatasetSpec):
    """The FedDyn/FedDC synthetic generator (docs/algorithms.md 2.2).

    Example:
        >>> d = FedDynSyntheticData(dataset="feddyn_synthetic", clients=4).build(4, 0)
        >>> d.x.shape, d.num_classes, d.n_samples.tolist(), d.test_x.shape
        ((800, 30), 5, [200, 200, 200, 200], (800, 30))
    """

    dataset: Literal["feddyn_synthetic"]
    alpha: NonNegFloat = 0.0
    beta: NonNegFloat = 0.0
    iid_sol: bool = True
    iid_data: bool = True
    clients: Annotated[int, Field(ge=1, le=1_000_000)] = 20
    samples: Annotated[int, Field(ge=1, le=1_000_000)] = 200
    size_sigma: float = Field(0.0, ge=0, le=5)
    dim: Annotated[int, Field(ge=1, le=100_000)] = 30
    classes: Annotated[int, Field(ge=2, le=10_000)] = 5

    no_validation: ClassVar[str | None] = (
        "feddyn_synthetic's test set is its training data (as in the papers), "
        "so no training row can be held out from it"
    )

    def info(self, num_clients: int) -> DataInfo:
        """Vectors of ``dim``; ``samples`` per client, counted twice (the test
        set is a copy of the training data).

        Args:
            num_clients: Unused: the client count is the ``clients`` field.
        """
        samples = 2 * self.clients * self.samples
        return DataInfo("vector", (self.dim,), self.classes, samples)

    def build(self, num_clients: int, seed: int) -> FederatedData:
        """Generate every client's samples from the scenario seed.

        Args:
            num_clients: Unused: ``clients`` fixes the clients.
            seed: The scenario seed; the data is a pure function of it and
                the fields.

        Returns:
            float32 features and int64 labels, clients one after another,
            weighted by their sizes; the test set is a copy of the training
            data.
        """
        m, d, c = self.clients, self.dim, self.classes
        rng = np.random.default_rng(np.random.SeedSequence([seed, _TAG]))

        # + 0.001: with size_sigma 0, int() of exp(log(200)) may give 199
        sizes = rng.lognormal(np.log(self.samples + 0.001), self.size_sigma, m)
        sizes = np.maximum(sizes.astype(np.int64), 1)
        mean_w = rng.normal(0.0, self.alpha, m)
        shift = rng.normal(0.0, self.beta, m)
        sd = np.arange(1, d + 1, dtype=np.float64) ** -0.6  # sqrt of j^-1.2
        # drawn whatever iid_sol says, so the draws after it start at the same
        # point of the stream either way
        w = rng.normal(0.0, 1.0, (d, c))  # the shared solution (iid_sol)
        b = rng.normal(0.0, 1.0, (1, c))

        xs, ys = [], []
        for i in range(m):
            if not self.iid_sol:
                w = rng.normal(mean_w[i], 1.0, (d, c))
                b = rng.normal(mean_w[i], 1.0, (1, c))
            mu = np.zeros(d) if self.iid_data else rng.normal(shift[i], 1.0, d)
            x = mu + sd * rng.standard_normal((int(sizes[i]), d))
            xs.append(x)
            ys.append(np.argmax(x @ w + b, axis=1))

        x_all = np.concatenate(xs).astype(np.float32)
        y_all = np.concatenate(ys).astype(np.int64)
        return FederatedData(
            x=x_all,
            y=y_all,
            offsets=np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64),
            weights=sizes.astype(np.float64),
            test_x=x_all.copy(),  # the papers' "test set" is the training data
            test_y=y_all.copy(),
            num_classes=c,
        )
