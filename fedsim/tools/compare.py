"""Compare algorithms on identical fleets and data, over seeds 0..N-1.

Fleet, data, selection and clock depend only on the seed, so every algorithm
sees the same devices and data; with common random numbers every device also
behaves the same in every arm (docs/fleets.md). Each arm is then compared
with a baseline arm seed by seed: the paired difference's Student t interval
and a verdict (:func:`paired_table`, docs/results.md "Paired comparisons").
Algorithm labels and outputs: README.md ("Comparing algorithms").

Example:
    >>> rows = compare("scenarios/ci/tiny-synthetic.yaml", ["fedavg", "fednova"],
    ...                seeds=1, overrides=["rounds=2"], out_dir=None)
    >>> [r["algorithm"] for r in rows]
    ['fedavg', 'fednova']
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import numpy as np

from fedsim.results import BOOL, F64, I64, STR, schema
from fedsim.rows import Row, nullable, number, text, whole
from fedsim.scenario import (
    Scenario,
    ScenarioError,
    dump_scenario,
    load_scenario,
    read_yaml,
)
from fedsim.tools.stats import (
    FIRM,
    PairedInterval,
    PairedMetric,
    confidence_sequence,
    paired_differences,
    paired_interval,
)

if TYPE_CHECKING:
    from matplotlib.axes import Axes

# A finished run: its compare row and its round rows (run_one's result).
_RunResult = tuple[dict[str, object], list[dict[str, object]]]
# A colour as matplotlib's colormaps give it: red, green, blue, alpha in [0, 1].
_RGBA = tuple[float, float, float, float]

# One row per run; stress.parquet shares these first columns.
RUN_COLUMNS = schema(
    (STR, "algorithm name mode"),  # mode: "sync" or "async"
    (I64, "seed rounds"),
    (BOOL, "diverged"),
    (F64, "final_accuracy best_accuracy"),
)
COMPARE_SCHEMA = schema(
    # final_fed_accuracy: federated evaluation's last fed_accuracy (NaN
    # without eval.federated_every)
    # best_fed_accuracy: the most of fed_accuracy over rounds (held-out rows:
    # "best" is chosen there, never on the test set)
    (F64, "final_test_loss final_train_loss final_objective final_fed_accuracy"),
    (F64, "best_fed_accuracy"),
    (I64, "rounds_to_target"),
    (F64, "time_to_target_s sim_time_s"),
    (I64, "bytes_down bytes_up bytes_up_to_target"),
    (F64, "mean_chi2_pw wall_time_s"),
    # round.policy and its window (null unless fixed_window): where time to
    # target is rounds x window, the paired table gives rounds only
    (STR, "policy"),
    (F64, "window_s"),
    base=RUN_COLUMNS,
)
# the columns federated evaluation adds (NaN in runs without it)
_FED = "final_fed_accuracy"
_BEST_FED = "best_fed_accuracy"


def split_algorithms(text: str) -> list[str]:
    """Split a comma-separated list; ``key=value`` pieces join the one before.

    An algorithm is a registered or installed name, or an import path
    ``module.path:Class``; its hyperparameters follow ``:`` after a name
    and ``?`` after an import path (``?`` after a name works too), so that
    the colon of an import path is never read as the start of settings.

    >>> split_algorithms("fedavg,feddc:alpha=0.005,correction=false,scaffold")
    ['fedavg', 'feddc:alpha=0.005,correction=false', 'scaffold']
    >>> split_algorithms("fedavg,mylab.algos:FedFoo?mu=0.1,beta=2,fedprox?mu=1")
    ['fedavg', 'mylab.algos:FedFoo?mu=0.1,beta=2', 'fedprox?mu=1']
    """
    out: list[str] = []
    for piece in filter(None, (p.strip() for p in text.split(","))):
        head = piece.split("=", 1)[0]
        if "=" in piece and ":" not in head and "?" not in head and out:
            out[-1] += "," + piece
        else:
            out.append(piece)
    return out


def _split_label(spec: str) -> tuple[str, str]:
    """``spec`` as (algorithm, settings text): settings follow the first
    ``?``; without one, the first ``:`` unless what follows it holds no
    ``=`` and what precedes it is no algorithm's name (then ``spec`` is an
    import path ``module:Class`` with none; ``fedprox:mu`` stays fedprox
    with a malformed setting, which :func:`_parse_label` refuses).

    >>> _split_label("mylab.algos:FedFoo?mu=0.1")
    ('mylab.algos:FedFoo', 'mu=0.1')
    >>> _split_label("mylab.algos:FedFoo"), _split_label("fedprox:mu=0.1")
    (('mylab.algos:FedFoo', ''), ('fedprox', 'mu=0.1'))
    >>> _split_label("fedprox:mu")
    ('fedprox', 'mu')
    """
    if "?" in spec:
        name, _, rest = spec.partition("?")
        return name, rest
    name, _, rest = spec.partition(":")
    if rest.strip() and "=" not in rest and not _is_algorithm_name(name.strip()):
        return spec, ""  # module.path:Class
    return name, rest


def _is_algorithm_name(name: str) -> bool:
    """Whether ``name`` is a built-in algorithm's or an installed plug-in's
    (entry point) name, as opposed to a module of an import path."""
    from fedsim import plugins

    return name in plugins.builtins("algorithm") or name in plugins.installed(
        "algorithm"
    )


def _parse_label(spec: str) -> tuple[str, dict[str, object]]:
    """``name[:key=value,...]`` or ``module:Class[?key=value,...]`` as the
    algorithm and the parsed (YAML) values.

    Raises:
        ScenarioError: a piece that is not ``key=value``, or a value that is
            not YAML; the message quotes the whole label.
    """
    name, rest = _split_label(spec)
    head = rest.partition("=")[0]
    if ":" in head:  # module:Class:key=value
        path, _, settings = f"{name}:{rest}".rpartition(":")
        raise ScenarioError(
            f"algorithm {spec!r}: an import path's settings follow '?', as in "
            f"{path}?{settings}"
        )
    values: dict[str, object] = {}  # YAML scalars, lists, mappings
    for item in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise ScenarioError(f"algorithm {spec!r}: expected key=value, got {item!r}")
        if key.strip() in values:  # the last would win without a word
            raise ScenarioError(f"algorithm {spec!r}: {key.strip()!r} is given twice")
        values[key.strip()] = read_yaml(value, f"--algorithms {spec!r}")
    return name.strip(), values


def canonical_label(spec: str) -> str:
    """``spec`` written from its parsed values, so that one setting has one
    label (in tables, file names and the check for an algorithm given twice).

    >>> canonical_label(" fedprox: mu = +5e-1")
    'fedprox:mu=0.5'
    >>> canonical_label("feddc:alpha=5e-3,correction=False")
    'feddc:alpha=0.005,correction=false'
    >>> canonical_label("mylab.algos:FedFoo?mu=1e-1"), canonical_label("fedprox?mu=1")
    ('mylab.algos:FedFoo?mu=0.1', 'fedprox:mu=1')
    """
    name, values = _parse_label(spec)
    if not values:
        return name
    shown = [
        f"{k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in values.items()
    ]
    # an import path's own colon: its settings follow "?"
    return name + ("?" if ":" in name else ":") + ",".join(shown)


def algorithm_section(
    spec: str, scenario_section: Mapping[str, object]
) -> dict[str, object]:
    """The ``algorithm`` section for ``name[:key=value,...]``.

    >>> algorithm_section("fedprox:mu=0.001", {"name": "fednova"})
    {'name': 'fedprox', 'mu': 0.001}
    >>> algorithm_section("feddc", {"name": "feddc", "alpha": 0.005})
    {'name': 'feddc', 'alpha': 0.005}
    """
    name, values = _parse_label(spec)
    own = scenario_section.get("name") == name
    section: dict[str, object] = dict(scenario_section) if own else {"name": name}
    return section | values


# File names hold a label: most file systems take 255 bytes a name, and the
# names get a seed and a suffix, so a long label is cut and told apart by hash.
_NAME_MAX = 80


def safe_name(label: str) -> str:
    """``label`` as part of a file name: letters, digits, ``_.-``; cut to at
    most 80 characters, with a short hash of the whole label when cut.

    >>> safe_name("fedprox:mu=0.01")
    'fedprox_mu_0.01'
    >>> len(safe_name("x" * 500))
    80
    """
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", label).strip("_") or "_"
    if len(name) <= _NAME_MAX:
        return name
    digest = hashlib.sha256(label.encode()).hexdigest()[:10]
    return f"{name[: _NAME_MAX - 11]}-{digest}"


def file_stems(labels: Iterable[str]) -> dict[str, str]:
    """A file-name stem per label, distinct even where :func:`safe_name`
    makes two labels alike (``a/b`` and ``a_b``): those get a hash too."""
    stems = {label: safe_name(label) for label in labels}
    count = Counter(stems.values())
    for label, stem in stems.items():
        if count[stem] > 1:
            digest = hashlib.sha256(label.encode()).hexdigest()[:10]
            stems[label] = f"{stem[: _NAME_MAX - 11]}-{digest}"
    return stems


def _own_algorithm(scenario_path: str | Path) -> dict[str, object]:
    """The scenario file's ``algorithm`` mapping, or {} (load_scenario reports why).

    A label naming the scenario's own algorithm starts from this section, so
    ``fedprox`` on a file that sets ``mu`` keeps that ``mu``; read raw, before
    validation, because the section is merged before the scenario is built.
    """
    path = Path(scenario_path)
    try:
        raw = read_yaml(path.read_text(encoding="utf-8"), str(path))
    except (OSError, UnicodeDecodeError, ScenarioError):
        return {}
    section = raw.get("algorithm") if isinstance(raw, dict) else None
    return section if isinstance(section, dict) else {}


# Fields compare and stress set or discard for every run, and why: a --set or
# --sweep of one would be ignored without a word.
TOOL_FIELDS = {
    "seed": "sets the seed of each run itself (0..N-1); use --seeds",
    "algorithm": "sets the algorithm of each run itself; use --algorithms "
    "(hyperparameters as name:key=value, or module.path:Class?key=value)",
    "resources.workers": "trains each run in one process; use --workers for "
    "how many runs go at once",
    "checkpoint": "writes no checkpoints (a run is not resumed)",
}


def tool_field(path: str) -> str | None:
    """The entry of :data:`TOOL_FIELDS` that ``path`` sets, or None.

    >>> tool_field("algorithm.mu"), tool_field("fleet.stragglers.p")
    ('algorithm', None)
    """
    for field in TOOL_FIELDS:
        if path == field or path.startswith((f"{field}.", f"{field}[")):
            return field
    return None


def _reject_run_overrides(overrides: Sequence[str], tool: str) -> None:
    """Refuse ``--set`` items for a field in :data:`TOOL_FIELDS` (the reason
    names the option to use)."""
    for item in overrides:
        field = tool_field(item.split("=", 1)[0].strip())
        if field is not None:
            raise ScenarioError(f"--set {item!r}: {tool} {TOOL_FIELDS[field]}")


def _async_overrides(sc: Scenario) -> list[str]:
    """Overrides for ``sc`` on the async timeline: the same work per job,
    ``clients_per_round`` jobs at once, as many versions as make the same updates.

    The synchronous round section is replaced (a window or deadline has no
    meaning on the timeline); ``rounds`` becomes the number of versions, so a
    ``--set rounds=N`` still counts: N rounds' worth of updates.
    """
    r, k = sc.round, sc.selector.clients_per_round
    section = {
        **r.model_dump(include={"max_steps", "epochs", "epochs_low", "epochs_high"}),
        "policy": "async",
        "job_steps": "epochs" if r.policy == "fixed_epochs" else "max_steps",
        "concurrency": k,
    }
    buffer = int(getattr(sc.algorithm, "buffer_size", 1))
    versions = max(1, math.ceil(sc.rounds * k / buffer))
    return [f"round={json.dumps(section)}", f"rounds={versions}"]


def load_variant(
    scenario_path: str | Path,
    label: str,
    seed: int,
    overrides: Sequence[str] = (),
    cell: Mapping[str, object] | None = None,
) -> tuple[Scenario, str]:
    """The scenario with ``label``'s algorithm section, ``seed`` and the
    ``cell``'s settings, and its mode (``sync`` or ``async``).

    An asynchronous rule (FedAsync, FedBuff) on a synchronous scenario runs on
    the asynchronous timeline with the same work per job (mode ``async``); a
    synchronous algorithm on an asynchronous scenario is refused.
    """
    items = _variant_items(scenario_path, label, seed, overrides, cell)
    sc = load_scenario(scenario_path, items)
    is_async = hasattr(sc.algorithm, "aggregate_async")  # a plug-in's too
    if is_async and sc.round.policy != "async":
        return load_scenario(scenario_path, items + _async_overrides(sc)), "async"
    if sc.round.policy == "async" and not is_async:
        raise ScenarioError(
            f"{scenario_path}: {label!r} is a synchronous algorithm but the "
            "scenario's round policy is 'async'; use a synchronous scenario "
            "(asynchronous rules are moved to the async timeline automatically)"
        )
    return sc, "async" if sc.round.policy == "async" else "sync"


def _variant_items(
    scenario_path: str | Path,
    label: str,
    seed: int,
    overrides: Sequence[str],
    cell: Mapping[str, object] | None,
) -> list[str]:
    """The ``path=value`` overrides of one variant, in the order they apply:
    the run's ``overrides``, the ``cell``'s settings, then ``label``'s
    algorithm section and the ``seed`` (which no earlier item may change)."""
    section = algorithm_section(label, _own_algorithm(scenario_path))
    return [
        *overrides,
        *(f"{p}={json.dumps(v)}" for p, v in (cell or {}).items()),
        f"algorithm={json.dumps(section)}",
        f"seed={seed}",
    ]


def check_variants(
    scenario_path: str | Path,
    algorithms: Sequence[str],
    overrides: Sequence[str] = (),
    cells: Sequence[Mapping[str, object]] = ({},),
) -> list[str]:
    """The canonical labels of ``algorithms``, once every variant (in every
    cell) has validated, before anything runs.

    Raises:
        ValueError: an algorithm is given twice, under one spelling or two
            (``fedprox:mu=0.5``, ``fedprox:mu=+0.5``), or two labels set the
            same algorithm with the same hyperparameters.
        ScenarioError: a variant is invalid.
    """
    labels = [canonical_label(a) for a in algorithms]
    twice = sorted({a for a in labels if labels.count(a) > 1})
    if twice:
        raise ValueError(f"--algorithms: {', '.join(twice)} given twice")
    seen: dict[str, str] = {}
    for label in labels:
        for cell in cells:
            sc, _ = load_variant(scenario_path, label, 0, overrides, cell)
        setting = json.dumps(sc.model_dump(mode="json")["algorithm"], sort_keys=True)
        if setting in seen:  # e.g. a hyperparameter given at its default
            raise ValueError(
                f"--algorithms: {seen[setting]} and {label} are the same algorithm "
                "with the same hyperparameters (given twice)"
            )
        seen[setting] = label
    return labels


def run_one(
    scenario_path: str | Path,
    label: str,
    seed: int,
    overrides: Sequence[str] = (),
    target_accuracy: float | None = None,
) -> tuple[dict[str, object], list[dict[str, object]]]:
    """Run one (algorithm, seed) in this process (a plain function: with Ray
    it runs as a task); return its compare row and its round rows.

    Raises:
        KeyboardInterrupt: the run was interrupted; the comparison stops,
            keeping the tables of the runs that finished.
    """
    from fedsim.runtime import run_scenario
    from fedsim.tools.tracking import with_round_bytes

    sc, mode = load_variant(scenario_path, label, seed, overrides)
    result = run_scenario(sc, workers=0)
    result.reraise_failure()  # a plug-in that failed stops it all
    if result.status == "interrupted":
        raise KeyboardInterrupt  # stop the comparison, not just this run
    rows = with_round_bytes(with_uploads(result.rows, result.clients), result.clients)
    summary = result.summary()
    chi2 = _finite(rows, "chi2_pw")
    last_loss = number(rows[-1]["test_loss"], "test_loss") if rows else 0.0
    diverged = result.status == "diverged" or not math.isfinite(last_loss)
    out = {
        **run_fields(label, sc, mode, seed, len(rows), diverged),
        "final_accuracy": nullable(summary["final_test_accuracy"]),
        "best_accuracy": nullable(summary["best_test_accuracy"]),
        "final_test_loss": nullable(summary["final_test_loss"]),
        "final_train_loss": _last(rows, "train_loss"),
        "final_objective": _last(rows, "train_objective"),  # F(x), where on
        # federated evaluation's accuracy: NaN in rounds without one
        "final_fed_accuracy": _last(rows, "fed_accuracy"),
        "best_fed_accuracy": max(_finite(rows, "fed_accuracy"), default=math.nan),
        **_at_target(rows, target_accuracy),
        "sim_time_s": float(summary["sim_time_s"]),
        "bytes_down": int(summary["bytes_down"]),
        "bytes_up": int(summary["bytes_up"]),
        "mean_chi2_pw": float(np.mean(chi2)) if chi2 else math.nan,
        "wall_time_s": result.wall_time_s,
        **round_policy(sc),
    }
    return {k: out[k] for k in COMPARE_SCHEMA.names}, rows  # the table's order


def _finite(rows: Sequence[Row], key: str) -> list[float]:
    """The finite values of a round column, in round order (a round that
    did not evaluate or record it holds NaN or None)."""
    return [y for _, y in _points(rows, "round", key)]


def _last(rows: Sequence[Row], key: str) -> float:
    """The last finite value of a round column (NaN when there is none)."""
    values = _finite(rows, key)
    return values[-1] if values else math.nan


def _at_target(rows: Sequence[Row], target_accuracy: float | None) -> dict[str, object]:
    """A run's target columns, read at the first round whose test accuracy
    reached the target: rounds done, simulated time and bytes uploaded
    (``rows`` carry ``bytes_up_cum``, :func:`with_uploads`); None when no
    round reached it, or no target was given."""
    target = math.inf if target_accuracy is None else target_accuracy
    hit = next((r for r in rows if _ge(r["test_accuracy"], target)), None)
    if hit is None:
        return dict.fromkeys(_TARGET_COLUMNS)
    return {
        "rounds_to_target": whole(hit["round"]) + 1,
        "time_to_target_s": number(hit["sim_time"]),
        "bytes_up_to_target": whole(hit["bytes_up_cum"]),
    }


_TARGET_COLUMNS = ("rounds_to_target", "time_to_target_s", "bytes_up_to_target")


def round_policy(sc: Scenario) -> dict[str, object]:
    """A run row's ``policy`` and ``window_s`` (None but under fixed_window)."""
    fixed = sc.round.policy == "fixed_window"
    return {
        "policy": sc.round.policy,
        "window_s": float(sc.round.window_s) if fixed else None,
    }


