"""Where a worker trains (fedsim.workers.worker_device), decided on the CPU:
the GPU tests (tests/test_gpu.py, skipped without CUDA) take their
expectation from it, so it must hold here too. FedDM keeps its own
procedure on the CPU by design, with a GPU share or not."""

from __future__ import annotations

import pytest

from fedsim.algorithms import REGISTRY, make_algorithm
from fedsim.runtime import run_setup
from fedsim.scenario import load_scenario
from fedsim.workers import Worker, worker_device

from .conftest import SCENARIOS

QUICK = SCENARIOS / "quickstart.yaml"
# the quickstart's 10 s window cuts FedDM's matching short: said, and beside the point
pytestmark = pytest.mark.filterwarnings("ignore::fedsim.scenario.ScenarioWarning")


def _device(name: str, gpus: float, cuda: bool) -> str:
    sc = load_scenario(
        QUICK, [f"algorithm={{name: {name}}}", f"resources.gpus_per_worker={gpus}"]
    )
    return worker_device(
        sc.resources.gpus_per_worker, make_algorithm(sc.algorithm), cuda=cuda
    ).type


@pytest.mark.parametrize(
    ("name", "gpus", "cuda", "want"),
    [
        ("fedavg", 0.25, True, "cuda"),  # a GPU share and CUDA: on it
        ("scaffold", 1, True, "cuda"),
        ("fedavg", 0.25, False, "cpu"),  # no CUDA here: the CPU
        ("fedavg", 0, True, "cpu"),  # no GPU share: the CPU
        ("feddm", 0.25, True, "cpu"),  # its own procedure: the CPU, by design
    ],
)
def test_the_device_a_worker_trains_on(name, gpus, cuda, want):
    assert _device(name, gpus, cuda) == want


def test_only_feddm_has_its_own_procedure():
    # every other algorithm trains through the shared step loop, on CUDA
    # when it has a GPU share: the GPU tests expect CUDA for each of them
    # (the classes: some need an optional extra to be built, e.g. flower)
    sc = load_scenario(QUICK, ["resources.gpus_per_worker=0.25"])
    own = [
        name
        for name, cls in sorted(REGISTRY.items())
        if worker_device(sc.resources.gpus_per_worker, cls, cuda=True).type == "cpu"
    ]
    assert own == ["feddm"]


def test_a_worker_is_placed_as_decided():
    from fedsim.data import build_data

    sc = load_scenario(QUICK, ["resources.gpus_per_worker=0.25"])
    data = build_data(sc.data, sc.num_clients, sc.seed)
    worker = Worker(run_setup(sc).worker, data)
    assert worker.device == worker_device(
        sc.resources.gpus_per_worker, worker.algorithm
    )
    assert worker.x.device == worker.device
