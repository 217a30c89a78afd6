"""``fedsim report RUN_DIR``: a run's figures as PNG and a report.md showing them
(:func:`write_report`; only ``rounds.parquet`` is required; docs/results.md)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import yaml
from matplotlib.figure import Figure

from fedsim import plots
from fedsim.results import atomic_write_bytes
from fedsim.units import duration

REPORT_NAME = "report.md"


class ReportError(ValueError):
    """The directory is not a readable run directory."""


# The report's figures: file -> (heading, what to look for in it).
FIGURES = {
    "metrics.png": (
        "Test accuracy and loss",
        "Compare the left panels across runs: simulated time, not rounds, is what a "
        "deployment pays for; a test loss that rises while the training loss falls "
        "means client drift. The curves start at the initial model (0 rounds "
        "completed); round t of rounds.parquet is drawn at t + 1 rounds completed.",
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


def _read(path: Path, parse: Callable[[Path], Any] = pq.read_table) -> Any:
    """``parse(path)``; None when the file is missing."""
    if not path.is_file():
        return None
    try:
        return parse(path)
    except (OSError, ValueError, yaml.YAMLError, pa.ArrowException) as exc:
        raise ReportError(f"cannot read {path}: {exc}") from None


def _read_mapping(path: Path, loads: Callable[[str], Any]) -> dict[str, Any]:
    """summary.json or scenario.yaml; {} when missing or not a mapping."""
    data = _read(path, lambda p: loads(p.read_text(encoding="utf-8")))
    return data if isinstance(data, dict) else {}


def _get(d: Any, *keys: str) -> Any:
    for k in keys:
        if not isinstance(d, dict):
            return None
        d = d.get(k)
    return d


def _fmt(x: Any, spec: str = ".4g") -> str:
    if isinstance(x, float):
        return format(x, spec) if math.isfinite(x) else "-"
    if isinstance(x, int) and not isinstance(x, bool):
        return f"{x:,}"
    return "-" if x is None else str(x)


def _bytes(n: Any) -> str:
    if not isinstance(n, int | float) or not math.isfinite(n):
        return "-"
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return "-"


def _summary_rows(
    summary: dict[str, Any], scenario: dict[str, Any], rounds: pa.Table
) -> list[tuple[str, str]]:
    traffic = ("bytes_down", "bytes_up")
    done, drop = summary.get("updates_completed"), summary.get("updates_dropped")
    if done is None and "n_completed" in rounds.column_names:
        done = sum(v or 0 for v in rounds.column("n_completed").to_pylist())
    if drop is None and "n_dropped" in rounds.column_names:
        drop = sum(v or 0 for v in rounds.column("n_dropped").to_pylist())
    dropped = _fmt(drop)
    if isinstance(done, int) and isinstance(drop, int) and done + drop:
        dropped += f" ({100 * drop / (done + drop):.1f}%)"
    sim_time = summary.get("sim_time_s")
    if sim_time is None and rounds.num_rows and "sim_time" in rounds.column_names:
        sim_time = rounds.column("sim_time")[-1].as_py()
    algo = _get(scenario, "algorithm", "name")
    tau_eff = _get(scenario, "algorithm", "tau_eff")
    groups = _get(scenario, "fleet", "groups") or []
    devices = sum(g.get("count", 0) for g in groups if isinstance(g, dict))
    policy = _get(scenario, "round", "policy")
    if policy == "fixed_window" and (window := _get(scenario, "round", "window_s")):
        policy = f"{policy}, {window} s window"
    # the model before round 0 (summary.json's "initial"; null values: "-")
    initial = summary.get("initial") or {}
    best = [_fmt(summary.get(k)) for k in ("best_test_accuracy", "best_round")]
    rows = [
        ("algorithm", f"{algo} (tau_eff: {tau_eff})" if tau_eff else _fmt(algo)),
        ("selector", _fmt(_get(scenario, "selector", "name"))),
        ("round policy", _fmt(policy)),
        ("devices", f"{devices} in {len(groups)} groups" if groups else "-"),
        ("seed", _fmt(scenario.get("seed"))),
        ("rounds", _fmt(summary.get("rounds", rounds.num_rows))),
        ("initial test accuracy", _fmt(initial.get("accuracy"))),
        ("initial test loss", _fmt(initial.get("loss"))),
        ("final test accuracy", _fmt(summary.get("final_test_accuracy"))),
        ("best test accuracy (round)", f"{best[0]} ({best[1]})"),
        ("final test loss", _fmt(summary.get("final_test_loss"))),
        ("best test loss", _fmt(summary.get("best_test_loss"))),
        ("simulated time", _sim_time(sim_time)),
        ("wall time", f"{_fmt(summary.get('wall_time_s'), '.1f')} s"),
        ("updates completed", _fmt(done)),
        ("updates dropped", dropped),
        ("traffic down / up", " / ".join(_bytes(summary.get(k)) for k in traffic)),
        ("workers", _fmt(summary.get("workers"))),
        ("fedsim version", _fmt(summary.get("fedsim_version"))),
    ]
    return [(k, v) for k, v in rows if v not in ("-", "- (-)", "- s")]


def _sim_time(seconds: Any) -> str:
    """Seconds, and the same in min/h/d when that reads better."""
    text = f"{_fmt(seconds, '.1f')} s"
    if isinstance(seconds, (int, float)) and math.isfinite(seconds) and seconds >= 600:
        text += f" ({duration(seconds)})"
    return text


def _step_cap(scenario: dict[str, Any]) -> int | None:
    """round.max_steps where it caps tau (fixed_window, async max_steps jobs)."""
    cap = _get(scenario, "round", "max_steps")
    policy = _get(scenario, "round", "policy") or "fixed_window"
    job_steps = _get(scenario, "round", "job_steps") or "max_steps"
    caps = policy == "fixed_window" or (policy == "async" and job_steps == "max_steps")
    return cap if caps and isinstance(cap, int) and not isinstance(cap, bool) else None


def _status_lines(summary: dict[str, Any]) -> list[str]:
    """Warnings from summary.json's ``status`` and ``degenerate``."""
    out = []
    if (status := summary.get("status")) and status != "completed":
        out.append(
            f"> **This run is {status}**: the figures show the rounds it "
            "made before it stopped."
        )
    if summary.get("degenerate"):
        out.append(f"> **Degenerate run**: {summary['degenerate']}.")
    return [*out, ""] if out else []


