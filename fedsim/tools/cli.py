"""The ``fedsim`` command line: ``fedsim run | validate | report | compare | stress``.

Exit codes (README.md): 0 success; 1 a failed run (e.g. diverged); 2 invalid
scenario or arguments, with one message on stderr and no traceback; 130 stopped.

How the module keeps those promises:

- Every refusal is :func:`_fail` (one ``error:`` line, then the exit code).
  fedsim's own errors (:class:`fedsim.errors.FedsimError`) are turned into
  it in one place, the command group :class:`_Commands`, with the exit code
  their kind says; the few built-in errors a command expects (an OSError
  writing --out, ...) by :func:`_errors`, naming them. Any other exception
  still shows its traceback (a bug to fix, not a message to word).
- Everything is checked before anything is written: the scenario (once,
  with every ``--set`` applied), preflight, the output folder, and for a
  resume every file it will read. A refused command leaves the disk as it
  found it.
- SIGTERM is Ctrl-C from :func:`main` on, and an interrupt during set-up is
  reported like one in a round (exit 130, summary.json, how to continue).
  In the round loop the first one stops the run before the next round, a
  second one (or a SIGTERM's grace period, FEDSIM_SIGTERM_GRACE_S) at once
  (fedsim/interrupts.py: a KeyboardInterrupt raised anywhere can be lost).
  An interrupted report says the run's results are whole and how to draw
  it again.
- Nothing the user asked for is silently dropped: options that would
  override each other (``--seed`` and ``--set seed``), or fields that compare
  and stress set themselves, are refused with the option to use instead.
- Heavy modules (torch, Ray, pyarrow) are imported inside the commands that
  need them, so ``fedsim --help`` and ``fedsim validate`` start at once.
"""

from __future__ import annotations

import functools
import inspect
import os
import re
import shutil
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext, suppress
from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, TypedDict, get_type_hints

import click
import typer
import typer.core
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from fedsim import __version__, interrupts
from fedsim.algorithms import REGISTRY
from fedsim.errors import FedsimError
from fedsim.units import duration

# fedsim.scenario (every plug-in, numpy, pydantic schemas) is imported by the
# commands that read a scenario, so that `fedsim --help` starts at once.
if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from fedsim.scenario import Scenario
    from fedsim.spec import ResourceSpec
    from fedsim.tools.tracking import OnRound, Tracked


class _Commands(typer.core.TyperGroup):
    """The ``fedsim`` command group: the one place fedsim's own errors are
    reported. A :class:`fedsim.errors.FedsimError` that ends a command (or
    its Ray task) is one ``error:`` line with the exit code its kind says:
    2 a refused input (load time), 1 a run that could not go on, 3 a
    plug-in's failure. Any other exception is a bug and keeps its traceback.
    """

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except FedsimError as exc:
            _fail(_error_text(exc), exc.exit_code)


