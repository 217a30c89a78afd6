"""``fedsim report RUN_DIR``: a run's figures as PNG and a report.md showing them.

:func:`write_report` is the one entry point (the command line and ``fedsim run``
both call it). It reads what a run directory holds, draws each figure with
:mod:`fedsim.tools.plots`, and writes ``report.md``: a table of key figures, then each
figure with a hint of what to look for (:data:`FIGURES`).

Only ``rounds.parquet`` is required. Every other file (clients.parquet,
summary.json, scenario.yaml, partition.parquet) may be missing, because an
interrupted run, or one written by an older fedsim, must still get a report:
a missing file gives an empty figure or a row left out, never an error. A file
that exists but cannot be parsed is an error (:class:`ReportError`), since
silently skipping it would hide a corrupted run. See docs/results.md.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import yaml
from matplotlib.figure import Figure

from fedsim.data.partition import plot_partition
from fedsim.errors import LoadError
from fedsim.results import atomic_write_bytes
from fedsim.tools import plots
from fedsim.units import duration

_T = TypeVar("_T")

REPORT_NAME = "report.md"


class ReportError(LoadError, ValueError):
    """The directory is not a readable run directory.

    Raised when the directory or its ``rounds.parquet`` is missing, or when a
    file in it exists but cannot be parsed. A ValueError, so callers that treat
    bad input uniformly can catch it as such.
    """


# The report's figures: file -> (heading, what to look for in it). The order
# here is not the order in report.md: write_report adds a figure when it draws
# it, so a run without async clients or chi^2 values has no empty section.
FIGURES = {
    "metrics.png": (
        "Test accuracy and loss",
        "Compare the left panels across runs: simulated time, not rounds, is what a "
        "deployment pays for; a test loss that rises while the training loss falls "
        "means client drift. The curves start at the initial model (0 rounds "
        "completed); round t of rounds.parquet is drawn at t + 1 rounds completed.",
    ),
    "objective.png": (
        "Global training objective F(x)",
        "F(x) = sum_i p_i F_i(x): the model's mean loss on each client's training "
        "data, weighted by its data weight p_i (the task loss only, no proximal or "
        "dynamic regulariser), every eval.objective_every rounds and after the last. "
        "Unlike the dashed train loss of the metrics figure (the participants' "
        "minibatch losses during local training), it is the objective the run "
        "minimises, on every client's data: a plateau above other runs' is "
        "objective inconsistency or client drift.",
    ),
    "tau_by_group.png": (
        "Local steps tau_i(t) per device group",
        "Wide boxes or groups far apart mean heterogeneous local progress: this is "
        "where FedAvg's objective inconsistency comes from. The dashed line is "
        "round.max_steps: updates on it were capped, not slow.",
    ),
    "timeline.png": (
        "Client timeline",
        "Each bar is one selected client in one round, from download to arrival; "
        "long bars at the right edge of a round are stragglers (under a fixed "
        "window they finish fewer steps instead), and hatched bars ending in a red "
        "marker are dropped updates (the marker's shape gives the reason). Odd "
        "rounds are drawn lighter, so a client's consecutive rounds stay apart; "
        "rounds are numbered from 0, as in the Parquet files.",
    ),
    "staleness.png": (
        "Staleness over simulated time",
        "Staleness that grows over time, or one device group far above the others, "
        "means slow devices keep contributing updates computed on old models.",
    ),
    "chi2.png": (
        "Objective inconsistency",
        "chi^2(p||w) measures how far the effective aggregation weights w are from "
        "the data weights p; 0 means the server optimises the true objective.",
    ),
    "plugin_metrics.png": (
        "Plug-in metrics",
        "The algorithm's (alg_) and the selector's (sel_) own scalars per "
        "round, and federated evaluation's (fed_: the clients' own held-out "
        "rows, aggregated by the algorithm's rule), as reported "
        '(docs/extending.md, "Hooks"); '
        "rounds.parquet holds the same columns.",
    ),
    "links.png": (
        "Fleet and data links: samples vs speed",
        "Each point is a device: its training samples against its speed, "
        "coloured by device group. A falling cloud means the slow devices hold "
        "the data (under a deadline, their updates are the ones dropped).",
    ),
    "weight_share.png": (
        "Participation bias: weight share vs data share",
        "Each point is a client: its share of the aggregation weight over the run "
        "against its data share p_i. Points on the dashed line y = x mean the "
        "selector and the weighting are paired without bias; large clients far "
        "above it mean the data share was counted twice (summary.json's "
        "participation_bias gives the L1 distance and the top over-weighted "
        "clients).",
    ),
}


def _read_table(path: Path) -> pa.Table | None:
    """One optional Parquet table of a run directory (:func:`_read`)."""
    return _read(path, pq.read_table)


def _read(path: Path, parse: Callable[[Path], _T]) -> _T | None:
    """Read one optional file of a run directory.

    Args:
        path: The file.
        parse: Turns the path into a value (a Parquet or text reader).

    Returns:
        ``parse(path)``, or None when the file is missing.

    Raises:
        ReportError: The file exists but ``parse`` fails on it.
    """
    if not path.is_file():
        return None
    try:
        return parse(path)
    except (OSError, ValueError, yaml.YAMLError, pa.ArrowException) as exc:
        # "from None": the parser's traceback says nothing the message does not
        raise ReportError(f"cannot read {path}: {exc}") from None


def _read_mapping(path: Path, loads: Callable[[str], object]) -> dict[str, object]:
    """summary.json or scenario.yaml as a dict.

    Args:
        path: The file.
        loads: Parses its text (``json.loads`` or ``yaml.safe_load``).

    Returns:
        The parsed mapping; {} when the file is missing or holds something
        else (an empty YAML file parses to None), so lookups need no guard.

    Raises:
        ReportError: The file exists but cannot be parsed.
    """
    return _mapping(_read(path, lambda p: loads(p.read_text(encoding="utf-8"))))


def _mapping(x: object) -> dict[str, object]:
    """``x`` when it is a mapping (a JSON object, a YAML mapping), else {}:
    what a hand-edited or older file holds there is never assumed."""
    return x if isinstance(x, dict) else {}


def _list(x: object) -> list[object]:
    """``x`` when it is a list (a JSON array, a YAML sequence), else []."""
    return x if isinstance(x, list) else []


def _get(d: object, *keys: str) -> object:
    """``d[k1][k2]...``, or None where a level is missing or not a dict.

    A hand-edited scenario.yaml may hold anything, so the report never
    assumes its shape.
    """
    for k in keys:
        if not isinstance(d, dict):
            return None
        d = d.get(k)
    return d


def _fmt(x: object, spec: str = ".4g") -> str:
    """A table cell: floats by ``spec``, ints with thousands separators.

    None and non-finite floats give "-", which :func:`_summary_rows` reads as
    "nothing to show" and drops the row.
    """
    if isinstance(x, float):
        return format(x, spec) if math.isfinite(x) else "-"
    # bool is an int subclass: True must print as "True", not "1"
    if isinstance(x, int) and not isinstance(x, bool):
        return f"{x:,}"
    return "-" if x is None else str(x)


def _bytes(n: object) -> str:
    """A byte count in decimal units (1 KB = 1000 B); "-" when not a number."""
    if not isinstance(n, int | float) or not math.isfinite(n):
        return "-"
    for unit in ("B", "KB", "MB", "GB"):
        # GB is the largest unit: a terabyte prints as "1000.0 GB"
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return "-"


def _total(value: object, rounds: pa.Table, column: str) -> object:
    """``value`` (from summary.json), else the sum of ``column`` over rounds.

    An interrupted run has no summary.json, so its counts come from the
    per-round columns; None when neither is there.
    """
    if value is None and column in rounds.column_names:
        return sum(v or 0 for v in rounds.column(column).to_pylist())
    return value


def _update_counts(summary: dict[str, object], rounds: pa.Table) -> tuple[object, str]:
    """Updates completed, and updates dropped as a report cell.

    Args:
        summary: summary.json (may be {}).
        rounds: rounds.parquet.

    Returns:
        ``(completed, dropped)``: the completed count (None when unknown) and
        the dropped count with its share of all updates, e.g. "12 (4.0%)".
    """
    done = _total(summary.get("updates_completed"), rounds, "n_completed")
    drop = _total(summary.get("updates_dropped"), rounds, "n_dropped")
    dropped = _fmt(drop)
    if isinstance(done, int) and isinstance(drop, int) and done + drop:
        dropped += f" ({100 * drop / (done + drop):.1f}%)"
    return done, dropped


def _last_value(rounds: pa.Table, column: str) -> float | None:
    """The last finite value of a float ``column``; None when the column is
    missing or has none."""
    if column not in rounds.column_names:
        return None
    column_values = rounds.column(column).to_pylist()
    values = [v for v in column_values if isinstance(v, float) and math.isfinite(v)]
    return values[-1] if values else None


def _final_sim_time(summary: dict[str, object], rounds: pa.Table) -> object:
    """summary.json's ``sim_time_s``, else the last round's ``sim_time``."""
    sim_time = summary.get("sim_time_s")
    if sim_time is None and rounds.num_rows and "sim_time" in rounds.column_names:
        sim_time = rounds.column("sim_time")[-1].as_py()
    return sim_time


def _policy(scenario: dict[str, object]) -> object:
    """The round policy, with its window when it is a fixed window."""
    policy = _get(scenario, "round", "policy")
    if policy == "fixed_window" and (window := _get(scenario, "round", "window_s")):
        policy = f"{policy}, {window} s window"
    return policy


def _devices(scenario: dict[str, object]) -> str:
    """ "N in G groups" from the scenario's fleet; "-" without groups."""
    groups = _list(_get(scenario, "fleet", "groups"))
    devices = sum(_count(g) for g in groups)
    return f"{devices} in {len(groups)} groups" if groups else "-"