def _column(rows: Sequence[Row], key: str) -> list[float]:
    """``key``'s value in every row, as floats (a numeric column)."""
    return [number(r[key], key) for r in rows]


def with_uploads(
    rows: Sequence[Row], clients: Sequence[Row]
) -> list[dict[str, object]]:
    """Copies of the round rows with ``bytes_up_cum``: the bytes clients
    uploaded in that round (or server version) and every one before it.

    >>> with_uploads([{"round": 0}, {"round": 1}],
    ...              [{"round": 0, "bytes_up": 5}, {"round": 1, "bytes_up": 7},
    ...               {"round": 1, "bytes_up": 0}])
    [{'round': 0, 'bytes_up_cum': 5}, {'round': 1, 'bytes_up_cum': 12}]
    """
    per_round: Counter[int] = Counter()
    for c in clients:
        per_round[whole(c["round"], "round")] += whole(c["bytes_up"], "bytes_up")
    totals = itertools.accumulate(per_round[whole(r["round"], "round")] for r in rows)
    return [{**r, "bytes_up_cum": total} for r, total in zip(rows, totals, strict=True)]


def run_fields(
    label: str, sc: Scenario, mode: str, seed: int, rounds: int, diverged: bool
) -> dict[str, object]:
    """The first columns of every run's row (:data:`RUN_COLUMNS`)."""
    values = (label, sc.algorithm.name, mode, seed, rounds, diverged)
    return dict(zip(RUN_COLUMNS.names, values, strict=False))


