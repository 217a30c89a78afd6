"""Odd but valid scenarios, run end to end: every run ends well, and in time.

Hypothesis builds scenarios that pass (or nearly pass) validation yet push
the runtime to its edges: windows shorter than one step or than the
download, fleets that nobody (or only a few) are online in, devices at 1e-3
and 1e6 steps/s, bandwidths from 1 kbit/s to 1 Tbit/s, dropouts with
probability near 1, asynchronous runs with dropouts and ``max_staleness: 0``,
FedBuff buffers larger than the fleet, ``clients_per_round`` larger than the
fleet, one-device fleets, datasets with fewer samples than clients or than a
batch, both synchronous policies and the asynchronous timeline, and most of
the algorithms. Each scenario is written to a file and run with
``fedsim run FILE --workers 0 --out DIR --quiet`` (typer's CliRunner, in
this process: a torch import per example would not fit the time budget).

The property, for every example:

- the command ends within ``RUN_S`` seconds (a SIGALRM raises
  :class:`Hang`, which no ``except Exception`` in fedsim can swallow);
- it never raises: no traceback, whatever the exit code;
- exit 0: the run completed; summary.json says ``completed`` and its
  ``degenerate`` flag matches the one-line warning on stderr;
- exit 1: stderr is one ``run stalled:`` or ``run diverged:`` line (plus the
  degenerate warning, when it applies) and summary.json says so;
- exit 2: stderr is one ``error:`` message and no summary.json was written;
- the run directory agrees with summary.json (rows on disk, rounds counted,
  ``LATEST`` naming a checkpoint that exists).

And for the examples as a whole: at least ``MIN_TRAINED`` of the generated
ones reach training (summary.json counts at least one update that arrived),
so the property is not met by scenarios that are all refused with exit 2.

The suite is derandomized (the same examples in every run, so CI is
reproducible) and marked ``slow``. ``FEDSIM_FUZZ_EXAMPLES=200 pytest
tests/test_fuzz_runtime.py`` runs more examples (how its bugs were found;
``FEDSIM_FUZZ_RANDOM=1`` draws new ones each time);
each bug found is pinned below with ``@example`` or a plain test.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import yaml
from hypothesis import HealthCheck, Phase, event, example, given, note, settings
from hypothesis import strategies as st

from .conftest import time_limit

pytestmark = pytest.mark.slow

RUN_S = 60  # one run taking this long is a hang
# The share of generated examples (the @example ones aside) that must train:
# 13 of the 30 derandomized ones do (the rest are refused, stall or diverge).
MIN_TRAINED = 1 / 3
# An exploration draws other examples, and fewer of those train (18 of 100
# new draws did once); below this share the generator itself is broken.
MIN_TRAINED_EXPLORED = 0.1
# 30 examples take about a minute on an idle 2-core machine, three on a busy one
EXAMPLES = int(os.environ.get("FEDSIM_FUZZ_EXAMPLES", "30"))

SPEEDS = [1e-3, 0.05, 1.0, 5.0, 1e6]
BANDWIDTHS = [1e-3, 0.05, 1.0, 100.0, 1e6]  # Mbit/s
LATENCIES = [0.0, 0.05, 2.0, 1e4]
WINDOWS = [1e-6, 1e-3, 0.1, 2.0, 30.0, 1e5]
DROPOUTS = [0.0, 0.0, 0.3, 0.99, 0.999, 1.0]


# ------------------------------------------------------------ the scenarios


@st.composite
def speeds(draw) -> dict[str, Any]:
    if draw(st.booleans()):
        return {"dist": "fixed", "steps_per_s": draw(st.sampled_from(SPEEDS))}
    return {
        "dist": "lognormal",
        "median_steps_per_s": draw(st.sampled_from(SPEEDS)),
        "sigma": draw(st.sampled_from([0.0, 0.5, 3.0])),
    }


@st.composite
def availabilities(draw) -> dict[str, Any]:
    kind = draw(st.sampled_from(["always", "always", "on_off", "daily"]))
    if kind == "always":
        return {"kind": "always"}
    if kind == "on_off":
        return {
            "kind": "on_off",
            "mean_on_s": draw(st.sampled_from([1e-3, 1.0, 60.0, 3600.0])),
            "mean_off_s": draw(st.sampled_from([1e-3, 1.0, 3600.0, 1e9])),
        }
    # daily: few online (with 3 devices, often none), fewest at t = 0 when
    # the peak is half a day away
    lo = draw(st.sampled_from([0.001, 0.01]))
    return {
        "kind": "daily",
        "min_online": lo,
        "max_online": draw(st.sampled_from([0.02, 0.1, 0.5])),
        "mean_on_s": draw(st.sampled_from([0.01, 1.0, 10.0])),
        "peak_hour": draw(st.sampled_from([0.0, 12.0, 23.9])),
    }


@st.composite
def groups(draw, index: int, trace_file: str | None) -> dict[str, Any]:
    name = f"g{index}"
    if trace_file is not None and draw(st.integers(0, 3)) == 0:
        return {"name": name, "trace": trace_file}
    group: dict[str, Any] = {
        "name": name,
        "count": draw(st.integers(1, 4)),
        "speed": draw(speeds()),
        "network": {
            "down_mbps": draw(st.sampled_from(BANDWIDTHS)),
            "up_mbps": draw(st.sampled_from(BANDWIDTHS)),
            "latency_s": draw(st.sampled_from(LATENCIES)),
        },
        "availability": draw(availabilities()),
    }
    if draw(st.booleans()):
        group["stragglers"] = {
            "p": draw(st.sampled_from([0.0, 0.5, 1.0])),
            "slowdown": draw(
                st.sampled_from(
                    [
                        {"dist": "fixed", "factor": 1e6},
                        {"dist": "pareto", "shape": 0.1},
                        {"dist": "uniform", "low": 1, "high": 3},
                    ]
                )
            ),
            "dropout_p": draw(st.sampled_from(DROPOUTS)),
        }
    return group


def fleet_size(fleet: dict[str, Any], trace_rows: int) -> int:
    return sum(g.get("count", trace_rows) for g in fleet["groups"])


@st.composite
def data_sections(draw, n_devices: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """(data, model): tiny synthetic data (sometimes fewer samples than
    devices: one sample each, and test_fraction leaves none to test on),
    or a quadratic objective."""
    if draw(st.integers(0, 5)) == 0:
        centers = draw(
            st.lists(
                st.sampled_from([-1.0, 0.0, 3.0]),
                min_size=n_devices,
                max_size=n_devices,
            )
        )
        return {"dataset": "quadratic", "centers": centers}, {"name": "quadratic"}
    tiny = draw(st.booleans())
    data = {
        "dataset": "synthetic",
        "features": draw(st.sampled_from([1, 5])),
        "classes": draw(st.sampled_from([2, 3])),
        "min_samples": 1 if tiny else draw(st.sampled_from([5, 20])),
        "max_samples": draw(st.sampled_from([1, 2, 3])) if tiny else 40,
        "iid": draw(st.booleans()),
    }
    if not tiny and draw(st.integers(0, 3)) == 0:  # rows held out on clients
        data["validation_fraction"] = 0.5
    if tiny:
        data["test_fraction"] = draw(st.sampled_from([0.1, 0.5, 0.9]))
    model = {"name": draw(st.sampled_from(["logreg", "logreg", "mlp"]))}
    if model["name"] == "mlp":
        model["hidden"] = [4]
    return data, model


SYNC_ALGORITHMS: list[dict[str, Any]] = [
    {"name": "fedavg"},
    {"name": "fedprox", "mu": 0.1},
    {"name": "fednova"},
    {"name": "scaffold"},
    {"name": "feddyn", "alpha": 0.1},
    {"name": "feddc", "alpha": 0.1},
    {"name": "fedavgm"},
    {"name": "fedadam"},
    {"name": "fedpns"},
    {"name": "fednova", "tau_eff": "steps"},
    {"name": "fedbuff", "buffer_size": 2},  # a synchronous FedBuff round
    {"name": "feddm", "ipc": 1, "iterations": 2, "server_epochs": 1},
]


@st.composite
def scenarios(draw, trace_file: str | None = None, trace_rows: int = 0) -> dict:
    """A scenario as plain data (dumped to YAML by the test)."""
    n_groups = draw(st.integers(1, 2))
    fleet = {"groups": [draw(groups(i, trace_file)) for i in range(n_groups)]}
    if draw(st.integers(0, 4)) == 0:
        fleet["stragglers"] = {"p": 0.5, "dropout_p": draw(st.sampled_from(DROPOUTS))}
    n = fleet_size(fleet, trace_rows)
    data, model = draw(data_sections(n))
    policy = draw(st.sampled_from(["fixed_window", "fixed_epochs", "async"]))
    # now and then more clients per round than devices: refused with exit 2
    k = draw(st.integers(1, n + 1)) if draw(st.integers(0, 9)) == 0 else None
    k = k or draw(st.integers(1, n))
    rnd: dict[str, Any] = {
        "policy": policy,
        "max_steps": draw(st.sampled_from([1, 3, 50])),
    }
    if policy == "fixed_window":
        rnd["window_s"] = draw(st.sampled_from(WINDOWS))
    elif policy == "fixed_epochs":
        rnd["epochs"] = draw(st.sampled_from([1, 2]))
        if draw(st.booleans()):
            rnd["deadline_s"] = draw(st.sampled_from(WINDOWS))
        if draw(st.integers(0, 3)) == 0:
            rnd["over_select"] = draw(st.sampled_from([1.5, 10.0]))
    else:
        rnd["job_steps"] = draw(st.sampled_from(["max_steps", "epochs"]))
        rnd["concurrency"] = draw(st.integers(1, n + 2))
        rnd["max_staleness"] = draw(st.sampled_from([None, 0, 0, 1, 5]))
        if rnd["max_staleness"] is None:
            del rnd["max_staleness"]
    if policy == "async":
        algorithm = draw(
            st.sampled_from(
                [
                    {"name": "fedbuff", "buffer_size": draw(st.integers(1, n + 3))},
                    {"name": "fedasync"},
                    {"name": "fedbuff", "buffer_size": 1, "normalize": True},
                ]
            )
        )
        selector = {"name": draw(st.sampled_from(["uniform", "weighted"]))}
    else:
        algorithm = dict(draw(st.sampled_from(SYNC_ALGORITHMS)))
        if algorithm["name"] == "fedpns" and data["dataset"] == "quadratic":
            algorithm = {"name": "fedavg"}  # it needs held-out rows
        selector = {
            "name": draw(
                st.sampled_from(
                    ["uniform", "uniform", "weighted", "power_of_choice", "oort"]
                )
            )
        }
        if algorithm["name"] == "fedpns" and "validation_fraction" in data:
            selector = {"name": "fedpns"}
        elif algorithm["name"] == "fedpns":
            data["validation_fraction"] = 0.5
    selector["clients_per_round"] = k
    client: dict[str, Any] = {
        "solver": draw(st.sampled_from(["sgd", "sgd", "momentum", "prox", "decay"])),
        "lr": draw(st.sampled_from([1e-3, 0.05, 1.0, 1e20])),  # 1e20: diverges
        "batch_size": draw(st.sampled_from([1, 10, 10_000])),
    }
    if client["solver"] == "prox":
        client["mu"] = 0.1
    return {
        "name": "fuzz-runtime",
        "seed": draw(st.integers(0, 3)),
        "rounds": draw(st.integers(1, 3)),
        "model": model,
        "data": data,
        "client": client,
        "fleet": fleet,
        "round": rnd,
        "algorithm": algorithm,
        "selector": selector,
        "eval": {"every_rounds": draw(st.sampled_from([1, 2, 5]))},
        "checkpoint": {"every_rounds": draw(st.sampled_from([0, 1]))},
        "resources": {"workers": 0, "vectorize": draw(st.booleans())},
    }


# ---------------------------------------------------------- running a scenario

# Three measured devices, one never online and one online only after an hour.
TRACE = (
    "device,speed_steps_per_s,down_mbps,up_mbps,latency_s,availability\n"
    "never,2.0,10,10,0.1,1000000000-1000000001\n"
    "late,2.0,10,10,0.1,3600-inf\n"
    "brief,1e6,1e6,1e6,0,0-0.001\n"
)
TRACE_ROWS = 3


def run_cli(doc: dict[str, Any], d: Path, report: bool) -> dict[str, Any]:
    """Write ``doc`` to ``d``/scenario.yaml and ``fedsim run`` it into
    ``d``/run; what came out of it."""
    from typer.testing import CliRunner

    from fedsim.tools.cli import app

    path = d / "scenario.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    out = d / "run"
    args = ["run", str(path), "--workers", "0", "--out", str(out), "--quiet"]
    args.append("--report" if report else "--no-report")
    old_term = signal.getsignal(signal.SIGTERM)  # `fedsim run` installs its own
    t0 = time.monotonic()
    try:
        with time_limit(RUN_S):
            result = CliRunner().invoke(app, args)
    finally:
        signal.signal(signal.SIGTERM, old_term)
    return {
        "code": result.exit_code,
        "stdout": result.stdout,
        "stderr": result.stderr,
        "exception": result.exception,
        "exc_info": result.exc_info,
        "out": out,
        "seconds": time.monotonic() - t0,
    }


def _reason(stderr: str) -> str:
    """The gist of an error message, without the file's path."""
    text = stderr.replace("\n", " ").removeprefix("error: ")
    text = re.sub(r"\S*fedsim-fuzzrt-\S*", "FILE", text)
    return re.sub(r"\s+", " ", text)[:160]


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def check_outcome(r: dict[str, Any], rounds: int) -> str:
    """The property (see the module docstring); returns a label of the
    outcome for Hypothesis' statistics."""
    exc = r["exception"]
    if exc is not None and not isinstance(exc, SystemExit):
        tb = "".join(traceback.format_exception(*r["exc_info"]))
        pytest.fail(f"fedsim run raised (exit {r['code']}):\n{tb}")
    code, stderr, out = r["code"], r["stderr"], r["out"]
    where = f"exit {code}; stderr:\n{stderr[-3000:]}"
    assert code in (0, 1, 2), where
    assert "Traceback" not in stderr + r["stdout"], where
    assert " object at 0x" not in stderr, where
    lines = _lines(stderr)
    summary_path = out / "summary.json"
    if code == 2:
        assert lines and lines[0].startswith("error: "), where
        # one message: a scenario's list of problems is indented under it
        assert all(x[0].isspace() for x in lines[1:]), where
        assert not summary_path.exists(), f"exit 2 but a summary.json: {where}"
        return "exit 2: " + _reason(stderr)
    assert summary_path.exists(), f"no summary.json: {where}"
    summary = json.loads(summary_path.read_text())
    warning = [x for x in lines if x.startswith("warning: degenerate run")]
    assert bool(warning) == bool(summary["degenerate"]), (summary, where)
    # what the fleet did beside what it declared (fedsim.realised): each such
    # line is one of summary.json's own warnings
    realised = summary.get("fleet_realised", {}).get("warnings", [])
    fleet = [x for x in lines if x.removeprefix("warning: ") in realised]
    assert len(fleet) == len(realised), (realised, where)
    others = [x for x in lines if x not in warning and x not in fleet]
    if code == 0:
        assert summary["status"] == "completed", (summary, where)
        assert not others, where
        assert summary["rounds"] == rounds, summary
    else:
        assert summary["status"] in ("stalled", "diverged"), (summary, where)
        assert len(others) == 1, where
        assert others[0].startswith(f"run {summary['status']}: "), where
        # a stall ends the run early; a NaN stops it, but a finite loss past
        # the divergence bound only marks a run that went on to the end
        if summary["status"] == "stalled":
            assert summary["rounds"] < rounds, summary
        else:
            assert summary["rounds"] <= rounds, summary
    check_run_dir(out, summary)
    label = f"exit {code}: {summary['status']}"
    return label + (" (degenerate)" if summary["degenerate"] else "")


