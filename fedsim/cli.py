"""The ``fedsim`` command line: ``fedsim run | validate | report | compare | stress``.

Exit codes (README.md): 0 success; 1 a failed run (e.g. diverged); 2 invalid
scenario or arguments, with one message on stderr and no traceback; 130 stopped.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from fedsim import __version__
from fedsim.units import duration

# fedsim.scenario (every plug-in, numpy, pydantic schemas) is imported by the
# commands that read a scenario, so that `fedsim --help` starts at once.
if TYPE_CHECKING:
    from fedsim.scenario import Scenario

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="fedsim: simulate federated learning on heterogeneous device fleets.",
    pretty_exceptions_enable=False,
)
err = Console(stderr=True)
out = Console()


SetOption = Annotated[
    list[str] | None,
    typer.Option(
        "--set",
        help="Override a scenario field (in every run): path.to.key=value; repeatable.",
    ),
]
# Parsed by run itself, so that a bad value is one line naming the option.
SeedOption = Annotated[
    str | None,
    typer.Option("--seed", metavar="INT", help="Override the scenario's seed (>= 0)."),
]
AddressOption = Annotated[
    str | None,
    typer.Option("--address", help="Join this Ray cluster (default: RAY_ADDRESS)."),
]
QuietOption = Annotated[bool, typer.Option("--quiet", "-q")]
# compare and stress: the same names for the same things
AlgorithmsOption = Annotated[
    str,
    typer.Option(
        "--algorithms",
        "-a",
        help="Comma-separated algorithms, each NAME or NAME:key=value,... "
        "(e.g. fedavg,fedprox:mu=0.001,fednova).",
    ),
]
SeedsOption = Annotated[int, typer.Option("--seeds", min=1, help="Seeds 0..N-1.")]
TargetOption = Annotated[
    float | None,
    typer.Option(
        "--target-accuracy",
        "--target",
        min=0.0,
        max=1.0,
        help="Target test accuracy (a fraction) for the rounds and simulated "
        "time to reach it.",
    ),
]
RunsOption = Annotated[
    int | None,
    typer.Option(
        "--workers",
        min=0,
        help="0: one run after another in this process; n: at most n runs at "
        "once as Ray tasks (stress default: one per CPU; compare default: 0).",
    ),
]
OutDirOption = Annotated[
    Path | None,
    typer.Option(
        "--out", help="Output folder (default results/<command>-<name>-<time>/)."
    ),
]


def _version(value: bool) -> None:
    if value:
        out.print(f"fedsim {__version__}")
        raise typer.Exit(0)


@app.callback()
def _main(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Print the version."
        ),
    ] = False,
) -> None:
    """fedsim: simulate federated learning on heterogeneous device fleets."""


def _say(label: str, message: str) -> None:
    """A line on stderr, never wrapped (paths stay whole); ``message`` is not markup."""
    text = f"{label} {escape(message)}" if label else escape(message)
    err.print(text, highlight=False, soft_wrap=True)


def _fail(message: str, code: int = 2) -> NoReturn:
    _say("[bold red]error:[/]", message)
    raise typer.Exit(code)


@contextmanager
def _errors(*kinds: type[Exception], code: int = 2) -> Iterator[None]:
    """Report these exceptions as one error line and exit with ``code``."""
    try:
        yield
    except typer.Exit:  # a RuntimeError: already said
        raise
    except kinds as exc:
        _fail(str(exc), code)


def _fmt(x: Any, spec: str = ".4f") -> str:
    try:
        return "-" if x is None or x != x else format(x, spec)
    except (TypeError, ValueError):
        return str(x)


@app.command()
def run(
    scenario: Annotated[
        Path | None, typer.Argument(help="Scenario YAML file.", show_default=False)
    ] = None,
    out_dir: Annotated[
        Path | None,
        typer.Option("--out", help="Run directory (default results/<name>-<time>/)."),
    ] = None,
    workers: Annotated[
        int | None,
        typer.Option(
            "--workers", min=0, help="Ray worker actors (0: no Ray, in-process)."
        ),
    ] = None,
    seed: SeedOption = None,
    set_: SetOption = None,
    resume: Annotated[
        Path | None,
        typer.Option(
            "--resume", help="Continue an interrupted run from its last checkpoint."
        ),
    ] = None,
    address: AddressOption = None,
    quiet: QuietOption = False,
    report: Annotated[
        bool, typer.Option("--report/--no-report", help="Write plots and report.md.")
    ] = True,
    overwrite: Annotated[
        bool,
        typer.Option(
            "--overwrite", help="Replace the results already in --out (not resume)."
        ),
    ] = False,
    log_every: Annotated[
        float,
        typer.Option(
            "--log-every",
            min=0,
            help="Without a terminal (batch jobs, ray job submit): a plain "
            "progress line at least every this many seconds, and every 10% of "
            "the rounds.",
        ),
    ] = 30.0,
) -> None:
    """Run a scenario (or resume a run) and write its results."""
    overrides = list(set_ or [])
    if seed is not None:
        overrides.append(f"seed={_seed(seed)}")
    if resume is not None:
        if scenario is not None or overrides or out_dir is not None:
            _fail("--resume RUN_DIR takes no scenario, --out, --seed or --set")
        scenario, out_dir = resume / "scenario.yaml", resume
        _expect_dir(resume, "--resume", "a run directory")
        if not scenario.exists():
            _fail(f"{resume}: not a run directory (no scenario.yaml)")
    if scenario is None:
        _fail("missing SCENARIO (a YAML file), or --resume RUN_DIR")
    from fedsim.results import default_run_dir

    _expect_dir(out_dir, "--out", "a run directory")
    sc = _load(scenario, overrides, seed)
    _preflight(sc, scenario, workers)
    run_dir = out_dir if out_dir is not None else default_run_dir(sc.name)
    start, sim0 = _prepare_run_dir(sc, run_dir, scenario, resume, overwrite)
    n_workers = _start_workers(sc, workers, address)
    with _progress(sc, quiet, start, sim0, log_every) as on_round:
        result = _run(sc, n_workers, run_dir, resume is not None, on_round)
    raise typer.Exit(_finish(result, run_dir, report, quiet))


def _seed(text: str) -> int:
    """``--seed``'s value, or a one-line error naming the option."""
    value = -1
    with suppress(ValueError):
        value = int(text.strip(), 10)
    if value < 0:
        _fail(f"--seed {text}: expected a whole number >= 0")
    return value