def _ray_ready(workers: int | None) -> bool:
    """Whether the runs go to Ray: never with ``workers`` 0; with n >= 1 Ray
    must be up (a RuntimeError says so); with None, when it is up."""
    if workers == 0:
        return False
    import ray

    if workers is not None and not ray.is_initialized():
        raise RuntimeError(
            "workers >= 1 needs Ray initialised (fedsim.remote.ray_session)"
        )
    return ray.is_initialized()


_Result = TypeVar("_Result")


def run_jobs(
    fn: Callable[..., _Result],
    jobs: Sequence[tuple[object, ...]],
    workers: int | None,
    done: Callable[[_Result, list[_Result]], None],
) -> list[_Result]:
    """``fn(*job)`` for every job: ``workers`` 0 in this process one after
    another; n >= 1 as Ray tasks of one CPU, at most n at once (Ray must be
    up); None as Ray tasks, one per CPU, when Ray is initialised. As each run
    ends (in any order with Ray), ``done`` gets its result and the results so
    far in job order; returns them all in job order."""
    finished: dict[int, _Result] = {}

    def record(i: int, result: _Result) -> None:
        # ``done`` sees the runs so far in job order, so the tables it
        # writes list them in the same order however Ray finished them
        finished[i] = result
        done(result, [finished[k] for k in sorted(finished)])

    if not _ray_ready(workers):
        for i, job in enumerate(jobs):
            record(i, fn(*job))
    else:
        import ray

        from fedsim.remote.actors import release_parked

        release_parked(everything=False)  # warm actors would hold the CPUs
        task = ray.remote(num_cpus=1)(fn)
        limit = workers or int(max(1, ray.cluster_resources().get("CPU", 1)))
        todo = list(enumerate(jobs))
        pending: dict[ray.ObjectRef[_Result], int] = {}  # ref -> job index
        while todo or pending:
            while todo and len(pending) < limit:
                i, job = todo.pop(0)
                pending[task.remote(*job)] = i
            ready, _ = ray.wait(list(pending), num_returns=1)
            record(pending.pop(ready[0]), ray.get(ready[0]))
    return [finished[k] for k in sorted(finished)]


