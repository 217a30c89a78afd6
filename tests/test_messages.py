"""What the user reads is true and valid: summary.json is JSON (no NaN),
plug-in references say what they hold, refusals name their field once and
offer the closest known name, and nothing says "interrupted" twice."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from fedsim.results import write_summary
from fedsim.scenario import ScenarioError, load_scenario
from fedsim.tools.compare import canonical_label

from .conftest import SCENARIOS


def _strict(text: str) -> object:
    """json.loads refusing NaN and infinities, as any other JSON reader does."""

    def refuse(name: str) -> object:
        raise ValueError(f"not JSON: {name}")

    return json.loads(text, parse_constant=refuse)


def test_summary_json_writes_null_for_a_mean_that_has_no_value(tmp_path):
    # Prepare: a device group never selected has no mean (NaN), at depth
    summary = {
        "final_accuracy": 0.5,
        "groups": {"phones": {"mean_tau": math.nan}, "laptops": {"mean_tau": 3.0}},
        "curve": [1.0, np.float64("nan"), math.inf],
    }

    # Execute
    write_summary(tmp_path / "summary.json", summary)

    # Assert: valid JSON, every other value as it was
    read = _strict((tmp_path / "summary.json").read_text())
    assert read == {
        "final_accuracy": 0.5,
        "groups": {"phones": {"mean_tau": None}, "laptops": {"mean_tau": 3.0}},
        "curve": [1.0, None, None],
    }


# ------------------------------------------------- refusals that help
TINY = SCENARIOS / "ci" / "tiny-synthetic.yaml"


def _refusal(*overrides: str) -> str:
    with pytest.raises(ScenarioError) as info:
        load_scenario(TINY, list(overrides))
    return str(info.value)


@pytest.mark.parametrize(
    ("override", "hint"),
    [
        ("algorithm.name=fedprx", "unknown name 'fedprx' (did you mean 'fedprox'"),
        ("selector.name=unifrom", "unknown name 'unifrom' (did you mean 'uniform'?"),
        ("model.name=mpl", "unknown name 'mpl' (did you mean 'mlp'?"),
        ("data.dataset=synthetc", "unknown name 'synthetc' (did you mean 'synthetic'"),
        ("roudns=3", "roudns: unknown key (did you mean 'rounds'"),
        ("client.lrr=0.1", "client.lrr: unknown key (did you mean 'lr'?"),
        ("algorithm={name: fedprox, muu: 0.1}",
         "algorithm.muu: unknown key (did you mean 'mu'?"),
        ("fleet.groups[0].speed.sigmaa=1",
         "speed.sigmaa: unknown key (did you mean 'sigma'?"),
    ],
)  # fmt: skip
def test_a_mistyped_name_or_field_is_offered_the_closest_known_one(override, hint):
    assert hint in _refusal(override)


def test_an_unknown_key_far_from_any_is_offered_nothing():
    said = _refusal("client.zzzzzz=1")
    assert "client.zzzzzz: unknown key (check the spelling" in said


def test_a_cross_field_refusal_names_its_field_once():
    said = _refusal("selector={name: bernoulli, q: 1e-300, clients_per_round: 3}")
    assert "  selector.q: 1e-300 with 6 clients: a round would draw" in said
    assert "selector.q: selector.q" not in said


def test_instruct_under_async_rounds_names_the_policies_there_are():
    said = _refusal(
        "round={policy: async, concurrency: 2}",
        "algorithm={name: 'tests.hook_plugins:Echo'}",
    )
    assert "(use fixed_epochs or fixed_window)" in said and "use sync" not in said


def test_a_plugin_of_the_wrong_kind_is_named_as_users_import_its_base():
    said = _refusal("algorithm.name=tests.hook_plugins:Twice")
    assert "not a subclass of fedsim.api.Algorithm (an algorithm plug-in" in said


@pytest.mark.parametrize(
    ("label", "said"),
    [
        ("fedprox:mu=0.1,mu=0.2",
         "algorithm 'fedprox:mu=0.1,mu=0.2': 'mu' is given twice"),
        ("tests.hook_plugins:Echo?x=1,x=2", "'x' is given twice"),
        ("tests.hook_plugins:Echo:x=1",
         "an import path's settings follow '?', as in tests.hook_plugins:Echo?x=1"),
    ],
)  # fmt: skip
def test_an_algorithm_label_keeps_no_setting_silently(label, said):
    with pytest.raises(ScenarioError) as info:
        canonical_label(label)
    assert said in str(info.value)
