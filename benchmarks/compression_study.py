"""The compression study of docs/fleets.md ("Compressed updates: a study"):
FedAvg on scenarios/stress/phones-stragglers.yaml with a 284k-parameter MLP
(1.1 MB an update) in a 3 s window, with no compression, top-1% with error
feedback, and 4-bit QSGD; paired over seeds with fedsim's own intervals.

    nice -n 10 python benchmarks/compression_study.py [--seeds 3] [--rounds 30]

Prints the table of docs/fleets.md and writes docs/compression-study.png
(test accuracy against simulated time, the mean over seeds per arm).
``fedsim compare`` pairs algorithms, not sections; this script runs the
same paired design over the ``compression`` section.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from fedsim.rows import Row
from fedsim.runtime import run_scenario
from fedsim.scenario import load_scenario
from fedsim.tools.stats import PairedInterval, paired_differences, paired_interval

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = ROOT / "scenarios" / "stress" / "phones-stragglers.yaml"
BASE = [
    "model={name: mlp, hidden: [4000]}",
    "round.window_s=3",
    "algorithm={name: fedavg}",
    "eval.every_rounds=3",
]
ARMS = {
    "dense": [],
    "top-1% + EF": ["compression={name: top_k, fraction: 0.01, error_feedback: true}"],
    "QSGD 4 bits": ["compression={name: qsgd, bits: 4}"],
}


def _run(arm: list[str], seed: int, rounds: int) -> list[Row]:
    sc = load_scenario(SCENARIO, [*BASE, *arm, f"seed={seed}", f"rounds={rounds}"])
    res = run_scenario(sc, workers=0)
    assert res.status == "completed", res.message
    return res.rows


def _time_to(rows: list[Row], target: float) -> float | None:
    for r in rows:
        acc = float(r["test_accuracy"])  # type: ignore[arg-type]
        if acc == acc and acc >= target:
            return float(r["sim_time"])  # type: ignore[arg-type]
    return None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--target", type=float, default=0.3)
    args = ap.parse_args()
    runs = {
        name: {s: _run(arm, s, args.rounds) for s in range(args.seeds)}
        for name, arm in ARMS.items()
    }
    final = {
        a: {s: float(rows[-1]["test_accuracy"]) for s, rows in by.items()}  # type: ignore[arg-type]
        for a, by in runs.items()
    }
    reach = {
        a: {s: _time_to(r, args.target) for s, r in by.items()}
        for a, by in runs.items()
    }
    tau = {
        a: {
            s: float(np.nanmean([r["tau_mean"] for r in rows]))
            for s, rows in by.items()
        }  # type: ignore[misc]
        for a, by in runs.items()
    }
    head = f"time to {args.target:.0%}"
    print(f"| arm | final accuracy | minus dense | {head} | minus dense | mean tau |")
    print("|---|---|---|---|---|---|")
    for a in runs:
        acc = np.mean(list(final[a].values()))
        d_acc = paired_interval(paired_differences(final[a], final["dense"]))
        d_t = paired_interval(
            paired_differences(reach[a], reach["dense"]), higher_is_better=False
        )
        times = [t for t in reach[a].values() if t is not None]
        t_txt = (
            f"{np.mean(times):.0f} s ({len(times)}/{args.seeds})" if times else "never"
        )
        print(
            f"| {a} | {acc:.3f} | {_fmt(d_acc, 100)} | {t_txt} | {_fmt(d_t, 1)} "
            f"| {np.mean(list(tau[a].values())):.2f} |"
        )
    _plot(runs, ROOT / "docs" / "compression-study.png")


def _fmt(iv: PairedInterval, scale: float) -> str:
    mean, lo, hi = iv.mean * scale, iv.lo * scale, iv.hi * scale
    if mean != mean:
        return "n/a"
    return f"{mean:+.1f} [{lo:+.1f}, {hi:+.1f}]" if lo == lo else f"{mean:+.1f}"


def _plot(runs: dict[str, dict[int, list[Row]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.6))
    for arm, by in runs.items():
        rows = [
            [r for r in rr if r["test_accuracy"] == r["test_accuracy"]]
            for rr in by.values()
        ]
        t = np.mean([[float(r["sim_time"]) for r in rr] for rr in rows], axis=0)  # type: ignore[arg-type]
        acc = np.mean([[float(r["test_accuracy"]) for r in rr] for rr in rows], axis=0)  # type: ignore[arg-type]
        ax.plot(t, acc, marker="o", ms=3, label=arm)
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("test accuracy (mean over seeds)")
    ax.set_title("FedAvg on phones-stragglers, MLP 284k, 3 s window")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
