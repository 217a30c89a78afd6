"""The contract every registered algorithm keeps (STYLE.md habit 9).

Parametrized over every entry of ``REGISTRY``, so a new algorithm is checked
as soon as it is registered: :func:`fedsim.testing.check_algorithm` (the
public contract a plug-in's own tests call too: pickling, identical updates
give a known result, state kept finite with its keys, shapes and dtypes, an
empty round changes nothing, ...), and here also: the ``algorithm:`` section
of a scenario builds it, and a short in-process simulation runs its client
hooks end-to-end.

A new algorithm needs an ``IDENTICAL`` entry (or a ``NOT_DELTA`` reason when
its clients upload something else than a delta).
"""

from __future__ import annotations

import math
import pickle
import re
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch

from fedsim.algorithms import REGISTRY, Algorithm
from fedsim.algorithms.base import (
    PLAIN_ROUND,
    ClientUpdate,
    RoundContext,
    meter,
    outdated_form,
)
from fedsim.runtime import RunResult, run_scenario
from fedsim.scenario import ScenarioError, load_scenario
from fedsim.testing import M, check_algorithm

from .conftest import SCENARIOS

TINY = SCENARIOS / "ci" / "tiny-synthetic.yaml"
NAMES = sorted(REGISTRY)


# What n identical updates (delta, equal weights, equal steps) from zero state
# give, per algorithm: x0 -> expected new x.
Expected = Callable[[Algorithm, torch.Tensor, torch.Tensor, int], torch.Tensor]


def _back(alg, x0, delta, n):  # FedAvg-like: the update itself
    return x0 + delta


def _dyn(alg, x0, delta, n):
    # mean theta_i^+ plus the mean over all m clients of hist_i = delta
    return x0 + delta + (n / M) * delta


def _adam(alg, x0, delta, n):
    d = delta.double()
    m = (1 - alg.beta1) * d
    v = alg.beta2 * alg.adaptivity**2 + (1 - alg.beta2) * d**2
    return (x0.double() + alg.server_lr * m / (v.sqrt() + alg.adaptivity)).float()


def _mix(alg, x0, delta, n):  # FedAsync: x <- (1 - alpha) x + alpha (x + delta)
    return x0 + alg.alpha * delta


IDENTICAL: dict[str, Expected] = {
    "fedavg": _back,
    "fedprox": _back,
    "fednova": _back,
    "fednova_vr": _back,
    "scaffold": _back,
    "fedavgm": _back,
    "feddyn": _dyn,
    "feddc": _dyn,
    "fedadam": _adam,
    "fedasync": _mix,
    "fedbuff": _back,  # a synchronous round is one fresh buffer
    "fedpns": _back,  # identical gradients: nothing is ever labeled
    "flower": _back,  # its default strategy is Flower's FedAvg
}

# Algorithms whose clients upload something other than a model delta: the
# delta-based checks below do not apply to them (their own tests cover it).
NOT_DELTA = {"feddm": "uploads a synthetic dataset, not a model delta"}

# Hyperparameters for the end-to-end run where the defaults do not suit a
# 6-client logistic regression on unnormalised features: FedDM's image_lr = 1
# (its CIFAR default) makes the synthetic set blow up to NaN here.
TINY_ARGS = {
    "fedpns": "check_loss_data: test",
    "feddm": "iterations: 5, server_epochs: 2, ipc: 2, dc_batch_size: 16, "
    "image_lr: 0.01",
}


def test_every_algorithm_has_a_contract_entry():
    assert set(IDENTICAL) | set(NOT_DELTA) == set(REGISTRY)
    assert not set(IDENTICAL) & set(NOT_DELTA)


@pytest.mark.parametrize("name", NAMES)
def test_name_field_matches_the_registry_key(name):
    assert REGISTRY[name]().name == name


@pytest.mark.parametrize("name", NAMES)
def test_the_algorithm_keeps_the_contract(name):
    check_algorithm(
        REGISTRY[name](),
        identical=IDENTICAL.get(name),
        uploads_delta=name not in NOT_DELTA,
    )


def test_the_contract_catches_a_wrong_result():
    # FedAvg's update is not FedAsync's mixing: the identical-updates check fails
    with pytest.raises(AssertionError):
        check_algorithm(REGISTRY["fedavg"](), identical=_mix_half)


def _mix_half(alg, x0, delta, n):
    return x0 + 0.5 * delta