app = typer.Typer(
    cls=_Commands,
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
LogEveryOption = Annotated[
    float,
    typer.Option(
        "--log-every",
        min=0,
        help="Without a terminal (batch jobs, ray job submit): a plain "
        "progress line at least every this many seconds, and every 10% of "
        "the rounds.",
    ),
]
SweepOption = Annotated[
    list[str],
    typer.Option(
        "--sweep",
        help="PATH=v1,v2,... mildest first, e.g. fleet.stragglers.p=0,0.1,0.3,0.5 "
        "(repeat for a grid).",
    ),
]
# The interactive page (fedsim/tools/page.py) and serving it (tools/live.py).
HtmlOption = Annotated[
    bool,
    typer.Option("--html/--no-html", help="Write the interactive page (.html)."),
]
LiveOption = Annotated[
    bool,
    typer.Option(
        "--live", help="Serve the page on 127.0.0.1 while it runs (prints the address)."
    ),
]
_LIVE_PORT = 8765  # fedsim.tools.live.DEFAULT_PORT (not imported at start-up)
LivePortOption = Annotated[
    int,
    typer.Option(
        "--live-port",
        min=0,
        max=65535,
        help="Port for --live (taken: a free one is used, said in one line).",
    ),
]


# compare and stress: the same names for the same things
def _installed_algorithms() -> str:
    """``; installed: a, b`` for the algorithm plug-ins installed packages
    declare (entry points of ``fedsim.algorithms``, not loaded), or ""."""
    from fedsim.plugins import installed

    names = sorted(set(installed("algorithm")) - set(REGISTRY))
    return f"; installed: {', '.join(names)}" if names else ""


AlgorithmsOption = Annotated[
    str,
    typer.Option(
        "--algorithms",
        "-a",
        # the names from the registry and the installed packages' entry
        # points, so that a new algorithm (built in or a plug-in) is listed
        help="Comma-separated algorithms, each NAME or NAME:key=value,... "
        f"(NAME: {', '.join(REGISTRY)}{_installed_algorithms()}), or an import "
        "path module.path:Class or module.path:Class?key=value,... (docs/"
        "extending.md).",
    ),
]
SeedsOption = Annotated[int, typer.Option("--seeds", min=1, help="Seeds 0..N-1.")]
UntilDecidedOption = Annotated[
    bool,
    typer.Option(
        "--until-decided",
        help="Add --seeds seeds at a time until every arm is decided against the "
        "baseline (an anytime-valid confidence sequence) or --max-seeds is reached.",
    ),
]
MaxSeedsOption = Annotated[
    int,
    typer.Option("--max-seeds", min=2, help="With --until-decided: the most seeds."),
]
BaselineOption = Annotated[
    str | None,
    typer.Option(
        "--baseline",
        help="The algorithm every other is paired with, seed by seed (default: "
        "the first of --algorithms).",
    ),
]
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
OverwriteOption = Annotated[
    bool,
    typer.Option("--overwrite", help="Replace the results already in --out."),
]
# trackers (fedsim/tools/tracking.py), the optional extra fedsim[track]
LogOption = Annotated[
    list[str] | None,
    typer.Option(
        "--log",
        metavar="TRACKER",
        help="Also log every round to tensorboard (event files in the run "
        "folder) or mlflow (MLFLOW_TRACKING_URI, else ./mlruns); repeatable.",
    ),
]


def _trackers(log: list[str] | None, folder: Path | None = None) -> list[str]:
    """The --log choices, refused (exit 2) when unknown, not installed or
    unusable (an MLflow store that cannot be reached, a file where
    ``folder``'s tensorboard/ goes), before anything runs."""
    if not log:
        return []
    from fedsim.tools.tracking import require

    with _errors(ValueError):  # an unknown kind; fedsim's own errors: _Commands
        require(log or [], folder)
    return list(dict.fromkeys(log or []))


def _version(value: bool) -> None:
    """``--version``: print it and exit 0 before any command is parsed (the
    option is eager, so ``fedsim --version run`` needs no scenario)."""
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
    _check_sigterm_grace()


def _check_sigterm_grace() -> None:
    """Refuse a bad FEDSIM_SIGTERM_GRACE_S before any command runs (a
    signal handler could only fall back to the default)."""
    try:
        interrupts.sigterm_grace_s()
    except ValueError as exc:
        _fail(str(exc))


def _say(label: str, message: str) -> None:
    """A line on stderr, never wrapped (paths stay whole); ``message`` is not markup.

    Args:
        label: rich markup (``[bold red]error:[/]``), or "" for none.
        message: plain text, escaped: a path or value holding ``[...]`` is
            shown as it is rather than read as markup.
    """
    message = escape(_ANSI.sub("", message))  # Ray colours its errors' text
    text = f"{label} {message}" if label else message
    err.print(text, highlight=False, soft_wrap=True)


# A terminal colour or cursor code (CSI ... final byte), as Ray writes into the
# text of its task errors: on a log file or a pipe they are noise.
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")


def _is_ray_error(exc: BaseException) -> bool:
    """Whether ``exc`` is one of Ray's errors (a task's exception carried back
    from a worker, a dead actor), without importing Ray for a command that
    never started it."""
    errors = sys.modules.get("ray.exceptions")
    return errors is not None and isinstance(exc, errors.RayError)


def _error_text(exc: BaseException) -> str:
    """The one line that reports ``exc``: its own text, or for an exception
    raised in a Ray worker the text of its cause and where it was raised
    (Ray's own text holds the worker's whole traceback, in colour)."""
    cause = getattr(exc, "cause", None)
    if _is_ray_error(exc) and isinstance(cause, BaseException):
        pid = getattr(exc, "pid", "?")
        text = _error_text(cause) or type(cause).__name__
        if isinstance(cause, ImportError):  # the worker's environment differs
            text += (
                "; a Ray worker must import what this process imports "
                "(installed, or on a PYTHONPATH the workers inherit)"
            )
        return f"{text} (in Ray worker pid {pid})"
    if _is_ray_error(exc):  # a dead actor or node: Ray's first line says which
        return _ANSI.sub("", str(exc)).strip().splitlines()[0]
    return str(exc)


def _fail(message: str, code: int = 2) -> NoReturn:
    """One ``error:`` line on stderr, then exit ``code`` (2: the user's input
    is wrong; 1: the run failed). Every refusal goes through here, so that no
    message is a traceback and each names the option or file at fault."""
    _say("[bold red]error:[/]", message)
    raise typer.Exit(code)


@contextmanager
def _errors(*kinds: type[Exception], code: int = 2) -> Iterator[None]:
    """Report these built-in exceptions as one error line and exit with
    ``code``. fedsim's own errors (FedsimError, e.g. a DataMissingError,
    which is also an OSError) go on to :class:`_Commands`, which reports
    them with their own exit code.

    Args:
        kinds: built-in exceptions whose message is written for the user
            as is (OSError, ValueError, ...); any other exception is a bug
            and keeps its traceback.
        code: the exit code for them.
    """
    try:
        yield
    except (typer.Exit, FedsimError):  # typer.Exit: a RuntimeError, already said
        raise
    except kinds as exc:
        _fail(_error_text(exc), code)


@contextmanager
def _worker_errors() -> Iterator[None]:
    """Report an error that a Ray worker raised (other than fedsim's own,
    which :class:`_Commands` reports) as one line, exit 1: the cause
    and the worker, never Ray's coloured traceback of the worker. A
    plug-in's failure (:class:`fedsim.hooks.PluginFailure`, raised here or
    in a worker) is one line too, with a run's exit code for it, 3."""
    from fedsim.hooks import PluginFailure

    try:
        yield
    except typer.Exit:
        raise
    except PluginFailure as exc:  # an arm's plug-in failed in this process
        _fail(f"{exc}; {_PLUGIN_FAILED}", 3)
    except FedsimError:  # also from a worker: its kind's code (_Commands)
        raise
    except Exception as exc:
        if not _is_ray_error(exc):
            raise  # fedsim's own bug: keep its traceback
        if isinstance(getattr(exc, "cause", None), PluginFailure):
            # ... or in a Ray worker: the plug-in's exit code, not a crash's
            _fail(f"{_error_text(exc)}; {_PLUGIN_FAILED}", 3)
        _fail(_error_text(exc), 1)


# What compare and stress say after a plug-in's failure (exit 3, as a run's).
_PLUGIN_FAILED = (
    "the runs that finished before it are kept in --out's runs/; fix the "
    "plug-in and run the command again"
)


def _fmt(x: Any, spec: str = ".4f") -> str:
    """``x`` formatted for the summary table; "-" for None and NaN (not
    evaluated), and ``str(x)`` for what the spec does not fit."""
    try:
        return "-" if x is None or x != x else format(x, spec)
    except (TypeError, ValueError):
        return str(x)


class _LibraryOptions(TypedDict):
    """:meth:`ArmsOptions.library`: compare's and run_stress's arguments."""

    seeds: int
    target_accuracy: float | None
    overrides: list[str]
    baseline: str | None
    max_seeds: int | None


@dataclass(frozen=True)
class ArmsOptions:
    """The options compare and stress share, declared once: each command
    takes them after its own (:func:`_arms_command`), so that both spell,
    check and document them alike."""

    algorithms: AlgorithmsOption
    seeds: SeedsOption = 3
    target: TargetOption = None
    out_dir: OutDirOption = None
    set_: SetOption = None
    address: AddressOption = None
    quiet: QuietOption = False
    overwrite: OverwriteOption = False
    baseline: BaselineOption = None
    log: LogOption = None
    live: LiveOption = False
    live_port: LivePortOption = _LIVE_PORT
    until_decided: UntilDecidedOption = False
    max_seeds: MaxSeedsOption = 20

    @property
    def overrides(self) -> list[str]:
        """The ``--set`` items, in the order given."""
        return list(self.set_ or [])

    def library(self) -> _LibraryOptions:
        """The arguments of fedsim.tools.compare.compare and
        fedsim.tools.stress.run_stress that these options give (``max_seeds``
        only with ``--until-decided``; None: one batch of seeds)."""
        return {
            "seeds": self.seeds,
            "target_accuracy": self.target,
            "overrides": self.overrides,
            "baseline": self.baseline,
            "max_seeds": self.max_seeds if self.until_decided else None,
        }

    def check(self) -> None:
        """Refuse (exit 2) an --out that is a file, and a --max-seeds below
        --seeds with --until-decided, before anything is loaded."""
        _expect_dir(self.out_dir, "--out", "an output folder")
        if self.until_decided and self.max_seeds < self.seeds:
            _fail(
                f"--max-seeds {self.max_seeds}: expected at least --seeds "
                f"({self.seeds})"
            )


def _arms_command(fn: Callable[..., None]) -> Callable[..., None]:
    """Register ``fn(<its own parameters>, *, opts: ArmsOptions)`` as a
    command whose options are its own, then :class:`ArmsOptions`' (typer
    reads a command's options from its signature: the one given here)."""
    hints = get_type_hints(ArmsOptions, include_extras=True)
    shared = [
        inspect.Parameter(
            f.name,
            inspect.Parameter.KEYWORD_ONLY,
            default=inspect.Parameter.empty if f.default is MISSING else f.default,
            annotation=hints[f.name],
        )
        for f in fields(ArmsOptions)
    ]
    own = inspect.signature(fn, eval_str=True).parameters.values()

    @functools.wraps(fn)
    def command(**given: Any) -> None:
        opts = ArmsOptions(**{p.name: given.pop(p.name) for p in shared})
        fn(**given, opts=opts)

    signature = inspect.Signature([p for p in own if p.name != "opts"] + shared)
    command.__signature__ = signature  # type: ignore[attr-defined]
    return app.command(fn.__name__)(command)


# The commands' scenario argument (a path: only the commands load it).
_SCENARIO_FILE = "Scenario YAML file."


@app.command()
def run(
    scenario: Annotated[
        Path | None, typer.Argument(help=_SCENARIO_FILE, show_default=False)
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
    log_every: LogEveryOption = 30.0,
    log: LogOption = None,
    html: HtmlOption = True,
    live: LiveOption = False,
    live_port: LivePortOption = _LIVE_PORT,
) -> None:
    """Run a scenario (or resume a run) and write its results.\f

    Exit codes: 0 completed (also: a resume with nothing left to do, which
    changes no file); 1 diverged, stalled, out of memory, results not
    written or Ray not started in time; 3 plug-in code failed during the
    run (failure.txt holds the traceback); 2 a refused input (scenario,
    options, data, checkpoint, placement); 130 interrupted, at any point
    from the first line on (also while the report of a finished run is
    drawn: ``fedsim report DIR`` draws it). A first SIGTERM waits for the
    round's end at most FEDSIM_SIGTERM_GRACE_S seconds (default 20).
    """
    # A scheduler's SIGTERM (Kubernetes, Slurm) stops the run like Ctrl-C from
    # the first line on: set-up (data, model, Ray) can take minutes. In the
    # round loop either waits for the round's end (fedsim/interrupts.py).
    reached: dict[str, Any] = {}  # how far set-up got (see _set_up)
    trackers = _trackers(log, out_dir or resume)
    with interrupts.stop_at_round_ends():
        try:
            sc, run_dir, start, sim0 = _set_up(
                scenario, out_dir, workers, seed, list(set_ or []), resume,
                overwrite, reached,
            )  # fmt: skip
            reached["workers"] = n = _start_workers(sc.resources, workers, address)
            with (
                _live(live, run_dir, live_port, "run"),  # the page, while it runs
                _progress(sc, quiet, start, sim0, log_every) as on_round,
                _tracked(trackers, run_dir, sc.name, on_round, resume) as tr,
            ):
                result = _run(sc, n, run_dir, resume is not None, tr.on_round)
                tr.status = result.status
        except KeyboardInterrupt:  # during set-up: the loop catches its own
            code = _set_up_interrupted(reached, resume is not None, quiet)
        else:  # not in the try: an interrupt while the report is written must
            # not replace the summary of the rows with the one of an empty set-up
            code = _finish(result, run_dir, report, quiet, html)
    raise typer.Exit(code)


def _live(
    live: bool, directory: Path, port: int, kind: str
) -> AbstractContextManager[object]:
    """With ``--live``, the page of ``directory`` served on 127.0.0.1 for
    the block (fedsim.tools.live.serving); else nothing.

    Args:
        live: ``--live`` was given.
        directory: the output directory the command writes.
        port: ``--live-port``.
        kind: "run", "compare" or "stress": which page.
    """
    if not live:
        return nullcontext()
    from fedsim.tools.live import serving
    from fedsim.tools.page import run_page_data
    from fedsim.tools.page_group import group_page_data

    build = run_page_data if kind == "run" else group_page_data

    def say(line: str) -> None:
        err.print(line, highlight=False, soft_wrap=True)

    with _errors(OSError, code=1):  # not even a free port on the loopback
        return serving(directory, build, port, say, f"fedsim {kind}: starting")


def _tracked(
    trackers: list[str],
    run_dir: Path,
    name: str,
    on_round: OnRound | None,
    resume: Path | None,
) -> AbstractContextManager[Tracked]:
    """fedsim.tools.tracking.tracked, imported here (its tracker libraries only
    when ``trackers`` asks for them): without --log it tracks nothing and
    its ``on_round`` calls the caller's callback alone. The trackers record
    the resolved scenario from ``run_dir``'s scenario.yaml, under the
    scenario's ``name`` (the MLflow experiment); a ``resume`` continues
    their runs, each round logged once."""
    from fedsim.tools.tracking import tracked

    return tracked(trackers, run_dir, name, on_round, resume is not None)


def _set_up(
    scenario: Path | None,
    out_dir: Path | None,
    workers: int | None,
    seed: str | None,
    overrides: list[str],
    resume: Path | None,
    overwrite: bool,
    reached: dict[str, Any],
) -> tuple[Scenario, Path, int, float]:
    """Check the arguments, load and check the scenario, and prepare the run
    directory; returns the scenario, the directory and the (round, simulated
    time) to start from. ``reached`` gets ``sc`` and ``run_dir`` as soon as
    they are known, so that an interrupt can say what was written.

    A resume of a finished run exits here, 0, without touching a file."""
    if seed is not None:
        _seed_once(seed, overrides)
        overrides.append(f"seed={_seed(seed)}")
    if resume is not None:
        scenario, out_dir = _resume_args(resume, scenario, overrides, out_dir)
    if scenario is None:
        _fail("missing SCENARIO (a YAML file), or --resume RUN_DIR")
    from fedsim.results import default_run_dir

    _expect_dir(out_dir, "--out", "a run directory")
    sc = _load(scenario, overrides, seed)
    _preflight(sc, scenario, workers)
    run_dir = out_dir if out_dir is not None else default_run_dir(sc.name)
    reached.update(sc=sc, run_dir=run_dir)
    start, sim0 = _prepare_run_dir(sc, run_dir, scenario, resume, overwrite)
    if resume is not None and start >= sc.rounds and _finished(run_dir):
        # rewriting summary.json would change only its wall time: leave it
        _say(
            "",
            f"nothing to do: {run_dir} holds a finished run ({sc.rounds} rounds); "
            "every file is left as it was (fedsim report rewrites the report)",
        )
        raise typer.Exit(0)
    return sc, run_dir, start, sim0


def _resume_args(
    resume: Path, scenario: Path | None, overrides: list[str], out_dir: Path | None
) -> tuple[Path, Path]:
    """``--resume RUN_DIR``'s scenario file and output folder (both in
    RUN_DIR), refusing options that would contradict them: the resolved
    scenario.yaml in RUN_DIR is the experiment, and another one (or a
    --set of an experiment field) would make the resumed rows a mix of two.

    ``--set resources.…`` is taken: where the work runs is not part of the
    experiment (the checkpoint's fingerprint leaves ``resources`` out, and
    results do not depend on it), and a resume may need it, e.g. to place
    the server actor on another node when its own node was lost."""
    placement = [o for o in overrides if o.split("=", 1)[0].startswith("resources.")]
    if scenario is not None or out_dir is not None or len(placement) < len(overrides):
        _fail(
            "--resume RUN_DIR takes no scenario, --out, --seed or --set, but "
            "--set resources.… (where the work runs, e.g. "
            "resources.server.resources={node_b: 0.01})"
        )
    _expect_dir(resume, "--resume", "a run directory")
    if not (resume / "scenario.yaml").exists():
        _fail(f"{resume}: not a run directory (no scenario.yaml)")
    return resume / "scenario.yaml", resume


def _seed_once(seed: str, overrides: list[str]) -> None:
    """Refuse ``--seed`` together with ``--set seed=...``: one would be ignored."""
    for o in overrides:
        if o.split("=", 1)[0].strip() == "seed":
            _fail(f"--seed {seed} and --set {o}: give the seed once")


def _finished(run_dir: Path) -> bool:
    """Whether ``run_dir``'s summary.json says the run completed (an
    unreadable or interrupted one is not finished: the resume writes it)."""
    import json

    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(summary, dict) and summary.get("status") == "completed"


def _set_up_interrupted(reached: dict[str, Any], resuming: bool, quiet: bool) -> int:
    """Ctrl-C or SIGTERM before the first round: say so as for one in a round;
    a new run that has its folder gets summary.json (``status: interrupted``,
    no rows). A resume leaves the files it found as they were.

    Args:
        reached: what :func:`_set_up` got to (``sc``, ``run_dir``,
            ``workers``); empty when the scenario was not even loaded.
        resuming: a ``--resume``; its folder holds a run worth keeping.
        quiet: no summary table.

    Returns:
        130, the exit code of an interrupted run.
    """
    run_dir = reached.get("run_dir")
    if run_dir is None or not (run_dir / "scenario.yaml").exists():
        _say("[yellow]interrupted[/]", "before the run started; nothing was written")
        return 130
    if resuming:
        _say(
            "[yellow]interrupted[/]",
            f"while setting up the resume; {run_dir} is as it was; continue "
            f"with: fedsim run --resume {run_dir}",
        )
        return 130
    from fedsim.runtime import RunResult

    result = RunResult(
        scenario=reached["sc"],
        rows=[],
        clients=[],
        final_params=None,
        status="interrupted",
        message="interrupted during set-up",
        workers=reached.get("workers", 0),
        wall_time_s=0.0,
    )
    return _finish(result, run_dir, False, quiet)


def _seed(text: str) -> int:
    """``--seed``'s value, or a one-line error naming the option (typer's
    own int parsing would accept "-1" and print a usage block instead)."""
    value = -1
    with suppress(ValueError):
        value = int(text.strip(), 10)
    if value < 0:
        _fail(f"--seed {text}: expected a whole number >= 0")
    return value


def _load(scenario: Path, overrides: list[str], seed: str | None = None) -> Scenario:
    """load_scenario, blaming a bad --set or --seed; ScenarioWarnings as lines.

    Args:
        scenario: the YAML file.
        overrides: ``path=value`` items, applied in order (``--seed N``
            arrives last, as ``seed=N``).
        seed: ``--seed``'s text, so that a bad value is blamed on it.

    Returns:
        The validated scenario; on any problem the command exits 2.
    """
    from fedsim.scenario import ScenarioWarning

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ScenarioWarning)
        sc = _load_blamed(scenario, overrides, seed)
    for w in caught:
        if issubclass(w.category, ScenarioWarning):
            _say("[yellow]warning:[/]", str(w.message))
        else:  # not ours: as Python would have shown it
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return sc


def _load_blamed(scenario: Path, overrides: list[str], seed: str | None) -> Scenario:
    """:func:`_load` without the warnings: the scenario, or exit 2 with
    the file's own problems when it is invalid without the overrides, else
    with the overrides' problems (:func:`_blame`)."""
    from fedsim.scenario import ScenarioError, load_scenario

    try:
        return load_scenario(scenario, overrides)
    except ScenarioError as exc:
        if not overrides:
            _fail(str(exc))
        error = exc
    try:  # is the file alone valid? Then the overrides are to blame.
        load_scenario(scenario, [])
    except ScenarioError:
        _fail(str(error))
    _fail(_blame(error, scenario, overrides, seed))


def _blame(
    error: Exception, scenario: Path, overrides: list[str], seed: str | None
) -> str:
    """``error``'s problems, each after the options that set its field.

    The problems are those of the scenario with every override applied: one
    checked alone meets the file's other values, not the other overrides',
    and would be blamed for the wrong thing. A cross-field
    problem whose field no override sets names them all."""
    blamed = []
    for line in _problems(str(error), scenario):
        path = line.split(": ", 1)[0] if ": " in line else ""
        mine = [o for o in overrides if _covers(_key(o), path)]
        options = " ".join(_option(o, overrides, seed) for o in mine or overrides)
        if len(mine) == 1 and path == _key(mine[0]):
            line = line.removeprefix(f"{path}: ")
        blamed.append(f"{options}: {line}")
    return "; ".join(blamed)


def _key(override: str) -> str:
    """The field path of ``path=value``."""
    return override.split("=", 1)[0].strip()


def _covers(key: str, path: str) -> bool:
    """Whether setting ``key`` sets the field ``path`` or one inside it (or
    ``path`` is a section holding ``key``)."""
    if not key or not path:
        return False
    inside = (f"{key}.", f"{key}[")
    return (
        path == key
        or path.startswith(inside)
        or key.startswith((f"{path}.", f"{path}["))
    )


def _option(override: str, overrides: list[str], seed: str | None) -> str:
    """How the user gave ``override``: run's --seed N arrives last, as seed=N."""
    if seed is not None and override is overrides[-1] and _key(override) == "seed":
        return f"--seed {seed}"
    return f"--set {override}"


def _problems(message: str, scenario: Path) -> list[str]:
    """A ScenarioError's problems, one per line, less the file's name."""
    lines = [ln.strip() for ln in message.splitlines() if ln.strip()]
    if len(lines) > 1 and "invalid scenario" in lines[0]:
        lines = lines[1:]
    return [ln.removeprefix(f"{scenario}: ") for ln in lines]


def _expect_dir(path: Path | None, option: str, what: str) -> None:
    """A path that exists but is not a folder: say so, naming the option."""
    if path is not None and path.exists() and not path.is_dir():
        _fail(f"{option} {path}: is a file, expected {what}")


def _preflight(sc: Scenario, scenario: Path, workers: int | None = None) -> None:
    """preflight, after checking that a data root that exists is a folder.

    Args:
        sc: the loaded scenario.
        scenario: its file, named in messages.
        workers: ``--workers``, for the memory estimate (None: the
            scenario's own ``resources.workers``).
    """
    from fedsim.data.errors import ENV_ROOT
    from fedsim.tools.preflight import preflight

    if "root" in type(sc.data).model_fields:  # not e.g. synthetic data
        where = "data.root" if sc.data.root else ENV_ROOT
        root = sc.data.root or os.environ.get(ENV_ROOT)
        path = Path(root or ".").expanduser()
        if root and path.exists() and not path.is_dir():
            _fail(f"{where} {root}: is a file, expected a data folder")
    preflight(sc, str(scenario), workers=workers)


def _prepare_run_dir(
    sc: Scenario, run_dir: Path, scenario: Path, resume: Path | None, overwrite: bool
) -> tuple[int, float]:
    """Before Ray starts: a new run's resolved scenario, or a resumed one's checkpoint
    (of the same experiment); returns the (round, simulated time) to start from.

    A resume checks every file it will read (checkpoint and result tables)
    before anything is written, so a resume that cannot continue exits 2
    with the run directory exactly as it was and still resumable.
    """
    from fedsim.checkpoint import check_fingerprint, check_resumable
    from fedsim.results import atomic_write_bytes, prepare_run_dir
    from fedsim.scenario import dump_scenario, load_scenario

    if resume is None:
        _check_out(run_dir, scenario, overwrite)
    with _errors(OSError):
        prepare_run_dir(run_dir)
        if resume is None:
            atomic_write_bytes(run_dir / "scenario.yaml", dump_scenario(sc).encode())
    if resume is None:
        return 0, 0.0
    # every file the resume reads, before it writes any: a refusal (a
    # CheckpointError, exit 2) leaves nothing half-done
    ck = check_resumable(run_dir)
    check_fingerprint(run_dir, sc, missing_ok=True)
    resolved = dump_scenario(sc)
    if dump_scenario(load_scenario(run_dir / "scenario.yaml")) != resolved:
        # a --set resources.… (the fingerprint allowed it): the next
        # --resume places the work as this one does
        with _errors(OSError):
            atomic_write_bytes(run_dir / "scenario.yaml", resolved.encode())
    return ck.next_round, ck.sim_time


def _finish(
    result: Any, run_dir: Path, report: bool, quiet: bool, html: bool = True
) -> int:
    """Say how the run ended, write summary.json and the report; return the code.

    Args:
        result: the run's RunResult (rows may be empty: set-up interrupted).
        run_dir: where summary.json and the report go.
        report: write plots and report.md (only when there are rows).
        quiet: no summary table on stdout.
        html: with the report, report.html (the interactive page).

    Returns:
        The exit code of the run's status; 1 when summary.json or the report
        cannot be written (the rows on disk are whole).
    """
    from fedsim.results import write_summary

    code = _EXIT_CODES[result.status]
    _say_ending(result, run_dir)
    summary = result.summary()
    if summary["degenerate"]:
        _say("[yellow]warning:[/]", f"degenerate run: {summary['degenerate']}")
    for line in summary.get("fleet_realised", {}).get("warnings", []):
        _say("[yellow]warning:[/]", line)  # declared vs realised (fedsim.realised)
    try:
        write_summary(run_dir / "summary.json", summary)
        if report and result.rows:
            code = _write_report(result, run_dir, code, html)
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


def _write_report(result: Any, run_dir: Path, code: int, html: bool = True) -> int:
    """Draw the report of a run whose summary.json is written (and its
    report.html when ``html``); returns the
    exit code: ``code``, or 130 when Ctrl-C (or SIGTERM) stops the drawing,
    which is said with what is whole and how to draw the report again."""
    from fedsim.tools.page import write_page
    from fedsim.tools.report import write_report

    try:
        write_report(run_dir)
        if html:
            write_page(run_dir)
    except KeyboardInterrupt:
        _say(
            "[yellow]interrupted:[/]",
            f"the run {result.status} and its results are whole in {run_dir}; "
            "the report was interrupted while it was drawn; draw it with: "
            f"fedsim report {run_dir}",
        )
        return 130
    return code


def _say_ending(result: Any, run_dir: Path) -> None:
    """A line on stderr for a run that did not complete: what is kept, and
    for an interrupted one how to continue."""
    status = result.status
    kept = {
        "stalled": "Rows so far are kept.",
        "diverged": f"Rows so far and the last good checkpoint are kept in {run_dir}.",
    }
    if status in kept:
        _say(f"[bold red]run {status}:[/]", f"{result.message}. {kept[status]}")
    elif status == "failed":  # plug-in code (fedsim.hooks.PluginFailure)
        where = run_dir / (result.failure or {}).get("traceback", "summary.json")
        _say(
            "[bold red]run failed:[/]",
            f"{result.message}. The full traceback is in {where}; "
            f"{_what_is_kept(result, run_dir, 'once the plug-in is fixed, ')}",
        )
    elif status == "interrupted":
        # a signal says only "interrupted"; a lost server actor says why
        why = result.message.removeprefix("interrupted").strip()
        why = f"{why}; " if why else ""
        _say("[yellow]interrupted:[/]", f"{why}{_what_is_kept(result, run_dir)}")


def _what_is_kept(result: Any, run_dir: Path, when: str = "") -> str:
    """What a run that stopped keeps in ``run_dir`` and how to go on: the
    resume command once a checkpoint exists, else that the same command
    starts over with --overwrite (no "rows so far" when there are none).

    Args:
        result: the RunResult (its rows).
        run_dir: the run's folder.
        when: what must happen first ("once the plug-in is fixed, ").
    """
    rows = f"{len(result.rows)} round row(s) are kept in {run_dir}"
    if not result.rows:
        rows = f"no round finished; {run_dir} holds summary.json"
    if (run_dir / "LATEST").exists():
        return f"{rows}; {when}continue with: fedsim run --resume {run_dir}"
    return f"{rows}; no checkpoint yet: {when}run the same command with --overwrite"


# 3: plug-in code failed during the run: its own code, so that a
# script tells a broken plug-in from a diverged run
_EXIT_CODES = {
    "completed": 0,
    "diverged": 1,
    "stalled": 1,
    "failed": 3,
    "interrupted": 130,
}
_SUMMARY_KEYS = """rounds final_test_accuracy best_test_accuracy final_test_loss
sim_time_s wall_time_s updates_completed updates_dropped workers"""
# What a run writes into its directory (besides the input it was given).
_RESULTS = ("rounds.parquet", "clients.parquet", "summary.json", "LATEST")
_TABLES = (".parquet", ".png")  # tables and figures a run or report writes


def _check_out(run_dir: Path, scenario: Path, overwrite: bool) -> None:
    """Refuse to write over the scenario or another run (``--overwrite`` clears it).

    The check looks at the files a run writes, not at whether the folder is
    empty: an --out that holds only the user's own files is fine to use.
    """
    target = run_dir / "scenario.yaml"
    if target.exists() and target.resolve() == Path(scenario).resolve():
        _fail(
            f"--out {run_dir}: the run would write over its own scenario file "
            f"{scenario}; choose another --out"
        )
    resume = f"continue it with: fedsim run --resume {run_dir}, "
    if _held(run_dir, _RESULTS, overwrite, ("the results of a run", resume)):
        _clear_run(run_dir)


def _held(
    out_dir: Path, files: tuple[str, ...], overwrite: bool, said: tuple[str, str]
) -> list[str]:
    """Which of ``files`` --out holds: refused (exit 2) unless ``overwrite``,
    naming them, so that no earlier result is mixed with new ones.

    Args:
        out_dir: the --out folder (it may not exist yet).
        files: the names the command writes there.
        overwrite: ``--overwrite`` was given.
        said: what the files are ("earlier results"), and what else the
            refusal offers before another --out or --overwrite ("" for none).
    """
    held = [n for n in files if (out_dir / n).exists()]
    if held and not overwrite:
        _fail(
            f"--out {out_dir} holds {said[0]} ({', '.join(held)}); {said[1]}"
            "choose another --out, or pass --overwrite to replace them"
        )
    return held


def _clear_run(run_dir: Path) -> None:
    """Delete an old run's files for ``--overwrite``, leaving any other file:
    --out may be a folder the user also keeps other things in."""
    old = {*_RESULTS, "report.md", "report.html", "scenario.yaml"}
    for p in run_dir.iterdir():  # the old run's files, not the user's others
        if p.name in old or p.name.startswith("ckpt-") or p.suffix in _TABLES:
            shutil.rmtree(p) if p.is_dir() else p.unlink()


def _start_workers(res: ResourceSpec, workers: int | None, address: str | None) -> int:
    """Ray worker actors (0: in-process), once Ray is up and can place them.

    Args:
        res: the scenario's ``resources`` section.
        workers: ``--workers``; None: the scenario's own count.
        address: a Ray cluster to join; None: RAY_ADDRESS or an embedded Ray.

    Returns:
        The number of worker actors the run will start; exits 2 when the
        cluster cannot hold them (checked before any actor starts).
    """
    if workers == 0 or (workers is None and res.workers == 0):
        return 0
    import ray

    from fedsim.remote.placement import resolve_workers
    from fedsim.remote.ray_session import init_ray
    from fedsim.tools.preflight import check_address, check_ray_resources

    if address:
        check_address(address)
    init_ray(address)
    n = resolve_workers(res, workers)
    check_ray_resources(res, n, ray.cluster_resources())
    return n


def _run(sc: Scenario, workers: int, run_dir: Path, resume: bool, on_round: Any) -> Any:
    """run_scenario, with its errors as the command line reports them.

    Exits 2 for a refused input found only now (missing data, a checkpoint,
    a placement Ray cannot meet), 1 for results that cannot be written or
    memory the system refused; KeyboardInterrupt from set-up goes to the
    caller, which reports it like an interrupt in a round.
    """
    from fedsim.runtime import SetupError, run_scenario

    try:
        with _out_of_memory(run_dir):
            return run_scenario(
                sc, workers=workers, run_dir=run_dir, resume=resume, on_round=on_round
            )
    except SetupError as exc:
        # the run's folder or settings refused before any training: the
        # command line's exit 2, though the library files it as a run error
        _fail(_error_text(exc))
    except FedsimError:  # a refused input found only now: _Commands, exit 2
        raise
    except OSError as exc:
        _say("[bold red]cannot write results:[/]", str(exc))
        if (run_dir / "LATEST").exists():
            _say(
                "",
                "The files on disk are whole, up to the last checkpoint; once "
                f"the cause is fixed, continue with: fedsim run --resume {run_dir}",
            )
        raise typer.Exit(1) from None


@contextmanager
def _out_of_memory(run_dir: Path) -> Iterator[None]:
    """An allocation the memory check let through but the system refused
    (``ulimit -v``, a container's limit, memory taken meanwhile), while the
    run is built or later (a round, a checkpoint): one line, exit 1, instead
    of the allocator's traceback. Checkpoints are committed last
    (fedsim/checkpoint.py), so one refused half way is never the latest:
    the line says how to continue from the last whole one."""
    from fedsim.hooks import is_memory_error

    try:
        yield
    except (MemoryError, RuntimeError) as exc:
        # a MemoryError, or torch's refused allocation (a RuntimeError)
        if not isinstance(exc, MemoryError) and not is_memory_error(exc):
            raise
        lines = [ln for ln in str(exc).splitlines() if ln.strip()]
        why = lines[-1].strip() if lines else type(exc).__name__
        then = (
            "the estimate of `fedsim validate` fitted, so a limit on this "
            "process (ulimit -v, a container) or other programs may hold the rest"
        )
        if (run_dir / "LATEST").exists():
            then = (
                "the last whole checkpoint is kept; with more memory, continue "
                f"with: fedsim run --resume {run_dir}"
            )
        _fail(f"out of memory ({why}); {then}", 1)


@contextmanager
def _progress(
    sc: Scenario, quiet: bool, start: int, sim0: float, log_every: float = 30.0
) -> Iterator[Any]:
    """Yields the per-round callback: a progress bar, or without a terminal a
    plain line every ``log_every`` seconds and every 10% of the rounds.

    Args:
        sc: the scenario (its name, rounds and whether they are versions).
        quiet: no bar and no lines.
        start: rounds already done (a resume starts its bar there).
        sim0: the simulated time they took.
        log_every: seconds between plain lines at most.

    The plain lines exist for batch jobs (``ray job submit``, Slurm), whose
    logs would otherwise hold a bar's control characters or nothing at all.
    """
    unit = "versions" if sc.round.policy == "async" else "rounds"
    if not quiet and not err.is_terminal:
        step = max(1, sc.rounds // 10)
        last: dict[str, Any] = {"time": time.monotonic(), "acc": "-"}

        def log_line(row: dict[str, Any], clients: list[dict[str, Any]]) -> None:
            # the last evaluated accuracy: a round without evaluation is NaN
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
    scenario: Annotated[Path, typer.Argument(help=_SCENARIO_FILE)],
    set_: SetOption = None,
) -> None:
    """Check a scenario file and print what it resolves to.\f

    Prints only the fields that do something in this scenario (see
    :func:`_applicable`); exits 2 with the problems otherwise.
    """
    import yaml

    from fedsim.scenario import _Dumper

    sc = _load(scenario, list(set_ or []))
    _preflight(sc, scenario)
    # soft_wrap: rich must not break long YAML lines
    text = yaml.dump(
        _applicable(sc), Dumper=_Dumper, sort_keys=False, default_flow_style=None
    )
    out.print(text, highlight=False, markup=False, end="", soft_wrap=True)
    if sc.fleet.per_flop:  # speeds in FLOP/s become steps/s for this model
        from fedsim.flops import describe, step_flops

        # a count the model gives or torch finds (a ModelError: exit 2)
        lines = describe(sc.facts, step_flops(sc.facts))
        err.print("\n".join(lines), highlight=False)
    err.print(
        f"ok: {scenario} ({sc.fleet.size} devices, {sc.rounds} rounds, "
        f"{sc.algorithm.name})"
    )


def _keep(section: dict[str, Any], fields: str) -> dict[str, Any]:
    """``section`` with only the (space-separated) ``fields``, in its order."""
    return {k: v for k, v in section.items() if k in fields.split()}


def _applicable(sc: Scenario) -> dict[str, Any]:
    """The resolved scenario without the fields that do nothing in it.

    ``validate`` prints this rather than the full dump: a field that the
    chosen policy, distribution or model ignores would read as if it
    mattered (a ``window_s`` in an epochs round, ``sigma`` on fixed speeds).
    """
    d = sc.model_dump(mode="json")
    # each section's spec says which of its fields its choice reads
    d["model"] = _keep(d["model"], sc.model.used_fields)
    d["round"] = _keep(d["round"], sc.round.used_fields)
    fleet = sc.fleet
    specs = [fleet.stragglers, *(g.stragglers for g in fleet.groups)]
    dumps = [d["fleet"]["stragglers"], *(g["stragglers"] for g in d["fleet"]["groups"])]
    pairs = [(spec, dump) for spec, dump in zip(specs, dumps, strict=True) if spec]
    dropouts = any(spec.dropout_p > 0 for spec, _ in pairs)
    for spec, dump in pairs:
        if not dropouts:
            del dump["dropout_p"]
        dump["slowdown"] = _keep(dump["slowdown"], spec.slowdown.used_fields)
    for group, g in zip(fleet.groups, d["fleet"]["groups"], strict=True):
        if group.speed:
            g["speed"] = _keep(g["speed"], group.speed.used_fields)
        if g["network"]["preset"] is None:
            del g["network"]["preset"]
        g["availability"] = _keep(g["availability"], group.availability.used_fields)
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
    html: HtmlOption = True,
) -> None:
    """Write plots (PNG), report.md and report.html for a run directory.\f

    Reads only the result files, so it works on a finished, interrupted or
    diverged run, and rewrites the report of a run that was resumed.
    """
    from fedsim.tools.page import write_page
    from fedsim.tools.report import write_report

    try:
        path = write_report(run_dir, max_timeline_rounds=timeline_rounds)
        page = write_page(run_dir) if html else None
    except KeyboardInterrupt:
        _say(
            "[yellow]interrupted:[/]",
            f"the report of {run_dir} was not finished (the run's results are "
            f"whole); draw it again with: fedsim report {run_dir}",
        )
        raise typer.Exit(130) from None
    out.print(f"report: {path}", highlight=False, soft_wrap=True)
    if page is not None:
        out.print(f"page: {page}", highlight=False, soft_wrap=True)


