"""Paired comparisons in compare and stress: each arm against a baseline,
seed by seed, with a Student t interval and a verdict (fedsim.tools.stats)."""

from __future__ import annotations

import math

import pyarrow.parquet as pq
import pytest

from fedsim.scenario import ScenarioError
from fedsim.tools.compare import (
    PAIRED_METRICS,
    format_markdown,
    format_paired,
    paired_note,
    paired_table,
    per_round_time,
    resolve_baseline,
    summarize_runs,
    undecided,
)
from fedsim.tools.stats import paired_interval

from .conftest import SCENARIOS, assert_figure, fedsim_here

T2_975 = 4.302652729749462  # t_{0.975, 2}: (2p - 1) / sqrt(2 p (1 - p))


def runs() -> list[dict]:
    """Two arms, three seeds of 60 s; seed 2 of the arm never reaches the
    target."""
    rows = []
    base = {"final_accuracy": [0.5, 0.6, 0.7], "time_to_target_s": [30.0, 40.0, 50.0]}
    arm = {"final_accuracy": [0.6, 0.65, 0.8], "time_to_target_s": [20.0, 36.0, None]}
    for name, values in (("fedavg", base), ("fednova", arm)):
        for seed in range(3):
            rows.append(
                {
                    "algorithm": name,
                    "seed": seed,
                    "diverged": False,
                    "final_accuracy": values["final_accuracy"][seed],
                    "time_to_target_s": values["time_to_target_s"][seed],
                    "sim_time_s": 60.0,
                    "final_objective": math.nan,  # not recorded: no row
                }
            )
    return rows


