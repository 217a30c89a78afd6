"""Issue 16, polish: the initial evaluation, one round-numbering convention,
figures that say what they show, validate's applicable fields, and errors
attributed to the option or path that caused them."""

from __future__ import annotations

import json
import math

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fedsim.runtime import run_setup
from fedsim.tools import plots
from tests.conftest import SCENARIOS

from .conftest import assert_figure


# ------------------------------------------------------------ figures
def _clients(rows: list[dict]) -> pa.Table:
    return pa.Table.from_pylist(rows)


def test_tau_plot_marks_the_max_steps_cap():
    # Prepare: two groups, one of them on the cap (7 steps)
    row = {"round": 0, "dropped": False}
    clients = _clients(
        [
            {**row, "client_id": 0, "device_group": "a", "tau": 7},
            {**row, "client_id": 1, "device_group": "b", "tau": 3},
        ]
    )

    # Execute
    fig = plots.figure_tau_by_group(clients, ["a", "b"], max_steps=7)
    without = plots.figure_tau_by_group(clients, ["a", "b"])

    # Assert: one dashed horizontal line at 7, labelled, and in the legend
    ax = fig.axes[0]
    cap = [ln for ln in ax.get_lines() if ln.get_label() == "max_steps cap"]
    assert len(cap) == 1
    assert cap[0].get_linestyle() == "--"
    assert list(cap[0].get_ydata()) == [7, 7]
    assert "max_steps cap" in [t.get_text() for t in ax.get_legend().get_texts()]
    labels = [ln.get_label() for ln in without.axes[0].get_lines()]
    assert "max_steps cap" not in labels


def test_chi2_plot_says_zero_in_every_round():
    # Prepare: FedNova-like weights: chi^2 exactly 0 in all three rounds
    zero = pa.table({"round": [0, 1, 2], "chi2_pw": [0.0, 0.0, 0.0]})
    some = pa.table({"round": [0, 1, 2], "chi2_pw": [0.0, 0.2, 0.1]})

    # Execute
    texts = [t.get_text() for t in plots.figure_chi2(zero).axes[0].texts]
    other = [t.get_text() for t in plots.figure_chi2(some).axes[0].texts]

    # Assert
    assert any("0 in every round" in t for t in texts)
    assert not any("0 in every round" in t for t in other)


def test_timeline_bars_of_consecutive_rounds_do_not_merge():
    # Prepare: client 5 is busy to the end of round 0 (t = 10) and starts
    # round 1 at once: its two bars touch.
    row = {"client_id": 5, "device_group": "a", "dropped": False, "drop_reason": ""}
    clients = _clients(
        [
            {**row, "round": 0, "t_start": 0.0, "t_arrive": 10.0},
            {**row, "round": 1, "t_start": 10.0, "t_arrive": 20.0},
        ]
    )
    rounds = pa.table({"round": [0, 1], "sim_time": [10.0, 20.0]})

    # Execute
    fig = plots.figure_timeline(clients, rounds, ["a"])

    # Assert: the two bars touch, so their fill must differ
    bars = sorted(
        (p for p in fig.axes[0].patches if p.get_width() > 0), key=lambda p: p.get_x()
    )
    assert len(bars) == 2
    first, second = bars
    assert first.get_x() + first.get_width() == pytest.approx(second.get_x())
    assert first.get_facecolor() != second.get_facecolor()


def test_metrics_curves_start_at_the_initial_model():
    # Prepare: two evaluated rounds (0-based) and the initial model
    rounds = pa.table(
        {
            "round": [0, 1],
            "sim_time": [9.5, 20.0],
            "test_accuracy": [0.5, 0.7],
            "test_loss": [1.5, 1.0],
            "train_loss": [1.6, 1.1],
        }
    )
    initial = {"accuracy": 0.1, "loss": 2.3, "t": 0.0}

    # Execute
    fig = plots.figure_metrics(rounds, initial=initial)

    # Assert: by time, (0, 0.1) then the rows; by rounds completed, 0, 1, 2
    by_time, by_round = fig.axes[0], fig.axes[1]
    acc = [ln for ln in by_time.get_lines() if ln.get_label() == "test accuracy"][0]
    assert list(acc.get_xdata()) == [0.0, 9.5, 20.0]
    assert list(acc.get_ydata()) == [0.1, 0.5, 0.7]
    acc = [ln for ln in by_round.get_lines() if ln.get_label() == "test accuracy"][0]
    assert list(acc.get_xdata()) == [0.0, 1.0, 2.0]
    assert by_round.get_xlabel() == "rounds completed"
    loss = [ln for ln in fig.axes[3].get_lines() if ln.get_label() == "test loss"][0]
    assert list(loss.get_ydata()) == [2.3, 1.5, 1.0]
    # the training loss has no initial value: it starts at the first round
    train = [ln for ln in fig.axes[3].get_lines() if ln.get_label() == "train loss"]
    assert list(train[0].get_xdata()) == [1.0, 2.0]


