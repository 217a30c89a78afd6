"""Paired comparisons in compare and stress: each arm against a baseline,
seed by seed, with a Student t interval and a verdict (fedsim.tools.stats)."""

from __future__ import annotations

import math

import pyarrow.parquet as pq
import pytest

from fedsim.scenario import ScenarioError
from fedsim.tools.compare import paired_table, resolve_baseline
from fedsim.tools.stats import paired_interval

from .conftest import SCENARIOS, assert_figure, fedsim_here

T2_975 = 4.302652729749462  # t_{0.975, 2}: (2p - 1) / sqrt(2 p (1 - p))


def runs() -> list[dict]:
    """Two arms, three seeds; seed 2 of the arm never reaches the target."""
    rows = []
    base = {"final_accuracy": [0.5, 0.6, 0.7], "time_to_target_s": [30.0, 40.0, 50.0]}
    arm = {"final_accuracy": [0.6, 0.65, 0.8], "time_to_target_s": [20.0, 36.0, None]}
    for name, values in (("fedavg", base), ("fednova", arm)):
        for seed in range(3):
            rows.append(
                {
                    "algorithm": name,
                    "seed": seed,
                    "final_accuracy": values["final_accuracy"][seed],
                    "time_to_target_s": values["time_to_target_s"][seed],
                    "final_objective": math.nan,  # not recorded: no row
                }
            )
    return rows


def test_paired_table_by_hand():
    # Execute
    table = paired_table(runs(), "fedavg")

    # Assert: one row per metric with values; the objective has none
    by_metric = {r["metric"]: r for r in table}
    assert sorted(by_metric) == ["final_accuracy", "time_to_target_s"]
    acc = by_metric["final_accuracy"]
    # differences 0.1, 0.05, 0.1: mean 0.25 / 3, sd sqrt((2 (1/60)^2 + (1/30)^2) / 2)
    mean, sd = 0.25 / 3, math.sqrt((2 * (1 / 60) ** 2 + (1 / 30) ** 2) / 2)
    half = T2_975 * sd / math.sqrt(3)
    assert (acc["seeds"], acc["baseline"], acc["algorithm"]) == (3, "fedavg", "fednova")
    assert acc["mean"] == pytest.approx(mean, rel=1e-12)
    assert acc["sd"] == pytest.approx(sd, rel=1e-12)
    assert (acc["lo"], acc["hi"]) == (
        pytest.approx(mean - half),
        pytest.approx(mean + half),
    )
    assert acc["verdict"] == "better" and acc["higher_is_better"]
    # time: seed 2 unreached, so two pairs: -10 and -4, lower is better
    t = by_metric["time_to_target_s"]
    assert (t["seeds"], t["mean"], t["higher_is_better"]) == (2, -7.0, False)
    half = math.tan(math.pi * 0.475) * 3 * math.sqrt(2) / math.sqrt(2)  # df 1
    assert t["hi"] == pytest.approx(-7.0 + half) and t["verdict"] == "no difference"


def test_a_baseline_not_among_the_arms_is_refused():
    assert resolve_baseline("fednova", ["fedavg", "fednova"]) == "fednova"
    with pytest.raises(ScenarioError, match=r"--baseline 'scaffold'.*fedavg, fednova"):
        resolve_baseline("scaffold", ["fedavg", "fednova"])


@pytest.mark.parametrize("command", ["compare", "stress"])
def test_the_cli_refuses_a_foreign_baseline_before_running(command, tmp_path):
    # Execute
    args = [command, str(SCENARIOS / "quickstart.yaml"), "-a", "fedavg,fednova"]
    if command == "stress":
        args += ["--sweep", "fleet.groups[0].stragglers.p=0,0.5", "--workers", "0"]
    res = fedsim_here(*args, "--baseline", "fedprox", "--out", str(tmp_path / "o"))

    # Assert: exit 2, the option named, nothing run
    assert res.returncode == 2, res.stdout + res.stderr
    assert "--baseline 'fedprox' is not among" in res.stderr
    assert not list((tmp_path / "o").glob("*.parquet"))


def test_compare_on_quickstart_prints_and_stores_the_paired_intervals(tmp_path):
    # Execute: fedavg against fednova (the baseline given), three seeds
    out = tmp_path / "cmp"
    res = fedsim_here(
        "compare", str(SCENARIOS / "quickstart.yaml"), "-a", "fedavg,fednova",
        "--seeds", "3", "--baseline", "fednova", "--set", "rounds=2",
        "--set", "eval.every_rounds=2", "--target", "0.3", "--out", str(out), "-q",
        check=True,
    )  # fmt: skip

    # Assert: printed
    assert "## Paired against fednova" in res.stdout
    assert "| fedavg | final accuracy (points) | 3 |" in res.stdout
    # stored: the interval recomputed from the runs' own table
    runs = pq.read_table(out / "compare.parquet").to_pylist()
    acc = {(r["algorithm"], r["seed"]): r["final_accuracy"] for r in runs}
    diffs = [acc["fedavg", s] - acc["fednova", s] for s in range(3)]
    want = paired_interval(diffs)
    paired = pq.read_table(out / "paired.parquet").to_pylist()
    row = next(r for r in paired if r["metric"] == "final_accuracy")
    assert (row["algorithm"], row["baseline"], row["seeds"]) == ("fedavg", "fednova", 3)
    assert (row["mean"], row["lo"], row["hi"]) == (want.mean, want.lo, want.hi)
    assert row["verdict"] == want.verdict
    assert any(d != 0 for d in diffs)  # the arms did differ
    assert_figure(out / "paired.png")


def test_compare_carries_federated_evaluation_s_final_accuracy():
    from fedsim.tools.compare import format_markdown, run_one, summarize_runs

    # Prepare: the tiny scenario with federated evaluation every 2 rounds
    # (rounds 1 and 3 of 4, the last one always)
    tiny = SCENARIOS / "ci" / "tiny-synthetic.yaml"
    fed = ["rounds=4", "data.client_test_fraction=0.25", "eval.federated_every=2"]
    # Execute: two arms, two seeds; and one run without federated evaluation
    runs, last = [], {}
    for label in ("fedavg", "fedprox"):
        for seed in (0, 1):
            row, rounds = run_one(tiny, label, seed, fed)
            runs.append(row)
            evaluated = [r for r in rounds if r.get("fed_accuracy") is not None]
            last[label, seed] = evaluated[-1]["fed_accuracy"]
            assert [r["round"] for r in evaluated] == [1, 3]
    plain, _ = run_one(tiny, "fedavg", 0, fed[:2])
    # Assert: each run's row holds its last federated accuracy
    for r in runs:
        assert r["final_fed_accuracy"] == last[r["algorithm"], r["seed"]]
    assert math.isnan(plain["final_fed_accuracy"])
    # the table shows it beside the central accuracy, only when present
    table = summarize_runs(runs)
    text = format_markdown(table, "t")
    mean = (last["fedavg", 0] + last["fedavg", 1]) / 2
    assert "| best acc % | final fed acc % | final test loss |" in text
    assert f"| {mean * 100:.2f} ± " in text.split("| fedavg |")[1].split("\n")[0]
    assert "final fed acc" not in format_markdown(summarize_runs([plain]), "t")
    # and the paired table compares the arms on it
    paired = paired_table(runs, "fedavg")
    row = next(r for r in paired if r["metric"] == "final_fed_accuracy")
    diffs = [last["fedprox", s] - last["fedavg", s] for s in (0, 1)]
    assert row["seeds"] == 2 and row["mean"] == pytest.approx(sum(diffs) / 2)