def _load(scenario: Path, overrides: list[str], seed: str | None = None) -> Scenario:
    """load_scenario, blaming a bad --set or --seed; FedDMClockWarnings as lines."""
    from fedsim.scenario import FedDMClockWarning

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", FedDMClockWarning)
        sc = _load_blamed(scenario, overrides, seed)
    for w in caught:
        if issubclass(w.category, FedDMClockWarning):
            _say("[yellow]warning:[/]", str(w.message))
        else:  # not ours: as Python would have shown it
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return sc


def _load_blamed(scenario: Path, overrides: list[str], seed: str | None) -> Scenario:
    """:func:`_load` without the warnings."""
    from fedsim.scenario import ScenarioError, load_scenario

    try:
        return load_scenario(scenario, overrides)
    except ScenarioError as exc:
        if not overrides:
            _fail(str(exc))
        error = exc
    try:  # is the file alone valid? Then an override is to blame.
        load_scenario(scenario, [])
    except ScenarioError:
        _fail(str(error))
    blamed = []
    for o in overrides:
        try:
            load_scenario(scenario, [o])
        except ScenarioError as exc:
            key = o.split("=", 1)[0].strip()
            # run's --seed N arrives as the last override, seed=N
            by_seed = seed is not None and o is overrides[-1] and key == "seed"
            option = f"--seed {seed}" if by_seed else f"--set {o}"
            blamed.append(f"{option}: {_problem(str(exc), scenario, key)}")
    if not blamed:  # only the combination fails (a cross-field check)
        options = " ".join(f"--set {o}" for o in overrides)
        blamed.append(f"{options}: {_problem(str(error), scenario, '')}")
    _fail("; ".join(blamed))


