"""report.html, compare.html and stress.html (fedsim/tools/page*.py) and the
live server (fedsim/tools/live.py), read without a browser: the data each
page embeds must be the run's Parquet rows, the page must open offline,
and the server must listen on the loopback only. What a browser draws of
it is tests/test_page_browser.py's."""

from __future__ import annotations

import base64
import json
import re
import shutil
import socket
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from fedsim.tools import page
from fedsim.tools.live import HOST, serving
from fedsim.tools.page import run_page_data, write_page
from fedsim.tools.page_group import write_group_page
from fedsim.tools.report import ReportError

from .conftest import SCENARIOS, fedsim_here

TINY = str(SCENARIOS / "ci" / "tiny-synthetic.yaml")


def page_data(path: Path) -> dict:
    """The JSON a written page embeds (what its script draws)."""
    html = path.read_text()
    found = re.search(r'id="fedsim-data">(.*?)</script>', html, re.S)
    assert found, "the page has no data element"
    return json.loads(found.group(1))


def sections(data: dict) -> dict[str, dict]:
    """The page's sections by id, each array as a list (Plotly writes
    NumPy arrays as base64 typed arrays, which plotly.js decodes)."""
    return {s["id"]: decoded(s) for s in data["sections"]}


def decoded(x):
    if isinstance(x, dict) and "bdata" in x:
        array = np.frombuffer(base64.b64decode(x["bdata"]), dtype=x["dtype"])
        shape = [int(n) for n in str(x.get("shape", array.size)).split(",")]
        return array.reshape(shape).tolist()
    if isinstance(x, dict):
        return {k: decoded(v) for k, v in x.items()}
    if isinstance(x, list):
        return [decoded(v) for v in x]
    return x


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> Path:
    # 6 devices of 3 groups would need another scenario: tiny's one group,
    # 4 rounds of 3 selected devices, is 12 jobs
    out = tmp_path_factory.mktemp("page") / "tiny"
    fedsim_here("run", TINY, "--workers", "0", "--out", str(out), "--set",
                "rounds=4", "-q", check=True)  # fmt: skip
    return out


# session scope: tests/test_page_browser.py opens the same run's and
# comparison's pages (a fixture of module scope is built again for each
# module that imports it); every test only reads them
@pytest.fixture(scope="session")
def straggler_run(tmp_path_factory) -> Path:
    # quickstart's three groups with an 8 s deadline: late updates are dropped
    out = tmp_path_factory.mktemp("page") / "quickstart"
    fedsim_here("run", str(SCENARIOS / "quickstart.yaml"), "--workers", "0",
                "--out", str(out), "-q", "--set", "rounds=3", "--set",
                "round={policy: fixed_epochs, epochs: 1, deadline_s: 8}",
                check=True)  # fmt: skip
    return out


def timeline_jobs(data: dict) -> list[tuple[int, int, float]]:
    """(round, device, tau) of every bar the timeline draws."""
    out = []
    for trace in sections(data)["timeline"]["figure"]["data"]:
        for device, custom in zip(trace["y"], trace["customdata"], strict=True):
            out.append((int(custom[1]), int(device), float(custom[2])))
    return out


def test_every_run_writes_a_self_contained_page(tiny_run):
    html = (tiny_run / "report.html").read_text()
    # plotly.js inside the page, and nothing fetched from anywhere
    assert "plotly.js v" in html and len(html) > 3_000_000
    assert not re.search(r"<script[^>]*\bsrc=", html)
    assert re.findall(r"<link[^>]*>", html) == ['<link rel="icon" href="data:,">']
    data = page_data(tiny_run / "report.html")
    assert data["counter"] == 4 and data["counter_label"] == "rounds done"
    ids = list(sections(data))
    assert ids[:4] == ["metrics", "timeline", "states", "tau"] and "realised" in ids
    assert dict(map(tuple, data["table"]))["rounds"] == "4"


@pytest.mark.parametrize("which", ["tiny", "straggler"])
def test_timeline_has_one_bar_per_job_with_its_tau(which, tiny_run, straggler_run):
    run = {"tiny": tiny_run, "straggler": straggler_run}[which]
    rows = pq.read_table(run / "clients.parquet").to_pylist()
    expected = sorted((r["round"], r["client_id"], float(r["tau"])) for r in rows)
    assert sorted(timeline_jobs(page_data(run / "report.html"))) == expected


