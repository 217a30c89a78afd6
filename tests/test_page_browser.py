"""The pages in a real browser: Debian's Chromium (/usr/bin/chromium, which
.ci/run installs), driven by Playwright (which never downloads a browser of
its own here). A written report.html loads from file:// with no console
error, draws one bar per (round, device) job, and a hovered bar shows that
job's tau; a live page's round counter advances while a run goes on.

Without /usr/bin/chromium or the playwright package every test here skips,
saying which is missing; nothing else in the suite needs them."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from .conftest import ROOT, SCENARIOS
from .test_page import compare_dir, straggler_run  # noqa: F401 (fixtures)

CHROMIUM = Path("/usr/bin/chromium")
# no GPU, no network of its own (QUIC, updates, sync), a fresh profile each
# session (launch_persistent_context's --user-data-dir)
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def _missing() -> str | None:
    """Why the browser tests cannot run here, or None."""
    if not CHROMIUM.exists():
        return (
            f"no browser: {CHROMIUM} is missing (Debian's chromium package; "
            ".ci/run installs it)"
        )
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "no browser driver: the playwright package is missing (.[dev])"
    return None


pytestmark = pytest.mark.skipif(_missing() is not None, reason=str(_missing()))


def launch(playwright, profile: str):
    """Debian's Chromium, headless, with :data:`ARGS` and the fresh profile
    folder ``profile`` (benchmarks/report_page.py opens pages with it too)."""
    return playwright.chromium.launch_persistent_context(
        profile,
        executable_path=str(CHROMIUM),
        headless=True,
        args=ARGS,
        viewport={"width": 1200, "height": 900},
    )


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        context = launch(p, str(tmp_path_factory.mktemp("chromium-profile")))
        yield context
        context.close()


def open_page(browser, url: str, ready: str = ".main-svg"):
    """The page at ``url`` once ``ready`` shows (by default: once a figure
    is drawn), and the list its console errors and uncaught exceptions go
    to."""
    page = browser.new_page()
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(url)
    page.wait_for_selector(ready, timeout=60_000)
    return page, errors


def test_run_page_loads_with_a_bar_per_job(browser, straggler_run):  # noqa: F811
    page, errors = open_page(browser, (straggler_run / "report.html").as_uri())
    jobs = pq.read_table(straggler_run / "clients.parquet").num_rows
    assert page.locator("#plot-timeline .barlayer .point").count() == jobs
    assert page.locator("#counter").text_content() == "3"
    for section in ("metrics", "states", "tau", "meters", "realised"):
        assert page.locator(f"#plot-{section} .main-svg").count() > 0, section
    assert errors == []
    page.close()


def test_a_hovered_bar_shows_its_jobs_tau(browser, straggler_run):  # noqa: F811
    rows = pq.read_table(straggler_run / "clients.parquet").to_pylist()
    tau = {(r["round"], r["client_id"]): r["tau"] for r in rows}
    page, errors = open_page(browser, (straggler_run / "report.html").as_uri())
    bars = page.locator("#plot-timeline .barlayer .point path")
    boxes = [bars.nth(i).bounding_box() for i in range(bars.count())]
    widths = [box["width"] if box else 0 for box in boxes]
    widest = sorted(range(len(boxes)), key=lambda i: -widths[i])
    seen = set()
    for i in widest[:3]:
        bars.nth(i).scroll_into_view_if_needed()
        box = bars.nth(i).bounding_box()  # where it is once scrolled to
        page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
        page.wait_for_selector("#plot-timeline .hoverlayer .hovertext")
        label = page.locator("#plot-timeline .hoverlayer .hovertext").text_content()
        found = re.search(r"device (\d+) \(.*?\)round (\d+)tau (\d+) steps", label)
        assert found, label
        device, rnd, shown = map(int, found.groups())
        assert shown == tau[rnd, device], label
        seen.add((rnd, device))
    assert len(seen) == 3 and errors == []
    page.close()


def test_compare_page_loads_without_console_error(browser, compare_dir):  # noqa: F811
    out = compare_dir
    page, errors = open_page(browser, (out / "compare.html").as_uri())
    assert page.locator("#counter").text_content() == "4"
    paired = pq.read_table(out / "paired.parquet").num_rows
    assert page.locator("#plot-paired .scatterlayer .point").count() == paired
    assert errors == []
    page.close()


# ``fedsim run`` whose recorder takes each round's rows PACE_S seconds
# late: the run lasts at least rounds x PACE_S seconds on any machine (200
# unpaced rounds of quickstart took 40 s of CPU, and a fast machine could
# still end them before the page saw two writes), for a fraction of the
# training. The rows, the files and the page are the run's own.
_PACED_RUN = """
import os, sys, time
import fedsim.results
from fedsim.__main__ import main
pace, add = float(os.environ["PACE_S"]), fedsim.results.Recorder.add
def paced(self, *args, **kwargs):
    time.sleep(pace)
    return add(self, *args, **kwargs)