@_arms_command
def stress(
    scenario: Annotated[
        Path, typer.Argument(help=f"{_SCENARIO_FILE[:-1]} (a synchronous one).")
    ],
    sweep: SweepOption,
    workers: RunsOption = None,
    *,
    opts: ArmsOptions,
) -> None:
    """Sweep a fleet setting, run each algorithm at each value, and report
    which aggregator degrades least (stress.md, stress.parquet, plots).\f

    Refused with exit 2 before any run: a swept or --set field that stress
    sets itself (seed, algorithm, resources.workers, checkpoint), a
    --baseline not among the algorithms, and an --out that holds an earlier
    sweep (unless --overwrite). Exit 1 when a
    run diverged (every table is written first), 3 when a plug-in failed
    during a run (one line), 130 when interrupted.
    """
    from fedsim.tools.stress import run_stress

    opts.check()
    grid = _sweep_grid(sweep)
    labels = _algorithms(opts.algorithms)
    out_dir = opts.out_dir
    if opts.live and out_dir is None:  # the page needs the folder before it exists
        out_dir = _default_out("stress", scenario, opts.overrides)
    trackers = _trackers(opts.log, out_dir)
    if out_dir is not None:
        _claim_out(out_dir, _STRESS_FILES, opts.overwrite)
    _maybe_ray(workers, opts.address)
    # innermost first: a plug-in's failure (a RuntimeError) is exit 3
    # before the general RuntimeError handler can make it 1
    with (
        _errors(OSError, RuntimeError, code=1),
        _worker_errors(),
        _live(opts.live, out_dir or Path("."), opts.live_port, "stress"),
        _sweep_interrupted(out_dir, "stress"),
    ):
        path = run_stress(
            scenario,
            grid,
            labels,
            out_dir=out_dir,
            workers=workers,
            progress=None if opts.quiet else _stress_progress,
            log=trackers,
            **opts.library(),
        )
    out.print(f"report: {path / 'stress.md'}", highlight=False, soft_wrap=True)
    _write_group_page(path)
    import pyarrow.parquet as pq

    diverged = pq.read_table(path / "stress.parquet", columns=["diverged"])
    _exit_if_diverged(sum(diverged.column(0).to_pylist()), "stress.parquet")