def check_run_dir(out: Path, summary: dict[str, Any]) -> None:
    """The files agree with summary.json."""
    rows = pq.read_table(out / "rounds.parquet").to_pylist()
    assert len(rows) == summary["rounds"], (len(rows), summary)
    clients = pq.read_table(out / "clients.parquet").to_pylist()
    arrived = sum(int(r["n_completed"]) for r in rows)
    assert summary["updates_completed"] == arrived, summary
    assert [r["round"] for r in rows] == list(range(len(rows)))
    for key in ("bytes_down", "bytes_up"):
        assert summary[key] == sum(int(c[key]) for c in clients), (key, summary)
    latest = out / "LATEST"
    if latest.exists():
        assert (out / latest.read_text().strip()).is_dir(), latest.read_text()
    for key in ("final_test_accuracy", "final_test_loss", "sim_time_s"):
        v = summary.get(key)
        assert v is None or isinstance(v, int | float), (key, v)
        if key == "sim_time_s" and v is not None:
            assert math.isfinite(v) and v >= 0, summary


def fuzz_once(doc: dict[str, Any], report: bool) -> bool:
    """Run ``doc`` and check the property; whether it reached training."""
    note(yaml.safe_dump(doc, sort_keys=False))
    with tempfile.TemporaryDirectory(prefix="fedsim-fuzzrt-") as tmp:
        d = Path(tmp)
        _place_trace(doc, d)
        r = run_cli(doc, d, report)
        note(f"exit {r['code']} in {r['seconds']:.1f} s; stderr: {r['stderr']}")
        event(check_outcome(r, doc["rounds"]))
        summary = r["out"] / "summary.json"
        done = json.loads(summary.read_text()) if summary.exists() else {}
        if report and done.get("rounds"):
            assert (r["out"] / "report.md").exists(), "--report wrote no report.md"
        return done.get("updates_completed", 0) > 0


