"""The CUDA path: a worker given a (fractional) GPU trains on it and gets
CPU's results within floating-point tolerance.

Every test here is skipped where torch sees no CUDA device (CI has none). On
a GPU machine, run ``bash benchmarks/gpu_check.sh`` (this file, then the
timing comparison) or ``pytest -m gpu``.
"""

from __future__ import annotations

import pytest
import torch

from fedsim.algorithms import REGISTRY
from fedsim.runtime import run_scenario
from fedsim.scenario import load_scenario
from fedsim.server import Server
from fedsim.workers import Task, Worker

from .conftest import SCENARIOS

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

QUICK = SCENARIOS / "quickstart.yaml"
ASYNC_ONLY = {"fedasync", "fedbuff"}
SYNC = sorted(set(REGISTRY) - ASYNC_ONLY)


def final_params(overrides: list[str], workers: int = 0) -> tuple[torch.Tensor, list]:
    sim = run_scenario(load_scenario(QUICK, overrides), workers=workers)
    rows, _ = sim.rows, sim.clients
    assert sim.final_params is not None
    return sim.final_params, rows


@pytest.mark.parametrize("model", ["logreg", "mlp"])
@pytest.mark.parametrize("name", SYNC)
def test_a_gpu_worker_matches_the_cpu_worker(name, model):
    # Prepare: 4 rounds of the quickstart with this algorithm and model
    over = ["rounds=4", f"algorithm={{name: {name}}}", f"model={{name: {model}}}"]

    # Execute: once on the CPU, once with a quarter of a GPU per worker
    x_cpu, rows_cpu = final_params(over)
    x_gpu, rows_gpu = final_params([*over, "resources.gpus_per_worker=0.25"])

    # Assert: the same model and metrics, up to float32 summation order
    torch.testing.assert_close(x_gpu, x_cpu, rtol=1e-3, atol=1e-4)
    for a, b in zip(rows_cpu, rows_gpu, strict=True):
        assert a["n_completed"] == b["n_completed"]
        assert b["train_loss"] == pytest.approx(a["train_loss"], rel=1e-3, abs=1e-5)


def test_a_worker_trains_on_cuda_and_returns_its_update_on_the_cpu():
    sc = load_scenario(
        QUICK, ["resources.gpus_per_worker=0.25", "algorithm={name: scaffold}"]
    )
    from fedsim.data import build_data

    data = build_data(sc.data, sc.num_clients, sc.seed)
    worker = Worker(sc, data)
    assert worker.device.type == "cuda" and worker.x.is_cuda and worker.theta.is_cuda
    payload = Server(sc, data).payload()  # on the CPU, as the server sends it
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
    assert Worker(sc, data).device.type == "cpu"


@pytest.mark.ray
def test_ray_workers_on_fractional_gpus_match_the_cpu_run(ray_session):
    import ray

    if ray.cluster_resources().get("GPU", 0) < 0.5:
        pytest.skip("the Ray session sees no GPU")
    over = ["rounds=4", "algorithm={name: fednova}"]
    x_cpu, _ = final_params(over)
    x_gpu, _ = final_params([*over, "resources.gpus_per_worker=0.25"], workers=2)
    torch.testing.assert_close(x_gpu, x_cpu, rtol=1e-3, atol=1e-4)
