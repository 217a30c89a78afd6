"""Secure aggregation's cost on the clock (fedsim/secagg.py, docs/fleets.md
"Secure aggregation"):

- a round's per-client bytes and seconds, and the server's seconds, equal a
  hand computation from the stated constants for a small cohort and model;
- a round with drops that leave fewer survivors than the threshold is
  recorded as failed, with its reason, and the model is unchanged;
- a round with a few drops above the threshold costs the stated extra
  unmasking (the dropped clients' pairwise masks), on the server's clock;
- SecAgg+ costs less than SecAgg at a large cohort;
- the rows are the same on 0 and 2 Ray workers and through --resume;
- no section: no column and no change; each bad input is one line naming
  the field, exit 2, before any training.
"""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
import torch

from fedsim.clock import Plan, RoundPlan, RunContext
from fedsim.fleet import Fleet, FleetSpec
from fedsim.runtime import _Run, run_scenario
from fedsim.scenario import ScenarioError, dump_scenario, load_scenario, parse_scenario
from fedsim.secagg import ABORTED, SecAggModel, SecAggSpec

from .conftest import WAIT_S
from .test_async_sim import _Stop, _stop_after, same_run
from .test_feddm import TINY

# 3 of 6 devices a round, each dropping out with probability 0.3; a server
# at 1 MFLOP/s so that the unmasking's compute is visible on the clock
DROPS = "fleet.stragglers={p: 0.0, dropout_p: 0.3}"
SLOW = "server.flops_per_s=1e6"


def _secagg(threshold, protocol="secagg"):
    return f"secure_aggregation={{protocol: {protocol}, threshold: {threshold}}}"


def _run(sc, **kw):
    res = run_scenario(sc, workers=kw.pop("workers", 0), **kw)
    assert res.status == "completed", res.message
    return res


def _fleet(n):
    """n devices at 8 Mbit/s down, 2 Mbit/s up, 50 ms latency."""
    spec = FleetSpec.model_validate(
        {
            "groups": [
                {
                    "name": "phones",
                    "count": n,
                    "speed": {"dist": "fixed", "steps_per_s": 4.0},
                    "network": {"down_mbps": 8, "up_mbps": 2, "latency_s": 0.05},
                }
            ]
        }
    )
    return Fleet.from_spec(spec, seed=0)


def _plan(n, dropped):
    """A round of devices 0..n-1 whose first ``dropped`` dropped out."""
    plans = tuple(
        Plan(i, 5, 0.0, 1.0, i < dropped, "dropout" if i < dropped else "", 1.0, 1)
        for i in range(n)
    )
    return RoundPlan(plans, 0.0, 1.0)


# ------------------------------------------------------------- hand computations
# The stated constants (fedsim/secagg.py, SecAggCosts): keys 32 B, ids 4 B,
# shares 32 B (key) and 16 B (seed), AES-GCM overhead 28 B: a share message
# is 2*4 + 32 + 16 + 28 = 84 B. Key agreement 120,000 cycles, a Shamir term
# 20, AEAD 4 cycles a byte, the PRG 1.5 a byte; a client at 2e9 cycles/s, the
# server's cycle 16 FLOPs.
M, ELEM = 10, 4  # a model of 10 float32 parameters


def test_a_clients_bytes_and_seconds_equal_the_hand_computation():
    # Prepare: SecAgg, a cohort of 4 (k = 3 neighbours), threshold 3
    model = SecAggModel(SecAggSpec(protocol="secagg", threshold=3), M, ELEM)

    # Execute
    c = model.cohort(4)

    # Assert: masked elements are 32 + ceil(log2 4) = 34 bits: ceil(340/8) = 43 B
    assert (c.neighbours, c.threshold, c.share_threshold) == (3, 3, 3)
    assert c.masked_bytes == 43
    # up: 2 keys + 3 share messages + the masked vector's 3 bytes more
    assert c.bytes_up == 2 * 32 + 3 * 84 + (43 - 40) == 319
    # down: each neighbour's 2 keys and its share message for this client
    assert c.bytes_down == 3 * (2 * 32 + 84) == 444
    # compute: 2 key generations + 2 agreements a neighbour; 2 secrets into 3
    # shares of 3 terms; 3 encryptions + 3 decryptions of 84 B; 4 masks of
    # 43 ring bytes (34 bits x 10 / 8 = 42.5) at 1.5 cycles a byte
    cycles = 8 * 120_000 + 2 * 3 * 3 * 20 + 6 * 84 * 4 + 4 * 42.5 * 1.5
    assert cycles == 962_631.0
    assert c.client_s == pytest.approx(cycles / 2e9, rel=1e-15)


