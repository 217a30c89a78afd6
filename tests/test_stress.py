"""fedsim stress: a sweep over a fleet setting, several aggregators, a report."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from fedsim.scenario import ScenarioError
from fedsim.tools.stress import degradation, parse_sweep, run_stress

from .conftest import SCENARIOS, assert_figure, fedsim_here

PHONES = SCENARIOS / "stress" / "phones-stragglers.yaml"
CI = ["rounds=4", "eval.every_rounds=2"]


def run_ci_grid(out: Path, workers: int | None = 0) -> Path:
    return run_stress(
        PHONES,
        {"fleet.stragglers.p": [0.0, 0.5]},
        ["fedavg", "fednova", "fedbuff"],
        seeds=2,
        out_dir=out,
        workers=workers,
        overrides=CI,
    )


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return run_ci_grid(tmp_path_factory.mktemp("stress") / "report")


def test_stress_report_on_a_ci_sized_grid(report: Path):
    # Assert: one row per cell, algorithm and seed, in grid order
    table = pq.read_table(report / "stress.parquet").to_pylist()
    assert len(table) == 2 * 3 * 2
    assert [
        (r["fleet.stragglers.p"], r["algorithm"], r["seed"]) for r in table[:3]
    ] == [(0.0, "fedavg", 0), (0.0, "fedavg", 1), (0.0, "fednova", 0)]
    for r in table:
        assert (
            0 <= r["final_accuracy"] <= 1 and r["best_accuracy"] >= r["final_accuracy"]
        )
        assert 0 <= r["dropped_fraction"] <= 1
        # no held-out rows (FedBuff's asynchronous timeline has no federated
        # evaluation): no default target, rather than one chosen on the test set
        assert r["target_accuracy"] is None and r["time_to_target_s"] is None
    assert "no target accuracy: give --target" in (report / "stress.md").read_text()
    # tau_mean and tau_std are those of the run's kept updates in taus.parquet:
    # in a synchronous round (a 30 s window) phones of different speeds make
    # different numbers of steps, so they spread; every asynchronous job
    # makes max_steps (50) steps, so they do not
    taus = pq.read_table(report / "taus.parquet").to_pylist()
    for r in table:
        kept = [
            t["tau"]
            for t in taus
            if (t["cell"], t["algorithm"], t["seed"])
            == (r["cell"], r["algorithm"], r["seed"])
            and not t["dropped"]
        ]
        assert len(kept) == r["updates"] > 1, r
        mean = sum(kept) / len(kept)
        std = math.sqrt(sum((t - mean) ** 2 for t in kept) / len(kept))
        assert r["tau_mean"] == pytest.approx(mean, rel=1e-12) and mean > 0, r
        assert r["tau_std"] == pytest.approx(std, rel=1e-12), r
        if r["mode"] == "sync":
            assert std > 0, r
        else:
            assert set(kept) == {50} and r["tau_std"] == 0.0, r
    fedbuff = [r for r in table if r["algorithm"] == "fedbuff"]
    assert {r["mode"] for r in fedbuff} == {"async"}
    assert {r["rounds"] for r in fedbuff} == {4 * 10 // 10}  # versions, K = 10
    # stragglers shorten the synchronous runs' local work
    sync = [r for r in table if r["mode"] == "sync"]
    mild = [r["tau_mean"] for r in sync if r["fleet.stragglers.p"] == 0.0]
    harsh = [r["tau_mean"] for r in sync if r["fleet.stragglers.p"] == 0.5]
    assert sum(harsh) < sum(mild)

    text = (report / "stress.md").read_text()
    assert "degrades least" in text
    assert "| fleet.stragglers.p | algorithm | final acc % |" in text
    assert "fedbuff (async)" in text
    assert (report / "taus.parquet").stat().st_size > 1000
    assert_figure(report / "degradation.png", (6.5, 4.2))
    for name in ("accuracy_vs_time.png", "tau_by_group.png"):
        assert_figure(report / name)
    assert len(list((report / "runs").glob("*.parquet"))) == 12
    # each arm against fedavg (the first), cell by cell, recomputed from the runs
    paired = pq.read_table(report / "paired.parquet").to_pylist()
    acc = {(r["cell"], r["algorithm"], r["seed"]): r["final_accuracy"] for r in table}
    rows = [r for r in paired if r["metric"] == "final_accuracy"]
    assert [(r["cell"], r["algorithm"]) for r in rows] == [
        (c, a) for c in (0, 1) for a in ("fednova", "fedbuff")
    ]
    for r in rows:
        d = [
            acc[r["cell"], r["algorithm"], s] - acc[r["cell"], "fedavg", s]
            for s in (0, 1)
        ]
        half = 12.706204736174696 * abs(d[0] - d[1]) / 2  # t_{0.975, 1} sd / sqrt 2
        assert r["mean"] == pytest.approx(sum(d) / 2, abs=1e-15)
        assert r["hi"] - r["lo"] == pytest.approx(2 * half, rel=1e-9)
        assert r["fleet.stragglers.p"] in (0.0, 0.5) and r["baseline"] == "fedavg"
    assert "## Paired against fedavg, cell by cell" in text
    assert_figure(report / "paired.png")


def test_stress_is_deterministic(report: Path, tmp_path: Path):
    # Execute: the harsher cell again, for one synchronous and one
    # asynchronous rule (a third of the grid: every run is its own)
    again = run_stress(
        PHONES,
        {"fleet.stragglers.p": [0.5]},
        ["fednova", "fedbuff"],
        seeds=2,
        out_dir=tmp_path / "again",
        workers=0,
        overrides=CI,
    )

    # Assert: identical rows, except how long the host took (and the
    # target, which the grid's mildest cell sets)
    skip = {"wall_time_s", "cell", "target_accuracy", "time_to_target_s"}
    skip |= {"rounds_to_target"}

    def rows(path: Path, keep: Callable[[dict], bool]) -> list[dict]:
        table = pq.read_table(path / "stress.parquet").to_pylist()
        return [{k: v for k, v in r.items() if k not in skip} for r in table if keep(r)]

    first = rows(report, lambda r: r["cell"] == 1 and r["algorithm"] != "fedavg")
    assert len(first) == 4 and rows(again, lambda r: True) == first


@pytest.mark.ray
@pytest.mark.slow
def test_ray_tasks_give_the_same_table(report: Path, tmp_path: Path, ray_session):
    # Execute: each run a Ray task (num_cpus=1)
    out = run_ci_grid(tmp_path / "ray", workers=None)

    # Assert
    a = pq.read_table(report / "stress.parquet").drop(["wall_time_s"])
    b = pq.read_table(out / "stress.parquet").drop(["wall_time_s"])
    assert a.equals(b)


def fedavg_once(sweep: dict, out: Path, overrides: list[str]) -> Path:
    """One seed of FedAvg over ``sweep``, in this process."""
    return run_stress(
        PHONES, sweep, ["fedavg"], seeds=1, out_dir=out, workers=0, overrides=overrides
    )


def test_every_combination_is_validated_before_anything_runs(tmp_path: Path):
    with pytest.raises(ScenarioError, match="fleet.stragglers.p"):
        fedavg_once({"fleet.stragglers.p": [0.1, 1.5]}, tmp_path / "x", CI)
    with pytest.raises(ScenarioError, match="algorithm"):
        fedavg_once(
            {"fleet.stragglers.p": [0.1]}, tmp_path / "x", ["algorithm={name: x}"]
        )
    assert not (tmp_path / "x").exists()


def test_a_swept_field_named_like_a_result_column_keeps_both(tmp_path: Path):
    # Prepare: sweep `rounds`, which is also the column of rounds actually run
    out = fedavg_once({"rounds": [1, 2]}, tmp_path / "r", ["eval.every_rounds=1"])
    # Execute
    table = pq.read_table(out / "stress.parquet").to_pylist()
    # Assert: the swept value has its own column; `rounds` is what ran
    assert [(r["sweep.rounds"], r["rounds"]) for r in table] == [(1.0, 1), (2.0, 2)]


def test_parse_sweep():
    assert parse_sweep("fleet.stragglers.p=0,0.1,0.3,0.5") == (
        "fleet.stragglers.p",
        [0, 0.1, 0.3, 0.5],
    )
    assert parse_sweep("round.policy=fixed_window, fixed_epochs") == (
        "round.policy",
        ["fixed_window", "fixed_epochs"],
    )
    path, values = parse_sweep(
        "fleet.stragglers.slowdown={dist: fixed, factor: 2},{dist: pareto, shape: 1.5}"
    )
    assert values == [{"dist": "fixed", "factor": 2}, {"dist": "pareto", "shape": 1.5}]
    with pytest.raises(ScenarioError, match="PATH=v1"):
        parse_sweep("fleet.stragglers.p")


def test_degradation_hand_computed():
    # Prepare: two algorithms, two values, two seeds
    cells = [{"p": 0.0}, {"p": 0.5}]
    acc = {
        ("a", 0, 0): 0.8,
        ("a", 0, 1): 0.7,
        ("a", 1, 0): 0.6,
        ("a", 1, 1): 0.6,
        ("b", 0, 0): 0.5,
        ("b", 0, 1): 0.5,
        ("b", 1, 0): 0.45,
        ("b", 1, 1): 0.5,
    }
    records = [
        {"algorithm": a, "cell": c, "seed": s, "final_accuracy": v}
        for (a, c, s), v in acc.items()
    ]

    # Execute
    deg = degradation(records, cells, "p")

    # Assert: b drops (0.05 + 0.0) / 2, a (0.2 + 0.1) / 2; b first
    assert [d["algorithm"] for d in deg] == ["b", "a"]
    assert deg[0]["drop"] == pytest.approx(0.025)
    assert deg[1]["drop"] == pytest.approx(0.15)
    assert deg[1]["accuracy"] == pytest.approx([0.75, 0.6])
    assert deg[1]["drop_sd"] == pytest.approx(math.sqrt(0.005))


def test_docstring_examples_run():
    import doctest

    import fedsim.tools.stress

    assert doctest.testmod(fedsim.tools.stress).failed == 0


def test_the_headline_never_crowns_an_algorithm_at_chance():
    from fedsim.tools.stress import _verdict

    def deg(name, acc):
        return {
            "algorithm": name,
            "values": [0, 0.5],
            "accuracy": acc,
            "drop": acc[0] - acc[-1],
            "drop_sd": 0.0,
            "seeds": 3,
        }

    # Prepare: "stuck" never learns (10 classes: chance 10%) and so drops least
    stuck, learns = deg("stuck", [0.11, 0.11]), deg("learns", [0.8, 0.6])

    # Execute / Assert: the one that learns leads, whatever the order
    assert "**learns degrades least**" in _verdict([stuck, learns], "p", chance=0.1)
    nobody = _verdict([stuck], "p", chance=0.1)
    assert "No algorithm learned clearly beyond chance (10%)" in nobody
    # without a chance level (a regression task) the order decides, as before
    assert "**stuck degrades least**" in _verdict([stuck, learns], "p")


@pytest.mark.ray
@pytest.mark.slow
def test_a_plugin_failing_in_a_ray_task_exits_3_with_one_line(
    tmp_path: Path, ray_session, capsys
):
    """A plug-in's exception inside stress's Ray task reaches the command
    line as Ray's wrapper of fedsim's PluginFailure: ``fedsim stress`` exits
    3 (a run's code for it) with one line, never Ray's worker traceback."""
    import typer

    from fedsim.hooks import PluginFailure
    from fedsim.tools import cli

    # Execute: tests/hook_plugins.py's Boom raises in round 2's aggregate
    boom = "tests.hook_plugins:Boom"
    with pytest.raises(Exception) as raised:
        run_stress(
            SCENARIOS / "ci" / "tiny-synthetic.yaml",
            {"client.lr": [0.05]},
            [boom],
            seeds=1,
            out_dir=tmp_path / "s",
            workers=None,  # each run a Ray task
            overrides=["rounds=3"],
        )
    # Assert: what the task raised, and what the command line makes of it
    from ray.exceptions import RayTaskError

    assert isinstance(raised.value, RayTaskError)  # Ray's wrapper ...
    assert isinstance(getattr(raised.value, "cause", None), PluginFailure)  # of it
    with pytest.raises(typer.Exit) as done, cli._worker_errors():
        raise raised.value
    assert done.value.exit_code == 3
    err = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    text = " ".join(err)
    assert f"algorithm '{boom}' failed in aggregate" in text, err
    assert "ValueError: boom in round 2" in text and "Traceback" not in text
    assert "fix the plug-in and run the command again" in text


def test_stress_exits_3_with_one_line_when_a_plugin_fails_in_process(tmp_path):
    """A plug-in's failure is a RuntimeError too: the command's general
    RuntimeError handler (exit 1) must not see it before the plug-in's (3)."""
    p = fedsim_here(
        *("stress", str(SCENARIOS / "ci" / "tiny-synthetic.yaml"), "--workers", "0"),
        *("-a", "tests.hook_plugins:Boom", "--sweep", "client.lr=0.05"),
        *("--seeds", "1", "--set", "rounds=3", "--quiet", "--out", str(tmp_path / "s")),
    )
    assert p.returncode == 3, p.stderr
    lines = [x for x in p.stderr.splitlines() if x.strip()]
    assert lines[-1].startswith("error: algorithm 'tests.hook_plugins:Boom'"), lines
    assert "Traceback (most" not in p.stderr


def test_the_default_target_is_chosen_on_held_out_rows_not_the_test_set():
    from fedsim.tools.stress import _default_target

    # Prepare: the mildest cell's runs; test-set bests far above the held-out
    rows = [
        {"cell": c, "algorithm": a, "best_accuracy": 0.99, "best_fed_accuracy": f}
        for c, a, f in [
            (0, "fedavg", 0.60),
            (0, "fedavg", 0.64),
            (0, "fednova", 0.70),
            (0, "fednova", 0.72),
            (1, "fednova", 0.95),  # a harsher cell does not set the bar
        ]
    ]
    # Execute / Assert: 90% of fednova's mean 0.71, rounded down to 0.5 points
    assert _default_target(rows) == 0.635
    no_held_out = [{**r, "best_fed_accuracy": math.nan} for r in rows]
    assert _default_target(no_held_out) is None


def test_a_sweep_without_target_uses_the_default_one_on_held_out_rows(tmp_path):
    """No --target: the sweep measures times to the default target, chosen
    on the clients' held-out rows of its mildest cell, and says so."""
    from fedsim.tools.stress import _default_target

    # Execute: held-out rows on the clients, evaluated every round
    out = run_stress(
        SCENARIOS / "ci" / "tiny-synthetic.yaml",
        {"client.lr": [0.05]},
        ["fedavg"],
        seeds=1,
        out_dir=tmp_path / "s",
        workers=0,
        overrides=["rounds=3", "data.client_test_fraction=0.3"]
        + ["eval.federated_every=1"],
    )

    # Assert: every row measured against that target, and stress.md names it
    table = pq.read_table(out / "stress.parquet").to_pylist()
    target = _default_target(table)
    assert target is not None and 0 < target < 1
    assert [r["target_accuracy"] for r in table] == [target]
    text = (out / "stress.md").read_text()
    assert f"target accuracy: {target * 100:g}% (90% of the best algorithm" in text


@pytest.mark.slow
def test_stress_until_decided_adds_seeds_in_batches(tmp_path: Path):
    # Execute: two seeds cannot decide anything, so the batch of 1 seed is
    # followed by a second, and the sweep stops at --max-seeds 2
    out = run_stress(
        SCENARIOS / "ci" / "tiny-synthetic.yaml",
        {"client.lr": [0.05]},
        ["fedavg", "fedprox:mu=1"],
        seeds=1,
        out_dir=tmp_path / "s",
        workers=0,
        overrides=["rounds=2"],
        max_seeds=2,
    )
    # Assert: both seeds of both arms, the tables of them all, and the note
    table = pq.read_table(out / "stress.parquet").to_pylist()
    assert sorted((r["algorithm"], r["seed"]) for r in table) == [
        ("fedavg", 0),
        ("fedavg", 1),
        ("fedprox:mu=1", 0),
        ("fedprox:mu=1", 1),
    ]
    paired = pq.read_table(out / "paired.parquet").to_pylist()
    assert [r["seeds"] for r in paired if r["metric"] == "final_accuracy"] == [2]
    text = (out / "stress.md").read_text()
    assert "anytime-valid confidence sequence" in text and "seeds: 0..1" in text
