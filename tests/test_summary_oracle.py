"""summary.json against an independent oracle.

Two parts:

* :func:`fedsim.results.summarize` on hand-made rows whose answers are worked
  out by hand (ties, rounds without evaluation, drops, metrics of exactly 0.0);
* real runs made by the ``fedsim`` command line (one synchronous, one
  asynchronous), where every summary.json field is recomputed here from
  rounds.parquet and clients.parquet with code that shares nothing with
  ``summarize``, and report.md's key-figure table is checked against
  summary.json.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import yaml

from fedsim.results import summarize
from fedsim.scenario import load_scenario

from .conftest import cli_run

NAN = float("nan")


def round_row(r: int, acc: float, loss: float, **kw: Any) -> dict[str, Any]:
    row = {
        "round": r,
        "sim_time": 10.0 * (r + 1),
        "test_accuracy": acc,
        "test_loss": loss,
        "n_completed": 2,
        "n_dropped": 0,
    }
    row.update(kw)
    return row


def summary_of(rows: list[dict[str, Any]], clients=()) -> dict[str, Any]:
    return summarize(
        rows,
        list(clients),
        scenario_name="hand",
        wall_time_s=1.5,
        workers=0,
        version="test",
    )


# ---------------------------------------------------------------- hand-made rows


def test_a_zero_metric_is_a_value_not_a_missing_one():
    # Prepare: the last evaluation is exactly 0.0 accuracy and 0.0 loss (a
    # model that collapsed to one wrong class; a loss that reached its floor).
    rows = [round_row(0, 0.5, 0.7), round_row(1, 0.0, 0.0)]

    # Execute
    s = summary_of(rows)

    # Assert: the final values are the 0.0 of round 1, not round 0's stale ones
    assert s["final_test_accuracy"] == 0.0
    assert s["final_test_loss"] == 0.0
    assert s["best_test_loss"] == 0.0
    assert s["best_test_accuracy"] == 0.5
    assert s["best_round"] == 0


def test_all_zero_accuracy_still_has_a_best_round():
    rows = [round_row(0, 0.0, 2.0), round_row(1, 0.0, 1.0)]

    s = summary_of(rows)

    # a tie: the latest round of the best accuracy
    assert (s["best_test_accuracy"], s["best_round"]) == (0.0, 1)
    assert s["final_test_accuracy"] == 0.0


def test_tie_goes_to_the_latest_round_and_unevaluated_rounds_are_skipped():
    # Prepare: eval every 2 rounds (NaN and None in between), a tie at 0.8 in
    # rounds 1 and 3, and round 5 (the last) not evaluated.
    rows = [
        round_row(0, NAN, NAN),
        round_row(1, 0.8, 0.4),
        round_row(2, None, None),
        round_row(3, 0.8, 0.5),
        round_row(4, NAN, NAN),
        round_row(5, 0.6, 0.3, n_completed=1, n_dropped=1),
        round_row(6, NAN, NAN, sim_time=99.0),
    ]

    s = summary_of(rows)

    assert s["best_test_accuracy"] == 0.8
    assert s["best_round"] == 3
    # final = the last round that was evaluated (round 5), not NaN
    assert s["final_test_accuracy"] == 0.6
    assert s["final_test_loss"] == 0.3
    assert s["best_test_loss"] == 0.3
    assert s["rounds"] == 7
    assert s["sim_time_s"] == 99.0
    assert s["updates_completed"] == 2 * 6 + 1
    assert s["updates_dropped"] == 1


def test_no_evaluation_at_all_and_infinite_values_give_none():
    rows = [round_row(0, NAN, math.inf), round_row(1, None, -math.inf)]

    s = summary_of(rows)

    for key in (
        "final_test_accuracy",
        "best_test_accuracy",
        "best_round",
        "final_test_loss",
        "best_test_loss",
    ):
        assert s[key] is None, key


def test_empty_run():
    s = summary_of([])

    assert s["rounds"] == 0
    assert s["sim_time_s"] == 0.0
    assert s["best_round"] is None
    assert s["updates_completed"] == s["updates_dropped"] == 0
    assert s["bytes_down"] == s["bytes_up"] == 0


def test_traffic_counts_every_client_row_including_dropped_ones():
    clients = [
        {"bytes_down": 100, "bytes_up": 40, "dropped": False},
        {"bytes_down": 100, "bytes_up": 0, "dropped": True},
        {"bytes_down": 7, "bytes_up": 3, "dropped": False},
    ]

    s = summary_of([round_row(0, 0.1, 1.0)], clients)

    assert (s["bytes_down"], s["bytes_up"]) == (207, 43)
    assert s["scenario"] == "hand"
    assert s["wall_time_s"] == 1.5
    assert s["workers"] == 0
    assert s["fedsim_version"] == "test"
    assert s["server_validation"] is None  # not given: no server-side choice


def test_server_validation_is_passed_through():
    s = summarize(
        [],
        [],
        scenario_name="hand",
        wall_time_s=0.0,
        workers=0,
        version="test",
        server_validation="validation split (12 rows)",
    )

    assert s["server_validation"] == "validation split (12 rows)"


# ---------------------------------------------------------------- real runs

# (scenario, overrides): small enough to run in a few seconds in-process, with
# unevaluated rounds (eval every 2 or 3) and dropped updates in both.
RUNS = {
    # fixed epochs with an 8 s deadline: slow phones arrive late, are dropped
    "sync": (
        "quickstart.yaml",
        [
            "rounds=4",
            "round={policy: fixed_epochs, epochs: 1, deadline_s: 8}",
            "eval.every_rounds=2",
        ],
    ),
    # FedPNS with a validation split: CHECK LOSS scores on it
    "fedpns": (
        "quickstart.yaml",
        [
            "rounds=4",
            "round={policy: fixed_epochs, epochs: 1, deadline_s: 8}",
            "eval.every_rounds=2",
            "algorithm={name: fedpns}",
            "data.validation_fraction=0.1",
        ],
    ),
    # FedBuff with max_staleness 2: stale arrivals are dropped
    "async": (
        "async-fedbuff.yaml",
        ["rounds=8", "round.max_staleness=2", "eval.every_rounds=3"],
    ),
}


@pytest.fixture(scope="module", params=sorted(RUNS))
def run_dir(request, tmp_path_factory) -> Path:
    scenario, overrides = RUNS[request.param]
    return cli_run(tmp_path_factory.mktemp(request.param) / "run", scenario, overrides)


def finite(x: Any) -> bool:
    return x is not None and not isinstance(x, bool) and math.isfinite(x)


def server_validation(run_dir: Path) -> str | None:
    """What FedPNS's CHECK LOSS scored on: the rows each client gave up,
    floor(f n_i) but never its last one, counted on the data as the
    dataset builds it (before the split)."""
    sc = yaml.safe_load((run_dir / "scenario.yaml").read_text())
    if sc["algorithm"]["name"] != "fedpns":
        return None
    if sc["algorithm"].get("check_loss_data") == "test":
        return "test set (opt-in)"
    scenario = load_scenario(run_dir / "scenario.yaml")
    f = sc["data"]["validation_fraction"]
    counts = scenario.data.build(scenario.num_clients, scenario.seed).n_samples
    rows = sum(min(math.floor(f * int(n)), int(n) - 1) for n in counts)
    return f"validation split ({rows} rows)"


def participation_l1(run_dir: Path, rounds: list, clients: list) -> float | None:
    """The L1 distance between each client's summed applied weight per
    round that applied updates and its data share, from the Parquet files."""
    part = pq.read_table(run_dir / "partition.parquet").to_pylist()
    if not part:
        return None
    total = sum(r["weight"] for r in part)
    used = sum(r["n_completed"] > 0 for r in rounds)
    share = {r["client_id"]: 0.0 for r in part}
    for c in clients:
        if not c["dropped"]:
            share[c["client_id"]] += c["agg_weight"] / used
    return sum(abs(share[r["client_id"]] - r["weight"] / total) for r in part)


def oracle(run_dir: Path) -> dict[str, Any]:
    """Every summary.json field but wall_time_s, from the Parquet files alone."""
    rounds = sorted(
        pq.read_table(run_dir / "rounds.parquet").to_pylist(), key=lambda r: r["round"]
    )
    clients = pq.read_table(run_dir / "clients.parquet").to_pylist()
    acc = {r["round"]: r["test_accuracy"] for r in rounds if finite(r["test_accuracy"])}
    loss = {r["round"]: r["test_loss"] for r in rounds if finite(r["test_loss"])}
    best_acc = max(acc.values()) if acc else None
    scenario = (run_dir / "scenario.yaml").read_text()
    return {
        "scenario": re.search(r"^name: (\S+)$", scenario, re.M).group(1),
        "rounds": len(rounds),
        "final_test_accuracy": acc[max(acc)] if acc else None,
        "best_test_accuracy": best_acc,
        "best_round": max(r for r, a in acc.items() if a == best_acc) if acc else None,
        "final_test_loss": loss[max(loss)] if loss else None,
        "best_test_loss": min(loss.values()) if loss else None,
        "sim_time_s": rounds[-1]["sim_time"] if rounds else 0.0,
        "updates_completed": sum(not c["dropped"] for c in clients),
        "updates_dropped": sum(bool(c["dropped"]) for c in clients),
        "bytes_down": sum(c["bytes_down"] for c in clients),
        "bytes_up": sum(c["bytes_up"] for c in clients),
        "workers": 0,
        "degenerate": None,  # updates arrived; every round had k devices online
        "server_validation": server_validation(run_dir),
        # a run that made every round it was asked for completed
        "status": "completed"
        if len(rounds) == int(re.search(r"^rounds: (\d+)$", scenario, re.M).group(1))
        else "interrupted or diverged",
    }


def test_summary_equals_the_oracle(run_dir):
    # Prepare
    summary = json.loads((run_dir / "summary.json").read_text())
    rounds = pq.read_table(run_dir / "rounds.parquet").to_pylist()
    clients = pq.read_table(run_dir / "clients.parquet").to_pylist()

    # Execute
    expected = oracle(run_dir)

    # Assert: the run covers what the oracle is about
    assert any(c["dropped"] for c in clients), "want dropped updates"
    assert any(not finite(r["test_accuracy"]) for r in rounds), "want unevaluated"
    # every field, exactly (the same floats, read back from the same run)
    extra = {"wall_time_s", "fedsim_version", "initial", "participation_bias"}
    extra |= {"server"}  # where the server ran: this process (no Ray here)
    extra |= {"fleet_realised"}  # declared vs realised: tests/test_realised.py
    assert set(summary) == set(expected) | extra
    assert summary["server"]["home"] == "driver"
    l1 = participation_l1(run_dir, rounds, clients)
    assert summary["participation_bias"]["l1"] == pytest.approx(l1, abs=1e-12)
    for key, value in expected.items():
        assert summary[key] == value, key
    assert summary["wall_time_s"] > 0
    from fedsim import __version__

    assert summary["fedsim_version"] == __version__


def test_rounds_and_clients_tables_agree(run_dir):
    # The per-round counters are the client rows of that round.
    rounds = pq.read_table(run_dir / "rounds.parquet").to_pylist()
    clients = pq.read_table(run_dir / "clients.parquet").to_pylist()
    every = int(
        re.search(
            r"every_rounds: (\d+)", (run_dir / "scenario.yaml").read_text()
        ).group(1)
    )
    last = max(r["round"] for r in rounds)

    for r in rounds:
        mine = [c for c in clients if c["round"] == r["round"]]
        assert r["n_completed"] == sum(not c["dropped"] for c in mine), r["round"]
        assert r["n_dropped"] == sum(bool(c["dropped"]) for c in mine), r["round"]
        # evaluated every `every` rounds, and always after the last one
        evaluated = (r["round"] + 1) % every == 0 or r["round"] == last
        assert finite(r["test_accuracy"]) == evaluated, r["round"]
        assert finite(r["test_loss"]) == evaluated, r["round"]


def report_table(text: str) -> dict[str, str]:
    return dict(re.findall(r"^\| ([^|]+?) \| ([^|]+?) \|$", text, re.M))


def test_report_key_figures_match_the_summary(run_dir):
    summary = json.loads((run_dir / "summary.json").read_text())

    table = report_table((run_dir / "report.md").read_text())

    def close(cell: str, value: float) -> bool:
        return math.isclose(float(cell.replace(",", "")), value, rel_tol=5e-4)

    assert int(table["rounds"].replace(",", "")) == summary["rounds"]
    assert close(table["final test accuracy"], summary["final_test_accuracy"])
    best, best_round = re.fullmatch(
        r"(\S+) \((\d+)\)", table["best test accuracy (round)"]
    ).groups()
    assert close(best, summary["best_test_accuracy"])
    assert int(best_round) == summary["best_round"]
    assert close(table["final test loss"], summary["final_test_loss"])
    assert close(table["best test loss"], summary["best_test_loss"])
    sim = re.fullmatch(r"(\S+) s", table["simulated time"]).group(1)
    assert abs(float(sim.replace(",", "")) - summary["sim_time_s"]) <= 0.05
    done, drop = summary["updates_completed"], summary["updates_dropped"]
    assert int(table["updates completed"].replace(",", "")) == done
    n, pct = re.fullmatch(r"(\S+) \((\S+)%\)", table["updates dropped"]).groups()
    assert int(n) == drop
    assert abs(float(pct) - 100 * drop / (done + drop)) <= 0.05
    for cell, value in zip(
        table["traffic down / up"].split(" / "),
        (summary["bytes_down"], summary["bytes_up"]),
        strict=True,
    ):
        number, unit = cell.split()  # e.g. "97.6 KB": one decimal, SI units
        scale = {"B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9}[unit]
        assert abs(float(number) - value / scale) <= 0.05 + 1e-9, cell
    assert table["workers"] == "0"