def _problem(message: str, scenario: Path, key: str) -> str:
    """A ScenarioError's problems on one line, less the file's and ``key``'s names."""
    lines = [ln.strip() for ln in message.splitlines() if ln.strip()]
    if len(lines) > 1 and "invalid scenario" in lines[0]:
        lines = lines[1:]
    for prefix in filter(None, (f"{scenario}: ", key and f"{key}: ")):
        lines = [ln.removeprefix(prefix) for ln in lines]
    return "; ".join(lines)


def _expect_dir(path: Path | None, option: str, what: str) -> None:
    """A path that exists but is not a folder: say so, naming the option."""
    if path is not None and path.exists() and not path.is_dir():
        _fail(f"{option} {path}: is a file, expected {what}")


def _preflight(sc: Scenario, scenario: Path, workers: int | None = None) -> None:
    """preflight, after checking that a data root that exists is a folder."""
    from fedsim.data.errors import ENV_ROOT
    from fedsim.preflight import preflight
    from fedsim.scenario import ScenarioError

    if "root" in type(sc.data).model_fields:  # not e.g. synthetic data
        where = "data.root" if sc.data.root else ENV_ROOT
        root = sc.data.root or os.environ.get(ENV_ROOT)
        path = Path(root or ".").expanduser()
        if root and path.exists() and not path.is_dir():
            _fail(f"{where} {root}: is a file, expected a data folder")
    with _errors(ScenarioError):
        preflight(sc, str(scenario), workers=workers)


def _prepare_run_dir(
    sc: Scenario, run_dir: Path, scenario: Path, resume: Path | None, overwrite: bool
) -> tuple[int, float]:
    """Before Ray starts: a new run's resolved scenario, or a resumed one's checkpoint
    (of the same experiment); returns the (round, simulated time) to start from."""
    from fedsim.checkpoint import CheckpointError, check_fingerprint, latest_checkpoint
    from fedsim.results import atomic_write_bytes, prepare_run_dir
    from fedsim.scenario import dump_scenario

    if resume is None:
        _check_out(run_dir, scenario, overwrite)
    with _errors(OSError):
        prepare_run_dir(run_dir)
        if resume is None:
            atomic_write_bytes(run_dir / "scenario.yaml", dump_scenario(sc).encode())
    if resume is None:
        return 0, 0.0
    with _errors(CheckpointError):
        ck = latest_checkpoint(run_dir)
        check_fingerprint(run_dir, sc, missing_ok=True)
    return ck.next_round, ck.sim_time


def _finish(result: Any, run_dir: Path, report: bool, quiet: bool) -> int:
    """Say how the run ended, write summary.json and the report; return the code."""
    from fedsim.results import write_summary

    status = result.status
    code = _EXIT_CODES[status]
    kept = {
        "stalled": "Rows so far are kept.",
        "diverged": f"Rows so far and the last good checkpoint are kept in {run_dir}.",
    }
    if status in kept:
        _say(f"[bold red]run {status}:[/]", f"{result.message}. {kept[status]}")
    elif status == "interrupted":
        again = f"fedsim run --resume {run_dir}"
        if not (run_dir / "LATEST").exists():
            again = "(no checkpoint yet: run it again)"
        why = "" if result.message == "interrupted" else f"{result.message}; "
        _say(
            "[yellow]interrupted;[/]",
            f"{why}rows so far are kept in {run_dir}; continue with: {again}",
        )
    summary = result.summary()
    if summary["degenerate"]:
        _say("[yellow]warning:[/]", f"degenerate run: {summary['degenerate']}")
    try:
        write_summary(run_dir / "summary.json", summary)
        if report and result.rows:
            from fedsim.report import write_report

            write_report(run_dir)
    except OSError as exc:  # e.g. the disk that failed the run is still full
        code = code or 1
        _say("[bold red]cannot write the summary or report:[/]", str(exc))
    if not quiet:
        table = Table(title=f"{result.scenario.name}: summary", show_header=False)
        for key in _SUMMARY_KEYS.split():
            table.add_row(key, _fmt(summary[key], ".4g"))
        out.print(table)
    out.print(f"results: {run_dir}")
    return code