@pytest.mark.parametrize(
    ("scenario", "rounds"),
    [("async-fedbuff.yaml", 6), ("quadratic-objective-inconsistency.yaml", 3)],
)
def test_async_and_quadratic_runs_get_their_page(scenario, rounds, tmp_path):
    # asynchronous: a bar per job (round: the version it was applied to);
    # the quadratic objective: no accuracy at all, so no accuracy curve
    out = tmp_path / "run"
    fedsim_here("run", str(SCENARIOS / scenario), "--workers", "0", "--out",
                str(out), "-q", "--set", f"rounds={rounds}", check=True)  # fmt: skip
    data = page_data(out / "report.html")
    rows = pq.read_table(out / "clients.parquet").to_pylist()
    assert len(timeline_jobs(data)) == len(rows) and data["counter"] == rounds
    curves = sections(data)["metrics"]["figure"]["data"]
    accuracy = [t for t in curves if t["name"] == "test_accuracy"]
    assert all(len(t["y"]) > 0 for t in accuracy) == ("async" in scenario)


def test_dropped_jobs_are_their_own_traces_with_the_reason(straggler_run):
    rows = pq.read_table(straggler_run / "clients.parquet").to_pylist()
    dropped = {(r["round"], r["client_id"]): r["drop_reason"] for r in rows
               if r["dropped"]}  # fmt: skip
    assert dropped, "the deadline dropped no update: the test checks nothing"
    traces = sections(page_data(straggler_run / "report.html"))["timeline"]
    seen = {}
    for trace in traces["figure"]["data"]:
        for device, custom in zip(trace["y"], trace["customdata"], strict=True):
            if "(dropped)" in trace["name"]:
                seen[int(custom[1]), int(device)] = custom[4]
                assert trace["marker"]["pattern"]["shape"] == "/"
    assert seen == {k: f"dropped: {v}" for k, v in dropped.items()}


def test_accuracy_curves_are_the_rounds_columns(tiny_run):
    rounds = pq.read_table(tiny_run / "rounds.parquet").to_pylist()
    summary = json.loads((tiny_run / "summary.json").read_text())
    fig = sections(page_data(tiny_run / "report.html"))["metrics"]["figure"]
    acc = [t for t in fig["data"] if t["name"] == "test_accuracy"]
    by_time, by_round = acc  # the left panel first
    want = [summary["initial"]["accuracy"]] + [r["test_accuracy"] for r in rounds]
    assert by_round["y"] == pytest.approx(want)
    assert by_round["x"] == [0, 1, 2, 3, 4]
    assert by_time["x"] == pytest.approx([0] + [r["sim_time"] for r in rounds])


def test_no_html_flag_writes_no_page(tmp_path):
    out = tmp_path / "run"
    fedsim_here("run", TINY, "--workers", "0", "--out", str(out), "--no-html",
                "-q", check=True)  # fmt: skip
    assert (out / "report.md").exists() and not (out / "report.html").exists()


def test_report_command_draws_the_page_of_an_older_run(tiny_run, tmp_path):
    # an older or interrupted run: rows, no summary.json, no page
    old = tmp_path / "old"
    old.mkdir()
    for name in ("rounds.parquet", "clients.parquet", "scenario.yaml"):
        shutil.copy(tiny_run / name, old / name)
    done = fedsim_here("report", str(old), check=True)
    assert f"page: {old / 'report.html'}" in done.stdout
    data = page_data(old / "report.html")
    assert data["counter"] == 4 and "no summary.json" in data["subtitle"]
    assert len(timeline_jobs(data)) == 12


def test_report_command_refuses_a_folder_without_rounds(tmp_path):
    done = fedsim_here("report", str(tmp_path))
    assert done.returncode == 2 and "rounds.parquet is missing" in done.stderr


def test_page_is_a_pure_function_of_the_files(tiny_run, tmp_path):
    copy = shutil.copytree(tiny_run, tmp_path / tiny_run.name)  # the name shows
    first = write_page(copy).read_bytes()
    assert write_page(copy).read_bytes() == first
    assert first == (tiny_run / "report.html").read_bytes()


