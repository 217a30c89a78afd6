"""Scenario loading: typed, frozen, unknown keys rejected, clear errors."""

from __future__ import annotations

import pytest
import yaml

from fedsim.scenario import (
    Scenario,
    ScenarioError,
    apply_overrides,
    dump_scenario,
    load_scenario,
    parse_scenario,
)

from .conftest import SCENARIOS

QUICK_TEXT = (SCENARIOS / "quickstart.yaml").read_text()


def mutate(fn) -> str:
    raw = yaml.safe_load(QUICK_TEXT)
    fn(raw)
    return yaml.safe_dump(raw)


def error_of(text: str) -> str:
    with pytest.raises(ScenarioError) as exc:
        parse_scenario(text, "bad.yaml")
    return str(exc.value)


@pytest.mark.parametrize("path", sorted(SCENARIOS.rglob("*.yaml")), ids=str)
def test_every_shipped_scenario_is_valid(path):
    sc = load_scenario(path)
    assert isinstance(sc, Scenario)
    # the resolved form loads back to the same scenario
    assert parse_scenario(dump_scenario(sc), "resolved") == sc


def test_shipped_scenarios_never_depend_on_shared_data():
    for path in SCENARIOS.rglob("*.yaml"):
        assert "shared/" not in path.read_text(), path


def test_scenario_is_frozen():
    sc = parse_scenario(QUICK_TEXT)
    with pytest.raises(Exception):  # noqa: B017 - pydantic's frozen error
        sc.rounds = 3


def test_unknown_key_names_the_path():
    msg = error_of(mutate(lambda r: r["fleet"]["groups"][1]["speed"].update(sigmaa=1)))
    assert msg.startswith("bad.yaml")
    assert "fleet.groups[1].speed.sigmaa" in msg
    assert "unknown key" in msg


def test_wrong_type_names_path_and_expectation():
    msg = error_of(mutate(lambda r: r["fleet"]["groups"][1]["speed"].update(sigma="x")))
    assert "fleet.groups[1].speed.sigma" in msg
    assert "number" in msg and "'x'" in msg


def test_true_for_a_number_and_a_number_for_a_switch_are_refused():
    # pydantic's lax mode alone would read these as 1, 1.0 and True
    msg = error_of(
        mutate(
            lambda r: (
                r["fleet"]["groups"][0].update(count=True),
                r["client"].update(lr=True),
                r["round"].update(over_select=True),
            )
        )
    )
    assert "invalid scenario (3 problems)" in msg
    assert "fleet.groups[0].count: expected a number, not true" in msg
    assert "client.lr: expected a number, not true" in msg
    assert "round.over_select: expected a number, not true" in msg
    msg = error_of(mutate(lambda r: r["resources"].update(vectorize=1)))
    assert "resources.vectorize: expected true or false (got 1)" in msg
    # numbers that are numbers still pass
    sc = parse_scenario(mutate(lambda r: r["client"].update(lr=1)))
    assert sc.client.lr == 1.0


def test_negative_count():
    msg = error_of(mutate(lambda r: r["fleet"]["groups"][0].update(count=-3)))
    assert "fleet.groups[0].count" in msg and "greater than or equal to 1" in msg


def test_missing_field():
    msg = error_of(mutate(lambda r: r.pop("rounds")))
    assert "rounds: required field is missing" in msg


def test_malformed_yaml_reports_line():
    msg = error_of("name: x\nrounds: [1, 2\nseed: 0\n")
    assert msg.startswith("bad.yaml: malformed YAML at line")


def test_python_tags_are_refused():
    msg = error_of("name: !!python/object/apply:os.system ['echo hi']\nrounds: 1\n")
    assert "malformed YAML" in msg


def test_the_yaml_loader_is_a_safe_one():
    from yaml.constructor import SafeConstructor

    from fedsim import scenario

    assert issubclass(scenario._Loader, SafeConstructor)


def test_non_mapping_top_level():
    assert "expected a YAML mapping" in error_of("- 1\n- 2\n")


def test_nan_is_rejected_with_path():
    msg = error_of(mutate(lambda r: r["client"].update(lr=float("nan"))))
    assert "client.lr" in msg and "finite" in msg


def test_unknown_algorithm_lists_choices():
    msg = error_of(mutate(lambda r: r.update(algorithm={"name": "fedsgd"})))
    assert "algorithm" in msg and "fednova" in msg