def _place_trace(doc: dict[str, Any], d: Path) -> None:
    """Trace groups name ``devices.csv``, written next to the scenario."""
    for g in doc["fleet"]["groups"]:
        if "trace" in g:
            (d / "devices.csv").write_text(TRACE)


FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,  # `time_limit` bounds each run instead
    # the same examples in every run (CI); FEDSIM_FUZZ_RANDOM=1 explores
    derandomize=not os.environ.get("FEDSIM_FUZZ_RANDOM"),
    phases=(Phase.explicit, Phase.generate),  # no shrinking: runs cost seconds
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    report_multiple_bugs=False,
)


# ------------------------------------------------------ what fuzzing found

BASE: dict[str, Any] = {
    "name": "fuzz-found",
    "seed": 0,
    "rounds": 2,
    "model": {"name": "logreg"},
    "data": {
        "dataset": "synthetic",
        "features": 3,
        "classes": 2,
        "min_samples": 5,
        "max_samples": 10,
    },
    "client": {"solver": "sgd", "lr": 0.05, "batch_size": 10},
    "fleet": {"groups": [{"name": "g0", "count": 3, "speed": {"steps_per_s": 5}}]},
    "round": {"policy": "fixed_window", "window_s": 10.0, "max_steps": 3},
    "algorithm": {"name": "fedavg"},
    "selector": {"name": "uniform", "clients_per_round": 2},
    "resources": {"workers": 0},
}


