"""report.html of a big run: its size, the time to write it, and the time
headless Chromium takes to open it (docs/report-page.md, "Big runs").

    .venv/bin/python benchmarks/report_page.py [--rounds 1000] [--devices 1000]

Builds a synthetic run directory of ``--rounds`` rounds in which every one of
``--devices`` devices (three groups) trains every round: clients.parquet
holds rounds x devices jobs (a million by default), rounds.parquet one row
per round, with summary.json and scenario.yaml as a run writes them. It then
writes the page with fedsim.tools.page.write_page and opens it from file://
in Debian's /usr/bin/chromium (Playwright, as tests/test_page_browser.py
launches it),
timing from the request until every figure is drawn. A small run's page
(one round of ten devices) is opened the same way first: the difference is
what the big run's data costs, apart from plotly.js's own start-up.

``--screenshot RUN_DIR PNG`` instead saves the top of RUN_DIR's
report.html as PNG (how docs/report-page.png was taken).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from fedsim.results import CLIENT_SCHEMA, ROUND_SCHEMA, write_arrow
from fedsim.tools.page import MAX_TIMELINE_BARS, write_page

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.test_page_browser import launch  # noqa: E402

GROUPS = ["phones", "tablets", "laptops"]


def synthetic_run(run_dir: Path, rounds: int, devices: int, seed: int = 0) -> int:
    """A run directory whose every device trains every round; returns the
    number of jobs. Values are drawn, not trained: the page reads only
    the columns."""
    rng = np.random.default_rng(seed)
    run_dir.mkdir(parents=True, exist_ok=True)
    r = np.repeat(np.arange(rounds), devices)
    dev = np.tile(np.arange(devices), rounds)
    group = np.array(GROUPS)[dev % len(GROUPS)]
    took = rng.lognormal(1.0, 0.5, r.size)
    dropped = took > 8.0
    start = r * 10.0
    cols = {
        "round": r, "client_id": dev, "device_group": group,
        "tau": rng.integers(1, 50, r.size), "t_start": start,
        "t_arrive": start + took, "dropped": dropped,
        "drop_reason": np.where(dropped, "late", ""),
        "slowdown": rng.uniform(1, 2, r.size),
        "weight": np.full(r.size, 1 / devices),
        "update_norm": rng.uniform(0, 1, r.size),
        "train_loss": rng.uniform(0, 2, r.size),
        "bytes_down": np.full(r.size, 400_000), "bytes_up": np.full(r.size, 400_000),
        "agg_weight": np.where(dropped, 0.0, 1 / devices),
    }  # fmt: skip
    write_arrow(run_dir / "clients.parquet", pa.table(cols, schema=CLIENT_SCHEMA))
    x = np.arange(rounds)
    per_round = {
        "round": x, "sim_time": (x + 1) * 10.0, "wall_time": x * 0.1,
        "test_loss": 2 / (1 + x / 50), "test_accuracy": 1 - 0.9 / (1 + x / 50),
        "train_loss": 2 / (1 + x / 40), "n_selected": np.full(rounds, devices),
        "n_completed": np.bincount(r[~dropped], minlength=rounds),
        "n_dropped": np.bincount(r[dropped], minlength=rounds),
        "tau_mean": np.full(rounds, 25.0), "tau_min": np.ones(rounds),
        "tau_max": np.full(rounds, 49.0), "tau_eff": np.full(rounds, 25.0),
        "chi2_pw": rng.uniform(0, 0.2, rounds),
    }  # fmt: skip
    write_arrow(run_dir / "rounds.parquet", pa.table(per_round, schema=ROUND_SCHEMA))
    fleet = [{"name": g, "count": devices // 3} for g in GROUPS]
    scenario = {"name": f"synthetic-{rounds}x{devices}", "fleet": {"groups": fleet}}
    (run_dir / "scenario.yaml").write_text(json.dumps(scenario))  # JSON is YAML
    summary = {"status": "completed", "rounds": rounds,
               "participation_bias": {"l1": 0.1, "top_overweighted": []}}  # fmt: skip
    (run_dir / "summary.json").write_text(json.dumps(summary))
    return int(r.size)


def open_seconds(context, page_path: Path) -> tuple[float, float]:
    """Seconds from asking for ``page_path`` until every figure is drawn,
    and the CPU seconds Chromium's processes spent meanwhile: on a machine
    shared with other work the first grows with the load, the second
    hardly does (it is what an idle core would take, less what Chromium
    does in parallel)."""
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    cpu0, t0 = browser_cpu(), time.perf_counter()
    page.goto(page_path.as_uri(), timeout=120_000)
    drawn = (
        "[...document.querySelectorAll('.plot')]"
        ".every(p => p.querySelector('.main-svg'))"
    )
    page.wait_for_function(drawn, timeout=120_000)
    seconds, busy = time.perf_counter() - t0, browser_cpu() - cpu0
    page.close()
    if errors:
        raise SystemExit(f"{page_path}: the page failed: {errors[0]}")
    return seconds, busy


def browser_cpu() -> float:
    """CPU seconds (user and system) of the Chromium processes this
    process started (through Playwright's driver)."""
    import psutil

    total = 0.0
    for proc in psutil.Process().children(recursive=True):
        try:
            if "chrom" in proc.name():
                total += sum(proc.cpu_times()[:2])
        except psutil.NoSuchProcess:  # a helper process that just ended
            continue
    return total


def screenshot(run_dir: Path, png: Path) -> None:
    """The device timeline of ``run_dir``'s report.html, its longest bar
    hovered, as ``png``."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p, tempfile.TemporaryDirectory() as profile:
        context = launch(p, profile)
        page = context.new_page()
        page.goto((run_dir / "report.html").as_uri())
        section = page.locator("#section-timeline")
        section.scroll_into_view_if_needed()
        bars = page.locator("#plot-timeline .barlayer .point path")
        boxes = [bars.nth(i).bounding_box() for i in range(bars.count())]
        box = max((b for b in boxes if b), key=lambda b: b["width"])
        page.mouse.move(box["x"] + box["width"] * 0.8, box["y"] + box["height"] / 2)
        page.wait_for_selector("#plot-timeline .hoverlayer .hovertext")
        section.screenshot(path=str(png))
        context.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=1000)
    p.add_argument("--devices", type=int, default=1000)
    p.add_argument("--screenshot", nargs=2, type=Path, metavar=("RUN_DIR", "PNG"))
    args = p.parse_args()
    if args.screenshot:
        return screenshot(*args.screenshot)
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as tmp:
        small, big = Path(tmp, "small"), Path(tmp, "big")
        synthetic_run(small, 1, 10)
        jobs = synthetic_run(big, args.rounds, args.devices)
        t0 = time.perf_counter()
        path = write_page(big)
        write_s = time.perf_counter() - t0
        small_path = write_page(small)
        with sync_playwright() as pw, tempfile.TemporaryDirectory() as profile:
            context = launch(pw, profile)
            open_seconds(context, small_path)  # the browser's own first start
            small_s = open_seconds(context, small_path)
            big_s = open_seconds(context, path)
            context.close()
        mb = path.stat().st_size / 1e6
        (big_s, big_busy), (small_s, small_busy) = big_s, small_s
        how = "aggregated" if jobs > MAX_TIMELINE_BARS else "a bar per job"
        print(f"{args.rounds} rounds x {args.devices} devices: {jobs:,} jobs "
              f"(timeline: {how})")  # fmt: skip
        print(f"report.html: {mb:.1f} MB, written in {write_s:.1f} s")
        print(f"opened in headless Chromium in {big_s:.2f} s, {big_busy:.2f} CPU s "
              f"(a 10-job page: {small_s:.2f} s, {small_busy:.2f} CPU s)")  # fmt: skip


if __name__ == "__main__":
    main()
