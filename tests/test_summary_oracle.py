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
from typer.testing import CliRunner

from fedsim.cli import app
from fedsim.results import summarize

from .conftest import SCENARIOS

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
