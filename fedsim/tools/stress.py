"""``fedsim stress``: sweep a fleet setting, compare aggregators, see who degrades.

Every cell of the sweep grid (the product of the swept fields' values),
algorithm (as in :mod:`fedsim.tools.compare`) and seed 0..N-1 is one run. Values go
mildest first: the degradation table compares the first swept field's first
value with its last. Usage, outputs and an example: docs/fleets.md.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NotRequired, TypedDict, TypeVar

import numpy as np
import pyarrow as pa

from fedsim.results import BOOL, F64, I64, STR, schema
from fedsim.rows import Row, number, text, whole
from fedsim.tools.compare import (
    PAIRED_METRICS,
    PAIRED_SCHEMA,
    RUN_COLUMNS,
    TOOL_FIELDS,
    Pairing,
    _cell,
    _colors,
    _column,
    _ge,
    _pm,
    _pm_of,
    _reject_run_overrides,
    _spread,
    _stats,
    canonical_label,
    censored,
    check_variants,
    file_stems,
    format_paired,
    interval_for,
    load_variant,
    resolve_baseline,
    round_policy,
    run_batches,
    run_fields,
    split_algorithms,
    to_target,
    tool_field,
    undecided,
)

if TYPE_CHECKING:
    from matplotlib.axes import Axes

    from fedsim.tools.plots import RGBA
from fedsim.scenario import ScenarioError, dump_scenario, load_scenario, read_yaml
from fedsim.tools.stats import (
    paired_differences,
    paired_interval,
    seeds_needed,
)

# What stress.md pairs each arm on, against the baseline, in every cell.
# (time to target only where it is not rounds x a fixed window: paired_table)
STRESS_PAIRED = tuple(
    m
    for m in PAIRED_METRICS
    if m.key in ("final_accuracy", "rounds_to_target", "time_to_target_s")
)
_TIME = next(m for m in PAIRED_METRICS if m.key == "time_to_target_s")

STRESS_SCHEMA = schema(
    (F64, "target_accuracy time_to_target_s sim_time_s best_fed_accuracy"),
    (I64, "updates rounds_to_target"),
    (F64, "dropped_fraction tau_mean tau_std wall_time_s"),
    (STR, "policy"),
    (F64, "window_s"),
    base=pa.schema([pa.field("cell", I64), *RUN_COLUMNS]),
)
TAU_SCHEMA = schema(
    (I64, "cell"),
    (STR, "algorithm"),
    (I64, "seed"),
    (STR, "device_group"),
    (I64, "tau"),
    (BOOL, "dropped"),
    (STR, "drop_reason mode"),
)
_DEFAULT_TARGET = (
    "90% of the best algorithm's mean best accuracy on the clients' held-out "
    "rows (federated evaluation) in the mildest cell"
)

# One cell of the grid: each swept field path -> its value there (a YAML
# scalar or flow collection, as --sweep gave it).
Cell = Mapping[str, object]
# A row that names its ``cell`` (a record, a taus row), kept as its own type.
_R = TypeVar("_R", bound=Row)


class RunOutput(TypedDict):
    """What :func:`_run_one` returns for one (cell, algorithm, seed).

    Attributes:
        record: its stress.parquet row (less the time to target).
        rounds: rounds.parquet's rows.
        taus: taus.parquet's rows (one per client update).
        chance: 1 / classes (0 when not classifying): the verdict's floor.
    """

    record: dict[str, object]
    rounds: list[dict[str, object]]
    taus: list[dict[str, object]]
    chance: float


class Degradation(TypedDict):
    """One algorithm's row of :func:`degradation`.

    Attributes:
        algorithm: its label.
        values: the swept field's value labels, in sweep order.
        accuracy: mean final accuracy at each value (NaN where none).
        seeds: how many seeds ran at both ends.
        drop: mean paired drop from the first value to the last.
        drop_sd: its sample std over seeds.
        drops: each seed's drop.
        drop_lo: the 95% Student t interval's lower end.
        drop_hi: its upper end.

    :func:`degradation` sets every key; the readers take a row without the
    per-seed drops and interval too (a row written by hand, as in tests).
    """

    algorithm: str
    values: list[str]
    accuracy: list[float]
    seeds: int
    drop: float
    drop_sd: float
    drops: NotRequired[dict[int, float]]
    drop_lo: NotRequired[float]
    drop_hi: NotRequired[float]


def _split_top(text: str) -> list[str]:
    """Split on commas outside brackets and braces, so that a swept value
    may be a flow collection (``{dist: fixed, factor: 4}``); pieces are
    stripped and empty ones dropped (a trailing comma is harmless)."""
    pieces, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += (ch in "[{") - (ch in "]}")
        if ch == "," and depth == 0:
            pieces.append(text[start:i])
            start = i + 1
    pieces.append(text[start:])
    return [p.strip() for p in pieces if p.strip()]


def parse_sweep(text: str) -> tuple[str, list[object]]:
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
    out = [read_yaml(piece, f"--sweep {path}") for piece in _split_top(values)]
    if not out:
        raise ScenarioError(f"--sweep {path}: no values")
    return path.strip(), out


def check_sweep_fields(paths: Sequence[str]) -> None:
    """Refuse to sweep a field every run's own value replaces (the seed, the
    algorithm, ...: :data:`fedsim.tools.compare.TOOL_FIELDS`), or the name, which
    changes no result: the cells would differ in name only.

    Raises:
        ScenarioError: naming the field and the option to use instead.
    """
    for path in paths:
        field = tool_field(path)
        if field is not None:
            raise ScenarioError(f"--sweep {path}: stress {TOOL_FIELDS[field]}")
        if path == "name":
            raise ScenarioError(
                "--sweep name: the name changes no result; sweep a setting"
            )


def _values(cells: Sequence[Cell], path: str) -> list[str]:
    """The labels of ``path``'s values over the grid, in sweep order (each
    once, although a grid repeats it for every value of the other fields)."""
    return list(dict.fromkeys(_cell(c[path]) for c in cells))


def _at(rows: Sequence[_R], cells: Sequence[Cell], path: str, value: str) -> list[_R]:
    """The ``rows`` (each naming its ``cell``) where ``path``'s label is ``value``."""
    return [r for r in rows if _cell(cells[whole(r["cell"])][path]) == value]


