"""Figures of one run, drawn from its Parquet tables (docs/results.md, "Figures").

``figure_*`` returns a matplotlib Figure (Agg canvas, no pyplot state), which
fedsim.report writes as a PNG. Missing columns, NaN and empty tables give a figure
that says so, not an error: an interrupted run still gets a report.

Example:
    >>> import pyarrow as pa
    >>> rounds = pa.table({"round": [0, 1], "sim_time": [9.5, 20.0],
    ...                    "test_loss": [2.3, 1.9]})  # or pq.read_table(...)
    >>> [ax.get_title() for ax in figure_metrics(rounds).axes]
    ['loss vs simulated time', 'loss vs rounds completed']
"""

from __future__ import annotations

import io
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from fedsim.algorithms.sampling import weight_shares
from fedsim.links import spearman
from fedsim.results import atomic_write_bytes

DPI = 110

# Marker per drop reason (fedsim.clock.Plan.reason); anything else gets "x".
_DROP_MARKERS = {"late": "x", "offline": "v", "no_time": "s", "no_data": "o"}
_DROP_COLOR = "#d62728"
_TEXT: dict[str, Any] = {"ha": "center", "va": "center", "fontsize": 11}


def _round_ticks() -> MaxNLocator:
    return MaxNLocator(nbins="auto", integer=True, steps=[1, 2, 2.5, 5, 10])


def _column(table: pa.Table | None, name: str) -> list[Any]:
    if table is None or name not in table.column_names:
        return []
    return table.column(name).to_pylist()


def _floats(table: pa.Table | None, name: str, n: int = 0) -> np.ndarray:
    """A float column, nulls as NaN (``n`` NaN when the column is missing)."""
    return np.array(_column(table, name) or [None] * n, dtype=float)


def _by_group(
    clients: pa.Table | None, n: int, groups: Sequence[str]
) -> tuple[np.ndarray, dict[str, Any], np.ndarray]:
    """``n`` updates' device groups, each group's color in legend order, dropped."""
    col = _column(clients, "device_group")
    dev = ["unknown" if g is None else str(g) for g in col]
    dev_arr = np.array(dev if len(col) == n else ["unknown"] * n, dtype=object)
    # the scenario's groups first, then the others seen, sorted, then "unknown"
    seen = {str(g) for g in col if g is not None}
    order = [g for g in groups if g in seen or not seen]
    order += sorted(seen - set(order))
    order += sorted(set(dev_arr.tolist()) - set(order))
    palette = [colormaps["tab10"](i) for i in range(10) if i != 3]  # red: dropped
    colors = {g: palette[i % len(palette)] for i, g in enumerate(order)}
    flags = np.array(_column(clients, "dropped") or [False] * n, dtype=bool)
    return dev_arr, colors, flags


def is_async(clients: pa.Table | None) -> bool:
    """Whether the run is asynchronous: its clients table has ``staleness``."""
    return clients is not None and "staleness" in clients.column_names


def has_chi2(rounds: pa.Table | None) -> bool:
    """Whether ``rounds`` has a ``chi2_pw`` column with a finite value."""
    return bool(np.isfinite(_floats(rounds, "chi2_pw")).any())


def _new_figure(width: float, height: float) -> Figure:
    return Figure(figsize=(width, height), dpi=DPI, layout="constrained")


def _subplots(width: float, height: float, *grid: int, **kw: Any) -> tuple[Figure, Any]:
    fig = _new_figure(width, height)
    return fig, fig.subplots(*grid, **kw)


def _save(fig: Figure, path: Path) -> Path:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    atomic_write_bytes(Path(path), buf.getvalue())
    return Path(path)


def _no_data(ax: Axes, message: str) -> None:
    ax.text(0.5, 0.5, message, transform=ax.transAxes, color="0.4", wrap=True, **_TEXT)
    ax.set(xticks=[], yticks=[])


def _line(ax: Axes, x: np.ndarray, y: np.ndarray, **kw: Any) -> bool:
    """Plot the finite points of y against x; False when there are none."""
    ok = np.isfinite(x) & np.isfinite(y) if len(x) == len(y) else np.zeros(0, bool)
    if not ok.any():
        return False
    marker = "o" if ok.sum() <= 30 else None
    ax.plot(x[ok], y[ok], marker=marker, markersize=3.5, linewidth=1.6, **kw)
    return True


def _frame_metric(ax: Axes, ylabel: str, xlabel: str, by_round: bool) -> None:
    ax.set(ylabel=ylabel, xlabel=xlabel, title=f"{ylabel} vs {xlabel.split(' (')[0]}")
    if by_round:
        ax.xaxis.set_major_locator(_round_ticks())
    ax.grid(alpha=0.3)


