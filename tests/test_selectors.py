"""The contract every registered selector keeps, and each selector's behaviour.

Contract (parametrized over ``REGISTRY``, so a new selector is checked as
soon as it is registered): :func:`fedsim.testing.check_selector`, the public
contract a plug-in's tests call too (ids distinct, sorted, among the
candidates; every random choice from the generator given; the state survives
pickle and JSON and resumes identically; multiplicities and artifact rows
well formed); here also the ``selector`` section of a scenario builds it, it
works with an uninformed context unless it needs one, and a short simulation
runs with it.
"""

from __future__ import annotations

import inspect
import pickle
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

import fedsim.runtime
from fedsim.algorithms.base import AggregateInfo
from fedsim.runtime import run_scenario
from fedsim.scenario import load_scenario
from fedsim.selectors import REGISTRY, Draw, SelectorContext
from fedsim.selectors.oort import Oort
from fedsim.selectors.power_of_choice import PowerOfChoice
from fedsim.selectors.uniform import Uniform
from fedsim.selectors.weighted import Weighted
from fedsim.testing import check_selector

from .conftest import SCENARIOS

TINY = SCENARIOS / "ci" / "tiny-synthetic.yaml"
NAMES = sorted(REGISTRY)
K = 3
M = 8
CTX = SelectorContext.from_arrays(
    n_samples=[5, 1, 8, 2, 9, 3, 7, 4],
    speed=[1.0, 2.0, 0.5, 4.0, 1.0, 3.0, 0.25, 1.5],
    round_time_s=[10.0, 5.0, 20.0, 2.5, 10.0, 3.3, 40.0, 6.7],
)


@dataclass
class Stats:
    train_loss: float
    weight: float = 0.1
    flags: dict[str, Any] = field(default_factory=dict)


@dataclass
class Result:
    info: AggregateInfo
    clients: dict[int, Stats]


def draw(t: int, cand: np.ndarray, seed: int) -> Draw:
    """Round ``t``'s choice among ``cand``, from ``default_rng(seed)``, with CTX."""
    return Draw(t, cand, np.random.default_rng(seed), CTX)


@pytest.fixture(params=NAMES)
def sel(request):
    return REGISTRY[request.param](clients_per_round=K)


# ------------------------------------------------------------------ contract
def test_name_field_matches_the_registry_key(sel):
    assert REGISTRY[sel.name] is type(sel)


def test_selector_object_pickles(sel):
    again = pickle.loads(pickle.dumps(sel))
    assert again == sel and hash(again) == hash(sel)


def test_scenario_section_builds_it(sel):
    sc = load_scenario(TINY, [f"selector={{name: {sel.name}, clients_per_round: 2}}"])
    assert type(sc.selector) is type(sel) and sc.selector.clients_per_round == 2


def test_the_selector_keeps_the_contract(sel):
    check_selector(sel)


def test_an_uninformed_context_works_unless_real_weights_are_needed(sel):
    ctx = SelectorContext.uniform(M)
    if sel.needs_context:
        with pytest.raises(TypeError, match="SelectorContext"):
            sel.init(ctx)
    else:
        state = sel.init(ctx)
        ids, _ = sel.select(state, Draw(0, np.arange(M), np.random.default_rng(0), ctx))
        # a random count (Bernoulli): at least one, at most K
        assert len(ids) == K if type(sel).fixed_count else 1 <= len(ids) <= K


def test_a_short_simulation_runs_with_it(sel):
    sc = load_scenario(
        TINY, [f"selector={{name: {sel.name}, clients_per_round: 3}}", "rounds=3"]
    )
    res = run_scenario(sc, workers=0)
    rows = res.rows
    assert len(rows) == 3 and np.isfinite(rows[-1]["test_loss"])
    assert all(1 <= r["n_selected"] <= 3 for r in rows)


# ------------------------------------------------------------ the selectors
def test_uniform_is_uniform():
    sel = Uniform(clients_per_round=2)
    counts = np.zeros(M)
    for t in range(4000):
        ids, _ = sel.select({}, draw(t, np.arange(M), t))
        counts[ids] += 1
    np.testing.assert_allclose(counts / counts.sum(), 1 / M, atol=0.01)


def test_weighted_draws_proportionally_to_data_weights():
    sel = Weighted(clients_per_round=K)
    state = sel.init(CTX)
    draws = np.zeros(M)
    for t in range(4000):
        ids, state = sel.select(state, draw(t, np.arange(M), t))
        for i, k in sel.multiplicity(state, ids).items():
            draws[i] += k
    np.testing.assert_allclose(draws / draws.sum(), CTX.data_weights, atol=0.01)


def test_weighted_renormalises_over_online_devices():
    sel = Weighted(clients_per_round=20)
    ids, state = sel.select(sel.init(CTX), draw(0, np.array([1, 4]), 0))
    k = sel.multiplicity(state, ids)
    assert set(k) <= {1, 4} and sum(k.values()) == 20
    assert k.get(4, 0) > k.get(1, 0)  # p_4 = 9 p_1