def _run_one(
    scenario_path: str,
    overrides: list[str],
    cell_index: int,
    cell: Cell,
    label: str,
    seed: int,
) -> RunOutput:
    """Run one (cell, algorithm, seed) in this process (a Ray task when the
    sweep runs on Ray: it must be a plain module-level function).

    Returns:
        ``record`` (its stress.parquet row, less the time to target, which
        needs every run of the mildest cell), ``rounds`` (rounds.parquet's
        rows), ``taus`` (one row per client update, for tau_by_group.png)
        and ``chance`` (1 / classes: the verdict's floor).

    Raises:
        KeyboardInterrupt: the run was interrupted; the whole sweep stops,
            with the tables of the runs that finished already written.
    """
    from fedsim.runtime import run_scenario
    from fedsim.tools.tracking import with_round_bytes

    sc, mode = load_variant(scenario_path, label, seed, overrides, cell)
    result = run_scenario(sc, workers=0)  # keeps the rows up to a divergence
    result.reraise_failure()  # a plug-in that failed stops it all
    if result.status == "interrupted":
        raise KeyboardInterrupt  # stop the sweep, not just this run
    rows = with_round_bytes(result.rows, result.clients)  # the trackers' bytes
    diverged = result.status == "diverged"
    record = {
        "cell": cell_index,
        **run_fields(label, sc, mode, seed, len(rows), diverged),
        **_run_figures(rows, result.clients),
        "wall_time_s": result.wall_time_s,
        **round_policy(sc),
    }
    run = {"cell": cell_index, "algorithm": label, "seed": seed, "mode": mode}
    classes = result.data.num_classes if result.data is not None else 0
    chance = 1.0 / classes if classes else 0.0
    taus = _tau_rows(run, result.clients)
    return RunOutput(record=record, rounds=rows, taus=taus, chance=chance)


def _run_figures(
    rows: Sequence[Row], clients: Sequence[Row]
) -> dict[str, float | int | None]:
    """A run's accuracies, simulated time, updates, dropped share and tau
    spread, as stress.parquet holds them; NaN where a run has none (no
    evaluated round, no update), never an exception on an empty run."""
    finite = [a for a in _column(rows, "test_accuracy") if math.isfinite(a)]
    held = [number(a) for r in rows if (a := r.get("fed_accuracy")) is not None]
    done = [c for c in clients if not c["dropped"]]
    taus = np.array(_column(done, "tau"), dtype=np.float64)
    selected = sum(whole(r["n_selected"], "n_selected") for r in rows)
    dropped = sum(whole(r["n_dropped"], "n_dropped") for r in rows)
    return {
        "final_accuracy": finite[-1] if finite else math.nan,
        "best_accuracy": max(finite, default=math.nan),
        # None (null), not NaN, without held-out rows: rows stay comparable
        "best_fed_accuracy": max(filter(math.isfinite, held), default=None),
        "sim_time_s": number(rows[-1]["sim_time"], "sim_time") if rows else 0.0,
        "updates": taus.size,
        "dropped_fraction": dropped / selected if selected else math.nan,
        # numpy warns on the mean of nothing; a run without updates has NaN
        "tau_mean": float(taus.mean()) if taus.size else math.nan,
        "tau_std": float(taus.std()) if taus.size else math.nan,
    }


def _tau_rows(run: Row, clients: Sequence[Row]) -> list[dict[str, object]]:
    """taus.parquet's rows of one run: ``run`` (cell, algorithm, seed, mode)
    with each client row's group, tau and drop (dropped rows too: the figure
    leaves them out, a reader of the table may not)."""
    return [
        {
            **run,
            "device_group": str(c["device_group"]),
            "tau": whole(c["tau"], "tau"),
            "dropped": bool(c["dropped"]),
            "drop_reason": str(c.get("drop_reason") or ""),
        }
        for c in clients
    ]


