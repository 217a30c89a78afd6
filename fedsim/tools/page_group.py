"""compare.html and stress.html: the interactive page of ``fedsim compare``
and ``fedsim stress``, beside compare.md and stress.md.

The page reads only the output folder's files: ``runs/*.parquet`` (each
run's rounds, named ``<arm>-seed<k>`` by compare and
``<cell>-<arm>-seed<k>`` by stress), the one-row-per-run table
(compare.parquet or stress.parquet) and paired.parquet. It holds the test
accuracy against simulated time and rounds, per arm: the mean over seeds
with the band from the lowest to the highest seed; and each arm's paired
differences against the baseline with their 95% intervals, the hover giving
every column of the row (the verdict among them). paired.parquet's columns
are read by name and only ``metric``, ``algorithm``, ``mean``, ``lo`` and
``hi`` are needed: a column added or renamed shows in the hover as it is.

The page is rewritten as the tables are, so it can be served live while
the runs go on (fedsim.tools.live); see docs/report-page.md.
"""

from __future__ import annotations

import math
import re
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from fedsim.results import atomic_write_bytes
from fedsim.tools.page import _section, numbers
from fedsim.tools.page_html import render
from fedsim.tools.report import ReportError, _read_table

# the file each command writes a row per run to, and its page's name
TABLES = {"compare": "compare.parquet", "stress": "stress.parquet"}
# runs/<cell>-<arm>-seed<k>.parquet (stress) or runs/<arm>-seed<k>.parquet
_RUN_FILE = re.compile(r"^(?:(?P<cell>\d+)-)?(?P<arm>.+)-seed(?P<seed>\d+)\.parquet$")
_PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2",
            "#7f7f7f", "#bcbd22", "#17becf"]  # fmt: skip


def write_group_page(out_dir: Path) -> Path:
    """Write ``compare.html`` (or ``stress.html``) into a comparison's (or
    sweep's) output folder, atomically; the same bytes for the same files.

    Raises:
        ReportError: the folder holds neither table, or a file cannot be read.
    """
    out_dir = Path(out_dir)
    kind = _kind(out_dir)
    path = out_dir / f"{kind}.html"
    atomic_write_bytes(path, render(group_page_data(out_dir)).encode())
    return path


def _kind(out_dir: Path) -> str:
    """The command that wrote the folder: "stress" when it holds
    stress.parquet, else "compare"."""
    return "stress" if (out_dir / TABLES["stress"]).is_file() else "compare"


def group_page_data(out_dir: Path) -> dict[str, Any]:
    """What a comparison's or a sweep's page shows (fedsim.tools.page_html's
    data format), from the runs finished so far.

    Raises:
        ReportError: no run has finished yet (no table), or a file cannot be
            read.
    """
    out_dir = Path(out_dir)
    kind = _kind(out_dir)
    runs = _read_table(out_dir / TABLES[kind])
    if runs is None:
        raise ReportError(
            f"{out_dir}: neither compare.parquet nor stress.parquet (expected "
            "the --out folder of `fedsim compare` or `fedsim stress`)"
        )
    names = (
        runs.column("algorithm").to_pylist() if "algorithm" in runs.column_names else []
    )
    curves = _curves(out_dir / "runs", _labels(map(str, names)))
    paired = _read_table(out_dir / "paired.parquet")
    rows = [] if paired is None else paired.to_pylist()
    sections = [_curve_section(curves)]
    if rows:
        sections.append(_paired_section(rows))
    arms = sorted({arm for arm, _ in curves})
    return {
        "title": f"fedsim {kind}: {out_dir.name}",
        "subtitle": f"Output folder: {out_dir.name}; arms: {', '.join(arms) or '-'}",
        "counter_label": "runs done",
        "counter": runs.num_rows,
        "notes": [],
        "table": [
            (f"{arm}: seeds done", str(len(seeds)))
            for arm, seeds in _seeds(curves).items()
        ],  # fmt: skip
        "sections": sections,
    }


def _labels(labels: Iterable[str]) -> dict[str, str]:
    """The arms' labels by the file-name stem their runs are written under
    (compare's file_stems), so that the curves and the paired rows name an
    arm alike; a stem of no known label names its arm itself."""
    from fedsim.tools.compare import file_stems

    return {stem: label for label, stem in file_stems(dict.fromkeys(labels)).items()}


def _curves(runs_dir: Path, labels: dict[str, str]) -> dict[tuple[str, int], Any]:
    """Each run's rounds table by (arm, seed), the arm named by its label
    (``labels``: stem -> label); an arm of a sweep is ``cell N: <arm>``.
    Files not named as a run are left alone."""
    out = {}
    for path in sorted(runs_dir.glob("*.parquet")):
        m = _RUN_FILE.match(path.name)
        if m is None:
            continue
        arm = labels.get(m["arm"], m["arm"])
        arm = arm if m["cell"] is None else f"cell {int(m['cell'])}: {arm}"
        try:
            out[arm, int(m["seed"])] = pq.read_table(path)
        except (OSError, ValueError) as exc:
            raise ReportError(f"cannot read {path}: {exc}") from None
    return out


def _seeds(curves: dict[tuple[str, int], Any]) -> dict[str, list[int]]:
    """The seeds finished per arm, arms in name order."""
    out: dict[str, list[int]] = {}
    for arm, seed in sorted(curves):
        out.setdefault(arm, []).append(seed)
    return out