def test_past_the_bound_the_timeline_aggregates_and_says_so(straggler_run, monkeypatch):
    # lower the bound: the real one needs 20,000 jobs (benchmarks/report_page.py)
    rows = pq.read_table(straggler_run / "clients.parquet").to_pylist()
    monkeypatch.setattr(page, "MAX_TIMELINE_BARS", len(rows) - 1)
    timeline = sections(run_page_data(straggler_run))["timeline"]
    assert f"{len(rows):,} jobs" in timeline["note"]
    (heat,) = timeline["figure"]["data"]
    assert heat["type"] == "heatmap"
    # each cell: the device's mean tau over its jobs in the round (bins of 1)
    device = heat["y"].index(rows[0]["client_id"])
    assert heat["z"][device][rows[0]["round"]] == pytest.approx(rows[0]["tau"])
    monkeypatch.setattr(page, "MAX_TIMELINE_BARS", len(rows))
    assert not sections(run_page_data(straggler_run))["timeline"]["note"]


def test_aggregated_timeline_bins_rounds_within_the_cell_bound(
    straggler_run, monkeypatch
):
    rows = pq.read_table(straggler_run / "clients.parquet").to_pylist()
    devices = len({r["client_id"] for r in rows})
    monkeypatch.setattr(page, "MAX_TIMELINE_BARS", 0)
    # room for 2 of the 3 rounds per device: bins of 2 rounds
    monkeypatch.setattr(page, "MAX_TIMELINE_CELLS", 2 * devices + 1)
    timeline = sections(run_page_data(straggler_run))["timeline"]
    (heat,) = timeline["figure"]["data"]
    assert len(heat["y"]) == devices and heat["x"] == [0, 2]
    assert "bin of 2 round(s)" in timeline["note"]


def test_text_of_the_run_cannot_end_the_script_element(tiny_run, tmp_path):
    copy = shutil.copytree(tiny_run, tmp_path / "copy")
    scenario = (copy / "scenario.yaml").read_text()
    (copy / "scenario.yaml").write_text(
        scenario.replace("name: tiny-synthetic", "name: </script><b>x")
    )
    data = page_data(write_page(copy))
    assert data["title"] == "Run report: </script><b>x"


# ------------------------------------------------------- compare and stress


@pytest.fixture(scope="session")  # as straggler_run
def compare_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("page") / "compare"
    fedsim_here("compare", TINY, "--algorithms", "fedavg,fedprox:mu=0.5",
                "--seeds", "2", "--out", str(out), "-q", check=True)  # fmt: skip
    return out


def test_compare_writes_its_page_with_seed_bands_and_paired_rows(compare_dir):
    data = page_data(compare_dir / "compare.html")
    assert data["counter"] == 4 and data["counter_label"] == "runs done"
    curves = sections(data)["curves"]["figure"]["data"]
    lines = [t for t in curves if t.get("name") and t.get("fill") is None]
    assert sorted({t["name"] for t in lines}) == ["fedavg", "fedprox:mu=0.5"]
    files = sorted((compare_dir / "runs").glob("fedavg-seed*.parquet"))
    rounds = [pq.read_table(p).column("test_accuracy").to_pylist() for p in files]
    by_round = [t for t in lines if t["name"] == "fedavg"][1]
    mean = [sum(v) / len(v) for v in zip(*rounds, strict=True)]
    assert by_round["y"] == pytest.approx(mean)
    paired = pq.read_table(compare_dir / "paired.parquet").to_pylist()
    points = sections(data)["paired"]["figure"]["data"]
    assert sum(len(t["x"]) for t in points) == len(paired)
    # the hover lists the row's columns by name, the verdict among them
    hovers = "\n".join(h for t in points for h in t["hovertext"])
    assert all(f"<br>verdict: {r['verdict']}<br>" in hovers for r in paired)


