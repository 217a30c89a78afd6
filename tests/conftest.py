"""Shared fixtures and the suite's scheduling rules (tests/README.md).

- ``ray_session``: the embedded local Ray of a pytest process, started by
  the first test that takes it and stopped after the last of a run of such
  tests (started again if another comes later); tests that take it are
  marked ``ray`` (``make test-quick`` skips them). Never call
  ``ray.init``/``ray.shutdown`` in a test. Under pytest-xdist they run in
  two groups, ``ray`` and ``ray2`` (split by module, about evenly in
  time: ``RAY2_MODULES``): each group in one process, whose embedded Ray
  and warm worker actors serve all of its tests. An embedded Ray in each of
  the three processes cost its daemons' CPU three times and more new
  worker processes; one group for all of them made its process the
  suite's critical path (603 s of a 627 s run).
- ``cluster`` (session scope): the one multi-node cluster (a head and worker
  nodes a, b, c, started one after the other) for every test marked
  ``cluster``. The cluster tests run first, together (those marked
  ``cluster(kills_nodes=True)`` last), in one pytest-xdist group: one process
  starts the cluster, once, and stops it after the last cluster test, while
  the other process runs the rest.
- Every test has a time limit (pytest-timeout, ``timeout`` in pyproject.toml);
  cluster tests get ``CLUSTER_TIMEOUT_S`` and ``slow`` ones ``SLOW_TIMEOUT_S``
  unless they set their own ``@pytest.mark.timeout``. A test past its limit
  fails with every thread's stack dumped (SIGALRM: the test fails, its
  fixtures are torn down and the run goes on; :func:`time_limit` nests in it).
- Tests marked ``explore`` (slow explorations: new random draws, more
  examples, more seeds; and the longest repeats of what a faster test
  checks, such as the asynchronous twin of a Ray fault test) run only with
  ``-m explore`` (``make test-explore``; CI runs them after the suite when
  its time budget allows).
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
# One compute thread per process (set before torch or numpy is imported, and
# inherited by every process the tests start): the suite runs three pytest
# processes, Ray's worker actors and CLI subprocesses on two cores, where a
# thread per core for each BLAS and OpenMP pool only adds threads that wait on
# each other. Runs set torch's count themselves (resources.cpus_per_worker).
# Measured: 74 s of user CPU against 80 s on five CPU-heavy test files; on the
# whole suite 814 busy core-seconds against 827, the same wall time.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# Ctrl-C as at a terminal, whoever started the suite: a job started in the
# background by a shell without job control (`nohup .ci/run &`, some CI
# runners) inherits SIGINT ignored, and Python then never turns it into
# KeyboardInterrupt, so the tests that send a real SIGINT to this process
# (tests/test_silent_exits.py) would see nothing happen; xdist's processes
# load this file too. Subprocesses get theirs back in run_python.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# Hypothesis: the same examples on every run (CI must be reproducible);
# FEDSIM_FUZZ_RANDOM=1 (or HYPOTHESIS_PROFILE=explore) draws new ones.
try:
    from hypothesis import settings as _hypothesis_settings

    _hypothesis_settings.register_profile("ci", derandomize=True, print_blob=True)
    _hypothesis_settings.register_profile("explore", derandomize=False)
    _hypothesis_settings.load_profile(
        "explore"
        if os.environ.get("FEDSIM_FUZZ_RANDOM")
        else os.environ.get("HYPOTHESIS_PROFILE", "ci")
    )
except ImportError:  # hypothesis is a dev extra
    pass

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = ROOT / "scenarios"
SHARED = ROOT.parent / "shared"
MNIST = SHARED / "data"  # holds mnist-test/ (the t10k files)
# Tests on the shared MNIST test set skip, saying so, on a clone without it
# (a newcomer's clone has no ../shared: README.md, "Development").
HAS_MNIST = (MNIST / "mnist-test" / "t10k-images-idx3-ubyte.gz").is_file()
needs_mnist = pytest.mark.skipif(
    not HAS_MNIST, reason=f"shared MNIST test set not found at {MNIST / 'mnist-test'}"
)

# The limits are hang detectors, not speed checks: on a CI machine shared
# with other jobs (load 10 to 16 on 2 cores seen) a test's processes get a
# sliver of a core, and at 300 s the first test of each embedded-Ray group
# (its Ray and warm workers starting: 40 s idle) timed out, the SIGALRM
# landing inside Ray's C code (SystemError). A suite that hangs is caught by
# .ci/watch, which names the test. The default limit is pyproject's.
SLOW_TIMEOUT_S = 1800
CLUSTER_TIMEOUT_S = 2400  # includes starting the cluster (session fixture)
# The longest a test waits for a process, a job or Ray to finish its normal
# work (subprocess timeouts, polling deadlines): a bound on a hang, as
# generous as the limits above, so that a loaded machine's slowness is
# never a failure. A wait that is meant to run out stays short.
WAIT_S = 600
# The modules whose embedded-Ray tests form the second xdist group, ``ray2``
# (the others' form ``ray``): about half the time of those tests each, as
# measured in whole runs on 2 cores on 2026-12-03 (one group: 603 s; then
# ray 502 s and ray2 193 s, when test_warm_workers, 164 s of it, was in
# ray; a new module's tests join ``ray``).
RAY2_MODULES = frozenset(
    {
        "test_faults.py",  # the killed worker: about 100 s
        "test_warm_workers.py",
        "test_async_sim.py",
        "test_fedeval.py",
        "test_executors.py",
        "test_plugin_edges.py",
        "test_hooks.py",
        "test_flower.py",
        "test_links.py",
        "test_gpu.py",
    }
)


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config, items):
    # Explorations run only when asked for by name: `-m explore`.
    if "explore" not in (config.getoption("markexpr", "") or ""):
        skipped = [i for i in items if i.get_closest_marker("explore") is not None]
        if skipped:
            config.hook.pytest_deselected(items=skipped)
            items[:] = [i for i in items if i.get_closest_marker("explore") is None]
    for item in items:
        if item.get_closest_marker("timeout") is None:
            if item.get_closest_marker("cluster") is not None:
                item.add_marker(pytest.mark.timeout(CLUSTER_TIMEOUT_S))
            elif item.get_closest_marker("slow") is not None:
                item.add_marker(pytest.mark.timeout(SLOW_TIMEOUT_S))
        if item.get_closest_marker("cluster") is not None:
            item.add_marker(pytest.mark.xdist_group("cluster"))
        elif "ray_session" in getattr(item, "fixturenames", ()):
            second = item.path.name in RAY2_MODULES
            item.add_marker(pytest.mark.xdist_group("ray2" if second else "ray"))

    # The cluster tests first and together (xdist starts their group first;
    # the cluster stops after the last one), those that kill cluster nodes
    # last among them; then the tests of the embedded Ray, each group
    # together; then the rest, module by module (a module's fixtures are set
    # up once per process), the modules with the most `slow` tests first: a
    # pytest-xdist process takes the ungrouped tests in this order once its
    # group is done, and a long test taken last would keep one process
    # running alone at the end while the other core idles. A stable sort: a
    # module's tests keep their order.
    slow_in: dict[Path, int] = {}
    for item in items:
        grouped = item.get_closest_marker("xdist_group") is not None
        slow = item.get_closest_marker("slow") is not None
        slow_in[item.path] = slow_in.get(item.path, 0) + (slow and not grouped)

    def order(item) -> tuple[bool, bool, bool, bool, int]:
        mark = item.get_closest_marker("cluster")
        in_ray = "ray_session" in getattr(item, "fixturenames", ())
        kills = bool(mark and mark.kwargs.get("kills_nodes"))
        ray2 = in_ray and item.path.name in RAY2_MODULES
        ungrouped = mark is None and not in_ray
        return mark is None, kills, not in_ray, ray2, -slow_in[item.path] * ungrouped

    items.sort(key=order)


def pytest_configure(config):
    """With ``FEDSIM_STACKS_DIR`` set (``.ci/watch`` sets it), let a watchdog
    ask this pytest process where it is: SIGUSR1 writes every thread's stack
    to ``stacks-PID.txt`` in that folder (faulthandler answers even while
    the main thread is stuck in C code, where pytest-timeout's SIGALRM
    waits in vain), and ``running-PID.txt`` names the test it is running
    (pytest_runtest_protocol). Without it, a suite that hangs past CI's
    limit is killed without a word."""
    folder = os.environ.get("FEDSIM_STACKS_DIR")
    if not folder or _WATCH:
        return
    import faulthandler

    pid = os.getpid()
    # Both open for the process's life: faulthandler writes to the stacks
    # file's descriptor from its signal handler.
    _WATCH["stacks"] = open(Path(folder) / f"stacks-{pid}.txt", "w")  # noqa: SIM115
    _WATCH["running"] = open(Path(folder) / f"running-{pid}.txt", "w")  # noqa: SIM115
    faulthandler.register(signal.SIGUSR1, file=_WATCH["stacks"], all_threads=True)


# pytest_configure's watchdog files ("stacks", "running"), while
# FEDSIM_STACKS_DIR is set.
_WATCH: dict[str, Any] = {}


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session):
    """Refuse to run when pytest-xdist's ``--dist loadgroup`` did not group
    the cluster tests (it renames each grouped test ``<id>@<group>``; a
    pytest it does not know may ignore that, and every process would then
    start its own multi-node cluster: minutes of CPU, twice the memory)."""
    config = session.config
    if not getattr(config.option, "loadgroup", False):
        return  # not an xdist worker with --dist loadgroup
    bad = [
        i.nodeid
        for i in session.items
        if i.get_closest_marker("cluster") is not None
        and not i.nodeid.endswith("@cluster")
    ]
    if bad:
        raise pytest.UsageError(
            f"pytest-xdist --dist loadgroup did not group {len(bad)} cluster "
            f"tests (e.g. {bad[0]}): this pytest ({pytest.__version__}) and "
            "pytest-xdist do not work together; install the versions "
            "pyproject.toml's dev extra allows (make venv)"
        )


@pytest.fixture
def ray_session() -> Iterator[None]:
    """The embedded local Ray of this process, with warm worker actors
    (``fedsim.remote.actors.warm_workers``): a run takes over the last run's
    idle actors of the same shape instead of starting new processes (about
    3.5 s of CPU each: Python, Ray and torch), with identical results.

    Started by the first test that takes it and kept for the next; stopped
    (:func:`pytest_runtest_teardown`) after a test whose next test in this
    process does not take it. The tests that take it run together (the
    ``ray`` and ``ray2`` groups), so a process usually starts it once; if
    another comes later, it starts again."""
    if not _EMBEDDED_RAY:
        from fedsim.remote.actors import warm_workers
        from fedsim.remote.ray_session import init_ray, shutdown_ray

        init_ray(num_cpus=2)
        stack = ExitStack()
        stack.callback(shutdown_ray)
        _EMBEDDED_RAY.append(stack)  # up: stopped from here on
        stack.enter_context(warm_workers())
    yield


# This process's embedded Ray, while it is up: the ExitStack that stops it
# (the warm pool's actors, then Ray).
_EMBEDDED_RAY: list[ExitStack] = []


def _stop_embedded_ray() -> None:
    while _EMBEDDED_RAY:
        _EMBEDDED_RAY.pop().close()


def pytest_sessionfinish(session, exitstatus):
    """Stop the embedded Ray if a test left it up (an interrupted run)."""
    _stop_embedded_ray()


@pytest.fixture(scope="session")
def cluster_batch(cluster, tmp_path_factory):
    """The cluster tests' runs that differ only in their settings (placement,
    per-node data, the server actor's home), in turn in one job's driver on
    the head: one submission and one driver start-up for them all
    (tests/cluster_batch.py). The driver must succeed; each test checks its
    own runs' exit codes."""
    from .cluster_batch import Batch, batch_runs

    out = tmp_path_factory.mktemp("cluster-batch")
    logs, codes = cluster.fedsim_in_one_job(batch_runs(out), timeout=900)
    return Batch(out, logs, codes)


