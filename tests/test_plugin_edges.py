"""Plug-ins at fedsim's edges (issue 37's defects 1, 2, 4 and 5, and issue
39's misbehaving plug-ins caught before training): the package Ray's workers
import, a plug-in module that fails at import, state that is not a tensor,
compare's and stress's import-path arms, and the refusals that name the
plug-in, the hook and what was expected.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from .conftest import ROOT, fedsim_here

EXAMPLE = ROOT / "examples" / "fedsim_example"
SCENARIO = EXAMPLE / "scenario.yaml"


@pytest.fixture(autouse=True)
def example_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLE))


# ------------------------------------------- defect 1: the package on Ray workers
def test_workers_get_the_package_folder_only_when_the_path_lacks_it(monkeypatch):
    import fedsim
    from fedsim.remote.ray_session import worker_code_paths

    # Prepare: the folder holding this process's fedsim
    home = str(Path(fedsim.__file__).resolve().parent.parent)
    # Execute / Assert: on sys.path (site-packages, a checkout run from its
    # root) nothing is added; found only by an import hook (an editable
    # install), the folder is given to the workers
    monkeypatch.setattr(sys, "path", [home, *sys.path])
    assert worker_code_paths() == []
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in (home, "")])
    monkeypatch.chdir("/")
    assert worker_code_paths() == [home]


@pytest.mark.ray
def test_an_error_in_a_ray_worker_is_one_plain_line(tmp_path, ray_session):
    # Prepare: a plug-in module this process imports (its folder on sys.path
    # here) that the Ray workers cannot (their path lacks it)
    (tmp_path / "driver_only_algo.py").write_text(
        "from fedsim_example.fastest import FastestK as DriverOnly\n"
    )
    sys.path.insert(0, str(tmp_path))
    try:
        # Execute
        p = fedsim_here(
            "compare",
            str(SCENARIO),
            "-a",
            "fedavg",
            "--set",
            "selector.name=driver_only_algo:DriverOnly",
            "--seeds",
            "1",
            "--workers",
            "1",
            "--out",
            str(tmp_path / "cmp"),
            "--quiet",
        )
    finally:
        sys.path.remove(str(tmp_path))
    # Assert: one line, no terminal codes, the cause and the worker named
    lines = p.stderr.strip().splitlines()
    assert p.returncode in (1, 2) and len(lines) == 1, p.stderr[-3000:]
    assert "\x1b" not in p.stderr
    assert "driver_only_algo" in lines[0] and "in Ray worker pid" in lines[0]


# --------------------------- defect 2: a plug-in module that fails at import
def _module(folder: Path, name: str, text: str) -> None:
    (folder / f"{name}.py").write_text(text)


def _validate(scenario: Path, *sets: str):
    args = ["validate", str(scenario)]
    for s in sets:
        args += ["--set", s]
    return fedsim_here(*args)


def _one_error_line(p) -> str:
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1, (p.returncode, p.stderr[-3000:])
    return lines[0]


@pytest.mark.parametrize(
    ("body", "line", "expected"),
    [
        (  # a field without a default after defaulted ones
            "from dataclasses import dataclass\n"
            "from fedsim.api import Algorithm\n\n"
            "@dataclass(frozen=True)\n"
            "class Bad(Algorithm):\n"
            "    mu: float = 0.1\n"
            "    beta: float\n",
            4,
            "TypeError: non-default argument 'beta' follows default argument",
        ),
        ("import sys\n\nsys.exit(7)\n", 3, "SystemExit(7) (sys.exit at import)"),
        ("raise SystemExit\n", 1, "SystemExit(None)"),
        ("x = 1\nx = 1 / 0\n", 2, "ZeroDivisionError: division by zero"),
        ("x = 1\ny = (\n", 2, "SyntaxError: '(' was never closed"),
    ],
)
def test_a_module_raising_at_import_is_one_line_exit_2(
    tmp_path, monkeypatch, body, line, expected
):
    # Prepare: a plug-in module (a fresh name: imports are cached)
    name = f"raises_{abs(hash(body)) % 10**8}"
    _module(tmp_path, name, body)
    monkeypatch.syspath_prepend(str(tmp_path))
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        SCENARIO.read_text().replace("fedsim_example.fedexp:FedExP", f"{name}:Bad")
    )
    # Execute
    p = _validate(bad)
    # Assert: the field, the module, the exception and the plug-in's file:line
    got = _one_error_line(p)
    assert got.startswith(
        f"error: {bad}: algorithm.name: module {name!r} of '{name}:Bad' raised "
        f"while imported: {expected}"
    ), got
    assert got.endswith(f"(at {tmp_path / name}.py:{line})"), got


# ------------------ issue 39: misbehaving plug-ins refused before training
def test_the_abstract_base_is_refused_naming_the_hook():
    p = _validate(SCENARIO, "algorithm={name: 'fedsim.api:Algorithm'}")
    assert "'fedsim.api:Algorithm' is abstract: Algorithm does not define " in (
        got := _one_error_line(p)
    )
    assert got.endswith("that defines aggregate)"), got


def test_a_subclass_leaving_select_to_its_base_is_refused(tmp_path, monkeypatch):
    _module(
        tmp_path,
        "lazy_selector",
        "from dataclasses import dataclass\n"
        "from fedsim.api import Selector\n\n"
        "@dataclass(frozen=True)\n"
        "class Lazy(Selector):\n"
        "    pass\n",
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    p = _validate(SCENARIO, "selector={name: 'lazy_selector:Lazy'}")
    assert "Lazy does not define select" in _one_error_line(p)


_LOCKED = (
    "import threading\n"
    "from dataclasses import dataclass, field\n"
    "from fedsim_example.fedexp import FedExP\n\n"
    "@dataclass(frozen=True)\n"
    "class Typed(FedExP):\n"
    "    lock: threading.Lock = field(default_factory=threading.Lock)\n\n"
    "@dataclass(frozen=True)\n"
    "class Untyped(FedExP):\n"
    "    lock: object = field(default_factory=threading.Lock)\n"
)


@pytest.mark.parametrize(
    ("cls", "expected"),
    [
        ("Typed", "has a field of a type a scenario file cannot hold"),
        ("Untyped", "field 'lock' of plug-in 'locked_algo:Untyped' holds a "),
    ],
)
def test_a_field_that_cannot_be_written_is_one_line(
    tmp_path, monkeypatch, cls, expected
):
    _module(tmp_path, "locked_algo", _LOCKED)
    monkeypatch.syspath_prepend(str(tmp_path))
    p = _validate(SCENARIO, f"algorithm={{name: 'locked_algo:{cls}'}}")
    assert expected in _one_error_line(p)


_MISBEHAVING = """
import dataclasses
import math
from fedsim_example.blobs import Blobs
from fedsim_example.tiny_mlp import TinyMLP