def test_the_server_seconds_and_the_unmasking_equal_the_hand_computation():
    # Prepare: the same cohort, no drop, a server at 1 GFLOP/s
    model = SecAggModel(SecAggSpec(protocol="secagg", threshold=3), M, ELEM, 1e9)
    fleet = _fleet(4)

    # Execute
    cost = model.round_cost(4, _plan(4, dropped=0), fleet)

    # Assert: rebuild 4 seeds (3^2 Shamir terms each), remove 4 self masks
    cycles = 4 * 9 * 20 + 4 * 42.5 * 1.5
    assert not cost.failed and cost.server_flops == pytest.approx(cycles * 16)
    assert cost.columns["secagg_server_s"] == pytest.approx(cycles * 16 / 1e9)
    # each survivor: down 3 ids; up a seed share per neighbour with its id
    assert (cost.unmask_bytes_down, cost.unmask_bytes_up) == (12, 3 * 20)
    assert cost.unmask_s == pytest.approx(8 * 12 / 8e6 + 0.05 + 8 * 60 / 2e6 + 0.05)
    assert cost.columns["secagg_bytes_up"] == 319 + 60


def test_a_few_drops_above_the_threshold_cost_the_stated_extra_unmasking():
    # Prepare: 1 of 4 drops after sharing its keys; 3 survivors meet t = 3
    model = SecAggModel(SecAggSpec(protocol="secagg", threshold=3), M, ELEM, 1e9)
    fleet = _fleet(4)

    # Execute
    none = model.round_cost(4, _plan(4, dropped=0), fleet)
    one = model.round_cost(4, _plan(4, dropped=1), fleet)

    # Assert: the server rebuilds the dropped client's key (as many Shamir
    # terms as a seed), agrees it with its 3 surviving neighbours and
    # expands their 3 pairwise masks; one self mask fewer to remove
    mask = 42.5 * 1.5
    extra = 3 * (120_000 + mask) - mask
    assert not one.failed and (one.survivors, one.dropped) == (3, 1)
    assert one.server_flops - none.server_flops == pytest.approx(extra * 16)
    # a survivor sends the dropped one a key share, 16 B more than a seed's
    assert one.unmask_bytes_up - none.unmask_bytes_up == 32 - 16


def test_the_run_bills_the_stated_unmasking_on_the_servers_clock():
    # Prepare: threshold 2 of 3, drops in some rounds, the server at 1 MFLOP/s
    sc = load_scenario(TINY, ["rounds=8", DROPS, _secagg(2), SLOW])
    run = _Run(sc, None, None)
    d = run.num_params

    # Execute
    res = _run(sc)

    # Assert: every applied round's server seconds are the rule's sum (2 n d
    # FLOPs) and the hand computation of its unmasking, from its columns
    mask = d * (32 + 2) / 8 * 1.5  # 3 chosen: ceil(log2 3) = 2 bits more
    assert any(r["secagg_dropped"] for r in res.rows if not r["secagg_failed"])
    for r in res.rows:
        if r["secagg_failed"]:
            continue
        s, drop = r["secagg_survivors"], r["secagg_dropped"]
        pairs = drop * (2 * s / 2)  # each dropped one's surviving neighbours
        cycles = 3 * 2**2 * 20 + pairs * (120_000 + mask) + s * mask
        assert r["secagg_server_s"] == pytest.approx(cycles * 16 / 1e6)
        rule = 2.0 * r["n_completed"] * d
        assert r["server_s"] == pytest.approx(rule / 1e6 + r["secagg_server_s"])
        # the round ends at its last device's end, then the unmasking
        # exchange, then the server's step
        ends = [c["t_arrive"] for c in res.clients if c["round"] == r["round"]]
        after = max(ends) + r["secagg_unmask_s"] + r["server_s"]
        assert r["secagg_unmask_s"] > 0
        assert r["sim_time"] == pytest.approx(after, rel=1e-12, abs=0)


