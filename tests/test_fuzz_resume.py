"""Interrupt a run anywhere, resume it, and get the uninterrupted run's results.

Hypothesis picks an algorithm (synchronous, stateful, asynchronous), a
checkpoint cadence and the point where the run stops: during set-up (the
data, the executor) or after any round. The run is then resumed (or, when no
checkpoint was written yet, run again with ``--overwrite``) and every column
of rounds.parquet and clients.parquet, less ``wall_time``, must equal those
of the same run left alone. The in-process cases raise KeyboardInterrupt
where a signal would; a few cases send a real SIGINT or SIGTERM to a
``fedsim`` subprocess. A last property feeds odd ``--algorithms`` labels
(spaces, signs, exponents, long values, characters a file name cannot hold)
to ``fedsim compare``: it ends in a result or one error line, never a
traceback, and writes bounded, distinct file names.

Derandomized (the same examples in every run) with few examples, so the
file stays within a small time budget; ``FEDSIM_FUZZ_RESUME_EXAMPLES=50``
runs more.
"""

from __future__ import annotations

import json
import os
import subprocess
from functools import cache
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, Phase, example, given, note, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from fedsim.tools.cli import app

from .conftest import SCENARIOS, run_python

TINY = str(SCENARIOS / "ci" / "tiny-synthetic.yaml")
ROUNDS = 4
EXAMPLES = int(os.environ.get("FEDSIM_FUZZ_RESUME_EXAMPLES", "8"))
RESUME = settings(
    max_examples=EXAMPLES,
    deadline=None,  # a run takes seconds on a busy machine
    derandomize=True,
    phases=(Phase.explicit, Phase.generate),  # no shrinking: runs cost seconds
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.function_scoped_fixture,
    ],
    report_multiple_bugs=False,
)
# algorithm section -> what it exercises on resume
ALGORITHMS = {
    "{name: fedavg}": "synchronous, stateless",
    "{name: scaffold}": "per-client state in the store",
    "{name: fedbuff, buffer_size: 2}": "asynchronous: versions in flight",
}


def cli(*args: object):
    return CliRunner().invoke(app, [str(a) for a in args])


def overrides(algorithm: str, every: int) -> list[str]:
    sets = [f"algorithm={algorithm}", f"rounds={ROUNDS}"]
    sets.append(f"checkpoint.every_rounds={every}")
    if "fedbuff" in algorithm:
        sets.append("round={policy: async, concurrency: 3, job_steps: epochs}")
    return sets


def run_args(out: Path, sets: list[str], *extra: str) -> list[str]:
    args = ["run", TINY, "--workers", "0", "--out", str(out), "-q", "--no-report"]
    for s in sets:
        args += ["--set", s]
    return [*args, *extra]


def tables(run_dir: Path) -> dict[str, list[dict]]:
    """rounds.parquet and clients.parquet without the wall-clock column."""
    out = {}
    for name in ("rounds", "clients"):
        rows = pq.read_table(run_dir / f"{name}.parquet").to_pylist()
        out[name] = [{k: v for k, v in r.items() if k != "wall_time"} for r in rows]
    return out


@cache
def reference(algorithm: str, every: int, root: str) -> dict[str, list[dict]]:
    """The uninterrupted run's tables (once per configuration)."""
    out = Path(root) / f"ref-{abs(hash((algorithm, every)))}"
    r = cli(*run_args(out, overrides(algorithm, every)))
    assert r.exit_code == 0, r.output
    return tables(out)


class Stop(Exception):
    """Where the test stops the run; raised as KeyboardInterrupt."""


def stop_at(monkeypatch, where: str, at_round: int) -> None:
    """Make the run see Ctrl-C at ``where`` (set-up) or after ``at_round``."""
    import fedsim.runtime

    def interrupt(original):
        def wrapped(*args, **kwargs):
            raise KeyboardInterrupt

        return wrapped

    if where in ("build_data", "make_executor"):
        original = getattr(fedsim.runtime, where)
        monkeypatch.setattr(fedsim.runtime, where, interrupt(original))
        return
    record = fedsim.runtime._Run.record

    def record_then_stop(self, t, *args, **kwargs):
        record(self, t, *args, **kwargs)
        if t == at_round:
            raise KeyboardInterrupt

    monkeypatch.setattr(fedsim.runtime._Run, "record", record_then_stop)