# ---------------------------------------- initial evaluation, round numbers
def test_initial_evaluation_in_summary_and_the_same_on_resume(tmp_path):
    # Prepare: a 1-round run with a checkpoint, then the same run resumed to 2
    from fedsim.data import build_data
    from fedsim.runtime import run_scenario
    from fedsim.scenario import load_scenario
    from fedsim.server import Server

    path = SCENARIOS / "ci" / "tiny-synthetic.yaml"
    sc1 = load_scenario(path, ["rounds=1", "checkpoint.every_rounds=1"])
    sc2 = load_scenario(path, ["rounds=2", "checkpoint.every_rounds=1"])
    fresh = Server(
        run_setup(sc1).server, build_data(sc1.data, sc1.num_clients, sc1.seed)
    )
    loss0, acc0 = fresh.evaluate()  # x_0, evaluated by hand

    # Execute
    first = run_scenario(sc1, run_dir=tmp_path)
    resumed = run_scenario(sc2, run_dir=tmp_path, resume=True)

    # Assert: x_0's metrics, at t = 0, and the same after a resume
    assert first.summary()["initial"] == {"accuracy": acc0, "loss": loss0, "t": 0.0}
    assert resumed.summary()["initial"] == first.summary()["initial"]
    assert [r["round"] for r in resumed.rows] == [0, 1]  # rows unchanged
    assert 0.0 <= acc0 <= 1.0 and math.isfinite(loss0)


def test_progress_lines_count_what_the_files_number(tmp_path):
    # Prepare: a 3-round run, a progress line every round (no terminal)
    from typer.testing import CliRunner

    from fedsim.tools.cli import app

    args = ["run", str(SCENARIOS / "ci" / "tiny-synthetic.yaml"), "--workers", "0"]
    args += ["--out", str(tmp_path / "run"), "--set", "rounds=3", "--no-report"]

    # Execute
    result = CliRunner().invoke(app, [*args, "--log-every", "0"])

    # Assert: "k/3 rounds done (last: round k-1)": rounds.parquet numbers from 0
    assert result.exit_code == 0, result.output
    rounds = pq.read_table(tmp_path / "run" / "rounds.parquet").column("round")
    assert rounds.to_pylist() == [0, 1, 2]
    lines = [ln for ln in result.output.splitlines() if "rounds done" in ln]
    assert len(lines) == 3
    for k, line in enumerate(lines, start=1):
        assert f": {k}/3 rounds done (last: round {k - 1})," in line
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["rounds"] == 3 and summary["initial"]["t"] == 0.0


# ------------------------------------------------------------- validate
def _validate(*args: str) -> dict:
    """``fedsim validate ARGS``'s YAML output (it must succeed)."""
    import yaml
    from typer.testing import CliRunner

    from fedsim.tools.cli import app

    result = CliRunner().invoke(app, ["validate", *args])
    assert result.exit_code == 0, result.output
    return yaml.safe_load(result.stdout)


def _keys(d: object) -> set[str]:
    """Every key at any depth."""
    if isinstance(d, dict):
        return set(d) | {k for v in d.values() for k in _keys(v)}
    if isinstance(d, list):
        return {k for v in d for k in _keys(v)}
    return set()


def test_validate_prints_only_the_fields_that_apply_fixed_epochs():
    # Prepare / Execute: fixed_epochs, logreg, no dropouts, always online
    d = _validate(str(SCENARIOS / "ci" / "tiny-synthetic.yaml"))

    # Assert: no window, async, other-model or dropout fields
    assert d["round"] == {
        "policy": "fixed_epochs",
        "epochs": 1,
        "deadline_s": None,
        "over_select": 1.0,
    }
    assert d["model"] == {"name": "logreg", "dtype": "float32", "zero_init": False}
    assert d["fleet"]["groups"][0]["availability"] == {"kind": "always"}
    assert d["fleet"]["groups"][0]["speed"] == {
        "dist": "lognormal",
        "median_steps_per_s": 5.0,
        "sigma": 0.5,
    }
    assert "dropout_p" not in _keys(d)


def test_validate_prints_only_the_fields_that_apply_window_and_async(tmp_path):
    # Prepare: quickstart (fixed_window) with dropouts in one group
    quick = str(SCENARIOS / "quickstart.yaml")
    drop = "fleet.groups.0.stragglers.dropout_p=0.1"

    # Execute
    window = _validate(quick, "--set", drop)
    plain = _validate(quick)
    asynchronous = _validate(str(SCENARIOS / "async-fedbuff.yaml"))

    # Assert: the window's fields, the dropouts once some group has them
    assert window["round"] == {
        "policy": "fixed_window",
        "window_s": 10.0,
        "max_steps": 100,
    }
    assert window["fleet"]["groups"][0]["stragglers"]["dropout_p"] == 0.1
    assert window["fleet"]["groups"][1]["stragglers"]["dropout_p"] == 0.0
    assert "dropout_p" not in _keys(plain)
    assert set(asynchronous["round"]) == {
        "policy", "concurrency", "max_staleness", "job_steps", "max_steps"
    }  # fmt: skip
    # what is left out is unused here: the output still resolves the same
    import yaml

    from fedsim.scenario import dump_scenario, load_scenario

    path = tmp_path / "printed.yaml"
    path.write_text(yaml.safe_dump(window))
    again = load_scenario(path)
    assert dump_scenario(again) == dump_scenario(load_scenario(quick, [drop]))