def _count(group: object) -> int:
    """A fleet group's ``count`` (0 when it has none or is no mapping)."""
    count = _mapping(group).get("count", 0)
    return count if isinstance(count, int) else 0


def _summary_rows(
    summary: dict[str, object], scenario: dict[str, object], rounds: pa.Table
) -> list[tuple[str, str]]:
    """report.md's "key figure | value" rows.

    Args:
        summary: summary.json (may be {}: an interrupted run).
        scenario: The resolved scenario.yaml (may be {}).
        rounds: rounds.parquet, the fallback for what summary.json lacks.

    Returns:
        ``(key, value)`` pairs in display order; rows whose value is unknown
        are left out rather than shown as "-".
    """
    traffic = ("bytes_down", "bytes_up")
    done, dropped = _update_counts(summary, rounds)
    sim_time = _final_sim_time(summary, rounds)
    algo = _get(scenario, "algorithm", "name")
    tau_eff = _get(scenario, "algorithm", "tau_eff")
    policy = _policy(scenario)
    # the model before round 0 (summary.json's "initial"; null values: "-")
    initial = _mapping(summary.get("initial"))
    best = [_fmt(summary.get(k)) for k in ("best_test_accuracy", "best_round")]
    rows = [
        ("algorithm", f"{algo} (tau_eff: {tau_eff})" if tau_eff else _fmt(algo)),
        ("selector", _fmt(_get(scenario, "selector", "name"))),
        ("round policy", _fmt(policy)),
        ("devices", _devices(scenario)),
        ("seed", _fmt(scenario.get("seed"))),
        ("rounds", _fmt(summary.get("rounds", rounds.num_rows))),
        ("initial test accuracy", _fmt(initial.get("accuracy"))),
        ("initial test loss", _fmt(initial.get("loss"))),
        ("final test accuracy", _fmt(summary.get("final_test_accuracy"))),
        ("best test accuracy (round)", f"{best[0]} ({best[1]})"),
        ("final test loss", _fmt(summary.get("final_test_loss"))),
        ("best test loss", _fmt(summary.get("best_test_loss"))),
        # federated evaluation (the clients' own held-out rows), when on
        ("final federated accuracy", _fmt(_last_value(rounds, "fed_accuracy"))),
        ("final federated loss", _fmt(_last_value(rounds, "fed_loss"))),
        ("initial training objective F(x)", _fmt(initial.get("objective"))),
        ("final training objective F(x)", _fmt(_last_value(rounds, "train_objective"))),
        ("simulated time", _sim_time(sim_time)),
        ("wall time", f"{_fmt(summary.get('wall_time_s'), '.1f')} s"),
        ("updates completed", _fmt(done)),
        ("updates dropped", dropped),
        ("traffic down / up", " / ".join(_bytes(summary.get(k)) for k in traffic)),
        ("workers", _fmt(summary.get("workers"))),
        ("fedsim version", _fmt(summary.get("fedsim_version"))),
    ]
    # the shapes an unknown value takes once _fmt and the units are applied
    return [(k, v) for k, v in rows if v not in ("-", "- (-)", "- s")]


