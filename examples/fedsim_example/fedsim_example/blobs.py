"""Gaussian blobs, as a dataset plug-in: each client holds ``samples_per_client``
points of a few classes, whose centres it sees shifted by its own offset
(feature skew, scaled by ``skew``). The fields are the scenario's ``data``
section; ``info`` states the samples' shape without building them."""

from __future__ import annotations

from typing import Annotated

import numpy as np
from pydantic import Field

from fedsim.api import DataInfo, Dataset, FederatedData


class Blobs(Dataset):
    """``classes`` Gaussian blobs in ``features`` dimensions, 10% of each
    client's points held out for the shared test set.

    >>> data = Blobs(features=2, classes=3, samples_per_client=10).build(4, seed=0)
    >>> data.num_clients, data.x.shape, data.num_classes
    (4, (36, 2), 3)
    """

    features: Annotated[int, Field(ge=1, le=10_000)] = 8
    classes: Annotated[int, Field(ge=2, le=1_000)] = 3
    samples_per_client: Annotated[int, Field(ge=2, le=100_000)] = 40
    skew: Annotated[float, Field(ge=0)] = 0.5

    def build(self, num_clients: int, seed: int) -> FederatedData:
        m, n = self.clients or num_clients, self.samples_per_client
        rng = np.random.default_rng(np.random.SeedSequence([seed, 0xB10B]))
        centres = rng.normal(0.0, 3.0, (self.classes, self.features))
        n_train = n - max(1, n // 10)
        train, test = [], []
        for _ in range(m):
            offset = rng.normal(0.0, self.skew, self.features)
            y = rng.integers(0, self.classes, n)
            x = centres[y] + offset + rng.standard_normal((n, self.features))
            train.append((x[:n_train], y[:n_train]))
            test.append((x[n_train:], y[n_train:]))
        x, y = (np.concatenate(a) for a in zip(*train, strict=True))
        test_x, test_y = (np.concatenate(a) for a in zip(*test, strict=True))
        return FederatedData(
            x=x.astype(np.float32),
            y=y.astype(np.int64),
            offsets=np.arange(m + 1, dtype=np.int64) * n_train,
            weights=np.full(m, float(n_train)),
            test_x=test_x.astype(np.float32),
            test_y=test_y.astype(np.int64),
            num_classes=self.classes,
        )

    def info(self, num_clients: int) -> DataInfo:
        samples = (self.clients or num_clients) * self.samples_per_client
        return DataInfo("vector", (self.features,), self.classes, samples)
