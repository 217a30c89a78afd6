"""The one runtime: both modes share the selector, the bytes rule, the
divergence handling, compare and stress (each of these drifted between the
synchronous and the asynchronous copies of the loop before they were one)."""

from __future__ import annotations

import math

import numpy as np
import pyarrow.parquet as pq
import pytest

from fedsim.compare import compare
from fedsim.runtime import run_scenario
from fedsim.scenario import load_scenario
from fedsim.stress import run_stress

from .conftest import SCENARIOS

FEDBUFF = SCENARIOS / "async-fedbuff.yaml"
QUICK = SCENARIOS / "quickstart.yaml"


def jobs_per_client(clients: list[dict]) -> np.ndarray:
    counts = np.zeros(30, dtype=np.int64)
    for c in clients:
        counts[c["client_id"]] += 1
    return counts


# ------------------------------------------------- the selector, async too
def test_the_selector_decides_which_device_starts_an_async_job():
    # Prepare: always-online devices and very uneven data shares, so a
    # data-weighted selector must favour the big clients
    base = [
        "rounds=40",
        "data.size_sigma=2.0",
        "fleet.groups[0].availability={kind: always}",
    ]
    uniform = load_scenario(FEDBUFF, base)
    weighted = load_scenario(
        FEDBUFF, [*base, "selector={name: weighted, clients_per_round: 15}"]
    )

    # Execute
    ru = run_scenario(uniform)
    rw = run_scenario(weighted)

    # Assert: with the weighted selector the big clients start more jobs
    # (a selector that was ignored would give identical runs)
    assert [c["client_id"] for c in ru.clients] != [c["client_id"] for c in rw.clients]
    n = ru.data.n_samples
    big = np.argsort(-n)[:5]
    assert (
        jobs_per_client(rw.clients)[big].sum() > jobs_per_client(ru.clients)[big].sum()
    )


def test_the_uniform_selector_keeps_the_timelines_own_uniform_stream():
    # The uniform selector, asked through the chooser, reproduces the
    # timeline's default choice (pinned by tests/data/clock_golden.json).
    from fedsim.clock import AsyncTimeline
    from fedsim.runtime import _Run, async_timeline

    sc = load_scenario(FEDBUFF, ["rounds=25"])
    run = _Run.plan_only(sc)
    plain = AsyncTimeline(
        run.fleet,
        sc.round,
        versions=sc.rounds,
        buffer_size=sc.algorithm.buffer_size,
        concurrency=sc.round.concurrency,
        seed=sc.seed,
        bytes_down=run.bytes_down,
        bytes_up=run.bytes_up,
        n_samples=run.data.n_samples,
        batch_size=sc.client.batch_size,
    )
    assert list(async_timeline(sc)) == list(plain)


# ------------------------------------------------------------ bytes
def test_sync_bills_the_upload_of_late_updates_and_not_of_dropouts():
    # Prepare: a deadline that some devices miss, and mid-round dropouts
    sc = load_scenario(
        SCENARIOS / "fleets" / "edge-boxes.yaml",
        ["rounds=6", "round.deadline_s=40", "fleet.groups[0].stragglers.dropout_p=0.3"],
    )

    # Execute
    clients = run_scenario(sc).clients

    # Assert
    full = max(c["bytes_up"] for c in clients)
    by_reason: dict[str, set[int]] = {}
    for c in clients:
        by_reason.setdefault(c["drop_reason"], set()).add(c["bytes_up"])
    assert by_reason[""] == {full} and full > 0
    assert by_reason["late"] == {full}  # it was sent; the server had stopped
    assert by_reason["dropout"] == {0}  # it never finished uploading


def test_async_bills_stale_uploads_and_not_dropouts():
    sc = load_scenario(
        FEDBUFF,
        [
            "rounds=60",
            "round.max_staleness=2",
            "fleet.groups[1].stragglers.dropout_p=0.3",
        ],
    )
    clients = run_scenario(sc).clients
    full = max(c["bytes_up"] for c in clients)
    by_reason: dict[str, set[int]] = {}
    for c in clients:
        by_reason.setdefault(c["drop_reason"], set()).add(c["bytes_up"])
    assert by_reason[""] == {full} and by_reason["stale"] == {full}
    assert by_reason["dropout"] == {0}
    assert by_reason.get("offline", {0}) == {0}


# ------------------------------------------------------- divergence
@pytest.mark.parametrize("scenario", [QUICK, FEDBUFF], ids=["sync", "async"])
def test_a_diverging_run_returns_its_rows_and_says_where(scenario):
    sc = load_scenario(scenario, ["rounds=20", "client.lr=1e37"])
    res = run_scenario(sc)
    assert res.status == "diverged" and res.final_params is None
    assert ("round" if scenario == QUICK else "version") in res.message
    assert len(res.rows) < 20


def test_stress_records_a_diverging_async_run(tmp_path):
    out = run_stress(
        FEDBUFF,
        {"client.lr": [0.05, 1e37]},
        ["fedbuff"],
        seeds=1,
        out_dir=tmp_path,
        workers=0,
        overrides=["rounds=6"],
    )
    table = pq.read_table(out / "stress.parquet").to_pylist()
    assert [r["diverged"] for r in table] == [False, True]
    assert {r["mode"] for r in table} == {"async"}


def test_compare_runs_an_async_scenario(tmp_path):
    rows = compare(
        FEDBUFF,
        ["fedbuff", "fedasync:alpha=0.5"],
        seeds=1,
        overrides=["rounds=4"],
        out_dir=tmp_path,
    )
    assert [r["algorithm"] for r in rows] == ["fedbuff", "fedasync:alpha=0.5"]
    assert {r["mode"] for r in rows} == {"async"}
    runs = pq.read_table(tmp_path / "compare.parquet").to_pylist()
    assert all(math.isfinite(r["final_accuracy"]) for r in runs)
    assert "(async)" in (tmp_path / "compare.md").read_text()


def test_compare_moves_an_async_rule_to_the_async_timeline_and_refuses_twins():
    rows = compare(QUICK, ["fedavg", "fedbuff"], seeds=1, overrides=["rounds=2"])
    assert [r["mode"] for r in rows] == ["sync", "async"]
    with pytest.raises(ValueError, match="fedavg given twice"):
        compare(QUICK, ["fedavg", "fedavg"], seeds=1, overrides=["rounds=2"])
