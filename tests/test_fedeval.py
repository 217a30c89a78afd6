"""Federated evaluation (issue 37, hook 4): the clients evaluate the global
model on their own held-out rows every K rounds, aggregated by the
algorithm's ``aggregate_evaluation``, written to rounds.parquet as
``fed_<name>`` beside the central test metrics.

What is checked: the held-out split (each client's rows, hashed from the
seed with its own tag); the scenario's refusals; that turning the evaluation
on changes no training or central test column; that the default rule is the
sample-weighted mean of real forward passes (recomputed here from the final
model); the drawn subset (``federated_clients``); a misbehaving rule fails
the run naming the plug-in and the hook, and the contract catches it; the
example FedExP's rule after a ``--resume``; and (marked ``ray``) identical
columns on 2 Ray workers, the server actor included.

The plug-in rules below are referenced by import path
(``tests.test_fedeval:Name``), so Ray workers import them too.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow.parquet as pq
import pytest

from fedsim.algorithms import FedAvg
from fedsim.api import ClientEvaluation, weighted_evaluation
from fedsim.data import build_data
from fedsim.data.heldout import heldout_clients, split_heldout
from fedsim.results import write_summary
from fedsim.runtime import FAILURE_FILE, run_scenario
from fedsim.scenario import ScenarioError, dump_scenario, load_scenario
from fedsim.testing import check_algorithm
from fedsim.tools.plots import figure_metrics
from fedsim.tools.report import write_report

from .conftest import ROOT, SCENARIOS, fedsim_here

TINY = SCENARIOS / "ci" / "tiny-synthetic.yaml"
EXAMPLE = ROOT / "examples" / "fedsim_example"
FED = ["data.client_test_fraction=0.25"]
CENTRAL = ("test_loss", "test_accuracy", "train_loss", "tau_eff", "chi2_pw")


@dataclass(frozen=True)
class Counting(FedAvg):
    """FedAvg whose evaluation rule reports what it was given: how many
    clients, whether in ascending id, and their ids' sum."""

    def aggregate_evaluation(
        self, results: Sequence[ClientEvaluation], round: int
    ) -> dict[str, float]:
        ids = [r.client for r in results]
        return {
            "n": len(ids),
            "ascending": float(ids == sorted(ids)),
            "id_sum": sum(ids),
            "rows": sum(r.n_samples for r in results),
        }


@dataclass(frozen=True)
class BadName(FedAvg):
    """A rule whose metric name cannot be a column."""

    def aggregate_evaluation(
        self, results: Sequence[ClientEvaluation], round: int
    ) -> dict[str, float]:
        return {"worst accuracy": 0.0}


@dataclass(frozen=True)
class Raises(FedAvg):
    """A rule that raises."""

    def aggregate_evaluation(
        self, results: Sequence[ClientEvaluation], round: int
    ) -> dict[str, float]:
        raise ZeroDivisionError("no clients?")


def _tiny(*overrides: str):
    return load_scenario(TINY, ["rounds=3", *overrides])


def _plugin(cls: str) -> str:
    return f"algorithm={{name: 'tests.test_fedeval:{cls}'}}"


def _cells(rows):
    """Rows as rounds.parquet holds them: without the host clock, NaN and a
    column a row lacks (a round without federated evaluation) as None."""
    keys = sorted({k for r in rows for k in r} - {"wall_time"})

    def cell(v):
        return None if isinstance(v, float) and math.isnan(v) else v

    return [{k: cell(r.get(k)) for k in keys} for r in rows]


