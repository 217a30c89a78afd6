"""Figures of one run, drawn from its Parquet tables.

Each ``figure_*`` function takes the run's tables (``rounds.parquet`` and
``clients.parquet`` read with :func:`pyarrow.parquet.read_table`) and returns
a matplotlib Figure; the matching ``plot_*`` function takes a path too,
writes the figure there as a PNG, atomically, and returns the path. They use
matplotlib's object API with the Agg canvas, so they need no display and
leave pyplot's global state alone. Missing columns, NaN values and empty
tables give a figure that says so instead of an error: a report of an
interrupted run is still a report.

Example:
    >>> import pyarrow as pa
    >>> rounds = pa.table({"round": [0, 1], "sim_time": [9.5, 20.0],
    ...                    "test_loss": [2.3, 1.9]})  # or pq.read_table(...)
    >>> [ax.get_title() for ax in figure_metrics(rounds).axes]
    ['loss vs simulated time', 'loss vs rounds completed']
    >>> plot_metrics(rounds, Path("metrics.png"))  # doctest: +SKIP
    PosixPath('metrics.png')
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar

import numpy as np
import pyarrow as pa
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from fedsim.algorithms.sampling import weight_shares
from fedsim.results import atomic_write_bytes

__all__ = [
    "DPI",
    "is_async",
    "has_chi2",
    "group_order",
    "figure_metrics",
    "figure_tau_by_group",
    "figure_timeline",
    "figure_staleness",
    "figure_chi2",
    "figure_weight_share",
    "plot_metrics",
    "plot_tau_by_group",
    "plot_timeline",
    "plot_staleness",
    "plot_chi2",
    "plot_weight_share",
]

DPI = 110

# Marker per drop reason (fedsim.clock.Plan.reason); anything else gets "x".
_DROP_MARKERS = {"late": "x", "offline": "v", "no_time": "s", "no_data": "o"}
_DROP_COLOR = "#d62728"

_T = TypeVar("_T")
_P = ParamSpec("_P")


def _round_ticks() -> MaxNLocator:
    return MaxNLocator(nbins="auto", integer=True, steps=[1, 2, 2.5, 5, 10])


def _column(table: pa.Table | None, name: str) -> list[Any]:
    if table is None or name not in table.column_names:
        return []
    return table.column(name).to_pylist()


def _floats(table: pa.Table | None, name: str) -> np.ndarray:
    """A float column, with nulls as NaN (empty when the column is missing)."""
    return np.array(
        [np.nan if v is None else float(v) for v in _column(table, name)],
        dtype=np.float64,
    )


def _by_group(
    clients: pa.Table | None, n: int, groups: Sequence[str]
) -> tuple[np.ndarray, list[str], np.ndarray]:
    """Each of the ``n`` updates' device group (``"unknown"`` when not
    recorded), the groups in legend order, and whether each update was
    dropped (bool)."""
    col = _column(clients, "device_group")
    dev = np.array(
        [str(g) if g is not None else "unknown" for g in col]
        if len(col) == n
        else ["unknown"] * n,
        dtype=object,
    )
    order = group_order(clients, groups)
    order += sorted(set(dev.tolist()) - set(order))
    flags = [bool(d) for d in _column(clients, "dropped")] or [False] * n
    return dev, order, np.array(flags, dtype=bool)


def _n_rows(table: pa.Table | None) -> int:
    return 0 if table is None else table.num_rows


def is_async(clients: pa.Table | None) -> bool:
    """Whether the run is asynchronous: its clients table has ``staleness``."""
    return clients is not None and "staleness" in clients.column_names


def has_chi2(rounds: pa.Table | None) -> bool:
    """Whether ``rounds`` has a ``chi2_pw`` column with a finite value."""
    return bool(np.isfinite(_floats(rounds, "chi2_pw")).any())


def group_order(clients: pa.Table | None, groups: Sequence[str] = ()) -> list[str]:
    """Device groups in a stable order: ``groups`` first (the scenario's
    order), then any other group seen in ``clients``, sorted."""
    seen = {str(g) for g in _column(clients, "device_group") if g is not None}
    order = [g for g in groups if g in seen or not seen]
    return order + sorted(seen - set(order))


def _colors(groups: Sequence[str]) -> dict[str, Any]:
    from matplotlib import colormaps

    cmap = colormaps["tab10"]
    # Red is kept for dropped updates.
    palette = [cmap(i) for i in range(10) if i != 3]
    return {g: palette[i % len(palette)] for i, g in enumerate(groups)}


def _new_figure(width: float, height: float) -> Figure:
    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    return fig


def _save(fig: Figure, path: Path) -> Path:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    path = Path(path)
    atomic_write_bytes(path, buf.getvalue())
    return path


def _no_data(ax: Axes, message: str) -> None:
    ax.text(
        0.5,
        0.5,
        message,
        ha="center",
        va="center",
        transform=ax.transAxes,
        fontsize=11,
        color="0.4",
        wrap=True,
    )
    ax.set_xticks([])
    ax.set_yticks([])


def _line(ax: Axes, x: np.ndarray, y: np.ndarray, **kw: Any) -> bool:
    """Plot the finite points of y against x; False when there are none (or
    one of the columns is missing: empty)."""
    if len(x) != len(y):
        return False
    ok = np.isfinite(x) & np.isfinite(y)
    if not ok.any():
        return False
    marker = "o" if ok.sum() <= 30 else None
    ax.plot(x[ok], y[ok], marker=marker, markersize=3.5, linewidth=1.6, **kw)
    return True


def _log_if_wide(ax: Axes, *series: np.ndarray) -> None:
    vals = np.concatenate([s[np.isfinite(s)] for s in series] or [np.array([])])
    if len(vals) and vals.min() > 0 and vals.max() / vals.min() > 100:
        ax.set_yscale("log")


def _frame_metric(ax: Axes, ylabel: str, xlabel: str, by_round: bool) -> None:
    """Labels, title ("<ylabel> vs <x>") and grid of a metrics panel;
    integer ticks when the x axis is the round."""
    ax.set_ylabel(ylabel)
    ax.set_xlabel(xlabel)
    if by_round:
        ax.xaxis.set_major_locator(_round_ticks())
    ax.set_title(f"{ylabel} vs {xlabel.split(' (')[0]}")
    ax.grid(alpha=0.3)


def _with_initial(
    x: np.ndarray, y: np.ndarray, x0: float, y0: float | None
) -> tuple[np.ndarray, np.ndarray]:
    """``(x, y)`` with the initial model's point ``(x0, y0)`` in front (when
    it has a finite value)."""
    if y0 is None or not math.isfinite(float(y0)) or len(x) != len(y):
        return x, y
    return np.concatenate([[x0], x]), np.concatenate([[float(y0)], y])


def figure_metrics(
    rounds: pa.Table | None,
    title: str = "",
    initial: Mapping[str, Any] | None = None,
) -> Figure:
    """Test accuracy and loss against simulated time and against rounds.

    A 2x2 grid (accuracy on top, loss below; simulated time left, rounds
    completed right). The row of round ``t`` (0-based, as in
    rounds.parquet) is the model after ``t + 1`` rounds, so it is drawn at
    ``t + 1`` rounds completed; ``initial`` (summary.json's ``initial``:
    ``accuracy``, ``loss``, ``t``), when given, starts each test curve at
    the initial model (0 rounds completed, simulated time ``t``). Runs
    without an accuracy (e.g. the quadratic objective) get a 1x2 grid of
    the loss only. The training loss (the clients' weighted mean over their
    local steps) is drawn dashed next to the test loss.
    """
    # summary.json's value: anything but a mapping (an old run: null) is none
    initial = initial if isinstance(initial, Mapping) else {}
    t0 = float(initial.get("t") or 0.0)
    sim_time = _floats(rounds, "sim_time")
    done = _floats(rounds, "round") + 1.0
    acc = _floats(rounds, "test_accuracy")
    test_loss = _floats(rounds, "test_loss")
    train_loss = _floats(rounds, "train_loss")
    with_acc = bool(np.isfinite(acc).any())
    nrows = 2 if with_acc else 1
    fig = _new_figure(11, 4.2 * nrows)
    axes = np.atleast_2d(fig.subplots(nrows, 2, squeeze=False))
    xs = [(sim_time, t0, "simulated time (s)"), (done, 0.0, "rounds completed")]
    for col, (x, x0, xlabel) in enumerate(xs):
        if with_acc:
            ax = axes[0, col]
            _line(
                ax,
                *_with_initial(x, acc, x0, initial.get("accuracy")),
                color="C0",
                label="test accuracy",
            )
            _frame_metric(ax, "test accuracy", xlabel, by_round=col == 1)
        ax = axes[nrows - 1, col]
        xy = _with_initial(x, test_loss, x0, initial.get("loss"))
        drew = _line(ax, *xy, color="C1", label="test loss")
        drew |= _line(ax, x, train_loss, color="C2", linestyle="--", label="train loss")
        if not drew:
            _no_data(ax, "no loss recorded")
            continue
        _log_if_wide(ax, test_loss, train_loss)
        _frame_metric(ax, "loss", xlabel, by_round=col == 1)
        ax.legend(loc="best", fontsize=9)
    if not with_acc and _n_rows(rounds):
        fig.text(0.01, 0.005, "no test accuracy in this run", fontsize=8, color="0.4")
    fig.suptitle(title or "test metrics", fontsize=13)
    return fig


def figure_tau_by_group(
    clients: pa.Table | None,
    groups: Sequence[str] = (),
    title: str = "",
    max_steps: int | None = None,
) -> Figure:
    """Distribution of local steps tau_i(t) per device group (box plot with
    the individual updates jittered on top). Dropped updates are left out:
    they contribute no steps. ``max_steps`` (the scenario's
    ``round.max_steps``), when given, is drawn as a dashed line labelled
    "max_steps cap": updates on it were capped, not slow."""
    fig = _new_figure(max(6.0, 1.6 + 1.5 * max(1, len(groups))), 4.6)
    ax = fig.subplots()
    tau = _floats(clients, "tau")
    dev, order, dropped = _by_group(clients, len(tau), groups)
    keep = np.isfinite(tau) & ~dropped if len(tau) else np.zeros(0, dtype=bool)
    data = [tau[keep & (dev == g)] for g in order]
    present = [(g, d) for g, d in zip(order, data, strict=True) if len(d)]
    if not present:
        _no_data(ax, "no completed updates")
    else:
        colors = _colors(order)
        labels = [f"{g}\n(n={len(d)})" for g, d in present]
        box = ax.boxplot(
            [d for _, d in present],
            tick_labels=labels,
            patch_artist=True,
            widths=0.55,
            showfliers=False,
            medianprops={"color": "black", "linewidth": 1.5},
        )
        rng = np.random.default_rng(0)  # jitter only; fixed so plots are stable
        for i, ((g, d), patch) in enumerate(zip(present, box["boxes"], strict=True)):
            patch.set_facecolor(colors[g])
            patch.set_alpha(0.45)
            jitter = rng.uniform(-0.18, 0.18, size=len(d))
            ax.scatter(i + 1 + jitter, d, s=9, color=colors[g], alpha=0.7, zorder=3)
        ax.set_ylabel("local steps tau_i(t)")
        ax.set_xlabel("device group")
        ax.grid(axis="y", alpha=0.3)
        if max_steps is not None:
            ax.axhline(
                max_steps,
                color="0.3",
                linestyle="--",
                linewidth=1.0,
                label="max_steps cap",
            )
            ax.legend(loc="best", fontsize=9)
        ax.set_ylim(bottom=min(0.0, ax.get_ylim()[0]))
    ax.set_title(title or "local steps per update, by device group")
    return fig


def figure_staleness(
    clients: pa.Table | None, groups: Sequence[str] = (), title: str = ""
) -> Figure:
    """Async runs: staleness of each update against its simulated arrival
    time, coloured by device group; dropped updates as red crosses."""
    fig = _new_figure(10, 4.6)
    ax = fig.subplots()
    stale = _floats(clients, "staleness")
    t1 = _floats(clients, "t_arrive")
    n = len(stale)
    dev, order, dropped = _by_group(clients, n, groups)
    ok = np.isfinite(stale) & np.isfinite(t1) if n and len(t1) == n else None
    if ok is None or not ok.any():
        _no_data(ax, "no staleness recorded")
    else:
        colors = _colors(order)
        for g in order:
            m = ok & ~dropped & (dev == g)
            if m.any():
                ax.scatter(t1[m], stale[m], s=12, alpha=0.6, color=colors[g], label=g)
        m = ok & dropped
        if m.any():
            ax.scatter(
                t1[m], stale[m], s=30, marker="x", color=_DROP_COLOR, label="dropped"
            )
        ax.set_xlabel("simulated arrival time (s)")
        ax.set_ylabel("staleness (server versions)")
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
    """The columns of clients.parquet the timeline draws, one entry per update.

    Attributes:
        rnd, cid: int64 round and client id.
        t0, t1: float ``t_start`` and ``t_arrive`` (simulated seconds).
        dev: device group of each update; ``order`` the groups to draw.
        dropped: bool; ``reasons`` (object) the drop reason, "" when none.
        stale: float staleness at arrival (async runs), else None.
    """

    rnd: np.ndarray
    cid: np.ndarray
    t0: np.ndarray
    t1: np.ndarray
    dev: np.ndarray
    order: list[str]
    dropped: np.ndarray
    reasons: np.ndarray
    stale: np.ndarray | None


def _timeline_updates(
    clients: pa.Table | None, groups: Sequence[str]
) -> _Updates | None:
    """The updates to draw; None when there are none (or columns are missing)."""
    rnd = np.array(_column(clients, "round"), dtype=np.int64)
    cid = np.array(_column(clients, "client_id"), dtype=np.int64)
    t0 = _floats(clients, "t_start")
    t1 = _floats(clients, "t_arrive")
    n = len(rnd)
    dev, order, dropped = _by_group(clients, n, groups)
    reason = [str(r or "") for r in _column(clients, "drop_reason")] or [""] * n
    stale = _floats(clients, "staleness") if is_async(clients) else None
    if n == 0 or not (len(cid) == len(t0) == len(t1) == n):
        return None
    reasons = np.array(reason, dtype=object)
    return _Updates(rnd, cid, t0, t1, dev, order, dropped, reasons, stale)


@dataclass(frozen=True)
class _BarStyle:
    """How big bars, edges and markers are for this many client rows.

    Attributes:
        colors: device group -> colour.
        edge_w: white bar edge width (0 with many rows: edges would hide bars).
        mark: marker area (points^2) of drop markers.
        stale_max: top of the staleness colour scale.
        bar_h: bar height in client rows.
    """

    colors: dict[str, Any]
    edge_w: float
    mark: float
    stale_max: float
    bar_h: float = 0.7

    @classmethod
    def of(cls, u: _Updates, height: float, n_rows: int) -> _BarStyle:
        stale = u.stale[np.isfinite(u.stale)] if u.stale is not None else np.zeros(0)
        # Points of figure height per client row: with many rows, white edges
        # would hide the bars and markers would cover each other.
        row_pt = 72.0 * (height - 1.5) / max(1, n_rows)
        return cls(
            colors=_colors(u.order),
            edge_w=0.8 if row_pt >= 6 else 0.0,
            mark=float(np.clip(row_pt**2, 4.0, 38.0)),
            stale_max=float(stale.max()) if len(stale) else 0.0,
        )


def _draw_bars(
    ax: Axes, u: _Updates, y: np.ndarray, m_block: np.ndarray, st: _BarStyle
) -> None:
    """One bar per update of ``m_block``: start to arrival, dropped hatched.

    Odd rounds are drawn in a lighter shade than even ones: a client that
    is busy until the end of a round and starts again at once has two bars
    that touch, and white edges vanish when rows are thin."""
    # One barh call per (group, dropped, round parity) keeps large fleets fast.
    odd = (u.rnd % 2).astype(bool)
    for g in u.order:
        for is_drop in (False, True):
            for is_odd in (False, True):
                m = m_block & (u.dev == g) & (u.dropped == is_drop) & (odd == is_odd)
                if not m.any():
                    continue
                alpha = (0.35 if is_drop else 0.85) * (0.6 if is_odd else 1.0)
                ax.barh(
                    y[m],
                    np.maximum(u.t1[m] - u.t0[m], 0.0),
                    left=u.t0[m],
                    height=st.bar_h,
                    color=st.colors[g],
                    alpha=alpha,
                    hatch="////" if is_drop else None,
                    # White edges keep one client's consecutive rounds apart.
                    edgecolor=_DROP_COLOR if is_drop else "white",
                    linewidth=0.6 * (st.edge_w > 0) if is_drop else st.edge_w,
                )


def _draw_arrivals(
    ax: Axes, u: _Updates, y: np.ndarray, m_block: np.ndarray, st: _BarStyle
) -> tuple[set[str], Any]:
    """Drop markers (shape: reason) and, async, arrival dots coloured by
    staleness. Returns the drop reasons drawn and the staleness scatter (or
    None)."""
    used: set[str] = set()
    for r in sorted(set(u.reasons[m_block & u.dropped].tolist())):
        m = m_block & u.dropped & (u.reasons == r)
        used.add(r)
        ax.scatter(
            u.t1[m],
            y[m],
            marker=_DROP_MARKERS.get(r, "x"),
            s=st.mark,
            color=_DROP_COLOR,
            zorder=4,
        )
    if u.stale is None:
        return used, None
    m = m_block & ~u.dropped & np.isfinite(u.stale)
    if not m.any():
        return used, None
    scatter = ax.scatter(
        u.t1[m],
        y[m],
        c=u.stale[m],
        cmap="viridis",
        vmin=0,
        vmax=max(st.stale_max, 1.0),
        s=0.6 * st.mark,
        edgecolors="black" if st.edge_w else "none",
        linewidths=0.4,
        zorder=5,
    )
    return used, scatter


def _frame_block(
    ax: Axes, u: _Updates, m_block: np.ndarray, block: list[int], rounds: Any
) -> None:
    """Round boundaries, x range and title of one panel of rounds ``block``."""
    lo, hi = float(u.t0[m_block].min()), float(u.t1[m_block].max())
    # Round boundaries: the end of every shown round and of the one before.
    shown_rounds = set(block)
    end_times = _floats(rounds, "sim_time")
    for r, t in zip(_column(rounds, "round"), end_times, strict=False):
        near = r in shown_rounds or r + 1 in shown_rounds
        if near and math.isfinite(t) and lo <= t:
            ax.axvline(t, color="0.55", linewidth=0.8, alpha=0.5, zorder=0)
    pad = max(hi - lo, 1e-9)
    ax.set_xlim(lo - 0.01 * pad, hi + 0.02 * pad)
    first, last = block[0], block[-1]
    label = f"round {first}" if first == last else f"rounds {first}-{last}"
    ax.set_title(label, fontsize=10)
    ax.set_xlabel("simulated time (s)")
    ax.grid(axis="x", alpha=0.2)


def _client_axis(ax: Axes, ids: list[int]) -> None:
    """The y axis: one row per client id (at most about 40 labelled)."""
    ax.set_ylabel("client id")
    step = max(1, math.ceil(len(ids) / 40))
    ax.set_yticks(range(0, len(ids), step))
    ax.set_yticklabels([str(ids[i]) for i in range(0, len(ids), step)])
    ax.set_ylim(len(ids) - 0.5, -0.5)


def _timeline_legend(
    fig: Figure, axes: list[Axes], u: _Updates, st: _BarStyle, used: set[str]
) -> None:
    """Device groups and the drop reasons drawn, below the panels."""
    handles: list[Any] = [
        Patch(facecolor=st.colors[g], alpha=0.85, label=g)
        for g in u.order
        if g in st.colors
    ]
    for r in sorted(used):
        handles.append(
            axes[0].scatter(
                [],
                [],
                marker=_DROP_MARKERS.get(r, "x"),
                color=_DROP_COLOR,
                label=f"dropped: {r or 'unknown'}",
            )
        )
    fig.legend(
        handles=handles,
        loc="outside lower center",
        ncol=min(len(handles), 5) or 1,
        fontsize=9,
        frameon=False,
    )


def figure_timeline(
    clients: pa.Table | None,
    rounds: pa.Table | None = None,
    groups: Sequence[str] = (),
    max_rounds: int = 20,
    title: str = "",
) -> Figure:
    """Client timeline: one bar per selected client per round, from
    ``t_start`` to ``t_arrive``, coloured by device group.

    The y axis lists the client ids that appear; faint vertical lines mark
    round ends (``sim_time`` of ``rounds``). Dropped updates are hatched and
    end in a red marker whose shape gives the drop reason. For async runs
    the arrival is a dot coloured by staleness. With more than
    ``max_rounds`` rounds, only the first and the last ``max_rounds / 2``
    are drawn, in two panels, so bars stay readable.
    """
    if max_rounds < 1:
        raise ValueError(f"max_rounds must be at least 1, got {max_rounds}")
    u = _timeline_updates(clients, groups)
    if u is None:
        fig = _new_figure(8, 3.5)
        _no_data(fig.subplots(), "no client updates recorded")
        fig.suptitle(title or "client timeline")
        return fig

    blocks = _round_blocks(sorted(set(u.rnd.tolist())), max_rounds)
    shown = np.isin(u.rnd, np.concatenate([np.array(b) for b in blocks]))
    ids = sorted(set(u.cid[shown].tolist()))
    row_of = {c: i for i, c in enumerate(ids)}
    height = float(np.clip(1.5 + 0.22 * len(ids), 3.5, 14.0))
    fig = _new_figure(12.0 if len(blocks) > 1 else 10.0, height)
    axes = np.atleast_1d(
        fig.subplots(1, len(blocks), sharey=True, squeeze=False)[0]
    ).tolist()
    st = _BarStyle.of(u, height, len(ids))
    y = np.array([row_of.get(int(c), -1) for c in u.cid], dtype=np.float64)
    finite = np.isfinite(u.t0) & np.isfinite(u.t1)
    used: set[str] = set()
    scatter = None
    for ax, block in zip(axes, blocks, strict=True):
        m_block = np.isin(u.rnd, block) & finite
        _draw_bars(ax, u, y, m_block, st)
        reasons, drawn = _draw_arrivals(ax, u, y, m_block, st)
        used |= reasons
        scatter = drawn if drawn is not None else scatter
        if m_block.any():
            _frame_block(ax, u, m_block, block, rounds)
    _client_axis(axes[0], ids)
    _timeline_legend(fig, axes, u, st, used)
    if scatter is not None:
        bar = fig.colorbar(scatter, ax=axes, label="staleness at arrival", shrink=0.8)
        bar.locator = _round_ticks()
        bar.update_ticks()
    total = len(set(u.rnd.tolist()))
    suffix = "" if len(blocks) == 1 else f" (first and last of {total} rounds)"
    fig.suptitle((title or "client timeline") + suffix, fontsize=12)
    return fig


def figure_chi2(rounds: pa.Table | None, title: str = "") -> Figure:
    """Objective inconsistency chi^2(p||w) of the aggregation weights per round
    (0: the server optimises the true objective)."""
    fig = _new_figure(9, 4.0)
    ax = fig.subplots()
    chi2 = _floats(rounds, "chi2_pw")
    if not _line(ax, _floats(rounds, "round"), chi2, color="C4"):
        _no_data(ax, "no objective-inconsistency values recorded")
    else:
        finite = chi2[np.isfinite(chi2)]
        if not finite.any():  # a flat line on the axis looks like no data
            ax.text(
                0.5,
                0.6,
                "chi^2(p || w) = 0 in every round",
                ha="center",
                va="center",
                transform=ax.transAxes,
                fontsize=11,
                color="0.3",
            )
            ax.set_ylim(-0.05, 1.0)
        ax.set_xlabel("round (0-based, as in rounds.parquet)")
        ax.xaxis.set_major_locator(_round_ticks())
        ax.set_ylabel("chi^2(p || w)")
        if finite.any():
            ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    ax.set_title(title or "objective inconsistency per round")
    return fig


def _shares(
    clients: pa.Table | None, rounds: pa.Table | None, partition: pa.Table | None
) -> tuple[np.ndarray, np.ndarray] | None:
    """(weight share, data share) per client, or None when a table lacks
    what they need."""
    ids = _floats(partition, "client_id")
    p = _floats(partition, "weight")
    if len(p) == 0 or len(ids) != len(p) or not np.isfinite(p).all() or p.sum() <= 0:
        return None
    # agg_weight: the weight as applied (runs before it had only "weight")
    has = clients is not None and "agg_weight" in clients.column_names
    cid, w = (
        _floats(clients, "client_id"),
        _floats(clients, "agg_weight" if has else "weight"),
    )
    if len(cid) == 0 or len(cid) != len(w):
        return None
    m = int(ids.max()) + 1
    data = np.zeros(m)
    data[ids.astype(np.int64)] = p / p.sum()
    used = int((_floats(rounds, "n_completed") > 0).sum())
    return weight_shares(m, cid.astype(np.int64), w, used), data


def figure_weight_share(
    clients: pa.Table | None,
    rounds: pa.Table | None = None,
    partition: pa.Table | None = None,
    title: str = "",
) -> Figure:
    """Each client's share of the aggregation weight over the run against
    its data share p_i (``partition.parquet``'s ``weight``), with the line
    y = x where an unbiased pairing of selector and weighting puts them;
    log axes when data shares span more than 100x (clients never
    aggregated are drawn at the bottom edge)."""
    fig = _new_figure(6.0, 5.5)
    ax = fig.subplots()
    got = _shares(clients, rounds, partition)
    if got is None:
        _no_data(ax, "no weight or data shares recorded")
        ax.set_title(title or "weight share vs data share")
        return fig
    share, data = got
    l1 = float(np.abs(share - data).sum())
    pos = data[data > 0]
    log = len(pos) > 1 and pos.max() / pos.min() > 100
    lo = min(pos.min(), share[share > 0].min() if (share > 0).any() else 1.0)
    y = np.where(share > 0, share, lo / 2) if log else share
    ax.scatter(data, y, s=14, alpha=0.7, color="C0", label="client")
    top = max(float(data.max()), float(share.max()))
    line = np.array([lo / 2 if log else 0.0, top * 1.05])
    ax.plot(line, line, color="0.3", linewidth=1, linestyle="--", label="y = x")
    if log:
        ax.set_xscale("log")
        ax.set_yscale("log")
    ax.set_xlabel("data share p_i")
    ax.set_ylabel("aggregation weight share")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", fontsize=9)
    ax.set_title(f"{title or 'weight share vs data share'} (L1 = {l1:.3g})")
    return fig


# The plot_* functions: each draws its figure_* and writes it as a PNG. The
# figure_* functions are public so that tests (and notebooks) can check the
# data behind a figure, not only that a file was written.


def _writes_png(
    figure: Callable[Concatenate[_T, _P], Figure],
) -> Callable[Concatenate[_T, Path, _P], Path]:
    """``plot(data, path, ...)``: draw ``figure(data, ...)`` and write it to
    ``path`` as a PNG; returns ``path``."""

    def plot(data: _T, path: Path, /, *args: _P.args, **kwargs: _P.kwargs) -> Path:
        return _save(figure(data, *args, **kwargs), path)

    name = figure.__name__.replace("figure_", "plot_", 1)
    plot.__name__ = plot.__qualname__ = name
    plot.__doc__ = (
        f"Write :func:`{figure.__name__}` to ``path`` (PNG); returns ``path``."
    )
    return plot


plot_metrics = _writes_png(figure_metrics)
plot_tau_by_group = _writes_png(figure_tau_by_group)
plot_timeline = _writes_png(figure_timeline)
plot_staleness = _writes_png(figure_staleness)
plot_chi2 = _writes_png(figure_chi2)
plot_weight_share = _writes_png(figure_weight_share)