def found(**sections: Any) -> dict[str, Any]:
    """BASE with whole sections replaced."""
    return {**json.loads(json.dumps(BASE)), **sections}


FOUND = {
    # FedAsync's worker adds a proximal term (rho = 0.005 by default), which
    # the momentum and decay solvers refuse: validation said ok, then `fedsim
    # run` died with a ValueError traceback once training started.
    "fedasync-momentum": found(
        client={"solver": "momentum", "lr": 0.05},
        round={"policy": "async", "max_steps": 3},
        algorithm={"name": "fedasync"},
        selector={"name": "uniform", "clients_per_round": 1},
    ),
    # The same with FedProx's mu and the decay solver.
    "fedprox-decay": found(
        client={"solver": "decay", "lr": 0.05, "step_decay": 0.5},
        algorithm={"name": "fedprox", "mu": 0.1},
    ),
    # Proximal SGD with lr * mu >= 2 has ||a||_1 <= 0 after an even number of
    # steps; FedBuff's normalisation then raised a ValueError traceback
    # mid-run (found with lr 1e20, mu 0.1; here lr * mu = 2, tau = 2).
    "prox-overshoot-normalized": found(
        client={"solver": "prox", "lr": 20.0, "mu": 0.1},
        round={"policy": "async", "max_steps": 2},
        algorithm={"name": "fedbuff", "buffer_size": 1, "normalize": True},
    ),
    # An asynchronous run that stalls before its first server version wrote
    # summary.json but no tables: `fedsim report` called the folder "not a run
    # directory", and `fedsim run --out` there said to --resume it (which
    # cannot work: no checkpoint).
    "stalled-before-first-version": found(
        fleet={
            "groups": [
                {
                    "name": "g0",
                    "count": 3,
                    "speed": {"steps_per_s": 5},
                    "stragglers": {"dropout_p": 1.0},
                }
            ]
        },
        round={"policy": "async", "max_steps": 3},
        algorithm={"name": "fedbuff", "buffer_size": 2},
    ),
}