# ---------------------------------------------------------- the split
def test_the_heldout_split_takes_each_clients_own_rows():
    # Prepare: the tiny scenario's data (6 clients of 20 to 80 rows)
    sc = _tiny()
    data = build_data(sc.data, sc.num_clients, sc.seed)
    # Execute
    held = split_heldout(data, 0.25, sc.seed)
    again = split_heldout(data, 0.25, sc.seed)
    # Assert: floor(f n_i) rows per client, taken from its own rows only
    # (training and held-out rows together are its rows again), weights
    # following the counts, the same rows for the same seed
    n = data.n_samples
    assert held.heldout_offsets is not None and held.heldout_x is not None
    k = np.diff(held.heldout_offsets)
    assert k.tolist() == [math.floor(0.25 * m + 1e-9) for m in n.tolist()]
    assert (held.n_samples + k).tolist() == n.tolist()
    assert held.weights.tolist() == held.n_samples.astype(float).tolist()
    for i in range(data.num_clients):
        own = data.x[data.client_rows(i)]
        lo, hi = held.heldout_offsets[i], held.heldout_offsets[i + 1]
        mine = np.concatenate([held.x[held.client_rows(i)], held.heldout_x[lo:hi]])
        assert sorted(map(tuple, mine.tolist())) == sorted(map(tuple, own.tolist()))
    assert np.array_equal(again.heldout_x, held.heldout_x)
    assert heldout_clients(held) == list(range(data.num_clients))
    assert heldout_clients(data) == []


# ---------------------------------------------------------- refusals
@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        (["eval.federated_every=2"], "data.client_test_fraction is 0"),
        (["eval.federated_clients=2"], "eval.federated_every is 0"),
        (
            [*FED, "eval.federated_every=1", "round={policy: async}"],
            "round.policy 'async'",
        ),
        (
            ["data={dataset: quadratic, centers: [[1.0]], client_test_fraction: 0.2}"],
            "client_test_fraction must be 0 here",
        ),
    ],
)
def test_a_federated_evaluation_that_cannot_run_is_refused_at_load(overrides, words):
    with pytest.raises(ScenarioError) as err:
        _tiny(*overrides)
    assert words in str(err.value) and "tiny-synthetic.yaml" in str(err.value)


# ------------------------------------------------- what it changes, and not
def test_turning_it_on_changes_no_training_column_and_is_the_weighted_mean():
    # Prepare: the same held-out split, with and without the evaluation;
    # every round of the evaluated run evaluates (K = 1), the last always
    off = _tiny(*FED)
    on = _tiny(*FED, "eval.federated_every=2")
    # Execute
    a, b = run_scenario(off), run_scenario(on)
    # Assert: the training and central test columns and the client rows are
    # bit for bit the same; fed_ columns only in rounds 1 and 2 (2nd, last)
    strip = [{k: v for k, v in r.items() if not k.startswith("fed_")} for r in b.rows]
    assert _cells(strip) == _cells(a.rows)
    assert _cells(b.clients) == _cells(a.clients)
    assert [("fed_loss" in r) for r in b.rows] == [False, True, True]
    assert not any(k.startswith("fed_") for r in a.rows for k in r)
    # the default rule is the sample-weighted mean of each client's forward
    # passes on its own rows, recomputed here from the final model
    assert b.final_params is not None and b.data is not None
    want = weighted_evaluation(_evaluate_here(on, b.final_params, b.data))
    last = b.rows[-1]
    assert last["fed_loss"] == pytest.approx(want["loss"], rel=1e-12)
    assert last["fed_accuracy"] == pytest.approx(want["accuracy"], rel=1e-12)
    assert 0.0 <= last["fed_accuracy"] <= 1.0
    # summary.json says so; a run without it has no such key
    held = int(b.data.heldout_offsets[-1])
    assert b.summary()["federated_evaluation"] == {
        "every": 2,
        "clients": None,
        "heldout_rows": held,
        "final": {"fed_loss": last["fed_loss"], "fed_accuracy": last["fed_accuracy"]},
    }
    assert "federated_evaluation" not in a.summary()