def _default_target(records: Sequence[Row]) -> float | None:
    """90% of the best per-algorithm mean best held-out accuracy in the
    mildest cell, rounded down to half a point; None when no run there
    evaluated held-out rows (federated evaluation: ``eval.federated_every``
    with ``data.client_test_fraction``).

    The mildest cell sets the bar because every harsher cell is meant to be
    compared against what the fleet allows at its best; 90% of the best
    algorithm's *best* (not final) accuracy keeps the target reachable by
    the others in that cell, so times to target can be compared at all. The
    best is taken on held-out rows, never on the test set the times to
    target are then measured on: a target chosen on the test set would be
    selected on the data it reports.
    """
    mild = [r for r in records if r["cell"] == 0]
    means = [
        _stats([r.get("best_fed_accuracy") for r in mild if r["algorithm"] == label])[0]
        for label in dict.fromkeys(r["algorithm"] for r in mild)
    ]
    best = max((m for m in means if math.isfinite(m)), default=None)
    return None if best is None else math.floor(0.9 * best * 200) / 200


def aggregate(records: Sequence[Row], cells: Sequence[Cell]) -> list[dict[str, object]]:
    """One row per (cell, algorithm), in grid order: mean and std over seeds.

    Args:
        records: stress.parquet's rows, with times to target filled in.
        cells: the grid; each row also carries its cell's swept values.

    Returns:
        Rows for stress.md's "All cells" table: ``reached`` counts the seeds
        that reached the target, ``diverged`` those that diverged.
    """
    table = []
    labels = list(dict.fromkeys(text(r["algorithm"]) for r in records))
    keys = "final_accuracy dropped_fraction tau_mean tau_std sim_time_s"
    for (ci, cell), label in itertools.product(enumerate(cells), labels):
        rs = [r for r in records if r["cell"] == ci and r["algorithm"] == label]
        if rs:
            table.append({"cell": ci, **cell, **_arm_row(label, rs, keys)})
    return table


def _arm_row(label: str, rs: Sequence[Row], keys: str) -> dict[str, object]:
    """One arm's columns of an "All cells" row: its seeds, mode, the mean
    and sample std of each of ``keys`` and of the time to target, and how
    many seeds reached the target and diverged."""
    at_length = [{_TIME.key: censored(r, _TIME)} for r in rs]  # misses censored
    return {
        "algorithm": label,
        "seeds": len(rs),
        "mode": rs[0]["mode"],
        **_spread(rs, keys, "_sd"),
        **_spread(at_length, _TIME.key, "_sd"),
        "reached": sum(r["time_to_target_s"] is not None for r in rs),
        "diverged": sum(bool(r["diverged"]) for r in rs),
    }


def degradation(
    records: Sequence[Row],
    cells: Sequence[Cell],
    path: str,
) -> list[Degradation]:
    """Per algorithm: mean final accuracy at each value of ``path`` (averaged
    over the other swept fields) and the drop from the first value to the
    last, paired by seed (mean, sample std and 95% Student t interval over
    seeds; ``drops``: each seed's), sorted by drop.

    Pairing by seed matters: a seed fixes the fleet, the data and the
    selections, so the difference between the two ends of the sweep for one
    seed is free of the seed-to-seed variation that would swamp it in a
    difference of means. Algorithms without a finite drop sort last.

    Args:
        records: stress.parquet's rows (each names its ``cell``).
        cells: the grid; ``cells[i]`` maps each swept path to its value.
        path: the swept field the drop is measured along.
    """
    values = _values(cells, path)
    out = []
    for label in dict.fromkeys(text(r["algorithm"]) for r in records):
        mine = [r for r in records if r["algorithm"] == label]
        by_value = _accuracy_by_value(mine, cells, path, values)
        acc = [_stats([*itertools.chain(*by_value[v].values())])[0] for v in values]
        drops = _seed_drops(by_value[values[0]], by_value[values[-1]])
        paired = [d for d in drops.values() if math.isfinite(d)]
        drop, drop_sd = _stats(paired)
        iv = paired_interval(paired)
        out.append(
            Degradation(
                algorithm=label,
                values=values,
                accuracy=acc,
                seeds=len(drops),
                drop=drop,
                drop_sd=drop_sd,
                drops=drops,
                drop_lo=iv.lo,
                drop_hi=iv.hi,
            )
        )
    return sorted(out, key=lambda d: (not math.isfinite(d["drop"]), d["drop"]))


def _accuracy_by_value(
    records: Sequence[Row], cells: Sequence[Cell], path: str, values: Sequence[str]
) -> dict[str, dict[int, list[float]]]:
    """The final accuracies of ``records`` (one algorithm's), by the label of
    ``path``'s value in their cell and then by seed (a seed runs once per
    cell, so several values under one seed come from the other swept
    fields, averaged over by the caller)."""
    by_value: dict[str, dict[int, list[float]]] = {v: {} for v in values}
    for r in records:
        seeds = by_value[_cell(cells[whole(r["cell"])][path])]
        accuracy = number(r["final_accuracy"], "final_accuracy")
        seeds.setdefault(whole(r["seed"]), []).append(accuracy)
    return by_value


def _seed_drops(
    first: Mapping[int, list[float]], last: Mapping[int, list[float]]
) -> dict[int, float]:
    """Each seed's drop from ``first`` to ``last`` (seed -> accuracies at the
    sweep's two ends): the difference of its mean accuracies, for the seeds
    that ran at both ends, in seed order."""
    return {
        s: float(np.mean(first[s])) - float(np.mean(last[s]))
        for s in sorted(set(first) & set(last))
    }


