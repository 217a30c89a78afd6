"""The speed section's typed forms (fedsim.fleet.speed): one form per law,
each with its own fields only; presets resolved into a form; a field of
another law refused in one line; every shipped scenario's dump unchanged."""

from __future__ import annotations

import hashlib
import json

import pytest
import yaml
from pydantic import ValidationError

from fedsim.checkpoint import fingerprint
from fedsim.fleet import (
    FixedSpeed,
    Fleet,
    FleetSpec,
    LognormalSpeed,
    MixtureSpeed,
    speed_spec,
)
from fedsim.scenario import ScenarioError, load_scenario, parse_scenario

from .conftest import SCENARIOS

TIER = {"share": 1, "median_steps_per_s": 1.0}


def problems(speed: dict) -> list[str]:
    """The problem lines a scenario file with this speed gets (group 0)."""
    raw = yaml.safe_load((SCENARIOS / "quickstart.yaml").read_text())
    raw["fleet"]["groups"][0]["speed"] = speed
    with pytest.raises(ScenarioError) as caught:
        parse_scenario(yaml.safe_dump(raw), "bad.yaml")
    head, *lines = str(caught.value).splitlines()
    assert head.startswith("bad.yaml: invalid scenario")
    return [line.strip() for line in lines]


@pytest.mark.parametrize(
    "fields, form, used, laws, per_flop",
    [
        ({"steps_per_s": 4}, FixedSpeed, "dist steps_per_s", [(4.0, 0.0)], False),
        ({"dist": "fixed", "flops_per_s": 2e9}, FixedSpeed, "dist flops_per_s",
         [(2e9, 0.0)], True),
        ({"dist": "lognormal", "median_steps_per_s": 2, "sigma": 0.5},
         LognormalSpeed, "dist median_steps_per_s sigma", [(2.0, 0.5)], False),
        ({"dist": "lognormal", "median_flops_per_s": 1e9}, LognormalSpeed,
         "dist median_flops_per_s sigma", [(1e9, 0.0)], True),
        ({"dist": "mixture", "tiers": [TIER, {**TIER, "sigma": 0.3}]}, MixtureSpeed,
         "dist tiers", [(1.0, 0.0), (1.0, 0.3)], False),
    ],
)  # fmt: skip
def test_each_form_validates_its_own_fields(fields, form, used, laws, per_flop):
    # Execute
    speed = speed_spec(**fields)

    # Assert: the law's form, what validate prints, its components, its unit
    assert type(speed) is form
    assert speed.used_fields == used
    assert speed.laws() == laws
    assert speed.per_flop is per_flop


@pytest.mark.parametrize(
    "speed, line",
    [
        ({"steps_per_s": 2, "sigma": 0.5},
         "fleet.groups[0].speed.sigma: goes with dist 'lognormal', not 'fixed' "
         "(got 0.5)"),
        ({"dist": "fixed", "steps_per_s": 2, "tiers": [TIER]},
         "fleet.groups[0].speed.tiers: goes with dist 'mixture', not 'fixed'"),
        ({"dist": "lognormal", "median_steps_per_s": 2, "steps_per_s": 3},
         "fleet.groups[0].speed.steps_per_s: goes with dist 'fixed', not "
         "'lognormal' (got 3)"),
        ({"dist": "mixture", "tiers": [TIER], "median_flops_per_s": 1e9},
         "fleet.groups[0].speed.median_flops_per_s: goes with dist 'lognormal', "
         "not 'mixture' (got 1000000000.0)"),
        ({"preset": "flash-phones", "sigma": 0.2},
         "fleet.groups[0].speed.sigma: goes with dist 'lognormal', not 'mixture' "
         "(got 0.2)"),
        ({"dist": "uniform", "steps_per_s": 2},
         "fleet.groups[0].speed.dist: Input should be 'fixed', 'lognormal' or "
         "'mixture' (got 'uniform')"),
        ({"dist": "mixture"}, "fleet.groups[0].speed.tiers: required field is missing"),
        ({"steps_per_s": 2, "sigmaa": 1},
         "fleet.groups[0].speed.sigmaa: unknown key (did you mean 'sigma'? check "
         "the spelling; see docs/scenarios.md)"),
        ({"preset": "flash-phones-mid", "dist": "fixed", "steps_per_s": 2},
         "fleet.groups[0].speed: preset 'flash-phones-mid' is a lognormal speed: "
         "leave dist out"),
    ],
)  # fmt: skip
def test_a_wrong_field_for_the_law_gets_one_line_naming_it(speed, line):
    # Execute / Assert: one problem, at the field, saying what is expected
    assert problems(speed) == [line]