def _evaluate_here(sc, x, data):
    """Each client's (loss, accuracy) of parameters ``x`` on its held-out
    rows, by the model's own evaluation function, one client at a time."""
    import torch

    from fedsim.models import NetworkSetup, evaluate, make_model
    from fedsim.params import bind_flat

    model = make_model(NetworkSetup(sc.model, sc.seed, sc.data.start_value), data)
    theta, _ = bind_flat(model)
    theta.copy_(x)
    out = []
    for i in range(data.num_clients):
        lo, hi = data.heldout_offsets[i], data.heldout_offsets[i + 1]
        hx = torch.as_tensor(data.heldout_x[lo:hi]).to(theta.dtype)
        loss, acc = evaluate(model, hx, torch.as_tensor(data.heldout_y[lo:hi]))
        out.append(ClientEvaluation(i, int(hi - lo), loss, acc))
    return out


def test_federated_clients_draws_a_subset_per_round_from_its_own_stream():
    # Prepare: 3 of the 6 clients evaluate, every round
    sc = _tiny(
        *FED, _plugin("Counting"), "eval={federated_every: 1, federated_clients: 3}"
    )
    plain = _tiny(*FED, _plugin("Counting"))
    # Execute
    res, ref = run_scenario(sc), run_scenario(plain)
    # Assert: three clients each round, ascending; not always the same
    # three; training untouched by the draws
    assert [r["fed_n"] for r in res.rows] == [3.0, 3.0, 3.0]
    assert all(r["fed_ascending"] == 1.0 for r in res.rows)
    assert len({r["fed_id_sum"] for r in res.rows}) > 1
    strip = [{k: v for k, v in r.items() if not k.startswith("fed_")} for r in res.rows]
    assert _cells(strip) == _cells(ref.rows)


# ------------------------------------------------------ misuse
@pytest.mark.parametrize(
    ("cls", "error"),
    [("BadName", "metric named 'worst accuracy'"), ("Raises", "ZeroDivisionError")],
)
def test_a_rule_that_misbehaves_fails_the_run_naming_it(cls, error):
    # Prepare / Execute
    res = run_scenario(_tiny(*FED, _plugin(cls), "eval.federated_every=2"))
    # Assert: failed in round 1 (its first evaluation), round 0 kept
    assert res.status == "failed" and res.failure is not None
    assert res.failure["plugin"] == f"algorithm 'tests.test_fedeval:{cls}'"
    assert res.failure["hook"] == "aggregate_evaluation"
    assert error in res.failure["error"]
    assert len(res.rows) == 1


def test_the_command_line_exits_3_naming_the_rule_and_writes_the_failure(tmp_path):
    # Prepare / Execute: the misbehaving rule through `fedsim run`
    out = tmp_path / "run"
    p = fedsim_here(
        *("run", str(TINY), "-q", "--no-report", "--workers", "0", "--out", str(out)),
        *("--set", "rounds=3", "--set", "eval.federated_every=2"),
        *("--set", FED[0], "--set", _plugin("Raises")),
    )
    # Assert: exit 3, one line naming the plug-in and the hook; summary.json
    # says failed, the round before kept, the traceback in failure.txt
    assert p.returncode == 3, p.stderr
    err = " ".join(p.stderr.split())
    assert "algorithm 'tests.test_fedeval:Raises' failed in aggregate_evaluation" in err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "failed"
    assert summary["failure"]["hook"] == "aggregate_evaluation"
    assert pq.read_table(out / "rounds.parquet").num_rows == 1
    assert "ZeroDivisionError: no clients?" in (out / FAILURE_FILE).read_text()


def test_the_contract_checks_the_rule():
    check_algorithm(Counting())  # a rule used rightly passes
    with pytest.raises(AssertionError, match="aggregate_evaluation"):
        check_algorithm(BadName())
    with pytest.raises(ZeroDivisionError):
        check_algorithm(Raises())


# ------------------------------------------------- the example, resumed
class _Stop(Exception):
    pass