@RESUME
@given(
    algorithm=st.sampled_from(list(ALGORITHMS)),
    every=st.sampled_from([1, 2, 3]),
    where=st.sampled_from(["build_data", "make_executor", "round", "round"]),
    at_round=st.integers(0, ROUNDS - 1),
)
def test_interrupt_anywhere_then_resume_equals_the_run_left_alone(
    tmp_path_factory, monkeypatch, algorithm, every, where, at_round
):
    # Prepare
    root = tmp_path_factory.getbasetemp()
    want = reference(algorithm, every, str(root))
    out = tmp_path_factory.mktemp("run")
    sets = overrides(algorithm, every)
    note(f"{algorithm}, checkpoint every {every}, stop at {where} {at_round}")

    # Execute: interrupted (exit 130), then resumed or run again
    with monkeypatch.context() as m:
        stop_at(m, where, at_round)
        first = cli(*run_args(out, sets))
    assert first.exit_code == 130, first.output
    assert "Traceback" not in first.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "interrupted"
    if (out / "LATEST").exists():
        again = cli("run", "--resume", out, "-q", "--no-report")
    else:  # nothing to resume from: the message says to run it again
        assert "run the same command with --overwrite" in first.output
        again = cli(*run_args(out, sets, "--overwrite"))

    # Assert
    assert again.exit_code == 0, again.output
    assert tables(out) == want
    done = json.loads((out / "summary.json").read_text())
    assert done["status"] == "completed" and done["rounds"] == ROUNDS


_SIGNAL_DRIVER = """
import os, signal, sys
import fedsim.runtime

sig, at_round = getattr(signal, sys.argv[1]), int(sys.argv[2])
record = fedsim.runtime._Run.record

def record_then_signal(self, t, *args, **kwargs):
    record(self, t, *args, **kwargs)
    if t == at_round:
        os.kill(os.getpid(), sig)

fedsim.runtime._Run.record = record_then_signal
sys.argv = ["fedsim", *sys.argv[3:]]
import fedsim.tools.cli
fedsim.tools.cli.main()
"""


def fedsim_process(
    *args: str, driver: tuple[str, ...] = ()
) -> subprocess.CompletedProcess:
    """``fedsim *args`` in its own process (through the signal driver when
    ``driver`` gives the signal and the round to send it at)."""
    code = ["-c", _SIGNAL_DRIVER, *driver] if driver else ["-m", "fedsim.tools.cli"]
    return run_python(*code, *args)


