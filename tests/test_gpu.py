"""The CUDA path: a worker given a (fractional) GPU trains on it and gets
the CPU's results.

In float64 the GPU must equal the CPU to 1e-9 for every algorithm and model
(sequential and batched workers): any larger gap is a real difference in the
CUDA path, not rounding. In float32 the comparison follows from an argument
instead: the models differ only in summation order (about 1e-7 relative per
reduction); logistic regression is smooth, so that stays near 1e-6 after a
few rounds, but an MLP's ReLUs are kinks: a unit whose pre-activation sits
within rounding of 0 switches on one device and not the other, and its
weights then take different steps. On the CPU alone, the sequential and the
batched worker (the same float32 arithmetic in another order) differ by
1.9e-3 on 606 of 54,410 mlp parameters after 4 FedProx rounds, and by
5.6e-17 in float64: the same 0.00186 the first GPU run reported. So float32
mlp runs are compared on their metrics, not their parameters.

Every test here is skipped where torch sees no CUDA device (CI has none). On
a GPU machine, run ``bash benchmarks/gpu_check.sh`` (this file, then the
timing comparison) or ``pytest -m gpu``.
"""

from __future__ import annotations

import os
from pathlib import Path
from unittest import mock

import pytest
import torch

from fedsim.algorithms import REGISTRY, make_algorithm
from fedsim.runtime import run_scenario, run_setup
from fedsim.scenario import load_scenario
from fedsim.server import Server, Step
from fedsim.workers import Task, Worker, worker_device

from .conftest import SCENARIOS

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

QUICK = SCENARIOS / "quickstart.yaml"
CNN = Path(__file__).resolve().parents[1] / "benchmarks" / "cnn-mnist.yaml"
MNIST = (
    Path(os.environ.get("FEDSIM_DATA_ROOT", "/nonexistent"))
    / "mnist-test"
    / "t10k-images-idx3-ubyte.gz"
)
ASYNC_ONLY = {"fedasync", "fedbuff"}
SYNC = sorted(set(REGISTRY) - ASYNC_ONLY)


def algorithm(name: str) -> str:
    """The override that selects an algorithm; FedPNS scores its CHECK LOSS
    on the test set (the quickstart keeps no validation split)."""
    extra = ", check_loss_data: test" if name == "fedpns" else ""
    return f"algorithm={{name: {name}{extra}}}"


def final_params(
    overrides: list[str], workers: int = 0, scenario: Path = QUICK
) -> tuple[torch.Tensor, list]:
    """The run's final parameters and rows; it asserts that its workers
    trained on the device the overrides ask for: CUDA with a GPU share, but
    the CPU for an algorithm with its own procedure (FedDM), by design
    (fedsim.workers.worker_device, tested on the CPU in test_worker_device.py;
    CUDA is taken as there: a worker that fell back to the CPU fails)."""
    sc = load_scenario(scenario, overrides)
    want = worker_device(
        sc.resources.gpus_per_worker, make_algorithm(sc.algorithm), cuda=True
    ).type
    seen: set[tuple[str, str]] = set()  # (worker device, its model's device)
    train = Worker.train

    def recording_train(self, *args, **kwargs):
        seen.add((self.device.type, self.x.device.type))
        return train(self, *args, **kwargs)

    with mock.patch.object(Worker, "train", recording_train):
        sim = run_scenario(sc, workers=workers)
    rows, _ = sim.rows, sim.clients
    assert sim.final_params is not None
    if workers == 0:  # trained in this process
        assert seen == {(want, want)}, seen
    else:  # in Ray actors: their own report of where they trained
        devices = [g["device"] for g in sim.summary()["workers_gpus"]]
        assert len(devices) == workers, devices
        assert all(d.split(":")[0] == want for d in devices), devices
    return sim.final_params, rows


