"""Asynchronous runs end to end: real training on the async timeline.

- FedBuff with K = every device, identical devices and no stragglers is
  synchronous FedAvg (equal-sized clients, so the weights match too);
- each update is trained from the parameters of the version its device
  downloaded: the final model equals a closed-form replay of the timeline
  on the quadratic objectives;
- the result does not depend on how jobs are batched, nor on the number of
  Ray workers.
"""

from __future__ import annotations

import math

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from fedsim.algorithms.fedasync import staleness_weight
from fedsim.checkpoint import CheckpointError
from fedsim.results import ASYNC_CLIENT_SCHEMA, ASYNC_ROUND_SCHEMA, WALL_CLOCK_COLUMNS
from fedsim.runtime import async_timeline, run_scenario
from fedsim.scenario import ScenarioError, load_scenario, parse_scenario

from .conftest import SCENARIOS

FEDBUFF = SCENARIOS / "async-fedbuff.yaml"
FEDASYNC = SCENARIOS / "async-fedasync.yaml"

# Five identical, always-on devices; equal-sized clients (size_sigma = 0).
IDENTICAL = """
name: identical
seed: 3
rounds: 4
model: {name: logreg}
data: {dataset: synthetic, alpha: 1.0, beta: 1.0, features: 10, classes: 3,
       size_mean: 0.0, size_sigma: 0.0, min_samples: 60}
client: {solver: sgd, lr: 0.05, batch_size: 10}
fleet:
  groups:
    - {name: same, count: 5, speed: {dist: fixed, steps_per_s: 4.0},
       network: {down_mbps: 8, up_mbps: 8}}
round: {policy: fixed_window, window_s: 100, max_steps: 7}
algorithm: {name: fedavg}
selector: {name: uniform, clients_per_round: 5}
resources: {workers: 0}
"""

# Four devices of different speeds (and stragglers) on FedNova's quadratics.
QUADRATIC = """
name: quadratic-async
seed: 0
rounds: 14
model: {name: quadratic, dtype: float64}
data: {dataset: quadratic, centers: [0.0, 1.0, 4.0, -2.0],
       weights: [0.1, 0.2, 0.3, 0.4], x0: 0.5}
client: {solver: sgd, lr: 0.1, batch_size: 1}
fleet:
  groups:
    - {name: a, count: 1, speed: {dist: fixed, steps_per_s: 0.7},
       stragglers: {p: 0.3, slowdown: {dist: uniform, low: 1, high: 3}}}
    - {name: b, count: 1, speed: {dist: fixed, steps_per_s: 1.3}}
    - {name: c, count: 1, speed: {dist: fixed, steps_per_s: 2.9},
       stragglers: {p: 0.3, slowdown: {dist: uniform, low: 1, high: 3}}}
    - {name: d, count: 1, speed: {dist: fixed, steps_per_s: 0.45}}
round: {policy: async, max_steps: 5, concurrency: 3, max_staleness: 4}
algorithm: {name: fedasync, alpha: 0.7, staleness: hinge, staleness_a: 2,
            staleness_b: 1}
selector: {name: uniform, clients_per_round: 3}
resources: {workers: 0}
"""


def metrics(rows):
    return [{k: v for k, v in r.items() if k not in WALL_CLOCK_COLUMNS} for r in rows]


def same_rows(a, b):
    assert len(a) == len(b)
    for ra, rb in zip(a, b, strict=True):
        assert ra.keys() == rb.keys()
        for k in ra:
            va, vb = ra[k], rb[k]
            if isinstance(va, float) and math.isnan(va):
                assert isinstance(vb, float) and math.isnan(vb), k
            else:
                assert va == vb, (k, va, vb)


def same_run(a, b):
    """Two runs' results alike: rows (wall-clock columns aside), client rows
    and the final model, bit for bit."""
    same_rows(metrics(a.rows), metrics(b.rows))
    same_rows(a.clients, b.clients)
    assert torch.equal(a.final_params, b.final_params)


def run_async(sc, workers=0, **kw):
    res = run_scenario(sc, workers=workers, **kw)
    assert res.status == "completed" and res.final_params is not None
    return metrics(res.rows), res.clients, res.final_params


# ------------------------------------------------------- FedBuff == FedAvg
def test_fedbuff_with_k_equal_to_the_fleet_is_synchronous_fedavg():
    # Prepare: the same scenario, synchronous FedAvg and async FedBuff(K = 5)
    sync = parse_scenario(IDENTICAL)
    asyn = parse_scenario(
        IDENTICAL,
        overrides=[
            "round={policy: async, max_steps: 7, concurrency: 5}",
            "algorithm={name: fedbuff, buffer_size: 5}",
        ],
    )

    # Execute
    sim = run_scenario(sync, workers=0)
    rows_s, clients_s = sim.rows, sim.clients
    rows_a, clients_a, x_a = run_async(asyn)

    # Assert: the same model after every version, bit for bit
    assert sim.final_params is not None
    torch.testing.assert_close(x_a, sim.final_params, rtol=0, atol=0)
    for rs, ra in zip(rows_s, rows_a, strict=True):
        for key in ("round", "test_loss", "test_accuracy", "train_loss", "tau_mean"):
            assert rs[key] == ra[key], key
        assert ra["staleness_max"] == 0 and ra["n_completed"] == 5
    assert [c["tau"] for c in clients_s] == [c["tau"] for c in clients_a]
    assert {c["staleness"] for c in clients_a} == {0}