class Raises(TinyMLP):
    def build(self, input_shape, num_classes):
        raise RuntimeError("no GPU kernel for this")


class Undercounts(TinyMLP):
    def param_count(self, input_shape, num_classes):
        return 10


class WrongOutputs(TinyMLP):
    def build(self, input_shape, num_classes):
        return super().build(input_shape, num_classes + 4)

    def param_count(self, input_shape, num_classes):
        return super().param_count(input_shape, num_classes + 4)


class Misstated(Blobs):
    def build(self, num_clients, seed):
        return Blobs(features=7, classes=10, samples_per_client=20).build(
            num_clients, seed
        )


class MoreClasses(Blobs):
    def build(self, num_clients, seed):
        return Blobs(features=4, classes=5, samples_per_client=20).build(
            num_clients, seed
        )


class ShiftedLabels(Blobs):
    def build(self, num_clients, seed):
        data = super().build(num_clients, seed)
        return dataclasses.replace(data, y=data.y + 1)
"""


def _run_here(tmp_path: Path, *sets: str):
    args = ["run", str(SCENARIO), "--workers", "0", "--out", str(tmp_path / "r")]
    for s in sets:
        args += ["--set", s]
    return fedsim_here(*args, "--quiet", "--no-report")


@pytest.mark.parametrize(
    ("sets", "expected"),
    [
        (
            ["model={name: 'misbehaving:Raises'}"],
            "model.name 'misbehaving:Raises': build((10,), 3) raised RuntimeError: "
            "no GPU kernel for this (at ",
        ),
        (
            ["model={name: 'misbehaving:Undercounts'}"],
            "model.name 'misbehaving:Undercounts': param_count((10,), 3) states "
            "10 parameters, but build() made 227 trainable ones",
        ),
        (
            ["model={name: 'misbehaving:WrongOutputs'}"],
            "model.name 'misbehaving:WrongOutputs': the network's outputs for 2 "
            "samples have shape (2, 7), expected (2, 3)",
        ),
        (
            [
                "data={dataset: 'misbehaving:Misstated', features: 4, classes: 3, "
                "samples_per_client: 20}",
                "model={name: 'fedsim_example.tiny_mlp:TinyMLP', hidden: 8}",
            ],
            "data.dataset 'misbehaving:Misstated': info() stated samples of shape "
            "(4,), but build() returned x of shape",
        ),
        (
            [
                "data={dataset: 'misbehaving:MoreClasses', features: 4, classes: 3, "
                "samples_per_client: 20}",
                "model={name: 'fedsim_example.tiny_mlp:TinyMLP', hidden: 8}",
            ],
            "data.dataset 'misbehaving:MoreClasses': info() stated 3 classes, but "
            "build() returned num_classes=5",
        ),
        (
            [
                "data={dataset: 'misbehaving:ShiftedLabels', features: 4, "
                "classes: 3, samples_per_client: 20}",
                "model={name: 'fedsim_example.tiny_mlp:TinyMLP', hidden: 8}",
            ],
            "data.dataset 'misbehaving:ShiftedLabels': build() returned labels "
            "from 0 to 3, expected 0 to 2 (num_classes=3)",  # the test set kept 0
        ),
    ],
)
def test_a_misbehaving_model_or_dataset_is_refused_before_training(
    tmp_path, monkeypatch, sets, expected
):
    # Prepare
    _module(tmp_path, "misbehaving", _MISBEHAVING)
    monkeypatch.syspath_prepend(str(tmp_path))
    # Execute
    p = _run_here(tmp_path, *sets)
    # Assert: one line, exit 2, no round written
    got = _one_error_line(p)
    assert got.startswith(f"error: {expected}"), got
    assert not (tmp_path / "r" / "rounds.parquet").exists()


# ------------------------- defect 4: server state that is not a tensor
def test_a_state_of_ints_floats_bools_and_numpy_is_checkpointed_exactly(tmp_path):
    import numpy as np
    import torch

    from fedsim.checkpoint import load_tensors, save_tensors

    # Prepare: every kind a state may hold, with values a float32 would round
    state = {
        "x": torch.tensor([1 / 3, 2.0], dtype=torch.float64),
        "step": 2**40 + 1,
        "decay": 0.1 + 0.2,
        "warm": True,
        "m": np.array([[1 / 3, -0.0]], dtype=np.float64),
        "seen": np.array([3, 0, 7], dtype=np.int64),
        "mask": np.array([True, False]),
        "scale": np.float32(1 / 3),
    }
    # Execute
    save_tensors(tmp_path / "server.pt", state)
    back = load_tensors(tmp_path / "server.pt")
    # Assert: the same keys, types, dtypes and bits
    assert set(back) == set(state)
    assert torch.equal(back["x"], state["x"]) and back["x"].dtype == torch.float64
    for key in ("step", "decay", "warm"):
        assert type(back[key]) is type(state[key]) and back[key] == state[key], key
    for key in ("m", "seen", "mask"):
        assert isinstance(back[key], np.ndarray) and back[key].dtype == state[key].dtype
        assert back[key].tobytes() == state[key].tobytes(), key
    assert type(back["scale"]) is np.float32 and back["scale"] == state["scale"]


@pytest.mark.parametrize("value", ["text", [1, 2], None, {"a": 1}])
def test_a_state_value_of_another_type_names_its_key(tmp_path, value):
    import torch

    from fedsim.checkpoint import CheckpointError, save_tensors

    with pytest.raises(CheckpointError, match="server state key 'odd' holds a "):
        save_tensors(tmp_path / "s.pt", {"x": torch.zeros(2), "odd": value})


_COUNTING = '''
from dataclasses import dataclass

import numpy as np
import torch

from fedsim.api import PLAIN_ROUND
from fedsim_example.fedexp import FedExP


@dataclass(frozen=True)
class Counting(FedExP):
    """FedExP whose server step shrinks with an int step counter, a float
    decay and a NumPy count of each client's updates (a lost or rounded
    counter after a resume changes the model)."""

    def init(self, x0, num_clients):
        state = super().init(x0, num_clients)
        seen = np.zeros(num_clients, np.int64)
        return {**state, "step": 0, "decay": 1.0, "seen": seen}

    def aggregate(self, state, updates, ctx=PLAIN_ROUND):
        new, info = super().aggregate(state, updates, ctx)
        shrink = state["decay"] / (1 + state["step"])
        x = state["x"] + shrink * (new["x"] - state["x"])
        seen = state["seen"].copy()
        for u in updates:
            seen[u.client] += 1
        step, decay = state["step"] + 1, state["decay"] * 0.9
        return {**new, "x": x, "step": step, "decay": decay, "seen": seen}, info
'''


def test_a_plugin_with_an_int_counter_resumes_exactly(tmp_path, monkeypatch):
    import numpy as np
    import pyarrow.parquet as pq

    from fedsim.checkpoint import load_tensors
    from fedsim.runtime import run_scenario
    from fedsim.scenario import dump_scenario, load_scenario

    # Prepare: a whole run, and one stopped in round 3 after the round-2
    # checkpoint, of a plug-in whose state holds an int, a float and NumPy
    _module(tmp_path, "counting", _COUNTING)
    monkeypatch.syspath_prepend(str(tmp_path))
    sets = ["checkpoint.every_rounds=2", "algorithm={name: 'counting:Counting'}"]
    sc = load_scenario(SCENARIO, sets)
    ref, part = tmp_path / "ref", tmp_path / "part"
    for folder in (ref, part):
        folder.mkdir()
        (folder / "scenario.yaml").write_text(dump_scenario(sc))
    run_scenario(sc, run_dir=ref)

    class Stop(Exception):
        pass

    def stop_in_round_3(row, clients):
        if row["round"] == 3:
            raise Stop

    with pytest.raises(Stop):
        run_scenario(sc, run_dir=part, on_round=stop_in_round_3)
    # Execute
    run_scenario(sc, run_dir=part, resume=True)

    # Assert: the same rows, and the same final state, bit for bit
    def rows(folder):
        table = pq.read_table(folder / "rounds.parquet").to_pylist()
        return [{k: v for k, v in r.items() if k != "wall_time"} for r in table]

    assert rows(part) == rows(ref) and len(rows(ref)) == 4
    a = load_tensors(ref / "ckpt-00000004" / "server.pt")
    b = load_tensors(part / "ckpt-00000004" / "server.pt")
    assert a["step"] == b["step"] == 4 and type(b["step"]) is int
    assert b["decay"] == a["decay"] == 1.0 * 0.9 * 0.9 * 0.9 * 0.9  # as multiplied
    assert np.array_equal(a["seen"], b["seen"]) and b["seen"].sum() == 4 * 3
    assert a["x"].equal(b["x"])


# ------------------------------- docs/extending.md's claims, each checked
_MY_FEDAVG = '''
from dataclasses import dataclass

import torch

from fedsim.api import PLAIN_ROUND, Algorithm, data_weights, meter, skip_empty_rounds


@dataclass(frozen=True)
class MyFedAvg(Algorithm):
    """FedAvg from docs/extending.md's description alone."""

    @skip_empty_rounds
    def aggregate(self, state, updates, ctx=PLAIN_ROUND):
        x = state["x"]
        assert x.ndim == 1 and x.dtype == torch.float32  # the flat model
        for u in updates:
            assert u.norm_a == u.tau  # plain SGD: a_i = (1, ..., 1)
        p = data_weights(updates)
        step = sum(pi * u.delta.double() for pi, u in zip(p, updates))
        w = [pi * u.norm_a for pi, u in zip(p, updates)]
        return {**state, "x": x + step.to(x.dtype)}, meter(updates, w, sum(w), p)