ABSENT = {"kind": "on_off", "mean_on_s": 1e-3, "mean_off_s": 1e9}
ABSENT_FLEET = {
    "groups": [
        {"name": "g0", "count": 3, "speed": {"steps_per_s": 5}, "availability": ABSENT}
    ]
}
# Corners the generator reaches only now and then, run on every CI run.
CORNERS = {
    "nobody-online-sync": found(fleet=ABSENT_FLEET),
    "nobody-online-async": found(
        fleet=ABSENT_FLEET,
        round={"policy": "async", "max_steps": 3, "max_staleness": 0},
        algorithm={"name": "fedbuff", "buffer_size": 5},
    ),
    "window-shorter-than-one-step": found(
        fleet={"groups": [{"name": "g0", "count": 2, "speed": {"steps_per_s": 1e-3}}]},
        round={"policy": "fixed_window", "window_s": 1e-6},
    ),
    "one-device-one-sample": found(
        data={**BASE["data"], "min_samples": 1, "max_samples": 1},
        client={"solver": "sgd", "lr": 0.05, "batch_size": 10_000},
        fleet={"groups": [{"name": "g0", "count": 1, "speed": {"steps_per_s": 1e6}}]},
        round={"policy": "fixed_epochs", "epochs": 2},
        selector={"name": "uniform", "clients_per_round": 1},
    ),
}


