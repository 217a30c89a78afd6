"""Paired intervals of two stress sweeps, side by side (docs/fleets.md, "Study:
common random numbers and paired intervals").

    .venv/bin/python benchmarks/paired_widths.py BEFORE_DIR AFTER_DIR [--baseline NAME]

Reads each directory's stress.parquet (written by `fedsim stress`, of any
fedsim version) and recomputes, with fedsim.tools.stats, every arm's paired
difference in final accuracy against the baseline, cell by cell, and each
arm's paired drop from the first cell to the last. Prints, per comparison,
both intervals, their widths and verdicts, and the median width ratio
(after / before).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from fedsim.tools.stats import PairedInterval, paired_differences, paired_interval


def load(folder: Path) -> list[dict]:
    return pq.read_table(folder / "stress.parquet").to_pylist()


def acc(rows: list[dict], cell: int, arm: str) -> dict[int, float]:
    """seed -> final accuracy of ``arm`` in ``cell``."""
    return {
        r["seed"]: r["final_accuracy"]
        for r in rows
        if r["cell"] == cell and r["algorithm"] == arm
    }


def intervals(rows: list[dict], baseline: str) -> dict[tuple, PairedInterval]:
    """(cell, arm) -> the arm's paired difference from ``baseline`` in the
    cell; ("drop", arm) -> its paired drop from the first cell to the last."""
    cells = sorted({r["cell"] for r in rows})
    arms = list(dict.fromkeys(r["algorithm"] for r in rows))
    out = {}
    for cell in cells:
        base = acc(rows, cell, baseline)
        for arm in arms:
            if arm != baseline:
                d = paired_differences(acc(rows, cell, arm), base)
                out[cell, arm] = paired_interval(d)
    for arm in arms:  # accuracy lost from the mildest cell to the harshest
        d = paired_differences(acc(rows, cells[0], arm), acc(rows, cells[-1], arm))
        out["drop", arm] = paired_interval(d, higher_is_better=False)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    ap.add_argument("--baseline", default=None)
    args = ap.parse_args()
    before, after = load(args.before), load(args.after)
    baseline = args.baseline or before[0]["algorithm"]
    b, a = intervals(before, baseline), intervals(after, baseline)
    print(
        "| comparison | before: mean [95% interval] | width | verdict "
        "| after: mean [95% interval] | width | verdict |"
    )
    print("|---|---|---|---|---|---|---|")
    ratios = []
    for key in b:
        what = (
            f"{key[1]} drop, first -> last cell"
            if key[0] == "drop"
            else (f"cell {key[0]}: {key[1]} - {baseline}")
        )
        cells = []
        for iv in (b[key], a[key]):
            span = f"{iv.mean * 100:+.1f} [{iv.lo * 100:+.1f}, {iv.hi * 100:+.1f}]"
            cells += [span, f"{(iv.hi - iv.lo) * 100:.1f}", iv.verdict]
        if b[key].hi > b[key].lo:  # a zero width has no ratio
            ratios.append((a[key].hi - a[key].lo) / (b[key].hi - b[key].lo))
        print(f"| {what} | " + " | ".join(cells) + " |")
    print(f"\nmedian width ratio after / before: {np.median(ratios):.2f}")


if __name__ == "__main__":
    main()
