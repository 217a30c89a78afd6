"""The hooks a method needs and what happens when plug-in code fails
(issue 37: defects 3 and 6, hooks 1 to 3; issue 39: misbehaving plug-ins).

- A resume of another experiment is refused by the library as by the CLI.
- Plug-in code that raises during a run ends it with ``status: failed``,
  the plug-in, the hook and the error in summary.json, the traceback in
  failure.txt and the rows kept (exit 3 on the command line); once the
  plug-in is fixed, ``--resume`` continues to the uninterrupted result.
- A hook that returns the wrong thing fails the run the same way, with a
  message naming the plug-in, the hook and what was expected.
- Per-client instructions reach their client; the round's failures reach
  the server rule; plug-in metrics become rounds.parquet columns; all the
  same after a resume (and, marked ``ray``, on 2 Ray workers).

The plug-ins are in tests/hook_plugins.py (they must pickle); the example
package's CatchUp (examples/fedsim_example) uses the three hooks together.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pyarrow.parquet as pq
import pytest

from fedsim.checkpoint import CheckpointError
from fedsim.hooks import PluginFailure
from fedsim.runtime import FAILURE_FILE, run_scenario
from fedsim.scenario import dump_scenario, load_scenario
from fedsim.testing import check_algorithm, check_selector

from . import hook_plugins
from .conftest import ROOT, SCENARIOS, assert_figure, fedsim_here

TINY = SCENARIOS / "ci" / "tiny-synthetic.yaml"
EXAMPLE = ROOT / "examples" / "fedsim_example"
ENV = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join([str(ROOT), str(EXAMPLE)]),
    "RAY_USAGE_STATS_ENABLED": "0",
}
WALL_CLOCK = {"wall_time"}


def _tiny(*overrides: str):
    return load_scenario(TINY, ["rounds=4", "checkpoint.every_rounds=1", *overrides])


def _plugin(kind: str, cls: str, extra: str = "") -> str:
    return f"{kind}={{name: 'tests.hook_plugins:{cls}'{extra}}}"


def _rows(run_dir, name="rounds.parquet"):
    return _without_wall(pq.read_table(run_dir / name).to_pylist())


def _without_wall(rows):
    """Rows without the host-clock column, NaN as None (NaN != NaN) and in
    key order (a row read back from Parquet has the table's order)."""

    def cell(v):
        return None if isinstance(v, float) and math.isnan(v) else v

    return [{k: cell(r[k]) for k in sorted(r) if k not in WALL_CLOCK} for r in rows]


def _fedsim(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "fedsim", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=ENV,
        timeout=600,
    )


@pytest.fixture
def example_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLE))


class _Stop(Exception):
    pass


def _stop_at(round_: int):
    def on_round(row, clients):
        if row["round"] == round_:
            raise _Stop

    return on_round


# ------------------------------------------------------------- defect 6
def test_the_library_refuses_to_resume_another_experiment(tmp_path):
    # Prepare: a run stopped after its round-2 checkpoint, seed 0
    sc = _tiny()
    with pytest.raises(_Stop):
        run_scenario(sc, run_dir=tmp_path, on_round=_stop_at(2))
    rows_before = (tmp_path / "rounds.parquet").read_bytes()

    # Execute: resume it with another seed and learning rate
    other = _tiny("seed=9", "client.lr=0.5")
    with pytest.raises(CheckpointError) as err:
        run_scenario(other, run_dir=tmp_path, resume=True)

    # Assert: refused before anything is written, naming both fields
    assert "another experiment" in str(err.value)
    assert "seed: 0 (checkpoint) vs 9 (scenario)" in str(err.value)
    assert "client.lr" in str(err.value)
    assert (tmp_path / "rounds.parquet").read_bytes() == rows_before
    # the same experiment still resumes
    assert run_scenario(sc, run_dir=tmp_path, resume=True).status == "completed"