def test_fedasync_without_concurrency_is_fedbuff_with_one_update_per_version():
    # One device at a time: every update is fresh (x_start = x), so mixing in
    # the client model with weight alpha is adding alpha * Delta.
    one = ["round.concurrency=1", "rounds=6"]
    fa = load_scenario(
        FEDASYNC, [*one, "algorithm={name: fedasync, alpha: 0.6, rho: 0}"]
    )
    fb = load_scenario(
        FEDASYNC, [*one, "algorithm={name: fedbuff, buffer_size: 1, server_lr: 0.6}"]
    )
    ra, _, xa = run_async(fa)
    rb, _, xb = run_async(fb)
    torch.testing.assert_close(xa, xb, rtol=1e-6, atol=1e-7)
    assert [r["staleness_max"] for r in ra] == [0] * 6
    assert [r["sim_time"] for r in ra] == [r["sim_time"] for r in rb]


# ------------------------------------ training starts from the start version
def replay(sc) -> list[float]:
    """Closed-form replay of the timeline: a client of F_i = 1/2 (x - e_i)^2
    doing tau gradient steps of size lr from x_start moves by
    Delta = (e_i - x_start) (1 - (1 - lr)^tau)."""
    alg = sc.algorithm
    e, lr = sc.data.centers, sc.client.lr
    xs = [sc.data.x0]
    for rec in async_timeline(sc):
        x = xs[rec.version]
        total = 0.0
        for a in rec.applied:
            start = xs[a.job.version]
            rho = getattr(alg, "rho", 0.0)  # FedAsync's proximal term
            contraction = 1 - (1 - lr * (1 + rho)) ** a.tau
            delta = (e[a.job.device] - start) / (1 + rho) * contraction
            s = staleness_weight(
                alg.staleness, a.staleness, alg.staleness_a, alg.staleness_b
            )
            if alg.name == "fedasync":
                total += alg.alpha * s * (start + delta - x)
            else:  # fedbuff, normalised: tau_eff = mean tau (SGD: ||a|| = tau)
                tau_eff = sum(b.tau for b in rec.applied) / len(rec.applied)
                total += alg.server_lr * s * delta * tau_eff / a.tau / len(rec.applied)
        xs.append(x + total)
    return xs


@pytest.mark.parametrize(
    "overrides",
    [
        [],
        ["algorithm={name: fedbuff, buffer_size: 2, normalize: true, server_lr: 0.8}"],
    ],
    ids=["fedasync-hinge", "fedbuff-normalized"],
)
def test_each_update_trains_from_the_version_its_device_downloaded(overrides):
    # Prepare
    sc = parse_scenario(QUADRATIC, overrides=overrides)

    # Execute
    sim = run_scenario(sc, workers=0)
    rows, clients = sim.rows, sim.clients
    expected = replay(sc)

    # Assert: the run had stale updates, and every version matches the replay
    assert any(c["staleness"] for c in clients if not c["dropped"])
    assert sim.final_params is not None
    assert float(sim.final_params[0]) == pytest.approx(expected[-1], rel=1e-12)
    assert len(rows) == sc.rounds


# ----------------------------------------------- batching and determinism
def test_results_do_not_depend_on_batching_and_repeat_bit_for_bit():
    sc = load_scenario(FEDBUFF, ["rounds=12"])
    a, ca, xa = run_async(sc)
    b, cb, xb = run_async(sc, max_lookahead=1)  # one version's jobs per call
    same_rows(a, b)
    same_rows(ca, cb)
    assert torch.equal(xa, xb)
    c, _, _ = run_async(load_scenario(FEDBUFF, ["rounds=12", "seed=1"]))
    assert [r["train_loss"] for r in a] != [r["train_loss"] for r in c]


# ----------------------------------------------------------- the records
def test_rows_and_client_rows_of_an_async_run(tmp_path):
    # Prepare: FedAsync with stragglers, availability and max_staleness
    sc = load_scenario(FEDASYNC, ["rounds=40", "round.max_staleness=3"])
    seen = []

    # Execute
    res = run_scenario(
        sc, workers=0, run_dir=tmp_path, on_round=lambda r, c: seen.append(r)
    )
    rows, clients = res.rows, res.clients

    # Assert: one row per version, written with the async schemas
    assert [r["round"] for r in rows] == list(range(40)) == [r["round"] for r in seen]
    assert pq.read_schema(tmp_path / "rounds.parquet").equals(ASYNC_ROUND_SCHEMA)
    assert pq.read_schema(tmp_path / "clients.parquet").equals(ASYNC_CLIENT_SCHEMA)
    assert pq.read_table(tmp_path / "clients.parquet").num_rows == len(clients)
    times = [r["sim_time"] for r in rows]
    assert times == sorted(times)
    applied = [c for c in clients if not c["dropped"]]
    stale = [c for c in clients if c["drop_reason"] == "stale"]
    assert len(applied) == 40 and stale
    for c in applied:
        assert c["staleness"] == c["version_applied"] - c["version_started"] <= 3
        assert c["t_start"] <= c["t_arrive"] <= rows[c["round"]]["sim_time"]
        assert c["weight"] == 1.0 and np.isfinite(c["update_norm"])
    for c in stale:
        assert c["staleness"] > 3 and c["version_applied"] is None
        assert c["bytes_up"] == applied[0]["bytes_up"] > 0  # uploaded, then dropped
    for r in rows:
        mine = [c for c in clients if c["round"] == r["round"]]
        assert len(mine) == r["n_selected"] == r["n_completed"] + r["n_dropped"]