# ------------------------------------------- errors at the option or path
def _cli(*args: str) -> tuple[int, str]:
    """Exit code and output (stdout and stderr) of ``fedsim ARGS``."""
    from typer.testing import CliRunner

    from fedsim.tools.cli import app

    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.output


@pytest.mark.parametrize(
    ("args", "want"),
    [
        (
            ["validate", "Q", "--set", "selector.clients_per_round=abc"],
            "error: --set selector.clients_per_round=abc: Input should be a valid "
            "integer",
        ),
        (
            ["run", "Q", "--set", "rounds=0", "--out", "OUT"],
            "error: --set rounds=0: Input should be greater than or equal to 1",
        ),
        (["run", "Q", "--seed", "abc", "--out", "OUT"], "error: --seed abc: expected"),
        (["run", "Q", "--seed", "-3", "--out", "OUT"], "error: --seed -3: expected"),
        (
            ["run", "Q", "--seed", "9" * 30, "--out", "OUT"],
            f"error: --seed {'9' * 30}: number too large",
        ),
    ],
)
def test_a_bad_option_value_is_one_line_naming_the_option(args, want, tmp_path):
    # Prepare
    args = [
        str(SCENARIOS / "quickstart.yaml")
        if a == "Q"
        else str(tmp_path / "out")
        if a == "OUT"
        else a
        for a in args
    ]

    # Execute
    code, output = _cli(*args)

    # Assert: exit 2, one line, at the option (not the YAML file); no run dir
    assert code == 2
    assert output.strip().startswith(want), output
    assert len(output.strip().splitlines()) == 1, output
    assert "quickstart.yaml" not in output
    assert not (tmp_path / "out").exists()


def test_a_path_of_the_wrong_kind_is_said_as_such(tmp_path, monkeypatch):
    # Prepare: a file where folders are expected, a folder where a file is
    a_file = tmp_path / "notes.txt"
    a_file.write_text("my notes\n")
    tiny = str(SCENARIOS / "ci" / "tiny-synthetic.yaml")
    fmnist = str(SCENARIOS / "fmnist-dirichlet.yaml")
    monkeypatch.delenv("FEDSIM_DATA_ROOT", raising=False)

    # Execute
    cases = {
        "scenario dir": _cli("run", str(tmp_path), "--out", str(tmp_path / "o")),
        "out file": _cli("run", tiny, "--out", str(a_file)),
        "resume file": _cli("run", "--resume", str(a_file)),
        "compare out": _cli("compare", tiny, "-a", "fedavg", "--out", str(a_file)),
        "data root": _cli("validate", fmnist, "--set", f"data.root={a_file}"),
    }

    # Assert: exit 2, one line that names the path and its kind
    want = {
        "scenario dir": f"{tmp_path}: is a directory, expected a",
        "out file": f"--out {a_file}: is a file, expected a run directory",
        "resume file": f"--resume {a_file}: is a file, expected a run directory",
        "compare out": f"--out {a_file}: is a file, expected an output folder",
        "data root": f"data.root {a_file}: is a file, expected a data folder",
    }
    for name, (code, output) in cases.items():
        assert code == 2, (name, output)
        assert output.strip() == f"error: {want[name]}" or output.strip().startswith(
            f"error: {want[name]}"
        ), (name, output)
        assert len(output.strip().splitlines()) == 1, (name, output)
    assert a_file.read_text() == "my notes\n"  # untouched


def test_report_shows_the_initial_model(tmp_path):
    # Prepare: a run directory with two rounds and the initial evaluation
    from fedsim.results import ROUND_SCHEMA, write_summary, write_table
    from fedsim.tools.report import write_report

    nan = math.nan
    row = dict.fromkeys(ROUND_SCHEMA.names, nan)
    rows = [
        {**row, "round": 0, "sim_time": 10.0, "test_accuracy": 0.5, "test_loss": 1.2},
        {**row, "round": 1, "sim_time": 20.0, "test_accuracy": 0.6, "test_loss": 1.0},
    ]
    for r in rows:
        r.update(n_selected=2, n_completed=2, n_dropped=0)
    write_table(tmp_path / "rounds.parquet", rows, ROUND_SCHEMA)
    initial = {"accuracy": 0.125, "loss": 2.25, "t": 0.0}
    write_summary(tmp_path / "summary.json", {"rounds": 2, "initial": initial})

    # Execute
    text = write_report(tmp_path).read_text()

    # Assert: the key figure, and the metrics figure written
    assert "| initial test accuracy | 0.125 |" in text
    assert "| initial test loss | 2.25 |" in text
    assert_figure(tmp_path / "metrics.png", (11, 8.4))  # accuracy and loss rows


def test_report_shows_long_simulated_times_in_hours_or_days():
    from fedsim.tools.report import _sim_time

    assert _sim_time(50.0) == "50.0 s"
    assert _sim_time(11520.0) == "11520.0 s (3.2h)"
    assert _sim_time(302400.0) == "302400.0 s (3.5d)"
    assert _sim_time(None) == "- s"  # the row is then left out