def _curve_section(curves: dict[tuple[str, int], Any]) -> dict[str, Any]:
    """Test accuracy against simulated time and rounds: per arm the mean
    over seeds, and a band from the lowest to the highest seed."""
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, shared_yaxes=True)
    for i, (arm, seeds) in enumerate(_seeds(curves).items()):
        tables = [curves[arm, s] for s in seeds]
        color = _PALETTE[i % len(_PALETTE)]
        acc = _stack([numbers(t, "test_accuracy") for t in tables])
        sim = np.nanmean(_stack([numbers(t, "sim_time") for t in tables]), 0)
        done = np.arange(1, acc.shape[1] + 1, dtype=float)
        for col, x in ((1, sim), (2, done)):
            _band(fig, x, acc, (arm, color, col))
    fig.update_xaxes(title_text="simulated time (s)", col=1)
    fig.update_xaxes(title_text="rounds completed", col=2)
    fig.update_yaxes(title_text="test accuracy", col=1)
    fig.update_layout(height=450)
    hint = (
        "Per arm: the mean over its seeds (line) and the band from the lowest "
        "to the highest seed; seeds still running are not in it yet."
    )
    return _section("curves", "Test accuracy over seeds", hint, fig)


def _stack(columns: list[np.ndarray]) -> np.ndarray:
    """Runs' columns as rows of one array, padded with NaN to the longest."""
    n = max((c.size for c in columns), default=0)
    return np.vstack([np.pad(c, (0, n - c.size), constant_values=np.nan)
                      for c in columns])  # fmt: skip


def _band(fig: Any, x: np.ndarray, y: np.ndarray, style: tuple[str, str, int]) -> None:
    """One arm in one panel: its mean line and its min-max band (rounds
    where no seed has a value are left out)."""
    arm, color, col = style
    with warnings.catch_warnings():  # "Mean of empty slice": no seed got there
        warnings.simplefilter("ignore", RuntimeWarning)
        mean, low, high = np.nanmean(y, 0), np.nanmin(y, 0), np.nanmax(y, 0)
    keep = np.isfinite(mean) & np.isfinite(x)
    x, mean, low, high = x[keep], mean[keep], low[keep], high[keep]
    fig.add_scatter(
        x=np.r_[x, x[::-1]], y=np.r_[high, low[::-1]], fill="toself",
        fillcolor=_translucent(color), line={"width": 0}, hoverinfo="skip",
        mode="lines",
        legendgroup=arm, showlegend=False, row=1, col=col,
    )  # fmt: skip
    fig.add_scatter(
        x=x, y=mean, name=arm, legendgroup=arm, showlegend=col == 1,
        line={"color": color}, mode="lines", row=1, col=col,
    )  # fmt: skip


def _translucent(color: str) -> str:
    """A "#rrggbb" colour at 20% opacity, for a band behind its line."""
    r, g, b = (int(color[i : i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r},{g},{b},0.2)"


def _paired_section(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Each arm's paired difference against the baseline, a panel per
    metric: the mean with its 95% interval; the hover lists every column."""
    from plotly.subplots import make_subplots

    metrics = list(dict.fromkeys(str(r.get("metric")) for r in rows))
    fig = make_subplots(rows=1, cols=len(metrics), subplot_titles=metrics)
    for col, metric in enumerate(metrics, start=1):
        mine = [r for r in rows if str(r.get("metric")) == metric]
        names = [_arm_name(r) for r in mine]
        mean = [_float(r.get("mean")) for r in mine]
        lo = [_float(r.get("lo")) for r in mine]
        hi = [_float(r.get("hi")) for r in mine]
        fig.add_scatter(
            x=mean, y=names, mode="markers", row=1, col=col, showlegend=False,
            error_x={"type": "data", "symmetric": False,
                     "array": [h - m for h, m in zip(hi, mean, strict=True)],
                     "arrayminus": [m - v for m, v in zip(mean, lo, strict=True)]},
            hovertext=["<br>".join(f"{k}: {_cell(v)}" for k, v in r.items())
                       for r in mine],
            hoverinfo="text", marker={"size": 9, "color": "#1f77b4"},
        )  # fmt: skip
        fig.add_vline(x=0, line_dash="dash", line_color="#888", row=1, col=col)
    fig.update_layout(height=max(300, 60 + 30 * len(rows) // max(1, len(metrics))))
    hint = (
        "Each arm minus the baseline, seed by seed: the mean difference and its "
        "95% Student t interval; an interval that does not cross 0 is a "
        "difference the seeds support. Hover a point for its verdict and "
        "every column of paired.parquet."
    )
    return _section("paired", "Paired differences against the baseline", hint, fig)


def _arm_name(row: dict[str, Any]) -> str:
    """A paired row's arm, with its cell in a sweep."""
    arm = str(row.get("algorithm"))
    return arm if row.get("cell") is None else f"cell {row['cell']}: {arm}"


def _float(value: object) -> float:
    """A cell as a float; NaN when it is not a number."""
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    return float(value) if ok else math.nan  # type: ignore[arg-type]


def _cell(value: object) -> str:
    """A hover cell: floats to 4 significant digits, the rest as text."""
    return f"{value:.4g}" if isinstance(value, float) else str(value)