def _ge(x: object, target: float) -> bool:
    """Whether ``x`` is a finite number at least ``target`` (NaN, None and
    inf never reach a target: not evaluated, or diverged)."""
    return isinstance(x, float | int) and math.isfinite(x) and x >= target


def _stats(values: Sequence[object]) -> tuple[float, float]:
    """Mean and sample std of the finite values (None and NaN left out)."""
    present = [number(x) for x in values if x is not None]
    v = np.array([x for x in present if math.isfinite(x)])
    if v.size == 0:
        return math.nan, math.nan
    return float(v.mean()), float(v.std(ddof=1)) if v.size > 1 else math.nan


def _spread(rs: Sequence[Row], keys: str, suffix: str) -> dict[str, float]:
    """``_stats`` of each space-separated key over ``rs``, as key, key+suffix."""
    out: dict[str, float] = {}
    for key in keys.split():
        out[key], out[key + suffix] = _stats([r[key] for r in rs])
    return out


PAIRED_METRICS = (
    PairedMetric("final_accuracy", "final accuracy", True, 100.0, "points"),
    PairedMetric("final_objective", "training objective F(x)", False),
    PairedMetric(
        "final_fed_accuracy", "final federated accuracy", True, 100.0, "points"
    ),
    PairedMetric(
        "rounds_to_target", "rounds to target", False, unit="rounds", censor="rounds"
    ),
    PairedMetric(
        "time_to_target_s",
        "simulated time to target",
        False,
        unit="s",
        censor="sim_time_s",
    ),
)
# every column counted to the target: a miss is censored at these lengths
TARGET_METRICS = (
    *(m for m in PAIRED_METRICS if m.censor),
    PairedMetric(
        "bytes_up_to_target", "uploaded to target", False, unit="B", censor="bytes_up"
    ),
)
PAIRED_SCHEMA = schema(
    (STR, "baseline algorithm metric"),
    (I64, "seeds"),
    (F64, "mean lo hi sd"),
    (STR, "verdict"),
    (BOOL, "higher_is_better"),
    # target metrics: "arm k/n, baseline k/n" reached; values: "" ;
    # left_out: pairs left out because a run in them diverged
    (STR, "reached"),
    (I64, "left_out"),
)


def censored(row: Row, metric: PairedMetric) -> float | None:
    """A run's value of a target metric, a miss censored at the run's length.

    A run that reached the target has its value; one that did not (or
    diverged first) has at least its run's length: the rounds it ran plus
    one (the earliest round it could still reach it), its simulated time,
    its uploads. None when the row has neither.
    """
    value = row.get(metric.key)
    if _ge(value, -math.inf):
        return number(value, metric.key)
    length = row.get(metric.censor)
    if not _ge(length, -math.inf):
        return None
    return number(length, metric.censor) + (1 if metric.censor == "rounds" else 0)


def paired_values(
    arm: Sequence[Row], base: Sequence[Row], metric: PairedMetric
) -> tuple[list[float], int]:
    """Per-seed differences (arm - baseline) of one metric, and how many
    pairs were left out, by the one rule compare, stress and the gallery use:

    - a value (accuracy, objective): a pair in which either run diverged is
      left out, and counted; a seed either arm lacks is left out silently;
    - a target (rounds, time): a miss is censored at its run's length
      (:func:`censored`). A pair where one run reached the target and the
      other did not counts for the one that reached it: the miss is never
      placed before the reach (a tie when the miss's run ended earlier than
      the other reached: nothing says it would not have reached by then);
      both missed is a tie (difference 0).

    Args:
        arm: the arm's runs (``seed``, ``diverged``, the metric's keys).
        base: the baseline's runs.
        metric: what to compare.
    """
    by_seed = {whole(r["seed"], "seed"): r for r in base}
    pair = _value_pair if not metric.censor else _target_pair
    diffs: list[float] = []
    left_out = 0
    for r in sorted(arm, key=lambda r: whole(r["seed"], "seed")):
        b = by_seed.get(whole(r["seed"], "seed"))
        if b is not None:  # a seed either arm lacks is left out silently
            diff, out = pair(r, b, metric)
            diffs += diff
            left_out += out
    return diffs, left_out


def _value_pair(r: Row, b: Row, metric: PairedMetric) -> tuple[list[float], int]:
    """One seed's difference of a value (:func:`paired_values`): none when
    either run diverged, then counted as left out if either recorded it."""
    x, y = r.get(metric.key), b.get(metric.key)
    if r.get("diverged") or b.get("diverged"):
        # a metric neither run recorded has no pair to leave out
        return [], int(_ge(x, -math.inf) or _ge(y, -math.inf))
    return paired_differences({0: x}, {0: y}), 0


def _target_pair(r: Row, b: Row, metric: PairedMetric) -> tuple[list[float], int]:
    """One seed's difference of a target (:func:`paired_values`): a miss
    censored at its run's length, never placed before the other's reach;
    both missed a tie; none when a row has no length either. Never left out."""
    x, y = censored(r, metric), censored(b, metric)
    if x is None or y is None:
        return [], 0
    hit_x, hit_y = _ge(r.get(metric.key), -math.inf), _ge(b.get(metric.key), -math.inf)
    if not (hit_x or hit_y):
        return [0.0], 0
    x = x if hit_x or not hit_y else max(x, y)  # a miss never beats a reach
    y = y if hit_y or not hit_x else max(x, y)
    return paired_differences({0: x}, {0: y}), 0


def _reached(rs: Sequence[Row], key: str) -> str:
    """How many of ``rs`` reached the target (have ``key``), as "k/n"."""
    return f"{sum(_ge(r.get(key), -math.inf) for r in rs)}/{len(rs)}"


def _reached_pair(arm: Sequence[Row], base: Sequence[Row], m: PairedMetric) -> str:
    """A paired row's ``reached``: both arms' k/n for a target, else ""."""
    if not m.censor:
        return ""
    return f"arm {_reached(arm, m.key)}, baseline {_reached(base, m.key)}"


def per_round_time(runs: Sequence[Row]) -> float | None:
    """The window w when every run's time to target is exactly its rounds
    times w (``round.policy: fixed_window``): then time to target holds no
    evidence rounds do not, and is paired once, as rounds. None otherwise."""
    windows = {r.get("window_s") for r in runs}
    if len(windows) != 1 or any(r.get("policy") != "fixed_window" for r in runs):
        return None
    w = windows.pop()
    return number(w, "window_s") if _ge(w, -math.inf) else None


def resolve_baseline(baseline: str | None, labels: Sequence[str]) -> str:
    """The baseline arm: ``baseline`` (any spelling of one of ``labels``),
    or the first label.

    >>> resolve_baseline(None, ["fedavg", "fednova"])
    'fedavg'
    >>> resolve_baseline("fedprox: mu=+5e-1", ["fedavg", "fedprox:mu=0.5"])
    'fedprox:mu=0.5'

    Raises:
        ScenarioError: ``baseline`` is not among ``labels``, naming both.
    """
    if baseline is None:
        return labels[0]
    label = canonical_label(baseline)
    if label not in labels:
        raise ScenarioError(
            f"--baseline {baseline!r} is not among the algorithms compared "
            f"({', '.join(labels)}); give one of them"
        )
    return label


