"""``fedsim --help`` and ``fedsim validate`` start without torch, Ray or
torchvision (issue 16, item 1), and the parameter-count formulas preflight
uses instead of building the network agree with the networks themselves."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from fedsim.models import (
    CNN,
    LSTM,
    MLP,
    MODELS,
    VGG11,
    CifarCNN,
    ConvNet,
    Quadratic,
)
from fedsim.scenario import ScenarioError, load_scenario
from fedsim.spec import Model
from fedsim.tools import preflight as pf

from .conftest import ROOT, SCENARIOS

HEAVY = ("torch", "ray", "torchvision", "pyarrow", "simpy", "matplotlib")
ALL_SCENARIOS = sorted(SCENARIOS.rglob("*.yaml"))

# Runs the CLI once per argument list in one fresh interpreter, then reports
# each exit code and which heavy packages ended up in sys.modules.
_PROBE = """
import json, sys
from fedsim.tools.cli import main
argvs, names = json.loads(sys.argv[1]), set(json.loads(sys.argv[2]))
codes = []
for argv in argvs:
    sys.argv = ["fedsim", *argv]
    try:
        main()
    except SystemExit as exc:
        codes.append(exc.code)
heavy = sorted({m.split(".")[0] for m in sys.modules} & names)
print(json.dumps({"codes": codes, "heavy": heavy}))
"""


def probe(*argvs: list[str]) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, json.dumps(argvs), json.dumps(HEAVY)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------- imports at start
def test_help_imports_neither_torch_nor_ray():
    # Prepare / Execute
    got = probe(["--help"])
    # Assert
    assert got == {"codes": [0], "heavy": []}


def test_validate_quickstart_imports_neither_torch_nor_ray():
    got = probe(["validate", "scenarios/quickstart.yaml"])
    assert got == {"codes": [0], "heavy": []}


def _per_flop(path) -> bool:
    """Whether a shipped scenario gives some group's speed in FLOP/s."""
    return load_scenario(path).fleet.per_flop


def test_validating_every_shipped_scenario_imports_neither_torch_nor_ray():
    # Prepare: every scenario, image networks included (preflight counts
    # their parameters by formula, not by building them), except the fleets
    # with speeds in FLOP/s: validate prints the model's FLOPs per step, and
    # counting them builds the network (the next test)
    paths = [p for p in ALL_SCENARIOS if not _per_flop(p)]
    argvs = [["validate", str(p.relative_to(ROOT))] for p in paths]
    # Execute
    got = probe(*argvs)
    # Assert
    assert got["codes"] == [0] * len(argvs)
    assert got["heavy"] == []


def test_validating_a_flops_fleet_imports_torch_but_not_ray():
    # Prepare: the shipped FLOP/s fleets (at least phones-flops.yaml)
    paths = [p for p in ALL_SCENARIOS if _per_flop(p)]
    assert paths
    argvs = [["validate", str(p.relative_to(ROOT))] for p in paths]
    # Execute
    got = probe(*argvs)
    # Assert: torch counts the FLOPs on the meta device; Ray never starts
    assert got["codes"] == [0] * len(argvs)
    assert got["heavy"] == ["torch"]


def test_a_refused_scenario_imports_neither_torch_nor_ray():
    # preflight's refusal (a CNN on 60 non-image features) runs without torch
    got = probe(["validate", "scenarios/quickstart.yaml", "--set", "model.name=cnn"])
    assert got == {"codes": [2], "heavy": []}


# ------------------------------------------------------- parameter-count formulas
def _info(sc):
    return pf.data_info(sc.data, sc.num_clients)


def _shapes() -> set[tuple[str, tuple[int, ...], int]]:
    """(kind, sample shape, classes) of every shipped scenario's dataset where
    the spec tells, plus the shapes of the datasets no scenario ships with."""
    found = {
        (info.kind, info.shape, info.classes)
        for info in (_info(load_scenario(p)) for p in ALL_SCENARIOS)
        if info.shape is not None and info.classes
    }
    found |= {
        ("image", (3, 32, 32), 10),  # cifar10
        ("image", (3, 32, 32), 100),  # cifar100
        ("image", (1, 28, 28), 62),  # emnist byclass
        ("image", (3, 64, 64), 7),  # larger than 32 px: resnet18's 7x7 stem
        ("image", (1, 32, 32), 10),  # grey 32x32: vgg11 with a 1-channel input
        ("vector", (784,), 10),  # flat 28x28: read as a grey image
        ("sequence", (80,), 80),  # shakespeare
    }
    return found