def test_the_cli_refuses_a_resume_whose_scenario_changed(tmp_path):
    # Prepare: a finished-but-short run whose scenario.yaml is then edited
    out = tmp_path / "run"
    args = ["run", str(TINY), "-q", "--no-report", "--workers", "0"]
    first = fedsim_here(*args, "--out", str(out), "--set", "checkpoint.every_rounds=1")
    assert first.returncode == 0, first.stderr
    text = (out / "scenario.yaml").read_text()
    text = text.replace("rounds: 2", "rounds: 4").replace("lr: 0.05", "lr: 0.5")
    (out / "scenario.yaml").write_text(text)
    before = (out / "rounds.parquet").read_bytes()

    # Execute
    p = fedsim_here("run", "--resume", str(out), "-q", "--no-report")

    # Assert: exit 2, one error line naming the field, nothing written
    assert p.returncode == 2, p.stderr
    err = " ".join(p.stderr.split())
    assert "another experiment" in err and "client.lr: 0.05 (checkpoint)" in err
    assert "Traceback" not in p.stderr
    assert (out / "rounds.parquet").read_bytes() == before


# ------------------------------------------------------------- defect 3
def test_a_plugin_exception_fails_the_run_keeps_its_rows_and_resumes(
    tmp_path, monkeypatch
):
    # Prepare: Boom raises in round 2's aggregate; the same run, fixed
    sc = _tiny(_plugin("algorithm", "Boom"))
    (tmp_path / "scenario.yaml").write_text(dump_scenario(sc))

    # Execute
    res = run_scenario(sc, run_dir=tmp_path)

    # Assert: failed, with the plug-in, the hook, the error and the traceback
    assert res.status == "failed"
    assert [r["round"] for r in res.rows] == [0, 1]
    assert len(_rows(tmp_path)) == 2  # the rows written are kept
    summary = res.summary()
    assert summary["failure"] == {
        "plugin": "algorithm 'tests.hook_plugins:Boom'",
        "hook": "aggregate",
        "error": "ValueError: boom in round 2",
        "traceback": FAILURE_FILE,
    }
    json.dumps(summary)  # summary.json can hold it
    with pytest.raises(PluginFailure, match="failed in aggregate"):
        res.reraise_failure()  # compare and stress stop on it
    trace = (tmp_path / FAILURE_FILE).read_text()
    assert "hook_plugins.py" in trace and 'raise ValueError("boom' in trace

    # Execute: the plug-in fixed, the run resumes from its last checkpoint
    monkeypatch.setattr(hook_plugins, "BROKEN", False)
    resumed = run_scenario(sc, run_dir=tmp_path, resume=True)
    whole = run_scenario(sc)

    # Assert: the result of a run that never failed
    assert resumed.status == "completed"
    assert not (tmp_path / FAILURE_FILE).exists()  # no stale traceback
    assert _without_wall(resumed.rows) == _without_wall(whole.rows)
    assert _without_wall(resumed.clients) == _without_wall(whole.clients)


def test_a_failed_run_exits_3_with_one_line_and_the_resume_command(tmp_path):
    out = tmp_path / "run"
    p = fedsim_here(
        *("run", str(TINY), "-q", "--no-report", "--workers", "0", "--out", str(out)),
        *("--set", "rounds=4", "--set", "checkpoint.every_rounds=1"),
        *("--set", _plugin("algorithm", "Boom")),
    )
    assert p.returncode == 3, p.stderr
    err = " ".join(p.stderr.split())
    assert "algorithm 'tests.hook_plugins:Boom' failed in aggregate" in err
    assert f"fedsim run --resume {out}" in err and "Traceback (most" not in err
    assert f"full traceback is in {out / FAILURE_FILE}" in err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["failure"]["hook"] == "aggregate"
    assert len(_rows(out)) == 2 and (out / FAILURE_FILE).is_file()


def test_compare_exits_3_with_one_line_when_an_arms_plugin_fails(tmp_path):
    # Prepare / Execute: fedavg, then the arm whose aggregate raises
    p = fedsim_here(
        *("compare", str(TINY), "--seeds", "1", "--workers", "0", "--quiet"),
        *("-a", "fedavg,tests.hook_plugins:Boom", "--out", str(tmp_path / "c")),
        *("--set", "rounds=3"),
    )
    # Assert: a run's exit code for a plug-in's failure, one error line
    assert p.returncode == 3, p.stderr
    lines = [x for x in p.stderr.splitlines() if x.strip()]
    assert lines[-1].startswith("error: algorithm 'tests.hook_plugins:Boom'"), lines
    assert "failed in aggregate: ValueError: boom in round 2" in lines[-1]
    assert "Traceback (most" not in p.stderr
    assert (tmp_path / "c" / "runs" / "fedavg-seed0.parquet").is_file()