def paired_table(
    runs: Sequence[Row],
    baseline: str,
    metrics: Sequence[PairedMetric] = PAIRED_METRICS,
    by: Sequence[str] = (),
    decide: Callable[..., PairedInterval] = paired_interval,
) -> list[dict[str, object]]:
    """Each arm against ``baseline``, seed by seed: one row per (group, arm,
    metric) with the mean difference (arm - baseline), its 95% interval
    over seeds and the verdict (:func:`fedsim.tools.stats.paired_interval`).

    Pairs follow :func:`paired_values` (targets censored, pairs with a
    diverged run left out of values and counted); a metric no pair has a
    value for gets no row. Under ``fixed_window`` time to target is rounds
    times the window (:func:`per_round_time`) and gets no row of its own.

    Args:
        runs: one row per run: ``algorithm``, ``seed``, the ``metrics``'
            keys and the ``by`` keys.
        baseline: the label every other arm is compared with.
        metrics: what to compare.
        by: keys whose values group the runs (stress: ``cell``); each group
            compares its own arms.
        decide: the interval (``paired_interval``; seeds until decided use
            ``confidence_sequence``, valid however often it was looked at).

    Returns:
        Rows of :data:`PAIRED_SCHEMA` (preceded by the ``by`` keys), groups
        in first-seen order, arms in first-seen order.
    """
    metrics = _pairable(runs, metrics)
    out = []
    for group, mine in _groups(runs, by).items():
        base = [r for r in mine if r["algorithm"] == baseline]
        for (label,), arm in _groups(mine, ("algorithm",)).items():
            if label == baseline:
                continue
            for m in metrics:
                diffs, left_out = paired_values(arm, base, m)
                if diffs or left_out:
                    out.append(
                        {
                            **dict(zip(by, group, strict=True)),
                            **_paired_row(diffs, m, decide),
                            "baseline": baseline,
                            "algorithm": label,
                            "reached": _reached_pair(arm, base, m),
                            "left_out": left_out,
                        }
                    )
    return out


def _groups(
    rows: Sequence[Row], keys: Sequence[str]
) -> dict[tuple[object, ...], list[Row]]:
    """``rows`` by their values of ``keys``, groups in first-seen order."""
    out: dict[tuple[object, ...], list[Row]] = {}
    for r in rows:
        out.setdefault(tuple(r[k] for k in keys), []).append(r)
    return out


def _pairable(
    runs: Sequence[Row], metrics: Sequence[PairedMetric]
) -> list[PairedMetric]:
    """The metrics :func:`paired_table` gives rows: not time to target
    where it is rounds times the window (the same evidence as rounds), and
    no target no run reached (or none given: nothing to pair)."""
    same_as_rounds = bool(runs) and per_round_time(runs) is not None
    return [
        m
        for m in metrics
        if not (same_as_rounds and m.key == "time_to_target_s")
        and (not m.censor or any(_ge(r.get(m.key), 0) for r in runs))
    ]


@dataclass(frozen=True)
class Pairing:
    """How compare and stress pair their arms, and read the pairs.

    Attributes:
        baseline: the arm every other is paired with.
        decide: the interval: :func:`fedsim.tools.stats.paired_interval`,
            or with seeds added until decided the anytime-valid
            :func:`fedsim.tools.stats.confidence_sequence`
            (:func:`interval_for`).
        target: the target accuracy given (None: none; stress then picks
            its default).
    """

    baseline: str
    decide: Callable[..., PairedInterval] = paired_interval
    target: float | None = None

    def table(
        self,
        runs: Sequence[Row],
        metrics: Sequence[PairedMetric] = PAIRED_METRICS,
        by: Sequence[str] = (),
    ) -> list[dict[str, object]]:
        """:func:`paired_table` of ``runs`` against the baseline."""
        return paired_table(runs, self.baseline, metrics, by, self.decide)

    def settled(self, runs: Sequence[Row]) -> bool:
        """Whether every arm is decided against the baseline on final
        accuracy, and with a target on rounds to it (:func:`undecided`)."""
        return not undecided(runs, self.baseline, self.target is not None)

    def note(self, runs: Sequence[Row]) -> str:
        """:func:`paired_note` under the table of ``runs``."""
        return paired_note(self.baseline, per_round_time(runs), self.decide)


def _paired_row(
    diffs: Sequence[float], m: PairedMetric, decide: Callable[..., PairedInterval]
) -> dict[str, object]:
    """The interval's columns of a paired row."""
    iv = decide(diffs, higher_is_better=m.higher_is_better)
    return {
        "metric": m.key,
        "seeds": iv.n,
        "mean": iv.mean,
        "lo": iv.lo,
        "hi": iv.hi,
        "sd": iv.sd,
        "verdict": iv.verdict,
        "higher_is_better": m.higher_is_better,
    }


def _signed(x: float, scale: float, digits: int) -> str:
    """``x * scale`` with its sign, "-" when not finite."""
    return f"{x * scale:+.{digits}f}" if math.isfinite(x) else "-"


def format_paired(
    rows: Sequence[Row],
    metrics: Sequence[PairedMetric] = PAIRED_METRICS,
    lead: Sequence[str] = (),
) -> list[str]:
    """The paired table as Markdown lines (accuracy in points).

    Args:
        rows: :func:`paired_table`'s rows.
        metrics: how each metric is printed.
        lead: leading columns (stress: the swept fields), from the rows.
    """
    if not rows:
        return ["No pair of seeds to compare (one algorithm, or no values)."]
    by_key = {m.key: m for m in metrics}
    head = "".join(f"| {k} " for k in lead)
    lines = [
        f"{head}| algorithm | metric | seeds | mean difference | 95% interval "
        "| verdict |",
        "|---" * (len(lead) + 6) + "|",
    ]
    for r in rows:
        m = by_key[text(r["metric"], "metric")]
        digits = 1 if m.scale != 1 or m.unit in ("rounds", "s") else 4
        what = f"{m.label} ({m.unit})" if m.unit else m.label
        what += f"; reached in {r['reached']}" if r.get("reached") else ""
        lo, hi = (_signed(number(r[k], k), m.scale, digits) for k in ("lo", "hi"))
        interval = f"[{lo}, {hi}]" if whole(r["seeds"]) > 1 else "n/a (one seed)"
        cells = "".join(f"| {_cell(r[k])} " for k in lead)
        left = whole(r.get("left_out") or 0)
        seeds = f"{r['seeds']} ({left} left out: diverged)" if left else r["seeds"]
        lines.append(
            f"{cells}| {r['algorithm']} | {what} | {seeds} "
            f"| {_signed(number(r['mean']), m.scale, digits)} | {interval} "
            f"| {r['verdict']} |"
        )
    return lines


def _cell(value: object) -> str:
    """A swept value as text: strings as they are, anything else as JSON
    (``0.5``, ``true``, ``{"dist": "fixed"}``), so equal values compare
    equal across cells however YAML typed them (stress's tables, the
    paired table's lead columns)."""
    return value if isinstance(value, str) else json.dumps(value)


