"""FedDM on the clock: its matching iterations, at a stated cost each, and its
real upload (the synthetic set), in both synchronous policies; the window
that would cut the iterations short is reported; ``async`` is refused."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from fedsim.algorithms.feddm import FedDM, iteration_flops_ratio, upload_bytes
from fedsim.clock import JobWork, RoundSpec, RunContext, plan_round
from fedsim.fleet import Fleet, FleetSpec
from fedsim.runtime import run_scenario
from fedsim.scenario import ScenarioError, ScenarioWarning, load_scenario

from .conftest import SCENARIOS, WAIT_S

TINY = SCENARIOS / "ci" / "tiny-synthetic.yaml"


def two_devices() -> Fleet:
    # 4 steps/s, 8 Mbit/s both ways, no latency: 1 MB takes 1 s
    spec = {
        "groups": [
            {
                "name": "g",
                "count": 2,
                "speed": {"dist": "fixed", "steps_per_s": 4.0},
                "network": {"down_mbps": 8, "up_mbps": 8, "latency_s": 0.0},
            }
        ]
    }
    return Fleet.from_spec(FleetSpec.model_validate(spec), seed=0)


# An iteration costs 2 local steps on device 0 and half a step on device 1;
# device 0 uploads 2 MB (2 s), device 1 uploads 1 MB (1 s).
WORK = JobWork(
    steps=50,
    unit_cost=np.array([2.0, 0.5]),
    bytes_up=np.array([2_000_000, 1_000_000], dtype=np.int64),
)


def plan(policy: RoundSpec, n_samples=(50, 50)):
    return plan_round(
        two_devices(),
        np.array([0, 1]),
        now=0.0,
        policy=policy,
        t=0,
        # bytes_up 7_777, the model size: not what the algorithm uploads
        ctx=RunContext(1_000_000, 7_777, np.array(n_samples), 10, work=WORK),
    )


# ---------------------------------------------------------------- the cost
def test_iteration_cost_counts_forward_passes_against_a_minibatch_step():
    # Prepare: 2 classes held, 300 and 5 samples; dc_batch 256, ipc 10, B 32
    alg = FedDM(ipc=10, dc_batch_size=256)
    counts = np.array([[300, 0, 5], [0, 0, 0]])
    # Execute
    auto = alg.cost_per_iteration(counts, batch_size=32)
    fixed = FedDM(iteration_cost=1.5).cost_per_iteration(counts, batch_size=32)
    # Assert: real forwards 256 + 5, synthetic forward+backward 2 * 2 * 10,
    # over 3 * 32 for a step (forward + backward); no data: 1.0
    assert auto.tolist() == [pytest.approx(301 / 96), 1.0]
    assert fixed.tolist() == [1.5, 1.5]
    assert iteration_flops_ratio([256] * 10, 10, 64) == 14.375


def test_upload_sizes_are_the_synthetic_set_of_the_classes_held():
    alg = FedDM(ipc=2)
    counts = np.array([[3, 0, 1], [0, 0, 0], [1, 1, 1]])
    sizes = alg.upload_sizes(counts, (1, 28, 28), float_bytes=4, label_bytes=8)
    # 2 classes x 2 images x 784 floats x 4 B + 4 int64 labels
    assert sizes.tolist() == [4 * 784 * 4 + 4 * 8, 0, 6 * 784 * 4 + 6 * 8]


# --------------------------------------------------------------- the clock
def test_fixed_window_counts_iterations_at_their_cost_and_the_real_upload():
    # Execute: a 10 s window, max_steps 10 (it bounds SGD steps, not these)
    rp = plan(RoundSpec(policy="fixed_window", window_s=10, max_steps=10))
    # Assert: device 0: 10 - 1 down - 2 up = 7 s at 4 / 2 = 2 it/s -> 14;
    # device 1: 10 - 1 - 1 = 8 s at 4 / 0.5 = 8 it/s = 64, capped at 50, so
    # it arrives after 1 + 50 / 8 + 1 = 8.25 s
    assert [(p.tau, p.t_arrive, p.dropped) for p in rp.plans] == [
        (14, 10.0, False),
        (50, 8.25, False),
    ]
    assert rp.t_end == 10.0


def test_fixed_epochs_runs_every_iteration_at_its_cost():
    # Execute: epochs would give 3 * 50 / 10 = 15 steps; FedDM runs 50 iterations
    rp = plan(RoundSpec(policy="fixed_epochs", epochs=3), n_samples=(50, 0))
    p0, p1 = rp.plans
    # Assert: 1 s down + 50 * 2 / 4 = 25 s + 2 s up = 28 s; no data: skipped
    assert (p0.tau, p0.t_arrive, p0.dropped, p0.epochs) == (50, 28.0, False, None)
    assert (p1.tau, p1.dropped, p1.reason) == (0, True, "no_data")
    assert rp.t_end == 28.0
    rp = plan(RoundSpec(policy="fixed_epochs", epochs=3))
    # device 1: 1 + 50 * 0.5 / 4 = 6.25 s + 1 s up
    assert [p.t_arrive for p in rp.plans] == [28.0, 8.25]


# ---------------------------------------------------------- whole runs
SLOW_LINK = [
    "fleet.groups[0].speed={dist: fixed, steps_per_s: 4.0}",
    # 8 kbit/s: 1,000 bytes take 1 s
    "fleet.groups[0].network={down_mbps: 0.008, up_mbps: 0.008, latency_s: 0}",
    "rounds=1",
]
ALG = (
    "algorithm={name: feddm, ipc: 3, iterations: %d, dc_batch_size: 16, "
    "image_lr: 0.01, server_epochs: 1, iteration_cost: %s}"
)


def classes_held(data, client: int) -> int:
    return len(set(data.y[data.client_rows(client)].tolist()))


def test_a_fixed_epochs_run_bills_and_times_the_synthetic_set():
    # Prepare: logreg on 10 features, 3 classes: d = 33 float32 = 132 B down
    sc = load_scenario(TINY, [ALG % (4, "2.0"), *SLOW_LINK])
    # Execute
    sim = run_scenario(sc, workers=0)
    # Assert: per client k classes x 3 images x (10 x 4 B) + 3k int64 labels;
    # arrival = 132 B (0.132 s) + 4 iterations x 2 steps / 4 steps/s + upload
    done = [c for c in sim.clients if not c["dropped"]]
    assert done
    for c in done:
        k = classes_held(sim.data, c["client_id"])
        up = 3 * k * 40 + 3 * k * 8
        assert c["bytes_up"] == up == upload_bytes(k, 3, (10,))
        assert c["tau"] == 4
        assert c["t_arrive"] == pytest.approx(0.132 + 2.0 + up / 1000)
    assert sc.algorithm.clock_work(sc.facts, sim.data).bytes_up.tolist() == [
        upload_bytes(classes_held(sim.data, i), 3, (10,)) for i in range(6)
    ]


def test_time_aware_selectors_see_feddm_s_round_time():
    # Prepare: as above; the selectors' context estimates a round's time
    # from the same work the clock charges (Oort and FedPNS read it)
    from fedsim.runtime import _Run

    sc = load_scenario(TINY, [ALG % (4, "2.0"), *SLOW_LINK])
    # Execute
    run = _Run(sc, None, None)
    # Assert: 0.132 s down + 4 iterations x 2 steps / 4 steps/s + upload
    up = sc.algorithm.clock_work(sc.facts, run.data).bytes_up
    expected = 0.132 + 2.0 + up / 1000
    assert run.sel_ctx.round_time_s == pytest.approx(expected)


def test_a_fixed_window_run_runs_the_iterations_that_fit():
    # Prepare: a 3 s window, 8 it/s (cost 0.5); 20 iterations, max_steps 5
    over = [
        ALG % (20, "0.5"),
        *SLOW_LINK,
        "round={policy: fixed_window, window_s: 3, max_steps: 5}",
    ]
    sc = load_scenario(TINY, over)
    # Execute
    sim = run_scenario(sc, workers=0)
    # Assert: tau = min(20, floor((3 - 0.132 - upload_s) * 8)): 3 classes
    # upload 432 B -> 19 (the upload ate into the window), 2 classes 288 B -> 20
    done = [c for c in sim.clients if not c["dropped"]]
    assert done
    for c in done:
        k = classes_held(sim.data, c["client_id"])
        up_s = (3 * k * 48) / 1000
        assert c["tau"] == min(20, int((3 - 0.132 - up_s) * 8))
        assert c["bytes_up"] == 3 * k * 48


# ------------------------------------------------------------- validation
def test_a_window_too_short_for_the_iterations_is_reported():
    # 10 s at 5 steps/s (median) = 50 steps; 1000 iterations at >= 1 step each
    over = [
        "algorithm={name: feddm, iteration_cost: 1.0}",
        "round={policy: fixed_window, window_s: 10, max_steps: 100}",
    ]
    with pytest.warns(ScenarioWarning) as got:
        load_scenario(TINY, over)
    text = str(got[0].message)
    for field in ("round.window_s", "algorithm.iterations", "iteration_cost"):
        assert field in text
    assert "runs at most 50 of algorithm.iterations (1000)" in text
    assert "round.window_s >= 200" in text


def test_a_window_that_fits_the_iterations_is_not_reported():
    over = [
        "algorithm={name: feddm, iterations: 50, iteration_cost: 1.0}",
        "round={policy: fixed_window, window_s: 10, max_steps: 5}",
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("error", ScenarioWarning)
        load_scenario(TINY, over)


def test_epoch_ranges_and_async_are_refused_for_feddm():
    over = [
        "algorithm={name: feddm}",
        "round={policy: fixed_epochs, epochs_low: 1, epochs_high: 3}",
    ]
    with pytest.raises(ScenarioError, match="epochs_low"):
        load_scenario(TINY, over)
    over = ["algorithm={name: feddm}", "round={policy: async}"]
    with pytest.raises(ScenarioError, match="asynchronous server rule"):
        load_scenario(TINY, over)


def test_validate_prints_the_window_warning_as_one_line():
    # The warning reaches the user as fedsim's own one-line "warning:", not
    # as Python's "file.py:NNN: ScenarioWarning" with a source line
    import subprocess
    import sys

    over = [
        "--set",
        "algorithm={name: feddm, iteration_cost: 1.0}",
        "--set",
        "round={policy: fixed_window, window_s: 10, max_steps: 100}",
    ]
    p = subprocess.run(
        [sys.executable, "-m", "fedsim", "validate", str(TINY), *over],
        capture_output=True,
        text=True,
        timeout=WAIT_S,
    )
    assert p.returncode == 0, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if "algorithm.iterations" in ln]
    assert len(lines) == 1 and lines[0].startswith("warning: ")
    assert "ScenarioWarning" not in p.stderr
