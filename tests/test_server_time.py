"""The server as a device: its work billed on the clock at the scenario's
``server`` speed (fedsim/servertime.py, docs/fleets.md "The server's clock").

- ``server: {flops_per_s: inf}`` reproduces a run without the section bit
  for bit, synchronous and asynchronous;
- FedDM's server epochs cost simulated time, exactly the samples trained
  at the model's FLOPs per sample, and the next round waits for them;
- a rule's validation losses (FedPNS's CHECK LOSS) are billed as forward
  passes over the validation rows;
- an asynchronous run with a slow server queues updates, and a resumed one
  equals the uninterrupted run;
- a bad speed is one line naming the field.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import pytest
import torch

from fedsim.algorithms.base import PLAIN_ROUND, ServerWork
from fedsim.algorithms.fedavg import FedAvg
from fedsim.algorithms.feddm import FedDM
from fedsim.clock import AsyncTimeline, ServedVersion
from fedsim.flops import step_flops
from fedsim.runtime import _Run, run_scenario
from fedsim.scenario import ScenarioError, dump_scenario, load_scenario, parse_scenario
from fedsim.server import Server
from fedsim.servertime import SERVER_PRESETS, ServerClock, ServerSpec

from .test_async_sim import FEDBUFF, _Stop, _stop_after, metrics, same_rows, same_run
from .test_feddm import SMALL, TINY

SLOW = "server.flops_per_s=1000"  # a logreg FedBuff version (K 5): 6.1 s
EF_ALIKE = "compression={name: top_k, k: 3, error_feedback: true}"


def _run(sc, **kw):
    res = run_scenario(sc, workers=0, **kw)
    assert res.status == "completed", res.message
    return res


# ------------------------------------------------------------- a free server
@pytest.mark.parametrize(
    ("scenario", "over"),
    [(TINY, ["rounds=3"]), (FEDBUFF, ["rounds=12"])],
    ids=["sync", "async"],
)
def test_an_infinite_server_reproduces_the_run_without_one_bit_for_bit(scenario, over):
    # Prepare
    plain = load_scenario(scenario, over)
    free = load_scenario(scenario, [*over, "server.flops_per_s=inf"])
    assert free.server is not None and free.server.free

    # Execute
    a, b = _run(plain), _run(free)

    # Assert: every row, every client row, the model, and no server columns
    same_run(a, b)
    assert "server_s" not in b.rows[0]
    assert "server" not in b.summary()["fleet_realised"]


# ------------------------------------------------------------- FedDM's epochs
def test_feddm_server_epochs_cost_simulated_time_and_the_next_round_waits():
    # Prepare: FedDM on the tiny fleet, its server at 10 MFLOP/s
    over = [f"algorithm={SMALL}", "rounds=3", "server.flops_per_s=1e7"]
    sc = load_scenario(TINY, over)
    free = _run(load_scenario(TINY, over[:-1]))
    train = step_flops(sc.facts) / sc.client.batch_size  # per sample
    d = _Run(sc, None, None).num_params

    # Execute
    res = _run(sc)

    # Assert: each round's seconds are the rule's sum plus server_epochs
    # passes over the synthetic union (ipc images per class held) ...
    assert isinstance(sc.algorithm, FedDM)
    epochs, ipc = sc.algorithm.server_epochs, sc.algorithm.ipc
    for row in res.rows:
        n = row["n_completed"]
        trained = (row["server_s"] * 1e7 - 2.0 * n * d) / (epochs * train)
        assert trained > 0 and trained == pytest.approx(round(trained), abs=1e-6)
        assert round(trained) % ipc == 0
    # ... the next round starts when the server is done ...
    starts = {}
    for c in res.clients:
        starts[c["round"]] = min(c["t_start"], starts.get(c["round"], math.inf))
    for prev, row in zip(res.rows, res.rows[1:], strict=False):
        assert starts[row["round"]] == prev["sim_time"]
    # ... and the server's time is all the run gains (same clients, same model)
    gained = sum(r["server_s"] for r in res.rows)
    assert res.rows[-1]["sim_time"] == pytest.approx(free.rows[-1]["sim_time"] + gained)
    assert torch.equal(res.final_params, free.final_params)
    busy = res.summary()["fleet_realised"]["server"]
    assert busy["busy_s"] == pytest.approx(gained)
    assert busy["busy_share"] == pytest.approx(gained / res.rows[-1]["sim_time"])


def test_a_rules_validation_losses_are_billed_as_forward_passes():
    # Prepare: FedPNS scores candidate subsets on the validation rows
    over = [
        "rounds=2",
        "data.validation_fraction=0.2",
        "algorithm={name: fedpns, v: 2}",
        "selector={name: fedpns, clients_per_round: 3}",
        "round={policy: fixed_epochs, epochs: 1}",
    ]
    sc = load_scenario(TINY, [*over, "server.flops_per_s=1e9"])
    run = _Run(sc, None, None)

    # Execute
    res = _run(sc)

    # Assert: beyond the rule's sum, whole forward passes over the rows
    timer = run.server_time
    assert timer is not None
    val = len(Server(run.setup.server, run.data).val[1])
    for row in res.rows:
        rule = timer.step_s(row["n_completed"])
        evaluated = (row["server_s"] - rule) * 1e9 / timer.clock.forward_flops
        assert evaluated == pytest.approx(round(evaluated), abs=1e-6)
        assert round(evaluated) >= val and round(evaluated) % val == 0


# ------------------------------------------------------------- asynchronous
def test_a_slow_server_queues_updates_on_the_async_timeline():
    # Prepare: the FedBuff fleet's timeline, free and with 6.1 s a version
    sc = load_scenario(FEDBUFF, ["rounds=30"])
    run = _Run(sc, None, None)

    def timeline(server_s):
        return AsyncTimeline(
            run.fleet,
            sc.round,
            versions=30,
            buffer_size=5,
            concurrency=15,
            seed=sc.seed,
            ctx=run.ctx,
            server_s=server_s,
        )

    # Execute
    free, slow = list(timeline(0.0)), list(timeline(6.1))

    # Assert: versions come at least 6.1 s apart, a queue forms, the server
    # is busy 6.1 s a version, and staleness counts the queued versions
    assert not any(isinstance(v, ServedVersion) for v in free)
    assert all(isinstance(v, ServedVersion) for v in slow)
    gaps = np.diff([v.t for v in slow])
    assert gaps.min() >= 6.1 - 1e-9
    assert max(v.queued for v in slow) >= 5  # a whole buffer waited
    assert [v.busy_s for v in slow] == pytest.approx([6.1 * (i + 1) for i in range(30)])
    assert slow[-1].t > free[-1].t
    stale = [a.staleness for v in slow for a in v.applied]
    assert max(stale) > max(a.staleness for v in free for a in v.applied)


def test_an_async_run_with_a_slow_server_records_its_queue():
    # Prepare
    sc = load_scenario(FEDBUFF, ["rounds=20", SLOW])

    # Execute
    res = _run(sc)

    # Assert: the columns, and the realised block's summary of them
    queue = [r["server_queue"] for r in res.rows]
    assert max(queue) > 0
    assert all(r["server_s"] == pytest.approx(6100 / 1000) for r in res.rows)
    last = res.rows[-1]
    assert last["server_busy"] == pytest.approx(20 * 6.1 / last["sim_time"])
    server = res.summary()["fleet_realised"]["server"]
    assert server["queue_max"] == max(queue)
    assert server["queue_mean"] == pytest.approx(np.mean(queue))


@pytest.mark.parametrize(
    ("scenario", "over", "stop_at"),
    [(FEDBUFF, ["rounds=24", SLOW], 15), (TINY, ["rounds=6", SLOW], 4)],
    ids=["async", "sync"],
)
def test_a_resumed_run_with_a_slow_server_equals_an_uninterrupted_one(
    tmp_path, scenario, over, stop_at
):
    # Prepare
    sc = load_scenario(scenario, [*over, "checkpoint.every_rounds=3"])
    ref = _run(sc)
    with pytest.raises(_Stop):
        run_scenario(sc, run_dir=tmp_path, on_round=_stop_after(stop_at))

    # Execute
    res = _run(sc, run_dir=tmp_path, resume=True)

    # Assert: the server's columns (its busy share too) as uninterrupted
    same_rows(metrics(res.rows), metrics(ref.rows))
    assert torch.equal(res.final_params, ref.final_params)
    assert res.rows[-1]["server_busy"] > 0


# ------------------------------------------------------------- the section
def test_presets_and_the_seconds_of_a_step():
    assert ServerSpec().free and ServerSpec(flops_per_s=math.inf).free
    assert ServerSpec(preset="cpu-socket").rate == SERVER_PRESETS["cpu-socket"]
    assert SERVER_PRESETS["cpu-socket"] == pytest.approx(5.0176e12)
    clock = ServerClock(1e6, train_flops=30.0, forward_flops=10.0)
    work = ServerWork(train_samples=100, eval_samples=50, flops=500)
    assert clock.seconds(1000.0, work) == pytest.approx((1000 + 500 + 3000 + 500) / 1e6)


@pytest.mark.parametrize(
    ("setting", "words"),
    [
        ("server.flops_per_s=0", "server.flops_per_s"),
        ("server.flops_per_s=-3", "server.flops_per_s"),
        ("server={flops_per_s: 1e12, preset: a100}", "not both"),
        ("server.preset=tpu", "server.preset"),
    ],
)
def test_a_bad_server_speed_is_refused_naming_the_field(setting, words):
    with pytest.raises(ScenarioError) as err:
        load_scenario(TINY, [setting])
    assert words in str(err.value)


def test_the_async_timeline_is_told_the_rules_seconds_per_version():
    # the FedBuff rule: 2 K d FLOPs, at 1000 FLOP/s
    sc = load_scenario(FEDBUFF, ["rounds=2", SLOW])
    run = _Run(sc, None, None)
    d = run.num_params
    assert run.server_time is not None
    assert run.server_time.step_s(5) == 2.0 * 5 * d / 1000


# ------------------------------------------------------------- a plug-in's work
@dataclass(frozen=True)
class Heavy(FedAvg):
    """A user's rule that declares its own arithmetic and reports work on
    the server's network (both billed by the server's clock)."""

    name: str = "heavy"

    def server_flops(self, n_updates, d):
        return 2.0 * n_updates * d + 1e6

    def aggregate(self, state, updates, ctx=PLAIN_ROUND):
        new, info = super().aggregate(state, updates, ctx)
        return new, replace(info, server_work=ServerWork(flops=3e6))


def test_a_plug_ins_declared_server_work_is_billed():
    # Prepare: the rule's sum plus 1 MFLOP declared, plus 3 MFLOP reported
    sc = load_scenario(
        TINY, ["rounds=2", "algorithm={name: tests.test_server_time:Heavy}", SLOW]
    )
    d = _Run(sc, None, None).num_params

    # Execute
    res = _run(sc)

    # Assert
    for row in res.rows:
        flops = 2.0 * row["n_completed"] * d + 1e6 + 3e6
        assert row["server_s"] == pytest.approx(flops / 1000)


@pytest.mark.parametrize("speed", ["inf", "2.5e9"])
def test_the_resolved_scenario_with_a_server_loads_again(speed):
    # every run folder keeps dump_scenario's text; inf is written as a word
    sc = load_scenario(TINY, [f"server.flops_per_s={speed}", EF_ALIKE])
    again = parse_scenario(dump_scenario(sc))
    assert again.server == sc.server and again.compression == sc.compression
