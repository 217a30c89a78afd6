"""Common random numbers: a device's behaviour in a synchronous round (its
slowdown, dropout, epochs, hence tau) is a function of (seed, device,
round) only, the same whichever selector chose it, whichever algorithm
trains, and after a resume (docs/fleets.md, "Common random numbers"; the
0 vs 2 Ray workers check is in tests/test_determinism.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest

from fedsim.runtime import run_scenario
from fedsim.scenario import load_scenario

from .conftest import SCENARIOS

QUICK = SCENARIOS / "quickstart.yaml"
# stragglers and dropouts in two groups, so most rounds have both
HARSH = [
    "rounds=8",
    "eval.every_rounds=4",
    "fleet.groups[0].stragglers.p=0.5",
    "fleet.groups[0].stragglers.dropout_p=0.3",
    "fleet.groups[1].stragglers.p=0.4",
    "fleet.groups[1].stragglers.dropout_p=0.3",
]
SELECTORS = {
    "uniform": "selector={name: uniform, clients_per_round: 10}",
    "power_of_choice": "selector={name: power_of_choice, clients_per_round: 10}",
    "oort": "selector={name: oort, clients_per_round: 10}",
}


def behaviour(clients: list[dict]) -> dict[tuple[int, int], tuple]:
    """(round, device) -> what the clock decided for it: its slowdown, tau,
    why it dropped, and how long after the round's start it arrived or left."""
    return {
        (c["round"], c["client_id"]): (
            c["slowdown"],
            c["tau"],
            c["drop_reason"],
            c["t_arrive"] - c["t_start"],
        )
        for c in clients
    }


def run(*overrides: str, **kw):
    return run_scenario(load_scenario(QUICK, [*HARSH, *overrides]), **kw)


@pytest.fixture(scope="module")
def by_selector() -> dict[str, Any]:
    """Each selector's plans (quickstart's FedNova), and uniform's last loss."""
    out: dict[str, Any] = {}
    for name, s in SELECTORS.items():
        res = run(s)
        out[name] = behaviour(res.clients)
        out[f"{name}_loss"] = res.rows[-1]["test_loss"]
    return out


def test_a_device_behaves_alike_whichever_selector_chose_it(by_selector):
    base = by_selector["uniform"]
    for name in ("power_of_choice", "oort"):
        other = by_selector[name]
        common = sorted(set(base) & set(other))
        # Assert: every (round, device) both runs selected did the same
        assert [base[k] for k in common] == [other[k] for k in common], name
        # ... and the check had teeth: both selections differ, and the
        # pairs they share include stragglers and dropouts
        assert set(base) != set(other), name
        assert sum(base[k][0] > 1 for k in common) >= 3, name
        assert sum(base[k][2] == "dropout" for k in common) >= 2, name


def test_a_device_behaves_alike_whichever_algorithm_trains(by_selector):
    # Execute: FedAvg, uniform selection (the scenario's own is FedNova)
    avg = run("algorithm={name: fedavg}")

    # Assert: identical plans, while the models differ
    assert behaviour(avg.clients) == by_selector["uniform"]
    assert avg.rows[-1]["test_loss"] != by_selector["uniform_loss"]


def test_a_resumed_run_draws_what_an_uninterrupted_one_does(by_selector, tmp_path):
    # Execute: oort (adaptive: its state is in the checkpoint) for 4 rounds,
    # then resumed to all 8
    ck = "checkpoint.every_rounds=4"
    run(SELECTORS["oort"], ck, "rounds=4", run_dir=tmp_path)
    resumed = run(SELECTORS["oort"], ck, run_dir=tmp_path, resume=True)

    # Assert: every round's plans as in the uninterrupted run
    assert behaviour(resumed.clients) == by_selector["oort"]
    written = pq.read_table(Path(tmp_path) / "clients.parquet").to_pylist()
    assert behaviour(written) == by_selector["oort"]
    assert {r for r, _ in behaviour(written)} == set(range(8))


def test_a_device_draws_anew_each_round():
    # Common random numbers key a device's draws by (seed, device, round):
    # the tests above only compare runs with each other, so draws keyed by
    # (seed, device) alone, the same every round, would pass them all.
    from fedsim.fleet import Fleet, FleetSpec

    # Prepare: 40 devices that straggle and drop out half the time
    spec = FleetSpec.model_validate({"groups": [{
        "name": "g", "count": 40, "speed": {"dist": "fixed", "steps_per_s": 1.0},
        "stragglers": {"p": 0.5, "dropout_p": 0.5,
                       "slowdown": {"dist": "uniform", "low": 2, "high": 3}},
    }]})  # fmt: skip
    fleet = Fleet.from_spec(spec, seed=0)
    ids = np.arange(40)

    # Execute: 200 rounds of every device
    draws = [fleet.round_draws(ids, t) for t in range(200)]
    slowed = np.array([fleet.draw_slowdowns(ids, d.slowdown) > 1 for d in draws])
    dropped = np.array(
        [np.isfinite(fleet.draw_dropouts(ids, d.dropout, 10.0)) for d in draws]
    )

    # Assert: each device straggles and drops out in about half the rounds
    # (200 Bernoulli(0.5) draws: sd 0.035), not in all of them or none
    for events in (slowed, dropped):
        share = events.mean(axis=0)
        assert share.min() > 0.3 and share.max() < 0.7, share
    # ... with a new factor each time it is slowed
    factors = np.array([fleet.draw_slowdowns(ids, d.slowdown) for d in draws])
    assert all(len(set(factors[slowed[:, i], i])) == slowed[:, i].sum() for i in ids)


def test_in_a_run_a_device_selected_again_behaves_anew(by_selector):
    # Prepare: each device's slowdowns over the rounds it was selected in
    # (the scenario's own run: 8 rounds of 10 of 30 devices)
    by_device: dict[int, list[float]] = {}
    for (_, device), (slowdown, *_) in sorted(by_selector["uniform"].items()):
        by_device.setdefault(device, []).append(slowdown)
    again = {d: s for d, s in by_device.items() if len(s) >= 2}

    # Assert: devices chosen in several rounds, of which several were slowed
    # in one round and not in another (a draw keyed without the round
    # would repeat each device's slowdown in every round it is chosen in)
    assert len(again) >= 10
    assert sum(len(set(s)) > 1 for s in again.values()) >= 5
