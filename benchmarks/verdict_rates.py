"""Error rates and power of fedsim's paired verdicts, by simulation
(docs/results.md, "How often a verdict is wrong").

    .venv/bin/python benchmarks/verdict_rates.py [--sims 2000] [--seed 0]

Draws per-seed differences from a normal law and asks fedsim.tools.stats,
as compare and stress do, for a verdict. Prints four Markdown tables:

1. fixed n (``paired_interval``): with a known zero mean, the share of
   false "better"/"worse" at every n from 2 to 30 (the goal: at most 5%);
   also for a skewed law (centred exponential) and a two-point one;
2. power: the fewest seeds that decide a true effect (mean / spread) in
   80% of samples, for the fixed-n rule and for seeds until decided;
3. optional stopping (``confidence_sequence``): sequences looked at after
   every seed up to 30, stopped at the first firm verdict: false decisions
   with a zero mean, against a t interval re-checked the same way;
4. the price: the confidence sequence's half-width over the fixed-n t
   interval's, at the same n and spread (a ratio of quantiles, exact).

Every figure is a share of ``--sims`` samples drawn from one seeded
generator, so the tables are a pure function of (--sims, --seed).
"""

from __future__ import annotations

import argparse
import math
import random
from collections.abc import Callable

from fedsim.tools.stats import (
    FIRM,
    confidence_sequence,
    cs_quantile,
    paired_interval,
    t_quantile,
)

Draw = Callable[[random.Random], float]
LAWS: dict[str, Draw] = {
    "normal": lambda g: g.gauss(0.0, 1.0),
    "skewed (exponential - 1)": lambda g: g.expovariate(1.0) - 1.0,
    "two-point (+-1)": lambda g: 1.0 if g.random() < 0.5 else -1.0,
}


def false_rates(sims: int, gen: random.Random) -> list[str]:
    """Table 1: false firm verdicts at a known zero mean, n = 2..30."""
    lines = [
        "| seeds n | " + " | ".join(LAWS) + " |",
        "|---" * (len(LAWS) + 1) + "|",
    ]
    for n in range(2, 31):
        cells = []
        for draw in LAWS.values():
            wrong = sum(
                paired_interval([draw(gen) for _ in range(n)]).verdict in FIRM
                for _ in range(sims)
            )
            cells.append(f"{100 * wrong / sims:.1f}%")
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    return lines


def decided_at(d: list[float]) -> int | None:
    """The first n at which the confidence sequence gives a firm verdict."""
    for n in range(2, len(d) + 1):
        if confidence_sequence(d[:n]).verdict in FIRM:
            return n
    return None


def power(sims: int, gen: random.Random, top: int = 30) -> list[str]:
    """Table 2: seeds needed for 80% power, fixed n and until decided."""
    lines = [
        "| effect / spread | fixed n: seeds for 80% | until decided: 80% decided by "
        "| until decided: median seeds |",
        "|---|---|---|---|",
    ]
    for effect in (0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0):
        fixed = next(
            (
                n
                for n in range(2, top + 1)
                if sum(
                    paired_interval([gen.gauss(effect, 1) for _ in range(n)]).verdict
                    == "better"
                    for _ in range(sims // 4)
                )
                >= 0.8 * (sims // 4)
            ),
            None,
        )
        stops = sorted(
            decided_at([gen.gauss(effect, 1) for _ in range(top)]) or math.inf
            for _ in range(sims // 4)
        )
        p80, med = stops[int(0.8 * len(stops))], stops[len(stops) // 2]
        lines.append(
            f"| {effect:g} | {_n(fixed, top)} | {_n(p80, top)} | {_n(med, top)} |"
        )
    return lines


def _n(n: float | None, top: int) -> str:
    return f"more than {top}" if n is None or not math.isfinite(n) else str(n)


def optional_stopping(sims: int, gen: random.Random, top: int = 30) -> list[str]:
    """Table 3: false decisions when stopping at the first firm verdict."""
    bars = {n: t_quantile(0.975, n - 1) for n in range(2, top + 1)}
    lines = [
        "| law | confidence sequence | t interval re-checked |",
        "|---|---|---|",
    ]
    for name, draw in LAWS.items():
        cs = tt = 0
        for _ in range(sims):
            d = [draw(gen) for _ in range(top)]
            cs += decided_at(d) is not None
            tt += any(_t_decides(d[:n], bars[n]) for n in range(2, top + 1))
        lines.append(f"| {name} | {100 * cs / sims:.1f}% | {100 * tt / sims:.1f}% |")
    return lines


def _t_decides(d: list[float], bar: float) -> bool:
    mean = sum(d) / len(d)
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (len(d) - 1))
    return sd > 0 and abs(mean) * math.sqrt(len(d)) / sd > bar


def price() -> list[str]:
    """Table 4: the sequence's half-width over the t interval's."""
    ns = (5, 6, 8, 10, 15, 20, 30, 50)
    ratio = [cs_quantile(n) / t_quantile(0.975, n - 1) for n in ns]
    return [
        "| seeds n | " + " | ".join(map(str, ns)) + " |",
        "|---" * (len(ns) + 1) + "|",
        "| width / t width | " + " | ".join(f"{r:.2f}" for r in ratio) + " |",
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sims", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    gen = random.Random(args.seed)
    margin = 196 * math.sqrt(0.05 * 0.95 / args.sims)
    print(
        f"Each share is of {args.sims} samples (seed {args.seed}): a true 5% reads "
        f"within ±{margin:.2f} points of it 95% of the time.\n"
    )
    for title, lines in (
        ("False firm verdicts, zero mean, fixed n", false_rates(args.sims, gen)),
        ("Seeds needed (normal differences)", power(args.sims, gen)),
        ("False decisions under optional stopping, n <= 30", None),
    ):
        print(f"### {title}\n")
        print(
            "\n".join(lines if lines is not None else optional_stopping(args.sims, gen))
        )
        print(flush=True)
    print("### Width of the confidence sequence against the t interval\n")
    print("\n".join(price()))


if __name__ == "__main__":
    main()