def test_power_of_choice_takes_the_highest_losses():
    sel = PowerOfChoice(clients_per_round=2, candidates=M)
    state = {"ids": list(range(M)), "loss": [0.5, 0.1, 3.0, 0.2, 2.0, 0.3, 0.4, 0.6]}
    ids, _ = sel.select(state, draw(0, np.arange(M), 0))
    assert ids.tolist() == [2, 4]
    ids, _ = sel.select(state, draw(0, np.array([0, 1, 3]), 0))
    assert ids.tolist() == [0, 3]


def test_power_of_choice_tries_unseen_clients_first():
    sel = PowerOfChoice(clients_per_round=2, candidates=M)
    state = {"ids": [0, 1], "loss": [9.0, 9.0]}
    ids, _ = sel.select(state, draw(0, np.array([0, 1, 5]), 0))
    assert 5 in ids.tolist()


def test_power_of_choice_fills_with_zero_weight_clients_when_too_few_have_data():
    # Prepare: only clients 1 and 3 have data; 3 slots, d = 6
    ctx = SelectorContext.from_arrays([0, 2, 0, 5, 0, 0])
    sel = PowerOfChoice(clients_per_round=3, candidates=6)
    state = {"ids": [0, 1, 2, 3, 4, 5], "loss": [1.0] * 6}
    # Execute
    picks = [
        sel.select(state, Draw(t, np.arange(6), np.random.default_rng(t), ctx))[0]
        for t in range(50)
    ]
    # Assert: both clients with data every time, plus one zero-weight client
    assert all(len(ids) == 3 and {1, 3} <= set(ids.tolist()) for ids in picks)
    assert {int(i) for ids in picks for i in ids} - {1, 3} == {0, 2, 4, 5}


def test_power_of_choice_needs_d_at_least_k():
    with pytest.raises(Exception, match="candidates"):
        load_scenario(
            TINY,
            ["selector={name: power_of_choice, clients_per_round: 3, candidates: 2}"],
        )
    assert PowerOfChoice(clients_per_round=4).d == 8


def test_power_of_choice_remembers_the_last_loss():
    sel = PowerOfChoice(clients_per_round=1)
    state = sel.init(CTX)
    state = sel.observe(state, 0, Result(AggregateInfo({}, 1, 0), {3: Stats(1.5)}), CTX)
    state = sel.observe(state, 1, Result(AggregateInfo({}, 1, 0), {3: Stats(0.5)}), CTX)
    assert state == {"ids": [3], "loss": [0.5]}


def test_oort_penalises_slow_devices():
    # Prepare: all explored, equal utility, no exploration
    sel = Oort(clients_per_round=1, exploration=0.0, exploration_min=0.0, cutoff=0.0)
    state = {"ids": list(range(M)), "util": [1.0] * M, "last": [0] * M, "epsilon": 0.0}
    counts = np.zeros(M)
    # Execute
    for t in range(3000):
        ids, _ = sel.select(state, draw(5, np.arange(M), t))
        counts[ids] += 1
    # Assert: the slowest device (t = 40 s) far less often than the fastest
    assert counts[3] > 10 * counts[6]
    s = sel.scores(state, 5, np.arange(M), CTX)
    big_t = sel.preferred(CTX)
    for i in range(M):
        t_i = CTX.round_time_s[i]
        factor = (big_t / t_i) ** 2 if t_i > big_t else 1.0
        assert s[i] == pytest.approx(s[3] * factor)


def test_oort_explores_unseen_devices_and_decays_exploration():
    sel = Oort(clients_per_round=2, exploration=1.0, exploration_decay=0.5)
    state = {"ids": [0, 1], "util": [5.0, 5.0], "last": [0, 0], "epsilon": 1.0}
    ids, _ = sel.select(state, draw(1, np.arange(M), 0))
    assert not set(ids.tolist()) & {0, 1}
    state = sel.observe(state, 1, Result(AggregateInfo({}, 1, 0), {}), CTX)
    assert state["epsilon"] == 0.5
    state = sel.observe(state, 2, Result(AggregateInfo({}, 1, 0), {}), CTX)
    assert state["epsilon"] == pytest.approx(sel.exploration_min)


def test_oort_statistical_utility_is_samples_times_loss():
    sel = Oort(clients_per_round=1)
    state = sel.observe(
        sel.init(CTX), 4, Result(AggregateInfo({}, 1, 0), {2: Stats(0.5)}), CTX
    )
    assert state["ids"] == [2] and state["util"] == [8 * 0.5] and state["last"] == [4]


def test_selector_interface_is_the_same_for_every_selector():
    for cls in REGISTRY.values():
        assert list(inspect.signature(cls.select).parameters) == [
            "self",
            "state",
            "draw",
        ]
        params = list(inspect.signature(cls.observe).parameters)
        assert params == ["self", "state", "t", "result", "ctx"]


