"""``fedsim stress``: sweep a fleet setting, compare aggregators, see who degrades.

For every cell of the sweep grid (the cartesian product of the values of each
swept field), every algorithm and every seed s = 0..N-1, the scenario is
loaded with the cell's values, the algorithm's section (as in
:mod:`fedsim.compare`: ``name`` or ``name:key=value,...``) and ``seed: s``,
and run. Runs are independent: in this process one after another, or in
parallel as Ray tasks (one CPU each, each an in-process ``Simulation``) when
Ray is initialised. Results do not depend on which: every run is a pure
function of its scenario, and rows are put back in grid order.

Sweep values are taken in the order given, mildest first: the report's
degradation table compares the first value of the first swept field with its
last one. A fleet-wide straggler setting is the fleet's ``stragglers``
default (see :class:`fedsim.fleet.FleetSpec`): ``fleet.stragglers.p=0,0.1,0.3,0.5``
changes every group that does not set its own.

Asynchronous server rules (``fedbuff``, ``fedasync``) on a synchronous
scenario run on the asynchronous timeline instead: ``round`` becomes
``{policy: async, max_steps, job_steps, epochs...}`` from the scenario's
round (``job_steps: epochs`` for ``fixed_epochs``, else ``max_steps``), with
``concurrency`` = ``clients_per_round``, and ``rounds`` becomes the number of
server versions that apply as many client updates as the synchronous runs
select (``ceil(rounds * clients_per_round / buffer_size)``). stress.md says so.

Outputs in ``out_dir``:

- ``stress.parquet``: one row per (cell, algorithm, seed): the swept values,
  final and best test accuracy, simulated time to the target accuracy,
  fraction of dropped updates, mean tau and its standard deviation, ...;
- ``stress.md``: the table aggregated over seeds (mean +- sample std), and
  each algorithm's accuracy drop from the mildest to the harshest value,
  with a sentence naming the one that degrades least;
- ``accuracy_vs_time.png`` (one panel per cell, a line per algorithm and
  seed), ``degradation.png`` (final accuracy against the swept value) and
  ``tau_by_group.png`` (local steps per device group, a box per swept value);
- ``runs/<cell>-<algorithm>-seed<s>.parquet`` (each run's rounds) and
  ``taus.parquet`` (every update's tau, device group and drop reason).

Example:
    >>> out = run_stress("scenarios/ci/tiny-synthetic.yaml",
    ...                  {"fleet.stragglers.p": [0.0, 0.5]}, ["fedavg", "fednova"],
    ...                  seeds=1, out_dir="/tmp/stress-doc", workers=0,
    ...                  overrides=["rounds=2"])  # doctest: +SKIP
    >>> sorted(p.name for p in out.iterdir())  # doctest: +SKIP
    ['accuracy_vs_time.png', 'degradation.png', 'runs', 'stress.md', ...]
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from fedsim.compare import (
    RUN_COLUMNS,
    _pm,
    _reject_run_overrides,
    _safe,
    _stats,
    load_variant,
    run_fields,
    run_jobs,
    split_algorithms,
)
from fedsim.results import F64, I64, schema
from fedsim.scenario import ScenarioError, load_scenario, read_yaml

__all__ = [
    "STRESS_SCHEMA",
    "aggregate",
    "degradation",
    "format_markdown",
    "parse_sweep",
    "run_stress",
]

STRESS_SCHEMA = schema(
    (F64, "target_accuracy time_to_target_s sim_time_s"),
    (I64, "updates"),
    (F64, "dropped_fraction tau_mean tau_std wall_time_s"),
    base=pa.schema([pa.field("cell", I64), *RUN_COLUMNS]),
)
TAU_SCHEMA = pa.schema(
    [
        ("cell", pa.int64()),
        ("algorithm", pa.string()),
        ("seed", pa.int64()),
        ("device_group", pa.string()),
        ("tau", pa.int64()),
        ("dropped", pa.bool_()),
        ("drop_reason", pa.string()),
        ("mode", pa.string()),
    ]
)
_TARGET_FRACTION = 0.9  # default target: 90% of the best mean accuracy, mildest cell


# -------------------------------------------------------------------- parsing
def _split_top(text: str) -> list[str]:
    """Split on commas outside brackets and braces."""
    out, depth, cur = [], 0, ""
    for ch in text:
        if ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    out.append(cur)
    return [p.strip() for p in out if p.strip()]


def parse_sweep(text: str) -> tuple[str, list[Any]]:
    """``PATH=v1,v2,...`` into the path and its values (YAML scalars or flow
    collections; commas inside ``[]`` or ``{}`` do not split).

    >>> parse_sweep("fleet.stragglers.p=0,0.1,0.5")
    ('fleet.stragglers.p', [0, 0.1, 0.5])
    >>> parse_sweep("fleet.stragglers.slowdown={dist: fixed, factor: 4},{dist: pareto}")
    ('fleet.stragglers.slowdown', [{'dist': 'fixed', 'factor': 4}, {'dist': 'pareto'}])
    """
    path, eq, values = text.partition("=")
    if not eq or not path.strip():
        raise ScenarioError(f"--sweep {text!r}: expected PATH=v1,v2,...")
    out = []
    for piece in _split_top(values):
        out.append(read_yaml(piece, f"--sweep {path}"))
    if not out:
        raise ScenarioError(f"--sweep {path}: no values")
    return path.strip(), out


def _value_text(value: Any) -> str:
    """A value as override text (JSON is YAML, and keeps strings quoted)."""
    return json.dumps(value)


def _label(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


# ------------------------------------------------------------------ one run
def _run_one(
    scenario_path: str,
    overrides: list[str],
    cell_index: int,
    cell: dict[str, Any],
    label: str,
    seed: int,
) -> dict[str, Any]:
    """Run one (cell, algorithm, seed) in this process; return its record."""
    from fedsim.runtime import run_scenario

    sc, mode = load_variant(scenario_path, label, seed, overrides, cell)
    result = run_scenario(sc, workers=0)  # keeps the rows up to a divergence
    if result.status == "interrupted":
        raise KeyboardInterrupt  # stop the sweep, not just this run
    rows, clients = result.rows, result.clients
    diverged = result.status == "diverged"
    wall = result.wall_time_s
    acc = [float(r["test_accuracy"]) for r in rows]
    finite = [a for a in acc if math.isfinite(a)]
    done = [c for c in clients if not c["dropped"]]
    taus = np.array([c["tau"] for c in done], dtype=np.float64)
    selected = sum(int(r["n_selected"]) for r in rows)
    dropped = sum(int(r["n_dropped"]) for r in rows)
    record = {
        "cell": cell_index,
        **run_fields(label, sc, mode, seed, len(rows), diverged),
        "final_accuracy": finite[-1] if finite else math.nan,
        "best_accuracy": max(finite) if finite else math.nan,
        "target_accuracy": math.nan,
        "time_to_target_s": None,
        "sim_time_s": float(rows[-1]["sim_time"]) if rows else 0.0,
        "updates": len(done),
        "dropped_fraction": dropped / selected if selected else math.nan,
        "tau_mean": float(taus.mean()) if taus.size else math.nan,
        "tau_std": float(taus.std()) if taus.size else math.nan,
        "wall_time_s": wall,
    }
    curve = {
        "sim_time": [float(r["sim_time"]) for r in rows],
        "test_accuracy": acc,
    }
    tau_rows = [
        {
            "cell": cell_index,
            "algorithm": label,
            "seed": seed,
            "device_group": str(c["device_group"]),
            "tau": int(c["tau"]),
            "dropped": bool(c["dropped"]),
            "drop_reason": str(c.get("drop_reason") or ""),
            "mode": mode,
        }
        for c in clients
    ]
    classes = result.data.num_classes if result.data is not None else 0
    chance = 1.0 / classes if classes else 0.0
    return {
        "record": record,
        "curve": curve,
        "rounds": rows,
        "taus": tau_rows,
        "chance": chance,
    }


# -------------------------------------------------------------- the analysis
def _time_to(curve: Mapping[str, Sequence[float]], target: float) -> float | None:
    for t, a in zip(curve["sim_time"], curve["test_accuracy"], strict=True):
        if math.isfinite(a) and a >= target:
            return float(t)
    return None


def _default_target(records: Sequence[dict[str, Any]]) -> float | None:
    """90% of the best per-algorithm mean best accuracy in the mildest cell."""
    mild = [r for r in records if r["cell"] == 0]
    means = []
    for label in dict.fromkeys(r["algorithm"] for r in mild):
        m, _ = _stats([r["best_accuracy"] for r in mild if r["algorithm"] == label])
        if math.isfinite(m):
            means.append(m)
    if not means:
        return None
    return math.floor(_TARGET_FRACTION * max(means) * 200) / 200  # to 0.5 points


def aggregate(
    records: Sequence[dict[str, Any]], cells: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """One row per (cell, algorithm), in grid order: mean and std over seeds."""
    table = []
    labels = list(dict.fromkeys(r["algorithm"] for r in records))
    for ci, cell in enumerate(cells):
        for label in labels:
            rs = [r for r in records if r["cell"] == ci and r["algorithm"] == label]
            if not rs:
                continue
            row: dict[str, Any] = {"cell": ci, **cell, "algorithm": label}
            row["seeds"] = len(rs)
            row["mode"] = rs[0]["mode"]
            for key in (
                "final_accuracy",
                "best_accuracy",
                "dropped_fraction",
                "tau_mean",
                "tau_std",
                "sim_time_s",
            ):
                row[key], row[key + "_sd"] = _stats([r[key] for r in rs])
            hit = [
                r["time_to_target_s"] for r in rs if r["time_to_target_s"] is not None
            ]
            row["reached"] = len(hit)
            row["time_to_target_s"], row["time_to_target_s_sd"] = _stats(hit)
            row["diverged"] = sum(bool(r["diverged"]) for r in rs)
            table.append(row)
    return table


def degradation(
    records: Sequence[dict[str, Any]],
    cells: Sequence[Mapping[str, Any]],
    path: str,
) -> list[dict[str, Any]]:
    """Per algorithm: mean final accuracy at each value of ``path`` (averaged
    over the other swept fields) and the drop from the first value to the
    last, paired by seed (mean and sample std over seeds), sorted by drop."""
    values = list(dict.fromkeys(_label(c[path]) for c in cells))
    out = []
    for label in dict.fromkeys(r["algorithm"] for r in records):
        rs = [r for r in records if r["algorithm"] == label]
        by_value: dict[str, dict[int, list[float]]] = {v: {} for v in values}
        for r in rs:
            v = _label(cells[r["cell"]][path])
            by_value[v].setdefault(r["seed"], []).append(r["final_accuracy"])
        acc = [
            _stats([x for xs in by_value[v].values() for x in xs])[0] for v in values
        ]
        first, last = by_value[values[0]], by_value[values[-1]]
        paired = [
            float(np.mean(first[s])) - float(np.mean(last[s]))
            for s in sorted(set(first) & set(last))
        ]
        drop, drop_sd = _stats(paired)
        out.append(
            {
                "algorithm": label,
                "values": values,
                "accuracy": acc,
                "drop": drop,
                "drop_sd": drop_sd,
                "seeds": len(paired),
            }
        )
    return sorted(out, key=lambda d: (not math.isfinite(d["drop"]), d["drop"]))


def _points(drop: float) -> float:
    """An accuracy drop as a change in points, without a "-0.0"."""
    return round(-drop * 100, 1) + 0.0


def _verdict(deg: Sequence[dict[str, Any]], path: str, chance: float = 0.0) -> str:
    finite = [d for d in deg if math.isfinite(d["drop"])]
    if not finite:
        return "No algorithm has a finite accuracy at both ends of the sweep."
    # An algorithm that never learns "degrades least" trivially: only those
    # clearly above chance in the mildest setting can lead.
    floor = chance + max(0.05, 0.1 * (1 - chance)) if chance > 0 else -math.inf
    ok = [d for d in finite if d["accuracy"][0] >= floor]
    if not ok:
        return (
            f"No algorithm learned clearly beyond chance ({chance * 100:.0f}%) in "
            "the mildest setting, so none is named: check the scenario (rounds, "
            "learning rate) before reading the sweep."
        )
    first, last = ok[0]["values"][0], ok[0]["values"][-1]
    if len(ok[0]["values"]) < 2:
        return f"Only one value of `{path}` was run: nothing to compare."
    best = ok[0]
    others = ", ".join(
        f"{_points(d['drop']):+.1f} for {d['algorithm']}" for d in ok[1:]
    )
    change = _points(best["drop"])
    text = (
        f"As `{path}` goes from {first} to {last}, **{best['algorithm']} degrades "
        f"least**: its final accuracy changes by {change:+.1f} points "
        f"({best['accuracy'][0] * 100:.1f}% -> {best['accuracy'][-1] * 100:.1f}%)"
    )
    text += f", against {others}." if others else "."
    harsh = [d for d in ok if math.isfinite(d["accuracy"][-1])]
    if harsh:
        top = max(harsh, key=lambda d: d["accuracy"][-1])
        text += (
            f" At {last}, the most accurate is {top['algorithm']} "
            f"({top['accuracy'][-1] * 100:.1f}%)"
        )
        text += (
            "."
            if top is best
            else ("; a small drop from a low start is no win, so read both columns.")
        )
    if len(ok) > 1:
        gap = ok[1]["drop"] - best["drop"]
        noise = max(best["drop_sd"], ok[1]["drop_sd"])
        if best["seeds"] > 1 and gap <= noise:
            text += (
                f" The lead over {ok[1]['algorithm']} ({gap * 100:.1f} points) is "
                f"within the spread over seeds ({noise * 100:.1f} points): "
                "run more seeds before reading much into it."
            )
        elif best["seeds"] <= 1:
            text += " (One seed: no spread to judge the gaps by.)"
    return text


def format_markdown(
    table: Sequence[dict[str, Any]],
    deg: Sequence[dict[str, Any]],
    paths: Sequence[str],
    title: str,
    notes: Sequence[str] = (),
    target: float | None = None,
    chance: float = 0.0,
) -> str:
    """stress.md: the aggregated table, the degradation table and the verdict
    (``chance``: the accuracy of guessing, 1 / classes; 0 when not a
    classification task)."""
    lines = [f"# {title}", ""]
    lines += [f"- {n}" for n in notes]
    lines += ["", "## Which aggregator degrades least?", ""]
    if deg:
        lines.append(_verdict(deg, paths[0], chance))
        lines.append("")
        values = deg[0]["values"]
        head = " | ".join(f"{paths[0]} = {v}" for v in values)
        lines.append(f"| algorithm | {head} | drop (points, first -> last) |")
        lines.append("|---" * (len(values) + 2) + "|")
        for d in deg:
            accs = " | ".join(
                "-" if not math.isfinite(a) else f"{a * 100:.1f}" for a in d["accuracy"]
            )
            drop = _pm(d["drop"], d["drop_sd"], 100, 1)
            lines.append(f"| {d['algorithm']} | {accs} | {drop} |")
        lines.append("")
        lines.append(
            "Final test accuracy (%), mean over seeds; the drop is paired by seed "
            "(same fleet and data), mean ± sample std."
        )
    t_head = (
        f"time to {target * 100:g}% (s)" if target is not None else "time to target"
    )
    lines += ["", "## All cells (mean ± sample std over seeds)", ""]
    cols = " | ".join(paths)
    lines.append(
        f"| {cols} | algorithm | final acc % | best acc % | {t_head} "
        "| dropped % | tau mean | tau sd |"
    )
    lines.append("|---" * (len(paths) + 7) + "|")
    for r in table:
        vals = " | ".join(_label(r[p]) for p in paths)
        n = r["seeds"]
        if target is None:
            t = "-"
        elif r["reached"]:
            t = _pm(r["time_to_target_s"], r["time_to_target_s_sd"], digits=0)
            t += "" if r["reached"] == n else f" ({r['reached']}/{n})"
        else:
            t = "not reached"
        alg = r["algorithm"] + (" (async)" if r["mode"] == "async" else "")
        if r["diverged"]:
            alg += f" [diverged {r['diverged']}/{n}]"
        lines.append(
            f"| {vals} | {alg} "
            f"| {_pm(r['final_accuracy'], r['final_accuracy_sd'], 100, 1)} "
            f"| {_pm(r['best_accuracy'], r['best_accuracy_sd'], 100, 1)} | {t} "
            f"| {_pm(r['dropped_fraction'], r['dropped_fraction_sd'], 100, 1)} "
            f"| {_pm(r['tau_mean'], r['tau_mean_sd'], digits=1)} "
            f"| {_pm(r['tau_std'], r['tau_std_sd'], digits=1)} |"
        )
    lines += [
        "",
        "tau sd is each run's spread of local steps over its completed updates "
        "(then averaged over seeds); dropped % counts selected updates that did "
        "not count (late, offline, no time, ...).",
        "",
        "![final accuracy against the swept value](degradation.png)",
        "",
        "![accuracy against simulated time](accuracy_vs_time.png)",
        "",
        "![local steps per device group](tau_by_group.png)",
        "",
    ]
    return "\n".join(lines)


# ------------------------------------------------------------------- plots
def _colors(n: int) -> list[Any]:
    from matplotlib import colormaps

    cmap = colormaps["tab10"]
    return [cmap(i % 10) for i in range(n)]


def plot_accuracy(
    results: Sequence[dict[str, Any]],
    cells: Sequence[Mapping[str, Any]],
    path: Path,
) -> Path:
    """Test accuracy against simulated time: a panel per cell, a colour per
    algorithm, a line per seed."""
    from fedsim.plots import _new_figure, _save

    labels = list(dict.fromkeys(r["record"]["algorithm"] for r in results))
    colors = dict(zip(labels, _colors(len(labels)), strict=True))
    n = len(cells)
    ncols = min(n, 4)
    nrows = math.ceil(n / ncols)
    fig = _new_figure(3.6 * ncols + 1, 3.0 * nrows + 0.6)
    axes = np.atleast_1d(fig.subplots(nrows, ncols, squeeze=False)).reshape(-1)
    for ci, cell in enumerate(cells):
        ax = axes[ci]
        shown = set()
        for res in results:
            rec = res["record"]
            if rec["cell"] != ci:
                continue
            x = np.array(res["curve"]["sim_time"], dtype=float)
            y = np.array(res["curve"]["test_accuracy"], dtype=float)
            ok = np.isfinite(x) & np.isfinite(y)
            label = rec["algorithm"] if rec["algorithm"] not in shown else None
            shown.add(rec["algorithm"])
            ax.plot(
                x[ok],
                y[ok],
                color=colors[rec["algorithm"]],
                linewidth=1.2,
                alpha=0.85,
                label=label,
            )
        ax.set_title(
            ", ".join(f"{p} = {_label(v)}" for p, v in cell.items()), fontsize=9
        )
        ax.set_xlabel("simulated time (s)")
        ax.set_ylabel("test accuracy")
        ax.grid(alpha=0.3)
    for ax in axes[n:]:
        ax.set_visible(False)
    axes[0].legend(fontsize=8, loc="lower right")
    fig.suptitle("test accuracy against simulated time (one line per seed)")
    return _save(fig, path)


def plot_degradation(
    deg: Sequence[dict[str, Any]],
    records: Sequence[dict[str, Any]],
    cells: Sequence[Mapping[str, Any]],
    path_name: str,
    path: Path,
) -> Path:
    """Final accuracy (mean and seed spread) against the first swept field."""
    from fedsim.plots import _new_figure, _save

    fig = _new_figure(6.5, 4.2)
    ax = fig.subplots()
    labels = list(dict.fromkeys(r["algorithm"] for r in records))
    colors = dict(zip(labels, _colors(len(labels)), strict=True))
    values = deg[0]["values"] if deg else []
    xs = np.arange(len(values))
    for d in deg:
        lows, highs = [], []
        for v in values:
            acc = [
                r["final_accuracy"]
                for r in records
                if r["algorithm"] == d["algorithm"]
                and _label(cells[r["cell"]][path_name]) == v
                and math.isfinite(r["final_accuracy"])
            ]
            lows.append(min(acc) if acc else math.nan)
            highs.append(max(acc) if acc else math.nan)
        c = colors[d["algorithm"]]
        ax.plot(xs, d["accuracy"], marker="o", color=c, label=d["algorithm"])
        ax.fill_between(xs, lows, highs, color=c, alpha=0.15)
    ax.set_xticks(xs, values)
    ax.set_xlabel(path_name)
    ax.set_ylabel("final test accuracy")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(
        "final accuracy as the setting gets harsher (band: min-max over seeds)"
    )
    return _save(fig, path)


def plot_taus(
    taus: Sequence[dict[str, Any]],
    cells: Sequence[Mapping[str, Any]],
    path_name: str,
    path: Path,
) -> Path:
    """Local steps of completed updates per device group, one box per value
    of the first swept field (pooled over algorithms and seeds; asynchronous
    runs, whose jobs all do the same steps, are left out when there are
    synchronous ones)."""
    from fedsim.plots import _new_figure, _save

    sync = [t for t in taus if t.get("mode", "sync") == "sync"]
    taus = sync or list(taus)
    groups = list(dict.fromkeys(t["device_group"] for t in taus))
    values = list(dict.fromkeys(_label(c[path_name]) for c in cells))
    colors = _colors(len(values))
    fig = _new_figure(max(6.0, 1.5 + 0.55 * len(groups) * len(values)), 4.4)
    ax = fig.subplots()
    width = 0.8 / max(1, len(values))
    for vi, v in enumerate(values):
        data = []
        for g in groups:
            data.append(
                [
                    t["tau"]
                    for t in taus
                    if t["device_group"] == g
                    and not t["dropped"]
                    and _label(cells[t["cell"]][path_name]) == v
                ]
            )
        pos = np.arange(len(groups)) + (vi - (len(values) - 1) / 2) * width
        keep = [i for i, d in enumerate(data) if d]
        if not keep:
            continue
        box = ax.boxplot(
            [data[i] for i in keep],
            positions=pos[keep],
            widths=width * 0.85,
            patch_artist=True,
            showfliers=False,
            medianprops={"color": "black"},
        )
        for patch in box["boxes"]:
            patch.set_facecolor(colors[vi])
            patch.set_alpha(0.6)
        ax.plot(
            [], [], color=colors[vi], linewidth=6, alpha=0.6, label=f"{path_name} = {v}"
        )
    ax.set_xticks(np.arange(len(groups)), groups)
    ax.set_xlabel("device group")
    ax.set_ylabel("local steps tau of completed updates")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(
        "tau per device group (synchronous runs, pooled over algorithms and seeds)"
    )
    return _save(fig, path)


# --------------------------------------------------------------- the driver
def run_stress(
    scenario_path: str | Path,
    sweep: Mapping[str, Sequence[Any]],
    algorithms: Sequence[str],
    seeds: int = 3,
    out_dir: str | Path | None = None,
    workers: int | None = None,
    target_accuracy: float | None = None,
    overrides: Sequence[str] = (),
    progress: Callable[[dict[str, Any]], None] | None = None,
) -> Path:
    """Run the stress grid and write its report; return the report directory.

    Args:
        scenario_path: a synchronous scenario file.
        sweep: field path -> values, mildest first (``{"fleet.stragglers.p":
            [0, 0.1, 0.3, 0.5]}``); several paths make a grid.
        algorithms: ``name`` or ``name:key=value,...`` per algorithm.
        seeds: seeds 0..seeds-1 per (cell, algorithm).
        out_dir: the report directory (default ``results/stress-<name>-<time>``).
        workers: 0 runs everything in this process, one run after another;
            None uses Ray tasks when Ray is initialised (else this process);
            n >= 1 keeps at most n Ray tasks in flight (Ray must be up).
        target_accuracy: for the simulated time to reach it (a fraction);
            default: 90% of the best algorithm's mean best accuracy in the
            mildest cell, rounded down to half a point.
        overrides: ``path=value`` for every run (not ``algorithm`` or
            ``seed``, which this sets).
        progress: called with each run's record as it finishes.

    Raises:
        ScenarioError: if the scenario, a swept value or an algorithm is
            invalid (every combination is validated before anything runs).
    """
    from fedsim.results import default_run_dir

    if seeds < 1:
        raise ValueError("seeds must be >= 1")
    if not algorithms:
        raise ValueError("no algorithms given")
    if not sweep or any(len(v) == 0 for v in sweep.values()):
        raise ValueError("the sweep needs at least one field with at least one value")
    algorithms = list(
        dict.fromkeys(a for label in algorithms for a in split_algorithms(label))
    )
    _reject_run_overrides(overrides, "stress")
    paths = list(sweep)
    cells = [
        dict(zip(paths, combo, strict=True))
        for combo in itertools.product(*(list(sweep[p]) for p in paths))
    ]
    base = load_scenario(scenario_path, list(overrides))
    for cell in cells:  # every run must validate before any runs
        for label in algorithms:
            load_variant(scenario_path, label, 0, list(overrides), cell)
    out = (
        Path(out_dir) if out_dir is not None else default_run_dir(f"stress-{base.name}")
    )
    (out / "runs").mkdir(parents=True, exist_ok=True)
    jobs = [
        (str(scenario_path), list(overrides), ci, cell, label, seed)
        for ci, cell in enumerate(cells)
        for label in algorithms
        for seed in range(seeds)
    ]
    results = _run_jobs(jobs, workers, out, cells, paths, target_accuracy, progress)
    records, target = _write_tables(out, results, cells, paths, target_accuracy)
    notes = _notes(
        scenario_path,
        sweep,
        algorithms,
        seeds,
        overrides,
        target,
        target_accuracy is None,
        results,
    )
    _write_report(out, results, records, cells, paths, scenario_path, notes, target)
    return out


def _run_jobs(
    jobs: list[tuple[Any, ...]],
    workers: int | None,
    out: Path,
    cells: list[dict[str, Any]],
    paths: list[str],
    target_accuracy: float | None,
    progress: Callable[[dict[str, Any]], None] | None,
) -> list[dict[str, Any]]:
    """Run every (cell, algorithm, seed); write each run's rounds and the
    tables so far as runs finish; return the results in job order."""
    from fedsim.results import ROUND_SCHEMA, write_table

    order = {(j[2], j[4], j[5]): i for i, j in enumerate(jobs)}
    results: list[dict[str, Any]] = []

    def finish(res: dict[str, Any]) -> None:
        rec = res["record"]
        name = f"{rec['cell']:02d}-{_safe(rec['algorithm'])}-seed{rec['seed']}.parquet"
        write_table(out / "runs" / name, res["rounds"], ROUND_SCHEMA)
        results.append(res)
        results.sort(
            key=lambda r: order[
                (r["record"]["cell"], r["record"]["algorithm"], r["record"]["seed"])
            ]
        )
        _write_tables(out, results, cells, paths, target_accuracy)
        if progress is not None:
            progress(rec)

    run_jobs(_run_one, jobs, workers, finish)
    return results


def _write_report(
    out: Path,
    results: list[dict[str, Any]],
    records: list[dict[str, Any]],
    cells: list[dict[str, Any]],
    paths: list[str],
    scenario_path: str | Path,
    notes: list[str],
    target: float | None,
) -> None:
    """stress.md, taus.parquet and the three figures."""
    from fedsim.results import atomic_write_bytes, write_table

    deg = degradation(records, cells, paths[0])
    text = format_markdown(
        aggregate(records, cells),
        deg,
        paths,
        f"stress: {Path(scenario_path).stem}",
        notes,
        target,
        chance=max((r.get("chance", 0.0) for r in results), default=0.0),
    )
    atomic_write_bytes(out / "stress.md", text.encode())
    taus = [t for r in results for t in r["taus"]]
    write_table(out / "taus.parquet", taus, TAU_SCHEMA)
    plot_accuracy(results, cells, out / "accuracy_vs_time.png")
    plot_degradation(deg, records, cells, paths[0], out / "degradation.png")
    plot_taus(taus, cells, paths[0], out / "tau_by_group.png")


def _write_tables(
    out: Path,
    results: list[dict[str, Any]],
    cells: Sequence[Mapping[str, Any]],
    paths: Sequence[str],
    target_accuracy: float | None,
) -> tuple[list[dict[str, Any]], float | None]:
    """stress.parquet with times to target filled in (rewritten as runs end)."""
    from fedsim.results import write_table

    records = [dict(r["record"]) for r in results]
    target = (
        target_accuracy if target_accuracy is not None else _default_target(records)
    )
    for rec, res in zip(records, results, strict=True):
        rec["target_accuracy"] = math.nan if target is None else target
        rec["time_to_target_s"] = (
            None if target is None else _time_to(res["curve"], target)
        )
    table_schema = _schema(cells, paths)

    def value(p: str, v: Any) -> Any:
        return v if table_schema.field(p).type == pa.float64() else _label(v)

    rows = [{**{p: value(p, cells[r["cell"]][p]) for p in paths}, **r} for r in records]
    write_table(out / "stress.parquet", rows, table_schema)
    return records, target


def _schema(cells: Sequence[Mapping[str, Any]], paths: Sequence[str]) -> pa.Schema:
    fields = []
    for p in paths:
        vals = [c[p] for c in cells]
        numeric = all(
            isinstance(v, int | float) and not isinstance(v, bool) for v in vals
        )
        fields.append((p, pa.float64() if numeric else pa.string()))
    return pa.schema([*fields, *STRESS_SCHEMA])


def _notes(
    scenario_path: str | Path,
    sweep: Mapping[str, Sequence[Any]],
    algorithms: Sequence[str],
    seeds: int,
    overrides: Sequence[str],
    target: float | None,
    target_is_default: bool,
    results: Sequence[dict[str, Any]],
) -> list[str]:
    notes = [
        f"scenario: `{scenario_path}`",
        "sweep (mildest first): "
        + "; ".join(
            f"`{p}` = {', '.join(_label(v) for v in vs)}" for p, vs in sweep.items()
        ),
        f"algorithms: {', '.join(algorithms)}; seeds: 0..{seeds - 1}",
        f"overrides: {', '.join(f'`{o}`' for o in overrides) or 'none'}",
    ]
    if target is not None:
        how = (
            "90% of the best algorithm's mean best accuracy in the mildest cell"
            if target_is_default
            else "given"
        )
        notes.append(f"target accuracy: {target * 100:g}% ({how})")
    if any(r["record"]["mode"] == "async" for r in results):
        notes.append(
            "asynchronous rules ran on the asynchronous timeline (concurrency = "
            "clients per round; as many applied updates as the synchronous runs "
            "select; each job does the round's max_steps, or its epochs)"
        )
    wall = sum(r["record"]["wall_time_s"] for r in results)
    notes.append(f"{len(results)} runs, {wall:.0f} s of compute in total")
    return notes