def _sim_time(seconds: object) -> str:
    """Seconds, and the same in min/h/d when that reads better.

    Below ten minutes the seconds alone read well; above, "86400.0 s" needs
    its "(1.0 d)" to be read at a glance.
    """
    text = f"{_fmt(seconds, '.1f')} s"
    if isinstance(seconds, (int, float)) and math.isfinite(seconds) and seconds >= 600:
        text += f" ({duration(seconds)})"
    return text


def _step_cap(scenario: dict[str, object]) -> int | None:
    """The step cap to draw on the tau figure, if the run had one.

    Args:
        scenario: The resolved scenario.yaml (may be {}).

    Returns:
        ``round.max_steps`` where it caps tau: under a fixed window, and in an
        async run whose jobs run ``max_steps`` steps. None elsewhere
        (``fixed_epochs``, async epoch jobs: tau is set by the epochs, so a
        line at max_steps would suggest a cap that was never applied).
    """
    cap = _get(scenario, "round", "max_steps")
    policy = _get(scenario, "round", "policy") or "fixed_window"
    job_steps = _get(scenario, "round", "job_steps") or "max_steps"
    caps = policy == "fixed_window" or (policy == "async" and job_steps == "max_steps")
    return cap if caps and isinstance(cap, int) and not isinstance(cap, bool) else None