def test_the_example_rule_gives_the_same_rows_after_a_resume(tmp_path, monkeypatch):
    # Prepare: the example's FedExP with federated evaluation, whole and
    # stopped in round 3 (checkpoint after round 1: every 2 rounds)
    monkeypatch.syspath_prepend(str(EXAMPLE))
    sc = load_scenario(EXAMPLE / "fedeval.yaml", ["rounds=4"])
    whole = run_scenario(sc)

    def stop(row, clients):
        if row["round"] == 3:
            raise _Stop

    with pytest.raises(_Stop):
        run_scenario(sc, run_dir=tmp_path, on_round=stop)
    # Execute
    resumed = run_scenario(sc, run_dir=tmp_path, resume=True)
    # Assert: the same rows, federated columns included; the worst client
    # is never above the weighted mean
    assert resumed.status == "completed"
    assert _cells(resumed.rows) == _cells(whole.rows)
    fed = [r for r in whole.rows if "fed_accuracy" in r]
    assert [r["round"] for r in fed] == [1, 3]
    assert all(r["fed_worst_accuracy"] <= r["fed_accuracy"] for r in fed)
    # the report lists the final federated accuracy, and metrics.png draws
    # it beside the central test accuracy
    (tmp_path / "scenario.yaml").write_text(dump_scenario(sc))
    write_summary(tmp_path / "summary.json", resumed.summary())
    report = write_report(tmp_path).read_text()
    assert f"| final federated accuracy | {fed[-1]['fed_accuracy']:.4g} |" in report
    fig = figure_metrics(pq.read_table(tmp_path / "rounds.parquet"))
    labels = [line.get_label() for line in fig.axes[0].get_lines()]
    assert labels == ["test accuracy", "federated accuracy"]


# ---------------------------------------------------------- on Ray
@pytest.mark.ray
def test_two_ray_workers_and_the_server_actor_give_the_same_columns(ray_session):
    # Prepare: 4 of the 6 clients drawn per round, the default rule
    fed = [*FED, "eval={federated_every: 1, federated_clients: 4}"]
    home = "resources.server={home: actor, cpus: 0}"
    # Execute: the worker actors evaluate (real forward passes, the clients
    # dealt over them); with the server actor, the model comes from it
    here = run_scenario(_tiny(*fed))
    two = run_scenario(_tiny(*fed), workers=2)
    actor = run_scenario(_tiny(*fed, home), workers=2)
    # Assert: the columns of one process, bit for bit
    assert all("fed_loss" in r and "fed_accuracy" in r for r in here.rows)
    assert _cells(two.rows) == _cells(here.rows)
    assert _cells(actor.rows) == _cells(here.rows)


# explore: a restart costs a new process's torch import (about 10 s on the
# shared 2-core machine); the resend is _gather's, which
# tests/test_faults.py checks for training calls (CI runs it when its
# budget allows)
@pytest.mark.explore
@pytest.mark.ray
@pytest.mark.slow
def test_an_evaluation_call_whose_actor_died_is_resent_with_the_same_results(
    ray_session,
):
    # Prepare: the tiny run's data with held-out rows, the model x_0, an
    # in-process executor and two Ray worker actors
    import os
    import signal

    from fedsim.data.heldout import with_heldout
    from fedsim.runtime import make_executor, run_setup
    from fedsim.server import Server

    sc = _tiny(*FED, "eval.federated_every=1")
    setup = run_setup(sc)
    data = with_heldout(sc.data, build_data(sc.data, sc.num_clients, sc.seed), 0)
    x = Server(setup.server, data).params().clone()
    clients = heldout_clients(data)
    here = make_executor(setup.executor, data, 0).evaluate(x, clients, 64)
    ray_ex = make_executor(setup.executor, data, 2)
    try:
        # Execute: kill one actor's process, then evaluate on both
        os.kill(ray_ex.pids()[0], signal.SIGKILL)
        there = ray_ex.evaluate(x, clients, 64)
        retried = ray_ex.tasks_retried
    finally:
        ray_ex.shutdown()
    # Assert: the dead actor's clients were evaluated again, by its restart:
    # the same results, in client-id order
    assert there == here and [r.client for r in here] == clients
    assert retried == len(clients[0::2])