def _with_initial(
    x: np.ndarray, y: np.ndarray, x0: float, y0: float | None
) -> tuple[np.ndarray, np.ndarray]:
    """``(x, y)`` with the initial model's point in front, when finite."""
    if y0 is None or not math.isfinite(float(y0)) or len(x) != len(y):
        return x, y
    return np.concatenate([[x0], x]), np.concatenate([[float(y0)], y])


def figure_metrics(
    rounds: pa.Table | None, title: str = "", initial: Mapping[str, Any] | None = None
) -> Figure:
    """Test accuracy and loss (train loss dashed) against simulated time and rounds
    completed (round ``t`` at ``t + 1``) from ``initial`` on; no accuracy: loss only."""
    # summary.json's value: anything but a mapping (an old run: null) is none
    initial = initial if isinstance(initial, Mapping) else {}
    t0 = float(initial.get("t") or 0.0)
    acc = _floats(rounds, "test_accuracy")
    test_loss = _floats(rounds, "test_loss")
    train_loss = _floats(rounds, "train_loss")
    losses = np.concatenate([test_loss, train_loss])
    losses = losses[np.isfinite(losses)]
    with_acc = bool(np.isfinite(acc).any())
    nrows = 2 if with_acc else 1
    fig, axes = _subplots(11, 4.2 * nrows, nrows, 2, squeeze=False)
    xs = [
        (_floats(rounds, "sim_time"), t0, "simulated time (s)"),
        (_floats(rounds, "round") + 1.0, 0.0, "rounds completed"),
    ]
    for col, (x, x0, xlabel) in enumerate(xs):
        if with_acc:
            xy = _with_initial(x, acc, x0, initial.get("accuracy"))
            _line(axes[0, col], *xy, color="C0", label="test accuracy")
            _frame_metric(axes[0, col], "test accuracy", xlabel, by_round=col == 1)
        ax = axes[nrows - 1, col]
        xy = _with_initial(x, test_loss, x0, initial.get("loss"))
        drew = _line(ax, *xy, color="C1", label="test loss")
        drew |= _line(ax, x, train_loss, color="C2", linestyle="--", label="train loss")
        if not drew:
            _no_data(ax, "no loss recorded")
            continue
        if len(losses) and losses.min() > 0 and losses.max() / losses.min() > 100:
            ax.set_yscale("log")
        _frame_metric(ax, "loss", xlabel, by_round=col == 1)
        ax.legend(loc="best", fontsize=9)
    if not with_acc and rounds is not None and rounds.num_rows:
        fig.text(0.01, 0.005, "no test accuracy in this run", fontsize=8, color="0.4")
    fig.suptitle(title or "test metrics", fontsize=13)
    return fig


def figure_tau_by_group(
    clients: pa.Table | None,
    groups: Sequence[str] = (),
    title: str = "",
    max_steps: int | None = None,
) -> Figure:
    """Completed updates' local steps per device group; "max_steps cap" dashed."""
    fig, ax = _subplots(max(6.0, 1.6 + 1.5 * max(1, len(groups))), 4.6)
    tau = _floats(clients, "tau")
    dev, colors, dropped = _by_group(clients, len(tau), groups)
    keep = np.isfinite(tau) & ~dropped if len(tau) else np.zeros(0, dtype=bool)
    present = [(g, d) for g in colors if len(d := tau[keep & (dev == g)])]
    if not present:
        _no_data(ax, "no completed updates")
    else:
        box = ax.boxplot(
            [d for _, d in present],
            tick_labels=[f"{g}\n(n={len(d)})" for g, d in present],
            patch_artist=True,
            widths=0.55,
            showfliers=False,
            medianprops={"color": "black", "linewidth": 1.5},
        )
        rng = np.random.default_rng(0)  # jitter only; fixed so plots are stable
        for i, ((g, d), patch) in enumerate(zip(present, box["boxes"], strict=True)):
            patch.set(facecolor=colors[g], alpha=0.45)
            jitter = rng.uniform(-0.18, 0.18, size=len(d))
            ax.scatter(i + 1 + jitter, d, s=9, color=colors[g], alpha=0.7, zorder=3)
        ax.set(ylabel="local steps tau_i(t)", xlabel="device group")
        ax.grid(axis="y", alpha=0.3)
        if max_steps is not None:
            ax.axhline(max_steps, color="0.3", ls="--", lw=1.0, label="max_steps cap")
            ax.legend(loc="best", fontsize=9)
        ax.set_ylim(bottom=min(0.0, ax.get_ylim()[0]))
    ax.set_title(title or "local steps per update, by device group")
    return fig