def _status_lines(summary: dict[str, object]) -> list[str]:
    """Warnings from summary.json's ``status`` and ``degenerate``.

    Returns:
        Markdown quote lines and a blank line after them; [] for a completed,
        non-degenerate run, so a clean report starts with its table.
    """
    out = []
    if (status := summary.get("status")) and status != "completed":
        out.append(
            f"> **This run is {status}**: the figures show the rounds it "
            "made before it stopped."
        )
    if summary.get("degenerate"):
        out.append(f"> **Degenerate run**: {summary['degenerate']}.")
    return [*out, ""] if out else []


def _links_lines(links: object) -> list[str]:
    """report.md's "Fleet and data links" section (fedsim.links).

    Args:
        links: summary.json's ``links``; anything but a dict (a run without
            links, an older run) gives no section.

    Returns:
        Markdown lines: the declared targets, a table of the realised Spearman
        rank correlations (what the run actually got, which a small fleet can
        miss by a lot), and a table of per-group shares.
    """
    if not isinstance(links, dict):
        return []
    declared = links.get("declared") or {}
    out = ["", "## Fleet and data links", ""]
    out += [f"Declared: `{json.dumps(declared)}`.", ""]
    out += ["| Spearman rank correlation | realised |", "|---|---|"]
    for key, value in _mapping(links.get("spearman")).items():
        out.append(f"| {key.replace('_vs_', ' vs ')} | {_fmt(value, '+.3f')} |")
    out += ["", "(-: one side is the same for every device, e.g. always online.)"]
    # the header is built in two pieces only to keep the lines short
    out += ["", "| group | devices | sample share | median speed (steps/s) "]
    out[-1] += "| online fraction | selections | update share |"
    out.append("|---|---|---|---|---|---|---|")
    out += [_links_group_row(g) for g in map(_mapping, _list(links.get("groups")))]
    return out


def _links_group_row(g: dict[str, object]) -> str:
    """One group's row of the links section's per-group table."""
    cells = [g.get("name"), g.get("devices"), _fmt(g.get("sample_share"), ".3f")]
    cells += [_fmt(g.get("median_speed")), _fmt(g.get("online_fraction"), ".3f")]
    cells += [g.get("selections"), _fmt(g.get("update_share"), ".3f")]
    return "| " + " | ".join(_fmt(c) for c in cells) + " |"