def test_in_python_a_field_of_another_law_is_one_error_at_the_field():
    # Execute
    with pytest.raises(ValidationError) as caught:
        speed_spec(dist="fixed", steps_per_s=2.0, sigma=0.5)

    # Assert: not one error per form of the union, and no form name in loc
    (error,) = caught.value.errors()
    assert error["loc"] == ("sigma",) and error["type"] == "speed_law"
    assert caught.value.title == "speed"


@pytest.mark.parametrize(
    "fields",
    [
        {"steps_per_s": 2.0},
        {"dist": "lognormal", "median_flops_per_s": 1e9, "sigma": 0.4},
        {"dist": "mixture", "tiers": [TIER]},
        {"preset": "flash-phones-low", "scale": 2.0},
        {"preset": "flash-phones", "unit": "flops", "workload": "celeba-cnn"},
    ],
)
def test_a_dumped_speed_reads_back_as_itself(fields):
    # Prepare: the dump writes every law's fields, the others' empty
    speed = speed_spec(**fields)
    dumped = speed.model_dump(mode="json")
    assert set(dumped) > set(type(speed).model_fields)

    # Execute
    again = speed_spec(**dumped)

    # Assert
    assert again == speed and type(again) is type(speed)


def test_a_speed_dumps_as_the_one_model_of_every_law_did():
    # The scenario's dump (and so a run's fingerprint): every law's field in
    # this order, the other laws' at their old defaults
    assert list(FixedSpeed(steps_per_s=4.0).model_dump().items()) == [
        ("dist", "fixed"), ("steps_per_s", 4.0), ("median_steps_per_s", None),
        ("flops_per_s", None), ("median_flops_per_s", None), ("sigma", 0.0),
        ("tiers", None), ("preset", None), ("workload", None), ("scale", 1.0),
        ("unit", None),
    ]  # fmt: skip


def test_a_preset_resolves_to_the_form_and_numbers_it_did():
    # Execute
    mid = speed_spec(preset="flash-phones-mid")
    flops = speed_spec(preset="flash-phones-mid", unit="flops")
    mix = speed_spec(preset="flash-phones", scale=2.0)

    # Assert: the numbers of the presets' doctests before the forms
    assert type(mid) is LognormalSpeed and mid.median_steps_per_s == 1.7006802721088434
    assert mid.used_fields == "dist preset workload scale median_steps_per_s sigma"
    assert flops.median_flops_per_s == 1734983401.3605442 and flops.per_flop
    assert flops.used_fields == (
        "dist preset workload scale unit median_flops_per_s sigma"
    )
    assert type(mix) is MixtureSpeed
    assert [t.name for t in mix.tiers] == ["low", "mid", "high"]
    assert mix.tiers[1].median_steps_per_s == 2 * 1.7006802721088434
    assert mix.preset == "flash-phones" and mix.scale == 2.0


def test_a_group_built_in_python_takes_a_form():
    # Prepare: the same group, its speed a form and a mapping
    law = {"dist": "lognormal", "median_steps_per_s": 3.0, "sigma": 0.4}
    typed = FleetSpec(groups=[{"name": "g", "count": 50, "speed": speed_spec(**law)}])
    written = FleetSpec(groups=[{"name": "g", "count": 50, "speed": law}])

    # Execute
    a, b = Fleet.from_spec(typed, seed=5), Fleet.from_spec(written, seed=5)

    # Assert: the same spec, the same devices
    assert typed == written and a.speed.tolist() == b.speed.tolist()


