"""The participation-bias meter (issue 13): each client's share of the
aggregation weight over a run against its data share p_i, in summary.json
and report.md, on small real in-process runs (sync and async)."""

from __future__ import annotations

import json
import math

import numpy as np
import pyarrow.parquet as pq
import pytest

from fedsim.algorithms import FedAvg
from fedsim.algorithms.sampling import participation_bias, weight_shares
from fedsim.runtime import run_scenario
from fedsim.scenario import load_scenario
from fedsim.tools.plots import figure_weight_share
from fedsim.tools.report import write_report

from .conftest import assert_figure, cli_run

TINY = "scenarios/ci/tiny-synthetic.yaml"
FEDBUFF = "scenarios/async-fedbuff.yaml"
# one local step per client and round: equal ||a_i||_1, so the normalised
# weights FedAvg reports are its sampling weights
ONE_STEP = "round={policy: fixed_window, window_s: 1000, max_steps: 1}"


def oracle(result) -> tuple[float, dict[int, float]]:
    """L1 and weight shares recomputed by hand from the result's rows."""
    n = np.asarray(result.data.weights, dtype=float)
    p = n / n.sum()
    used = [r["round"] for r in result.rows if r["n_completed"] > 0]
    share: dict[int, float] = {}
    for c in result.clients:
        if not c["dropped"]:
            share[c["client_id"]] = share.get(c["client_id"], 0.0) + c["agg_weight"]
    share = {c: s / len(used) for c, s in share.items()}
    l1 = sum(abs(share.get(i, 0.0) - p[i]) for i in range(len(p)))
    return l1, share


# ------------------------------------------------------------------ units
def test_weight_shares_by_hand():
    # Prepare: 3 clients, 2 rounds that applied updates and one that did not
    # round 0: clients 0 and 1 at 0.25 / 0.75; round 1: client 1 alone (1.0);
    # client 2 dropped (weight 0)
    ids = [0, 1, 1, 2]
    w = [0.25, 0.75, 1.0, 0.0]

    # Execute
    shares = weight_shares(3, ids, w, rounds=2)
    out = participation_bias(shares, np.array([0.5, 0.25, 0.25]), top=5)

    # Assert: client 0: 0.25 / 2 = 0.125; client 1: 1.75 / 2 = 0.875
    assert shares.tolist() == [0.125, 0.875, 0.0]
    # L1 = |0.125 - 0.5| + |0.875 - 0.25| + |0 - 0.25| = 0.375 + 0.625 + 0.25
    assert out["l1"] == pytest.approx(1.25)
    # only client 1 is over-weighted
    assert out["top_overweighted"] == [
        {"client": 1, "weight_share": 0.875, "data_share": 0.25}
    ]
    assert weight_shares(2, [], [], rounds=0).tolist() == [0.0, 0.0]


def test_top_overweighted_keeps_five_in_order():
    shares = np.array([0.1, 0.3, 0.05, 0.2, 0.15, 0.12, 0.08])
    data = np.full(7, 1 / 7)
    top = participation_bias(shares, data)["top_overweighted"]
    # excesses over 1/7 = 0.1429: 0.3 (1), 0.2 (3), 0.15 (4); the rest below
    assert [t["client"] for t in top] == [1, 3, 4]


# ------------------------------------------------------------ sync runs
def long_run(selector: str) -> list[str]:
    """Overrides: 1000 one-step rounds of ``selector`` drawing 3 of the 6
    clients, evaluated never (the meter needs only the weights)."""
    return [
        "rounds=1000",
        ONE_STEP,
        "eval.every_rounds=100000",
        f"selector={{name: {selector}, clients_per_round: 3}}",
    ]


def test_the_meter_is_near_zero_for_the_unbiased_pairing_and_large_for_the_refused():
    # Prepare: 6 clients with n = (72, 37, 36, 72, 25, 24), the weighted
    # selector drawing 3 a round, 1000 rounds; the default (unbiased) pairing
    # and the refused one (built past the scenario check)
    base = long_run("weighted")
    unbiased = load_scenario(TINY, base)
    assert unbiased.algorithm.sampling == "proportional"
    refused = unbiased.model_copy(update={"algorithm": FedAvg(sampling="renormalized")})

    # Execute
    good = run_scenario(unbiased)
    bad = run_scenario(refused)

    # Assert: k_i / q is unbiased, so only sampling noise is left (0.059 at
    # 600 rounds); n_i weights on a p-proportional draw over-weight the big
    # clients (L1 0.28 at 600 rounds, the two 72-sample clients on top)
    pb_good = good.summary()["participation_bias"]
    pb_bad = bad.summary()["participation_bias"]
    assert pb_good["l1"] < 0.1
    assert pb_bad["l1"] > 0.2
    assert {t["client"] for t in pb_bad["top_overweighted"][:2]} == {0, 3}
    # the summary is what the rows say
    for result, pb in ((good, pb_good), (bad, pb_bad)):
        l1, share = oracle(result)
        assert pb["l1"] == pytest.approx(l1, abs=1e-9)
        assert sum(share.values()) == pytest.approx(1.0)
        for t in pb["top_overweighted"]:
            assert t["weight_share"] == pytest.approx(share[t["client"]])