def _realised_lines(realised: object, compute: object) -> list[str]:
    """report.md's "Declared against realised" section (fedsim.realised).

    Args:
        realised: summary.json's ``fleet_realised``; anything but a dict (an
            older run, one interrupted during set-up) gives no section.
        compute: summary.json's ``compute`` (speeds in FLOP/s), or None.

    Returns:
        Markdown lines: the warnings first, then per group the speed
        quantiles, online share at round starts, straggler and dropout
        rates and drop shares, each realised beside its declared value.
    """
    if not isinstance(realised, dict):
        return []
    out = ["", "## Declared against realised", ""]
    if isinstance(compute, dict):
        out += [_compute_line(compute), ""]
    for w in _list(realised.get("warnings")):
        out.append(f"> **Warning**: {w}.")
    if realised.get("warnings"):
        out.append("")
    out += [
        "| group | speed p10 / p50 / p90 (steps/s) | online at starts | stragglers "
        "| dropouts | dropped late / no time / offline |",
        "|---|---|---|---|---|---|",
    ]
    for g in map(_mapping, _list(realised.get("groups"))):
        out.append("| " + " | ".join(_realised_cells(g)) + " |")
    out += [
        "",
        "Each cell: realised (declared). Speeds are the devices' own, drawn once; "
        "the shares count the group's selected updates (dropouts: those whose "
        "work started). A warning marks a value outside its 99.9% sampling "
        'interval (docs/results.md, "Declared against realised").',
    ]
    return out


def _compute_line(compute: dict[str, object]) -> str:
    """The sentence on speeds given in FLOP/s: the model's FLOPs per step and
    each group's speed in steps/s (summary.json's ``compute``)."""
    speeds = []
    for name, value in _mapping(compute.get("groups")).items():
        g = _mapping(value)
        speeds.append(
            f"{name} at {_fmt(g.get('median_steps_per_s'), '.4g')} steps/s "
            f"(median {_fmt(g.get('median_flops_per_s'), '.3g')} FLOP/s)"
        )
    return (
        f"Model: {_fmt(compute.get('flops_per_step'), ',.0f')} FLOPs per local "
        f"step (batch {compute.get('batch_size')}); speeds in FLOP/s run "
        + ", ".join(speeds)
        + "."
    )


def _pair(value: object, spec: str = ".1%") -> str:
    """A realised value with its declared one in brackets (when declared)."""
    entry = _mapping(value)
    declared = entry.get("declared")
    shown = f" ({_fmt(declared, spec)})" if declared is not None else ""
    return _fmt(entry.get("realised"), spec) + shown


def _realised_cells(g: dict[str, object]) -> list[str]:
    """One group's row of the "Declared against realised" table."""
    speed = _mapping(g.get("speed_steps_per_s"))
    quantiles = " / ".join(_fmt(x, ".3g") for x in _list(speed.get("realised")))
    if speed.get("declared"):
        declared = _list(speed["declared"])
        quantiles += " (" + " / ".join(_fmt(x, ".3g") for x in declared) + ")"
    dropped = " / ".join(_fmt(v, ".0%") for v in _mapping(g.get("dropped")).values())
    name = f"{g.get('group')} ({_fmt(g.get('devices'))} devices)"
    return [
        name,
        quantiles,
        _pair(g.get("online_at_starts")),
        _pair(g.get("straggler_rate")),
        _pair(g.get("dropout_rate")),
        dropped,
    ]


def _links_figure(
    run_dir: Path, summary: dict[str, object], partition: pa.Table | None, name: str
) -> Figure | None:
    """Samples against speed per device, when the run declared links.

    The run does not store per-device speeds; they are drawn again from the
    resolved scenario.yaml, which gives the same fleet because a fleet is a
    pure function of (scenario, seed).

    Args:
        run_dir: The run directory (its scenario.yaml is loaded).
        summary: summary.json; its ``links`` says whether the run had links.
        partition: partition.parquet (samples per device), or None.
        name: The scenario's name, for the title.

    Returns:
        The figure, or None when there is nothing to draw: no links, no
        partition, a scenario that no longer loads, or a partition whose size
        does not match the fleet (it would pair samples with the wrong device).
    """
    if not isinstance(summary.get("links"), dict) or partition is None:
        return None
    # imported here: most reports have no links, and these pull in the simulator
    from fedsim.flops import scenario_fleet
    from fedsim.scenario import ScenarioError, load_scenario

    try:
        sc = load_scenario(run_dir / "scenario.yaml")
        fleet = scenario_fleet(sc.facts)
    except (ScenarioError, OSError, ValueError):
        return None  # e.g. a trace file that moved since the run
    n = np.asarray(partition.column("n_samples"), dtype=np.float64)
    if n.size != fleet.size:
        return None
    title = f"{name}: samples vs speed"
    return plots.figure_links(n, fleet.speed, fleet.group, fleet.group_names, title)