@pytest.mark.parametrize("executor", ["sequential", "batched"])
@pytest.mark.parametrize("model", ["logreg", "mlp"])
@pytest.mark.parametrize("name", SYNC)
def test_in_float64_a_gpu_worker_equals_the_cpu_worker(name, model, executor):
    # Prepare: 3 rounds of the quickstart in float64, this algorithm and model
    over = [
        "rounds=3",
        algorithm(name),
        f"model={{name: {model}, dtype: float64}}",
        f"resources.vectorize={str(executor == 'batched').lower()}",
    ]

    # Execute: once on the CPU, once with a quarter of a GPU per worker
    x_cpu, rows_cpu = final_params(over)
    x_gpu, rows_gpu = final_params([*over, "resources.gpus_per_worker=0.25"])

    # Assert: equal up to float64 rounding
    torch.testing.assert_close(x_gpu, x_cpu, rtol=1e-9, atol=1e-9)
    for a, b in zip(rows_cpu, rows_gpu, strict=True):
        assert a["n_completed"] == b["n_completed"]
        assert b["train_loss"] == pytest.approx(a["train_loss"], rel=1e-9)


@pytest.mark.skipif(not MNIST.exists(), reason="the MNIST test set is not here")
@pytest.mark.parametrize("name", ["fedavg", "scaffold", "feddyn", "fednova"])
def test_in_float64_a_gpu_cnn_equals_the_cpu_cnn(name):
    over = [
        "rounds=2",
        "selector.clients_per_round=4",
        algorithm(name),
        "model={name: cnn, dtype: float64}",
    ]
    x_cpu, _ = final_params(over, scenario=CNN)
    x_gpu, _ = final_params([*over, "resources.gpus_per_worker=1"], scenario=CNN)
    torch.testing.assert_close(x_gpu, x_cpu, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("model", ["logreg", "mlp"])
@pytest.mark.parametrize("name", SYNC)
def test_in_float32_a_gpu_worker_matches_the_cpu_worker(name, model):
    # Prepare: 4 rounds of the quickstart with this algorithm and model
    over = ["rounds=4", algorithm(name), f"model={{name: {model}}}"]

    # Execute: once on the CPU, once with a quarter of a GPU per worker
    x_cpu, rows_cpu = final_params(over)
    x_gpu, rows_gpu = final_params([*over, "resources.gpus_per_worker=0.25"])

    # Assert: logreg's parameters up to summation order; every model's
    # metrics (a few switched ReLU units move the loss by far less than 1%)
    if model == "logreg":
        torch.testing.assert_close(x_gpu, x_cpu, rtol=1e-3, atol=1e-4)
    for a, b in zip(rows_cpu, rows_gpu, strict=True):
        assert a["n_completed"] == b["n_completed"]
        assert b["train_loss"] == pytest.approx(a["train_loss"], rel=1e-2, abs=1e-5)
    acc_cpu, acc_gpu = rows_cpu[-1]["test_accuracy"], rows_gpu[-1]["test_accuracy"]
    assert abs(acc_gpu - acc_cpu) <= 0.01


def test_a_worker_trains_on_cuda_and_returns_its_update_on_the_cpu():
    sc = load_scenario(
        QUICK, ["resources.gpus_per_worker=0.25", "algorithm={name: scaffold}"]
    )
    from fedsim.data import build_data

    data = build_data(sc.data, sc.num_clients, sc.seed)
    worker = Worker(run_setup(sc).worker, data)
    assert worker.device.type == "cuda" and worker.x.is_cuda and worker.theta.is_cuda
    payload = Server(
        run_setup(sc).server, data
    ).payload()  # on the CPU, as the server sends it
    (u,) = worker.train(payload, [Task(client=0, round=0, tau=3)])
    assert u.delta.device.type == "cpu" and torch.isfinite(u.delta).all()
    assert all(t.device.type == "cpu" for t in u.extras.values())
    if u.new_state is not None:
        assert all(t.device.type == "cpu" for t in u.new_state.values())


def test_feddm_keeps_its_own_procedure_on_the_cpu():
    sc = load_scenario(
        QUICK, ["resources.gpus_per_worker=0.25", "algorithm={name: feddm}"]
    )
    from fedsim.data import build_data

    data = build_data(sc.data, sc.num_clients, sc.seed)
    assert Worker(run_setup(sc).worker, data).device.type == "cpu"


@pytest.mark.ray
def test_ray_workers_on_fractional_gpus_match_the_cpu_run(ray_session):
    import ray

    if ray.cluster_resources().get("GPU", 0) < 0.5:
        pytest.skip("the Ray session sees no GPU")
    over = ["rounds=4", "algorithm={name: fednova}"]
    x_cpu, _ = final_params(over)
    x_gpu, _ = final_params([*over, "resources.gpus_per_worker=0.25"], workers=2)
    torch.testing.assert_close(x_gpu, x_cpu, rtol=1e-3, atol=1e-4)


TINY = SCENARIOS / "ci" / "tiny-synthetic.yaml"
SERVER_WORK = {
    "feddm": "algorithm={name: feddm, ipc: 3, iterations: 4, dc_batch_size: 16, "
    "image_lr: 0.01, server_epochs: 3}",
    "fedpns": "algorithm={name: fedpns, v: 1, check_loss_data: test}",
}


def server_round(over: list[str], device: str) -> tuple[Server, set[str], tuple]:
    """One round of a tiny scenario whose server runs on ``device``: the
    server, the devices its forwards saw, and (x, evaluation, objective).
    The updates come from a CPU worker, the same in both runs."""
    from fedsim.data import build_data

    sc = load_scenario(TINY, over)
    data = build_data(sc.data, sc.num_clients, sc.seed)
    server = Server(run_setup(sc).server, data, device=device)
    tasks = [Task(c, 0, 4) for c in range(sc.num_clients)]
    ups = Worker(run_setup(sc).worker, data).train(server.payload(), tasks)
    seen: set[str] = set()

    def record(module, args):
        seen.update(str(a.device) for a in args if isinstance(a, torch.Tensor))

    hook = torch.nn.modules.module.register_module_forward_pre_hook(record)
    try:
        server.apply(ups, Step("round 0"))
        results = (server.params().clone(), server.evaluate(), server.objective())
    finally:
        hook.remove()
    return server, seen, results


@pytest.mark.parametrize("name", sorted(SERVER_WORK))
def test_a_server_on_cuda_does_its_work_there_and_matches_the_cpu(name):
    # Prepare: a FedDM round (the server trains on the synthetic sets) or a
    # FedPNS round (the server scores candidate aggregates), in float64
    over = [
        SERVER_WORK[name],
        "selector.clients_per_round=6",
        "model={name: logreg, dtype: float64}",
    ]

    # Execute: the same round with the server on the CPU, then on CUDA
    _, seen_cpu, (x_cpu, ev_cpu, f_cpu) = server_round(over, "cpu")
    server, seen, (x_gpu, ev_gpu, f_gpu) = server_round(over, "cuda")

    # Assert: every forward of the server's work (the algorithm's training
    # or scoring, the evaluation, the objective) ran on cuda:0, and only
    # there; the state stayed on the CPU; float64 results equal the CPU's
    # up to rounding (1e-9, this file's rule)
    assert seen_cpu == {"cpu"} and seen == {"cuda:0"}, seen
    assert str(server.device) == "cuda:0"
    assert all(p.is_cuda for p in server.context().model.parameters())
    assert x_gpu.device.type == "cpu"
    assert all(t.device.type == "cpu" for t in server.state.values())
    torch.testing.assert_close(x_gpu, x_cpu, rtol=1e-9, atol=1e-9)
    assert ev_gpu == pytest.approx(ev_cpu, rel=1e-9, nan_ok=True)
    assert f_gpu == pytest.approx(f_cpu, rel=1e-9)