fedsim.results.Recorder.add = paced
sys.argv = ["fedsim", *sys.argv[1:]]
main()
"""
ROUNDS, PACE_S = 60, 0.3  # 18 s at least: three of the recorder's 5 s writes


def _live_run(out: Path, workers: int) -> subprocess.Popen:
    """``fedsim run --live`` of ROUNDS rounds, paced, in a process of its own
    (its rows are written while the test reads the page)."""
    argv = [sys.executable, "-c", _PACED_RUN, "run", str(SCENARIOS / "quickstart.yaml"),
            "--workers", str(workers), "--out", str(out), "-q", "--live",
            "--live-port", "0", "--set", f"rounds={ROUNDS}",
            "--set", "eval.every_rounds=10"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_USAGE_STATS_ENABLED": "0"}
    env["PACE_S"] = str(PACE_S)
    return subprocess.Popen(argv, cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)


# The page reads the run's files, never the process that runs the rounds
# (fedsim/tools/live.py), so 2 Ray workers take the same path as 0; the
# case on 2 workers (an embedded Ray: the suite's longest test, 120 s on a
# loaded machine when it ran 200 rounds) is an exploration. --live beside an
# embedded Ray (its server on loopback, stopped when the run ends) is
# tests/test_loopback.py's.
@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    "workers", [0, pytest.param(2, marks=[pytest.mark.ray, pytest.mark.explore])]
)
def test_live_page_counter_advances_while_the_run_goes_on(browser, tmp_path, workers):
    # The recorder writes the rows every 5 s: the paced run lasts long enough
    # for the page to see several writes before it ends.
    run = _live_run(tmp_path / "run", workers)
    try:
        url = None
        for line in run.stderr:  # the address comes before the first round
            if found := re.search(r"live: (http://127\.0\.0\.1:\d+/)", line):
                url = found.group(1)
                break
        assert url, "no address printed"
        page, errors = open_page(browser, url, "#counter")
        counts = []
        while run.poll() is None:
            counts.append(int(page.locator("#counter").text_content()))
            time.sleep(0.5)
        tail = run.stderr.read()
    finally:
        run.kill() if run.poll() is None else None
        run.wait()
    assert run.returncode == 0, tail
    assert f"live: stopped serving {url}" in tail
    # seen mid-run (neither 0 nor all the rounds) and then higher
    middle = [c for c in counts if 0 < c < ROUNDS]
    assert middle and max(counts) > middle[0], counts
    # once the run ends, the page's next poll finds no server, and says so
    ended = "document.getElementById('live').textContent.includes('the run ended')"
    page.wait_for_function(ended, timeout=10_000)
    # That last poll's own console line: Chromium names the lost server
    # net::ERR_CONNECTION_REFUSED or, when the socket closes under it,
    # net::ERR_SOCKET_NOT_CONNECTED (seen once on an idle machine); a
    # network error, never the page's own.
    lost = "Failed to load resource: net::ERR_"
    assert [e for e in errors if not e.startswith(lost)] == []
    page.close()
