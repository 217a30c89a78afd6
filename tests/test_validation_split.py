"""The server's validation split (data.validation_fraction) and what
FedPNS's CHECK LOSS scores on."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedsim.algorithms.fedpns import FedPNS
from fedsim.data import build_data
from fedsim.data.base import FederatedData
from fedsim.data.errors import DataError
from fedsim.data.validation import (
    describe_validation,
    split_validation,
    validation_problem,
    validation_use,
)
from fedsim.models import make_model
from fedsim.params import flatten
from fedsim.runtime import run_scenario, run_setup
from fedsim.scenario import ScenarioError, load_scenario
from fedsim.server import Server, ServerSetupError

from .conftest import SCENARIOS

QUICK = SCENARIOS / "quickstart.yaml"
FEDPNS = "algorithm={name: fedpns}"


def quick(*overrides: str):
    return load_scenario(QUICK, list(overrides))


def row_set(x: np.ndarray) -> set[bytes]:
    return {r.tobytes() for r in np.ascontiguousarray(x)}


def tiny(counts: list[int]) -> FederatedData:
    """Row r holds the value r, so every row says where it came from."""
    n = sum(counts)
    return FederatedData(
        x=np.arange(n, dtype=np.float32).reshape(n, 1),
        y=np.arange(n, dtype=np.int64) % 2,
        offsets=np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
        weights=np.array(counts, dtype=np.float64),
        test_x=np.full((3, 1), -1.0, np.float32),
        test_y=np.zeros(3, np.int64),
        num_classes=2,
    )


# ------------------------------------------------------------------ the split


def test_each_client_gives_floor_f_n_rows_and_keeps_at_least_one():
    # Prepare: 4, 10, 1 and 2 rows; f = 0.25 -> floor(1), floor(2.5),
    # floor(0.25) = 0 and floor(0.5) = 0 rows given up
    data = tiny([4, 10, 1, 2])

    # Execute
    out = split_validation(data, 0.25, seed=3)

    # Assert
    assert out.n_samples.tolist() == [3, 8, 1, 2]
    assert out.weights.tolist() == [3.0, 8.0, 1.0, 2.0]  # counts follow
    assert len(out.val_y) == 3
    # each validation row came from a client that gave one up: client 0
    # owns values 0..3, client 1 owns 4..13
    vals = sorted(out.val_x[:, 0].tolist())
    assert 0 <= vals[0] <= 3 and all(4 <= v <= 13 for v in vals[1:])
    # a client keeps its remaining rows in their original order
    for i in range(4):
        kept = out.x[out.client_rows(i), 0]
        assert np.all(np.diff(kept) > 0)


def test_at_half_a_client_of_two_rows_still_keeps_one():
    out = split_validation(tiny([2, 3]), 0.5, seed=0)

    assert out.n_samples.tolist() == [1, 2]  # min(floor(f n), n - 1)


def test_a_fraction_that_takes_nothing_is_an_error():
    with pytest.raises(DataError, match="validation_fraction"):
        split_validation(tiny([3, 3]), 0.1, seed=0)


def test_explicit_weights_are_kept():
    data = tiny([4, 4])
    data = FederatedData(**{**data.__dict__, "weights": np.array([0.3, 0.7])})

    out = split_validation(data, 0.25, seed=0)

    assert out.weights.tolist() == [0.3, 0.7]


def test_validation_rows_are_disjoint_from_the_test_set_and_every_client():
    # Prepare: Synthetic(1,1): continuous features, so equal rows are the
    # same sample
    sc = quick("data.validation_fraction=0.1")
    before = sc.data.build(sc.num_clients, sc.seed)  # the rows as built

    # Execute
    data = build_data(sc.data, sc.num_clients, sc.seed)

    # Assert
    val = row_set(data.val_x)
    assert len(val) == len(data.val_x) > 0
    assert not val & row_set(data.test_x)
    for i in range(data.num_clients):
        assert not val & row_set(data.x[data.client_rows(i)]), i
    # nothing lost, nothing added: clients + validation = the training rows
    assert row_set(data.x) | val == row_set(before.x)
    assert len(data.x) + len(data.val_x) == len(before.x)
    expected = [min(int(0.1 * n), n - 1) for n in before.n_samples.tolist()]
    assert (before.n_samples - data.n_samples).tolist() == expected


def test_the_split_depends_on_the_seed_only():
    a = build_data(quick("data.validation_fraction=0.1").data, 30, 0)
    b = build_data(quick("data.validation_fraction=0.1").data, 30, 0)
    spec = quick("data.validation_fraction=0.1").data
    other = split_validation(spec.build(30, 0), 0.1, seed=1)

    assert np.array_equal(a.val_x, b.val_x) and np.array_equal(a.x, b.x)
    assert not np.array_equal(a.val_x, other.val_x)


def test_no_fraction_builds_exactly_what_the_dataset_builds():
    sc = quick()
    assert sc.data.validation_fraction == 0.0

    data = build_data(sc.data, sc.num_clients, sc.seed)
    raw = sc.data.build(sc.num_clients, sc.seed)

    assert data.val_x is None
    for name in ("x", "y", "offsets", "weights", "test_x", "test_y"):
        assert np.array_equal(getattr(data, name), getattr(raw, name)), name


@pytest.mark.parametrize(
    ("path", "override"),
    [
        ("quadratic-objective-inconsistency.yaml", "data.validation_fraction=0.1"),
        (
            "quickstart.yaml",
            "data={dataset: feddyn_synthetic, clients: 30, validation_fraction: 0.1}",
        ),
    ],
)
def test_datasets_without_held_out_rows_refuse_a_split(path, override):
    with pytest.raises(ScenarioError, match="validation_fraction must be 0"):
        load_scenario(SCENARIOS / path, [override])


# --------------------------------------------------------- FedPNS's CHECK LOSS


def test_fedpns_validation_loss_is_the_loss_on_the_split():
    # Prepare
    sc = quick(FEDPNS, "data.validation_fraction=0.1")
    data = build_data(sc.data, sc.num_clients, sc.seed)
    server = Server(run_setup(sc).server, data)
    x = flatten(server.model) + 0.01  # any parameters, not the zero init

    # Execute
    loss = server.context().validation_loss(x)

    # Assert: by hand, the mean cross-entropy of those parameters on the
    # validation rows (and not on the test rows)
    model = make_model(run_setup(sc).network, data)
    torch.nn.utils.vector_to_parameters(x, model.parameters())
    with torch.no_grad():
        val = F.cross_entropy(
            model(torch.from_numpy(data.val_x)), torch.from_numpy(data.val_y)
        )
        test = F.cross_entropy(
            model(torch.from_numpy(data.test_x)), torch.from_numpy(data.test_y)
        )
    assert loss == pytest.approx(float(val), rel=1e-5)
    assert abs(float(val) - float(test)) > 1e-3  # the two sets tell apart


def test_fedpns_without_a_split_or_opt_in_is_refused():
    # Prepare: past the load-time check (model_copy does not validate), as a
    # scenario built in code could be
    sc = quick("algorithm={name: fedpns, check_loss_data: test}")
    sc = sc.model_copy(update={"algorithm": FedPNS()})
    data = build_data(sc.data, sc.num_clients, sc.seed)

    problem = validation_problem(sc.algorithm, sc.data, sc.selector.clients_per_round)

    assert "data.validation_fraction" in problem
    assert "algorithm.check_loss_data" in problem
    with pytest.raises(ServerSetupError, match="data.validation_fraction"):
        Server(run_setup(sc).server, data)


def test_fedpns_without_a_split_is_refused_at_load_time():
    with pytest.raises(ScenarioError, match="algorithm.check_loss_data"):
        quick(FEDPNS)


def test_the_test_set_opt_in_scores_on_the_test_set():
    sc = quick("algorithm={name: fedpns, check_loss_data: test}")
    data = build_data(sc.data, sc.num_clients, sc.seed)
    server = Server(run_setup(sc).server, data)
    x = flatten(server.model) + 0.01

    loss = server.context().validation_loss(x)

    model = make_model(run_setup(sc).network, data)
    torch.nn.utils.vector_to_parameters(x, model.parameters())
    with torch.no_grad():
        test = F.cross_entropy(
            model(torch.from_numpy(data.test_x)), torch.from_numpy(data.test_y)
        )
    assert (
        validation_problem(sc.algorithm, sc.data, sc.selector.clients_per_round) is None
    )
    assert loss == pytest.approx(float(test), rel=1e-5)
    assert describe_validation(run_setup(sc).server.validation, data) == (
        "test set (opt-in)"
    )


def test_a_threshold_that_keeps_everything_needs_no_data():
    # v = clients_per_round: CHECK LOSS never runs, nothing to refuse
    sc = quick("algorithm={name: fedpns, v: 10}", "selector.clients_per_round=10")

    assert validation_use(sc.algorithm, sc.selector.clients_per_round) is None
    assert (
        validation_problem(sc.algorithm, sc.data, sc.selector.clients_per_round) is None
    )
    assert describe_validation(None, None) is None


def test_other_algorithms_use_no_server_side_data():
    for alg in ("fedavg", "scaffold", "feddm"):
        sc = quick(f"algorithm={{name: {alg}}}")
        assert validation_use(sc.algorithm, sc.selector.clients_per_round) is None, alg


# ------------------------------------------------------------------- whole runs


def test_a_fedpns_run_reports_its_validation_split():
    sc = quick(FEDPNS, "data.validation_fraction=0.1", "rounds=2")

    result = run_scenario(sc, workers=0)

    assert result.status == "completed"
    n = len(result.data.val_y)
    assert result.summary()["server_validation"] == f"validation split ({n} rows)"


def test_other_runs_are_unchanged_by_the_field():
    # Prepare: FedAvg, with the field left out and given as its default
    runs = [
        run_scenario(quick("rounds=2", *extra), workers=0)
        for extra in ([], ["data.validation_fraction=0"])
    ]

    # Assert: bit-identical, and nothing claims server-side data
    assert torch.equal(runs[0].final_params, runs[1].final_params)
    assert runs[0].summary()["server_validation"] is None