def _stress_progress(rec: dict[str, Any]) -> None:
    """stress's line on stderr as each run ends."""
    err.print(
        f"cell {rec['cell']} {rec['algorithm']} seed {rec['seed']}: "
        f"final acc {_fmt(rec['final_accuracy'], '.3f')}, "
        f"sim {rec['sim_time_s']:.0f}s",
        highlight=False,
    )


def _sweep_grid(sweep: list[str]) -> dict[str, list[Any]]:
    """stress's ``--sweep`` options as {field: values}, in the order given.

    Raises:
        typer.Exit: (code 2) a malformed option, or a field swept twice.
    """
    from fedsim.tools.stress import parse_sweep

    grid: dict[str, list[Any]] = {}
    for key, values in map(parse_sweep, sweep):  # a ScenarioError: exit 2
        if key in grid:
            _fail(f"--sweep {key}: given twice")
        grid[key] = values
    return grid


@_arms_command
def compare(
    scenario: Annotated[Path, typer.Argument(help=_SCENARIO_FILE)],
    workers: RunsOption = 0,
    *,
    opts: ArmsOptions,
) -> None:
    """Run several algorithms on identical fleets and data, over seeds 0..N-1,
    and write compare.parquet, compare.md and compare.png (accuracy against
    simulated time and rounds, with seed bands), and each against a baseline,
    seed by seed, with 95% intervals (paired.parquet, paired.png).\f

    Refused with exit 2 before any run: an invalid variant, an algorithm
    given twice (under any spelling), a --baseline not among them, a --set
    of a field compare sets itself, and an --out that holds an earlier
    comparison (unless --overwrite). Exit 1 when a run diverged, 3 when a
    plug-in failed during a run (one line), 130 when interrupted.
    """
    from fedsim.results import default_run_dir, prepare_run_dir
    from fedsim.rows import whole
    from fedsim.tools.compare import compare as run_compare

    overrides = opts.overrides
    opts.check()
    sc = _load(scenario, overrides)
    names = _algorithms(opts.algorithms)
    trackers = _trackers(opts.log, opts.out_dir)
    out_dir = opts.out_dir
    run_dir = out_dir if out_dir is not None else default_run_dir(f"compare-{sc.name}")
    _claim_out(run_dir, _COMPARE_FILES, opts.overwrite)
    existed = run_dir.exists()
    with _errors(OSError):
        prepare_run_dir(run_dir)

    def show(row: dict[str, Any]) -> None:
        flag = "  [red]diverged[/]" if row["diverged"] else ""
        err.print(
            f"{row['algorithm']} seed {row['seed']}: final accuracy "
            f"{_fmt(row['final_accuracy'], '.4f')}, {row['wall_time_s']:.0f}s{flag}"
        )

    _maybe_ray(workers, opts.address)
    # ValueError: e.g. an algorithm given twice; a Ray worker's error as one line
    with (
        _worker_errors(),
        _errors(ValueError),
        _live(opts.live, run_dir, opts.live_port, "compare"),
        _sweep_interrupted(run_dir, "compare", existed),
    ):
        table = run_compare(
            scenario,
            names,
            out_dir=run_dir,
            progress=None if opts.quiet else show,
            workers=workers,
            log=trackers,
            **opts.library(),
        )
    _write_group_page(run_dir)
    text = (run_dir / "compare.md").read_text()
    out.print(text, markup=False, highlight=False, soft_wrap=True)
    out.print(f"results: {run_dir}")
    _exit_if_diverged(sum(whole(r["diverged"]) for r in table), "compare.parquet")