_EXIT_CODES = {"completed": 0, "diverged": 1, "stalled": 1, "interrupted": 130}
_SUMMARY_KEYS = """rounds final_test_accuracy best_test_accuracy final_test_loss
sim_time_s wall_time_s updates_completed updates_dropped workers"""
# What a run writes into its directory (besides the input it was given).
_RESULTS = ("rounds.parquet", "clients.parquet", "summary.json", "LATEST")
_TABLES = (".parquet", ".png")  # tables and figures a run or report writes


def _check_out(run_dir: Path, scenario: Path, overwrite: bool) -> None:
    """Refuse to write over the scenario or another run (``--overwrite`` clears it)."""
    target = run_dir / "scenario.yaml"
    if target.exists() and target.resolve() == Path(scenario).resolve():
        _fail(
            f"--out {run_dir}: the run would write over its own scenario file "
            f"{scenario}; choose another --out"
        )
    held = [n for n in _RESULTS if (run_dir / n).exists()]
    if not held:
        return
    if not overwrite:
        _fail(
            f"--out {run_dir} holds the results of a run ({', '.join(held)}); "
            f"continue it with: fedsim run --resume {run_dir}, choose another "
            "--out, or pass --overwrite to replace them"
        )
    old = {*_RESULTS, "report.md", "scenario.yaml"}
    for p in run_dir.iterdir():  # the old run's files, not the user's others
        if p.name in old or p.name.startswith("ckpt-") or p.suffix in _TABLES:
            shutil.rmtree(p) if p.is_dir() else p.unlink()


def _start_workers(sc: Scenario, workers: int | None, address: str | None) -> int:
    """Ray worker actors (0: in-process), once Ray is up and can place them."""
    if workers == 0 or (workers is None and sc.resources.workers == 0):
        return 0
    from fedsim.executors import resolve_workers
    from fedsim.preflight import check_address, check_ray_resources
    from fedsim.ray_session import init_ray
    from fedsim.scenario import ScenarioError

    with _errors(ScenarioError):
        if address:
            check_address(address)
        init_ray(address)
        import ray

        n = resolve_workers(sc, workers)
        check_ray_resources(sc, n, ray.cluster_resources())
    return n


def _run(sc: Scenario, workers: int, run_dir: Path, resume: bool, on_round: Any) -> Any:
    """run_scenario, with its errors as the command line reports them; meanwhile a
    scheduler's SIGTERM (Kubernetes, Slurm) stops the run like Ctrl-C."""
    from fedsim.checkpoint import CheckpointError
    from fedsim.data import DataError, DataMissingError
    from fedsim.runtime import SetupError, run_scenario

    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        with _errors(DataMissingError, DataError, SetupError, CheckpointError):
            return run_scenario(
                sc, workers=workers, run_dir=run_dir, resume=resume, on_round=on_round
            )
    except OSError as exc:
        _say("[bold red]cannot write results:[/]", str(exc))
        if (run_dir / "LATEST").exists():
            _say(
                "",
                "The files on disk are whole, up to the last checkpoint; once "
                f"the cause is fixed, continue with: fedsim run --resume {run_dir}",
            )
        raise typer.Exit(1) from None
    finally:  # the previous handler again (tests, notebooks)
        signal.signal(signal.SIGTERM, previous)