def _links_lines(links: Any) -> list[str]:
    """report.md's "Fleet and data links" tables (summary.json's ``links``):
    the declared targets, the realised rank correlations, the groups."""
    if not isinstance(links, dict):
        return []
    declared = links.get("declared") or {}
    out = ["", "## Fleet and data links", ""]
    out += [f"Declared: `{json.dumps(declared)}`.", ""]
    out += ["| Spearman rank correlation | realised |", "|---|---|"]
    for key, value in (links.get("spearman") or {}).items():
        out.append(f"| {key.replace('_vs_', ' vs ')} | {_fmt(value, '+.3f')} |")
    out += ["", "(-: one side is the same for every device, e.g. always online.)"]
    out += ["", "| group | devices | sample share | median speed (steps/s) "]
    out[-1] += "| online fraction | selections | update share |"
    out.append("|---|---|---|---|---|---|---|")
    for g in links.get("groups") or []:
        cells = [g.get("name"), g.get("devices"), _fmt(g.get("sample_share"), ".3f")]
        cells += [_fmt(g.get("median_speed")), _fmt(g.get("online_fraction"), ".3f")]
        cells += [g.get("selections"), _fmt(g.get("update_share"), ".3f")]
        out.append("| " + " | ".join(_fmt(c) for c in cells) + " |")
    return out


def _links_figure(
    run_dir: Path, summary: dict[str, Any], partition: pa.Table | None, name: str
) -> Figure | None:
    """Samples against speed per device when the run declared links: speeds
    drawn again from the run's resolved scenario.yaml (a pure function of the
    scenario and seed); None when there is nothing to draw."""
    if not isinstance(summary.get("links"), dict) or partition is None:
        return None
    from fedsim.fleet import Fleet
    from fedsim.scenario import ScenarioError, load_scenario

    try:
        sc = load_scenario(run_dir / "scenario.yaml")
        fleet = Fleet.from_spec(sc.fleet, sc.seed)
    except (ScenarioError, OSError, ValueError):
        return None  # e.g. a trace file that moved since the run
    n = np.asarray(partition.column("n_samples"), dtype=np.float64)
    if n.size != fleet.size:
        return None
    title = f"{name}: samples vs speed"
    return plots.figure_links(n, fleet.speed, fleet.group, fleet.group_names, title)


def write_report(run_dir: Path, max_timeline_rounds: int = 20) -> Path:
    """Write the figures and ``report.md`` of ``run_dir`` (a ``fedsim run`` output),
    the timeline showing at most ``max_timeline_rounds`` rounds; return its path.
    Raises ReportError: not a run directory, or a file in it cannot be read."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ReportError(f"{run_dir} is not a run directory: no such directory")
    rounds = _read(run_dir / "rounds.parquet")
    if rounds is None:
        raise ReportError(
            f"{run_dir} is not a run directory: rounds.parquet is missing "
            "(expected the output directory of `fedsim run`)"
        )
    clients = _read(run_dir / "clients.parquet")
    summary = _read_mapping(run_dir / "summary.json", json.loads)
    scenario = _read_mapping(run_dir / "scenario.yaml", yaml.safe_load)
    name = str(scenario.get("name") or summary.get("scenario") or run_dir.name)
    fleet = _get(scenario, "fleet", "groups") or []
    groups = [str(g["name"]) for g in fleet if isinstance(g, dict) and "name" in g]
    figures: list[str] = []

    def save(file: str, fig: Figure) -> None:
        figures.append(file)
        plots._save(fig, run_dir / file)

    initial = summary.get("initial")  # the figure checks what it is
    save("metrics.png", plots.figure_metrics(rounds, f"{name}: test metrics", initial))
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
    partition = _read(run_dir / "partition.parquet")
    if clients is not None and partition is not None:
        fig = plots.figure_weight_share(clients, rounds, partition, name)
        save("weight_share.png", fig)
    if (linked := _links_figure(run_dir, summary, partition, name)) is not None:
        save("links.png", linked)
    lines = [f"# Run report: {name}", "", f"Run directory: `{run_dir.name}`", ""]
    lines += _status_lines(summary)
    lines += ["| key figure | value |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in _summary_rows(summary, scenario, rounds)]
    lines += _links_lines(summary.get("links"))
    if clients is None:
        lines += ["", "clients.parquet is missing: the client figures are empty."]
    for file in figures:
        heading, hint = FIGURES[file]
        lines += ["", f"## {heading}", "", f"![{heading}]({file})", "", hint]
    if (run_dir / "partition.png").exists():
        lines += ["", "## Data partition", "", "![Data partition](partition.png)", ""]
        lines.append("Samples per client by class (partition.parquet holds them all).")
    path = run_dir / REPORT_NAME
    atomic_write_bytes(path, ("\n".join(lines) + "\n").encode())
    return path
