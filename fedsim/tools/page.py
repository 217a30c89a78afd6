"""report.html: a run's interactive page (Plotly), beside report.md.

:func:`write_page` is the entry point (``fedsim run`` calls it through
:func:`fedsim.tools.report.write_report`, as does ``fedsim report``);
:func:`run_page_data` is what it draws, which the live server
(:mod:`fedsim.tools.live`) also serves while a run goes on. Like report.md,
the page reads only the run directory's files, so any finished,
interrupted or older run gets one; only rounds.parquet is required.

The page holds accuracy and loss against simulated time and rounds; the
device timeline over every round (a bar per (round, device) job, coloured by
group, dropped jobs hatched; the hover gives device, group, round, tau,
slowdown, drop reason and bytes); updates per round by group and state; tau
per group per round; the chi^2 and participation meters; the declared
against realised fleet; and the plug-ins' metrics. Past
:data:`MAX_TIMELINE_BARS` jobs the timeline is a heatmap of each device's
mean tau per bin of rounds instead (the page says so): a million bars would
not open in a browser. See docs/report-page.md.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from fedsim.results import atomic_write_bytes
from fedsim.tools import plots
from fedsim.tools.page_html import figure_json, render
from fedsim.tools.report import (
    _group_names,
    _mapping,
    _run_name,
    _step_cap,
    _summary_rows,
    read_run_files,
)

PAGE_NAME = "report.html"

# Beyond this many (round, device) jobs the timeline aggregates: Plotly
# draws each bar as an SVG element; 10,000 of them add about 1 CPU second to
# opening the page, 20,000 about 2 (benchmarks/report_page.py), and a million
# would take minutes.
MAX_TIMELINE_BARS = 10_000
# The aggregated timeline's most cells (devices x round bins).
MAX_TIMELINE_CELLS = 250_000
# Past this many rounds, jobs per round are filled lines, not bars (an SVG
# element per bar and round slows the page as much as the timeline would).
MAX_STATE_BARS = 200

# The hover of one timeline bar: every field the readers ask for.
_BAR_HOVER = (
    "device %{y} (%{customdata[0]})<br>round %{customdata[1]}<br>"
    "tau %{customdata[2]} steps<br>slowdown %{customdata[3]:.3g}<br>"
    "from %{base:.4g} s to %{x:.4g} s (simulated)<br>%{customdata[4]}<br>"
    "bytes down %{customdata[5]:,} / up %{customdata[6]:,}<extra></extra>"
)


def write_page(run_dir: Path) -> Path:
    """Write ``report.html`` into a run directory, atomically.

    The page is a pure function of the directory's files: writing it twice
    gives the same bytes.

    Args:
        run_dir: the run directory; only its rounds.parquet is required.

    Returns:
        The page's path.

    Raises:
        ReportError: the directory or its rounds.parquet is missing, or a
            file in it cannot be read.
    """
    path = Path(run_dir) / PAGE_NAME
    atomic_write_bytes(path, render(run_page_data(run_dir)).encode())
    return path


def run_page_data(run_dir: Path) -> dict[str, Any]:
    """What a run's page shows (fedsim.tools.page_html's data format).

    Args:
        run_dir: the run directory (complete or still being written).

    Raises:
        ReportError: as :func:`write_page`.
    """
    run_dir = Path(run_dir)
    rounds, clients, summary, scenario = read_run_files(run_dir)
    groups = _group_names(scenario)
    jobs = _Jobs(clients, groups)
    sections = [_metrics_section(rounds, summary.get("initial"))]
    sections += jobs.sections(_step_cap(scenario))
    sections += _meter_sections(rounds, summary)
    sections += _realised_sections(summary.get("fleet_realised"))
    if plots.plugin_columns(rounds):
        sections.append(_plugin_section(rounds))
    status = summary.get("status") or "running (or interrupted: no summary.json yet)"
    notes = [] if clients is not None else ["clients.parquet is missing."]
    return {
        "title": f"Run report: {_run_name(scenario, summary, run_dir)}",
        "subtitle": f"Run directory: {run_dir.name}; status: {status}",
        "counter_label": "rounds done",
        "counter": rounds.num_rows,
        "notes": notes,
        "table": _summary_rows(summary, scenario, rounds),
        "sections": sections,
    }


def _section(
    key: str, title: str, hint: str, fig: Any, note: str = ""
) -> dict[str, Any]:
    """One section of a page: a heading, a hint, an optional note (e.g. that
    the figure aggregates) and the figure."""
    return {"id": key, "title": title, "hint": hint, "note": note,
            "figure": figure_json(fig)}  # fmt: skip


def numbers(table: pa.Table | None, name: str, n: int = 0) -> np.ndarray:
    """A numeric column as float64 (nulls as NaN), without going through
    Python objects: a million-row clients table converts in milliseconds.
    ``n`` NaN when the table or column is missing."""
    if table is None or name not in table.column_names:
        return np.full(n, np.nan)
    col = table.column(name).cast(pa.float64())
    return np.asarray(col.to_numpy(zero_copy_only=False), dtype=np.float64)


def strings(table: pa.Table | None, name: str, n: int, default: str) -> np.ndarray:
    """A string column as an object array (nulls and a missing column as
    ``default``)."""
    if table is None or name not in table.column_names:
        return np.full(n, default, dtype=object)
    col = table.column(name).fill_null(default).cast(pa.string())
    return np.asarray(col.to_numpy(zero_copy_only=False), dtype=object)


def css(rgba: tuple[float, ...], alpha: float = 1.0) -> str:
    """A matplotlib colour as CSS, so the page and the PNGs colour a group
    alike."""
    r, g, b = (round(255 * c) for c in rgba[:3])
    return f"rgba({r},{g},{b},{alpha:g})"


# one colour per metric in both panels (Plotly would cycle per trace)
_METRIC_COLORS = {"test_accuracy": "#1f77b4", "test_loss": "#d62728",
                  "train_loss": "#ff7f0e"}  # fmt: skip


def _metrics_section(rounds: pa.Table, initial: object) -> dict[str, Any]:
    """Accuracy and loss against simulated time and against rounds
    completed, starting at the initial model when summary.json has it."""
    from plotly.subplots import make_subplots

    done = numbers(rounds, "round") + 1  # round t is drawn at t + 1 completed
    sim = numbers(rounds, "sim_time")
    start = initial if isinstance(initial, dict) else {}
    fig = make_subplots(rows=2, cols=2, shared_xaxes="columns", vertical_spacing=0.08)
    for row, keys in ((1, ("test_accuracy",)), (2, ("test_loss", "train_loss"))):
        for key in keys:
            y = numbers(rounds, key, rounds.num_rows)
            # summary.json's initial model: "accuracy" and "loss", no training loss
            first = None if key == "train_loss" else start.get(key[5:])
            for col, x in ((1, sim), (2, done)):
                xs, ys = x, y
                if isinstance(first, int | float):
                    xs, ys = np.r_[0.0, x], np.r_[float(first), y]
                keep = np.isfinite(ys)
                fig.add_scatter(
                    x=xs[keep], y=ys[keep], name=key, row=row, col=col,
                    legendgroup=key, showlegend=col == 1, mode=_mode(xs[keep]),
                    line={"dash": "dash" if key == "train_loss" else "solid",
                          "color": _METRIC_COLORS[key]},
                )  # fmt: skip
    fig.update_xaxes(title_text="simulated time (s)", row=2, col=1)
    fig.update_xaxes(title_text="rounds completed", row=2, col=2)
    fig.update_yaxes(title_text="test accuracy", row=1, col=1)
    fig.update_yaxes(title_text="loss", row=2, col=1)
    fig.update_layout(height=600, margin={"t": 30})
    hint = (
        "Left: against simulated time (what a deployment pays for); right: "
        "against rounds completed (round t of rounds.parquet is drawn at t + 1; "
        "0 is the initial model). Dashed: the participants' training loss."
    )
    return _section("metrics", "Test accuracy and loss", hint, fig)


class _Jobs:
    """clients.parquet's jobs as NumPy columns, for the timeline, the
    updates-per-round and the tau figures.

    Attributes:
        n: the number of jobs (rows).
        group: each job's device group ("unknown" where not recorded).
        order: the groups in legend order (the scenario's first).
        colors: a CSS colour per group, as in the PNG figures.
    """

    def __init__(self, clients: pa.Table | None, groups: list[str]) -> None:
        """Read the columns once (any may be missing in an older run)."""
        self.table = clients
        self.n = 0 if clients is None else clients.num_rows
        self.round = numbers(clients, "round", self.n)
        self.device = numbers(clients, "client_id", self.n)
        self.tau = numbers(clients, "tau", self.n)
        self.group = strings(clients, "device_group", self.n, "unknown")
        dropped = numbers(clients, "dropped", self.n)
        self.dropped = np.nan_to_num(dropped, nan=0.0) > 0
        self.order = plots._legend_order(list(self.group), self.group, groups)
        self.rgba = plots._group_colors(self.order)
        self.colors = {g: css(c) for g, c in self.rgba.items()}

    def sections(self, step_cap: int | None) -> list[dict[str, Any]]:
        """The timeline, updates per round and tau sections (none without
        clients.parquet)."""
        if self.table is None:
            return []
        timeline = self._bars() if self.n <= MAX_TIMELINE_BARS else self._heatmap()
        return [timeline, self._states(), self._taus(step_cap)]

    def _bars(self) -> dict[str, Any]:
        """The timeline: one horizontal bar per job, from its download to its
        arrival, one trace per (group, state) so the legend toggles them."""
        import plotly.graph_objects as go

        t0 = np.nan_to_num(numbers(self.table, "t_start", self.n))
        took = np.nan_to_num(numbers(self.table, "t_arrive", self.n) - t0).clip(0)
        reason = strings(self.table, "drop_reason", self.n, "")
        state = np.where(self.dropped, "dropped: " + reason, "aggregated")
        cols = ["slowdown", "bytes_down", "bytes_up"]
        slow, down, up = (numbers(self.table, c, self.n) for c in cols)
        custom = np.stack(
            [self.group, self.round.astype(int), self.tau, slow, state, down, up], 1
        )
        fig = go.Figure()
        for g in self.order:
            for drop in (False, True):
                keep = (self.group == g) & (self.dropped == drop)
                if not keep.any():
                    continue
                fig.add_bar(
                    y=self.device[keep], x=took[keep], base=t0[keep],
                    orientation="h", customdata=custom[keep],
                    name=f"{g} ({'dropped' if drop else 'aggregated'})",
                    legendgroup=g, hovertemplate=_BAR_HOVER,
                    marker=self._marker(g, drop),
                )  # fmt: skip
        fig.update_layout(
            barmode="overlay", height=_timeline_height(self.device), bargap=0.2,
            xaxis_title="simulated time (s)", yaxis_title="device",
            margin={"t": 30},
        )  # fmt: skip
        hint = (
            "Each bar is one job: a device selected in a round, from the model's "
            "download to its update's arrival, coloured by device group; hatched "
            "bars are dropped updates (the hover gives the reason). Drag to zoom, "
            "double-click to see every round again; hover a bar for its device, "
            "group, round, tau, slowdown, drop reason and bytes."
        )
        return _section("timeline", "Device timeline", hint, fig)

    def _heatmap(self) -> dict[str, Any]:
        """The aggregated timeline: each device's mean tau per bin of rounds
        (blank where it was not selected), at most
        :data:`MAX_TIMELINE_CELLS` cells."""
        import plotly.graph_objects as go

        devices, row = np.unique(self.device, return_inverse=True)
        n_rounds = int(np.nanmax(self.round)) + 1
        bins = max(1, MAX_TIMELINE_CELLS // devices.size)  # per device
        width = math.ceil(n_rounds / bins)
        col = (self.round // width).astype(int)
        shape = (devices.size, int(col.max()) + 1)
        flat = row * shape[1] + col
        count = np.bincount(flat, minlength=shape[0] * shape[1])
        total = np.bincount(flat, weights=np.nan_to_num(self.tau), minlength=count.size)
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = np.round(total / count, 1).reshape(shape)
        fig = go.Figure(
            go.Heatmap(
                z=mean, y=devices, x=np.arange(shape[1]) * width,
                colorscale="Viridis", colorbar={"title": {"text": "mean tau"}},
                hovertemplate="device %{y}<br>rounds from %{x}<br>"
                "mean tau %{z}<extra></extra>",
            )
        )  # fmt: skip
        fig.update_layout(
            height=600, xaxis_title=f"round (bins of {width})", yaxis_title="device"
        )
        note = (
            f"This run has {self.n:,} jobs, more than the {MAX_TIMELINE_BARS:,} "
            "bars a page draws one by one: the timeline is aggregated into each "
            f"device's mean tau per bin of {width} round(s) (blank: not "
            "selected). Jobs by state are in the next figure; clients.parquet "
            "holds every job."
        )
        hint = "Devices (rows) against rounds: where each device trained, and how much."
        return _section("timeline", "Device timeline", hint, fig, note)

    def _marker(self, group: str, dropped: bool) -> dict[str, Any]:
        """A bar's look: its group's colour; a dropped job's lighter and
        hatched, as in timeline.png."""
        shape = "/" if dropped else ""
        return {"color": self.colors[group], "opacity": 0.55 if dropped else 1,
                "pattern": {"shape": shape}}  # fmt: skip

    def _per_round(self, keep: np.ndarray, weights: np.ndarray | None) -> np.ndarray:
        """Per round: the count (or the sum of ``weights``) of the jobs in
        ``keep``."""
        n = int(np.nanmax(self.round)) + 1 if self.n else 0
        w = None if weights is None else weights[keep]
        return np.bincount(self.round[keep].astype(int), weights=w, minlength=n)

    def _states(self) -> dict[str, Any]:
        """Jobs per round, stacked by group and state (aggregated, dropped)."""
        import plotly.graph_objects as go

        fig = go.Figure()
        for g in self.order:
            for drop in (False, True):
                keep = (self.group == g) & (self.dropped == drop)
                counts = self._per_round(keep, None)
                if not counts.any():
                    continue
                name = f"{g} ({'dropped' if drop else 'aggregated'})"
                if counts.size <= MAX_STATE_BARS:
                    fig.add_bar(x=np.arange(counts.size), y=counts, legendgroup=g,
                                name=name, marker=self._marker(g, drop))  # fmt: skip
                else:  # one filled line per trace, not a bar per round
                    fig.add_scatter(
                        x=np.arange(counts.size), y=counts, legendgroup=g, name=name,
                        stackgroup="jobs", mode="lines", line={"width": 0},
                        fillcolor=css(self.rgba[g], 0.45 if drop else 0.9),
                    )  # fmt: skip
        fig.update_layout(
            barmode="stack", height=400, xaxis_title="round", yaxis_title="jobs"
        )
        hint = (
            "Each round's jobs by device group; hatched (past "
            f"{MAX_STATE_BARS} rounds: lighter): dropped updates."
        )
        return _section("states", "Jobs per round by group and state", hint, fig)

    def _taus(self, step_cap: int | None) -> dict[str, Any]:
        """Mean tau of each group's aggregated updates per round."""
        import plotly.graph_objects as go

        fig = go.Figure()
        for g in self.order:
            keep = (self.group == g) & ~self.dropped & np.isfinite(self.tau)
            count = self._per_round(keep, None)
            with np.errstate(invalid="ignore", divide="ignore"):
                mean = self._per_round(keep, self.tau) / count
            has = count > 0
            fig.add_scatter(
                x=np.flatnonzero(has), y=mean[has], name=g, mode=_mode(mean[has]),
                line={"color": self.colors[g]}, customdata=count[has],
                hovertemplate=f"{g}<br>round %{{x}}<br>mean tau %{{y:.3g}} over "
                "%{customdata} updates<extra></extra>",
            )  # fmt: skip
        if step_cap is not None:
            fig.add_hline(y=step_cap, line_dash="dash", annotation_text="max_steps")
        fig.update_layout(height=400, xaxis_title="round", yaxis_title="mean tau")
        hint = (
            "Groups far apart mean heterogeneous local progress, where FedAvg's "
            "objective inconsistency comes from; the dashed line is "
            "round.max_steps (updates on it were capped, not slow)."
        )
        return _section("tau", "Local steps tau per group per round", hint, fig)


def _mode(x: np.ndarray) -> str:
    """A curve's Plotly mode: markers on each point while they are few
    enough to be told apart (and cheap to draw)."""
    return "lines+markers" if x.size <= MAX_STATE_BARS else "lines"


def _timeline_height(device: np.ndarray) -> int:
    """Pixels for the bar timeline: enough for each device's row to be
    hovered, within what a screen scrolls comfortably."""
    return int(min(1600, max(350, 14 * np.unique(device).size + 120)))


def _meter_sections(rounds: pa.Table, summary: dict[str, object]) -> list[dict]:
    """The chi^2 and participation meters: gauges of the mean chi^2(p||w)
    and of the participation bias's L1 distance, and chi^2 per round."""
    from plotly.subplots import make_subplots

    chi2 = numbers(rounds, "chi2_pw", rounds.num_rows)
    bias = summary.get("participation_bias")
    l1 = bias.get("l1") if isinstance(bias, dict) else None
    if not np.isfinite(chi2).any() and not isinstance(l1, int | float):
        return []
    specs = [[{"type": "indicator"}, {"type": "indicator"}, {"type": "xy"}]]
    fig = make_subplots(rows=1, cols=3, specs=specs, column_widths=[0.25, 0.25, 0.5])
    finite = chi2[np.isfinite(chi2)]
    if finite.size:
        mean = float(finite.mean())
        gauge = {"axis": {"range": [0, max(1.0, float(finite.max()))]}}
        title = {"text": "mean chi^2(p||w)"}
        fig.add_indicator(value=mean, gauge=gauge, title=title, mode="gauge+number",
                          row=1, col=1)  # fmt: skip
        keep = np.isfinite(chi2)
        x = numbers(rounds, "round")[keep]
        fig.add_scatter(x=x, y=chi2[keep], name="chi^2(p||w)", row=1, col=3)
    if isinstance(l1, int | float):
        gauge = {"axis": {"range": [0, 2]}}
        title = {"text": "participation bias (L1)"}
        fig.add_indicator(value=float(l1), gauge=gauge, title=title,
                          mode="gauge+number", row=1, col=2)  # fmt: skip
    fig.update_xaxes(title_text="round", row=1, col=3)
    fig.update_layout(height=320, showlegend=False)
    hint = (
        "chi^2(p||w): how far the effective aggregation weights w are from the "
        "data weights p (0: the server optimises the true objective). "
        "Participation bias: the L1 distance between each client's share of the "
        "aggregation weight and its data share (0 to 2; summary.json lists the "
        "most over-weighted clients)."
    )
    return [_section("meters", "Objective inconsistency and participation", hint, fig)]


# declared-against-realised rates: summary.json key -> panel title
_RATES = {
    "online_at_starts": "online at round starts",
    "straggler_rate": "stragglers",
    "dropout_rate": "dropouts",
}


def _realised_sections(realised: object) -> list[dict]:
    """Declared against realised fleet, per group: the rates of
    :data:`_RATES` and the speed quantiles (fedsim.realised)."""
    from plotly.subplots import make_subplots

    if not isinstance(realised, dict):
        return []
    groups = [g for g in realised.get("groups") or [] if isinstance(g, dict)]
    titles = [*_RATES.values(), "median speed (steps/s)"]
    fig = make_subplots(rows=1, cols=4, subplot_titles=titles)
    names = [str(g.get("group")) for g in groups]
    for col, key in enumerate([*_RATES, "speed_steps_per_s"], start=1):
        entries = [_mapping(g.get(key)) for g in groups]
        for which, color in (("declared", "#999999"), ("realised", "#1f77b4")):
            fig.add_bar(
                x=names, y=[_middle(e.get(which)) for e in entries], name=which,
                marker_color=color, legendgroup=which, showlegend=col == 1,
                row=1, col=col,
            )  # fmt: skip
    fig.update_layout(barmode="group", height=380)
    warnings = [str(w) for w in realised.get("warnings") or []]
    hint = (
        "What each group was declared to be against what the run drew and "
        "did: the share online at round starts, straggler and dropout rates "
        "of its selected updates, and its median speed."
    )
    note = "; ".join(f"Warning: {w}" for w in warnings)
    return [_section("realised", "Declared against realised fleet", hint, fig, note)]


def _middle(value: object) -> float | None:
    """A number, or the middle of a list of quantiles (the median of
    [p10, p50, p90]); None when neither."""
    if isinstance(value, list) and value:
        value = value[len(value) // 2]
    return float(value) if isinstance(value, int | float) else None


def _plugin_section(rounds: pa.Table) -> dict[str, Any]:
    """The plug-ins' own per-round metrics (alg_, sel_, fed_ columns)."""
    import plotly.graph_objects as go

    fig = go.Figure()
    x = numbers(rounds, "round")
    for name in plots.plugin_columns(rounds):
        y = numbers(rounds, name)
        keep = np.isfinite(y)
        fig.add_scatter(x=x[keep], y=y[keep], name=name, mode="lines+markers")
    fig.update_layout(height=380, xaxis_title="round")
    hint = (
        "The algorithm's (alg_) and the selector's (sel_) own scalars per round "
        "and federated evaluation's (fed_); click a legend entry to hide it."
    )
    return _section("plugins", "Plug-in metrics", hint, fig)