def target_runs(arm_hits, base_hits, rounds=20, **extra):
    """Rows of fednova and fedavg with rounds to target per seed (None: a
    miss) in runs of ``rounds`` rounds of 10 s."""
    rows = []
    for name, hits in (("fednova", arm_hits), ("fedavg", base_hits)):
        for seed, hit in enumerate(hits):
            rows.append(
                {
                    "algorithm": name,
                    "seed": seed,
                    "diverged": False,
                    "rounds": rounds,
                    "rounds_to_target": hit,
                    "time_to_target_s": None if hit is None else 10.0 * hit,
                    "sim_time_s": 10.0 * rounds,
                    "final_accuracy": 0.5 + seed / 100,
                    **extra,
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
    # the interval excludes 0, but three seeds cannot pass the sign-flip test
    assert acc["lo"] > 0 and acc["higher_is_better"]
    assert acc["verdict"] == "inconclusive"
    # time: seed 2 missed by the arm, censored at its 60 s: -10, -4, +10
    t = by_metric["time_to_target_s"]
    assert (t["seeds"], t["mean"], t["higher_is_better"]) == (3, -4 / 3, False)
    assert t["reached"] == "arm 2/3, baseline 3/3"
    assert t["verdict"] == "no difference"


def test_a_seed_where_one_arm_missed_counts_for_the_one_that_reached():
    # Prepare: as quickstart's fedavg and fednova at 0.72 in 20 rounds: on
    # seed 1 fednova reaches at round 16 and fedavg never; seed 4 both miss
    rows = target_runs([12, 16, 9, 11, None], [13, None, 10, 12, None])

    # Execute
    by_metric = {r["metric"]: r for r in paired_table(rows, "fedavg")}

    # Assert: five pairs; seed 1 is fedavg censored at 21 rounds (-5),
    # seed 4 a tie; the rest as they are
    r = by_metric["rounds_to_target"]
    assert r["seeds"] == 5 and r["mean"] == pytest.approx((-1 - 5 - 1 - 1 + 0) / 5)
    assert r["reached"] == "arm 4/5, baseline 3/5"
    # time: censored at 200 s, so seed 1 is 160 - 200
    t = by_metric["time_to_target_s"]
    assert t["mean"] == pytest.approx((-10 - 40 - 10 - 10 + 0) / 5)
    # a miss whose run ended before the other reached is a tie, never a win
    short = target_runs([15], [None], rounds=10)
    short[0]["rounds"] = 20
    short[0]["sim_time_s"] = 200.0
    assert paired_values_of(short, "time_to_target_s") == [0.0]
    assert paired_values_of(short, "rounds_to_target") == [15 - 15]
    short = target_runs([None], [15], rounds=10)  # the same, arms swapped
    short[1].update(rounds=20, sim_time_s=200.0)
    assert paired_values_of(short, "time_to_target_s") == [0.0]


def paired_values_of(rows, key):
    from fedsim.tools.compare import PAIRED_METRICS, paired_values

    metric = next(m for m in PAIRED_METRICS if m.key == key)
    arm = [r for r in rows if r["algorithm"] == "fednova"]
    base = [r for r in rows if r["algorithm"] == "fedavg"]
    return paired_values(arm, base, metric)[0]


def test_a_pair_with_a_diverged_run_is_left_out_and_counted():
    # Prepare: the baseline diverged on both seeds, its final accuracy 0.1
    rows = target_runs([5, 6], [None, None])
    for r in rows:
        r["diverged"] = r["algorithm"] == "fedavg"
        r["final_accuracy"] = 0.1 if r["diverged"] else 0.19

    # Execute
    table = paired_table(rows, "fedavg")

    # Assert: no accuracy pair (not "+9 points, no difference"), two left out;
    # the targets count the diverged runs as misses
    acc = next(r for r in table if r["metric"] == "final_accuracy")
    assert (acc["seeds"], acc["left_out"], acc["verdict"]) == (0, 2, "n/a")
    # a metric no run recorded (the objective) has no pair and no row
    assert "final_objective" not in {r["metric"] for r in table}
    assert "0 (2 left out: diverged)" in "\n".join(format_paired(table))
    rounds = next(r for r in table if r["metric"] == "rounds_to_target")
    assert rounds["mean"] == pytest.approx(((5 - 21) + (6 - 21)) / 2)


def test_time_to_target_under_fixed_window_is_paired_once():
    # Prepare: time = rounds x 10 s exactly, as fixed_window makes it
    rows = target_runs([4, 5, 6], [5, 5, 7], policy="fixed_window", window_s=10.0)
    # Execute
    metrics = [r["metric"] for r in paired_table(rows, "fedavg")]
    # Assert: rounds only, and the note says why
    assert "rounds_to_target" in metrics and "time_to_target_s" not in metrics
    assert per_round_time(rows) == 10.0
    assert "rounds x 10 s exactly" in paired_note("fedavg", per_round_time(rows))
    other = target_runs([4, 5, 6], [5, 5, 7], policy="fixed_epochs", window_s=10.0)
    assert per_round_time(other) is None
    assert "time_to_target_s" in [r["metric"] for r in paired_table(other, "fedavg")]


def test_every_target_column_says_reached_in_k_of_n():
    rows = target_runs([12, 16, None], [13, None, None])
    for r in rows:
        r.update(bytes_up=1000, bytes_down=1000, bytes_up_to_target=None)
        r.update(
            {k: 0.5 for k in "best_accuracy final_test_loss final_train_loss".split()}
        )
        r.update(mean_chi2_pw=math.nan)
        if r["rounds_to_target"] is not None:
            r["bytes_up_to_target"] = 50 * r["rounds_to_target"]
    text = format_markdown(summarize_runs(rows, 0.72), "t")
    nova = text.split("| fednova |")[1].split("\n")[0]
    # censored: (12 + 16 + 21) / 3 rounds, a lower bound as one seed missed
    assert ">= 16.3 ± " in nova and nova.count("(reached in 2/3)") == 3
    avg = text.split("| fedavg |")[1].split("\n")[0]
    assert avg.count("(reached in 1/3)") == 3


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
    # and no best of the test set: a best is taken on held-out rows only
    assert (
        "| final acc % | final fed acc % | best fed acc % | final test loss |" in text
    )
    best = max(
        r["fed_accuracy"] for r in rounds if r.get("fed_accuracy") is not None
    )  # the last run of the loop: fedprox, seed 1
    assert runs[-1]["best_fed_accuracy"] == best
    assert f"| {mean * 100:.2f} ± " in text.split("| fedavg |")[1].split("\n")[0]
    assert "final fed acc" not in format_markdown(summarize_runs([plain]), "t")
    # and the paired table compares the arms on it
    paired = paired_table(runs, "fedavg")
    row = next(r for r in paired if r["metric"] == "final_fed_accuracy")
    diffs = [last["fedprox", s] - last["fedavg", s] for s in (0, 1)]
    assert row["seeds"] == 2 and row["mean"] == pytest.approx(sum(diffs) / 2)


def accuracy_runs(diffs, base=0.5):
    """fedavg at ``base`` and fednova at ``base + d`` on seed i, for each d."""
    rows = []
    for seed, d in enumerate(diffs):
        for name, acc in (("fedavg", base), ("fednova", base + d)):
            rows.append(
                {"algorithm": name, "seed": seed, "diverged": False}
                | {"final_accuracy": acc + seed / 1000, "rounds_to_target": None}
            )
    return rows


def test_undecided_names_the_arms_the_confidence_sequence_has_not_decided():
    steady = [0.05, 0.06, 0.055, 0.05, 0.058, 0.052]
    # six steady seeds: the t interval would decide at 3, the sequence at 6
    assert undecided(accuracy_runs(steady[:3]), "fedavg", False) == ["fednova"]
    assert undecided(accuracy_runs(steady), "fedavg", False) == []
    assert undecided(accuracy_runs([0.0] * 3), "fedavg", False) == []  # identical
    noisy = [0.05, -0.04, 0.03, -0.02, 0.01, 0.0]
    assert undecided(accuracy_runs(noisy), "fedavg", False) == ["fednova"]
    # all six above 0: the fixed-n rule decides, the sequence (valid under
    # looking after every batch) is wider and does not yet
    spread = [0.01, 0.05, 0.02, 0.06, 0.015, 0.04]
    assert paired_interval(spread).verdict == "better"
    assert undecided(accuracy_runs(spread), "fedavg", False) == ["fednova"]
    # with a target, rounds to target must be decided too (no run reached)
    assert undecided(accuracy_runs(steady), "fedavg", True) == ["fednova"]


@pytest.mark.slow
def test_until_decided_on_quickstart_stops_before_the_most_seeds(tmp_path):
    """fedavg against fedprox held at its start by mu = 10: clearly apart,
    decided by the confidence sequence before 12 seeds, in batches of 3."""
    from fedsim.tools.compare import compare

    # Execute
    table = compare(
        SCENARIOS / "quickstart.yaml",
        ["fedavg", "fedprox:mu=10"],
        seeds=3,
        overrides=["rounds=3"],
        out_dir=tmp_path / "ud",
        max_seeds=12,
    )

    # Assert: a whole number of batches, fewer than 12, decided
    n = table[0]["seeds"]
    assert n in (6, 9) and table[1]["seeds"] == n
    paired = pq.read_table(tmp_path / "ud" / "paired.parquet").to_pylist()
    assert [(r["metric"], r["verdict"]) for r in paired] == [
        ("final_accuracy", "worse")
    ]
    text = (tmp_path / "ud" / "compare.md").read_text()
    assert "anytime-valid confidence sequence" in text


def test_undecided_looks_at_every_cell():
    # decided in cell 0, not in cell 1: the arm is still undecided
    steady = [0.05, 0.06, 0.055, 0.05, 0.058, 0.052]
    noisy = [0.05, -0.04, 0.03, -0.02, 0.01, 0.0]
    rows = [
        {**r, "cell": c} for c, d in ((0, steady), (1, noisy)) for r in accuracy_runs(d)
    ]
    assert undecided(rows, "fedavg", False, ("cell",)) == ["fednova"]
    both = [{**r, "cell": c} for c in (0, 1) for r in accuracy_runs(steady)]
    assert undecided(both, "fedavg", False, ("cell",)) == []


@pytest.mark.parametrize("command", ["compare", "stress"])
def test_max_seeds_below_seeds_is_refused_before_running(command, tmp_path):
    args = [command, str(SCENARIOS / "quickstart.yaml"), "-a", "fedavg,fednova"]
    if command == "stress":
        args += ["--sweep", "fleet.groups[0].stragglers.p=0,0.5"]
    res = fedsim_here(
        *args,
        *("--seeds", "4", "--until-decided", "--max-seeds", "3"),
        *("--out", str(tmp_path / "o")),
    )
    assert res.returncode == 2, res.stdout + res.stderr
    assert "--max-seeds 3: expected at least --seeds (4)" in res.stderr
    assert not list((tmp_path / "o").glob("*.parquet"))


@pytest.mark.parametrize("command", ["compare", "stress"])
def test_max_seeds_equal_to_seeds_is_one_batch_not_a_refusal(command, tmp_path):
    """--max-seeds equal to --seeds is taken (one batch): the command goes
    on to its next check, here an algorithm that does not exist."""
    args = [command, str(SCENARIOS / "quickstart.yaml"), "-a", "fedavg,nosuch"]
    if command == "stress":
        args += ["--sweep", "fleet.groups[0].stragglers.p=0,0.5"]
    res = fedsim_here(
        *args,
        *("--seeds", "3", "--until-decided", "--max-seeds", "3", "--workers", "0"),
        *("--out", str(tmp_path / "o")),
    )
    assert res.returncode == 2, res.stdout + res.stderr
    assert "--max-seeds" not in res.stderr and "'nosuch'" in res.stderr, res.stderr


@pytest.mark.slow
def test_compare_until_decided_from_the_command_line(tmp_path):
    # Execute: one seed a batch, at most two: two seeds never decide
    out = tmp_path / "c"
    res = fedsim_here(
        *("compare", str(SCENARIOS / "ci" / "tiny-synthetic.yaml")),
        *("-a", "fedavg,fedprox:mu=1", "--seeds", "1", "--set", "rounds=2"),
        *("--until-decided", "--max-seeds", "2", "--out", str(out), "-q"),
    )
    # Assert: both batches ran, and the table says which interval it used
    assert res.returncode == 0, res.stderr
    runs = pq.read_table(out / "compare.parquet").to_pylist()
    assert sorted((r["algorithm"], r["seed"]) for r in runs) == [
        ("fedavg", 0),
        ("fedavg", 1),
        ("fedprox:mu=1", 0),
        ("fedprox:mu=1", 1),
    ]
    assert "anytime-valid confidence sequence" in res.stdout


@pytest.mark.parametrize("x_key", [None, "cell"])
def test_paired_figure_draws_an_interval_without_finite_ends(x_key, tmp_path):
    """The confidence sequence of seeds until decided has no finite ends at
    a few seeds ("no difference", from -inf to inf): paired.png draws its
    mean as a point, in compare's layout and in stress's, instead of failing
    on the dashed bar it does not have."""
    from fedsim.tools.plots import plot_paired
    from fedsim.tools.stats import confidence_sequence

    # Prepare: one arm undecided at 2 seeds, one decided-looking finite row
    open_ended = confidence_sequence([0.1, -0.05])
    assert (open_ended.lo, open_ended.hi) == (-math.inf, math.inf)
    assert open_ended.verdict == "no difference"
    rows = [
        {
            "cell": 0,
            "baseline": "fedavg",
            "algorithm": arm,
            "metric": "final_accuracy",
            "mean": iv.mean,
            "lo": iv.lo,
            "hi": iv.hi,
            "verdict": iv.verdict,
        }
        for arm, iv in (
            ("fednova", open_ended),
            ("fedprox", paired_interval([0.01, -0.02, 0.015])),
        )
    ]

    # Execute
    path = plot_paired(rows, PAIRED_METRICS, tmp_path / "paired.png", x_key)

    # Assert: a figure with its points drawn
    assert_figure(path, min_colored=20)