def test_a_client_hook_that_raises_names_the_hook_and_its_line(tmp_path):
    res = run_scenario(_tiny(_plugin("algorithm", "GradBoom")), run_dir=tmp_path)
    assert res.status == "failed" and res.rows == []
    assert res.failure is not None and res.failure["hook"] == "grad_hook"
    assert res.failure["error"] == "ZeroDivisionError: grad_hook divides by zero"
    assert "hook_plugins.py" in (tmp_path / FAILURE_FILE).read_text()


# ------------------------------------------------ issue 39: wrong results
@pytest.mark.parametrize(
    ("override", "hook", "expected"),
    [
        (
            _plugin("algorithm", "WrongSize"),
            "aggregate",
            "returned state['x'] of shape (32,) and dtype torch.float32, "
            "expected shape (33,)",
        ),
        (
            _plugin("algorithm", "AsList"),
            "aggregate",
            "returned state['x'] as a list, expected a Tensor of shape (33,)",
        ),
        (
            _plugin("algorithm", "NoInfo"),
            "aggregate",
            "returned a dict, expected a pair (state, AggregateInfo)",
        ),
        (
            _plugin("algorithm", "WordMetric"),
            "aggregate",
            "reported metric 'mood' as a str, expected a real number",
        ),
        (
            _plugin("algorithm", "StrayInstruction"),
            "instruct",
            "gave instructions to client 10000, which does not train this round",
        ),
        (
            _plugin("selector", "Twice", ", clients_per_round: 3"),
            "select",
            "twice, expected distinct ids",
        ),
        (
            _plugin("selector", "Outside", ", clients_per_round: 3"),
            "select",
            "returned client 10000, which is not among this draw's",
        ),
        (
            _plugin("selector", "FloatIds", ", clients_per_round: 3"),
            "select",
            "(float64, 1-d), expected a 1-d array of integer client ids",
        ),
        (
            _plugin("selector", "ArrayState", ", clients_per_round: 3"),
            "select",
            "returned a state that is not a JSON value",
        ),
    ],
)
def test_a_hook_returning_the_wrong_thing_fails_the_run_naming_it(
    tmp_path, override, hook, expected
):
    # Prepare: the run's first checkpoint is after round 0's rows
    sc = _tiny(override)
    # Execute
    res = run_scenario(sc, run_dir=tmp_path)
    # Assert: one clear message: the plug-in, the hook, what was expected
    assert res.status == "failed"
    kind = override.split("=")[0]
    name = override.split("'")[1]
    assert res.message.startswith(f"{kind} {name!r} failed in {hook}: ")
    assert expected in res.message
    assert "No exception was raised" in (tmp_path / FAILURE_FILE).read_text()


def test_the_contract_catches_what_the_server_refuses():
    with pytest.raises(AssertionError, match="expected shape"):
        check_algorithm(hook_plugins.WrongSize())
    with pytest.raises(AssertionError, match="expected a pair"):
        check_algorithm(hook_plugins.NoInfo())
    with pytest.raises(AssertionError, match="which does not train this round"):
        check_algorithm(hook_plugins.StrayInstruction())


def test_the_contract_passes_the_hooks_used_rightly(example_on_path):
    from fedsim_example.catchup import CatchUp

    check_algorithm(hook_plugins.Echo(), identical=lambda a, x0, d, n: x0 + d)
    check_algorithm(CatchUp(), identical=lambda a, x0, d, n: x0 + d)
    check_selector(hook_plugins.Counting(clients_per_round=3))


# ------------------------------------------------------- hooks 1, 2, 3
def test_instructions_reach_their_client_and_failures_the_server(tmp_path):
    # Prepare: a deadline that some clients miss, so rounds have failures
    sc = _tiny(
        _plugin("algorithm", "Echo"),
        _plugin("selector", "Counting", ", clients_per_round: 4"),
        "round={policy: fixed_epochs, epochs: 1, deadline_s: 1}",
    )
    # Execute
    res = run_scenario(sc, run_dir=tmp_path)
    # Assert: every trained client uploaded its own round's tag; the
    # context's failures are the round's dropped clients; both plug-ins'
    # metrics are columns
    assert res.status == "completed"
    rows = _rows(tmp_path)
    assert [r["alg_tags_ok"] for r in rows] == [r["n_completed"] for r in rows]
    assert [r["alg_lost"] for r in rows] == [r["n_dropped"] for r in rows]
    assert sum(r["n_dropped"] for r in rows) > 0  # the deadline bit
    assert [r["sel_seen"] for r in rows] == [1, 2, 3, 4]