@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    """A head that offers no CPUs (it runs the job drivers) and three worker
    nodes on 127.0.0.1 with token authentication (tests/cluster_utils.py):
    ``a`` with 2 CPUs and 2 fake GPUs, ``b`` and ``c`` with 1 CPU each; each
    names itself with a custom resource (``node_a``, ...). The head alone has
    data (FEDSIM_DATA_ROOT: the shared MNIST test set); the worker nodes have
    an empty data root and an empty HOME. A lost node is declared dead within
    about 10 s, so node-loss tests stay short."""
    import time

    from .cluster_utils import NodeSpec, multinode_cluster

    empty = tmp_path_factory.mktemp("nodata")
    no_data = {"FEDSIM_DATA_ROOT": str(empty), "HOME": str(empty)}
    workers = [
        NodeSpec("a", num_cpus=2, num_gpus=2, resources={"node_a": 1}, env=no_data),
        NodeSpec("b", num_cpus=1, resources={"node_b": 1}, env=no_data),
        NodeSpec("c", num_cpus=1, resources={"node_c": 1}, env=no_data),
    ]
    head_env = {
        "FEDSIM_DATA_ROOT": str(MNIST),
        "RAY_health_check_period_ms": "1000",
        "RAY_health_check_timeout_ms": "2000",
        "RAY_health_check_failure_threshold": "5",
    }
    start = time.monotonic()
    stack = ExitStack()
    c = stack.enter_context(multinode_cluster(workers, head_env=head_env))
    print(f"cluster up in {time.monotonic() - start:.1f}s")
    _STOP_CLUSTER.append(stack.close)
    try:
        yield c
    finally:
        stack.close()  # a second close does nothing
        _STOP_CLUSTER.clear()
    print(f"cluster up and down in {time.monotonic() - start:.1f}s")
    assert not c.pids(), f"processes of {c.work} left"