def _default_out(command: str, scenario: Path, overrides: list[str]) -> Path:
    """``results/<command>-<scenario name>-<time>/``, as the command itself
    would choose it (fedsim.results.default_run_dir)."""
    from fedsim.results import default_run_dir

    return default_run_dir(f"{command}-{_load(scenario, overrides).name}")


def _write_group_page(out_dir: Path) -> None:
    """compare.html or stress.html from the tables just written (exit 1,
    one line, when the folder cannot be written)."""
    from fedsim.tools.page_group import write_group_page

    with _errors(OSError, ValueError, code=1):
        out.print(f"page: {write_group_page(out_dir)}", highlight=False, soft_wrap=True)


@contextmanager
def _sweep_interrupted(
    out_dir: Path | None, command: str, existed: bool = True
) -> Iterator[None]:
    """Ctrl-C or SIGTERM in compare or stress: one line saying what is kept,
    exit 130. An empty ``runs/`` (and an --out this command created and left
    empty) is removed, so that the same command runs again without
    --overwrite; finished runs are kept and said.

    Args:
        out_dir: the command's --out, or None when it chose its own folder.
        command: "compare" or "stress", for the line.
        existed: whether ``out_dir`` existed before the command.
    """
    try:
        yield
    except KeyboardInterrupt:
        runs = out_dir / "runs" if out_dir is not None else None
        kept = sorted(runs.iterdir()) if runs is not None and runs.is_dir() else []
        with suppress(OSError):
            if runs is not None and not kept:
                runs.rmdir()
            if out_dir is not None and not existed:
                out_dir.rmdir()  # only when empty
        where = f" in {runs}" if kept else ""
        again = "with --overwrite " if kept else ""
        _say(
            "[yellow]interrupted:[/]",
            f"{command} stopped; {len(kept)} finished run(s) kept{where}, no "
            f"table written; run the command again {again}to start over",
        )
        raise typer.Exit(130) from None


