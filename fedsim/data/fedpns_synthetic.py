"""FedPNS's synthetic data: i.i.d. nodes sharing one model, and non-i.i.d.
nodes each with its own (docs/algorithms.md 2.5, "Synthetic").

Wu and Wang, "Node Selection Toward Faster Convergence for Federated Learning
on Non-IID Data" (FedPNS), IEEE TNSE 2022, arXiv:2105.07066, Fig. 2. Of K =
``clients`` nodes, the first round(sigma K) (sigma = ``iid_fraction``) are
i.i.d.: they share one W, b with N(0, 1) entries and draw x ~ N(0, Sigma).
Each of the others draws its own W_k, b_k ~ N(0, 1) (alpha = 0, but no model
is shared) and x ~ N(mu_k, Sigma) with mu_k,j ~ N(B_k, 1), B_k ~ N(0,
``varrho``) (``varrho`` is the normal's scale, as beta in Synthetic(alpha,
beta); the paper uses 0.5 and 1). Sigma = diag(j^-1.2), the Synthetic(alpha,
beta) covariance; y = argmax(x W + b). Every node has ``samples`` (1000)
rows: the first ``train_fraction`` (60%) train, the rest are held out, and
**only the i.i.d. nodes' held-out rows form the test set**, as in the FedPNS
code (its CHECK LOSS scores them too: ``algorithm.check_loss_data: test``).
"""

from __future__ import annotations

from typing import Annotated, Literal

import numpy as np
from pydantic import Field, model_validator

from fedsim.data.base import DataInfo, DatasetSpec, FederatedData
from fedsim.spec import NonNegFloat

_TAG = 0xF295  # this generator's stream of the scenario seed


class FedPNSSyntheticData(DatasetSpec):
    """FedPNS's synthetic generator (module docstring).

    Example (two i.i.d. nodes of five, 10 rows each, 6 for training):
        >>> d = FedPNSSyntheticData(dataset="fedpns_synthetic", clients=5,
        ...                         iid_fraction=0.4, samples=10).build(5, 0)
        >>> d.x.shape, d.n_samples.tolist(), d.test_x.shape, d.num_classes
        ((30, 60), [6, 6, 6, 6, 6], (8, 60), 10)
    """

    dataset: Literal["fedpns_synthetic"]
    clients: Annotated[int, Field(ge=1, le=1_000_000)] = 50
    iid_fraction: float = Field(0.2, ge=0, le=1)  # sigma
    varrho: NonNegFloat = 0.5
    samples: Annotated[int, Field(ge=2, le=1_000_000)] = 1000
    train_fraction: float = Field(0.6, gt=0, lt=1)
    dim: Annotated[int, Field(ge=1, le=100_000)] = 60
    classes: Annotated[int, Field(ge=2, le=10_000)] = 10

    @property
    def iid_nodes(self) -> int:
        """round(sigma K), the i.i.d. nodes (ids 0 to this - 1)."""
        return int(round(self.iid_fraction * self.clients))

    @property
    def train_rows(self) -> int:
        """Training rows per node, at least 1 and at most ``samples`` - 1."""
        n = int(round(self.train_fraction * self.samples))
        return min(max(n, 1), self.samples - 1)

    @model_validator(mode="after")
    def _needs_a_test_set(self) -> FedPNSSyntheticData:
        if self.iid_nodes == 0:
            raise ValueError(
                "iid_fraction * clients rounds to 0 i.i.d. nodes, and the test set "
                "is their held-out rows; raise iid_fraction"
            )
        return self

    def info(self, num_clients: int) -> DataInfo:
        """Vectors of ``dim`` features, ``classes`` classes, every node's rows."""
        return DataInfo(
            "vector", (self.dim,), self.classes, self.clients * self.samples
        )

    def build(self, num_clients: int, seed: int) -> FederatedData:
        """The nodes' training rows, by node, and the i.i.d. nodes' held-out
        rows as the test set; every draw from (``seed``, this generator)."""
        rng = np.random.default_rng(np.random.SeedSequence([seed, _TAG]))
        d, c, n, cut = self.dim, self.classes, self.samples, self.train_rows
        sd = np.arange(1, d + 1, dtype=np.float64) ** -0.6  # sqrt of j^-1.2
        w_iid, b_iid = rng.normal(0.0, 1.0, (d, c)), rng.normal(0.0, 1.0, c)
        train_x, train_y, test_x, test_y = [], [], [], []
        for k in range(self.clients):
            if k < self.iid_nodes:
                mu, w, b = np.zeros(d), w_iid, b_iid
            else:  # its own shift, then its own model
                mu = rng.normal(rng.normal(0.0, self.varrho), 1.0, d)
                w, b = rng.normal(0.0, 1.0, (d, c)), rng.normal(0.0, 1.0, c)
            x = mu + sd * rng.standard_normal((n, d))
            y = np.argmax(x @ w + b, axis=1)
            train_x.append(x[:cut])
            train_y.append(y[:cut])
            if k < self.iid_nodes:
                test_x.append(x[cut:])
                test_y.append(y[cut:])
        sizes = np.full(self.clients, cut, dtype=np.int64)
        return FederatedData(
            x=np.concatenate(train_x).astype(np.float32),
            y=np.concatenate(train_y).astype(np.int64),
            offsets=np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64),
            weights=sizes.astype(np.float64),
            test_x=np.concatenate(test_x).astype(np.float32),
            test_y=np.concatenate(test_y).astype(np.int64),
            num_classes=c,
        )
