"""Scale figures for issue 8: a 1,000,000-device fleet, 1,000 selected per round.

    .venv/bin/python benchmarks/scale.py [--devices N] [--end-to-end]

Prints the time to build the fleet, its memory, the time the selector and the
SimPy clock take for one round (the simulation's own cost, without training),
and, with --end-to-end, the wall time of `scenarios/stress/million-devices.yaml`
run in-process with the batched executor (fedsim/batched.py).

Issue 36 moved a round's device draws from one generator per round to
counter-based hashes of (seed, device, round) (common random numbers); the
clock's cost per round is timed both ways here, in the same process on the
same selections, and their ratio printed (hashed / per-round generator).
"""

from __future__ import annotations

import argparse
import resource
import time
from pathlib import Path
from typing import Any

import numpy as np

from fedsim import clock
from fedsim.fleet import Fleet, RoundDraws
from fedsim.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = ROOT / "scenarios" / "stress" / "million-devices.yaml"


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class StreamDraws:
    """The fleet with a round's draws as before issue 36: one generator per
    round (seeded by (seed, tag, round)), uniforms in increasing device id.
    The cost baseline of the hashed draws; the rest of the fleet delegates."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet

    def __getattr__(self, name: str) -> Any:
        return getattr(self.fleet, name)

    def round_draws(self, devices: np.ndarray, t: int) -> RoundDraws:
        n = len(devices)
        rng = np.random.default_rng(
            np.random.SeedSequence([self.fleet.seed, 0xC10C, t])
        )
        return RoundDraws(rng.random((n, 2)), rng.random(n), rng.random((n, 2)))


def clock_ratio(fleet: Fleet, sc: Any, rounds: list[tuple[float, np.ndarray]]) -> None:
    """Time plan_round with hashed and with per-round-generator draws on the
    same rounds, alternating (so both see the same machine load)."""
    ctx = clock.RunContext(2440, 2440, np.full(fleet.size, 8), 8)
    old = StreamDraws(fleet)
    times: dict[str, list[float]] = {"hashed": [], "stream": []}
    ways = [("hashed", fleet), ("stream", old)]
    for i in range(9):
        for name, f in ways if i % 2 else ways[::-1]:  # each goes first in turn
            t0 = time.perf_counter()
            for t, (now, chosen) in enumerate(rounds):
                clock.plan_round(f, chosen, now, sc.round, t, ctx)  # type: ignore[arg-type]
            times[name].append((time.perf_counter() - t0) / len(rounds))
    hashed, stream = (float(np.median(times[k])) for k in ("hashed", "stream"))
    print(f"clock per round, hashed     {hashed * 1000:.1f} ms (median of 9 passes)")
    print(f"clock per round, generator  {stream * 1000:.1f} ms")
    print(f"ratio hashed / generator    {hashed / stream:.3f}")
    # the draws alone: the rounds above also differ in what the draws decide
    # (other stragglers, other SimPy events), this part only in how
    draws = {}
    for name, f in (("hashed", fleet), ("stream", old)):
        t0 = time.perf_counter()
        for _ in range(20):
            for t, (_, chosen) in enumerate(rounds):
                f.round_draws(chosen, t)
        draws[name] = (time.perf_counter() - t0) / (20 * len(rounds))
    print(
        f"the draws alone per round   {draws['hashed'] * 1e6:.0f} us hashed, "
        f"{draws['stream'] * 1e6:.0f} us generator"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--devices", type=int, default=1_000_000)
    ap.add_argument("--end-to-end", action="store_true")
    args = ap.parse_args()
    share = args.devices * 6 // 10
    sc = load_scenario(
        SCENARIO,
        [
            f"fleet.groups[0].count={share}",
            f"fleet.groups[1].count={args.devices - share}",
        ],
    )
    base = rss_mb()
    t0 = time.perf_counter()
    fleet = Fleet.from_spec(sc.fleet, sc.seed)
    build = time.perf_counter() - t0
    n_samples = np.full(fleet.size, 8)
    selector = sc.selector
    now, times, rounds = 0.0, [], []
    for t in range(5):
        t1 = time.perf_counter()
        now = fleet.next_online_time(now)
        online = np.flatnonzero(fleet.online(now))
        rng = np.random.default_rng([sc.seed, t])
        chosen = np.sort(
            rng.choice(online, size=selector.clients_per_round, replace=False)
        )
        ctx = clock.RunContext(2440, 2440, n_samples, 8)
        plan = clock.plan_round(fleet, chosen, now, sc.round, t, ctx)
        times.append(time.perf_counter() - t1)
        rounds.append((now, chosen))
        now = plan.t_end
    print(f"devices                     {fleet.size:,}")
    print(f"fleet build                 {build:.2f} s")
    print(f"fleet memory (peak RSS up)  {rss_mb() - base:.0f} MB")
    print(f"online at the last round    {len(online):,}")
    print(
        "selection + clock per round "
        + " ".join(f"{x * 1000:.0f}" for x in times)
        + f" ms (max {max(times):.3f} s)"
    )
    clock_ratio(fleet, sc, rounds)
    if args.end_to_end:
        from fedsim.runtime import run_scenario

        t2 = time.perf_counter()
        rows = run_scenario(sc, workers=0).rows
        total = time.perf_counter() - t2
        setup = total - rows[-1]["wall_time"]
        print(f"end to end, 5 rounds        {total:.1f} s (data + fleet {setup:.1f} s)")
        print(f"final test accuracy         {rows[-1]['test_accuracy']:.3f}")
        print(f"peak RSS                    {rss_mb():.0f} MB")


if __name__ == "__main__":
    main()
