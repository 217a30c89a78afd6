"""Plug-ins written outside fedsim (examples/fedsim_example) are found, validated,
contract-checked and run as the built-ins are (docs/extending.md).

The example package is not installed: its folder goes on ``sys.path`` here
and on ``PYTHONPATH`` for the command lines (and their Ray workers); entry
points are tested with a ``.dist-info`` folder made in a temporary directory.
No built-in algorithm or selector is named in the modules that must stay
generic (the last tests).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from fedsim.api import Selector
from fedsim.plugins import resolve
from fedsim.scenario import ScenarioError, dump_scenario, load_scenario, parse_scenario
from fedsim.testing import check_algorithm, check_selector

from .conftest import ROOT, WAIT_S, fedsim_here

EXAMPLE = ROOT / "examples" / "fedsim_example"
SCENARIO = EXAMPLE / "scenario.yaml"
ENV = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join([str(ROOT), str(EXAMPLE)]),
    "RAY_USAGE_STATS_ENABLED": "0",
}
WALL_CLOCK = {"wall_time"}


@pytest.fixture(autouse=True)
def example_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLE))


def fedsim(
    *args: str, env: dict[str, str] | None = None, cwd: Path = ROOT
) -> subprocess.CompletedProcess:
    # from another folder than the checkout: the installed `fedsim` command
    # (`python -m` would put that folder, not the package, first on sys.path)
    command = [sys.executable, "-m", "fedsim"]
    if cwd != ROOT:
        command = [str(Path(sys.executable).with_name("fedsim"))]
    return subprocess.run(
        [*command, *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env or ENV,
        timeout=600,
    )


# ------------------------------------------------------- the example's classes
def test_fedexp_extrapolates_by_the_hand_computed_step():
    from fedsim_example.fedexp import FedExP

    from fedsim.api import ClientUpdate

    # Prepare: [2, 0] and [-1, 1], weights 1 and 3: mean = [-0.25, 0.75],
    # ||mean||^2 = 0.625, sum p ||Delta||^2 = 0.25 * 4 + 0.75 * 2 = 2.5,
    # eta = 2.5 / (2 * (0.625 + 0.625)) = 1 with epsilon 0.625; 2 with 0
    ups = [
        ClientUpdate(0, torch.tensor([2.0, 0.0]), 1.0, 1, 1.0, 0.0),
        ClientUpdate(1, torch.tensor([-1.0, 1.0]), 3.0, 1, 1.0, 0.0),
    ]
    x0 = {"x": torch.tensor([1.0, 1.0])}
    # Execute
    fast, info = FedExP(epsilon=0.0).aggregate(x0, ups)
    damped, _ = FedExP(epsilon=0.625).aggregate(x0, ups)
    # Assert
    torch.testing.assert_close(fast["x"], torch.tensor([0.5, 2.5]))
    torch.testing.assert_close(damped["x"], torch.tensor([0.75, 1.75]))
    assert info.weights == {0: 0.25, 1: 0.75}


def test_fedexp_never_steps_less_than_fedavg():
    from fedsim_example.fedexp import FedExP

    from fedsim.api import ClientUpdate

    # agreeing updates: eta = max(1, 1/2) = 1, the FedAvg step
    ups = [ClientUpdate(i, torch.tensor([1.0, 2.0]), 1.0, 1, 1.0, 0.0) for i in (0, 1)]
    new, _ = FedExP().aggregate({"x": torch.zeros(2)}, ups)
    torch.testing.assert_close(new["x"], torch.tensor([1.0, 2.0]))


def test_fastest_k_picks_the_shortest_expected_rounds():
    from fedsim_example.fastest import FastestK

    from fedsim.api import Draw, SelectorContext

    ctx = SelectorContext.from_arrays([1] * 5, round_time_s=[5.0, 1.0, 4.0, 2.0, 1.0])
    sel = FastestK(clients_per_round=3)
    ids, _ = sel.select({}, Draw(0, [0, 1, 2, 3, 4], np.random.default_rng(0), ctx))
    assert ids.tolist() == [1, 3, 4]


def test_example_algorithm_keeps_the_contract():
    from fedsim_example.fedexp import FedExP

    check_algorithm(FedExP(), identical=lambda alg, x0, delta, n: x0 + delta)
    check_algorithm(FedExP(epsilon=0.0, server_lr=0.5))


@pytest.mark.parametrize("explore", [0.0, 0.5])
def test_example_selector_keeps_the_contract(explore):
    from fedsim_example.fastest import FastestK

    check_selector(FastestK(clients_per_round=3, explore=explore), explore == 0.0)


@dataclass(frozen=True)
class Unsorted(Selector):
    """A broken selector: the highest candidates, largest id first."""

    def select(self, state, draw):
        return draw.candidates[::-1][: self.k(draw)].copy(), state


def test_the_contract_catches_a_broken_selector():
    with pytest.raises(AssertionError, match="distinct and sorted"):
        check_selector(Unsorted(clients_per_round=3), deterministic=True)


def test_example_model_counts_its_parameters_by_formula():
    from fedsim_example.tiny_mlp import TinyMLP

    spec = TinyMLP(hidden=5)
    net = spec.build((2, 3), 4)
    assert sum(p.numel() for p in net.parameters()) == spec.param_count((2, 3), 4)
    assert spec.param_count((2, 3), 4) == 6 * 5 + 5 + 5 * 4 + 4


# ------------------------------------------------------------- finding classes
def test_import_paths_resolve_and_keep_their_fields():
    # Execute
    sc = load_scenario(SCENARIO)
    again = parse_scenario(dump_scenario(sc), "<resolved>", base_dir=EXAMPLE)
    # Assert: the section keeps the path, and the dump loads to the same objects
    assert type(sc.algorithm).__name__ == "FedExP" and sc.algorithm.epsilon == 0.001
    assert sc.algorithm.name == "fedsim_example.fedexp:FedExP"
    assert sc.selector.explore == 0.3 and sc.model.hidden == 8
    assert again == sc


@pytest.mark.parametrize(
    ("override", "field", "expected"),
    [
        ("algorithm.bogus=1", "algorithm.bogus", "unknown key"),
        ("algorithm.epsilon=-1", "algorithm.epsilon", "greater than or equal to 0"),
        ("model.hidden=0", "model.hidden", "greater than or equal to 1"),
        ("selector.explore=2", "selector.explore", "less than or equal to 1"),
    ],
)
def test_plugin_fields_are_validated_like_builtin_ones(override, field, expected):
    with pytest.raises(ScenarioError) as got:
        load_scenario(SCENARIO, [override])
    assert re.search(rf"{re.escape(field)}: .*{expected}", str(got.value))


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        (
            "algorithm.name=nosuch_pkg.algos:FedFoo",
            "algorithm.name: cannot import module 'nosuch_pkg.algos' of "
            "'nosuch_pkg.algos:FedFoo'",
        ),
        (
            "algorithm.name=fedsim_example.fedexp:FedNope",
            "algorithm.name: module 'fedsim_example.fedexp' has no 'FedNope'",
        ),
        (
            "algorithm.name=fedsim_example.fastest:FastestK",
            "algorithm.name: 'fedsim_example.fastest:FastestK' is <class "
            "'fedsim_example.fastest.FastestK'>, not a subclass of "
            "fedsim.api.Algorithm",
        ),
        ("selector.name=nosuch", "selector.name: unknown name 'nosuch' (expected"),
    ],
)
def test_a_bad_plugin_is_one_line_exit_2(tmp_path, override, expected):
    # Prepare: the example scenario with the bad name in the file itself
    field, _, name = override.partition("=")
    section, key = field.split(".")
    bad = tmp_path / "bad.yaml"
    text = SCENARIO.read_text()
    line = next(ln for ln in text.splitlines() if ln.startswith(f"{section}:"))
    new = re.sub(rf'{key}: "?[^,"]+"?', f'{key}: "{name}"', line, count=1)
    bad.write_text(text.replace(line, new))
    # Execute
    p = fedsim("validate", str(bad))
    # Assert
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"error: {bad}: {expected}"), lines[0]


_PROBE = """
import sys
from fedsim.tools.cli import main
sys.argv = ["fedsim", "validate", sys.argv[1]]
try:
    main()
