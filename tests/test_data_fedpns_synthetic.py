"""FedPNS's synthetic generator (its Fig. 2 data): i.i.d. nodes first, the
test set their held-out rows only."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from fedsim.data import REGISTRY
from fedsim.data.fedpns_synthetic import FedPNSSyntheticData
from fedsim.runtime import run_scenario
from fedsim.scenario import load_scenario

from .conftest import SCENARIOS


def spec(**kw) -> FedPNSSyntheticData:
    return FedPNSSyntheticData(dataset="fedpns_synthetic", **kw)


def test_it_is_registered_with_the_papers_defaults():
    d = spec()
    assert REGISTRY["fedpns_synthetic"] is FedPNSSyntheticData
    assert (d.clients, d.samples, d.iid_nodes, d.train_rows) == (50, 1000, 10, 600)


def test_rows_split_by_hand():
    # Prepare: 5 nodes, sigma 0.4 -> 2 i.i.d. nodes; 10 rows each, 60% = 6 train
    # Execute
    data = spec(clients=5, iid_fraction=0.4, samples=10).build(5, 0)
    # Assert: 5 x 6 training rows; the test set is 2 nodes x 4 held-out rows
    assert data.offsets.tolist() == [0, 6, 12, 18, 24, 30]
    assert data.test_x.shape == (8, 60) and data.test_y.shape == (8,)
    assert data.weights.tolist() == [6.0] * 5


def test_iid_nodes_are_centred_and_the_others_shifted():
    # Prepare: 2000 rows per node; feature 1 has sd 1 (j^-0.6 at j = 1)
    data = spec(clients=4, iid_fraction=0.5, samples=2000, varrho=1.0).build(4, 3)
    o = data.offsets
    # Execute: each node's mean of feature 1 over its 1200 training rows
    means = [float(data.x[o[k] : o[k + 1], 0].mean()) for k in range(4)]
    # Assert: i.i.d. nodes within 5 standard errors (5 / sqrt(1200) = 0.14) of
    # 0; the test rows (i.i.d. nodes only) too; the others' mu_k,1 ~ N(B_k, 1)
    # is not 0 (seed 3: both beyond 0.3)
    assert all(abs(m) < 0.15 for m in means[:2])
    assert abs(float(data.test_x[:, 0].mean())) < 5 / np.sqrt(1600)
    assert all(abs(m) > 0.3 for m in means[2:])


def test_the_same_seed_gives_the_same_data():
    a, b = (spec(clients=3, samples=20, iid_fraction=0.4).build(3, 7) for _ in "ab")
    assert np.array_equal(a.x, b.x) and np.array_equal(a.test_y, b.test_y)


def test_no_iid_node_means_no_test_set_and_is_refused():
    with pytest.raises(ValidationError, match="i.i.d. nodes"):
        spec(clients=4, iid_fraction=0.1)


def test_a_scenario_runs_on_it():
    sc = load_scenario(
        SCENARIOS / "quickstart.yaml",
        [
            "data={dataset: fedpns_synthetic, clients: 30, samples: 50}",
            "model={name: logreg, zero_init: true}",
            "rounds=2",
        ],
    )
    sim = run_scenario(sc, workers=0)
    assert len(sim.rows) == 2 and np.isfinite(float(sim.rows[-1]["test_loss"]))