# sha256 (first 16 hex) of each shipped scenario's speed sections, as its run
# fingerprint holds them (JSON, in order), computed before the forms existed
SPEED_DUMPS = {
    "async-fedasync.yaml": "aad8ddd06e5344a5",
    "async-fedbuff.yaml": "aad8ddd06e5344a5",
    "ci/feddc-synthetic-small.yaml": "92d34180ba034d8e",
    "ci/fednova-synthetic-small.yaml": "6c67bf6c676a7e1d",
    "ci/fmnist-dirichlet-small.yaml": "108986b504cafb68",
    "ci/tiny-synthetic.yaml": "7aeed2719158dce3",
    "dp-fedavg.yaml": "bae64f5071b0288d",
    "fleets/edge-boxes.yaml": "2cabf5fe66b0d320",
    "fleets/gpu-cluster.yaml": "864668f7a1c05bfe",
    "fleets/phones-flash.yaml": "28b83074b11467e3",
    "fleets/phones-flops.yaml": "bbfeeeb959c06968",
    "fleets/phones-trace.yaml": "1d8fc6ceb1f94c63",
    "fmnist-dirichlet.yaml": "108986b504cafb68",
    "papers/feddc-fmnist-d1.yaml": "92d34180ba034d8e",
    "papers/feddc-fmnist-iid.yaml": "92d34180ba034d8e",
    "papers/feddc-synthetic-00.yaml": "92d34180ba034d8e",
    "papers/feddc-synthetic-01.yaml": "92d34180ba034d8e",
    "papers/feddc-synthetic-10.yaml": "92d34180ba034d8e",
    "papers/feddm-fmnist-ci.yaml": "7398912f5e5c007a",
    "papers/feddm-fmnist.yaml": "7398912f5e5c007a",
    "papers/feddm-mnist.yaml": "7398912f5e5c007a",
    "papers/fednova-fmnist-proxy.yaml": "92d34180ba034d8e",
    "papers/fednova-synthetic-full.yaml": "6c67bf6c676a7e1d",
    "papers/fednova-synthetic-sampled.yaml": "6c67bf6c676a7e1d",
    "papers/fednova-synthetic.yaml": "6c67bf6c676a7e1d",
    "papers/fedpns-bn2.yaml": "3257fddf9f70363a",
    "papers/fedpns-mnist-cnn.yaml": "3257fddf9f70363a",
    "papers/fedpns-mnist-like.yaml": "3257fddf9f70363a",
    "papers/fedpns-mnist-test.yaml": "3257fddf9f70363a",
    "papers/fedpns-synthetic.yaml": "3257fddf9f70363a",
    "quadratic-objective-inconsistency.yaml": "e33de0bbb684e9ea",
    "quickstart.yaml": "aad8ddd06e5344a5",
    "secagg-plus-phones.yaml": "28b83074b11467e3",
    "secagg-small.yaml": "a12755d6b416bec6",
    "stress/linked-speed-data.yaml": "fe8883d2ccb33a38",
    "stress/million-devices.yaml": "d98b293d2203676c",
    "stress/phones-deadline.yaml": "8db6ff9b100fd7a4",
    "stress/phones-stragglers.yaml": "28b83074b11467e3",
}


@pytest.mark.parametrize("name", sorted(SPEED_DUMPS))
def test_every_shipped_scenarios_speed_dump_and_fingerprint_are_unchanged(name):
    # Prepare
    sc = load_scenario(SCENARIOS / name)

    # Execute: the fingerprint's speed sections, and the dump's
    groups = fingerprint(sc)["fleet"]["groups"]
    speeds = [g.get("speed") for g in groups]
    dumped = [g["speed"] for g in sc.model_dump(mode="json")["fleet"]["groups"]]

    # Assert
    assert dumped == speeds
    digest = hashlib.sha256(json.dumps(speeds).encode()).hexdigest()[:16]
    assert digest == SPEED_DUMPS[name]