# ------------------------------------------------------------- failed rounds
def test_a_round_below_the_threshold_fails_and_leaves_the_model_unchanged():
    # Prepare: every one of the 3 must survive (rounds 0-2 and 6 lose some)
    over = ["rounds=7", DROPS, _secagg(3)]
    sc = load_scenario(TINY, over)

    # Execute
    res = _run(sc)
    before_last = _run(load_scenario(TINY, [*over[1:], "rounds=6"]))

    # Assert: a failed round is recorded with its reason, applies nothing
    failed = [r for r in res.rows if r["secagg_failed"]]
    assert failed and res.rows[-1]["secagg_failed"]
    loss = res.initial["loss"]
    for r in res.rows:
        if r["secagg_failed"]:
            assert r["n_completed"] == 0 and r["test_loss"] == loss
            assert "below the threshold 3" in r["secagg_reason"]
            assert r["secagg_survivors"] < 3
        else:
            assert r["secagg_reason"] == "" and r["test_loss"] != loss
        loss = r["test_loss"]
    # summary.json counts them
    entry = res.summary()["fleet_realised"]["secure_aggregation"]
    assert entry["rounds_failed"] == len(failed)
    # the last round failed: the model is the one the round before left
    assert torch.equal(res.final_params, before_last.final_params)
    # its survivors' masked inputs were sent, and lost with the round
    last = [c for c in res.clients if c["round"] == 6]
    survivors = [c for c in last if c["drop_reason"] == ABORTED]
    assert len(survivors) == res.rows[-1]["secagg_survivors"]
    assert all(c["dropped"] and c["bytes_up"] > 0 for c in survivors)


def test_a_fraction_threshold_is_taken_of_the_cohort():
    spec = SecAggSpec(protocol="secagg", threshold=0.3)
    assert [spec.cohort_threshold(n) for n in (10, 11, 1)] == [3, 4, 1]
    assert SecAggSpec(protocol="secagg", threshold=1.0).cohort_threshold(7) == 7


# ------------------------------------------------------------- SecAgg+
def test_secagg_plus_costs_less_than_secagg_at_a_large_cohort():
    # Prepare: 1,000 clients, a 1M-parameter model, 10% dropped
    n, m, fleet = 1000, 1_000_000, _fleet(1000)
    plain = SecAggModel(SecAggSpec(protocol="secagg", threshold=0.5), m, ELEM, 1e12)
    plus = SecAggModel(SecAggSpec(protocol="secagg_plus", threshold=0.5), m, ELEM, 1e12)
    plan = _plan(n, dropped=100)

    # Execute
    a, b = plain.cohort(n), plus.cohort(n)
    ra, rb = plain.round_cost(n, plan, fleet), plus.round_cost(n, plan, fleet)

    # Assert: k = ceil(3 log2 1000) = 30 neighbours, not 999
    assert (a.neighbours, b.neighbours) == (999, 30)
    # the same masked vector (O(m)); keys and shares O(log n), not O(n)
    assert b.masked_bytes == a.masked_bytes
    wider = a.masked_bytes - m * ELEM
    assert b.bytes_up - wider < (a.bytes_up - wider) / 10
    assert b.bytes_down < a.bytes_down / 10
    assert b.client_s < a.client_s / 10
    assert rb.server_flops < ra.server_flops / 10
    assert rb.unmask_bytes_up < ra.unmask_bytes_up