def test_a_run_stalled_before_its_first_version_leaves_empty_tables(tmp_path):
    # Prepare
    from typer.testing import CliRunner

    from fedsim.tools.cli import app

    # Execute
    r = run_cli(FOUND["stalled-before-first-version"], tmp_path, report=False)
    report = CliRunner().invoke(app, ["report", str(r["out"])])

    # Assert: exit 1, stalled, and a folder the other commands take as a run
    assert r["code"] == 1 and r["stderr"].startswith("run stalled: "), r["stderr"]
    assert pq.read_table(r["out"] / "rounds.parquet").num_rows == 0
    assert pq.read_table(r["out"] / "clients.parquet").num_rows == 0
    assert report.exit_code == 0, report.output
    assert (r["out"] / "report.md").exists()


def test_a_run_with_an_empty_test_set_is_flagged_degenerate(tmp_path):
    # Prepare: one sample per client, and training keeps it (test_fraction
    # 0.1 of 1 rounds to 0): the run used to end with exit 0, accuracy null
    # and no word about why
    doc = CORNERS["one-device-one-sample"]

    # Execute
    r = run_cli(doc, tmp_path, report=False)

    # Assert
    summary = json.loads((r["out"] / "summary.json").read_text())
    assert r["code"] == 0 and summary["final_test_accuracy"] is None
    assert "test set is empty" in (summary["degenerate"] or ""), summary
    assert "warning: degenerate run: the test set is empty" in r["stderr"]