except SystemExit as exc:
    print("exit", exc.code, "torch" in sys.modules)
"""


def test_validate_with_plugins_imports_no_torch():
    p = subprocess.run(
        [sys.executable, "-c", _PROBE, str(SCENARIO)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=ENV,
        timeout=WAIT_S,
    )
    assert p.stdout.strip().splitlines()[-1] == "exit 0 False", p.stderr[-2000:]


def _dist_info(root: Path) -> None:
    """An installed-package record of the example (its entry points), as pip
    would write it, without installing anything."""
    info = root / "fedsim_example-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fedsim-example\n")
    (info / "entry_points.txt").write_text(
        "[fedsim.algorithms]\nfedexp = fedsim_example.fedexp:FedExP\n\n"
        "[fedsim.selectors]\nfastest_k = fedsim_example.fastest:FastestK\n\n"
        "[fedsim.models]\ntiny_mlp = fedsim_example.tiny_mlp:TinyMLP\n\n"
        "[fedsim.datasets]\nblobs = fedsim_example.blobs:Blobs\n"
    )


def test_entry_points_give_short_names(tmp_path, monkeypatch):
    # Prepare
    _dist_info(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    from fedsim_example.fedexp import FedExP

    # Execute
    sc = load_scenario(
        SCENARIO,
        [
            "algorithm={name: fedexp, epsilon: 0.01}",
            "selector={name: fastest_k, clients_per_round: 2}",
            "model={name: tiny_mlp}",
        ],
    )
    # Assert
    assert resolve("algorithm", "fedexp") is FedExP
    assert type(sc.algorithm) is FedExP and sc.algorithm.name == "fedexp"
    assert type(sc.selector).__name__ == "FastestK" and sc.model.hidden == 16
    with pytest.raises(ScenarioError, match="unknown name 'fedexq'.*fedexp"):
        load_scenario(SCENARIO, ["algorithm.name=fedexq"])


def test_a_dataset_plugin_states_its_samples_and_trains(tmp_path, monkeypatch):
    from fedsim.runtime import run_scenario
    from fedsim.tools.preflight import preflight

    # Prepare: Blobs by its entry-point name, 8 features, 3 classes
    _dist_info(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    data = "data={dataset: blobs, features: 8, classes: 3, samples_per_client: 20}"
    sc = load_scenario(SCENARIO, [data, "rounds=2"])
    # Execute
    est = preflight(sc, "<test>", available_bytes=2**33)
    run = run_scenario(sc, workers=0)
    # Assert: TinyMLP(hidden=8) on 8 features, 3 classes: 8*8+8 + 8*3+3
    assert est.params == 99 and est.parts["data"] == 8 * 20 * (4 * 8 + 8)
    assert run.final_params is not None and run.final_params.numel() == 99
    assert len(run.rows) == 2


# ----------------------------------------------------------------- running them
def _table(run_dir: Path, name: str) -> list[dict]:
    rows = pq.read_table(run_dir / name).to_pylist()
    return [{k: v for k, v in r.items() if k not in WALL_CLOCK} for r in rows]


def _run(out: Path, *extra: str, env: dict[str, str] | None = None) -> Path:
    p = fedsim(
        "run",
        str(SCENARIO),
        "--out",
        str(out),
        "--quiet",
        "--no-report",
        *extra,
        env=env,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    return out


class _Stop(Exception):
    pass


def _stop_at(round_: int):
    def on_round(row, clients):
        if row["round"] == round_:
            raise _Stop

    return on_round


def test_the_example_runs_in_process_and_resumes(tmp_path):
    from fedsim.runtime import run_scenario

    # Prepare: a whole run; one stopped in round 3, after the round-2 checkpoint
    ckpt = "checkpoint.every_rounds=2"
    ref = _run(tmp_path / "ref", "--workers", "0", "--set", ckpt)
    part = tmp_path / "part"
    part.mkdir()
    sc = load_scenario(SCENARIO, [ckpt])
    (part / "scenario.yaml").write_text(dump_scenario(sc))
    with pytest.raises(_Stop):
        run_scenario(sc, run_dir=part, on_round=_stop_at(3))
    # Execute
    p = fedsim("run", "--resume", str(part), "--quiet", "--no-report")
    # Assert
    assert p.returncode == 0, p.stderr[-3000:]
    rows = _table(ref, "rounds.parquet")
    assert len(rows) == 4 and rows[-1]["test_loss"] < rows[0]["test_loss"]
    assert _table(part, "rounds.parquet") == rows
    assert _table(part, "clients.parquet") == _table(ref, "clients.parquet")


# explore: test_compare_and_stress_take_an_installed_plugin runs the example's
# plug-in on 2 Ray workers too, and test_hooks on the shared session (CI runs
# this one when its budget allows)
@pytest.mark.explore
@pytest.mark.ray
@pytest.mark.slow
def test_the_example_gives_the_same_results_on_two_ray_workers(tmp_path):
    # The reference through the CLI in this process (the example is on
    # sys.path here): results do not depend on the number of workers
    # (test_determinism), so one command line on 2 Ray workers, whose
    # workers import the plug-ins from the PYTHONPATH they inherit from it,
    # must match it.
    ref = tmp_path / "w0"
    args = ["run", str(SCENARIO), "--out", str(ref), "--workers", "0"]
    fedsim_here(*args, "--quiet", "--no-report", check=True)
    ray = _run(tmp_path / "w2", "--workers", "2")
    for name in ("rounds.parquet", "clients.parquet"):
        assert _table(ray, name) == _table(ref, name)
    summary = json.loads((ray / "summary.json").read_text())
    assert summary["workers"] == 2


@pytest.mark.slow
def test_compare_and_stress_take_an_installed_plugin(tmp_path):
    import pyarrow.parquet as pq

    _dist_info(tmp_path)
    env = {**ENV, "PYTHONPATH": os.pathsep.join([ENV["PYTHONPATH"], str(tmp_path)])}
    # stress starts in a folder that holds the checkout as `fedsim/` beside
    # the user's package (issue 37, defect 1): Ray puts that folder first on
    # its workers' sys.path, where `fedsim` was a namespace package rooted at
    # the checkout. The checkout is not on this PYTHONPATH: the editable
    # install finds fedsim, as a user's shell would.
    beside = tmp_path / "work"
    beside.mkdir()
    (beside / "fedsim").symlink_to(ROOT, target_is_directory=True)
    no_root = {
        **env,
        "PYTHONPATH": os.pathsep.join([str(EXAMPLE), str(tmp_path)]),
    }
    # compare in its own process (--workers 0), stress on Ray tasks (its
    # default): the plug-in's short names resolve in Ray's worker processes
    # too, once is enough (an embedded Ray costs a command seconds of CPU).
    # epsilon 0.001: FedExP's server step exceeds FedAvg's here (with 0.01
    # it stays 1, and the plug-in's run equals FedAvg's)
    plugin = "fedexp:epsilon=0.001"
    p = fedsim(
        "compare",
        str(SCENARIO),
        "-a",
        f"fedavg,{plugin}",
        "--seeds",
        "1",
        "--workers",
        "0",
        "--out",
        str(tmp_path / "cmp"),
        "--quiet",
        env=env,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    # stress names the same plug-in by import path, its settings after "?"
    # (issue 37, defect 5: a cluster's py_modules give import paths only),
    # on 2 Ray workers
    by_path = "fedsim_example.fedexp:FedExP?epsilon=0.001"
    p = fedsim(
        "stress",
        str(SCENARIO),
        "--sweep",
        "client.lr=0.05,0.1",  # 0.05: the scenario's own, as compare ran it
        "-a",
        by_path,
        "--seeds",
        "1",
        "--workers",
        "2",
        "--out",
        str(tmp_path / "stress"),
        "--quiet",
        env=no_root,
        cwd=beside,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    # a healthy run under --quiet: no WARNING from Ray's start (its token
    # authentication, chosen by fedsim rather than by Ray's default)
    assert "Token authentication is enabled" not in p.stderr, p.stderr[-3000:]
    # --help lists the installed plug-in among the algorithms
    for command in ("compare", "stress"):
        shown = fedsim(command, "--help", env={**env, "COLUMNS": "400"}).stdout
        assert re.search(r"installed: fedexp\)", shown), shown[-2000:]

    # Every run trained the scenario's 4 rounds; the plug-in is not FedAvg
    # under another name, and stress's run of it at the scenario's learning
    # rate (a Ray task) is compare's (in process), as results depend only on
    # (scenario, seed)
    table = pq.read_table(tmp_path / "cmp" / "compare.parquet").to_pylist()
    cmp = {r["algorithm"]: r for r in table}
    assert sorted(cmp) == ["fedavg", plugin], sorted(cmp)
    assert all(r["rounds"] == 4 and not r["diverged"] for r in cmp.values()), cmp
    assert cmp[plugin]["final_test_loss"] != cmp["fedavg"]["final_test_loss"]
    cells = pq.read_table(tmp_path / "stress" / "stress.parquet").to_pylist()
    by_lr = {r["client.lr"]: r for r in cells}
    assert sorted(by_lr) == [0.05, 0.1] and len(cells) == 2, cells
    assert {r["algorithm"] for r in cells} == {by_path}
    assert all(r["rounds"] == 4 and not r["diverged"] for r in cells), cells
    for key in ("final_accuracy", "best_accuracy", "sim_time_s"):
        assert by_lr[0.05][key] == cmp[plugin][key], key
    assert by_lr[0.1]["final_accuracy"] != by_lr[0.05]["final_accuracy"] or (
        by_lr[0.1]["best_accuracy"] != by_lr[0.05]["best_accuracy"]
    )


# ------------------------------------------- no built-in named where it must not be
def _builtin_names() -> list[str]:
    """Every built-in algorithm's and selector's registry name (a new
    built-in joins the check without editing it)."""
    from fedsim.algorithms import REGISTRY as ALGORITHMS
    from fedsim.selectors import REGISTRY as SELECTORS

    return sorted(set(ALGORITHMS) | set(SELECTORS))


BUILTIN_NAMES = _builtin_names()
_NAMED = re.compile(rf"\b({'|'.join(BUILTIN_NAMES)})\b", re.IGNORECASE)


def named_builtins(path: Path) -> list[str]:
    """``line: name`` for each built-in algorithm or selector name in the file
    (whole words, any case, comments and strings included)."""
    lines = path.read_text().splitlines()
    return [
        f"{i}: {m.group(1)}"
        for i, ln in enumerate(lines, 1)
        for m in _NAMED.finditer(ln)
    ]


def test_the_name_finder_finds_names():
    assert _NAMED.findall("a FedAvg b fedavgx feddm.") == ["FedAvg", "feddm"]


@pytest.mark.parametrize(
    "module",
    ["scenario.py", "tools/preflight.py", "tools/cli.py", "runtime.py", "server.py"],
)
def test_generic_modules_name_no_builtin_plugin(module):
    assert named_builtins(ROOT / "fedsim" / module) == []


def test_the_batched_executor_trains_the_example_as_the_sequential_one():
    from fedsim.runtime import run_scenario

    # Prepare / Execute
    seq = run_scenario(load_scenario(SCENARIO), workers=0)
    vec = run_scenario(load_scenario(SCENARIO, ["resources.vectorize=true"]), workers=0)
    # Assert: equal within float tolerance (batched sums in another order)
    chosen = [(c["round"], c["client_id"]) for c in seq.clients]
    assert [(c["round"], c["client_id"]) for c in vec.clients] == chosen
    for a, b in zip(vec.rows, seq.rows, strict=True):
        assert a["test_loss"] == pytest.approx(b["test_loss"], rel=1e-4)


@pytest.mark.parametrize("module", ["fedexp", "fastest", "tiny_mlp", "blobs"])
def test_the_example_docstrings_run(module):
    import doctest
    import importlib

    mod = importlib.import_module(f"fedsim_example.{module}")
    result = doctest.testmod(mod, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted > 0