@pytest.mark.slow
@settings(RESUME, max_examples=max(2, EXAMPLES // 4))
@given(
    sig=st.sampled_from(["SIGINT", "SIGTERM"]),
    at_round=st.integers(0, ROUNDS - 1),
)
def test_a_real_signal_in_a_round_then_resume_equals_the_run_left_alone(
    tmp_path_factory, sig, at_round
):
    # Prepare
    algorithm, every = "{name: scaffold}", 1
    want = reference(algorithm, every, str(tmp_path_factory.getbasetemp()))
    out = tmp_path_factory.mktemp("signalled")
    args = run_args(out, overrides(algorithm, every))

    # Execute: a real signal after round ``at_round``, then a resume (in
    # this process: only the signalled run needs one of its own, and each
    # process costs a Python start and a torch import)
    first = fedsim_process(*args, driver=(sig, str(at_round)))
    assert first.returncode == 130, first.stderr[-2000:]
    if (out / "LATEST").exists():
        assert f"fedsim run --resume {out}" in first.stderr
        again = cli("run", "--resume", str(out), "-q", "--no-report")
    else:  # stopped before the first checkpoint (after round 0's row)
        assert "run the same command with --overwrite" in first.stderr
        again = cli(*args, "--overwrite")

    # Assert
    assert again.exit_code == 0, again.output[-2000:]
    assert tables(out) == want


# ----------------------------------------------------------- odd labels
_NAMES = ["fedavg", "fedprox", "fednova", "FedAvg", "nosuch", ""]
_VALUES = ["0.5", "+0.5", "5e-1", " 0.5 ", "-1", "1e400", "nan", "'0.5'", "[1]"]
_VALUES += ["0." + "0" * 200 + "1", "x/y", "a\\b", "é", "true"]
_KEYS = ["mu", " mu ", "MU", "nosuch", "a/b"]


@st.composite
def labels(draw) -> str:
    name = draw(st.sampled_from(_NAMES))
    pairs = draw(
        st.lists(
            st.tuples(st.sampled_from(_KEYS), st.sampled_from(_VALUES)), max_size=2
        )
    )
    if not pairs:
        return draw(st.sampled_from(["", " ", ":"])) + name
    return name + ":" + ",".join(f"{k}={v}" for k, v in pairs)


@settings(RESUME, max_examples=EXAMPLES * 25)
@given(text=labels())
def test_canonical_labels_are_stable_and_name_bounded_files(text):
    from fedsim.scenario import ScenarioError
    from fedsim.tools.compare import canonical_label, safe_name

    try:
        label = canonical_label(text)
    except ScenarioError:
        return  # a malformed key=value: refused with a message
    assert canonical_label(label) == label  # one label per setting
    name = safe_name(label)
    assert 0 < len(name) <= 80 and "/" not in name and "\\" not in name


# Labels that name a setting fedsim runs, in several spellings (names are
# case-sensitive): with the odd labels alone, none of the 8 examples of the
# property below trained, and a compare that refused every label passed it
_PLAIN = ["fedavg", "fednova", "fedprox:mu=0.01", "fedprox:mu=+5e-1", " fedavg"]
# pairs that must train, whatever Hypothesis draws besides (explicit examples
# run first in every run; a code change redraws the generated ones)
_MUST_TRAIN = [
    ("fedavg", "fedprox:mu=0.01"),
    ("fednova", "fedprox: mu =5e-1"),  # spaces and an exponent: mu=0.5
    ("fedprox:mu=+0.5", "fedprox:mu=0.01"),
]


def test_compare_with_odd_labels_ends_in_a_result_or_one_line(tmp_path_factory):
    outcomes: dict[tuple[str, str], int] = {}

    def compare_once(first: str, second: str) -> None:
        # Prepare
        out = tmp_path_factory.mktemp("compare") / "out"

        # Execute
        result = cli(
            "compare", TINY, "-a", f"{first},{second}", "--seeds", "1", "--out", out,
            "-q", "--set", "rounds=1",
        )  # fmt: skip

        # Assert: a result, or an error line; never a traceback
        assert result.exception is None or isinstance(result.exception, SystemExit), (
            repr(result.exception)
        )
        assert result.exit_code in (0, 1, 2), result.output
        outcomes[first, second] = result.exit_code
        if result.exit_code == 2:
            assert "error:" in result.output
        if result.exit_code == 0:  # two settings, one round each
            rows = pq.read_table(out / "compare.parquet").to_pylist()
            assert len({r["algorithm"] for r in rows}) == 2, rows
            assert all(r["rounds"] == 1 for r in rows), rows
        if (out / "runs").exists():
            names = [p.name for p in (out / "runs").iterdir()]
            assert len(names) == len(set(names))
            assert all(len(n.encode()) <= 120 for n in names)

    plain_or_odd = st.one_of(st.sampled_from(_PLAIN), labels())
    prop = given(first=plain_or_odd, second=plain_or_odd)(compare_once)
    for first, second in _MUST_TRAIN:
        prop = example(first=first, second=second)(prop)
    settings(RESUME, max_examples=EXAMPLES)(prop)()

    # Assert: the property was not met by refusing everything: the plain
    # pairs trained, and so at least a quarter of all the examples
    assert all(outcomes.get(pair) == 0 for pair in _MUST_TRAIN), outcomes
    trained = list(outcomes.values()).count(0)
    assert trained >= len(outcomes) / 4, outcomes