# What compare and stress write into --out (runs/: a file per run).
_COMPARE_FILES = (
    "compare.parquet",
    "compare.html",
    "compare.md",
    "compare.png",
    "runs",
    "paired.parquet",
    "paired.png",
)
_STRESS_FILES = (
    "stress.parquet",
    "stress.html",
    "stress.md",
    "taus.parquet",
    "runs",
    "accuracy_vs_time.png",
    "degradation.png",
    "tau_by_group.png",
    "paired.parquet",
    "paired.png",
)


def _claim_out(out_dir: Path, files: tuple[str, ...], overwrite: bool) -> None:
    """Refuse an --out that holds a comparison's (or sweep's) ``files``, as
    ``run`` refuses another run's; ``overwrite`` deletes them first, so that
    no old run is left among the new ones.

    Args:
        out_dir: the --out folder (it may not exist yet).
        files: the names the command writes there (``runs`` is a folder).
        overwrite: ``--overwrite`` was given.
    """
    held = _held(out_dir, files, overwrite, ("earlier results", ""))
    with _errors(OSError):
        for name in held:
            path = out_dir / name
            shutil.rmtree(path) if path.is_dir() else path.unlink()


def _algorithms(algorithms: str) -> list[str]:
    """``--algorithms`` split (``key=value`` pieces stay with their name),
    and not empty; the labels are made canonical where they are run."""
    from fedsim.tools.compare import split_algorithms

    labels = split_algorithms(algorithms)
    if not labels:
        _fail("--algorithms: give at least one algorithm")
    return labels


