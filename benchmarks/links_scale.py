"""Scale figures for issue 26: linking a 1,000,000-device fleet to its data.

    .venv/bin/python benchmarks/links_scale.py [--devices N] [--repeat R]

Builds a fleet of N devices (two lognormal speed groups, on/off availability
in one), lognormal client sizes, and times :func:`fedsim.links.rank_assignment`
(the permutation that gives the declared Spearman correlation) for targets
-0.8, 0 and 0.8 against speed, and 0.5 against the online fraction (ties:
the bisection runs). Reports the best of R timings, the realised
correlation, and the assignment's peak memory (tracemalloc: NumPy reports
its buffers to it) beside the process's peak RSS. The fleet's and the
sizes' construction is not timed: it is not the link's cost.
"""

from __future__ import annotations

import argparse
import resource
import time
import tracemalloc

import numpy as np

from fedsim.data.partition import client_sizes
from fedsim.fleet import Fleet, FleetSpec
from fedsim.links import online_fraction, rank_assignment


def _fleet(m: int) -> Fleet:
    """Two halves: slow phones (on/off) and faster, always-on devices."""
    groups = [
        {
            "name": "slow",
            "count": m // 2,
            "speed": {"dist": "lognormal", "median_steps_per_s": 1, "sigma": 0.6},
            "availability": {"kind": "on_off", "mean_on_s": 600, "mean_off_s": 1800},
        },
        {
            "name": "fast",
            "count": m - m // 2,
            "speed": {"dist": "lognormal", "median_steps_per_s": 5, "sigma": 0.4},
        },
    ]
    return Fleet.from_spec(FleetSpec.model_validate({"groups": groups}), seed=0)


def _time(
    sizes: np.ndarray, key: np.ndarray, target: float, repeat: int
) -> tuple[float, float, float, float]:
    """(best wall seconds, best CPU seconds, realised Spearman, peak traced
    MiB) of one assignment; CPU time too, since a shared host's load
    stretches wall time (NumPy's sorts here run on one thread)."""
    best, cpu = float("inf"), float("inf")
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        _, r = rank_assignment(sizes, key, target, seed=0)
        best = min(best, time.perf_counter() - t0)
        cpu = min(cpu, time.process_time() - c0)
    tracemalloc.start()
    rank_assignment(sizes, key, target, seed=0)
    peak = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    return best, cpu, r, peak


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--devices", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    m = args.devices
    fleet = _fleet(m)
    sizes = client_sizes(50 * m, m, 1.0, np.random.default_rng(0))
    online = online_fraction(fleet)
    print(f"{m:,} devices, {int(sizes.sum()):,} samples")
    print("| link | target | realised | wall (s) | CPU (s) | peak traced MiB |")
    print("|---|---|---|---|---|---|")
    cases = [("speed", t, fleet.speed) for t in (-0.8, 0.0, 0.8)]
    cases.append(("online", 0.5, online))
    for name, target, key in cases:
        sec, cpu, r, peak = _time(sizes, key, target, args.repeat)
        cells = f"{target:+.1f} | {r:+.4f} | {sec:.3f} | {cpu:.3f} | {peak:.0f}"
        print(f"| samples_vs_{name} | {cells} |")
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"process peak RSS: {rss:.0f} MiB")


if __name__ == "__main__":
    main()