def paired_note(
    baseline: str,
    window: float | None = None,
    decide: Callable[..., PairedInterval] = paired_interval,
) -> str:
    """The sentences under a paired table: how to read it.

    Args:
        baseline: the arm the others are paired with.
        window: the fixed window when time to target is rounds times it
            (:func:`per_round_time`): the table then says why time has no row.
        decide: the interval the table used (seeds until decided: the
            confidence sequence, which the note then names).
    """
    once = (
        f" Under fixed_window, time to target is rounds x {window:g} s exactly: "
        "it is the same evidence as rounds, paired once (as rounds)."
        if window is not None
        else ""
    )
    return (
        f"Difference = algorithm - {baseline}, seed by seed (the same fleet, "
        "data, selections and device draws), with its 95% "
        + (
            "Student t interval over the seeds"
            if decide is paired_interval
            else "anytime-valid confidence sequence (seeds added until decided: "
            "valid however many batches were looked at, about 1.7 times the "
            "width of a t interval at 10 to 30 seeds)"
        )
        + ". Better or worse when the interval excludes 0 and the "
        "exact sign-flip test agrees (no firm verdict under 6 seeds); "
        "inconclusive when only the interval does; no difference when it holds "
        "0. Targets: a run that missed is censored at its length, so a seed "
        "where one arm reached the target and the other did not counts for the "
        "one that reached it, and both missing is a tie. Values: a pair with a "
        "diverged run is left out, and counted."
        + once
        + ' (docs/results.md, "Paired comparisons")'
    )


def summarize_runs(
    runs: Sequence[Row], target_accuracy: float | None = None
) -> list[dict[str, object]]:
    """Per algorithm (in first-seen order): mean and sample std over seeds.

    Args:
        runs: one compare row per (algorithm, seed).
        target_accuracy: recorded in each row for compare.md's headings.

    Returns:
        One row per algorithm. Rounds, time and uploads to target average
        every seed, a miss censored at its run's length (:func:`censored`):
        where some seed missed (``reached_target`` < ``seeds``) the mean is a
        lower bound.
    """
    table = []
    keys = """final_accuracy best_accuracy final_test_loss final_train_loss sim_time_s
    mean_chi2_pw"""
    for label in dict.fromkeys(r["algorithm"] for r in runs):
        rs = [r for r in runs if r["algorithm"] == label]
        traffic = [whole(r["bytes_down"]) + whole(r["bytes_up"]) for r in rs]
        at_length = [{m.key: censored(r, m) for m in TARGET_METRICS} for r in rs]
        table.append(
            {
                "algorithm": label,
                "mode": rs[0].get("mode", "sync"),
                "seeds": len(rs),
                **_spread(rs, keys, "_std"),
                **_spread(at_length, " ".join(m.key for m in TARGET_METRICS), "_std"),
                # rows made before the column (or by hand) may lack it: NaN
                **_spread(
                    [{k: r.get(k) for k in (_FED, _BEST_FED)} for r in rs],
                    f"{_FED} {_BEST_FED}",
                    "_std",
                ),
                "reached_target": sum(r["rounds_to_target"] is not None for r in rs),
                "bytes_per_run": float(np.mean(traffic)),
                "bytes_up_per_run": float(np.mean(_column(rs, "bytes_up"))),
                "diverged": sum(bool(r["diverged"]) for r in rs),
                "target_accuracy": target_accuracy,
            }
        )
    return table


def _pm(mean: float, std: float, scale: float = 1.0, digits: int = 2) -> str:
    """mean ± std; one seed has no spread ("± n/a")."""
    if not math.isfinite(mean):
        return "-"
    spread = f"{std * scale:.{digits}f}" if math.isfinite(std) else "n/a"
    return f"{mean * scale:.{digits}f} ± {spread}"


def _pm_of(
    r: Row, key: str, scale: float = 1.0, digits: int = 2, spread: str = "_std"
) -> str:
    """:func:`_pm` of a summary row's ``key`` and its spread, ``key + spread``."""
    return _pm(number(r[key], key), number(r[key + spread], key), scale, digits)


def to_target(
    r: Row,
    key: str,
    fmt: Callable[[float], str],
    reached: str = "reached_target",
    spread: str = "_std",
) -> str:
    """A summary row's target column: the censored mean (">=" when some seed
    missed: a lower bound) and std, and "reached in k/n".

    Args:
        r: a summary row (``seeds``, ``reached``, ``key``, ``key + spread``).
        key: the target column.
        fmt: prints a number of it.
        reached: the row's key of how many seeds reached the target.
        spread: the suffix of the std's key.
    """
    n, k = whole(r["seeds"]), whole(r[reached])
    mean, std = number(r[key], key), number(r[key + spread], key)
    if not math.isfinite(mean):
        return f"- (reached in {k}/{n})"
    sd = fmt(std) if math.isfinite(std) else "n/a"
    return f"{'' if k == n else '>= '}{fmt(mean)} ± {sd} (reached in {k}/{n})"


def _bytes(n: float) -> str:
    """``n`` bytes in decimal units (kB, MB, GB), as network traffic is
    counted; e.g. ``_bytes(2.5e6) == "2.50 MB"``."""
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} B"


def format_markdown(
    table: Sequence[Row],
    title: str,
    notes: Sequence[str] = (),
) -> str:
    """The comparison as a Markdown table (accuracies in %).

    Args:
        table: :func:`summarize_runs`'s rows, one per algorithm.
        title: the heading.
        notes: bullet lines above the table (scenario, seeds, overrides).

    Returns:
        compare.md's text: "-" where no seed has a value; every target
        column says "reached in k/n", its mean a lower bound (">=") where
        some seed missed (censored at its run's length).
        No "best" of the test set (that would choose on it): with
        federated evaluation (some arm has ``final_fed_accuracy``) columns
        "final fed acc %" and "best fed acc %", of the clients' held-out
        rows, follow "final acc %".
    """
    target = next((r["target_accuracy"] for r in table), None)
    target = None if target is None else number(target, "target_accuracy")
    lines = [f"# {title}", "", *(f"- {n}" for n in notes), *([""] if notes else [])]
    t_head = f"to {target * 100:g}%" if target is not None else "to target"
    fed = any(_ge(r.get("final_fed_accuracy"), -math.inf) for r in table)
    lines.append(
        "| algorithm | seeds | final acc % "
        f"{'| final fed acc % | best fed acc % ' if fed else ''}| final test loss "
        f"| rounds {t_head} | sim time {t_head} (s) | uploaded {t_head} "
        "| bytes / run | uploaded / run | diverged |"
    )
    lines.append("|---" * (12 if fed else 10) + "|")
    for r in table:
        n = r["seeds"]
        rounds = time_s = up_t = "-"
        if target is not None:
            rounds, time_s, up_t = (
                to_target(r, key, fmt)
                for key, fmt in (
                    ("rounds_to_target", lambda x: f"{x:.1f}"),
                    ("time_to_target_s", lambda x: f"{x:.1f}"),
                    ("bytes_up_to_target", _bytes),
                )
            )
        held_out = f"| {_pm_of(r, _FED, 100)} | {_pm_of(r, _BEST_FED, 100)} "
        lines.append(
            f"| {r['algorithm']}{' (async)' if r['mode'] == 'async' else ''} | {n} "
            f"| {_pm_of(r, 'final_accuracy', 100)} "
            f"{held_out if fed else ''}"
            f"| {_pm_of(r, 'final_test_loss', digits=4)} "
            f"| {rounds} | {time_s} | {up_t} | {_bytes(number(r['bytes_per_run']))} "
            f"| {_bytes(number(r['bytes_up_per_run']))} | {r['diverged']}/{n} |"
        )
    return "\n".join(lines) + "\n"