def _points(drop: float) -> float:
    """An accuracy drop as a change in points, without a "-0.0" (a drop is
    positive when accuracy falls; the text shows the change, so negated)."""
    return round(-drop * 100, 1) + 0.0


def _verdict(deg: Sequence[Degradation], path: str, chance: float = 0.0) -> str:
    """stress.md's answer to "which aggregator degrades least?", in words.

    Args:
        deg: :func:`degradation`'s rows, smallest drop first.
        path: the swept field, named in the sentence.
        chance: 1 / classes. Only an algorithm clearly above chance in the
            mildest setting can be named: one that never learns has nothing
            to lose, and would "degrade least" trivially.

    Returns:
        One paragraph: the winner and its drop, the others' drops, and the
        caveats of :func:`_caveats`; or why no algorithm is named.
    """
    finite = [d for d in deg if math.isfinite(d["drop"])]
    if not finite:
        return "No algorithm has a finite accuracy at both ends of the sweep."
    ok = _above_chance(finite, chance)
    if not ok:
        return (
            f"No algorithm learned clearly beyond chance ({chance * 100:.0f}%) in "
            "the mildest setting, so none is named: check the scenario (rounds, "
            "learning rate) before reading the sweep."
        )
    best = ok[0]
    if len(best["values"]) < 2:
        return f"Only one value of `{path}` was run: nothing to compare."
    return _headline(ok, path) + _caveats(best, ok, best["values"][-1])


def _above_chance(deg: Sequence[Degradation], chance: float) -> list[Degradation]:
    """The rows clearly above chance (``chance`` = 1 / classes; 0: not
    classifying, every row) in the mildest setting, in ``deg``'s order.

    An algorithm that never learns "degrades least" trivially: only those
    clearly above chance in the mildest setting can lead.
    """
    floor = chance + max(0.05, 0.1 * (1 - chance)) if chance > 0 else -math.inf
    return [d for d in deg if d["accuracy"][0] >= floor]


def _headline(ok: Sequence[Degradation], path: str) -> str:
    """The verdict's first sentence: ``ok[0]`` degrades least, its drop in
    points and its two ends' accuracies, against the others' drops."""
    best = ok[0]
    first, last = best["values"][0], best["values"][-1]
    others = ", ".join(
        f"{_points(d['drop']):+.1f} for {d['algorithm']}" for d in ok[1:]
    )
    text = (
        f"As `{path}` goes from {first} to {last}, **{best['algorithm']} degrades "
        f"least**: its final accuracy changes by {_points(best['drop']):+.1f} points "
        f"({best['accuracy'][0] * 100:.1f}% -> {best['accuracy'][-1] * 100:.1f}%)"
    )
    return text + (f", against {others}." if others else ".")


def _caveats(best: Degradation, ok: Sequence[Degradation], last: str) -> str:
    """The verdict's warnings: the one that degrades least may not be the most
    accurate at the harshest value, and its lead may be within the seeds'
    noise (or there is one seed, and no noise to judge it by)."""
    # a finite drop has a finite accuracy at both ends
    top = max(ok, key=lambda d: d["accuracy"][-1])
    text = (
        f" At {last}, the most accurate is {top['algorithm']} "
        f"({top['accuracy'][-1] * 100:.1f}%)"
    )
    low_start = "; a small drop from a low start is no win, so read both columns."
    text += "." if top is best else low_start
    if len(ok) > 1:
        text += _lead(best, ok[1])
    return text


def _lead(best: Degradation, second: Degradation) -> str:
    """Whether ``best``'s smaller drop than ``second``'s is real: the two
    drops are paired by seed, so their difference gets a t interval."""
    if best["seeds"] <= 1:
        return " (One seed: no spread to judge the gaps by.)"
    gap = second["drop"] - best["drop"]
    diffs = paired_differences(second.get("drops", {}), best.get("drops", {}))
    iv = paired_interval(diffs)
    if iv.verdict == "n/a":
        return ""
    span = f"[{iv.lo * 100:+.1f}, {iv.hi * 100:+.1f}] points over {iv.n} seeds"
    name = second["algorithm"]
    if iv.lo > 0:
        return (
            f" Its lead over {name} ({gap * 100:.1f} points) is real at 95% ({span})."
        )
    more = ""
    if gap > 0 and iv.sd > 0:
        more = f" (about {seeds_needed(gap, iv.sd)} seeds for a gap this size)"
    return (
        f" The lead over {name} ({gap * 100:.1f} points) is not real at 95% "
        f"({span}): run more seeds before reading much into it{more}."
    )