def test_draw_holds_int64_candidates():
    d = Draw(3, [4, 1], np.random.default_rng(0), CTX)
    assert d.candidates.dtype == np.int64 and d.candidates.tolist() == [4, 1]
    assert d.round == 3 and d.ctx is CTX


def test_weighted_multiplicities_reach_the_proportional_server():
    sc = load_scenario(
        TINY,
        [
            "selector={name: weighted, clients_per_round: 4}",
            "algorithm={name: fedavg, sampling: proportional}",
            "rounds=3",
        ],
    )
    sim = run_scenario(sc, workers=0)
    clients = sim.clients  # without multiplicities, sampling: proportional raises
    # replay the selector: FedAvg's effective weight is k_i tau_i / sum
    sel = sc.selector
    ctx = SelectorContext.from_arrays(sim.data.n_samples)
    state = sel.init(ctx)
    for t in range(3):
        rng = np.random.default_rng(
            np.random.SeedSequence([sc.seed, fedsim.runtime._SELECT_TAG, t])
        )
        ids, state = sel.select(state, Draw(t, np.arange(sc.num_clients), rng, ctx))
        k = sel.multiplicity(state, ids)
        done = [c for c in clients if c["round"] == t and not c["dropped"]]
        assert sorted(c["client_id"] for c in done) == ids.tolist()
        total = sum(k[c["client_id"]] * c["tau"] for c in done)
        for c in done:
            assert c["weight"] == pytest.approx(k[c["client_id"]] * c["tau"] / total)


# ------------------------------------------- through `fedsim run` (the server)
def cli_clients(tmp_path, overrides: list[str]) -> list[dict[str, Any]]:
    """clients.parquet of a ``fedsim run`` of tiny-synthetic."""
    import pyarrow.parquet as pq
    from typer.testing import CliRunner

    from fedsim.tools.cli import app

    args = ["run", str(TINY), "--workers", "0", "--out", str(tmp_path), "-q"]
    args += ["--no-report"]
    for o in overrides:
        args += ["--set", o]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return pq.read_table(tmp_path / "clients.parquet").to_pylist()


def test_power_of_choice_through_the_server_picks_the_highest_last_losses(tmp_path):
    # Prepare: d = all 6 clients (none goes offline), so the candidate set is
    # the whole fleet and the rule is deterministic once every client has a
    # loss: the 3 highest last-observed training losses.
    rounds = 7
    clients = cli_clients(
        tmp_path,
        [
            "selector={name: power_of_choice, clients_per_round: 3, candidates: 6}",
            f"rounds={rounds}",
        ],
    )

    # Execute: replay the rule from clients.parquet alone
    picked = [
        {c["client_id"] for c in clients if c["round"] == t} for t in range(rounds)
    ]
    last_loss: dict[int, float] = {}
    for t in range(rounds):
        if t >= 2:
            assert len(last_loss) == 6
            top = sorted(last_loss, key=lambda i: -last_loss[i])[:3]
            # Assert: exactly the 3 highest losses (uniform: 1 in 20 a round)
            assert picked[t] == set(top), (t, last_loss)
        for c in clients:
            if c["round"] == t and not c["dropped"]:
                last_loss[c["client_id"]] = c["train_loss"]

    # Assert: unseen clients (loss +inf) go first, so rounds 0 and 1 cover all
    assert picked[0] | picked[1] == set(range(6))


def test_oort_through_the_server_explores_fast_unseen_devices_first(tmp_path):
    # Prepare: 15 fast devices (100 steps/s) and 15 slow ones (1 step/s);
    # exploration 1 (kept by decay 1): every slot explores an unseen device
    # while there are any, drawn with probability proportional to 1/t_i.
    fleet = (
        "fleet={groups: ["
        "{name: fast, count: 15, speed: {dist: lognormal, median_steps_per_s: 100, "
        "sigma: 0.1}}, "
        "{name: slow, count: 15, speed: {dist: lognormal, median_steps_per_s: 1, "
        "sigma: 0.1}}]}"
    )
    clients = cli_clients(
        tmp_path,
        [
            fleet,
            "selector={name: oort, clients_per_round: 5, exploration: 1.0, "
            "exploration_decay: 1.0}",
            "rounds=6",
        ],
    )

    # Execute
    picked = [[c for c in clients if c["round"] == t] for t in range(6)]
    ids = [c["client_id"] for t in range(6) for c in picked[t]]
    first_15 = [c["device_group"] for t in range(3) for c in picked[t]]

    # Assert: 6 rounds of 5 distinct unseen devices cover the fleet (uniform
    # selection repeats a device almost surely) ...
    assert sorted(ids) == list(range(30))
    # ... fast devices first (measured 15 of 15; uniform: about 7.5)
    assert first_15.count("fast") >= 13, first_15
