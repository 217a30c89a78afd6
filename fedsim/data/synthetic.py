"""Synthetic(alpha, beta): the FedProx / LEAF generator (docs/algorithms.md 2.1).

Federated Optimization in Heterogeneous Networks (Li et al., MLSys 2020,
arXiv:1812.06127), section 5.1. For user k: u_k ~ N(0, alpha),
B_k ~ N(0, beta); v_k ~ N(B_k, 1)^d; W_k, b_k entries ~ N(u_k, 1);
x ~ N(v_k, diag(j^-1.2)); y = argmax(W_k^T x + b_k); n_k = int(LogNormal(4, 2))
+ 50. Each user's samples are split 90% train / 10% test.

alpha controls how much the users' models differ, beta how much their
inputs differ; ``iid: true`` gives every user the same model and inputs
(the paper's Synthetic-IID). The whole data set is a pure function of the
fields and the seed; every draw comes from one stream, in a fixed order.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

import numpy as np
from pydantic import Field

from fedsim.data.base import DataInfo, DatasetSpec, FederatedData
from fedsim.spec import NonNegFloat

_TAG = 0x5E7D  # separates this generator's stream from every other use of the seed


class SyntheticData(DatasetSpec):
    """Synthetic(alpha, beta) (standard deviations, as NumPy's ``scale``);
    ``clients`` defaults to the fleet size.

    ``size_mean`` and ``size_sigma`` are the LogNormal of the user sizes,
    ``min_samples`` is added to each and ``max_samples`` caps them (the
    paper's sizes have no cap: a LogNormal(4, 2) tail reaches tens of
    thousands).
    """

    dataset: Literal["synthetic"]
    alpha: NonNegFloat = 1.0
    beta: NonNegFloat = 1.0
    iid: bool = False
    clients: Annotated[int, Field(ge=1, le=10_000_000)] | None = None
    features: Annotated[int, Field(ge=1, le=100_000)] = 60
    classes: Annotated[int, Field(ge=2, le=10_000)] = 10
    test_fraction: Annotated[float, Field(gt=0, lt=1)] = 0.1
    size_mean: float = Field(4.0, ge=-10, le=10)
    size_sigma: float = Field(2.0, ge=0, le=5)
    min_samples: Annotated[int, Field(ge=1, le=1_000_000)] = 50
    max_samples: Annotated[int, Field(ge=1, le=1_000_000)] = 10_000

    def info(self, num_clients: int) -> DataInfo:
        """Vectors of ``features``; the sample count is the expected one.

        Args:
            num_clients: The fleet size, used when ``clients`` is not set.
        """
        clients = self.clients or num_clients
        # E[lognormal] + min_samples, capped as the generator caps each client
        mean = math.exp(self.size_mean + self.size_sigma**2 / 2) + self.min_samples
        total = int(clients * min(mean, self.max_samples))
        return DataInfo("vector", (self.features,), self.classes, total)

    def build(self, num_clients: int, seed: int) -> FederatedData:
        """Generate every user's samples; one client per user.

        Args:
            num_clients: The fleet size, used when ``clients`` is not set.
            seed: The scenario seed.

        Returns:
            float32 features and int64 labels, users stored one after
            another, weighted by their training samples; the test set is
            every user's 10% (``test_fraction``), pooled.
        """
        m, d, c = self.clients or num_clients, self.features, self.classes
        rng = np.random.default_rng(np.random.SeedSequence([seed, _TAG]))

        # draw order (sizes, model means, input shifts, then per user) is the
        # contract: reordering would change every existing Synthetic scenario
        sizes = rng.lognormal(self.size_mean, self.size_sigma, m).astype(np.int64)
        sizes = np.minimum(sizes + self.min_samples, max(self.max_samples, 1))
        mean_w = rng.normal(0.0, self.alpha, m)
        shift = rng.normal(0.0, self.beta, m)
        # feature j's variance is j^-1.2 (the paper's): later features vary less
        cov_diag = np.arange(1, d + 1, dtype=np.float64) ** -1.2
        mean_x = np.zeros(d)
        if self.iid:  # one model for every user
            w, b = rng.normal(0.0, 1.0, (d, c)), rng.normal(0.0, 1.0, c)

        users = []
        for k in range(m):
            if not self.iid:
                mean_x = rng.normal(shift[k], 1.0, d)
                w, b = rng.normal(mean_w[k], 1.0, (d, c)), rng.normal(mean_w[k], 1.0, c)
            n = int(sizes[k])
            x = mean_x + np.sqrt(cov_diag) * rng.standard_normal((n, d))
            y = np.argmax(x @ w + b, axis=1)
            # shuffled before the cut, so the test share is a random one
            perm = rng.permutation(n)
            x, y = x[perm], y[perm]
            # at least one training sample: a user is a client and must train
            n_train = max(1, int(round((1.0 - self.test_fraction) * n)))
            users.append((x[:n_train], y[:n_train], x[n_train:], y[n_train:]))

        x, y, test_x, test_y = (np.concatenate(a) for a in zip(*users, strict=True))
        counts = np.array([len(u[1]) for u in users], dtype=np.int64)
        return FederatedData(
            x=x.astype(np.float32),
            y=y.astype(np.int64),
            offsets=np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
            weights=counts.astype(np.float64),
            test_x=test_x.astype(np.float32),
            test_y=test_y.astype(np.int64),
            num_classes=c,
        )