def test_compare_page_reads_paired_columns_by_name(compare_dir, tmp_path):
    # another verdict column and one missing: the page still draws
    copy = shutil.copytree(compare_dir, tmp_path / "copy")
    table = pq.read_table(copy / "paired.parquet")
    table = table.drop_columns(["verdict"]).append_column(
        "verdict_holm", table.column("verdict")
    )
    pq.write_table(table, copy / "paired.parquet")
    data = page_data(write_group_page(copy))
    hover = sections(data)["paired"]["figure"]["data"][0]["hovertext"][0]
    assert "verdict_holm: " in hover and "<br>verdict: " not in hover


def test_stress_writes_its_page_per_cell(tmp_path):
    out = tmp_path / "stress"
    # --workers 0: stress's default (Ray tasks) would start an embedded Ray
    # in this pytest process and leave it up, idle but costing CPU, until the
    # process ends; the page is written from the tables either way, and
    # test_stress runs stress on Ray tasks
    fedsim_here("stress", TINY, "--sweep", "fleet.stragglers.p=0,0.3",
                "--algorithms", "fedavg,fedprox:mu=0.5", "--seeds", "2",
                "--workers", "0", "--out", str(out), "-q", check=True)  # fmt: skip
    data = page_data(out / "stress.html")
    assert data["counter"] == 8
    names = {t["name"] for t in sections(data)["curves"]["figure"]["data"]
             if t.get("name")}  # fmt: skip
    assert names == {"cell 0: fedavg", "cell 0: fedprox:mu=0.5", "cell 1: fedavg",
                     "cell 1: fedprox:mu=0.5"}  # fmt: skip


def test_group_page_of_a_folder_without_tables_is_a_clear_error(tmp_path):
    with pytest.raises(ReportError, match="neither compare.parquet nor"):
        write_group_page(tmp_path)


# ---------------------------------------------------------------- live


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as reply:
        return reply.read().decode()


def test_live_serves_the_page_and_its_data_on_the_loopback(tiny_run, tmp_path):
    lines: list[str] = []
    with serving(tiny_run, run_page_data, 0, lines.append) as live:
        assert live.server.server_address[0] == HOST == "127.0.0.1"
        html = get(live.url)
        data = json.loads(get(live.url + "data.json"))
        assert "const LIVE = true;" in html
        with pytest.raises(urllib.error.HTTPError):
            get(live.url + "rounds.parquet")  # serves the page, not the folder
    assert data["counter"] == 4 and data["sections"]
    assert lines[0] == f"live: {live.url} (served while it runs)"
    assert lines[-1] == f"live: stopped serving {live.url}"
    with pytest.raises(OSError):  # nothing listens once the block ended
        get(live.url)


def test_live_data_follows_the_files(tiny_run, tmp_path):
    # an empty folder first (the run has not written rows), then rows
    run = tmp_path / "run"
    run.mkdir()
    with serving(run, run_page_data, 0, lambda line: None) as live:
        waiting = json.loads(get(live.url + "data.json"))
        for name in ("rounds.parquet", "clients.parquet", "scenario.yaml"):
            shutil.copy(tiny_run / name, run / name)
        ready = json.loads(get(live.url + "data.json"))
    assert waiting["counter"] == 0 and waiting["title"].startswith("waiting")
    assert ready["counter"] == 4 and ready["version"] != waiting["version"]


def test_a_taken_port_is_one_line_and_a_free_port_serves(tiny_run):
    taken = socket.socket()
    taken.bind((HOST, 0))
    taken.listen()
    port = taken.getsockname()[1]
    lines: list[str] = []
    try:
        with serving(tiny_run, run_page_data, port, lines.append) as live:
            assert live.server.server_address[1] != port
            assert json.loads(get(live.url + "data.json"))["counter"] == 4
    finally:
        taken.close()
    assert lines[0].startswith(f"live: port {port} on 127.0.0.1 is taken (")
    assert lines[0].endswith(f"using {live.server.server_address[1]}")


def test_run_live_prints_the_address_and_stops(tmp_path):
    out = tmp_path / "run"
    done = fedsim_here("run", TINY, "--workers", "0", "--out", str(out), "-q",
                       "--live", "--live-port", "0", check=True)  # fmt: skip
    said = re.findall(r"live: (http://127\.0\.0\.1:\d+/)", done.stderr)
    assert said and f"live: stopped serving {said[0]}" in done.stderr
    with pytest.raises(OSError):
        get(said[0])
