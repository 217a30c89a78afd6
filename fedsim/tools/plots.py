"""Figures of one run, drawn from its Parquet tables (docs/results.md, "Figures").

``figure_*`` returns a matplotlib Figure (Agg canvas, no pyplot state), which
fedsim.tools.report writes as a PNG. Missing columns, NaN and empty tables give a figure
that says so, not an error: an interrupted run still gets a report.

Every figure is a pure function of its inputs: no global pyplot state, a fixed
DPI, and the one random draw (box-plot jitter) from a fixed seed, so the same
run directory always gives the same PNG bytes. Colours follow the device
groups in the scenario's order, the same in every figure of a run; red is
kept for dropped updates and never given to a group.

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
from typing import TypedDict

import numpy as np
import pyarrow as pa
from matplotlib import colormaps
from matplotlib.artist import Artist
from matplotlib.axes import Axes
from matplotlib.collections import PathCollection
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from fedsim.algorithms.sampling import weight_shares
from fedsim.links import spearman
from fedsim.results import atomic_write_bytes
from fedsim.rows import Row, number, text, whole
from fedsim.tools.stats import PairedMetric

# One DPI for drawing and saving: text and marker sizes in points then map to
# the same pixels in every figure.
DPI = 110

# Marker per drop reason (fedsim.clock.Plan.reason); anything else gets "x".
_DROP_MARKERS = {"late": "x", "offline": "v", "no_time": "s", "no_data": "o"}
_DROP_COLOR = "#d62728"
# A colour as matplotlib's colormaps give it: red, green, blue, alpha in [0, 1].
RGBA = tuple[float, float, float, float]


class _TextStyle(TypedDict):
    """Keyword arguments of ``Axes.text`` for a centred message."""

    ha: str
    va: str
    fontsize: int


_TEXT = _TextStyle(ha="center", va="center", fontsize=11)


def _round_ticks() -> MaxNLocator:
    """Integer ticks for round axes (a round 2.5 does not exist)."""
    return MaxNLocator(nbins="auto", integer=True, steps=[1, 2, 2.5, 5, 10])


def _column(table: pa.Table | None, name: str) -> list[object]:
    """A column as a list (its cells as Python values, nulls as None); []
    when the table or the column is missing."""
    if table is None or name not in table.column_names:
        return []
    return table.column(name).to_pylist()


def _floats(table: pa.Table | None, name: str, n: int = 0) -> np.ndarray:
    """A float column, nulls as NaN (``n`` NaN when the column is missing)."""
    return np.array(_column(table, name) or [None] * n, dtype=float)


def _by_group(
    clients: pa.Table | None, n: int, groups: Sequence[str]
) -> tuple[np.ndarray, dict[str, RGBA], np.ndarray]:
    """Each update's device group, the group colours, and the dropped flags.

    Args:
        clients: clients.parquet, or None.
        n: The number of updates the caller draws (the length of its columns).
        groups: The scenario's device groups, in its order.

    Returns:
        ``(dev, colors, dropped)``: ``n`` group names ("unknown" where the
        column is missing or null), a colour per group in legend order, and
        ``n`` dropped flags (all False when the column is missing).
    """
    col = _column(clients, "device_group")
    dev = ["unknown" if g is None else str(g) for g in col]
    # a column of another length belongs to other rows: trust none of it
    dev_arr = np.array(dev if len(col) == n else ["unknown"] * n, dtype=object)
    colors = _group_colors(_legend_order(col, dev_arr, groups))
    flags = np.array(_column(clients, "dropped") or [False] * n, dtype=bool)
    return dev_arr, colors, flags


def _legend_order(
    col: list[object], dev: np.ndarray, groups: Sequence[str]
) -> list[str]:
    """The scenario's groups first, then the others seen, sorted, then "unknown".

    The scenario's order comes first so a group keeps its colour across runs
    of one fleet; without a device_group column every scenario group is kept,
    so the legend still names the fleet.
    """
    seen = {str(g) for g in col if g is not None}
    order = [g for g in groups if g in seen or not seen]
    order += sorted(seen - set(order))
    order += sorted(set(dev.tolist()) - set(order))
    return order


def _group_colors(order: list[str]) -> dict[str, RGBA]:
    """tab10 colours by position in ``order``, cycling past nine groups.

    tab10's red (index 3) is left out: red marks dropped updates.
    """
    palette = [colormaps["tab10"](i) for i in range(10) if i != 3]
    return {g: palette[i % len(palette)] for i, g in enumerate(order)}


def is_async(clients: pa.Table | None) -> bool:
    """Whether the run is asynchronous: its clients table has ``staleness``."""
    return clients is not None and "staleness" in clients.column_names


def has_chi2(rounds: pa.Table | None) -> bool:
    """Whether ``rounds`` has a ``chi2_pw`` column with a finite value."""
    return bool(np.isfinite(_floats(rounds, "chi2_pw")).any())


def plugin_columns(rounds: pa.Table | None) -> list[str]:
    """The plug-ins' own metric columns of ``rounds`` (``alg_<name>`` from
    the algorithm, ``sel_<name>`` from the selector, ``fed_<name>`` from
    federated evaluation's rule; docs/extending.md, "Hooks"), in table
    order."""
    names = [] if rounds is None else rounds.column_names
    return [c for c in names if c.startswith(("alg_", "sel_", "fed_"))]


# The most plug-in metric panels one figure draws: a plug-in may report
# thousands of scalars, and a figure of thousands of panels takes minutes and
# gigabytes to draw for nothing anyone can read (rounds.parquet holds them all).
MAX_PLUGIN_PANELS = 12


def plugin_metrics_left_out(rounds: pa.Table | None) -> str:
    """A sentence naming how many plug-in metric columns
    :func:`figure_plugin_metrics` leaves out (past :data:`MAX_PLUGIN_PANELS`)
    and where they are, or "" when it draws them all."""
    n = len(plugin_columns(rounds))
    if n <= MAX_PLUGIN_PANELS:
        return ""
    return (
        f"The figure shows the first {MAX_PLUGIN_PANELS} of {n} plug-in metrics; "
        f"the other {n - MAX_PLUGIN_PANELS} are in rounds.parquet."
    )


def figure_plugin_metrics(rounds: pa.Table | None, title: str = "") -> Figure:
    """One panel per plug-in metric column against the round, for
    the first :data:`MAX_PLUGIN_PANELS` columns in table order.

    Args:
        rounds: rounds.parquet, or None.
        title: The figure's title (a default when empty); it says how many
            columns were left out, if any.

    Returns:
        A figure with a panel per drawn column, stacked; a panel says so when
        its column has no finite value.
    """
    every = plugin_columns(rounds)
    cols = every[:MAX_PLUGIN_PANELS] or ["(none)"]
    if len(every) > MAX_PLUGIN_PANELS:
        left = f"(first {len(cols)} of {len(every)})"
        title = f"{title or 'plug-in metrics per round'} {left}"
    fig, axes = _subplot_grid(9, 2.4 * len(cols), len(cols), 1)
    x = _floats(rounds, "round")
    for ax, col in zip(axes[:, 0], cols, strict=True):
        if not _line(ax, x, _floats(rounds, col, len(x)), color="C2"):
            _no_data(ax, f"no finite value of {col}")
        ax.set(ylabel=col)
        ax.xaxis.set_major_locator(_round_ticks())
        ax.grid(alpha=0.3)
    axes[-1, 0].set(xlabel="round (0-based, as in rounds.parquet)")
    axes[0, 0].set_title(title or "plug-in metrics per round")
    return fig


def has_objective(rounds: pa.Table | None) -> bool:
    """Whether ``rounds`` has a ``train_objective`` column with a finite value
    (``eval.objective_every`` > 0)."""
    return bool(np.isfinite(_floats(rounds, "train_objective")).any())


def _new_figure(width: float, height: float) -> Figure:
    """A bare Figure (no pyplot: no global state, safe in worker threads)."""
    return Figure(figsize=(width, height), dpi=DPI, layout="constrained")


def _subplots(width: float, height: float) -> tuple[Figure, Axes]:
    """``plt.subplots()`` without pyplot: a new figure and its one panel."""
    fig = _new_figure(width, height)
    return fig, fig.subplots()


def _subplot_grid(
    width: float, height: float, nrows: int, ncols: int, sharey: bool = False
) -> tuple[Figure, np.ndarray]:
    """``plt.subplots(nrows, ncols, squeeze=False)`` without pyplot: a new
    figure and its panels as a 2-D array of Axes (``axes[row, col]``)."""
    fig = _new_figure(width, height)
    return fig, fig.subplots(nrows, ncols, sharey=sharey, squeeze=False)


def _save(fig: Figure, path: Path) -> Path:
    """Write ``fig`` as a PNG at ``path``, atomically; return the path.

    Rendered to memory first, so a reader (or a crash) never sees a
    half-written image.
    """
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    atomic_write_bytes(Path(path), buf.getvalue())
    return Path(path)


def _no_data(ax: Axes, message: str) -> None:
    """Say ``message`` in the middle of an empty, tickless ``ax``."""
    ax.text(0.5, 0.5, message, transform=ax.transAxes, color="0.4", wrap=True, **_TEXT)
    ax.set(xticks=[], yticks=[])


def _line(
    ax: Axes,
    x: np.ndarray,
    y: np.ndarray,
    color: str,
    label: str = "_nolegend_",
    linestyle: str = "-",
) -> bool:
    """Plot the finite points of y against x; False when there are none.

    x and y of different lengths draw nothing, rather than misaligning.
    """
    ok = np.isfinite(x) & np.isfinite(y) if len(x) == len(y) else np.zeros(0, bool)
    if not ok.any():
        return False
    # markers show each round on short runs; on long ones they blur the line
    marker = "o" if ok.sum() <= 30 else None
    ax.plot(
        x[ok],
        y[ok],
        marker=marker,
        markersize=3.5,
        linewidth=1.6,
        color=color,
        label=label,
        linestyle=linestyle,
    )
    return True


def _frame_metric(ax: Axes, ylabel: str, xlabel: str, by_round: bool) -> None:
    """Labels, a "y vs x" title (x without its unit) and a grid."""
    ax.set(ylabel=ylabel, xlabel=xlabel, title=f"{ylabel} vs {xlabel.split(' (')[0]}")
    if by_round:
        ax.xaxis.set_major_locator(_round_ticks())
    ax.grid(alpha=0.3)


def _with_initial(
    x: np.ndarray, y: np.ndarray, x0: float, y0: object
) -> tuple[np.ndarray, np.ndarray]:
    """``(x, y)`` with the initial model's point in front, when finite.

    ``y0`` (a summary.json value) is None for an older run without
    summary.json's ``initial``.
    """
    if y0 is None or not math.isfinite(number(y0)) or len(x) != len(y):
        return x, y
    return np.concatenate([[x0], x]), np.concatenate([[number(y0)], y])


def _initial(initial: object) -> tuple[Mapping[str, object], float]:
    """summary.json's ``initial`` and its time ``t`` (0 when unset): anything
    but a mapping (an old run: null) is an empty one."""
    values: Mapping[str, object] = initial if isinstance(initial, Mapping) else {}
    return values, number(values.get("t") or 0.0, "initial.t")


def _draw_losses(
    ax: Axes,
    x: np.ndarray,
    loss_xy: tuple[tuple[np.ndarray, np.ndarray], np.ndarray],
    losses: np.ndarray,
    xlabel: str,
    by_round: bool,
) -> None:
    """One loss panel: test loss (with the initial point), train loss dashed.

    Args:
        ax: The panel.
        x: The x values of the train loss (it has no initial point).
        loss_xy: ``((x, test loss), train loss)``.
        losses: Every finite loss of the run, test and train, which decides
            the scale for both panels alike.
        xlabel: The x axis label.
        by_round: Whether x counts rounds (integer ticks).
    """
    (xt, test_loss), train_loss = loss_xy
    drew = _line(ax, xt, test_loss, color="C1", label="test loss")
    drew |= _line(ax, x, train_loss, color="C2", linestyle="--", label="train loss")
    if not drew:
        _no_data(ax, "no loss recorded")
        return
    # losses spanning over two decades flatten on a linear axis
    if len(losses) and losses.min() > 0 and losses.max() / losses.min() > 100:
        ax.set_yscale("log")
    _frame_metric(ax, "loss", xlabel, by_round=by_round)
    ax.legend(loc="best", fontsize=9)


def figure_metrics(
    rounds: pa.Table | None, title: str = "", initial: object = None
) -> Figure:
    """Test accuracy and loss against simulated time and against rounds completed.

    Round ``t`` of rounds.parquet is drawn at ``t + 1`` rounds completed, so
    the initial model sits at 0. The train loss is dashed, on the loss
    panels; federated evaluation's ``fed_accuracy`` and ``fed_loss`` (the
    clients' own held-out rows), when the run has them, are dotted beside
    the central test metrics. A run without test accuracy gets the loss
    row only.

    Args:
        rounds: rounds.parquet, or None.
        title: The figure's title ("test metrics" when empty).
        initial: summary.json's ``initial`` (the model before round 0: ``t``,
            ``accuracy``, ``loss``); anything but a mapping is ignored.

    Returns:
        A figure with two columns (time, rounds) and one or two rows.
    """
    # summary.json's value: anything but a mapping (an old run: null) is none
    start, t0 = _initial(initial)
    acc = _floats(rounds, "test_accuracy")
    test_loss = _floats(rounds, "test_loss")
    train_loss = _floats(rounds, "train_loss")
    losses = np.concatenate([test_loss, train_loss])
    losses = losses[np.isfinite(losses)]
    with_acc = bool(np.isfinite(acc).any())
    nrows = 2 if with_acc else 1
    fig, axes = _subplot_grid(11, 4.2 * nrows, nrows, 2)
    xs = [
        (_floats(rounds, "sim_time"), t0, "simulated time (s)"),
        (_floats(rounds, "round") + 1.0, 0.0, "rounds completed"),
    ]
    for col, (x, x0, xlabel) in enumerate(xs):
        if with_acc:
            xy = _with_initial(x, acc, x0, start.get("accuracy"))
            _line(axes[0, col], *xy, color="C0", label="test accuracy")
            _frame_metric(axes[0, col], "test accuracy", xlabel, by_round=col == 1)
        loss_xy = (_with_initial(x, test_loss, x0, start.get("loss")), train_loss)
        _draw_losses(axes[nrows - 1, col], x, loss_xy, losses, xlabel, col == 1)
        _draw_federated(axes[:, col], x, rounds, with_acc)
    _title_metrics(fig, rounds, with_acc, title)
    return fig


def _draw_federated(
    panels: np.ndarray, x: np.ndarray, rounds: pa.Table | None, with_acc: bool
) -> None:
    """Federated evaluation's accuracy and loss (``fed_accuracy``,
    ``fed_loss``), dotted on the accuracy and loss panels of one column;
    nothing for a run without them.

    Args:
        panels: the column's panels (accuracy first when ``with_acc``).
        x: the rounds' x values.
        rounds: rounds.parquet.
        with_acc: whether the column has an accuracy panel.
    """
    pairs = [("fed_loss", "federated loss", panels[-1])]
    if with_acc:
        pairs.append(("fed_accuracy", "federated accuracy", panels[0]))
    for column, label, ax in pairs:
        y = _floats(rounds, column, len(x))
        if _line(ax, x, y, color="C3", linestyle=":", label=label):
            ax.legend(loc="best", fontsize=9)


def _title_metrics(
    fig: Figure, rounds: pa.Table | None, with_acc: bool, title: str
) -> None:
    """The metrics figure's title, and a note when a run has no accuracy.

    The note tells a reader the missing row is the run's, not the figure's;
    an empty table says so on its panels already.
    """
    if not with_acc and rounds is not None and rounds.num_rows:
        fig.text(0.01, 0.005, "no test accuracy in this run", fontsize=8, color="0.4")
    fig.suptitle(title or "test metrics", fontsize=13)


def figure_tau_by_group(
    clients: pa.Table | None,
    groups: Sequence[str] = (),
    title: str = "",
    max_steps: int | None = None,
) -> Figure:
    """Completed updates' local steps per device group, as boxes and points.

    Dropped updates are left out: their tau never reached the model. Groups
    without a completed update get no box.

    Args:
        clients: clients.parquet, or None.
        groups: The scenario's device groups (legend order and colours).
        title: The figure's title (a default when empty).
        max_steps: The step cap, drawn dashed; None when tau was not capped
            (fedsim.tools.report._step_cap decides).

    Returns:
        A figure with one axes, one box per group with updates.
    """
    # about 1.5 in per box, so a large fleet's labels do not overlap
    fig, ax = _subplots(max(6.0, 1.6 + 1.5 * max(1, len(groups))), 4.6)
    tau = _floats(clients, "tau")
    dev, colors, dropped = _by_group(clients, len(tau), groups)
    keep = np.isfinite(tau) & ~dropped if len(tau) else np.zeros(0, dtype=bool)
    present = [(g, d) for g in colors if len(d := tau[keep & (dev == g)])]
    if not present:
        _no_data(ax, "no completed updates")
    else:
        _draw_boxes(ax, present, colors, max_steps)
    ax.set_title(title or "local steps per update, by device group")
    return fig


def _draw_boxes(
    ax: Axes,
    present: list[tuple[str, np.ndarray]],
    colors: dict[str, RGBA],
    max_steps: int | None,
) -> None:
    """One box per ``(group, taus)`` with every tau jittered over it.

    Args:
        ax: The axes.
        present: The groups with completed updates and their taus.
        colors: The group colours.
        max_steps: The step cap to draw dashed, or None.
    """
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
    # from 0: a box floating high up would hide how small tau is
    ax.set_ylim(bottom=min(0.0, ax.get_ylim()[0]))


def figure_staleness(
    clients: pa.Table | None, groups: Sequence[str] = (), title: str = ""
) -> Figure:
    """Async runs: each update's staleness against its arrival time.

    Args:
        clients: clients.parquet, or None.
        groups: The scenario's device groups (legend order and colours).
        title: The figure's title (a default when empty).

    Returns:
        A scatter coloured by device group, dropped updates as red crosses.
    """
    fig, ax = _subplots(10, 4.6)
    stale, t1 = _floats(clients, "staleness"), _floats(clients, "t_arrive")
    n = len(stale)
    dev, colors, dropped = _by_group(clients, n, groups)
    ok = np.isfinite(stale) & np.isfinite(t1) if n and len(t1) == n else None
    if ok is None or not ok.any():
        _no_data(ax, "no staleness recorded")
    else:
        _draw_staleness_points(ax, (t1, stale), ok, (dev, colors, dropped))
    ax.set_title(title or "staleness of updates over simulated time")
    return fig


def _draw_staleness_points(
    ax: Axes,
    xy: tuple[np.ndarray, np.ndarray],
    ok: np.ndarray,
    by_group: tuple[np.ndarray, dict[str, RGBA], np.ndarray],
) -> None:
    """The staleness scatter: arrival time against staleness of each update
    with both (``ok``), a colour per device group, dropped ones as red
    crosses; then the panel's labels, integer ticks and legend.

    Args:
        ax: the panel.
        xy: (arrival times, staleness), one per update.
        ok: which updates have both values.
        by_group: :func:`_by_group`'s (groups, colours, dropped flags).
    """
    t1, stale = xy
    dev, colors, dropped = by_group
    for g, color in colors.items():
        m = ok & ~dropped & (dev == g)
        if m.any():
            ax.scatter(t1[m], stale[m], s=12, alpha=0.6, color=color, label=g)
    m = ok & dropped
    if m.any():
        ax.scatter(
            t1[m], stale[m], s=30, marker="x", color=_DROP_COLOR, label="dropped"
        )
    ax.set(xlabel="simulated arrival time (s)", ylabel="staleness (server versions)")
    ax.yaxis.set_major_locator(_round_ticks())
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", fontsize=9, markerscale=1.5)


def _round_blocks(rounds_present: list[int], max_rounds: int) -> list[list[int]]:
    """The rounds to draw: all of them, or the first and last ``max_rounds/2``.

    The first rounds show the start-up (everyone fresh), the last ones the
    steady state; the middle of a long run repeats them.

    Returns:
        One block, or two (each at least one round long).
    """
    if len(rounds_present) <= max_rounds:
        return [rounds_present]
    head = max(1, max_rounds // 2)
    tail = max(1, max_rounds - head)
    return [rounds_present[:head], rounds_present[-tail:]]


@dataclass(frozen=True)
class _Updates:
    """clients.parquet's columns the timeline draws, as aligned arrays.

    Row ``i`` of every array is the same update. ``stale`` is NaN unless the
    run is async; ``reasons`` is "" for updates that were not dropped.
    """

    rnd: np.ndarray
    cid: np.ndarray
    t0: np.ndarray
    t1: np.ndarray
    dev: np.ndarray
    colors: dict[str, RGBA]  # by device group, in legend order
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
    ax: Axes,
    u: _Updates,
    y: np.ndarray,
    block: list[int],
    rounds: pa.Table | None,
    row_pt: float,
) -> tuple[set[str], PathCollection | None]:
    """Draw one timeline panel: the updates of the rounds in ``block``.

    Args:
        ax: The panel.
        u: Every update of the run.
        y: Each update's row (its client's position among those shown).
        block: The rounds this panel shows.
        rounds: rounds.parquet (round end times), or None.
        row_pt: The height of one row, in points; bar edges and markers scale
            with it so that a thousand clients stay legible.

    Returns:
        ``(reasons, scatter)``: the drop reasons drawn (for the legend) and the
        staleness scatter (for the colour bar; None unless async).
    """
    m_block = np.isin(u.rnd, block) & np.isfinite(u.t0) & np.isfinite(u.t1)
    # With many rows (few points each), white edges would hide the bars.
    edge_w = 0.8 if row_pt >= 6 else 0.0
    mark = float(np.clip(row_pt**2, 4.0, 38.0))  # drop-marker area
    _draw_bars(ax, u, y, m_block, edge_w)
    used = _draw_drop_markers(ax, u, y, m_block, mark)
    scatter = _draw_staleness(ax, u, y, m_block, mark, edge_w)
    if m_block.any():
        _frame_panel(ax, u, m_block, block, rounds)
    return used, scatter


def _draw_bars(
    ax: Axes, u: _Updates, y: np.ndarray, m_block: np.ndarray, edge_w: float
) -> None:
    """A bar per update in ``m_block``, download to arrival.

    Colour by device group; dropped ones hatched and faint; odd rounds
    lighter, so one client's back-to-back rounds read as two bars.
    """
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


def _draw_drop_markers(
    ax: Axes, u: _Updates, y: np.ndarray, m_block: np.ndarray, mark: float
) -> set[str]:
    """A red marker at the end of each dropped update, shaped by its reason.

    Returns:
        The reasons drawn; reasons are drawn sorted, so the PNG does not
        depend on set order.
    """
    used = set(u.reasons[m_block & u.dropped].tolist())
    for r in sorted(used):
        m = m_block & u.dropped & (u.reasons == r)
        marker = _DROP_MARKERS.get(r, "x")
        ax.scatter(u.t1[m], y[m], marker=marker, s=mark, color=_DROP_COLOR, zorder=4)
    return used


def _draw_staleness(
    ax: Axes,
    u: _Updates,
    y: np.ndarray,
    m_block: np.ndarray,
    mark: float,
    edge_w: float,
) -> PathCollection | None:
    """A dot at each completed async update's arrival, coloured by staleness.

    The colour scale spans the whole run (not this panel), so the two panels
    of a long run share one colour bar.

    Returns:
        The scatter, or None when no update here has a staleness.
    """
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
    return scatter


def _draw_round_ends(
    ax: Axes, rounds: pa.Table | None, block: list[int], lo: float
) -> None:
    """Round boundaries on a panel: the end of every round in ``block`` and
    of the one before it, from ``lo`` (the panel's first start) on."""
    end_times = _floats(rounds, "sim_time")
    rnds = (whole(r, "round") for r in _column(rounds, "round"))
    for r, t in zip(rnds, end_times, strict=False):
        if (r in block or r + 1 in block) and math.isfinite(t) and lo <= t:
            ax.axvline(t, color="0.55", linewidth=0.8, alpha=0.5, zorder=0)


def _frame_panel(
    ax: Axes,
    u: _Updates,
    m_block: np.ndarray,
    block: list[int],
    rounds: pa.Table | None,
) -> None:
    """Round boundaries, x range, title and grid of a non-empty panel.

    The x range is the panel's own updates (plus a small margin), not the
    run's: a block of late rounds would otherwise be squeezed to the right.
    """
    lo, hi = float(u.t0[m_block].min()), float(u.t1[m_block].max())
    _draw_round_ends(ax, rounds, block, lo)
    pad = max(hi - lo, 1e-9)
    ax.set(xlabel="simulated time (s)", xlim=(lo - 0.01 * pad, hi + 0.02 * pad))
    label = f"rounds {block[0]}-{block[-1]}" if len(block) > 1 else f"round {block[0]}"
    ax.set_title(label, fontsize=10)
    ax.grid(axis="x", alpha=0.2)


def figure_timeline(
    clients: pa.Table | None,
    rounds: pa.Table | None = None,
    groups: Sequence[str] = (),
    max_rounds: int = 20,
    title: str = "",
) -> Figure:
    """A bar per client row of clients.parquet, ``t_start`` to ``t_arrive``.

    Bars are coloured by device group; dropped ones are hatched and end in a
    red marker shaped by the reason; async arrivals get a dot coloured by
    staleness. Each client has one row, so its rounds line up.

    Args:
        clients: clients.parquet, or None.
        rounds: rounds.parquet (the round boundaries), or None.
        groups: The scenario's device groups (legend order and colours).
        max_rounds: The most rounds drawn; past it, the first and last halves
            in two panels.
        title: The figure's title (a default when empty).

    Returns:
        The figure; it says so when there are no updates.

    Raises:
        ValueError: ``max_rounds`` is below 1.
    """
    if max_rounds < 1:
        raise ValueError(f"max_rounds must be at least 1, got {max_rounds}")
    u = _Updates.of(clients, groups)
    if u is None:
        return _no_updates(title)
    all_rounds = sorted(set(u.rnd.tolist()))
    blocks = _round_blocks(all_rounds, max_rounds)
    ids = _shown_clients(u, blocks)
    # grows with the clients shown, up to a height that still fits a screen
    height = float(np.clip(1.5 + 0.22 * len(ids), 3.5, 14.0))
    width = 12.0 if len(blocks) > 1 else 10.0
    fig, (axes,) = _subplot_grid(width, height, 1, len(blocks), sharey=True)
    row_pt = 72.0 * (height - 1.5) / max(1, len(ids))  # points of height per row
    y = np.searchsorted(ids, u.cid).astype(np.float64)  # rows not shown: not drawn
    used, scatter = _draw_panels(axes, blocks, u, y, rounds, row_pt)
    rows = range(0, len(ids), max(1, math.ceil(len(ids) / 40)))  # <= ~40 labels
    axes[0].set(ylabel="client id", yticks=rows, yticklabels=ids[rows])
    # inverted: the lowest client id on top, as in a table
    axes[0].set_ylim(len(ids) - 0.5, -0.5)
    _timeline_legend(fig, axes, u, used, scatter)
    more = f" (first and last of {len(all_rounds)} rounds)" if len(blocks) > 1 else ""
    fig.suptitle((title or "client timeline") + more, fontsize=12)
    return fig


def _shown_clients(u: _Updates, blocks: list[list[int]]) -> np.ndarray:
    """The ids of the clients with an update in the rounds shown, sorted:
    the timeline's rows."""
    shown = np.isin(u.rnd, np.concatenate([np.array(b) for b in blocks]))
    return np.unique(u.cid[shown])


def _draw_panels(
    axes: np.ndarray,
    blocks: list[list[int]],
    u: _Updates,
    y: np.ndarray,
    rounds: pa.Table | None,
    row_pt: float,
) -> tuple[set[str], PathCollection | None]:
    """Each block of rounds on its panel (:func:`_draw_panel`); returns the
    drop reasons drawn on any panel and the last staleness scatter (the
    colour bar's: every panel shares one colour scale)."""
    used: set[str] = set()
    scatter = None
    for ax, block in zip(axes, blocks, strict=True):
        reasons, drawn = _draw_panel(ax, u, y, block, rounds, row_pt)
        used |= reasons
        scatter = drawn if drawn is not None else scatter
    return used, scatter


def _no_updates(title: str) -> Figure:
    """The timeline of a run without client updates: a figure saying so."""
    fig, ax = _subplots(8, 3.5)
    _no_data(ax, "no client updates recorded")
    fig.suptitle(title or "client timeline")
    return fig


def _timeline_legend(
    fig: Figure,
    axes: np.ndarray,
    u: _Updates,
    used: set[str],
    scatter: PathCollection | None,
) -> None:
    """The legend below the panels (groups, drop reasons drawn) and the
    staleness colour bar when there is one."""
    handles: list[Artist] = [
        Patch(facecolor=color, alpha=0.85, label=g) for g, color in u.colors.items()
    ]
    for r in sorted(used):
        # empty scatters: legend handles with the very markers the panels drew
        marker, label = _DROP_MARKERS.get(r, "x"), f"dropped: {r or 'unknown'}"
        handles.append(
            axes[0].scatter([], [], marker=marker, color=_DROP_COLOR, label=label)
        )
    ncol = min(len(handles), 5)
    fig.legend(
        handles=handles,
        loc="outside lower center",
        fontsize=9,
        frameon=False,
        ncol=ncol,
    )
    if scatter is not None:
        label = "staleness at arrival"
        fig.colorbar(scatter, ax=axes, label=label, shrink=0.8, ticks=_round_ticks())


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


def figure_objective(
    rounds: pa.Table | None, title: str = "", initial: object = None
) -> Figure:
    """The global training objective F(x) = sum_i p_i F_i(x) (rounds.parquet's
    ``train_objective``) against simulated time and rounds completed.

    Drawn like :func:`figure_metrics`' loss panels: round ``t`` at ``t + 1``
    rounds completed, the initial model (summary.json's ``initial``
    ``objective``) at 0, a log scale when the values span over two decades.

    Args:
        rounds: rounds.parquet, or None.
        title: The figure's title (a default when empty).
        initial: summary.json's ``initial``; anything but a mapping is ignored.

    Returns:
        A figure with two panels (time, rounds), or panels saying there is no
        value to draw.
    """
    start, t0 = _initial(initial)
    f = _floats(rounds, "train_objective")
    fig, axes = _subplot_grid(11, 4.2, 1, 2)
    xs = [
        (_floats(rounds, "sim_time"), t0, "simulated time (s)"),
        (_floats(rounds, "round") + 1.0, 0.0, "rounds completed"),
    ]
    for col, (x, x0, xlabel) in enumerate(xs):
        ax = axes[0, col]
        x, y = _with_initial(x, f, x0, start.get("objective"))
        if not _line(ax, x, y, color="C4", label="F(x), training data"):
            _no_data(ax, "no training objective recorded (eval.objective_every)")
            continue
        values = y[np.isfinite(y)]
        if values.min() > 0 and values.max() / values.min() > 100:
            ax.set_yscale("log")
        _frame_metric(ax, "training objective F(x)", xlabel, by_round=col == 1)
    fig.suptitle(title or "global training objective", fontsize=13)
    return fig


def figure_weight_share(
    clients: pa.Table | None,
    rounds: pa.Table | None = None,
    partition: pa.Table | None = None,
    title: str = "",
) -> Figure:
    """Each client's aggregation weight share against its data share p_i.

    Shares are fedsim.algorithms.sampling.weight_shares over the rounds that
    aggregated something, the same figure summary.json's participation_bias
    reports. Points on the dashed y = x line mean no participation bias.

    Args:
        clients: clients.parquet, or None.
        rounds: rounds.parquet (which rounds aggregated), or None.
        partition: partition.parquet (each client's data weight), or None.
        title: The title's start (a default when empty); the L1 distance
            between the two shares is appended.

    Returns:
        The scatter (log-log when data shares span two decades), or a figure
        saying there is nothing to draw.
    """
    fig, ax = _subplots(6.0, 5.5)
    data = _data_shares(partition)
    # agg_weight: the weight as applied (runs before it had only "weight")
    w = np.array(_column(clients, "agg_weight") or _column(clients, "weight"), float)
    cid = _floats(clients, "client_id")
    if data is None or len(cid) == 0 or len(cid) != len(w):
        _no_data(ax, "no weight or data shares recorded")
        ax.set_title(title or "weight share vs data share")
        return fig
    used = int((_floats(rounds, "n_completed") > 0).sum())
    share = weight_shares(len(data), cid.astype(np.int64), w, used)
    l1 = float(np.abs(share - data).sum())
    _draw_shares(ax, data, share)
    ax.set_title(f"{title or 'weight share vs data share'} (L1 = {l1:.3g})")
    return fig


def _data_shares(partition: pa.Table | None) -> np.ndarray | None:
    """Each client's data share p_i, indexed by client id (summing to 1).

    Returns:
        The shares; None when partition.parquet's weights are missing, of
        another length than its ids, not finite, or sum to nothing.
    """
    ids, p = _floats(partition, "client_id"), _floats(partition, "weight")
    bad = len(p) == 0 or len(ids) != len(p) or not np.isfinite(p).all() or p.sum() <= 0
    if bad:
        return None
    data = np.zeros(int(ids.max()) + 1)
    data[ids.astype(np.int64)] = p / p.sum()
    return data


def _draw_shares(ax: Axes, data: np.ndarray, share: np.ndarray) -> None:
    """Weight share against data share per client, with the y = x line."""
    pos = data[data > 0]
    # log axes when shares span two decades: else small clients pile up at 0
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


def figure_links(
    samples: np.ndarray,
    speed: np.ndarray,
    group: np.ndarray,
    names: Sequence[str],
    title: str = "",
) -> Figure:
    """Each device's training samples against its speed (log-log).

    Args:
        samples: Training samples per device.
        speed: Local steps per second per device.
        group: Each device's group index into ``names``.
        names: The device groups' names (colours and legend).
        title: The title's start (a default when empty); the realised
            Spearman correlation over all devices is appended.

    Returns:
        A scatter coloured by device group; devices with no samples or no
        speed are left out (a log axis cannot show 0).
    """
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
            # an empty scatter gives a legend marker larger than the points
            ax.scatter([], [], s=20, color=cmap(gi), label=str(name))
    ax.set(xscale="log", yscale="log", xlabel="speed (local steps/s)")
    ax.set(ylabel="training samples")
    ax.grid(alpha=0.3, which="both")
    # past 20 groups a legend covers the plot; colours alone then suffice
    if len(names) <= 20:
        ax.legend(title="device group", fontsize=8, loc="best")
    rho = spearman(samples[ok], speed[ok])
    ax.set_title(f"{title or 'samples vs speed'} (Spearman {rho:+.2f})")
    return fig


def _paired_bar(
    ax: Axes,
    r: Row,
    scale: float,
    arms: list[str],
    groups: list[object],
    x_key: str | None,
) -> None:
    """One arm's interval on ``ax``: horizontal at the arm's row (compare),
    or vertical beside the other arms' at its group (stress). An interval
    without two finite ends (one seed; the confidence sequence of seeds
    until decided at a few seeds, from -inf to inf) is its mean alone."""
    a = arms.index(text(r["algorithm"], "algorithm"))
    width = 0.8 / max(1, len(arms))
    # grey: one seed, no bar
    color = _VERDICT_COLORS.get(text(r["verdict"], "verdict"), "0.45")
    mean, lo, hi = (number(r[k], k) * scale for k in ("mean", "lo", "hi"))
    ends = math.isfinite(lo) and math.isfinite(hi)
    err = [[mean - lo], [hi - mean]] if ends else None
    marker = _ARM_MARKERS[a % len(_ARM_MARKERS)] if x_key else "o"
    if x_key is None:
        bar = ax.errorbar(mean, a, xerr=err, fmt=marker, color=color, capsize=4)
    else:
        pos = groups.index(r[x_key]) + (a - (len(arms) - 1) / 2) * width
        bar = ax.errorbar(pos, mean, yerr=err, fmt=marker, color=color, capsize=4)
    if r["verdict"] == "no difference" and err is not None:
        bar[-1][0].set_linestyle("--")


# Paired comparisons: a verdict's colour (fedsim.tools.stats.Verdict).
_ARM_MARKERS = ("o", "s", "^", "D", "v", "P", "X")
_VERDICT_COLORS = {
    "better": "#2ca02c",
    "worse": _DROP_COLOR,
    "no difference": "#1f77b4",
}


def plot_paired(
    rows: Sequence[Row],
    metrics: Sequence[PairedMetric],
    path: Path,
    x_key: str | None = None,
    x_labels: Mapping[int, str] | None = None,
) -> Path:
    """paired.png: each arm's difference from the baseline with its 95%
    interval, a panel per metric (fedsim.tools.compare.paired_table's rows).

    Without ``x_key`` (compare) each arm is a row, its interval a horizontal
    bar; with it (stress: ``cell``) the x axis holds the groups (labelled by
    ``x_labels``) and each arm a vertical bar per group, side by side. A
    bar is green when the arm is better, red when worse, and when the
    interval holds 0 (blue, dashed); an arm with one seed has a grey point,
    no bar.

    Args:
        rows: the paired rows (``metric``, ``algorithm``, ``mean``, ``lo``,
            ``hi``, ``verdict``, ``baseline``).
        metrics: the metrics, in panel order.
        path: where the PNG goes.
        x_key: the row key of the groups, or None.
        x_labels: each group's tick label, by its value (stress: the cell
            index); a group without one is labelled ``str(value)``.
    """
    shown = [m for m in metrics if any(r["metric"] == m.key for r in rows)]
    arms = list(dict.fromkeys(text(r["algorithm"], "algorithm") for r in rows))
    groups: list[object] = [None]
    if x_key:
        groups = list(dict.fromkeys(r[x_key] for r in rows))
    panel = 4.6 if not x_key else 1.2 + 0.45 * len(groups) * max(1, len(arms))
    fig = _new_figure(min(max(panel, 4.6), 9.0) * max(1, len(shown)), 3.8)
    axes = np.atleast_1d(fig.subplots(1, max(1, len(shown)), squeeze=False)).ravel()
    if not shown:
        _no_data(axes[0], "no pair of seeds to compare")
        return _save(fig, path)
    for ax, m in zip(axes, shown, strict=True):
        mine = [r for r in rows if r["metric"] == m.key]
        _paired_panel(ax, mine, m, (arms, groups), x_key, x_labels)
    if x_key is not None:  # the arms' markers, which tell the bars apart
        _arm_legend(axes[0], arms)
    base = rows[0]["baseline"]
    fig.suptitle(f"each arm minus {base}, per seed: mean and 95% t interval")
    return _save(fig, path)


def _paired_panel(
    ax: Axes,
    rows: Sequence[Row],
    m: PairedMetric,
    arms_groups: tuple[list[str], list[object]],
    x_key: str | None,
    x_labels: Mapping[int, str] | None,
) -> None:
    """One metric's panel of paired.png (:func:`plot_paired`): a bar per
    row, laid out as compare's (an arm a row) or stress's (groups across).

    Args:
        ax: the panel.
        rows: the metric's paired rows.
        m: the metric.
        arms_groups: every arm, and every group (``[None]`` for compare).
        x_key: the row key of the groups, or None.
        x_labels: each group's tick label, by its value (or None).
    """
    arms, groups = arms_groups
    for r in rows:
        _paired_bar(ax, r, m.scale, arms, groups, x_key)
    unit = f" ({m.unit})" if m.unit else ""
    label = f"difference in {m.label}{unit}"
    if x_key is None:
        _arms_down(ax, label, arms)
    else:
        _groups_across(ax, label, groups, x_labels or {})
    better = "higher" if m.higher_is_better else "lower"
    ax.set_title(f"{m.label}: {better} is better", fontsize=9)


def _arm_legend(ax: Axes, arms: Sequence[str]) -> None:
    """stress's paired legend: each arm's marker, left to right in a group."""
    handles = [
        Line2D([], [], color="0.4", marker=_ARM_MARKERS[i % len(_ARM_MARKERS)],
               linestyle="", label=a)
        for i, a in enumerate(arms)
    ]  # fmt: skip
    ax.legend(handles=handles, fontsize=7, title="left to right")


def _arms_down(ax: Axes, label: str, arms: Sequence[str]) -> None:
    """compare's paired panel: an arm per row, differences along x from 0."""
    ax.axvline(0, color="0.3", linewidth=1)
    ax.set_yticks(range(len(arms)), arms)
    ax.set(xlabel=label, ylim=(-0.6, len(arms) - 0.4))
    ax.grid(axis="x", alpha=0.3)


def _groups_across(
    ax: Axes, label: str, groups: Sequence[object], x_labels: Mapping[int, str]
) -> None:
    """stress's paired panel: the groups (cells) along x, each labelled by
    ``x_labels`` (``str(value)`` without one), differences up from 0."""
    ax.axhline(0, color="0.3", linewidth=1)
    tick: dict[object, str] = {k: v for k, v in x_labels.items()}
    ax.set_xticks(range(len(groups)), [tick.get(g, str(g)) for g in groups], fontsize=8)
    ax.set(ylabel=label)
    ax.grid(axis="y", alpha=0.3)
