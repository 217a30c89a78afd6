"""Golden outputs of the clock: every field of plan_round's plans and of
AsyncTimeline's versions, for varied cases, captured from the clock before
its device process was unified (issue 12). The synchronous cases were
captured again when rounds moved to common random numbers (issue 36: each
device's draws of (seed, device, round)); the asynchronous ones are as
they were.

What is compared is what the clock promises across machines
(docs/architecture.md, "Determinism"): every discrete field (ids, tau,
epochs, versions, staleness, statuses, reasons, the order of every list:
who arrived in which order) exactly, and every float (simulated times,
slowdowns) to a relative ``REL_TOL``. NumPy's exp, log, sin, cos and power
take other SIMD paths on other CPUs (AVX-512 or AVX2 only), which may move
a float's last bit; ``test_last_bit_changes_move_no_discrete_outcome``
shows such a change moves no discrete outcome of any case, and CI runs
this file a second time with NumPy's AVX-512 paths switched off
(``.ci/run``). On one machine the clock is bit for bit the same through
any number of workers and a resume (tests/test_runtime.py).

Regenerate (only when a change of the timeline is intended) with
``python tests/test_clock_golden.py`` from the repository root;
``python tests/test_clock_golden.py --avx512-targets`` prints NumPy's
AVX-512 targets (what ``.ci/run`` switches off).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fedsim.clock import AsyncTimeline, RunContext, plan_round
from fedsim.fleet import Fleet
from fedsim.scenario import FleetSpec, RoundSpec, load_scenario

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = Path(__file__).with_name("data") / "clock_golden.json"
MB = 1_000_000


def mixed_fleet(
    dropout_p: float = 0.0, availability: dict | None = None, seed: int = 3
) -> Fleet:
    """Three groups of different speeds, links and stragglers (24 devices)."""
    on_off = availability if availability is not None else {}
    groups = [
        {
            "name": "fast",
            "count": 8,
            "speed": {"dist": "lognormal", "median_steps_per_s": 6.0, "sigma": 0.3},
            "network": {"down_mbps": 20, "up_mbps": 5, "latency_s": 0.05},
            "stragglers": {
                "p": 0.2,
                "slowdown": {"dist": "uniform", "low": 1.0, "high": 3.0},
                "dropout_p": dropout_p,
            },
            "availability": on_off,
        },
        {
            "name": "slow",
            "count": 8,
            "speed": {"dist": "fixed", "steps_per_s": 1.5},
            "network": {"down_mbps": 4, "up_mbps": 2},
            "stragglers": {
                "p": 0.4,
                "slowdown": {"dist": "pareto", "shape": 1.2, "max_factor": 50},
                "dropout_p": dropout_p,
            },
            "availability": on_off,
        },
        {
            "name": "steady",
            "count": 8,
            "speed": {"dist": "fixed", "steps_per_s": 3.0},
            "network": {"down_mbps": 8, "up_mbps": 8},
        },
    ]
    return Fleet.from_spec(FleetSpec.model_validate({"groups": groups}), seed)


def trace_fleet() -> Fleet:
    scenario = load_scenario(ROOT / "scenarios" / "fleets" / "phones-trace.yaml")
    return Fleet.from_spec(scenario.fleet, seed=0)


def n_samples_for(m: int, seed: int) -> np.ndarray:
    """Sample counts with some empty and some smaller than a batch."""
    n = np.random.default_rng(seed).integers(0, 300, size=m)
    n[::7] = 0
    n[1::5] = 7
    return n


def _plain(obj: Any) -> Any:
    """A dataclass tree as JSON-ready values (numpy scalars as Python ones)."""
    if dataclasses.is_dataclass(obj):
        return {f.name: _plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [_plain(x) for x in obj]
    if isinstance(obj, np.generic):
        return {"np": type(obj).__name__, "v": obj.item()}
    return obj


def sync_case(
    fleet: Fleet,
    policy: RoundSpec,
    *,
    rounds: int,
    k: int,
    seed: int,
    now: float = 0.0,
    gap_s: float = 0.0,
) -> list[Any]:
    """Several rounds in a row, as the server runs them (``seed`` the
    selection's generator; the devices' draws are the fleet's, per round)."""
    rng = np.random.default_rng(seed)
    n = n_samples_for(fleet.size, seed)
    asked = math.ceil(round(policy.over_select * k, 9))
    keep = k if policy.over_select > 1 else None
    out = []
    for t in range(rounds):
        chosen = rng.choice(fleet.size, size=asked, replace=False)
        rp = plan_round(
            fleet, chosen, now, policy, t, RunContext(MB, MB // 2, n, 20), keep
        )
        out.append(_plain(rp))
        now = rp.t_end + gap_s
    return out


def async_case(
    fleet: Fleet,
    policy: RoundSpec,
    *,
    versions: int,
    buffer_size: int,
    concurrency: int,
    seed: int,
) -> list[Any]:
    tl = AsyncTimeline(
        fleet,
        policy,
        versions=versions,
        buffer_size=buffer_size,
        concurrency=concurrency,
        seed=seed,
        ctx=RunContext(MB, MB // 2, n_samples_for(fleet.size, seed), 20),
    )
    return [_plain(v) for v in tl]


def cases() -> dict[str, Any]:
    """Every golden case, as a function computing it with the current clock."""
    flaky = {"kind": "on_off", "mean_on_s": 20.0, "mean_off_s": 10.0}
    return {
        "window_flaky_dropouts": lambda: sync_case(
            mixed_fleet(dropout_p=0.2, availability=flaky),
            RoundSpec(window_s=12, max_steps=40),
            rounds=8,
            k=10,
            seed=1,
            gap_s=0.5,
        ),
        "epochs_range_deadline": lambda: sync_case(
            mixed_fleet(dropout_p=0.15, availability=flaky),
            RoundSpec(
                policy="fixed_epochs", epochs_low=1, epochs_high=4, deadline_s=25
            ),
            rounds=8,
            k=12,
            seed=2,
        ),
        "epochs_no_deadline": lambda: sync_case(
            mixed_fleet(availability=flaky),
            RoundSpec(policy="fixed_epochs", epochs=2),
            rounds=6,
            k=9,
            seed=3,
        ),
        "epochs_over_select": lambda: sync_case(
            mixed_fleet(dropout_p=0.1, availability=flaky),
            RoundSpec(policy="fixed_epochs", epochs=1, deadline_s=40, over_select=1.5),
            rounds=8,
            k=8,
            seed=4,
        ),
        "epochs_trace": lambda: sync_case(
            trace_fleet(),
            RoundSpec(policy="fixed_epochs", epochs=1, deadline_s=600),
            rounds=6,
            k=6,
            seed=5,
            now=66_000.0,
            gap_s=900.0,
        ),
        "async_k1_flaky_dropouts": lambda: async_case(
            mixed_fleet(dropout_p=0.2, availability=flaky),
            RoundSpec(policy="async", max_steps=30, max_staleness=4),
            versions=40,
            buffer_size=1,
            concurrency=6,
            seed=6,
        ),
        "async_k3_epochs_range": lambda: async_case(
            mixed_fleet(dropout_p=0.1, availability=flaky),
            RoundSpec(policy="async", job_steps="epochs", epochs_low=1, epochs_high=3),
            versions=25,
            buffer_size=3,
            concurrency=9,
            seed=7,
        ),
        "async_k3_always_online": lambda: async_case(
            mixed_fleet(dropout_p=0.05),
            RoundSpec(policy="async", max_steps=20),
            versions=20,
            buffer_size=3,
            concurrency=5,
            seed=8,
        ),
        "async_trace": lambda: async_case(
            trace_fleet(),
            RoundSpec(policy="async", job_steps="epochs", epochs=1),
            versions=15,
            buffer_size=2,
            concurrency=4,
            seed=9,
        ),
    }


def _dump(obj: Any) -> str:
    return json.dumps(obj, indent=1, sort_keys=True)


# The clock's promise across CPUs for floats (docs/architecture.md,
# "Determinism"): a last-bit change of a transcendental function moves a
# simulated time by some 1e-16 relative, and the error of a few hundred
# additions in a timeline stays far below this; a changed draw or a changed
# decision moves floats by far more, and moves discrete fields besides.
REL_TOL = 1e-9


def golden_differences(got: Any, want: Any, path: str = "") -> list[str]:
    """Where ``got`` differs from ``want`` beyond what another CPU may change.

    Floats must agree to ``REL_TOL`` (relative); everything else (ints,
    bools, strings, None, the keys of every mapping and the length and order
    of every list) exactly, type included, so an int 0 that became 0.0 or an
    arrival order that changed is a difference.

    Args:
        got: a case's output as JSON values (dicts, lists, scalars).
        want: the golden output, alike.
        path: where in the tree ``got`` sits (for the messages).

    Returns:
        One line per difference, naming its path (empty: equivalent).
    """
    if isinstance(want, dict) and isinstance(got, dict):
        if sorted(got) != sorted(want):
            return [f"{path}: keys {sorted(got)} != {sorted(want)}"]
        return [
            d
            for k in sorted(want)
            for d in golden_differences(got[k], want[k], f"{path}.{k}")
        ]
    if isinstance(want, list) and isinstance(got, list):
        if len(got) != len(want):
            return [f"{path}: {len(got)} items != {len(want)}"]
        return [
            d
            for i, (g, w) in enumerate(zip(got, want, strict=True))
            for d in golden_differences(g, w, f"{path}[{i}]")
        ]
    if type(got) is float and type(want) is float:
        close = math.isclose(got, want, rel_tol=REL_TOL) or (
            got != got and want != want
        )
        return [] if close else [f"{path}: {got!r} != {want!r} (beyond {REL_TOL:g})"]
    if type(got) is not type(want) or got != want:
        return [f"{path}: {got!r} != {want!r}"]
    return []


def _golden(name: str) -> Any:
    return json.loads(FIXTURE.read_text())[name]


@pytest.mark.parametrize("name", sorted(cases()))
def test_clock_reproduces_golden_outputs(name):
    # Prepare
    golden = _golden(name)

    # Execute
    got = json.loads(_dump(cases()[name]()))

    # Assert: discrete fields exactly, floats to REL_TOL
    assert golden_differences(got, golden) == []


def test_golden_comparison_tolerates_last_bits_only():
    # Prepare: a version-like record, and copies changed in one way each
    want = {"t": 8.166666666666668, "tau": 20, "status": "applied", "ids": [1, 17]}
    ulp = {**want, "t": math.nextafter(want["t"], math.inf)}
    drift = {**want, "t": want["t"] * (1 + 1e-7)}
    tau = {**want, "tau": 19}
    order = {**want, "ids": [17, 1]}
    kind = {**want, "tau": 20.0}

    # Execute / Assert
    assert golden_differences(ulp, want) == []
    assert golden_differences(drift, want) == [
        f".t: {drift['t']!r} != {want['t']!r} (beyond 1e-09)"
    ]
    assert golden_differences(tau, want) == [".tau: 19 != 20"]
    assert golden_differences(order, want) == [".ids[0]: 17 != 1", ".ids[1]: 1 != 17"]
    assert golden_differences(kind, want) == [".tau: 20.0 != 20"]


# The transcendental functions the clock's draws use (speeds and bandwidths:
# exp; on/off periods: log; daily availability: sin, cos; the constants of a
# spec: math's), each of which a CPU's SIMD path may round differently.
_NUMPY_FUNCS = ("exp", "log", "sin", "cos")
_MATH_FUNCS = ("exp", "log", "sin", "cos", "atan")


def _nudge(x: Any, mode: str) -> Any:
    """``x`` moved one unit in the last place: ``up``, ``down``, or
    ``mixed`` (up or down by the parity of x's last bit, so that equal
    values move alike, as one CPU's function moves equal inputs alike)."""
    a = np.asarray(x, dtype=np.float64)
    if mode == "mixed":
        odd = (a.view(np.int64) & 1).astype(bool)
        toward = np.where(odd, -np.inf, np.inf)
    else:
        toward = np.full(a.shape, np.inf if mode == "up" else -np.inf)
    moved = np.where(np.isfinite(a), np.nextafter(a, toward), a)
    if isinstance(x, float) and not isinstance(x, np.floating):
        return float(moved)
    return moved if isinstance(x, np.ndarray) else np.float64(moved)


def perturb_transcendentals(monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    """Make NumPy's and math's transcendental functions, and the Pareto
    straggler factor's power (``**``, which no module attribute reaches),
    return results one ulp off, for the rest of the test."""

    def wrap(f: Any) -> Any:
        return lambda *args, **kw: _nudge(f(*args, **kw), mode)

    for name in _NUMPY_FUNCS:
        monkeypatch.setattr(np, name, wrap(getattr(np, name)))
    for name in _MATH_FUNCS:
        monkeypatch.setattr(math, name, wrap(getattr(math, name)))
    draw = Fleet.draw_slowdowns

    def draw_slowdowns(self: Fleet, devices: Any, u: np.ndarray) -> np.ndarray:
        factor = draw(self, devices, u)
        return np.where(factor == 1.0, factor, _nudge(factor, mode))

    monkeypatch.setattr(Fleet, "draw_slowdowns", draw_slowdowns)


def _float_bits(tree: Any) -> list[float]:
    """Every float of a JSON tree, in order."""
    if isinstance(tree, dict):
        return [x for k in sorted(tree) for x in _float_bits(tree[k])]
    if isinstance(tree, list):
        return [x for item in tree for x in _float_bits(item)]
    return [tree] if type(tree) is float else []


@pytest.mark.parametrize("mode", ["up", "down", "mixed"])
@pytest.mark.parametrize("name", sorted(cases()))
def test_last_bit_changes_move_no_discrete_outcome(monkeypatch, name, mode):
    # Prepare: every transcendental result of the clock's draws one ulp off,
    # as another CPU's SIMD path may round it
    golden = _golden(name)
    perturb_transcendentals(monkeypatch, mode)

    # Execute
    got = json.loads(_dump(cases()[name]()))

    # Assert: the floats did move (the perturbation reached the clock) ...
    assert _float_bits(got) != _float_bits(golden)
    # ... and every discrete outcome is the golden one, every float close
    assert golden_differences(got, golden) == []


def _numpy_umath() -> Any:
    """NumPy's C module that knows its CPU features and dispatch targets."""
    try:
        from numpy._core import _multiarray_umath as umath
    except ImportError:  # NumPy 1.x
        from numpy.core import _multiarray_umath as umath  # type: ignore[no-redef]
    return umath


def _needs_avx512(target: str) -> bool:
    return target.startswith("AVX512") or target == "X86_V4"


def avx512_targets() -> list[str]:
    """NumPy's dispatch targets that need AVX-512, by this NumPy's names
    (AVX512F, AVX512_SKX, ... before 2.4; X86_V4, AVX512_ICL, AVX512_SPR
    since): what ``NPY_DISABLE_CPU_FEATURES`` switches off to compute as an
    AVX2-only CPU does (``.ci/run``; it ignores names it does not know)."""
    return [t for t in _numpy_umath().__cpu_dispatch__ if _needs_avx512(t)]


def test_switching_off_the_avx512_targets_takes_exp_off_avx512():
    # Prepare: where this NumPy's float64 exp runs, with and without them
    # (the first run without the variable: .ci/run runs this file with it set)
    if not _numpy_umath().__cpu_features__.get("AVX512F"):
        pytest.skip("no AVX-512 here: NumPy already computes as on AVX2")
    code = (
        "import numpy as np; "
        "print(np.lib.introspect.opt_func_info(func_name='exp')['exp']['dd']['current'])"
    )
    on = {k: v for k, v in os.environ.items() if k != "NPY_DISABLE_CPU_FEATURES"}
    off = {**on, "NPY_DISABLE_CPU_FEATURES": " ".join(avx512_targets())}

    # Execute
    runs = [
        subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True
        )
        for env in (on, off)
    ]

    # Assert: exp ran on AVX-512, and no longer does with them off
    now, then = (r.stdout.strip() for r in runs)
    assert runs[1].returncode == 0, runs[1].stderr
    assert _needs_avx512(now) and then and not _needs_avx512(then)


if __name__ == "__main__":
    if sys.argv[1:] == ["--avx512-targets"]:
        print(" ".join(avx512_targets()))
        sys.exit(0)
    FIXTURE.parent.mkdir(exist_ok=True)
    FIXTURE.write_text(_dump({k: f() for k, f in cases().items()}) + "\n")
    print(f"wrote {FIXTURE}")
