"""The vectorised executor equals sequential training within float tolerance."""

from __future__ import annotations

import pytest
import torch

from fedsim.data import build_data
from fedsim.models import make_model
from fedsim.params import flatten
from fedsim.runtime import run_scenario
from fedsim.scenario import load_scenario
from fedsim.vectorized import supports, train_vectorized
from fedsim.workers import Task, Worker

from .conftest import SCENARIOS

QUICK = SCENARIOS / "quickstart.yaml"


def worker(*overrides: str) -> tuple[Worker, torch.Tensor]:
    sc = load_scenario(QUICK, list(overrides))
    data = build_data(sc.data, sc.num_clients, sc.seed)
    return Worker(sc, data, threads=1), flatten(make_model(sc, data))


@pytest.mark.parametrize(
    "overrides",
    [
        ["algorithm={name: fedavg}"],
        ["client.solver=momentum", "client.lr=0.01"],
        ["algorithm={name: fedprox, mu: 0.1}"],
        ["client.solver=decay", "client.step_decay=0.95", "client.weight_decay=0.01"],
        ["model={name: mlp, hidden: [32]}"],
    ],
    ids=["sgd", "momentum", "prox", "decay+wd", "mlp"],
)
def test_equals_sequential_training(overrides):
    w, x = worker(*overrides)
    assert supports(w)
    # heterogeneous steps, and clients smaller than a batch (client 0 has 54 rows)
    tasks = [Task(c, 3, tau) for c, tau in [(0, 7), (4, 1), (9, 30), (17, 12)]]
    seq = w.train({"x": x}, tasks)
    vec = train_vectorized(w, {"x": x}, tasks, {})
    for a, b in zip(seq, vec, strict=True):
        assert (a.client, a.tau) == (b.client, b.tau)
        assert a.norm_a == pytest.approx(b.norm_a, rel=1e-12)
        torch.testing.assert_close(b.delta, a.delta, rtol=1e-4, atol=1e-6)
        assert b.train_loss == pytest.approx(a.train_loss, rel=1e-5)


def test_whole_run_matches_within_tolerance():
    sc = load_scenario(QUICK, ["rounds=6"])
    plain = run_scenario(sc, workers=0)
    rows, _ = plain.rows, plain.clients
    vec_sc = load_scenario(QUICK, ["rounds=6", "resources.vectorize=true"])
    fast = run_scenario(vec_sc, workers=0)
    vrows, _ = fast.rows, fast.clients
    torch.testing.assert_close(
        fast.final_params, plain.final_params, rtol=1e-3, atol=1e-4
    )
    for a, b in zip(rows, vrows, strict=True):
        assert b["test_accuracy"] == pytest.approx(a["test_accuracy"], abs=0.01)


def test_stateful_algorithms_are_not_vectorised():
    w, _ = worker("algorithm={name: scaffold}", "resources.vectorize=true")
    assert not supports(w) and not w.batched


def test_fedpns_uploads_the_rounds_lr():
    # the vectorised path once handed client_finish lr=0, so FedPNS's
    # gradient estimates -delta / (lr ||a||_1) became inf
    w, x = worker(
        "algorithm={name: fedpns, check_loss_data: test}",
        "client.lr_decay=0.9",
        "resources.vectorize=true",
    )
    assert supports(w) and w.batched
    tasks = [Task(c, 3, tau) for c, tau in [(0, 7), (4, 1), (9, 30), (17, 12)]]
    vec = w.train({"x": x}, tasks)  # vectorised: one round, several tasks
    seq = [w._train_one({"x": x}, t, {}) for t in tasks]
    for a, b in zip(seq, vec, strict=True):
        assert float(a.extras["lr"]) == pytest.approx(0.05 * 0.9**3, rel=1e-12)
        assert torch.equal(b.extras["lr"], a.extras["lr"])
        assert a.norm_a == pytest.approx(b.norm_a, rel=1e-12)
        torch.testing.assert_close(b.delta, a.delta, rtol=1e-4, atol=1e-6)


def test_whole_fedpns_run_matches_within_tolerance():
    over = ["rounds=4", "algorithm={name: fedpns}", "data.validation_fraction=0.1"]
    plain = run_scenario(load_scenario(QUICK, over), workers=0)
    fast = run_scenario(
        load_scenario(QUICK, [*over, "resources.vectorize=true"]), workers=0
    )
    assert torch.isfinite(fast.final_params).all()
    torch.testing.assert_close(
        fast.final_params, plain.final_params, rtol=1e-3, atol=1e-4
    )