def format_markdown(
    table: Sequence[Row],
    deg: Sequence[Degradation],
    paths: Sequence[str],
    title: str,
    notes: Sequence[str] = (),
    target: float | None = None,
    chance: float = 0.0,
    paired: Sequence[str] = (),
) -> str:
    """stress.md: the degradation table and its verdict, the ``paired``
    section's lines (each arm against the baseline), then the aggregated
    table (``chance``: 1 / classes, the accuracy of guessing; 0 if not
    classifying)."""
    lines = [f"# {title}", "", *(f"- {n}" for n in notes)]
    lines += ["", "## Which aggregator degrades least?", ""]
    if deg:
        lines += _degradation_section(deg, paths[0], chance)
    lines += ["", *paired] if paired else []
    t_head = "time to target" if target is None else f"time to {target * 100:g}% (s)"
    lines += ["", "## All cells (mean ± sample std over seeds)", ""]
    lines.append(
        f"| {' | '.join(paths)} | algorithm | final acc % | {t_head} "
        "| dropped % | tau mean | tau sd |"
    )
    lines.append("|---" * (len(paths) + 6) + "|")
    for r in table:
        vals = " | ".join(_cell(r[p]) for p in paths)
        n = r["seeds"]
        t = "-"
        if target is not None:
            t = to_target(r, _TIME.key, lambda x: f"{x:.0f}", "reached", "_sd")
        alg = text(r["algorithm"]) + (" (async)" if r["mode"] == "async" else "")
        if r["diverged"]:
            alg += f" [diverged {r['diverged']}/{n}]"
        lines.append(
            f"| {vals} | {alg} "
            f"| {_pm_of(r, 'final_accuracy', 100, 1, '_sd')} | {t} "
            f"| {_pm_of(r, 'dropped_fraction', 100, 1, '_sd')} "
            f"| {_pm_of(r, 'tau_mean', digits=1, spread='_sd')} "
            f"| {_pm_of(r, 'tau_std', digits=1, spread='_sd')} |"
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


def _degradation_section(
    deg: Sequence[Degradation], path: str, chance: float
) -> list[str]:
    """stress.md's verdict and its table: per algorithm, the mean final
    accuracy at each value of the first swept field and the drop from the
    first value to the last ("-" where no seed has a finite accuracy)."""
    lines = [_verdict(deg, path, chance), ""]
    values = deg[0]["values"]
    head = " | ".join(f"{path} = {v}" for v in values)
    lines.append(f"| algorithm | {head} | drop (points, first -> last) |")
    lines.append("|---" * (len(values) + 2) + "|")
    for d in deg:
        accs = " | ".join(
            "-" if not math.isfinite(a) else f"{a * 100:.1f}" for a in d["accuracy"]
        )
        drop = _pm(d["drop"], d["drop_sd"], 100, 1)
        if math.isfinite(d.get("drop_lo", math.nan)):
            drop += f" [{d['drop_lo'] * 100:.1f}, {d['drop_hi'] * 100:.1f}]"
        lines.append(f"| {d['algorithm']} | {accs} | {drop} |")
    return lines + [
        "",
        "Final test accuracy (%), mean over seeds; the drop is paired by seed "
        "(same fleet, data and device draws), mean ± sample std [95% Student t "
        "interval].",
    ]


def plot_accuracy(
    results: Sequence[RunOutput], cells: Sequence[Cell], path: Path
) -> Path:
    """Test accuracy against simulated time: a panel per cell, a colour per
    algorithm, a line per seed.

    Simulated time rather than rounds on the x axis, because the sweep
    usually changes how long a round takes (stragglers, deadlines): two
    algorithms equal per round can be far apart per simulated hour.
    """
    from fedsim.tools.plots import _new_figure, _save

    colors = _colors(text(r["record"]["algorithm"]) for r in results)
    ncols = min(len(cells), 4)
    nrows = math.ceil(len(cells) / ncols)
    fig = _new_figure(3.6 * ncols + 1, 3.0 * nrows + 0.6)
    axes = np.atleast_1d(fig.subplots(nrows, ncols, squeeze=False)).reshape(-1)
    for ci, cell in enumerate(cells):
        ax = axes[ci]
        _draw_cell_runs(ax, [r for r in results if r["record"]["cell"] == ci], colors)
        title = ", ".join(f"{p} = {_cell(v)}" for p, v in cell.items())
        ax.set_title(title, fontsize=9)
        ax.set(xlabel="simulated time (s)", ylabel="test accuracy")
        ax.grid(alpha=0.3)
    for ax in axes[len(cells) :]:
        ax.set_visible(False)
    axes[0].legend(fontsize=8, loc="lower right")
    fig.suptitle("test accuracy against simulated time (one line per seed)")
    return _save(fig, path)


def _draw_cell_runs(
    ax: Axes, results: Sequence[RunOutput], colors: Mapping[str, RGBA]
) -> None:
    """One cell's panel: test accuracy against simulated time, a line per
    run (its finite points), coloured by algorithm, each algorithm in the
    legend once."""
    shown: set[str] = set()
    for rec, rows in ((r["record"], r["rounds"]) for r in results):
        x = np.array(_column(rows, "sim_time"), dtype=float)
        y = np.array(_column(rows, "test_accuracy"), dtype=float)
        ok = np.isfinite(x) & np.isfinite(y)
        algorithm = text(rec["algorithm"])
        label = algorithm if algorithm not in shown else None
        shown.add(algorithm)
        color = colors[algorithm]
        ax.plot(x[ok], y[ok], color=color, linewidth=1.2, alpha=0.85, label=label)


def plot_degradation(
    deg: Sequence[Degradation],
    records: Sequence[Row],
    cells: Sequence[Cell],
    path_name: str,
    path: Path,
) -> Path:
    """Final accuracy (mean and seed spread) against the first swept field.

    The values are evenly spaced on the x axis whatever their numbers: a
    sweep is a list of settings, mildest first, not a numeric scale (and may
    not be numeric at all). The band is min-max over seeds, not a
    confidence interval: with three seeds that is all there is to show.
    """
    from fedsim.tools.plots import _new_figure, _save

    fig = _new_figure(6.5, 4.2)
    ax = fig.subplots()
    colors = _colors(text(r["algorithm"]) for r in records)
    values = deg[0]["values"] if deg else []
    xs = np.arange(len(values))
    for d in deg:
        mine = [r for r in records if r["algorithm"] == d["algorithm"]]
        accs = [
            _column(_at(mine, cells, path_name, v), "final_accuracy") for v in values
        ]
        accs = [[a for a in acc if math.isfinite(a)] for acc in accs]
        lows = [min(acc, default=math.nan) for acc in accs]
        highs = [max(acc, default=math.nan) for acc in accs]
        c = colors[d["algorithm"]]
        ax.plot(xs, d["accuracy"], marker="o", color=c, label=d["algorithm"])
        ax.fill_between(xs, lows, highs, color=c, alpha=0.15)
    ax.set_xticks(xs, values)
    ax.set(xlabel=path_name, ylabel="final test accuracy")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(
        "final accuracy as the setting gets harsher (band: min-max over seeds)"
    )
    return _save(fig, path)


def plot_taus(
    taus: Sequence[Row],
    cells: Sequence[Cell],
    path_name: str,
    path: Path,
) -> Path:
    """Local steps of completed updates per device group, a box per value of the
    first swept field; async runs (same steps per job) only if nothing else ran.

    Pooled over algorithms and seeds: tau is set by the clock (speed,
    window, stragglers), not by the aggregator, so every synchronous
    algorithm sees the same distribution and pooling only adds samples.
    """
    from fedsim.tools.plots import _new_figure, _save

    taus = [t for t in taus if t.get("mode", "sync") == "sync"] or list(taus)
    groups = list(dict.fromkeys(text(t["device_group"]) for t in taus))
    values = _values(cells, path_name)
    colors = _colors(values)
    fig = _new_figure(max(6.0, 1.5 + 0.55 * len(groups) * len(values)), 4.4)
    ax = fig.subplots()
    width = 0.8 / max(1, len(values))
    for vi, v in enumerate(values):
        done = [t for t in _at(taus, cells, path_name, v) if not t["dropped"]]
        pos = np.arange(len(groups)) + (vi - (len(values) - 1) / 2) * width
        boxes = [
            (p, ts)
            for p, g in zip(pos, groups, strict=True)
            if (ts := _column([t for t in done if t["device_group"] == g], "tau"))
        ]  # a group with no completed update at this value has no box
        if boxes:
            _tau_boxes(ax, boxes, width, colors[v], f"{path_name} = {v}")
    ax.set_xticks(np.arange(len(groups)), groups)
    ax.set(xlabel="device group", ylabel="local steps tau of completed updates")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(
        "tau per device group (synchronous runs, pooled over algorithms and seeds)"
    )
    return _save(fig, path)


def _tau_boxes(
    ax: Axes,
    boxes: Sequence[tuple[float, list[float]]],
    width: float,
    color: RGBA,
    label: str,
) -> None:
    """One swept value's boxes on tau_by_group.png: a box per ``(position,
    taus)``, and the value once in the legend."""
    ax.boxplot(
        [ts for _, ts in boxes],
        positions=[p for p, _ in boxes],
        widths=width * 0.85,
        patch_artist=True,
        showfliers=False,
        medianprops={"color": "black"},
        boxprops={"facecolor": color, "alpha": 0.6},
    )
    ax.plot([], [], color=color, linewidth=6, alpha=0.6, label=label)


def run_stress(
    scenario_path: str | Path,
    sweep: Mapping[str, Sequence[object]],
    algorithms: Sequence[str],
    seeds: int = 3,
    out_dir: str | Path | None = None,
    workers: int | None = None,
    target_accuracy: float | None = None,
    overrides: Sequence[str] = (),
    progress: Callable[[dict[str, object]], None] | None = None,
    baseline: str | None = None,
    log: Sequence[str] = (),
    max_seeds: int | None = None,
) -> Path:
    """Run the stress grid and write its report; return the report directory.

    Args:
        scenario_path: a synchronous scenario file.
        sweep: field path -> values, mildest first (``{"fleet.stragglers.p":
            [0, 0.1, 0.3, 0.5]}``); several paths make a grid.
        out_dir: the report directory (default ``results/stress-<name>-<time>``).
        workers: as for :func:`fedsim.tools.compare.run_jobs`.
        target_accuracy: default: 90% of the best arm's mean best held-out
            accuracy in the mildest cell, rounded down to half a point.
        overrides: ``path=value`` for every run (not ``algorithm`` or ``seed``).
        baseline: the arm paired with the others in every cell (the first).
        log: trackers with one run per cell, arm and seed (tools/tracking.py).
        max_seeds: batches of ``seeds`` seeds until every arm is decided in
            every cell (on the confidence sequence), or ``max_seeds`` ran.

    Raises:
        ScenarioError: if the scenario, a swept value or an algorithm is
            invalid (every combination is validated before anything runs),
            or ``baseline`` is not among the algorithms.
    """
    from fedsim.results import ROUND_SCHEMA, default_run_dir, write_table

    cells, algorithms = _grid(scenario_path, sweep, algorithms, seeds, overrides)
    base = resolve_baseline(baseline, algorithms)
    name = load_scenario(scenario_path, list(overrides)).name
    stems = file_stems(algorithms)
    out = Path(out_dir) if out_dir is not None else default_run_dir(f"stress-{name}")
    (out / "runs").mkdir(parents=True, exist_ok=True)
    pairing = Pairing(base, interval_for(seeds, max_seeds), target_accuracy)

    def finish(res: RunOutput, so_far: list[RunOutput]) -> None:
        # Each run's rounds, then the table so far: an interrupted sweep
        # keeps everything that finished, written atomically.
        rec = res["record"]
        arm, seed, ci = text(rec["algorithm"]), whole(rec["seed"]), whole(rec["cell"])
        run = f"{ci:02d}-{stems[arm]}-seed{seed}.parquet"
        write_table(out / "runs" / run, res["rounds"], ROUND_SCHEMA)
        _write_tables(out, so_far, cells, pairing)
        if group is not None:  # one tracked run per cell, arm and seed
            sc = load_variant(str(scenario_path), arm, seed, overrides, cells[ci])[0]
            name = f"{ci:02d}-{stems[arm]}-seed{seed}"
            resolved = dump_scenario(sc)
            group.log_run(name, resolved, res["rounds"], arm=arm, seed=seed, cell=ci)
        if progress is not None:
            progress(rec)

    from fedsim.tools.tracking import run_group

    group = run_group(log, out, "stress", scenario_path, overrides)
    jobs = _jobs_of(str(scenario_path), list(overrides), cells, algorithms)
    results, seeds = run_batches(
        _run_one,
        jobs,
        workers,
        finish,
        (seeds, max_seeds),
        lambda rs: not undecided([r["record"] for r in rs], base, False, ("cell",)),
    )
    if group is not None:
        group.close()
    notes = _notes(scenario_path, sweep, algorithms, seeds, overrides)
    _write_report(out, results, cells, scenario_path, notes, pairing)
    return out


def _jobs_of(
    path: str, overrides: list[str], cells: Sequence[Cell], algorithms: Sequence[str]
) -> Callable[[int, int], list[tuple[object, ...]]]:
    """The jobs of seeds [first, end) of every cell and arm, as a function."""
    return lambda first, end: [
        (path, overrides, ci, cell, label, seed)
        for ci, cell in enumerate(cells)
        for label in algorithms
        for seed in range(first, end)
    ]


def _notes(
    scenario_path: str | Path,
    sweep: Mapping[str, Sequence[object]],
    algorithms: Sequence[str],
    seeds: int,
    overrides: Sequence[str],
) -> list[str]:
    """stress.md's first notes: what ran, with how many seeds."""
    swept = "; ".join(f"`{p}` = {', '.join(map(_cell, v))}" for p, v in sweep.items())
    return [
        f"scenario: `{scenario_path}`",
        f"sweep (mildest first): {swept}",
        f"algorithms: {', '.join(algorithms)}; seeds: 0..{seeds - 1}",
        f"overrides: {', '.join(f'`{o}`' for o in overrides) or 'none'}",
    ]


def _grid(
    scenario_path: str | Path,
    sweep: Mapping[str, Sequence[object]],
    algorithms: Sequence[str],
    seeds: int,
    overrides: Sequence[str],
) -> tuple[list[dict[str, object]], list[str]]:
    """The sweep's cells (every combination of the swept values, in sweep
    order) and the canonical algorithm labels, once every (cell, algorithm)
    has validated: a mistake in the last cell is found before the first run,
    not hours into the sweep.

    Raises:
        ValueError: no seeds, algorithms or swept values.
        ScenarioError: an invalid override, swept field or value, or algorithm.
    """
    _check_grid_size(sweep, algorithms, seeds)
    labels = [canonical_label(a) for s in algorithms for a in split_algorithms(s)]
    _reject_run_overrides(overrides, "stress")
    check_sweep_fields(list(sweep))
    products = itertools.product(*sweep.values())
    cells = [dict(zip(sweep, combo, strict=True)) for combo in products]
    # an algorithm given twice is run once (the sweep's own habit), but two
    # labels for one setting are refused: the tables would list it twice
    labels = check_variants(
        scenario_path, list(dict.fromkeys(labels)), list(overrides), cells
    )
    return cells, labels


def _check_grid_size(
    sweep: Mapping[str, Sequence[object]], algorithms: Sequence[str], seeds: int
) -> None:
    """Refuse a grid with nothing to run: no seeds, algorithms, swept fields
    or values of one (each a ValueError naming what is missing)."""
    if seeds < 1:
        raise ValueError("seeds must be >= 1")
    if not algorithms:
        raise ValueError("no algorithms given")
    if not sweep or any(len(v) == 0 for v in sweep.values()):
        raise ValueError("the sweep needs at least one field with at least one value")


def _write_report(
    out: Path,
    results: list[RunOutput],
    cells: list[dict[str, object]],
    scenario_path: str | Path,
    notes: list[str],
    pairing: Pairing,
) -> None:
    """stress.parquet, paired.parquet, stress.md, taus.parquet and the four
    figures.

    Called once every run has finished: the default target needs every run
    of the mildest cell, and the verdict every run of the first and last
    values. Until then :func:`_write_tables` keeps stress.parquet current,
    so an interrupted sweep still leaves a readable table.
    """
    from fedsim.results import atomic_write_bytes, write_table
    from fedsim.tools.plots import plot_paired

    records, target, paired = _write_tables(out, results, cells, pairing)
    if target is not None:
        how = "given" if pairing.target is not None else _DEFAULT_TARGET
        notes.append(f"target accuracy: {target * 100:g}% ({how})")
    else:
        notes.append(
            "no target accuracy: give --target, or hold out rows on the clients "
            "(data.client_test_fraction with eval.federated_every) for a default "
            "one (never chosen on the test set)"
        )
    notes.append(
        "final acc % and times to target: the test set, read for these reported "
        "numbers only"
    )
    if any(r["record"]["mode"] == "async" for r in results):
        notes.append(
            "asynchronous rules ran on the asynchronous timeline (concurrency = "
            "clients per round; as many applied updates as the synchronous runs "
            "select; each job does the round's max_steps, or its epochs)"
        )
    wall = sum(number(r["record"]["wall_time_s"]) for r in results)
    notes.append(f"{len(results)} runs, {wall:.0f} s of compute in total")
    paths = list(cells[0])
    deg = degradation(records, cells, paths[0])
    chance = max((r["chance"] for r in results), default=0.0)
    title = f"stress: {Path(scenario_path).stem}"
    for r in paired:
        r.update(cells[whole(r["cell"])])
    section = [f"## Paired against {pairing.baseline}, cell by cell", ""]
    section += format_paired(paired, STRESS_PAIRED, lead=paths)
    section += [
        "",
        pairing.note(records),
        "",
        "![paired differences](paired.png)",
    ]
    text = format_markdown(
        aggregate(records, cells), deg, paths, title, notes, target, chance, section
    )
    atomic_write_bytes(out / "stress.md", text.encode())
    taus = [t for r in results for t in r["taus"]]
    write_table(out / "taus.parquet", taus, TAU_SCHEMA)
    plot_accuracy(results, cells, out / "accuracy_vs_time.png")
    plot_degradation(deg, records, cells, paths[0], out / "degradation.png")
    plot_taus(taus, cells, paths[0], out / "tau_by_group.png")
    labels = {ci: ", ".join(_cell(v) for v in c.values()) for ci, c in enumerate(cells)}
    plot_paired(paired, STRESS_PAIRED, out / "paired.png", "cell", labels)


def _write_tables(
    out: Path,
    results: list[RunOutput],
    cells: Sequence[Cell],
    pairing: Pairing,
) -> tuple[list[dict[str, object]], float | None, list[dict[str, object]]]:
    """stress.parquet with times to target filled in, and paired.parquet
    (each arm against the baseline in every cell), rewritten as runs end.

    Returns:
        The records with ``target_accuracy`` and ``time_to_target_s`` (None:
        not reached), the target used: the one given, else the default
        (None: no run has an accuracy), and paired.parquet's rows (before
        its sweep columns).
    """
    from fedsim.results import write_table

    records = [dict(r["record"]) for r in results]
    target = _default_target(records) if pairing.target is None else pairing.target
    goal = math.inf if target is None else target  # inf: never reached
    for rec, res in zip(records, results, strict=True):
        # no target: null, as every "no value" cell (NaN would also make two
        # equal tables compare unequal)
        rec["target_accuracy"] = target
        hits = (r for r in res["rounds"] if _ge(number(r["test_accuracy"]), goal))
        hit = next(hits, None)
        rec["time_to_target_s"] = None if hit is None else number(hit["sim_time"])
        rec["rounds_to_target"] = None if hit is None else whole(hit["round"]) + 1
    fields, cols = _sweep_columns(cells)
    rows = [cols[whole(r["cell"])] | r for r in records]
    write_table(out / "stress.parquet", rows, pa.schema([*fields, *STRESS_SCHEMA]))
    paired = pairing.table(records, STRESS_PAIRED, ("cell",))
    paired_fields = pa.schema([*fields, ("cell", pa.int64()), *PAIRED_SCHEMA])
    paired_rows = [cols[whole(r["cell"])] | r for r in paired]
    write_table(out / "paired.parquet", paired_rows, paired_fields)
    return records, target, paired


def _sweep_columns(
    cells: Sequence[Cell],
) -> tuple[list[tuple[str, pa.DataType]], list[dict[str, object]]]:
    """stress.parquet's first columns: one per swept field, and each cell's
    values in them.

    A field is a float column when every value is a number (not a bool),
    else strings (flow collections as JSON), so that a reader can filter
    and plot it; one named like a result column (e.g. ``rounds``) is
    written as ``sweep.<field>`` rather than clash with it.
    """
    numeric = {p: all(type(c[p]) in (int, float) for c in cells) for p in cells[0]}
    name = {p: f"sweep.{p}" if p in STRESS_SCHEMA.names else p for p in numeric}
    fields = [(name[p], pa.float64() if n else pa.string()) for p, n in numeric.items()]
    cols = [
        {name[p]: v if numeric[p] else _cell(v) for p, v in c.items()} for c in cells
    ]
    return fields, cols