def test_uniform_runs_keep_their_numbers_and_gain_only_the_meter():
    # The meter reads the rows; the rows of a uniform run are unchanged
    sc = load_scenario(TINY, ["rounds=3"])
    result = run_scenario(sc)
    summary = result.summary()
    pb = summary["participation_bias"]
    assert set(pb) == {"l1", "top_overweighted"}
    assert len(pb["top_overweighted"]) <= 5
    assert math.isfinite(pb["l1"]) and pb["l1"] >= 0
    assert pb["l1"] == pytest.approx(oracle(result)[0], abs=1e-9)


# ------------------------------------------------------------ async runs
def async_run(selector: str):
    # 30 always-online devices of equal speed, sizes spread by size_sigma,
    # FedBuff with constant staleness weight: every applied update weighs
    # 1/K, so the weight share is how often a client's jobs arrive
    fleet = (
        "fleet={groups: [{name: d, count: 30, speed: {dist: fixed, steps_per_s: 10}}]}"
    )
    sc = load_scenario(
        FEDBUFF,
        [
            "rounds=300",
            "eval.every_rounds=100000",
            "resources.workers=0",
            "data.size_sigma=2.0",
            fleet,
            "round={policy: async, job_steps: max_steps, max_steps: 2, "
            "concurrency: 3, max_staleness: 20}",
            "algorithm={name: fedbuff, buffer_size: 3, staleness: constant}",
            f"selector={{name: {selector}, clients_per_round: 3}}",
        ],
    )
    return run_scenario(sc)


def test_async_the_weight_each_applied_update_got():
    # Execute
    uniform = async_run("uniform")
    weighted = async_run("weighted")

    # Assert: jobs started in proportion to p_i and averaged with equal
    # weights are close to p (0.155 over 300 versions); jobs started
    # uniformly give every client ~1/30 whatever its data (1.08)
    pb_u = uniform.summary()["participation_bias"]
    pb_w = weighted.summary()["participation_bias"]
    assert pb_w["l1"] < 0.3
    assert pb_u["l1"] > 0.8
    for result, pb in ((uniform, pb_u), (weighted, pb_w)):
        l1, share = oracle(result)
        assert pb["l1"] == pytest.approx(l1, abs=1e-9)
        assert sum(share.values()) == pytest.approx(1.0)


# ------------------------------------------------------ summary and report
def test_summary_json_and_report_show_the_meter(tmp_path):
    # Prepare / Execute: a CLI run and its report
    out = cli_run(
        tmp_path / "run",
        "ci/tiny-synthetic.yaml",
        ["rounds=20", "selector={name: weighted, clients_per_round: 3}"],
    )
    report = write_report(out).read_text()

    # Assert
    summary = json.loads((out / "summary.json").read_text())
    # L1 recomputed by hand from the files the run wrote
    p = {
        r["client_id"]: r["weight"]
        for r in pq.read_table(out / "partition.parquet").to_pylist()
    }
    total = sum(p.values())
    rows = pq.read_table(out / "rounds.parquet").to_pylist()
    used = sum(1 for r in rows if r["n_completed"] > 0)
    share: dict[int, float] = {}
    for c in pq.read_table(out / "clients.parquet").to_pylist():
        if not c["dropped"]:
            share[c["client_id"]] = share.get(c["client_id"], 0.0) + c["agg_weight"]
    l1 = sum(abs(share.get(i, 0.0) / used - w / total) for i, w in p.items())
    assert used > 0 and l1 > 0
    assert summary["participation_bias"]["l1"] == pytest.approx(l1, abs=1e-9)
    assert_figure(out / "weight_share.png", (6.0, 5.5))
    assert "![Participation bias: weight share vs data share](weight_share.png)" in (
        report
    )
    # the figure plots what the summary says
    fig = figure_weight_share(
        pq.read_table(out / "clients.parquet"),
        pq.read_table(out / "rounds.parquet"),
        pq.read_table(out / "partition.parquet"),
    )
    title = fig.axes[0].get_title()
    assert f"L1 = {summary['participation_bias']['l1']:.3g}" in title
    empty = figure_weight_share(None, None, None)
    assert "weight share" in empty.axes[0].get_title()


def test_the_meter_sums_the_weights_as_applied_not_normalised():
    # Prepare: the uniform selector drawing 3 of the 6 clients a round. The
    # unbiased scheme (ii) gives each delta p_i m / q, which does not sum to
    # 1 in a round; n_i weights renormalised over the draw always do, and so
    # over-weight the small clients drawn with big ones absent (and the
    # reverse): their expected weight is not p_i.
    base = long_run("uniform")
    renormalized = load_scenario(TINY, base)
    assert renormalized.algorithm.sampling == "renormalized"
    unbiased = load_scenario(TINY, [*base, "algorithm.sampling=uniform"])

    # Execute
    bad = run_scenario(renormalized)
    good = run_scenario(unbiased)

    # Assert
    l1_good = good.summary()["participation_bias"]["l1"]
    l1_bad = bad.summary()["participation_bias"]["l1"]
    # 0.040 against 0.100 here (sampling noise left in the first)
    assert l1_good < 0.06 and l1_bad > 0.08
    assert l1_good == pytest.approx(oracle(good)[0], abs=1e-9)
    # some round's applied weights do not sum to 1 (they do in expectation)
    sums: dict[int, float] = {}
    for c in good.clients:
        sums[c["round"]] = sums.get(c["round"], 0.0) + c["agg_weight"]
    assert any(abs(s - 1.0) > 0.05 for s in sums.values())