def _save_figures(
    run_dir: Path,
    name: str,
    tables: tuple[pa.Table, pa.Table | None],
    summary: dict[str, object],
    scenario: dict[str, object],
    max_timeline_rounds: int,
) -> list[str]:
    """Draw and write each figure the run has data for.

    Args:
        run_dir: Where the PNGs go.
        name: The scenario's name, for the titles.
        tables: rounds.parquet and clients.parquet (None when missing).
        summary: summary.json (may be {}).
        scenario: The resolved scenario.yaml (may be {}).
        max_timeline_rounds: The most rounds the timeline shows.

    Returns:
        The files written, in the order report.md shows them.

    Raises:
        ReportError: partition.parquet exists but cannot be read (after the
            figures that do not need it are written).
    """
    rounds, clients = tables
    groups = _group_names(scenario)
    figures: list[str] = []

    def save(file: str, fig: Figure) -> None:
        figures.append(file)
        plots._save(fig, run_dir / file)

    initial = summary.get("initial")  # the figure checks what it is
    save("metrics.png", plots.figure_metrics(rounds, f"{name}: test metrics", initial))
    if plots.has_objective(rounds):
        title = f"{name}: global training objective"
        save("objective.png", plots.figure_objective(rounds, title, initial))
    tau_title = f"{name}: local steps per update, by device group"
    tau = plots.figure_tau_by_group(clients, groups, tau_title, _step_cap(scenario))
    save("tau_by_group.png", tau)
    timeline = (rounds, groups, max_timeline_rounds, f"{name}: client timeline")
    save("timeline.png", plots.figure_timeline(clients, *timeline))
    if plots.is_async(clients):
        fig = plots.figure_staleness(clients, groups, f"{name}: staleness")
        save("staleness.png", fig)
    if plots.has_chi2(rounds):
        save("chi2.png", plots.figure_chi2(rounds, f"{name}: objective inconsistency"))
    if plots.plugin_columns(rounds):  # plug-in metrics
        title = f"{name}: plug-in metrics"
        save("plugin_metrics.png", plots.figure_plugin_metrics(rounds, title))
    partition = _read_table(run_dir / "partition.parquet")
    for file, fig in _partition_figures(run_dir, name, tables, summary, partition):
        save(file, fig)
    if partition is not None:
        # listed by write_report after the figures above, with its own hint
        plot_partition(partition, run_dir / "partition.png")
    return figures


def _group_names(scenario: dict[str, object]) -> list[str]:
    """The scenario's device group names, in its order: that order fixes the
    figures' legend order and colours (groups without a name are skipped)."""
    fleet = _list(_get(scenario, "fleet", "groups"))
    return [str(g["name"]) for g in fleet if isinstance(g, dict) and "name" in g]


def _partition_figures(
    run_dir: Path,
    name: str,
    tables: tuple[pa.Table, pa.Table | None],
    summary: dict[str, object],
    partition: pa.Table | None,
) -> list[tuple[str, Figure]]:
    """The figures that need partition.parquet: weight share, and links.

    Returns:
        ``(file, figure)`` pairs for the figures there is data for.
    """
    rounds, clients = tables
    out = []
    if clients is not None and partition is not None:
        fig = plots.figure_weight_share(clients, rounds, partition, name)
        out.append(("weight_share.png", fig))
    if (linked := _links_figure(run_dir, summary, partition, name)) is not None:
        out.append(("links.png", linked))
    return out


