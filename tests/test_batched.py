"""The batched executor (fedsim.batched) equals sequential training.

In float64 the two paths agree to ~1e-9 for every model, solver and
algorithm the batched path supports (only the order of reductions
differs); in float32 within the tolerances the old vectorised tests used.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch

from fedsim.batched import train_batched, why_not_batched
from fedsim.data import build_data
from fedsim.models import LSTM, build_model, make_model
from fedsim.params import flatten
from fedsim.runtime import run_scenario, run_setup
from fedsim.scenario import load_scenario
from fedsim.server import Server
from fedsim.solvers import SGD
from fedsim.workers import Task, Worker

from .conftest import SCENARIOS, SHARED

QUICK = SCENARIOS / "quickstart.yaml"

PLAY = SHARED / "data" / "tinyshakespeare" / "input.txt"
# Image models read the 64 features of this Synthetic(1,1) as 8x8 images.
IMAGES = "data={dataset: synthetic, alpha: 1.0, beta: 1.0, features: 64}"
MODELS = {
    "logreg": ["model={name: logreg, dtype: float64}"],
    "mlp": ["model={name: mlp, hidden: [16, 8], dtype: float64}"],
    "cnn": [IMAGES, "model={name: cnn, dtype: float64}"],
    # GroupNorm (the FedDM/DC ConvNet): normalisation without batch statistics
    "convnet": [IMAGES, "model={name: convnet, width: 4, depth: 1, dtype: float64}"],
    "lstm": [
        f"data={{dataset: shakespeare, path: {PLAY}, seq_len: 6, stride: 200, "
        "min_samples: 4, max_clients: 30}",
        "model={name: lstm, embed_dim: 4, lstm_hidden: 8, dtype: float64}",
    ],
}
SOLVERS = {
    "sgd": ["client.solver=sgd", "client.weight_decay=0.01"],
    "momentum": ["client.solver=momentum", "client.momentum=0.9"],
    "prox": ["client.solver=prox", "client.mu=0.1"],
    "decay": ["client.solver=decay", "client.step_decay=0.9"],
}
ALGORITHMS = ["fedavg", "scaffold", "fednova_vr", "feddyn", "feddc"]
# Client 0 has fewer rows than a batch (all rows, padded); the others do not.
TAUS = [(0, 3), (4, 1), (9, 5)]


def worker(*overrides: str) -> tuple[Worker, Server]:
    sc = load_scenario(QUICK, list(overrides))
    data = build_data(sc.data, sc.num_clients, sc.seed)
    return Worker(run_setup(sc).worker, data, threads=1), Server(
        run_setup(sc).server, data
    )


def start_state(w: Worker, server: Server) -> tuple[dict, dict]:
    """A payload and client states with nonzero control variates and drifts,
    so every correction term is exercised."""
    payload = dict(server.payload())
    gen = torch.Generator().manual_seed(1)
    noise = lambda x: 1e-3 * torch.randn(x.shape, generator=gen, dtype=x.dtype)  # noqa: E731
    for key in payload:
        if key != "x":
            payload[key] = payload[key] + noise(payload[key])
    x = payload["x"]
    states = {c: {"c": noise(x), "hist": noise(x)} for c, _ in TAUS[:2]}
    return payload, states


def assert_equal_updates(seq, bat, rtol: float, atol: float) -> None:
    for a, b in zip(seq, bat, strict=True):
        assert (a.client, a.tau, a.weight) == (b.client, b.tau, b.weight)
        assert b.norm_a == pytest.approx(a.norm_a, rel=1e-12)
        torch.testing.assert_close(b.delta, a.delta, rtol=rtol, atol=atol)
        assert b.train_loss == pytest.approx(a.train_loss, rel=rtol, abs=atol)
        assert sorted(a.extras) == sorted(b.extras)
        for k in a.extras:
            torch.testing.assert_close(b.extras[k], a.extras[k], rtol=rtol, atol=atol)
        assert (a.new_state is None) == (b.new_state is None)
        for k in a.new_state or {}:
            torch.testing.assert_close(
                b.new_state[k], a.new_state[k], rtol=rtol, atol=atol
            )


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("solver", list(SOLVERS))
@pytest.mark.parametrize("model", list(MODELS))
def test_float64_equals_sequential_training(model, solver, algorithm):
    if model == "lstm" and not PLAY.is_file():
        pytest.skip(f"Tiny Shakespeare not found at {PLAY}")
    # Prepare: 3 clients with different tau, nonzero starting state
    w, server = worker(
        *MODELS[model], *SOLVERS[solver], f"algorithm={{name: {algorithm}}}"
    )
    assert why_not_batched(w) is None
    assert w.theta.dtype == torch.float64
    payload, states = start_state(w, server)
    for r in (0, 1):  # round 1 starts from round 0's states and mean delta
        tasks = [Task(c, r, tau) for c, tau in TAUS]
        # Execute
        seq = w.train_sequential(payload, tasks, states)
        bat = train_batched(w, payload, tasks, states)
        # Assert
        assert_equal_updates(seq, bat, rtol=1e-9, atol=1e-10)
        states = {**states, **{u.client: u.new_state for u in seq if u.new_state}}
        mean = torch.stack([u.delta for u in seq]).mean(0)
        payload = {**payload, "x": payload["x"] + mean}


def test_the_quadratic_objective_is_batched_too():
    sc = SCENARIOS / "quadratic-objective-inconsistency.yaml"
    scenario = load_scenario(sc, ["model={name: quadratic, dtype: float64}"])
    data = build_data(scenario.data, scenario.num_clients, scenario.seed)
    w = Worker(run_setup(scenario).worker, data, threads=1)
    assert why_not_batched(w) is None
    x = flatten(make_model(run_setup(scenario).network, data))
    tasks = [Task(c, 2, tau) for c, tau in [(0, 4), (1, 2)]]
    seq = w.train_sequential({"x": x}, tasks, {})
    assert_equal_updates(seq, train_batched(w, {"x": x}, tasks, {}), 1e-9, 1e-10)


# ---------------------------------------------- float32 (the vectorised cases)
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
def test_float32_equals_sequential_training(overrides):
    w, server = worker(*overrides, "resources.vectorize=true")
    assert w.batched
    x = server.payload()["x"]
    # heterogeneous steps, and clients smaller than a batch (client 0 has 54 rows)
    tasks = [Task(c, 3, tau) for c, tau in [(0, 7), (4, 1), (9, 30), (17, 12)]]
    seq = w.train_sequential({"x": x}, tasks, {})
    bat = w.train({"x": x}, tasks)
    for a, b in zip(seq, bat, strict=True):
        assert (a.client, a.tau) == (b.client, b.tau)
        assert a.norm_a == pytest.approx(b.norm_a, rel=1e-12)
        torch.testing.assert_close(b.delta, a.delta, rtol=1e-4, atol=1e-6)
        assert b.train_loss == pytest.approx(a.train_loss, rel=1e-5)


def test_tasks_of_several_rounds_keep_their_order():
    w, server = worker("resources.vectorize=true")
    x = server.payload()["x"]
    tasks = [Task(9, 2, 4), Task(0, 1, 3), Task(4, 2, 2), Task(17, 1, 0)]
    seq = w.train_sequential({"x": x}, tasks, {})
    bat = w.train({"x": x}, tasks)
    assert [(u.client, u.tau) for u in bat] == [(t.client, t.tau) for t in tasks]
    assert torch.equal(bat[3].delta, torch.zeros_like(x))  # tau 0: no step
    for a, b in zip(seq, bat, strict=True):
        torch.testing.assert_close(b.delta, a.delta, rtol=1e-4, atol=1e-6)


def test_whole_run_matches_within_tolerance():
    plain = run_scenario(load_scenario(QUICK, ["rounds=6"]), workers=0)
    fast = run_scenario(
        load_scenario(QUICK, ["rounds=6", "resources.vectorize=true"]), workers=0
    )
    torch.testing.assert_close(
        fast.final_params, plain.final_params, rtol=1e-3, atol=1e-4
    )
    for a, b in zip(plain.rows, fast.rows, strict=True):
        assert b["test_accuracy"] == pytest.approx(a["test_accuracy"], abs=0.01)


def test_fedpns_uploads_the_rounds_lr():
    # the vectorised path once handed client_finish lr=0, so FedPNS's
    # gradient estimates -delta / (lr ||a||_1) became inf
    w, server = worker(
        "algorithm={name: fedpns, check_loss_data: test}",
        "client.lr_decay=0.9",
        "resources.vectorize=true",
    )
    assert w.batched
    x = server.payload()["x"]
    tasks = [Task(c, 3, tau) for c, tau in [(0, 7), (4, 1), (9, 30), (17, 12)]]
    bat = w.train({"x": x}, tasks)
    seq = [w._train_one({"x": x}, t, {}) for t in tasks]
    for a, b in zip(seq, bat, strict=True):
        assert float(a.extras["lr"]) == pytest.approx(0.05 * 0.9**3, rel=1e-12)
        assert torch.equal(b.extras["lr"], a.extras["lr"])
        torch.testing.assert_close(b.delta, a.delta, rtol=1e-4, atol=1e-6)


def test_whole_scaffold_run_matches_within_tolerance():
    over = ["rounds=4", "algorithm={name: scaffold}"]
    plain = run_scenario(load_scenario(QUICK, over), workers=0)
    fast = run_scenario(
        load_scenario(QUICK, [*over, "resources.vectorize=true"]), workers=0
    )
    assert torch.isfinite(fast.final_params).all()
    torch.testing.assert_close(
        fast.final_params, plain.final_params, rtol=1e-3, atol=1e-4
    )


# ------------------------------------------------------------------ fallback
def test_feddm_falls_back_with_one_message(caplog):
    with caplog.at_level(logging.WARNING, logger="fedsim.workers"):
        w, _ = worker(
            "algorithm={name: feddm, iterations: 2, ipc: 1, dc_batch_size: 4}",
            "resources.vectorize=true",
        )
    assert not w.batched
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "resources.vectorize: algorithm 'feddm' trains its clients with its own "
        "procedure; training clients one at a time"
    ]


def fake_worker(model: torch.nn.Module, solver: SGD | None = None) -> SimpleNamespace:
    """What why_not_batched reads of a worker (no data needed)."""
    return SimpleNamespace(
        algorithm=load_scenario(QUICK).algorithm,
        model=model,
        solver=solver or SGD(lr=0.1),
        setup=SimpleNamespace(
            network=SimpleNamespace(model=SimpleNamespace(name="lstm"))
        ),
        device=torch.device("cpu"),
    )


def test_batchnorm_models_and_recurrent_ones_on_a_gpu_are_not_batched():
    lstm = build_model(LSTM(lstm_hidden=8, lstm_layers=1), 1, 5, 0, input_shape=(4,))
    fake = fake_worker(lstm)
    assert why_not_batched(fake) is None  # type: ignore[arg-type]
    fake.device = torch.device("cuda")  # no vmap rule for cuDNN's RNN kernels
    assert "recurrent, on a GPU" in why_not_batched(fake)  # type: ignore[arg-type]
    bn = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.BatchNorm1d(3))
    assert "BatchNorm" in why_not_batched(fake_worker(bn))  # type: ignore[arg-type]

    class Adam(SGD):
        pass

    logreg = torch.nn.Sequential(torch.nn.Linear(3, 3))
    fake = fake_worker(logreg, Adam(lr=0.1))
    assert "solver Adam" in why_not_batched(fake)  # type: ignore[arg-type]
    assert why_not_batched(fake_worker(logreg)) is None  # type: ignore[arg-type]