# every built-in network with its defaults (a new one is checked as soon as
# it is registered), and a few with other fields
_SPECS = [cls() for cls in MODELS.values() if cls is not Quadratic] + [
    MLP(hidden=[7, 5, 3]),
    VGG11(norm_groups=32),
    ConvNet(depth=2, width=16),
    LSTM(embed_dim=4, lstm_hidden=32, lstm_layers=3),
]


def _reads(spec: Model, kind: str, shape: tuple[int, ...], classes: int) -> bool:
    """Whether the model reads such samples at all, as it says itself (else
    preflight's check_model_data refuses it)."""
    return spec.data_problem(pf.DataInfo(kind, shape, classes, None)) is None


_CASES = [
    (spec, kind, shape, classes)
    for spec in _SPECS
    for kind, shape, classes in sorted(_shapes())
    if _reads(spec, kind, shape, classes)
]


def _torch_count(spec: Model, shape: tuple[int, ...], classes: int) -> int:
    torch = pytest.importorskip("torch")
    from fedsim.models import build_model

    with torch.device("meta"):  # shapes only: vgg11 and resnet18 cost no memory
        net = build_model(spec, 0, classes, seed=0, input_shape=shape)
    return sum(p.numel() for p in net.parameters())


@pytest.mark.parametrize(
    ("spec", "kind", "shape", "classes"),
    _CASES,
    ids=[f"{s.name}-{k}-{'x'.join(map(str, sh))}-{c}" for s, k, sh, c in _CASES],
)
def test_param_count_formula_equals_the_torch_network(spec, kind, shape, classes):
    # Prepare: samples the model reads (a square vector is a grey image)
    info = pf.DataInfo(kind, shape, classes, None)
    try:
        want = _torch_count(spec, shape, classes)
    except (ValueError, RuntimeError):  # e.g. vgg11 on 28x28: too small for it
        # Execute / Assert: the formula refuses it too, in one line
        with pytest.raises(ScenarioError, match="too small"):
            pf.count_params(spec, info)
        return
    # Execute
    formula = pf.count_params(spec, info)
    # Assert
    assert formula == want


def test_quadratic_param_count_is_its_dimension():
    info = pf.DataInfo("vector", (5,), 0, None)
    spec = Quadratic()
    assert pf.count_params(spec, info) == 5
    assert _torch_count(spec, (5,), 0) == 5


def test_hand_counted_image_networks():
    # cnn on 28x28x1 (the FedAvg paper): conv 1*32*25+32 = 832, conv
    # 32*64*25+64 = 51264, fc 7*7*64*512+512 = 1606144, out 512*10+10 = 5130
    assert CNN().param_count((1, 28, 28), 10) == 1_663_370
    # cifar_cnn on 32x32x3: conv 3*64*25+64 = 4864 (32 -> 28 -> 14), conv
    # 64*64*25+64 = 102464 (14 -> 10 -> 5), fc 5*5*64*384+384 = 614784,
    # 384*192+192 = 73920, out 192*10+10 = 1930
    assert CifarCNN().param_count((3, 32, 32), 10) == 797_962
    # convnet depth 1 width 2 on 4x4x1: conv 1*2*9+2 = 20 with padding 3
    # (4 -> 8), GroupNorm 4, pool 8 -> 4, linear 2*4*4*3+3 = 99
    assert ConvNet(depth=1, width=2).param_count((1, 4, 4), 3) == 123


def test_an_image_too_small_for_the_network_is_one_line():
    # cifar_cnn on 8x8: 8 -> 4 -> 2, and the second 5x5 convolution has no room
    with pytest.raises(ScenarioError) as exc:
        pf.count_params(CifarCNN(), pf.DataInfo("image", (1, 8, 8), 10, None))
    msg = str(exc.value)
    assert "\n" not in msg
    assert msg.startswith("model.name 'cifar_cnn': 1x8x8 images are too small")


def test_lazy_import_imports_on_the_first_attribute_read():
    from fedsim.lazy import lazy_import

    # Prepare: a stand-in for a module that does not exist costs nothing...
    missing = lazy_import("fedsim_no_such_module")
    # Execute / Assert: ...until an attribute is read
    with pytest.raises(ModuleNotFoundError):
        missing.anything  # noqa: B018 - the read is the test
    real = lazy_import("json")
    assert real.dumps([1]) == "[1]"
    assert real.dumps is json.dumps  # the real function, kept after one read