def test_instructions_on_the_batched_path_train_one_by_one_alike():
    # resources.vectorize cannot start clients from their own payloads: the
    # worker trains them sequentially (and says why), with the same rows
    echo = _plugin("algorithm", "Echo")
    plain = run_scenario(_tiny(echo))
    batched = run_scenario(_tiny(echo, "resources.vectorize=true"))
    assert _without_wall(batched.rows) == _without_wall(plain.rows)
    assert all(r["alg_tags_ok"] == r["n_completed"] for r in batched.rows)


def test_the_example_hooks_give_the_same_rows_after_a_resume(tmp_path, example_on_path):
    # Prepare: the example's CatchUp scenario, whole and stopped in round 3
    sc = load_scenario(EXAMPLE / "catchup.yaml")
    whole = run_scenario(sc)
    part = tmp_path / "part"
    part.mkdir()
    with pytest.raises(_Stop):
        run_scenario(sc, run_dir=part, on_round=_stop_at(3))
    # Execute
    resumed = run_scenario(sc, run_dir=part, resume=True)
    # Assert: identical rows, plug-in columns included; the lost share is
    # what the clock dropped (the failures the server rule saw)
    assert _without_wall(resumed.rows) == _without_wall(whole.rows)
    assert _without_wall(resumed.clients) == _without_wall(whole.clients)
    rows = whole.rows
    assert all(
        math.isclose(r["alg_lost_share"], r["n_dropped"] / r["n_selected"])
        for r in rows
    )
    assert max(r["alg_mean_lr_scale"] for r in rows) > 1.0  # instructions used


def test_fedexp_reports_its_step_size_as_a_column_and_a_figure(
    tmp_path, example_on_path
):
    from fedsim.results import write_summary
    from fedsim.tools.report import write_report

    # a learning rate at which the clients' first updates already disagree
    sc = load_scenario(EXAMPLE / "scenario.yaml", ["rounds=2", "client.lr=0.5"])
    (tmp_path / "scenario.yaml").write_text(dump_scenario(sc))
    res = run_scenario(sc, run_dir=tmp_path)
    write_summary(tmp_path / "summary.json", res.summary())
    # round 0's step size by hand, from the updates its clients make
    eta = _fedexp_step(sc, [c for c in res.clients if c["round"] == 0], 1e-3)
    assert eta > 1.0  # extrapolated: the max(1, ...) does not decide it
    assert res.rows[0]["alg_eta_g"] == pytest.approx(eta, rel=1e-9)
    report = write_report(tmp_path).read_text()
    assert "plugin_metrics.png" in report and "## Plug-in metrics" in report
    assert_figure(tmp_path / "plugin_metrics.png")


def _fedexp_step(sc, clients, epsilon: float) -> float:
    """FedExP's eta_g for the first round, recomputed: the round's clients
    (their ids and tau from clients.parquet) trained again from the initial
    model, then max(1, sum_i p_i ||D_i||^2 / (2 (||sum_i p_i D_i||^2 + eps)))."""
    import torch

    from fedsim.data import build_data
    from fedsim.runtime import run_setup
    from fedsim.server import Server
    from fedsim.workers import Task, Worker

    data = build_data(sc.data, sc.num_clients, sc.seed)
    setup = run_setup(sc)
    payload = Server(setup.server, data).payload()
    tasks = [Task(c["client_id"], 0, c["tau"]) for c in clients if not c["dropped"]]
    ups = Worker(setup.worker, data, threads=1).train_sequential(payload, tasks, {})
    p = torch.tensor([u.weight for u in ups], dtype=torch.float64)
    p = p / p.sum()
    deltas = torch.stack([u.delta.double() for u in ups])
    mean = p @ deltas
    spread = float(p @ (deltas**2).sum(dim=1))
    return max(1.0, spread / (2.0 * (float(mean @ mean) + epsilon)))