def test_millisecond_sessions_in_a_long_window_are_refused_before_running(tmp_path):
    # Prepare: availability advances flip by flip from t = 0, so 1 ms
    # sessions in a 1e5 s window are ~1e8 flips a round: this ran for hours
    absent = {"kind": "on_off", "mean_on_s": 1e-3, "mean_off_s": 1e-3}
    fleet = {"groups": [{**BASE["fleet"]["groups"][0], "availability": absent}]}
    doc = found(
        fleet=fleet, round={"policy": "fixed_window", "window_s": 1e5, "max_steps": 3}
    )
    global RUN_S
    bound, RUN_S = RUN_S, 15

    # Execute
    try:
        r = run_cli(doc, tmp_path, report=False)
    finally:
        RUN_S = bound

    # Assert: exit 2 before training, naming the field and the way out
    assert check_outcome(r, doc["rounds"]).startswith("exit 2")
    assert "fleet.groups[0].availability" in r["stderr"]
    assert "use sessions of at least" in r["stderr"]


@pytest.mark.parametrize(
    "name", ["fedasync-momentum", "fedprox-decay", "prox-overshoot-normalized"]
)
def test_a_solver_the_algorithm_refuses_is_an_invalid_scenario(name):
    from fedsim.scenario import ScenarioError, parse_scenario

    text = yaml.safe_dump(FOUND[name])
    with pytest.raises(ScenarioError, match=r"client\.solver: "):
        parse_scenario(text, "found.yaml")


# -------------------------------------------------------------- the property


EXPLICIT = [
    (FOUND["fedasync-momentum"], False),
    (FOUND["fedprox-decay"], False),
    (FOUND["stalled-before-first-version"], True),
    (FOUND["prox-overshoot-normalized"], False),
    (CORNERS["nobody-online-sync"], True),
    (CORNERS["nobody-online-async"], False),
    (CORNERS["window-shorter-than-one-step"], False),
    (CORNERS["one-device-one-sample"], True),
]


def odd_scenarios_end_well(fuzz: settings, min_trained: float = MIN_TRAINED) -> None:
    """The property on every example ``fuzz`` draws (and the EXPLICIT ones),
    and at least ``min_trained`` of the generated examples train."""
    trained: list[bool] = []  # per generated example

    @fuzz
    @given(
        doc=scenarios("devices.csv", TRACE_ROWS),
        report=st.sampled_from([False, False, False, True]),  # figures cost seconds
    )
    def odd_scenarios(doc, report):
        went = fuzz_once(doc, report)
        if (doc, report) not in EXPLICIT:
            trained.append(went)

    for doc, report in EXPLICIT:
        odd_scenarios = example(doc=doc, report=report)(odd_scenarios)
    odd_scenarios()

    # Assert: enough of the generated examples trained (not all refused)
    share = sum(trained) / len(trained)
    print(f"{sum(trained)} of {len(trained)} generated examples trained")
    assert len(trained) >= fuzz.max_examples // 2, len(trained)
    assert share >= min_trained, f"only {sum(trained)} of {len(trained)} trained"


def test_odd_scenarios_end_well_and_in_time():
    odd_scenarios_end_well(FUZZ)


@pytest.mark.explore
@pytest.mark.timeout(3600)
def test_odd_scenarios_explored():
    # More examples (FEDSIM_FUZZ_EXAMPLES, default 200): the same ones in every
    # run, so a CI failure reproduces; FEDSIM_FUZZ_RANDOM=1 draws new ones
    # (FUZZ reads it), which is how a person explores.
    n = int(os.environ.get("FEDSIM_FUZZ_EXAMPLES", "200"))
    odd_scenarios_end_well(settings(FUZZ, max_examples=n), MIN_TRAINED_EXPLORED)