@contextmanager
def _progress(
    sc: Scenario, quiet: bool, start: int, sim0: float, log_every: float = 30.0
) -> Iterator[Any]:
    """Yields the per-round callback: a progress bar, or without a terminal a
    plain line every ``log_every`` seconds and every 10% of the rounds."""
    unit = "versions" if sc.round.policy == "async" else "rounds"
    if not quiet and not err.is_terminal:
        step = max(1, sc.rounds // 10)
        last: dict[str, Any] = {"time": time.monotonic(), "acc": "-"}

        def log_line(row: dict[str, Any], clients: list[dict[str, Any]]) -> None:
            if row["test_accuracy"] == row["test_accuracy"]:
                last["acc"] = _fmt(row["test_accuracy"], ".3f")
            done = row["round"] + 1
            now = time.monotonic()
            if done % step and done != sc.rounds and now - last["time"] < log_every:
                return
            last["time"] = now
            # "k/N done" counts; "last: round t" is the 0-based index of the files.
            err.print(
                f"{sc.name}: {done}/{sc.rounds} {unit} done "
                f"(last: round {row['round']}), sim {duration(row['sim_time'])}, "
                f"acc {last['acc']}",
                highlight=False,
                soft_wrap=True,
            )

        yield log_line
        return
    progress = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        # Progress counts rounds (versions) done; files number them from 0.
        TextColumn("{task.completed:>4.0f}/{task.total:.0f} " + unit),
        TextColumn("sim {task.fields[sim]} acc {task.fields[acc]}"),
        TimeElapsedColumn(),
        console=err,
        disable=quiet,
    )
    with progress:
        bar = progress.add_task(
            sc.name, total=sc.rounds, completed=start, sim=duration(sim0), acc="-"
        )

        def on_round(row: dict[str, Any], clients: list[dict[str, Any]]) -> None:
            if row["test_accuracy"] == row["test_accuracy"]:  # NaN: not evaluated
                progress.update(bar, acc=_fmt(row["test_accuracy"], ".3f"))
            sim = duration(row["sim_time"])
            progress.update(bar, completed=row["round"] + 1, sim=sim)

        yield on_round


@app.command()
def validate(
    scenario: Annotated[Path, typer.Argument(help="Scenario YAML file.")],
    set_: SetOption = None,
) -> None:
    """Check a scenario file and print what it resolves to."""
    import yaml

    from fedsim.scenario import _Dumper

    sc = _load(scenario, list(set_ or []))
    _preflight(sc, scenario)
    # soft_wrap: rich must not break long YAML lines
    text = yaml.dump(
        _applicable(sc), Dumper=_Dumper, sort_keys=False, default_flow_style=None
    )
    out.print(text, highlight=False, markup=False, end="", soft_wrap=True)
    err.print(
        f"ok: {scenario} ({sc.fleet.size} devices, {sc.rounds} rounds, "
        f"{sc.algorithm.name})"
    )


# Fields each choice uses; `fedsim validate` leaves the section's others out.
_USED = {
    ("model", "mlp"): "hidden",
    ("model", "vgg11"): "norm_groups",
    ("model", "resnet18"): "norm_groups",
    ("model", "convnet"): "width depth",
    ("model", "lstm"): "embed_dim lstm_hidden lstm_layers",
    ("round", "fixed_window"): "window_s max_steps",
    ("round", "fixed_epochs"): "epochs deadline_s over_select",
    ("round", "async"): "concurrency max_staleness job_steps max_steps epochs",
    ("speed", "fixed"): "steps_per_s",
    ("speed", "lognormal"): "median_steps_per_s sigma",
    ("speed", "mixture"): "tiers",
    ("slowdown", "fixed"): "factor",
    ("slowdown", "uniform"): "low high",
    ("slowdown", "pareto"): "shape max_factor",
    ("availability", "always"): "",
    ("availability", "on_off"): "mean_on_s mean_off_s",
    ("availability", "daily"): "mean_on_s min_online max_online peak_hour period_s",
}