def compare(
    scenario_path: str | Path,
    algorithms: Sequence[str],
    seeds: int = 3,
    overrides: Sequence[str] | None = None,
    out_dir: str | Path | None = None,
    target_accuracy: float | None = None,
    progress: Callable[[dict[str, object]], None] | None = None,
    workers: int | None = 0,
    baseline: str | None = None,
    log: Sequence[str] = (),
    max_seeds: int | None = None,
) -> list[dict[str, object]]:
    """Run every algorithm for seeds 0..seeds-1 (or until decided, with
    ``max_seeds``); return the summary table rows.

    Args:
        algorithms: ``name`` or ``name:key=value,...`` per algorithm.
        overrides: ``path=value`` for every run (not ``algorithm`` or ``seed``).
        out_dir: where the tables, the figures and runs/ go (None: nowhere).
        target_accuracy: for rounds and simulated time to reach it (a fraction).
        progress: called with each run's row as it finishes.
        workers: as for :func:`run_jobs`.
        baseline: the arm the others are paired with (default the first).
        log: trackers with one run per arm and seed (tools/tracking.py; out_dir).
        max_seeds: batches of ``seeds`` seeds until every arm is decided
            (:func:`undecided`, on the confidence sequence), or ``max_seeds``.

    Raises:
        ScenarioError: an invalid variant or a foreign ``baseline`` (before any run).
    """
    from fedsim.results import ROUND_SCHEMA, write_table
    from fedsim.tools.tracking import run_group

    overrides = list(overrides or [])
    _reject_run_overrides(overrides, "compare")
    decide = interval_for(seeds, max_seeds)
    if not algorithms:
        raise ValueError("no algorithms to compare")
    algorithms = check_variants(scenario_path, algorithms, overrides)
    pairing = Pairing(resolve_baseline(baseline, algorithms), decide, target_accuracy)
    stems = file_stems(algorithms)
    out = Path(out_dir) if out_dir is not None else None
    if out is not None:
        (out / "runs").mkdir(parents=True, exist_ok=True)

    def finish(res: _RunResult, so_far: list[_RunResult]) -> None:
        # Written as each run ends (atomically): an interrupted comparison
        # keeps every finished run's rows and a compare.md of them.
        row, rounds = res
        arm, seed = text(row["algorithm"], "algorithm"), whole(row["seed"], "seed")
        if out is not None:  # each run's rounds, then the tables so far
            name = f"{stems[arm]}-seed{seed}.parquet"
            write_table(out / "runs" / name, rounds, ROUND_SCHEMA)
            _write_tables(out, so_far, scenario_path, overrides, pairing)
        if group is not None:  # one tracked run per arm and seed
            sc = load_variant(scenario_path, arm, seed, overrides)[0]
            name = f"{stems[arm]}-seed{seed}"
            group.log_run(name, dump_scenario(sc), rounds, arm=arm, seed=seed)
        if progress is not None:
            progress(row)

    group = run_group(log, out, "compare", scenario_path, overrides)
    results, _ = run_batches(
        run_one,
        _jobs_of(scenario_path, algorithms, overrides, target_accuracy),
        workers,
        finish,
        (seeds, max_seeds),
        lambda rs: pairing.settled([r for r, _ in rs]),
    )
    if group is not None:
        group.close()
    if out is not None:
        _write_figures(out, results, pairing)
    return summarize_runs([row for row, _ in results], target_accuracy)


def interval_for(seeds: int, max_seeds: int | None) -> Callable[..., PairedInterval]:
    """The paired interval a comparison of ``seeds`` seeds uses: the fixed-n
    :func:`fedsim.tools.stats.paired_interval`, or with ``max_seeds`` (seeds
    until decided) the anytime-valid
    :func:`fedsim.tools.stats.confidence_sequence`.

    Raises:
        ValueError: ``seeds`` below 1, or ``max_seeds`` below ``seeds`` or 2.
    """
    if seeds < 1:
        raise ValueError("seeds must be >= 1")
    if max_seeds is not None and max_seeds < max(seeds, 2):
        raise ValueError(f"max_seeds must be >= seeds and >= 2, got {max_seeds}")
    return paired_interval if max_seeds is None else confidence_sequence


def run_batches(
    fn: Callable[..., _Result],
    jobs_for: Callable[[int, int], list[tuple[object, ...]]],
    workers: int | None,
    done: Callable[[_Result, list[_Result]], None],
    seeds: tuple[int, int | None],
    settled: Callable[[list[_Result]], bool],
) -> tuple[list[_Result], int]:
    """:func:`run_jobs` over batches of seeds (:func:`seed_batches`):
    ``jobs_for(first, end)`` makes a batch's jobs, ``done`` sees every run so
    far (earlier batches too), ``settled(results)`` ends the batches.

    Args:
        seeds: (seeds per batch, ``max_seeds`` or None for one batch).

    Returns:
        Every result, batch after batch, each in job order; the seeds run.
    """
    results: list[_Result] = []

    def record(res: _Result, so_far: list[_Result]) -> None:
        done(res, [*results, *so_far])

    def batch(first: int, end: int) -> None:
        results.extend(run_jobs(fn, jobs_for(first, end), workers, record))

    n = seed_batches(*seeds, batch, lambda: settled(results))
    return results, n


def seed_batches(
    seeds: int,
    max_seeds: int | None,
    run: Callable[[int, int], None],
    settled: Callable[[], bool],
) -> int:
    """Run seeds ``[0, seeds)``, then, with ``max_seeds``, ``seeds`` more at a
    time (``run(first, end)``) until ``settled()`` or ``max_seeds`` seeds
    have run; return how many ran. Without ``max_seeds``, one batch."""
    done, upto = 0, seeds
    while True:
        run(done, upto)
        if max_seeds is None or upto >= max_seeds or settled():
            return upto
        done, upto = upto, min(max_seeds, upto + seeds)


def undecided(
    runs: Sequence[Row], baseline: str, target: bool, by: Sequence[str] = ()
) -> list[str]:
    """The arms not yet decided against ``baseline``: those whose final
    accuracy (and, with a target, rounds to target) has no firm verdict
    from the anytime-valid confidence sequence, in some group of ``by``
    (stress: every cell); identical on every seed counts as decided. Empty
    when every pairing is decided."""
    keys = {"final_accuracy"} | ({"rounds_to_target"} if target else set())
    metrics = [m for m in PAIRED_METRICS if m.key in keys]
    rows = paired_table(runs, baseline, metrics, by, confidence_sequence)
    done = FIRM | {"identical on every seed"}
    decided = {
        (r["algorithm"], tuple(r[k] for k in by), r["metric"])
        for r in rows
        if r["verdict"] in done
    }
    arms = dict.fromkeys(
        text(r["algorithm"]) for r in runs if r["algorithm"] != baseline
    )
    wanted = list(itertools.product(_groups(runs, by), keys))  # (group, metric)
    return [a for a in arms if any((a, g, k) not in decided for g, k in wanted)]


def _jobs_of(
    scenario_path: str | Path,
    algorithms: Sequence[str],
    overrides: Sequence[str],
    target: float | None,
) -> Callable[[int, int], list[tuple[object, ...]]]:
    """compare's jobs of seeds [first, end), every arm, as a function."""
    return lambda first, end: [
        (scenario_path, arm, seed, overrides, target)
        for arm in algorithms
        for seed in range(first, end)
    ]


def _write_figures(out: Path, results: Sequence[_RunResult], pairing: Pairing) -> None:
    """compare.png and paired.png, once every run has ended."""
    from fedsim.tools.plots import plot_paired

    plot_compare(results, pairing.target, out / "compare.png")
    paired = pairing.table([row for row, _ in results])
    plot_paired(paired, PAIRED_METRICS, out / "paired.png")