def test_algorithm_hyperparameter_checks_run_on_load():
    msg = error_of(
        mutate(lambda r: r.update(algorithm={"name": "fednova", "tau_eff": "fixed"}))
    )
    assert "algorithm" in msg and "tau_eff_value" in msg


def test_more_clients_per_round_than_devices():
    msg = error_of(mutate(lambda r: r["selector"].update(clients_per_round=31)))
    assert "clients_per_round" in msg and "30 devices" in msg


def test_data_clients_must_match_fleet():
    msg = error_of(mutate(lambda r: r["data"].update(clients=20)))
    assert "20 clients" in msg and "30 devices" in msg


def test_overrides_set_nested_and_indexed_fields():
    sc = parse_scenario(
        QUICK_TEXT,
        overrides=[
            "rounds=3",
            "fleet.groups[1].speed.sigma=0.9",
            "fleet.groups.0.count=2",
            "algorithm={name: fedavg}",
        ],
    )
    assert sc.rounds == 3
    assert sc.fleet.groups[1].speed.sigma == 0.9
    assert sc.fleet.groups[0].count == 2
    assert sc.algorithm.name == "fedavg"


def test_overrides_are_validated_like_the_file():
    with pytest.raises(ScenarioError, match="rounds"):
        parse_scenario(QUICK_TEXT, "q.yaml", overrides=["rounds=-1"])
    with pytest.raises(ScenarioError, match="does not exist"):
        parse_scenario(QUICK_TEXT, "q.yaml", overrides=["fleet.groups[9].count=1"])
    with pytest.raises(ScenarioError, match="path.to.key=value"):
        apply_overrides({}, ["rounds"])


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(ScenarioError, match="no such scenario file"):
        load_scenario(tmp_path / "nope.yaml")
    with pytest.raises(ScenarioError, match="is a directory"):
        load_scenario(tmp_path)


def test_huge_file_is_refused(tmp_path):
    big = tmp_path / "big.yaml"
    big.write_text("a: " + "x" * (5 * 1024 * 1024))
    with pytest.raises(ScenarioError, match="larger|bytes"):
        load_scenario(big)


def test_deep_nesting_is_refused():
    text = "a: " + "[" * 200 + "]" * 200
    msg = error_of(text)
    assert "nested" in msg or "deep" in msg


# ------------------------------------------------------------ YAML 1.1 surprises
def test_duplicate_key_is_refused_with_path_and_lines(tmp_path):
    # Prepare: quickstart with a second `lr` under `client` two lines later
    text = "client:\n  lr: 0.1\n  batch_size: 5\n  lr: 0.2\n" + QUICK_TEXT.replace(
        "client:", "unused_client:", 1
    )
    path = tmp_path / "dup.yaml"
    path.write_text(text)
    # Execute
    with pytest.raises(ScenarioError) as exc:
        load_scenario(path)
    # Assert: file, key path, the duplicate's line and the first one's
    msg = str(exc.value)
    assert msg.startswith(f"{path}: line 4: duplicate key client.lr")
    assert "first given at line 2" in msg


def test_duplicate_key_inside_a_list_is_refused():
    msg = error_of(
        "fleet:\n  groups:\n    - {name: a, count: 1}\n    - name: b\n"
        "      count: 2\n      count: 3\n"
    )
    assert "line 6: duplicate key fleet.groups[1].count" in msg


def test_merge_keys_may_override_without_a_duplicate_error():
    raw = yaml.safe_dump(yaml.safe_load(QUICK_TEXT))
    text = raw.replace("client:", "base: &b {lr: 0.5}\nclient:", 1)
    text = text.replace("client:\n", "client:\n  <<: *b\n", 1)
    # `base` is an unknown key, so validation fails, but not for a duplicate
    assert "duplicate" not in error_of(text)


def test_duplicate_key_in_a_set_value_is_refused():
    with pytest.raises(ScenarioError, match="duplicate key a"):
        apply_overrides({}, ["x={a: 1, a: 2}"])