def test_meter_average_is_the_builtin_convention():
    # The meter a plug-in reports for a step along the p-weighted average
    # is the one fedadam (FedAvg's weighting) reports: chi^2 > 0 when the
    # clients took different steps; weighting by p alone would give 0.
    import torch

    from fedsim.algorithms import FedAdam
    from fedsim.api import ClientUpdate, meter, meter_average

    ups = [
        ClientUpdate(0, torch.ones(3), 1.0, 2, 0.2, 0.0),
        ClientUpdate(1, torch.ones(3), 3.0, 10, 1.0, 0.0),
    ]
    adam = FedAdam()
    _, builtin = adam.aggregate(adam.init(torch.zeros(3), 2), ups)
    ours = meter_average(ups)
    assert ours.weights == builtin.weights and ours.tau_eff == builtin.tau_eff
    assert ours.chi2_pw == builtin.chi2_pw > 0.1
    assert meter(ups, [0.25, 0.75], 1.0).chi2_pw == 0.0  # the wrong choice


# ---------------------------------------------------------- on Ray workers
@pytest.mark.ray
def test_hooks_give_the_same_rows_on_two_ray_workers_and_the_server_actor(
    ray_session, tmp_path
):
    # Prepare: instructions, failures and both plug-ins' metrics, with a
    # deadline some clients miss (the workers import tests.hook_plugins from
    # the driver's folder, the repository root)
    overrides = [
        _plugin("algorithm", "Echo"),
        _plugin("selector", "Counting", ", clients_per_round: 4"),
        "round={policy: fixed_epochs, epochs: 1, deadline_s: 1}",
    ]
    sc = _tiny(*overrides)
    actor = _tiny(*overrides, "resources.server={home: actor, cpus: 0}")
    # Execute
    here = run_scenario(sc)
    two = run_scenario(sc, workers=2)
    remote = run_scenario(actor, workers=2)
    boom = run_scenario(_tiny(_plugin("algorithm", "GradBoom")), workers=2)
    home = "resources.server={home: actor, cpus: 0}"
    boom_there = run_scenario(_tiny(_plugin("algorithm", "Boom"), home), workers=2)
    # Assert: the same rows, plug-in columns included; a client hook that
    # raises on a worker fails the run, naming it
    assert here.status == two.status == remote.status == "completed"
    for res in (two, remote):
        assert _without_wall(res.rows) == _without_wall(here.rows)
        assert _without_wall(res.clients) == _without_wall(here.clients)
    assert [r["alg_tags_ok"] for r in two.rows] == [r["n_completed"] for r in two.rows]
    assert boom.status == "failed" and boom.failure is not None
    assert boom.failure["hook"] == "grad_hook"
    # aggregate raising inside the server actor: the same failure, its rows
    assert boom_there.status == "failed" and len(boom_there.rows) == 2
    assert boom_there.failure == {
        "plugin": "algorithm 'tests.hook_plugins:Boom'",
        "hook": "aggregate",
        "error": "ValueError: boom in round 2",
    }


# explore: the command line's repeat of what
# test_hooks_give_the_same_rows_on_two_ray_workers_and_the_server_actor checks
# on the shared Ray session (CI runs it when its budget allows)
@pytest.mark.explore
@pytest.mark.ray
@pytest.mark.slow
def test_the_example_on_two_ray_workers_from_the_command_line(tmp_path):
    # Prepare: the example's CatchUp through the command line, in process
    # and on 2 Ray workers (they import the example from PYTHONPATH)
    scenario = str(EXAMPLE / "catchup.yaml")
    ref, ray = tmp_path / "w0", tmp_path / "w2"
    # Execute
    args = ("run", scenario, "-q", "--no-report", "--workers")
    a = _fedsim(*args, "0", "--out", str(ref))
    b = _fedsim(*args, "2", "--out", str(ray))
    # Assert: identical rows with the plug-in's columns
    assert a.returncode == b.returncode == 0, a.stderr + b.stderr
    for name in ("rounds.parquet", "clients.parquet"):
        assert _rows(ray, name) == _rows(ref, name)
    assert "alg_lost_share" in _rows(ray)[0]