'''


def test_fedavg_written_from_the_docs_is_the_builtin(tmp_path, monkeypatch):
    from fedsim.runtime import run_scenario
    from fedsim.scenario import load_scenario

    # Prepare: x + sum p_i delta_i, w_i = p_i ||a_i||_1, tau_eff = sum w_i
    _module(tmp_path, "my_fedavg", _MY_FEDAVG)
    monkeypatch.syspath_prepend(str(tmp_path))
    plugin = load_scenario(
        SCENARIO, ["algorithm={name: 'my_fedavg:MyFedAvg'}", "rounds=2"]
    )
    builtin = load_scenario(SCENARIO, ["algorithm={name: fedavg}", "rounds=2"])
    # Execute
    runs = [run_scenario(sc, workers=0) for sc in (plugin, builtin)]

    # Assert: the same rows (the meter's chi^2 and tau_eff too), bit for bit
    def rows(run):
        return [{k: v for k, v in r.items() if k != "wall_time"} for r in run.rows]

    assert rows(runs[0]) == rows(runs[1]) and len(runs[0].rows) == 2
    assert {"tau_eff", "chi2_pw"} <= set(runs[0].rows[0]), sorted(runs[0].rows[0])


def test_a_required_option_is_kw_only_and_name_is_the_text_written(
    tmp_path, monkeypatch
):
    from fedsim.scenario import ScenarioError, load_scenario

    _module(
        tmp_path,
        "kw_algo",
        "from dataclasses import dataclass\n"
        "from fedsim_example.fedexp import FedExP\n\n"
        "@dataclass(frozen=True, kw_only=True)\n"
        "class Needs(FedExP):\n"
        "    beta: float\n",
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    sc = load_scenario(SCENARIO, ["algorithm={name: 'kw_algo:Needs', beta: 2}"])
    assert sc.algorithm.beta == 2.0 and sc.algorithm.name == "kw_algo:Needs"
    with pytest.raises(ScenarioError, match="algorithm.beta: required field"):
        load_scenario(SCENARIO, ["algorithm={name: 'kw_algo:Needs'}"])


def test_validate_prints_no_gone_field_and_an_old_file_still_loads(tmp_path):
    from fedsim.scenario import load_scenario

    p = fedsim_here("validate", str(ROOT / "scenarios" / "quickstart.yaml"))
    assert p.returncode == 0 and "resources:" in p.stdout, p.stderr
    assert "server_node" not in p.stdout and "server_cpus" not in p.stdout
    # a run folder's scenario.yaml from before: the fields at their defaults
    old = tmp_path / "old.yaml"
    text = (ROOT / "scenarios" / "quickstart.yaml").read_text()
    line = "resources: {workers: auto, "
    assert line in text
    old.write_text(text.replace(line, line + "server_node: driver, server_cpus: 0, "))
    assert load_scenario(old).resources.server_node == "driver"


# ----------------------- plug-in code that exits, or raises its own MemoryError
_TINY = ROOT / "scenarios" / "ci" / "tiny-synthetic.yaml"


@pytest.mark.parametrize(
    ("plugin", "hook", "error"),
    [
        ("Exits", "aggregate", "SystemExit(5): plug-in code called sys.exit"),
        ("GradExits", "a client", "SystemExit(7): plug-in code called sys.exit"),
        ("OwnMemoryError", "aggregate", "MemoryError: my cache is full"),
    ],
)
def test_a_plugin_that_exits_or_raises_memoryerror_fails_its_run(
    tmp_path, plugin, hook, error
):
    import json

    # Prepare / Execute: sys.exit (in a server hook, in a client's), and a
    # MemoryError with a message of the plug-in's own (not a refused one)
    out = tmp_path / "run"
    p = fedsim_here(
        *("run", str(_TINY), "-q", "--no-report", "--workers", "0"),
        *("--out", str(out), "--set", "rounds=2"),
        *("--set", f"algorithm={{name: 'tests.hostile_plugins:{plugin}'}}"),
    )

    # Assert: a plug-in's failure like any other: exit 3, summary.json,
    # failure.txt, one line naming the plug-in (not "out of memory")
    assert p.returncode == 3, p.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "failed"
    assert summary["failure"]["hook"] == hook
    assert summary["failure"]["error"] == error
    assert (out / "failure.txt").is_file()
    said = " ".join(p.stderr.split())
    assert f"algorithm 'tests.hostile_plugins:{plugin}' failed in {hook}" in said
    assert "out of memory" not in said and "Traceback" not in said


def test_a_refused_allocation_is_still_the_systems_not_the_plugins():
    import numpy as np

    from fedsim.hooks import is_memory_error

    # Python's bare MemoryError and NumPy's subclass are the system's; a
    # MemoryError with a message of its own is a plug-in's
    with pytest.raises(MemoryError) as numpy_refused:
        np.empty(2**62, dtype=np.uint8)
    assert is_memory_error(MemoryError())
    assert is_memory_error(numpy_refused.value)
    assert is_memory_error(RuntimeError("DefaultCPUAllocator: can't allocate memory"))
    assert not is_memory_error(MemoryError("my cache is full"))


def test_a_state_no_checkpoint_can_keep_is_refused_at_the_first_aggregate(tmp_path):
    import json

    # Prepare / Execute: a string in the server state, checkpoints every 5
    # rounds (the first would come after the run's 2 rounds)
    out = tmp_path / "run"
    p = fedsim_here(
        *("run", str(_TINY), "-q", "--no-report", "--workers", "0"),
        *("--out", str(out), "--set", "rounds=2"),
        *("--set", "checkpoint.every_rounds=5"),
        *("--set", "algorithm={name: 'tests.hostile_plugins:TextState'}"),
    )

    # Assert: the plug-in and the key named at the first aggregate, a
    # plug-in's failure (exit 3), no checkpoint folder left behind
    assert p.returncode == 3, p.stderr
    said = " ".join(p.stderr.split())
    assert (
        "algorithm 'tests.hostile_plugins:TextState' failed in aggregate: "
        "returned a state whose key 'note' holds a str" in said
    )
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rounds"] == 0 and summary["failure"]["hook"] == "aggregate"
    assert not list(out.glob("ckpt-*"))
