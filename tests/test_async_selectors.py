"""Adaptive selectors (power-of-choice, Oort) in asynchronous mode.

They observe each server version's applied updates when the server applies
them, and every choice of which idle device takes a free slot sees exactly
the versions applied before it:

- the timeline hands out the slots freed when a version is made only after
  that version was yielded (the chooser can see it applied);
- power-of-choice really picks the highest last-seen losses, and the losses
  it sees are those clients.parquet holds for the versions before the choice;
- the results do not depend on ``max_lookahead``, survive a stop and resume,
  and are the same on Ray workers;
- FedPNS, which needs a synchronous round's full result, is refused.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from fedsim import clock
from fedsim.runtime import _Run, run_scenario
from fedsim.scenario import ScenarioError, load_scenario
from fedsim.selectors import PowerOfChoice

from .test_async_sim import FEDBUFF, _Stop, _stop_after, run_async, same_rows


def fedbuff(selector: str, *more: str, rounds: int = 12):
    """The async FedBuff scenario (30 phones, 15 slots) with ``selector``."""
    return load_scenario(
        FEDBUFF,
        [f"rounds={rounds}", f"selector={selector}", "round.concurrency=15", *more],
    )


POC = "{name: power_of_choice, clients_per_round: 5}"
OORT = "{name: oort, clients_per_round: 5}"


def started_jobs(clients):
    return [(c["client_id"], c["job"], c["version_started"]) for c in clients]


# ------------------------------------------------------------ the timeline
def test_the_chooser_runs_only_after_every_version_made_was_yielded():
    # Prepare: the uniform async timeline of FedBuff, and a chooser that
    # notes how many versions were made and yielded when it is called
    sc = fedbuff("{name: uniform, clients_per_round: 5}", rounds=15)
    run = _Run(sc, None, None)
    yielded = 0
    calls: list[tuple[int, int]] = []
    uniform = clock.uniform_choice(sc.seed)

    def choose(candidates, free, n):
        calls.append((tl.version, yielded))
        return uniform(candidates, free, n)

    tl = clock.AsyncTimeline(
        run.fleet,
        sc.round,
        versions=sc.rounds,
        buffer_size=sc.algorithm.buffer_size,
        concurrency=15,
        seed=sc.seed,
        ctx=run.ctx,
        choose=choose,
    )

    # Execute
    for _ in tl:
        yielded += 1

    # Assert: choices at many versions, each after all versions made so far
    # were handed out
    assert len({v for v, _ in calls}) > 5
    assert all(made == seen for made, seen in calls)


# --------------------------------------------------- the selector is used
@pytest.fixture
def poc_calls(monkeypatch):
    """Every PowerOfChoice.select call: (state, draw, picked ids)."""
    calls = []
    select = PowerOfChoice.select

    def spy(self, state, draw):
        ids, new = select(self, state, draw)
        calls.append((state, draw, ids))
        return ids, new

    monkeypatch.setattr(PowerOfChoice, "select", spy)
    return calls


def test_power_of_choice_picks_the_highest_losses_applied_before_the_choice(
    tmp_path, poc_calls
):
    # Prepare: d = 30 per free slot, so every candidate is in the pool and
    # the pick is the free highest last-seen losses (unseen: +inf)
    sc = fedbuff("{name: power_of_choice, clients_per_round: 1, candidates: 30}")

    # Execute
    res = run_scenario(sc, run_dir=tmp_path)

    # Assert
    assert res.status == "completed"
    clients = pq.read_table(tmp_path / "clients.parquet").to_pylist()
    applied = [c for c in clients if c["version_applied"] is not None]
    assert len(poc_calls) > 10
    jobs: Counter[int] = Counter()
    version_of = {(c["client_id"], c["job"]): c["version_started"] for c in clients}
    for state, draw, ids in poc_calls:
        # what it knew: the last loss of each client applied before draw.round
        known: dict[int, float] = {}
        for c in applied:
            if c["version_applied"] < draw.round and math.isfinite(c["train_loss"]):
                known[c["client_id"]] = c["train_loss"]
        assert dict(zip(state["ids"], state["loss"], strict=True)) == known
        # what it picked: no candidate left out had a higher loss
        loss = {int(i): known.get(int(i), math.inf) for i in draw.candidates}
        left = [loss[i] for i in loss if i not in set(ids.tolist())]
        assert min(loss[int(i)] for i in ids) >= max(left, default=-math.inf)
        # the picked devices started their jobs from version draw.round
        for i in ids.tolist():
            key = (i, jobs[i])
            jobs[i] += 1
            assert version_of.get(key, draw.round) == draw.round
    # some choices were greedy between seen clients, not only "unseen first"
    assert any(all(int(i) in s["ids"] for i in d.candidates) for s, d, _ in poc_calls)


@pytest.mark.parametrize("selector", [POC, OORT])
def test_adaptive_selectors_run_async_and_choose_unlike_uniform(selector):
    # Prepare
    sc = fedbuff(selector)
    uniform = fedbuff("{name: uniform, clients_per_round: 5}")

    # Execute
    rows, clients, _ = run_async(sc)
    _, uniform_clients, _ = run_async(uniform)

    # Assert: every version made, from other devices than uniform's
    assert [r["round"] for r in rows] == list(range(12))
    assert started_jobs(clients) != started_jobs(uniform_clients)


@pytest.mark.parametrize("selector", [POC, OORT])
def test_adaptive_results_do_not_depend_on_the_lookahead(selector):
    sc = fedbuff(selector)
    a, ca, xa = run_async(sc, max_lookahead=1)
    b, cb, xb = run_async(sc, max_lookahead=8)
    same_rows(a, b)
    same_rows(ca, cb)
    assert torch.equal(xa, xb)


# ------------------------------------------------------------------ resume
@pytest.mark.parametrize("selector", [POC, OORT])
def test_a_resumed_adaptive_run_equals_an_uninterrupted_one(tmp_path, selector):
    # Prepare: the reference, and a run stopped after version 13 with a
    # checkpoint every 5 versions (the last one after version 9)
    sc = fedbuff(selector, "checkpoint.every_rounds=5", rounds=20)
    ref_rows, ref_clients, ref_x = run_async(sc)
    with pytest.raises(_Stop):
        run_scenario(sc, run_dir=tmp_path, on_round=_stop_after(13))
    assert (tmp_path / "LATEST").read_text().strip() == "ckpt-00000010"

    # Execute
    rows, clients, x = run_async(sc, run_dir=tmp_path, resume=True)

    # Assert
    same_rows(rows, ref_rows)
    same_rows(clients, ref_clients)
    assert torch.equal(x, ref_x)


# explore: the selector chooses in the driver, whatever trains; Ray workers
# against the in-process run are test_async_sim's (CI runs this after the
# suite when its budget allows)
@pytest.mark.explore
@pytest.mark.ray
def test_two_ray_workers_equal_the_in_process_run(ray_session):
    sc = fedbuff(POC, rounds=8)
    local, c0, x0 = run_async(sc, workers=0)
    two, c2, x2 = run_async(sc, workers=2)
    same_rows(local, two)
    same_rows(c0, c2)
    assert torch.equal(x0, x2)


# -------------------------------------------------------------- validation
def test_fedpns_is_refused_in_async_mode_naming_both_fields():
    with pytest.raises(ScenarioError) as err:
        fedbuff("{name: fedpns, clients_per_round: 4}")
    msg = str(err.value)
    assert "selector.name: 'fedpns'" in msg and "round.policy 'async'" in msg
    for name in ("power_of_choice", "oort"):
        assert fedbuff(f"{{name: {name}, clients_per_round: 4}}").selector.adaptive


def test_power_of_choice_keeps_its_candidates_ratio_for_free_slots():
    sel = PowerOfChoice(clients_per_round=4, candidates=6)
    assert sel.with_slots(1).d == 2  # ceil(1 * 6 / 4)
    assert sel.with_slots(3).d == 5  # ceil(3 * 6 / 4)
    assert PowerOfChoice(clients_per_round=4).with_slots(3).d == 6  # 2 k
    assert np.isclose(sel.with_slots(8).d, 12)


def test_over_selection_scales_power_of_choice_s_candidates():
    # Prepare: d = 3 candidates for k = 2; over-selection asks ceil(1.5 k) = 3
    # devices, so d grows to ceil(3 * 3 / 2) = 5 (the same d / k ratio); a
    # plain copy with clients_per_round = 3 kept d = 3 = k, and with d = 2
    # (below what was asked) failed mid-run
    from fedsim.runtime import run_scenario
    from fedsim.scenario import load_scenario
    from fedsim.selectors.power_of_choice import PowerOfChoice

    over = [
        "rounds=2",
        "selector={name: power_of_choice, clients_per_round: 2, candidates: 2}",
        "round={policy: fixed_epochs, epochs: 1, deadline_s: 1000, over_select: 1.5}",
    ]
    sc = load_scenario("scenarios/ci/tiny-synthetic.yaml", over)
    # Execute
    result = run_scenario(sc)
    # Assert
    assert result.status == "completed"
    assert [r["n_selected"] for r in result.rows] == [3, 3]
    assert (
        PowerOfChoice(clients_per_round=2, candidates=3).with_slots(3).candidates == 5
    )