@pytest.mark.parametrize(
    ("value", "kind"),
    [("1:30", "base-60"), ("-1:30:00", "base-60"), ("0755", "octal"), ("010", "octal")],
)
def test_ambiguous_numbers_are_refused_with_line(value, kind):
    text = QUICK_TEXT.replace("rounds:", f"rounds: {value}\nx_rounds:", 1)
    line = text[: text.index(f"rounds: {value}")].count("\n") + 1
    msg = error_of(text)
    assert msg.startswith(f"bad.yaml: line {line}: rounds: {value} is ambiguous")
    assert kind.split("-")[0] in msg


def test_quoted_ambiguous_text_is_text():
    sc = parse_scenario(QUICK_TEXT.replace("name: quickstart", "name: '0755'"))
    assert sc.name == "0755"


@pytest.mark.parametrize("word", ["yes", "no", "on", "off", "Yes", "OFF"])
def test_yes_no_on_off_are_text_not_switches(word):
    # a string field keeps the word as typed (YAML 1.1 would give a bool)
    sc = parse_scenario(QUICK_TEXT.replace("name: quickstart", f"name: {word}"))
    assert sc.name == word
    # a switch refuses it and says what to write
    text = mutate(lambda r: r.setdefault("resources", {}).update(vectorize=0))
    text = text.replace("vectorize: 0", f"vectorize: {word}")
    msg = error_of(text)
    assert f"resources.vectorize: expected true or false (got '{word}')" in msg
    assert "write true or false" in msg


def test_numbers_read_as_yaml_1_2():
    from fedsim.scenario import read_yaml as _read_yaml

    got = _read_yaml(
        "a: 1e-3\nb: 2E5\nc: 1_000\nd: 0x1F\ne: 0b101\nf: .5\ng: True\n", "f"
    )
    assert got == {
        "a": 0.001,
        "b": 200000.0,
        "c": 1000,
        "d": 31,
        "e": 5,
        "f": 0.5,
        "g": True,
    }
    assert type(got["a"]) is float and type(got["c"]) is int


# ------------------------------------------------------------ through the CLI
def test_phones_trace_trains_the_fleet_not_one_phone(tmp_path):
    # Prepare: the shipped scenario, 8 of its 30 rounds, in-process
    import collections

    import pyarrow.parquet as pq
    from typer.testing import CliRunner

    from fedsim.tools.cli import app

    out = tmp_path / "run"
    args = ["run", str(SCENARIOS / "fleets" / "phones-trace.yaml"), "--workers", "0"]
    args += ["-q", "--no-report", "--set", "rounds=8", "--out", str(out)]
    # Execute
    r = CliRunner().invoke(app, args)
    # Assert: many distinct phones trained (before the fix: phone 8 alone)
    assert r.exit_code == 0, r.output
    rows = pq.read_table(out / "clients.parquet").to_pydict()
    trained = collections.Counter(
        c
        for c, dropped, tau in zip(
            rows["client_id"], rows["dropped"], rows["tau"], strict=True
        )
        if not dropped and tau > 0
    )
    assert len(trained) >= 12, trained
    assert max(trained.values()) <= 5  # no phone trains in most rounds


def test_python_dash_m_fedsim_runs_the_cli():
    import subprocess
    import sys

    r = subprocess.run(
        [sys.executable, "-m", "fedsim", "--help"], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    assert "Usage:" in r.stdout and "run" in r.stdout


@pytest.mark.parametrize("name", ["1e5", "0755", "yes", "1.5"])
def test_resolved_scenario_quotes_text_that_reads_as_numbers(name):
    # a run's scenario.yaml must load back to the same scenario on --resume
    sc = parse_scenario(QUICK_TEXT.replace("name: quickstart", f"name: '{name}'"))
    text = dump_scenario(sc)
    assert f"name: '{name}'" in text
    assert parse_scenario(text) == sc


def test_read_yaml_for_other_tools():
    from fedsim.scenario import read_yaml

    assert read_yaml("{lr: 1e-3, name: no}", "--sweep x") == {"lr": 0.001, "name": "no"}
    with pytest.raises(ScenarioError, match="--sweep x: line 1: duplicate key a"):
        read_yaml("{a: 1, a: 2}", "--sweep x")


def test_a_set_path_with_a_unicode_digit_is_a_key_not_an_index():
    # '¹'.isdigit() is True but int('¹') fails: found by the fuzz suite
    from fedsim.scenario import ScenarioError, load_scenario

    with pytest.raises(ScenarioError, match="¹"):
        load_scenario(SCENARIOS / "quickstart.yaml", ["¹=null"])