def _maybe_ray(workers: int | None, address: str | None) -> None:
    """Start or join Ray unless --workers 0 runs everything in this process
    (compare and stress run each run as one Ray task, not as actors)."""
    if workers != 0:
        from fedsim.remote.ray_session import init_ray

        init_ray(address)  # Ray slower to start than it waits: RayStartError, 1


def _exit_if_diverged(n: int, where: str) -> None:
    """Exit 1 when runs diverged: the results are written, and say which.

    Args:
        n: how many runs diverged (0: return and let the command exit 0).
        where: the table whose ``diverged`` column lists them.
    """
    if n:
        _say(
            "[bold red]diverged:[/]", f"{n} run(s); see the diverged column of {where}"
        )
        raise typer.Exit(1)


def main() -> None:
    """The ``fedsim`` entry point: SIGINT and SIGTERM are handled by
    fedsim/interrupts.py from here on (a scheduler that stops a job during
    start-up gets the interrupt's exit code and message, never a silent
    kill; in the round loop the run stops before the next round); exits
    with the command's code."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    with interrupts.stop_at_round_ends():
        try:
            app()  # fedsim's own errors: one line each (_Commands)
        except SystemExit as exc:
            # typer turns a KeyboardInterrupt no command caught into a
            # silent exit 130 (click's Exit raised from it)
            cause = exc.__context__.__cause__ if exc.__context__ else None
            if exc.code == 130 and isinstance(cause, KeyboardInterrupt):
                _say("[yellow]interrupted:[/]", "stopped; nothing was finished")
            raise


if __name__ == "__main__":
    main()
