"""Odd numbers from a plug-in or a fleet end in one line, never a
traceback nor a number passed on: a model's ``flops()`` of 0, 0.4, a
negative count, a string or 10**400; a model in which torch counts no FLOPs
under a FLOP/s fleet; a FLOP/s speed whose draws leave a float's range; a
metric or an instruction of 10**400. The plug-ins are real classes in
tests/hostile_plugins.py."""

from __future__ import annotations

import json

import pytest

from fedsim.flops import model_step_flops
from fedsim.models import ModelError

from . import hostile_plugins
from .conftest import SCENARIOS, fedsim_here

TINY = SCENARIOS / "ci" / "tiny-synthetic.yaml"
FLOPS_FLEET = (
    "fleet.groups[0].speed={dist: lognormal, median_flops_per_s: 1e9, sigma: 0.5}"
)


def _one_line(done, code: int) -> str:
    lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert done.returncode == code, done.stderr
    assert len(lines) == 1 and "Traceback" not in done.stderr, lines
    return lines[0]


@pytest.mark.parametrize(
    ("declared", "shown"),
    [(0, "0"), (0.4, "0.4"), (-5, "-5"), ("1000", "'1000'"), (True, "True"),
     (float("inf"), "inf"), (10**400, "100000000000... (401 characters)")],
    ids=["zero", "fraction", "negative", "string", "bool", "inf", "10**400"],
)  # fmt: skip
def test_a_stated_flop_count_that_is_no_count_is_refused(declared, shown):
    with pytest.raises(ModelError) as info:
        model_step_flops(hostile_plugins.StatedFlops(declared=declared), (7,), 3, 5)
    assert f"flops() returned {shown}; expected the FLOPs of one sample's" in str(
        info.value
    )


def test_a_whole_stated_count_is_charged_as_before():
    stated = hostile_plugins.StatedFlops(declared=1200.0)
    assert model_step_flops(stated, (7,), 3, 5) == 3 * 5 * 1200


def test_validate_refuses_a_negative_flop_count_instead_of_negative_speeds():
    model = "model={name: 'tests.hostile_plugins:StatedFlops', declared: -5}"
    done = fedsim_here("validate", str(TINY), "--set", FLOPS_FLEET, "--set", model)
    line = _one_line(done, 2)
    assert "flops() returned -5" in line and "ok:" not in done.stderr


@pytest.mark.parametrize("command", ["validate", "run"])
def test_a_model_torch_counts_no_flops_in_is_one_line_under_a_flops_fleet(
    tmp_path, command
):
    model = "model={name: 'tests.hostile_plugins:Uncounted'}"
    args = [command, str(TINY), "--set", FLOPS_FLEET, "--set", model]
    if command == "run":
        args += ["--workers", "0", "-q", "--out", str(tmp_path / "r")]
    line = _one_line(fedsim_here(*args), 2)
    assert "torch's FLOP counter finds no operation in a training step" in line


def test_a_speed_whose_draws_leave_a_floats_range_is_refused_before_training(
    tmp_path,
):
    speed = (
        "fleet.groups[0].speed={dist: lognormal, median_flops_per_s: 1e308, sigma: 3}"
    )
    out = tmp_path / "r"
    done = fedsim_here("run", str(TINY), "--set", speed, "-q", "--out", str(out))
    line = _one_line(done, 2)
    assert "fleet.groups[0].speed: a median of 1e+308 with sigma 3" in line
    assert not out.exists()


@pytest.mark.parametrize(
    ("plugin", "hook", "what"),
    [("HugeMetric", "aggregate", "metric 'huge'"),
     ("HugeInstruction", "instruct", "client 0's 'huge'")],
)  # fmt: skip
def test_a_number_no_float_holds_fails_the_plugin_by_name(tmp_path, plugin, hook, what):
    out = tmp_path / "r"
    done = fedsim_here(
        *("run", str(TINY), "--workers", "0", "-q", "--no-report", "--out", str(out)),
        *("--set", f"algorithm={{name: 'tests.hostile_plugins:{plugin}'}}"),
    )
    line = _one_line(done, 3)
    assert f"failed in {hook}: gave {what} as an integer of 401 digits" in line
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["failure"]["hook"] == hook