def figure_staleness(
    clients: pa.Table | None, groups: Sequence[str] = (), title: str = ""
) -> Figure:
    """Async runs: staleness against arrival time by device group, drops as red x."""
    fig, ax = _subplots(10, 4.6)
    stale, t1 = _floats(clients, "staleness"), _floats(clients, "t_arrive")
    n = len(stale)
    dev, colors, dropped = _by_group(clients, n, groups)
    ok = np.isfinite(stale) & np.isfinite(t1) if n and len(t1) == n else None
    if ok is None or not ok.any():
        _no_data(ax, "no staleness recorded")
    else:
        for g, color in colors.items():
            m = ok & ~dropped & (dev == g)
            if m.any():
                ax.scatter(t1[m], stale[m], s=12, alpha=0.6, color=color, label=g)
        m = ok & dropped
        if m.any():
            ax.scatter(
                t1[m], stale[m], s=30, marker="x", color=_DROP_COLOR, label="dropped"
            )
        ax.set(
            xlabel="simulated arrival time (s)", ylabel="staleness (server versions)"
        )
        ax.yaxis.set_major_locator(_round_ticks())
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left", fontsize=9, markerscale=1.5)
    ax.set_title(title or "staleness of updates over simulated time")
    return fig


def _round_blocks(rounds_present: list[int], max_rounds: int) -> list[list[int]]:
    """The rounds to draw: all of them, or the first and last ``max_rounds/2``."""
    if len(rounds_present) <= max_rounds:
        return [rounds_present]
    head = max(1, max_rounds // 2)
    tail = max(1, max_rounds - head)
    return [rounds_present[:head], rounds_present[-tail:]]


@dataclass(frozen=True)
class _Updates:
    """clients.parquet's columns the timeline draws; ``stale`` NaN unless async."""

    rnd: np.ndarray
    cid: np.ndarray
    t0: np.ndarray
    t1: np.ndarray
    dev: np.ndarray
    colors: dict[str, Any]  # by device group, in legend order
    dropped: np.ndarray
    reasons: np.ndarray
    stale: np.ndarray

    @classmethod
    def of(cls, clients: pa.Table | None, groups: Sequence[str]) -> _Updates | None:
        """None when there are no updates (or columns are missing)."""
        rnd = np.array(_column(clients, "round"), dtype=np.int64)
        cid = np.array(_column(clients, "client_id"), dtype=np.int64)
        t0, t1 = _floats(clients, "t_start"), _floats(clients, "t_arrive")
        n = len(rnd)
        if n == 0 or not (len(cid) == len(t0) == len(t1) == n):
            return None
        reason = [str(r or "") for r in _column(clients, "drop_reason")] or [""] * n
        stale = _floats(clients, "staleness", n)  # NaN unless async
        reasons = np.array(reason, dtype=object)
        return cls(rnd, cid, t0, t1, *_by_group(clients, n, groups), reasons, stale)


def _draw_panel(
    ax: Axes, u: _Updates, y: np.ndarray, block: list[int], rounds: Any, row_pt: float
) -> tuple[set[str], Any]:
    """Draw rounds ``block``; return the drop reasons drawn, the staleness scatter."""
    m_block = np.isin(u.rnd, block) & np.isfinite(u.t0) & np.isfinite(u.t1)
    # With many rows (few points each), white edges would hide the bars.
    edge_w = 0.8 if row_pt >= 6 else 0.0
    mark = float(np.clip(row_pt**2, 4.0, 38.0))  # drop-marker area
    # One barh call per (group, dropped, round parity) keeps large fleets fast.
    for g, is_drop, is_odd in itertools.product(u.colors, (False, True), (False, True)):
        m = m_block & (u.dev == g) & (u.dropped == is_drop) & (u.rnd % 2 == is_odd)
        if m.any():
            ax.barh(
                y[m],
                np.maximum(u.t1[m] - u.t0[m], 0.0),
                left=u.t0[m],
                height=0.7,
                color=u.colors[g],
                alpha=(0.35 if is_drop else 0.85) * (0.6 if is_odd else 1.0),
                hatch="////" if is_drop else None,
                # White edges keep one client's consecutive rounds apart.
                edgecolor=_DROP_COLOR if is_drop else "white",
                linewidth=0.6 * (edge_w > 0) if is_drop else edge_w,
            )
    used = set(u.reasons[m_block & u.dropped].tolist())
    for r in sorted(used):
        m = m_block & u.dropped & (u.reasons == r)
        marker = _DROP_MARKERS.get(r, "x")
        ax.scatter(u.t1[m], y[m], marker=marker, s=mark, color=_DROP_COLOR, zorder=4)
    scatter = None
    m = m_block & ~u.dropped & np.isfinite(u.stale)
    if m.any():
        scatter = ax.scatter(
            u.t1[m],
            y[m],
            c=u.stale[m],
            cmap="viridis",
            vmin=0,
            vmax=max(float(np.nanmax(u.stale, initial=0.0)), 1.0),
            s=0.6 * mark,
            edgecolors="black" if edge_w else "none",
            linewidths=0.4,
            zorder=5,
        )
    if not m_block.any():
        return used, scatter
    lo, hi = float(u.t0[m_block].min()), float(u.t1[m_block].max())
    # Round boundaries: the end of every shown round and of the one before.
    end_times = _floats(rounds, "sim_time")
    for r, t in zip(_column(rounds, "round"), end_times, strict=False):
        if (r in block or r + 1 in block) and math.isfinite(t) and lo <= t:
            ax.axvline(t, color="0.55", linewidth=0.8, alpha=0.5, zorder=0)
    pad = max(hi - lo, 1e-9)
    ax.set(xlabel="simulated time (s)", xlim=(lo - 0.01 * pad, hi + 0.02 * pad))
    label = f"rounds {block[0]}-{block[-1]}" if len(block) > 1 else f"round {block[0]}"
    ax.set_title(label, fontsize=10)
    ax.grid(axis="x", alpha=0.2)
    return used, scatter


def figure_timeline(
    clients: pa.Table | None,
    rounds: pa.Table | None = None,
    groups: Sequence[str] = (),
    max_rounds: int = 20,
    title: str = "",
) -> Figure:
    """A bar per client row, ``t_start`` to ``t_arrive``, by device group; dropped
    ones hatched, ending in a red marker shaped by the reason; async arrivals
    coloured by staleness; past ``max_rounds`` rounds, first and last halves."""
    if max_rounds < 1:
        raise ValueError(f"max_rounds must be at least 1, got {max_rounds}")
    u = _Updates.of(clients, groups)
    if u is None:
        fig, ax = _subplots(8, 3.5)
        _no_data(ax, "no client updates recorded")
        fig.suptitle(title or "client timeline")
        return fig
    all_rounds = sorted(set(u.rnd.tolist()))
    blocks = _round_blocks(all_rounds, max_rounds)
    shown = np.isin(u.rnd, np.concatenate([np.array(b) for b in blocks]))
    ids = np.unique(u.cid[shown])
    height = float(np.clip(1.5 + 0.22 * len(ids), 3.5, 14.0))
    width = 12.0 if len(blocks) > 1 else 10.0
    fig, (axes,) = _subplots(width, height, 1, len(blocks), sharey=True, squeeze=False)
    row_pt = 72.0 * (height - 1.5) / max(1, len(ids))  # points of height per row
    y = np.searchsorted(ids, u.cid).astype(np.float64)  # rows not shown: not drawn
    used: set[str] = set()
    scatter = None
    for ax, block in zip(axes, blocks, strict=True):
        reasons, drawn = _draw_panel(ax, u, y, block, rounds, row_pt)
        used |= reasons
        scatter = drawn if drawn is not None else scatter
    rows = range(0, len(ids), max(1, math.ceil(len(ids) / 40)))  # <= ~40 labels
    axes[0].set(ylabel="client id", yticks=rows, yticklabels=ids[rows])
    axes[0].set_ylim(len(ids) - 0.5, -0.5)
    # the legend, below the panels: device groups and the drop reasons drawn
    handles: list[Any] = [
        Patch(facecolor=color, alpha=0.85, label=g) for g, color in u.colors.items()
    ]
    for r in sorted(used):
        marker, label = _DROP_MARKERS.get(r, "x"), f"dropped: {r or 'unknown'}"
        handles.append(
            axes[0].scatter([], [], marker=marker, color=_DROP_COLOR, label=label)
        )
    kw: dict[str, Any] = {"fontsize": 9, "frameon": False, "ncol": min(len(handles), 5)}
    fig.legend(handles=handles, loc="outside lower center", **kw)
    if scatter is not None:
        kw = {"label": "staleness at arrival", "shrink": 0.8, "ticks": _round_ticks()}
        fig.colorbar(scatter, ax=axes, **kw)
    more = f" (first and last of {len(all_rounds)} rounds)" if len(blocks) > 1 else ""
    fig.suptitle((title or "client timeline") + more, fontsize=12)
    return fig


def figure_chi2(rounds: pa.Table | None, title: str = "") -> Figure:
    """chi^2(p||w) of the aggregation weights per round (0: the true objective)."""
    fig, ax = _subplots(9, 4.0)
    chi2 = _floats(rounds, "chi2_pw")
    if not _line(ax, _floats(rounds, "round"), chi2, color="C4"):
        _no_data(ax, "no objective-inconsistency values recorded")
    else:
        if chi2[np.isfinite(chi2)].any():
            ax.set_ylim(bottom=0)
        else:  # a flat line on the axis looks like no data
            note = "chi^2(p || w) = 0 in every round"
            ax.text(0.5, 0.6, note, transform=ax.transAxes, color="0.3", **_TEXT)
            ax.set_ylim(-0.05, 1.0)
        ax.set(xlabel="round (0-based, as in rounds.parquet)", ylabel="chi^2(p || w)")
        ax.xaxis.set_major_locator(_round_ticks())
        ax.grid(alpha=0.3)
    ax.set_title(title or "objective inconsistency per round")
    return fig


def figure_weight_share(
    clients: pa.Table | None,
    rounds: pa.Table | None = None,
    partition: pa.Table | None = None,
    title: str = "",
) -> Figure:
    """Each client's aggregation weight share against its data share p_i, y = x."""
    fig, ax = _subplots(6.0, 5.5)
    ids, p = _floats(partition, "client_id"), _floats(partition, "weight")
    # agg_weight: the weight as applied (runs before it had only "weight")
    w = np.array(_column(clients, "agg_weight") or _column(clients, "weight"), float)
    cid = _floats(clients, "client_id")
    bad = len(p) == 0 or len(ids) != len(p) or not np.isfinite(p).all() or p.sum() <= 0
    if bad or len(cid) == 0 or len(cid) != len(w):
        _no_data(ax, "no weight or data shares recorded")
        ax.set_title(title or "weight share vs data share")
        return fig
    data = np.zeros(int(ids.max()) + 1)
    data[ids.astype(np.int64)] = p / p.sum()
    used = int((_floats(rounds, "n_completed") > 0).sum())
    share = weight_shares(len(data), cid.astype(np.int64), w, used)
    l1 = float(np.abs(share - data).sum())
    pos = data[data > 0]
    log = len(pos) > 1 and pos.max() / pos.min() > 100
    lo = min(pos.min(), share[share > 0].min() if (share > 0).any() else 1.0)
    # clients never aggregated are drawn at the bottom edge of log axes
    y = np.where(share > 0, share, lo / 2) if log else share
    ax.scatter(data, y, s=14, alpha=0.7, color="C0", label="client")
    line = np.array([lo / 2 if log else 0.0, max(data.max(), share.max()) * 1.05])
    ax.plot(line, line, color="0.3", linewidth=1, linestyle="--", label="y = x")
    if log:
        ax.set(xscale="log", yscale="log")
    ax.set(xlabel="data share p_i", ylabel="aggregation weight share")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", fontsize=9)
    ax.set_title(f"{title or 'weight share vs data share'} (L1 = {l1:.3g})")
    return fig


def figure_links(
    samples: np.ndarray,
    speed: np.ndarray,
    group: np.ndarray,
    names: Sequence[str],
    title: str = "",
) -> Figure:
    """Each device's training samples against its speed (log-log), coloured
    by device group, with the realised Spearman correlation in the title."""
    fig, ax = _subplots(6.5, 5.0)
    ok = (samples > 0) & (speed > 0)
    if not ok.any():
        _no_data(ax, "no device with samples and speed")
        ax.set_title(title or "samples vs speed")
        return fig
    # a million points would take minutes to draw: an even subsample reads the same
    shown = np.flatnonzero(ok)[:: max(1, int(ok.sum()) // 20_000)]
    # tab10's own colours (resampling a listed map would pick neighbours)
    cmap = colormaps["tab10"]
    if len(names) > 10:
        cmap = colormaps["viridis"].resampled(len(names))
    for gi, name in enumerate(names):
        sel = shown[group[shown] == gi]
        if sel.size:
            ax.scatter(speed[sel], samples[sel], s=10, alpha=0.6, color=cmap(gi))
            ax.scatter([], [], s=20, color=cmap(gi), label=str(name))
    ax.set(xscale="log", yscale="log", xlabel="speed (local steps/s)")
    ax.set(ylabel="training samples")
    ax.grid(alpha=0.3, which="both")
    if len(names) <= 20:
        ax.legend(title="device group", fontsize=8, loc="best")
    rho = spearman(samples[ok], speed[ok])
    ax.set_title(f"{title or 'samples vs speed'} (Spearman {rho:+.2f})")
    return fig