def _keep(section: dict[str, Any], fields: str) -> dict[str, Any]:
    """``section`` with only the (space-separated) ``fields``, in its order."""
    return {k: v for k, v in section.items() if k in fields.split()}


def _applicable(sc: Scenario) -> dict[str, Any]:
    """The resolved scenario without the fields that do nothing in it."""
    d = sc.model_dump(mode="json")
    model = _USED.get(("model", sc.model.name), "")
    d["model"] = _keep(d["model"], f"name dtype {model}")
    r = sc.round
    used = ["policy", *_USED["round", r.policy].split()]
    if r.policy == "async":  # a job does max_steps or epochs
        used.remove("max_steps" if r.job_steps == "epochs" else "epochs")
    if "epochs" in used and r.epochs_low is not None:  # a range replaces epochs
        used[used.index("epochs")] = "epochs_low epochs_high"
    d["round"] = _keep(d["round"], " ".join(used))
    groups = d["fleet"]["groups"]
    stragglers = [g["stragglers"] for g in [d["fleet"], *groups] if g["stragglers"]]
    dropouts = any(st["dropout_p"] > 0 for st in stragglers)
    for st in stragglers:
        if not dropouts:
            del st["dropout_p"]
        slow = st["slowdown"]
        st["slowdown"] = _keep(slow, "dist " + _USED["slowdown", slow["dist"]])
    for g in groups:
        if g["speed"]:  # workload and scale go with a preset
            preset = "preset workload scale " if g["speed"]["preset"] else ""
            dist = _USED["speed", g["speed"]["dist"]]
            g["speed"] = _keep(g["speed"], f"dist {preset}{dist}")
        if g["network"]["preset"] is None:
            del g["network"]["preset"]
        avail = g["availability"]
        g["availability"] = _keep(avail, "kind " + _USED["availability", avail["kind"]])
    return d


@app.command()
def report(
    run_dir: Annotated[
        Path, typer.Argument(help="Run directory written by `fedsim run`.")
    ],
    timeline_rounds: Annotated[
        int,
        typer.Option(
            "--timeline-rounds",
            min=1,
            help="Rounds shown in the client timeline (the first and last halves).",
        ),
    ] = 20,
) -> None:
    """Write plots (PNG) and report.md for a run directory."""
    from fedsim.report import ReportError, write_report

    with _errors(ReportError):
        path = write_report(run_dir, max_timeline_rounds=timeline_rounds)
    out.print(f"report: {path}", highlight=False)


@app.command()
def stress(
    scenario: Annotated[
        Path, typer.Argument(help="Scenario YAML file (a synchronous one).")
    ],
    sweep: Annotated[
        list[str],
        typer.Option(
            "--sweep",
            help="PATH=v1,v2,... mildest first, e.g. fleet.stragglers.p=0,0.1,0.3,0.5 "
            "(repeat for a grid).",
        ),
    ],
    algorithms: AlgorithmsOption,
    seeds: SeedsOption = 3,
    out_dir: OutDirOption = None,
    target_accuracy: TargetOption = None,
    set_: SetOption = None,
    workers: RunsOption = None,
    address: AddressOption = None,
    quiet: QuietOption = False,
) -> None:
    """Sweep a fleet setting, run each algorithm at each value, and report
    which aggregator degrades least (stress.md, stress.parquet, plots)."""
    from fedsim.data import DataError, DataMissingError
    from fedsim.scenario import ScenarioError
    from fedsim.stress import parse_sweep, run_stress

    _expect_dir(out_dir, "--out", "an output folder")
    grid: dict[str, list[Any]] = {}
    with _errors(ScenarioError):
        for key, values in map(parse_sweep, sweep):
            if key in grid:
                _fail(f"--sweep {key}: given twice")
            grid[key] = values
    labels = _algorithms(algorithms)
    _maybe_ray(workers, address)

    def progress(rec: dict[str, Any]) -> None:
        err.print(
            f"cell {rec['cell']} {rec['algorithm']} seed {rec['seed']}: "
            f"final acc {_fmt(rec['final_accuracy'], '.3f')}, "
            f"sim {rec['sim_time_s']:.0f}s",
            highlight=False,
        )

    with (
        _errors(OSError, RuntimeError, code=1),
        _errors(ScenarioError, DataMissingError, DataError),
    ):
        path = run_stress(
            scenario,
            grid,
            labels,
            seeds=seeds,
            out_dir=out_dir,
            workers=workers,
            target_accuracy=target_accuracy,
            overrides=list(set_ or []),
            progress=None if quiet else progress,
        )
    out.print(f"report: {path / 'stress.md'}", highlight=False)
    import pyarrow.parquet as pq

    diverged = pq.read_table(path / "stress.parquet", columns=["diverged"])
    _exit_if_diverged(sum(diverged.column(0).to_pylist()), "stress.parquet")