# ------------------------------------------------------------- resume
class _Stop(Exception):
    pass


def _stop_after(version):
    def on_round(row, clients):
        if row["round"] == version:
            raise _Stop

    return on_round


@pytest.mark.parametrize(
    ("scenario", "stop_at"), [(FEDBUFF, 39), (FEDASYNC, 39), (FEDASYNC, 20)]
)
def test_a_resumed_run_equals_an_uninterrupted_one(tmp_path, scenario, stop_at):
    # Prepare: the uninterrupted reference, and a run stopped after version
    # stop_at with checkpoints every 7 versions (so jobs trained ahead of the
    # checkpoint are lost and must be trained again)
    sc = load_scenario(scenario, ["rounds=60", "checkpoint.every_rounds=7"])
    ref_rows, ref_clients, ref_x = run_async(sc)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    with pytest.raises(_Stop):
        run_scenario(sc, run_dir=run_dir, on_round=_stop_after(stop_at))
    latest = (run_dir / "LATEST").read_text().strip()
    assert latest == f"ckpt-{stop_at - stop_at % 7:08d}"  # row stop_at raised
    # jobs in flight started from several older versions: all were saved
    assert len(list((run_dir / latest).glob("payload-*.pt"))) > 2

    # Execute
    rows, clients, x = run_async(sc, run_dir=run_dir, resume=True)

    # Assert: identical rows (read back from disk, too) and model
    same_rows(rows, ref_rows)
    same_rows(clients, ref_clients)
    assert torch.equal(x, ref_x)
    same_rows(metrics(pq.read_table(run_dir / "rounds.parquet").to_pylist()), ref_rows)
    assert pq.read_table(run_dir / "clients.parquet").num_rows == len(ref_clients)


def test_resume_rejects_a_checkpoint_of_another_run(tmp_path):
    sc = load_scenario(FEDBUFF, ["rounds=14", "checkpoint.every_rounds=7"])
    run_async(sc, run_dir=tmp_path)
    shorter = load_scenario(FEDBUFF, ["rounds=10"])
    with pytest.raises(CheckpointError, match="not in this run"):
        run_scenario(shorter, run_dir=tmp_path, resume=True)
    with pytest.raises(CheckpointError, match="no checkpoint"):
        run_scenario(sc, run_dir=tmp_path / "empty", resume=True)


def test_async_policy_needs_an_async_rule_and_a_result_free_selector():
    # Per-client state (SCAFFOLD) is refused the same way: no async rule has it.
    for alg in ("fedavg", "scaffold"):
        with pytest.raises(ScenarioError, match="asynchronous server rule"):
            load_scenario(FEDBUFF, [f"algorithm={{name: {alg}}}"])
    for sel in ("fedpns",):  # power_of_choice and oort work async
        with pytest.raises(ScenarioError, match=f"selector.name: '{sel}'.*async"):
            load_scenario(FEDBUFF, [f"selector={{name: {sel}, clients_per_round: 4}}"])


@pytest.mark.ray
def test_one_and_two_ray_workers_match_the_in_process_run(ray_session):
    sc = load_scenario(FEDBUFF, ["rounds=8"])
    one, c1, x1 = run_async(sc, workers=1)
    two, c2, x2 = run_async(sc, workers=2)
    local, c0, x0 = run_async(sc, workers=0)
    same_rows(one, two)
    same_rows(c1, c2)
    same_rows(one, local)
    same_rows(c1, c0)
    assert torch.equal(x1, x2) and torch.equal(x0, x1)
    assert any(r["staleness_max"] > 0 for r in one)


@pytest.mark.ray
def test_a_run_resumed_on_ray_workers_equals_the_in_process_run(ray_session, tmp_path):
    sc = load_scenario(FEDBUFF, ["rounds=30", "checkpoint.every_rounds=10"])
    ref, ref_clients, ref_x = run_async(sc)
    tmp_path.mkdir(exist_ok=True)
    with pytest.raises(_Stop):
        run_scenario(sc, workers=2, run_dir=tmp_path, on_round=_stop_after(14))
    rows, clients, x = run_async(sc, workers=2, run_dir=tmp_path, resume=True)
    same_rows(rows, ref)
    same_rows(clients, ref_clients)
    assert torch.equal(x, ref_x)