@pytest.mark.parametrize("name", NAMES)
def test_scenario_section_builds_it_and_a_short_run_works(name):
    args = f", {TINY_ARGS[name]}" if name in TINY_ARGS else ""
    sc = load_scenario(TINY, [f"algorithm={{name: {name}{args}}}", "rounds=3"])
    assert type(sc.algorithm) is REGISTRY[name]
    assert pickle.loads(pickle.dumps(sc.algorithm)) == sc.algorithm
    sim = run_scenario(sc, workers=0)
    rows, clients = sim.rows, sim.clients
    assert len(rows) == 3
    assert all(math.isfinite(r["train_loss"]) for r in rows)
    assert math.isfinite(rows[-1]["test_loss"])
    assert sim.final_params is not None and bool(torch.isfinite(sim.final_params).all())
    done = [c for c in clients if not c["dropped"]]
    assert all(c["weight"] >= 0 for c in done)  # FedPNS gives removed updates 0
    for r in range(3):
        w = sum(c["weight"] for c in done if c["round"] == r)
        assert w == pytest.approx(1.0)
    per_client = sc.algorithm.down_factor
    assert {c["bytes_down"] for c in clients} == {per_client * 4 * sim_num_params(sim)}


def sim_num_params(sim: RunResult) -> int:
    assert sim.final_params is not None
    return int(sim.final_params.numel())


# ------------------------------------------------- the server seam (issue 38)
@dataclass(frozen=True)
class _Recorder(Algorithm):
    """Records what ``aggregate`` received (the one signature)."""

    def aggregate(self, state, updates, ctx=PLAIN_ROUND):
        _SEEN.append(([u.client for u in updates], ctx))
        return state, meter(updates, [1.0] * len(updates), 1.0)


@dataclass(frozen=True)
class _TwoArgs(Algorithm):  # written before the context existed
    def aggregate(self, state, updates):
        return state, meter(updates, [1.0] * len(updates), 1.0)


@dataclass(frozen=True)
class _ServerKw(Algorithm):  # the server= keyword of an earlier fedsim
    def aggregate(self, state, updates, server=None):
        return state, meter(updates, [1.0] * len(updates), 1.0)


@dataclass(frozen=True)
class _OldFlag(_Recorder):  # the flag server_needs replaced
    needs_server = True


_SEEN: list = []


def _up(client: int) -> ClientUpdate:
    return ClientUpdate(client, torch.ones(2), 1.0, 1, 1.0, 0.0)


@pytest.mark.parametrize(
    ("cls", "what"),
    [
        ("_TwoArgs", r"_TwoArgs\.aggregate\(self, state, updates\) is an older form"),
        ("_ServerKw", r"aggregate\(self, state, updates, server\) is an older"),
        ("_OldFlag", r"_OldFlag\.needs_server is no longer read"),
    ],
)
def test_an_older_form_of_the_interface_is_refused_in_one_line(cls, what):
    # Prepare: a plug-in written for an earlier fedsim, named in a scenario
    over = f"algorithm={{name: 'tests.test_contract:{cls}'}}"
    # Execute
    with pytest.raises(ScenarioError) as err:
        load_scenario(TINY, [over])
    # Assert: one line naming the old form and the one that replaced it
    line = str(err.value).splitlines()[-1]
    assert re.search(what, line), line
    assert "define aggregate(self, state, updates, ctx)" in line


def test_the_one_form_reaches_aggregate_with_the_context():
    # Prepare
    state, ups = {"x": torch.zeros(2)}, [_up(0), _up(1)]
    ctx = RoundContext(1, (0, 2), (state["x"], state["x"]))
    _SEEN.clear()
    # Execute
    _Recorder().server_step(state, ups, ctx)
    # Assert: the context as given; no server asked for
    assert _SEEN.pop() == ([0, 1], ctx) and not _Recorder().wants_server
    assert outdated_form(_Recorder) is None
    assert [n for n, c in REGISTRY.items() if outdated_form(c)] == []


def test_a_removed_name_says_what_replaced_it():
    # Execute / Assert: importing a name of an earlier fedsim stops with the
    # line naming its replacement, not Python's bare "cannot import name"
    with pytest.raises(ImportError, match=r"ScenarioView was removed: use RunFacts"):
        from fedsim.api import ScenarioView  # noqa: F401
    with pytest.raises(ImportError, match=r"MODELS\['mlp'\]\(hidden=\[7\]\)"):
        from fedsim.models import ModelSpec  # noqa: F401
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        import fedsim.api

        _ = fedsim.api.Nope