# ------------------------------------------------------------- determinism
@pytest.mark.ray
def test_rows_are_the_same_on_0_and_2_ray_workers(ray_session):
    sc = load_scenario(TINY, ["rounds=5", DROPS, _secagg(3), SLOW])
    a, b = _run(sc), _run(sc, workers=2)
    same_run(a, b)


def test_a_resumed_run_equals_an_uninterrupted_one(tmp_path):
    # Prepare: stopped after round 4, checkpoints every 3 rounds
    sc = load_scenario(
        TINY, ["rounds=8", DROPS, _secagg(2), SLOW, "checkpoint.every_rounds=3"]
    )
    ref = _run(sc)
    with pytest.raises(_Stop):
        run_scenario(sc, run_dir=tmp_path, on_round=_stop_after(4))

    # Execute
    res = _run(sc, run_dir=tmp_path, resume=True)

    # Assert
    same_run(res, ref)


def test_no_section_adds_no_column_and_the_clock_takes_no_extra_time():
    sc = load_scenario(TINY, ["rounds=2", DROPS])
    res = _run(sc)
    assert not any(k.startswith("secagg") for k in res.rows[0])
    assert "secure_aggregation" not in res.summary()["fleet_realised"]
    ctx = RunContext(100, 100, np.array([10]), 5)
    assert ctx.extra_s == 0.0


def test_the_key_phases_shorten_a_fixed_window_rounds_training():
    # a 10 s window: the keys' bytes and compute come out of training time
    over = ["rounds=1", "round={policy: fixed_window, window_s: 10, max_steps: 10000}"]
    plain = _run(load_scenario(TINY, over))
    costly = "secure_aggregation.costs.client_hz=1e6"  # 1 MHz: about 0.5 s
    sa = _run(load_scenario(TINY, [*over, _secagg(1), costly]))
    taus = [
        (c["tau"], d["tau"]) for c, d in zip(plain.clients, sa.clients, strict=True)
    ]
    assert all(b < a for a, b in taus)


def test_the_resolved_scenario_with_the_section_loads_again():
    sc = load_scenario(TINY, [_secagg(0.5, "secagg_plus")])
    again = parse_scenario(dump_scenario(sc))
    assert again.secure_aggregation == sc.secure_aggregation
    assert isinstance(again.secure_aggregation.threshold, float)


# ------------------------------------------------------------- bad input
ASYNC = ["round.policy=async", "round.max_steps=5", _secagg(2)]


@pytest.mark.parametrize(
    ("over", "words"),
    [
        ([_secagg(4)], "secure_aggregation.threshold: 4 is above the cohort"),
        ([_secagg(0)], "secure_aggregation.threshold"),
        ([_secagg(-2)], "secure_aggregation.threshold"),
        ([_secagg(1.5)], "secure_aggregation.threshold"),
        ([_secagg(0.0)], "secure_aggregation.threshold"),
        ([_secagg(2, "secagg_max")], "secure_aggregation.protocol"),
        (ASYNC, "secure_aggregation needs synchronous rounds"),
    ],
    ids=["above", "zero", "negative", "fraction", "zero-fraction", "protocol", "async"],
)
def test_a_bad_section_is_refused_naming_the_field(over, words):
    with pytest.raises(ScenarioError) as err:
        load_scenario(TINY, over)
    assert words in str(err.value)


def test_the_command_line_refuses_a_bad_threshold_with_exit_2(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "fedsim",
            "run",
            str(TINY),
            "--set",
            _secagg(5),
            "--out",
            str(tmp_path / "run"),
        ],
        capture_output=True,
        text=True,
        timeout=WAIT_S,
    )
    assert out.returncode == 2
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "secure_aggregation.threshold" in lines[0]
    assert not (tmp_path / "run" / "rounds.parquet").exists()


def test_infinite_server_bills_the_unmasking_nothing():
    model = SecAggModel(SecAggSpec(protocol="secagg", threshold=1), M, ELEM)
    cost = model.round_cost(4, _plan(4, dropped=2), _fleet(4))
    assert cost.server_flops > 0 and cost.columns["secagg_server_s"] == 0.0
    assert math.isinf(model.server_rate)