@app.command()
def compare(
    scenario: Annotated[Path, typer.Argument(help="Scenario YAML file.")],
    algorithms: AlgorithmsOption,
    seeds: SeedsOption = 3,
    target: TargetOption = None,
    out_dir: OutDirOption = None,
    set_: SetOption = None,
    workers: RunsOption = 0,
    address: AddressOption = None,
    quiet: QuietOption = False,
) -> None:
    """Run several algorithms on identical fleets and data, over seeds 0..N-1,
    and write compare.parquet, compare.md and compare.png (accuracy against
    simulated time and rounds, with seed bands)."""
    from fedsim.compare import compare as run_compare
    from fedsim.data import DataMissingError
    from fedsim.results import default_run_dir, prepare_run_dir

    overrides = list(set_ or [])
    _expect_dir(out_dir, "--out", "an output folder")
    sc = _load(scenario, overrides)
    names = _algorithms(algorithms)
    run_dir = out_dir if out_dir is not None else default_run_dir(f"compare-{sc.name}")
    with _errors(OSError):
        prepare_run_dir(run_dir)

    def show(row: dict[str, Any]) -> None:
        flag = "  [red]diverged[/]" if row["diverged"] else ""
        err.print(
            f"{row['algorithm']} seed {row['seed']}: final accuracy "
            f"{_fmt(row['final_accuracy'], '.4f')}, {row['wall_time_s']:.0f}s{flag}"
        )

    _maybe_ray(workers, address)
    with _errors(ValueError, DataMissingError):  # ScenarioError, DataError too
        table = run_compare(
            scenario,
            names,
            seeds=seeds,
            overrides=overrides,
            out_dir=run_dir,
            target_accuracy=target,
            progress=None if quiet else show,
            workers=workers,
        )
    text = (run_dir / "compare.md").read_text()
    out.print(text, markup=False, highlight=False, soft_wrap=True)
    out.print(f"results: {run_dir}")
    _exit_if_diverged(sum(int(r["diverged"]) for r in table), "compare.parquet")


def _algorithms(algorithms: str) -> list[str]:
    """``--algorithms`` split, and not empty."""
    from fedsim.compare import split_algorithms

    labels = split_algorithms(algorithms)
    if not labels:
        _fail("--algorithms: give at least one algorithm")
    return labels


def _maybe_ray(workers: int | None, address: str | None) -> None:
    """Start or join Ray unless --workers 0 runs everything in this process."""
    if workers != 0:
        from fedsim.ray_session import init_ray

        init_ray(address)


def _exit_if_diverged(n: int, where: str) -> None:
    """Exit 1 when runs diverged: the results are written, and say which."""
    if n:
        _say(
            "[bold red]diverged:[/]", f"{n} run(s); see the diverged column of {where}"
        )
        raise typer.Exit(1)


def main() -> None:
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    app()  # exits with the command's code


if __name__ == "__main__":
    main()