_STOP_CLUSTER: list = []  # stops the session's cluster, once it is started


def pytest_runtest_teardown(item, nextitem):
    """Stop the cluster as soon as this process has run its last cluster test,
    and the embedded Ray after a test that takes ``ray_session`` whose next
    test does not (their Ray processes would otherwise idle on the cores
    until the end; the order of pytest_collection_modifyitems and the xdist
    groups keep each kind together)."""
    if (
        _STOP_CLUSTER
        and item.get_closest_marker("cluster") is not None
        and (nextitem is None or nextitem.get_closest_marker("cluster") is None)
    ):
        _STOP_CLUSTER[0]()
    if "ray_session" in item.fixturenames and (
        nextitem is None or "ray_session" not in nextitem.fixturenames
    ):
        _stop_embedded_ray()


@pytest.fixture(autouse=True)
def _no_stray_ray(request) -> Iterator[None]:
    """Fail (at teardown) a test that left a Ray up in this process without
    ``ray_session``: a ``fedsim stress`` or ``--workers 2`` run in this
    process starts an embedded Ray that nothing stops, whose daemons then
    idle on the cores until the process's last test. It is stopped first,
    so the tests after it run as they would have. (After a test that takes
    ``ray_session`` its Ray is either kept for the next one, in
    ``_EMBEDDED_RAY``, or already stopped by pytest_runtest_teardown.)"""
    yield
    ray = sys.modules.get("ray")
    if _EMBEDDED_RAY or ray is None or not ray.is_initialized():
        return
    from fedsim.remote.ray_session import shutdown_ray

    shutdown_ray()
    pytest.fail(
        f"{request.node.nodeid} started Ray in the pytest process without the "
        "ray_session fixture (pass --workers 0, or take ray_session and "
        "mark the test ray)",
        pytrace=False,
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """With ``FEDSIM_TEST_CPU=FILE``, append a line per test to FILE: the CPU
    seconds of this pytest process and of the subprocesses it waited for
    (set-up, call and teardown together), the wall seconds, and the test's
    id, tab-separated. The suite is CPU-bound on two cores, where a test's
    wall time (``--durations``) also counts the time it waited for the CPU;
    this says what each test costs. Ray's daemons and actors are not children
    of pytest, so their CPU is not in it. ``sort -rn FILE | head -25`` ranks
    the tests. Each xdist process appends whole lines to the same file."""
    if running := _WATCH.get("running"):  # .ci/watch: the test this process runs
        running.seek(0)
        running.write(item.nodeid + "\n")
        running.truncate()
        running.flush()
    path = os.environ.get("FEDSIM_TEST_CPU")
    if not path:
        yield
        return
    import resource
    import time

    def cpu() -> float:
        me = resource.getrusage(resource.RUSAGE_SELF)
        kids = resource.getrusage(resource.RUSAGE_CHILDREN)
        return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime

    cpu0, wall0 = cpu(), time.monotonic()
    yield
    line = f"{cpu() - cpu0:.2f}\t{time.monotonic() - wall0:.2f}\t{item.nodeid}\n"
    with open(path, "a") as f:  # one write of one short line: not interleaved
        f.write(line)


def run_python(*argv: str) -> Any:
    """``python *argv`` from the repository root, as a user's shell starts it:
    this checkout first on the path, no usage stats, and SIGINT at its
    default (a suite started in the background hands its children SIGINT
    ignored, and the signal tests need it delivered). Returns the finished
    ``subprocess.CompletedProcess`` with text stdout and stderr."""
    import subprocess
    import sys

    return subprocess.run(
        [sys.executable, *argv],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(ROOT), "RAY_USAGE_STATS_ENABLED": "0"},
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def fedsim_here(*args: str, check: bool = False) -> Any:
    """``fedsim ARGS`` in this process (typer's CliRunner), returned as a
    ``subprocess.CompletedProcess`` (exit code, stdout, stderr) like a real
    one's. For runs that need no process of their own (no signal, no
    embedded Ray, no file size limit, no fresh import state): it spares a
    Python start-up and torch's import, seconds of CPU each. ``check``: the
    command must exit 0 (the assertion shows the end of its output)."""
    import subprocess

    from typer.testing import CliRunner

    from fedsim.tools.cli import app

    r = CliRunner(env={"COLUMNS": "120"}).invoke(app, list(args))
    done = subprocess.CompletedProcess(list(args), r.exit_code, r.stdout, r.stderr)
    if check:
        assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    return done


def cli_run(out: Path, scenario: str, overrides: list[str]) -> Path:
    """``fedsim run SCENARIO --workers 0 --out OUT --set ...`` in this process;
    it must succeed. Returns ``out``."""
    args = ["run", str(SCENARIOS / scenario), "--workers", "0", "--out", str(out)]
    for o in overrides:
        args += ["--set", o]
    fedsim_here(*args, "--quiet", check=True)
    return out


def assert_figure(
    path: Path,
    inches: tuple[float, float] | None = None,
    dpi: float = 110,  # fedsim.tools.plots.DPI
    min_colored: int = 100,
) -> tuple[int, int]:
    """``path`` is a PNG of ``inches`` (width, height) at ``dpi`` (or, when
    ``inches`` is None, at least 300 x 200 pixels) in which data were
    plotted: at least ``min_colored`` clearly colored pixels (axes, ticks,
    text and "no data" notes are black or gray, and a figure of no data has
    none; every plotted series is in a color). Returns its size in pixels."""
    import numpy as np
    from PIL import Image

    with Image.open(path) as im:
        assert im.format == "PNG", (path, im.format)
        size = im.size
        rgb = np.asarray(im.convert("RGB"), dtype=np.int16)
    colored = int(((rgb.max(axis=2) - rgb.min(axis=2)) > 60).sum())
    if inches is None:
        assert size[0] >= 300 and size[1] >= 200, (path, size)
    else:
        assert size == (round(inches[0] * dpi), round(inches[1] * dpi)), (path, size)
    assert colored >= min_colored, f"{path}: {colored} colored pixels, no data?"
    return size


class Hang(BaseException):
    """Raised when a bounded call runs past its time (BaseException: no
    ``except Exception`` in the code under test can swallow it)."""


@contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise :class:`Hang` in this thread after ``seconds`` (SIGALRM; no
    bound where the platform has no interval timer).

    It nests inside pytest-timeout's own SIGALRM limit (timeout_method
    "signal"): when that limit comes first, its handler runs (the test fails
    with the stack dump); on the way out the outer timer is set again to the
    time it has left."""
    if not hasattr(signal, "setitimer"):
        yield
        return
    import time

    outer = signal.getsignal(signal.SIGALRM)
    outer_left, _ = signal.getitimer(signal.ITIMER_REAL)
    outer_first = 0 < outer_left < seconds
    start = time.monotonic()
    fired: list[bool] = []

    def on_alarm(signum: int, frame: Any) -> None:
        fired.append(True)
        if outer_first and callable(outer):
            outer(signum, frame)  # the test's own time limit: it raises
        raise Hang(f"still running after {seconds} s")

    signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, outer_left if outer_first else seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, outer)
        if outer_left > 0 and not (fired and outer_first):
            left = outer_left - (time.monotonic() - start)
            signal.setitimer(signal.ITIMER_REAL, max(left, 0.001))