def _write_tables(
    out: Path,
    results: Sequence[_RunResult],
    scenario_path: str | Path,
    overrides: Sequence[str],
    pairing: Pairing,
) -> None:
    """compare.parquet (one row per run so far), paired.parquet (each arm
    against the baseline) and compare.md (their mean and spread per
    algorithm, then the paired differences), each replaced atomically: a
    reader, or an interrupted comparison, sees the runs that finished and
    no half file."""
    from fedsim.results import atomic_write_bytes, write_table

    runs = [row for row, _ in results]
    write_table(out / "compare.parquet", runs, COMPARE_SCHEMA)
    paired = pairing.table(runs)
    write_table(out / "paired.parquet", paired, PAIRED_SCHEMA)
    notes = [
        f"scenario: `{scenario_path}`",
        f"seeds: {', '.join(map(str, sorted({whole(r['seed']) for r in runs})))}",
        f"overrides: {', '.join(f'`{o}`' for o in overrides) or 'none'}",
        "final acc %, final test loss and the target columns: the test set, "
        "read for these reported numbers only (nothing is chosen on it); fed acc "
        "%: the clients' held-out rows (eval.federated_every), where a best "
        "over rounds may be taken; mean ± sample std over seeds",
    ]
    table = summarize_runs(runs, pairing.target)
    text = format_markdown(table, f"compare: {Path(scenario_path).stem}", notes)
    text += "\n".join(
        ["", f"## Paired against {pairing.baseline}", "", *format_paired(paired)]
        + [
            "",
            pairing.note(runs),
            "",
            "![paired differences](paired.png)",
            "",
        ]
    )
    atomic_write_bytes(out / "compare.md", text.encode())


def _colors(names: Iterable[str]) -> dict[str, _RGBA]:
    """A tab10 colour per name, in first-seen order."""
    from matplotlib import colormaps

    return {n: colormaps["tab10"](i % 10) for i, n in enumerate(dict.fromkeys(names))}


def _points(
    rounds: Sequence[Row], x_key: str, y_key: str = "test_accuracy"
) -> list[tuple[float, float]]:
    """(x, y) of a run's rounds with a finite ``y_key`` (accuracy: the
    evaluated rounds); rounds counted from 1."""
    shift = 1.0 if x_key == "round" else 0.0
    return [
        (number(r[x_key], x_key) + shift, number(r[y_key], y_key))
        for r in rounds
        if _ge(r.get(y_key), -math.inf)
    ]


def has_objective(rounds: Sequence[Row]) -> bool:
    """Whether a run's rows have a finite ``train_objective`` (F(x))."""
    return bool(_points(rounds, "round", "train_objective"))


def _band(
    curves: Sequence[Sequence[Row]],
    x_key: str,
    grid: np.ndarray,
    y_key: str = "test_accuracy",
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean, min and max over seeds of ``y_key`` against ``x_key`` on ``grid``;
    NaN where a seed does not reach (a band never mixes different sets of seeds)."""
    ys = []
    for pts in filter(None, (_points(rounds, x_key, y_key) for rounds in curves)):
        x, y = np.array(pts).T
        inside = (grid >= x[0]) & (grid <= x[-1])
        ys.append(np.where(inside, np.interp(grid, x, y), np.nan))
    stack = np.vstack(ys) if ys else np.full((1, grid.size), np.nan)
    return stack.mean(0), stack.min(0), stack.max(0)


def _draw_band(
    ax: Axes,
    mine: Sequence[Sequence[Row]],
    keys: tuple[str, str],
    color: _RGBA,
    label: str,
) -> None:
    """One algorithm's curve on ``ax``: the mean over its seeds, the min-max
    band, each seed thin.

    Args:
        ax: the panel.
        mine: the algorithm's round rows, one list per seed.
        keys: (x key, y key) of the rows.
        color: the algorithm's colour.
        label: the legend's label.
    """
    x_key, y_key = keys
    xs = [number(r[x_key], x_key) for c in mine for r in c]
    if not xs:
        return
    lo = 1.0 if x_key == "round" else 0.0
    grid = np.linspace(lo, max(xs) + lo, 200)
    mean, low, high = _band(mine, x_key, grid, y_key)
    ax.plot(grid, mean, color=color, linewidth=1.8, label=label)
    ax.fill_between(grid, low, high, color=color, alpha=0.2, linewidth=0)
    for pts in filter(None, (_points(c, x_key, y_key) for c in mine)):
        ax.plot(*np.array(pts).T, color=color, linewidth=0.6, alpha=0.4)


def _frame_objective(ax: Axes, curves: Sequence[Sequence[Row]], xlabel: str) -> None:
    """The F(x) panel's labels; a log scale when the values of all runs span
    over two decades."""
    pts = [y for c in curves for _, y in _points(c, "round", "train_objective")]
    values = np.array(pts)
    if values.size and values.min() > 0 and values.max() / values.min() > 100:
        ax.set_yscale("log")
    ax.set(xlabel=xlabel, ylabel="training objective F(x)")


def plot_compare(
    results: Sequence[tuple[Row, Sequence[Row]]],
    target: float | None,
    path: Path,
) -> Path:
    """compare.png: test accuracy against simulated time, rounds and MB uploaded,
    per algorithm: mean over seeds, min-max band, each seed thin; target dashed.
    When every run recorded the global training objective
    (``eval.objective_every``), a fourth panel draws F(x) against rounds."""
    from fedsim.tools.plots import _new_figure, _save

    colors = _colors(text(row["algorithm"], "algorithm") for row, _ in results)
    curves = [(row["algorithm"], _with_upload_mb(c)) for row, c in results]
    panels = [
        ("sim_time", "test_accuracy", "simulated time (s)"),
        ("round", "test_accuracy", "rounds completed"),
        ("upload_mb", "test_accuracy", "uploaded (MB, all clients)"),
    ]
    objective = bool(results) and all(has_objective(c) for _, c in results)
    if objective:
        panels.append(("round", "train_objective", "rounds completed"))
    fig = _new_figure(21.3 if objective else 16, 4.2)
    axes = fig.subplots(1, len(panels))
    for ax, (x_key, y_key, xlabel) in zip(axes, panels, strict=True):
        for label, color in colors.items():
            mine = [c for lab, c in curves if lab == label]  # by seed
            _draw_band(ax, mine, (x_key, y_key), color, label)
        _frame_panel(ax, y_key, xlabel, target, [c for _, c in curves])
    axes[0].legend(fontsize=8, loc="lower right")
    seeds = len({row["seed"] for row, _ in results})
    what = "test accuracy and training objective" if objective else "test accuracy"
    fig.suptitle(f"{what}: mean over {seeds} seed(s), band from min to max")
    return _save(fig, path)


def _with_upload_mb(rounds: Sequence[Row]) -> list[Row]:
    """Copies of a run's round rows with ``upload_mb``: MB uploaded so far."""
    return [{**r, "upload_mb": number(r["bytes_up_cum"]) / 1e6} for r in rounds]


def _frame_panel(
    ax: Axes,
    y_key: str,
    xlabel: str,
    target: float | None,
    curves: Sequence[Sequence[Row]],
) -> None:
    """A compare.png panel's labels and grid: test accuracy with the target
    dashed, or the training objective (:func:`_frame_objective`)."""
    if y_key != "test_accuracy":
        _frame_objective(ax, curves, xlabel)
    else:
        if target is not None:
            ax.axhline(target, color="0.3", linestyle="--", linewidth=1)
        ax.set(xlabel=xlabel, ylabel="test accuracy")
    ax.grid(alpha=0.3)
