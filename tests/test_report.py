"""``fedsim report``: figures and report.md from real run directories, written
by a tiny in-process simulation through the same files ``fedsim run`` writes."""

from __future__ import annotations

import re
import shutil
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fedsim import plots
from fedsim.report import ReportError, write_report
from fedsim.results import (
    CLIENT_SCHEMA,
    ROUND_SCHEMA,
    atomic_write_bytes,
    summarize,
    write_summary,
    write_table,
)
from fedsim.scenario import dump_scenario, load_scenario
from fedsim.server import Simulation

from .conftest import SCENARIOS

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SYNC_FIGURES = ["metrics.png", "tau_by_group.png", "timeline.png"]


def make_run_dir(path: Path, scenario: Path, overrides: list[str]) -> Path:
    sc = load_scenario(scenario, overrides)
    wall0 = time.perf_counter()
    rows, clients = Simulation(sc, workers=0).run()
    path.mkdir(parents=True)
    write_table(path / "rounds.parquet", rows, ROUND_SCHEMA)
    write_table(path / "clients.parquet", clients, CLIENT_SCHEMA)
    summary = summarize(
        rows,
        clients,
        scenario_name=sc.name,
        wall_time_s=time.perf_counter() - wall0,
        workers=0,
        version="test",
    )
    write_summary(path / "summary.json", summary)
    atomic_write_bytes(path / "scenario.yaml", dump_scenario(sc).encode())
    return path


@pytest.fixture(scope="module")
def quickstart_run(tmp_path_factory) -> Path:
    # One epoch per round with an 8 s deadline: stragglers arrive late and are
    # dropped, so the timeline draws long bars and dropped updates.
    return make_run_dir(
        tmp_path_factory.mktemp("runs") / "quickstart",
        SCENARIOS / "quickstart.yaml",
        [
            "rounds=3",
            "resources.workers=0",
            "round={policy: fixed_epochs, epochs: 1, deadline_s: 8}",
        ],
    )


@pytest.fixture(scope="module")
def quadratic_run(tmp_path_factory) -> Path:
    return make_run_dir(
        tmp_path_factory.mktemp("runs") / "quadratic",
        SCENARIOS / "quadratic-objective-inconsistency.yaml",
        ["rounds=5", "algorithm={name: fedavg}"],
    )


def copy_run(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def assert_png(path: Path) -> None:
    assert path.is_file(), f"{path.name} was not written"
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC, f"{path.name} is not a PNG"
    assert len(data) > 5_000, f"{path.name} is suspiciously small ({len(data)} B)"


def linked_images(report: Path) -> list[str]:
    return re.findall(r"!\[[^\]]*\]\(([^)]+)\)", report.read_text())


def test_report_of_a_quickstart_run(quickstart_run, tmp_path):
    # Prepare
    run_dir = copy_run(quickstart_run, tmp_path / "run")
    clients = pq.read_table(run_dir / "clients.parquet")
    assert any(clients.column("dropped").to_pylist()), "want a dropped update"

    # Execute
    report = write_report(run_dir)

    # Assert
    assert report == run_dir / "report.md"
    text = report.read_text()
    assert text.startswith("# Run report: quickstart")
    assert "| final test accuracy |" in text
    assert "| updates dropped |" in text
    links = linked_images(report)
    assert links[:3] == SYNC_FIGURES
    assert "staleness.png" not in links  # a synchronous run
    for name in links:
        assert_png(run_dir / name)
    assert "stragglers" in text


def test_quadratic_run_without_accuracy_still_reports(quadratic_run, tmp_path):
    run_dir = copy_run(quadratic_run, tmp_path / "run")
    rounds = pq.read_table(run_dir / "rounds.parquet")
    assert all(a != a for a in rounds.column("test_accuracy").to_pylist())

    report = write_report(run_dir)

    text = report.read_text()
    assert "accuracy" not in text.split("## ")[0]  # no empty accuracy rows
    assert "| final test loss |" in text
    links = linked_images(report)
    # FedAvg on unequal tau: chi^2(p||w) > 0 is recorded, and drawn.
    assert links == [*SYNC_FIGURES, "chi2.png"]
    for name in links:
        assert_png(run_dir / name)


def test_async_run_gets_a_staleness_figure(quickstart_run, tmp_path):
    # Prepare: an async run's clients table carries a staleness column.
    run_dir = copy_run(quickstart_run, tmp_path / "run")
    clients = pq.read_table(run_dir / "clients.parquet")
    stale = [float(i % 4) for i in range(clients.num_rows)]
    clients = clients.append_column("staleness", pa.array(stale, pa.float64()))
    pq.write_table(clients, run_dir / "clients.parquet")

    report = write_report(run_dir)

    links = linked_images(report)
    assert "staleness.png" in links
    for name in links:
        assert_png(run_dir / name)


def test_missing_rounds_parquet_is_a_clear_error(tmp_path):
    (tmp_path / "clients.parquet").write_bytes(b"")
    with pytest.raises(ReportError, match=r"rounds\.parquet is missing") as info:
        write_report(tmp_path)
    assert str(tmp_path) in str(info.value)


def test_missing_directory_is_a_clear_error(tmp_path):
    missing = tmp_path / "no-such-run"
    with pytest.raises(ReportError, match="not a run directory") as info:
        write_report(missing)
    assert str(missing) in str(info.value)
    assert isinstance(info.value, ValueError)


def test_empty_run_with_only_rounds_parquet(tmp_path):
    # A run interrupted before its first round: empty tables, no summary.
    write_table(tmp_path / "rounds.parquet", [], ROUND_SCHEMA)

    report = write_report(tmp_path)

    text = report.read_text()
    assert "clients.parquet is missing" in text
    assert linked_images(report) == SYNC_FIGURES
    for name in SYNC_FIGURES:
        assert (tmp_path / name).read_bytes()[:8] == PNG_MAGIC


def test_timeline_keeps_first_and_last_rounds(quickstart_run, tmp_path):
    clients = pq.read_table(quickstart_run / "clients.parquet")
    rounds = pq.read_table(quickstart_run / "rounds.parquet")
    assert plots._round_blocks([0, 1, 2], max_rounds=2) == [[0], [2]]
    assert plots._round_blocks([0, 1, 2], max_rounds=20) == [[0, 1, 2]]

    out = plots.plot_timeline(clients, tmp_path / "t.png", rounds, max_rounds=2)

    assert_png(out)
    with pytest.raises(ValueError, match="max_rounds"):
        plots.plot_timeline(clients, tmp_path / "u.png", rounds, max_rounds=0)
