"""The server's device: where its forward/backward work runs.

:func:`fedsim.server.server_device` decides it (CUDA only for a server given
a GPU share where torch sees CUDA); a server on the CPU computes what it
computed before the device existed, and keeps its state on the CPU. The
CUDA side is in tests/test_gpu.py (skipped without a GPU).
"""

from __future__ import annotations

import pytest
import torch

from fedsim.data import build_data
from fedsim.models import evaluate, make_model
from fedsim.runtime import run_setup
from fedsim.scenario import load_scenario
from fedsim.server import Server, Step, _split, server_device
from fedsim.workers import Task, Worker

from .conftest import SCENARIOS

TINY = SCENARIOS / "ci" / "tiny-synthetic.yaml"
FEDDM = (
    "algorithm={name: feddm, ipc: 3, iterations: 4, dc_batch_size: 16, "
    "image_lr: 0.01, server_epochs: 3}"
)
FEDPNS = "algorithm={name: fedpns, v: 1, check_loss_data: test}"


@pytest.mark.parametrize(
    ("gpus", "cuda", "want"),
    [
        (0.0, False, "cpu"),
        (0.0, True, "cpu"),  # a GPU in the machine, none given to the server
        (1.0, False, "cpu"),  # a declared (fake) GPU resource
        (1.0, True, "cuda:0"),
        (0.25, True, "cuda:0"),  # a share of one
    ],
)
def test_the_server_runs_on_cuda_only_with_a_gpu_share_and_cuda(gpus, cuda, want):
    assert server_device(gpus, cuda) == torch.device(want)


def _tiny(over: list[str]):
    sc = load_scenario(TINY, over)
    return sc, build_data(sc.data, sc.num_clients, sc.seed)


def test_a_cpu_server_evaluates_as_a_fresh_model_on_the_test_split():
    # Prepare: a server on the CPU at a model away from its initial one
    sc, data = _tiny([])
    server = Server(run_setup(sc).server, data, device="cpu")
    server.state["x"] = server.params() + 0.01
    model = make_model(run_setup(sc).network, data)
    torch.nn.utils.vector_to_parameters(server.params().clone(), model.parameters())
    x = server.params()
    test = _split(data.test_x, data.test_y, x.dtype, data.num_classes)

    # Execute
    got = server.evaluate()

    # Assert: the same floats as the evaluation by hand; all on the CPU
    assert got == evaluate(model, *test, sc.eval.batch_size, data.test_weights)
    assert server.device == torch.device("cpu") and x.device.type == "cpu"
    assert all(p.device.type == "cpu" for p in server.model.parameters())


def test_an_explicit_cpu_server_gives_the_default_servers_floats():
    sc, data = _tiny([])
    default, cpu = (
        Server(run_setup(sc).server, data),
        Server(run_setup(sc).server, data, device="cpu"),
    )
    for s in (default, cpu):
        s.state["x"] = s.params() + 0.01
    assert cpu.evaluate() == default.evaluate()
    assert cpu.objective() == default.objective()


@pytest.mark.parametrize("over", [FEDDM, FEDPNS], ids=["feddm", "fedpns"])
def test_a_cpu_servers_own_work_stays_on_the_cpu_and_its_state_too(over):
    # Prepare: a round of updates from a (CPU) worker
    sc, data = _tiny([over, "selector.clients_per_round=6"])
    server = Server(run_setup(sc).server, data, device="cpu")
    ups = Worker(run_setup(sc).worker, data).train(
        server.payload(), [Task(c, 0, 4) for c in range(6)]
    )
    seen: set[str] = set()

    def record(module, args):
        seen.update(a.device.type for a in args if isinstance(a, torch.Tensor))

    # Execute: the round's step, its evaluation and the objective
    hook = torch.nn.modules.module.register_module_forward_pre_hook(record)
    try:
        server.apply(ups, Step("round 0"))
        server.evaluate()
        server.objective()
    finally:
        hook.remove()

    # Assert: every forward ran on the CPU; the state is there too
    assert seen == {"cpu"}
    assert all(t.device.type == "cpu" for t in server.state.values())
    assert all(p.device.type == "cpu" for p in server.context().model.parameters())