def _run_name(
    scenario: dict[str, object], summary: dict[str, object], run_dir: Path
) -> str:
    """The run's name for titles: scenario.yaml's first, as a summary may be
    missing and a directory renamed; then summary.json's; then the folder's."""
    return str(scenario.get("name") or summary.get("scenario") or run_dir.name)


def _figure_lines(
    figures: Sequence[str], partition: bool, notes: dict[str, str]
) -> list[str]:
    """report.md's figure sections: each figure written, with its heading and
    hint (:data:`FIGURES`) and its note in ``notes`` if any (what a figure
    left out), then the data partition when ``partition`` (partition.png,
    drawn by :func:`_save_figures` from partition.parquet; a run of the
    quadratic objectives has none)."""
    lines: list[str] = []
    for file in figures:
        heading, hint = FIGURES[file]
        note = notes.get(file)
        hint = f"{hint} {note}" if note else hint
        lines += ["", f"## {heading}", "", f"![{heading}]({file})", "", hint]
    if partition:
        lines += ["", "## Data partition", "", "![Data partition](partition.png)", ""]
        lines.append("Samples per client by class (partition.parquet holds them all).")
    return lines


class RunFiles(NamedTuple):
    """A run directory's files as the report and the page read them.

    Attributes:
        rounds: rounds.parquet (the one file a report needs).
        clients: clients.parquet, or None when it is missing.
        summary: summary.json ({} when missing: a run still going).
        scenario: the resolved scenario.yaml ({} when missing).
    """

    rounds: pa.Table
    clients: pa.Table | None
    summary: dict[str, object]
    scenario: dict[str, object]


def read_run_files(run_dir: Path) -> RunFiles:
    """Read what a report or a page of ``run_dir`` draws from, once.

    Args:
        run_dir: a ``fedsim run`` output directory, finished or still being
            written (only its rounds.parquet is required).

    Raises:
        ReportError: ``run_dir`` or its rounds.parquet is missing, or a file
            in it cannot be read.
    """
    if not run_dir.is_dir():
        raise ReportError(f"{run_dir} is not a run directory: no such directory")
    rounds = _read_table(run_dir / "rounds.parquet")
    if rounds is None:
        raise ReportError(
            f"{run_dir} is not a run directory: rounds.parquet is missing "
            "(expected the output directory of `fedsim run`)"
        )
    return RunFiles(
        rounds,
        _read_table(run_dir / "clients.parquet"),
        _read_mapping(run_dir / "summary.json", json.loads),
        _read_mapping(run_dir / "scenario.yaml", yaml.safe_load),
    )


def write_report(run_dir: Path, max_timeline_rounds: int = 20) -> Path:
    """Write the figures and ``report.md`` of a ``fedsim run`` output directory.

    The figures and report.md are a pure function of the directory's files:
    writing the report twice gives the same bytes. Each file is written
    atomically, so a reader never sees half a report.

    Args:
        run_dir: The run directory; only its ``rounds.parquet`` is required.
        max_timeline_rounds: The most rounds the timeline draws; past that it
            shows the first and last halves.

    Returns:
        The path of report.md.

    Raises:
        ReportError: ``run_dir`` or its rounds.parquet is missing, or a file
            in it cannot be read.
    """
    run_dir = Path(run_dir)
    rounds, clients, summary, scenario = read_run_files(run_dir)
    name = _run_name(scenario, summary, run_dir)
    tables = (rounds, clients)
    figures = _save_figures(
        run_dir, name, tables, summary, scenario, max_timeline_rounds
    )
    lines = [f"# Run report: {name}", "", f"Run directory: `{run_dir.name}`", ""]
    lines += _status_lines(summary)
    lines += ["| key figure | value |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in _summary_rows(summary, scenario, rounds)]
    lines += _links_lines(summary.get("links"))
    lines += _realised_lines(summary.get("fleet_realised"), summary.get("compute"))
    if clients is None:
        lines += ["", "clients.parquet is missing: the client figures are empty."]
    notes = {"plugin_metrics.png": plots.plugin_metrics_left_out(rounds)}
    lines += _figure_lines(figures, (run_dir / "partition.png").exists(), notes)
    path = run_dir / REPORT_NAME
    atomic_write_bytes(path, ("\n".join(lines) + "\n").encode())
    return path
