"""Preflight: refuse what cannot run before data is built or Ray started."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from fedsim.scenario import ScenarioError, load_scenario
from fedsim.tools import preflight as pf

from .conftest import SCENARIOS

QUICK = SCENARIOS / "quickstart.yaml"
FMNIST = SCENARIOS / "ci" / "fmnist-dirichlet-small.yaml"
SRC = "sc.yaml"


def quick(*overrides: str):
    return load_scenario(QUICK, overrides=list(overrides))


def one_line_error(fn, *args, **kwargs) -> str:
    with pytest.raises(ScenarioError) as exc:
        fn(*args, **kwargs)
    msg = str(exc.value)
    assert "\n" not in msg
    return msg


def test_importing_preflight_imports_neither_torch_nor_ray():
    code = (
        "import sys, fedsim.tools.preflight; "
        "bad = [m for m in ('torch', 'ray') if m in sys.modules]; "
        "print(*bad); sys.exit(1 if bad else 0)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


# -------------------------------------------------------------- model and data
@pytest.mark.parametrize("model", ["cnn", "resnet18", "convnet", "vgg11", "lstm"])
def test_model_that_cannot_read_vector_data_is_refused(model):
    # Prepare: synthetic data, 60 features: neither an image nor a sequence
    sc = quick(f"model.name={model}")
    # Execute / Assert
    msg = one_line_error(pf.check_model_data, sc.facts, SRC)
    assert msg.startswith(f"{SRC}: model.name '{model}' does not fit data.dataset")
    assert "'synthetic'" in msg


def test_square_vectors_are_grey_images_for_a_cnn():
    sc = quick("model.name=cnn", "data.features=784")
    pf.check_model_data(sc.facts, SRC)  # 784 = 1 x 28 x 28, as fedsim.models reads it


def test_image_too_small_for_the_network_is_refused():
    sc = quick("model.name=cifar_cnn", "data.features=64")  # 8 x 8 images
    msg = one_line_error(pf.check_model_data, sc.facts, SRC)
    assert "at least 16x16" in msg and "8x8" in msg


def test_image_models_fit_images():
    for model in ("cnn", "cifar_cnn", "convnet", "resnet18"):
        pf.check_model_data(load_scenario(FMNIST, [f"model.name={model}"]).facts, SRC)


def test_data_info_from_the_spec_alone():
    sc = load_scenario(FMNIST)
    info = pf.data_info(sc.data, sc.num_clients)
    assert (info.kind, info.shape, info.classes) == ("image", (1, 28, 28), 10)


# -------------------------------------------------------------- parameter count
def params(sc):
    """The scenario's model parameters, by formula, from its data's spec."""
    return pf.count_params(sc.model, pf.data_info(sc.data, sc.num_clients))


def _ranges(sc, source):
    pf.check_numeric_ranges(sc.facts, sc.algorithm, source)


def test_param_counts_by_formula():
    # logreg on 60 features, 10 classes: 60*10 + 10
    assert params(quick()) == 610
    # mlp 60 -> 200 -> 200 -> 10: 12200 + 40200 + 2010
    assert params(quick("model.name=mlp")) == 54_410
    # mlp [7] on 60 features: 60*7+7 + 7*10+10
    assert params(quick("model.name=mlp", "model.hidden=[7]")) == 507


def test_lstm_param_count_matches_torch():
    torch = pytest.importorskip("torch")
    from fedsim.layers import CharLSTM

    # embedding 80*8 + layer 1: 4*256*(8+256) + 8*256 + layer 2: 4*256*512
    # + 8*256 + output 256*80 + 80 = 640 + 272384 + 526336 + 20560
    info = pf.DataInfo("sequence", (80,), 80, None)
    sc = quick("model.name=lstm")
    want = sum(p.numel() for p in CharLSTM(80, 8, 256, 2).parameters())
    assert pf.count_params(sc.model, info) == want == 819_920
    del torch


def test_cnn_param_count_by_formula():
    # the FedAvg paper's CNN on 28x28x1: 1,663,370 parameters
    assert params(load_scenario(FMNIST)) == 1_663_370


# ----------------------------------------------------------------------- memory
def test_memory_estimate_by_part():
    # scaffold keeps one model vector per client: 30 clients x 610 params x 4 B
    sc = quick("algorithm={name: scaffold}")
    est = pf.estimate_memory(sc.facts, sc.algorithm, workers=2)
    assert est.params == 610
    assert est.parts["algorithm"] == 30 * 610 * 4
    assert est.parts["model"] == 610 * 4 * (3 + 4 * 2)


def test_run_larger_than_memory_is_refused():
    # Prepare: logreg 10000 features x 1000 classes (10,001,000 params) with a
    # stateful algorithm: 30 client vectors x 40 MB; the data is 30 x 60 rows
    sc = quick(
        "algorithm={name: scaffold}",
        "data.features=10000",
        "data.classes=1000",
        "data.max_samples=60",
    )
    est = pf.estimate_memory(sc.facts, sc.algorithm)
    # Execute
    msg = one_line_error(
        pf.check_memory, sc.facts, sc.algorithm, SRC, available_bytes=est.total - 1
    )
    # Assert: names the file, the field and both sizes
    assert msg.startswith(f"{SRC}: needs at least")
    assert "algorithm.name 'scaffold' keeps 30 client vectors of 10,001,000" in msg
    pf.check_memory(
        sc.facts, sc.algorithm, SRC, available_bytes=est.total
    )  # exactly fits


def test_mem_available_reads_meminfo(tmp_path):
    f = tmp_path / "meminfo"
    f.write_text("MemTotal:  100 kB\nMemAvailable:    2048 kB\n")
    assert pf.mem_available(f) == 2048 * 1024
    assert pf.mem_available(tmp_path / "missing") is None


# --------------------------------------------------------------- numeric ranges
@pytest.mark.parametrize(
    ("override", "field", "word"),
    [
        ("client.lr=1e39", "client.lr", "too large"),
        ("client.lr=1e-39", "client.lr", "too small"),
        ("client.weight_decay=1e40", "client.weight_decay", "too large"),
    ],
)
def test_float32_unrepresentable_values_are_refused(override, field, word):
    msg = one_line_error(_ranges, quick(override), SRC)
    assert msg.startswith(f"{SRC}: {field}: ") and word in msg


def test_algorithm_fields_are_checked_too():
    sc = quick("algorithm={name: fedavgm, server_lr: 1e39}")
    assert "algorithm.server_lr" in one_line_error(_ranges, sc, SRC)


def test_float64_models_are_not_held_to_float32():
    _ranges(quick("client.lr=1e39", "model.dtype=float64"), SRC)


def test_preflight_passes_every_shipped_scenario():
    for path in sorted(SCENARIOS.rglob("*.yaml")):
        pf.preflight(load_scenario(path), str(path), available_bytes=2**40)


# -------------------------------------------------------------------------- Ray
@pytest.mark.parametrize(
    ("overrides", "workers", "cluster", "expect"),
    [
        ([], 5, {"CPU": 2.0}, "--workers 5 x resources.cpus_per_worker 1 needs 5 CPUs"),
        (["resources.workers=5"], 5, {"CPU": 2.0}, "resources.workers 5 x"),
        (["resources.cpus_per_worker=4"], 1, {"CPU": 2.0}, "cpus_per_worker 4: the"),
        (["resources.gpus_per_worker=1"], 1, {"CPU": 8.0}, "has no GPU"),
        (["resources.gpus_per_worker=1"], 2, {"CPU": 8, "GPU": 1}, "needs 2 GPUs"),
    ],
)
def test_ray_resources_refused(overrides, workers, cluster, expect):
    msg = one_line_error(
        pf.check_ray_resources, quick(*overrides).resources, workers, cluster
    )
    assert expect in msg


def test_ray_resources_that_fit():
    pf.check_ray_resources(quick().resources, 2, {"CPU": 2.0})
    pf.check_ray_resources(quick().resources, 0, {})  # no Ray at all
    sc = quick("resources.gpus_per_worker=0.5")
    pf.check_ray_resources(sc.resources, 2, {"CPU": 2.0, "GPU": 1.0})


ACTOR = "resources.server.home=actor"


@pytest.mark.parametrize(
    ("overrides", "workers", "cluster", "expect"),
    [
        # two workers fit the 2 CPUs; the server actor's default CPU does not
        (
            [ACTOR],
            2,
            {"CPU": 2.0},
            "--workers 2 x resources.cpus_per_worker 1 + the server actor's "
            "resources.server.cpus 1 need 3 CPUs; the Ray cluster has 2 "
            "(at most 1 workers)",
        ),
        (
            [ACTOR, "resources.server.gpus=1", "resources.gpus_per_worker=0.5"],
            2,
            {"CPU": 8, "GPU": 1},
            "+ the server actor's resources.server.gpus 1 need 2 GPUs",
        ),
        ([ACTOR, "resources.server.cpus=4"], 1, {"CPU": 3.0}, "server.cpus 4: the"),
        ([ACTOR, "resources.server.gpus=1"], 1, {"CPU": 8.0}, "has no GPU for the"),
        (
            [ACTOR, "resources.server.resources={node_b: 0.01}"],
            1,
            {"CPU": 8.0, "node_a": 1.0},
            "resources.server.resources.node_b 0.01: the Ray cluster has no node_b",
        ),
    ],
)
def test_ray_resources_without_room_for_the_server_actor_refused(
    overrides, workers, cluster, expect
):
    msg = one_line_error(
        pf.check_ray_resources, quick(*overrides).resources, workers, cluster
    )
    assert expect in msg


def test_ray_resources_with_room_for_the_server_actor():
    pf.check_ray_resources(quick(ACTOR).resources, 2, {"CPU": 3.0})
    # cpus 0: the server shares the workers' CPUs
    pf.check_ray_resources(
        quick(ACTOR, "resources.server.cpus=0").resources, 2, {"CPU": 2.0}
    )
    pin = [ACTOR, "resources.server={home: actor, gpus: 1, resources: {node_a: 1}}"]
    pf.check_ray_resources(
        quick(*pin).resources, 2, {"CPU": 3.0, "GPU": 1.0, "node_a": 1.0}
    )
    # the driver's home takes nothing from the cluster
    pf.check_ray_resources(quick().resources, 2, {"CPU": 2.0})


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_address_is_one_line():
    port = _free_port()  # bound, then closed: nothing listens there
    msg = one_line_error(pf.check_address, f"127.0.0.1:{port}", timeout_s=2)
    assert msg.startswith(f"--address 127.0.0.1:{port}: cannot reach")
    msg = one_line_error(pf.check_address, f"ray://127.0.0.1:{port}", timeout_s=2)
    assert f"127.0.0.1:{port}" in msg


def test_reachable_address_passes():
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(1)
        port = srv.getsockname()[1]
        pf.check_address(f"127.0.0.1:{port}")
        pf.check_address(f"ray://127.0.0.1:{port}")


def test_auto_reads_ray_address(monkeypatch, tmp_path):
    port = _free_port()
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{port}")
    msg = one_line_error(pf.check_address, "auto", timeout_s=2)
    assert f"127.0.0.1:{port} (from auto)" in msg
    monkeypatch.delenv("RAY_ADDRESS")
    monkeypatch.setattr(pf, "_RAY_CURRENT", tmp_path / "ray_current_cluster")
    assert "no running Ray cluster found" in one_line_error(pf.check_address, "auto")
    (tmp_path / "ray_current_cluster").write_text(f"127.0.0.1:{port}\n")
    assert "(from auto)" in one_line_error(pf.check_address, "auto", timeout_s=2)


def test_bad_addresses():
    assert "bad port" in one_line_error(pf.check_address, "127.0.0.1:99999")
    assert "unknown scheme" in one_line_error(pf.check_address, "http://x:1")
    pf.check_address("local")
    assert os.environ.get("FEDSIM_NEVER_SET") is None
