"""``fedsim report``: report.md and the data behind each figure, on real run
directories written by ``fedsim run`` (synchronous with dropped stragglers,
asynchronous FedBuff with stale drops, and the quadratic objective without
accuracy). The figures are checked through :mod:`fedsim.tools.plots`'
``figure_*`` functions: the x/y arrays drawn must be the Parquet columns."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from matplotlib.collections import PathCollection
from matplotlib.patches import Rectangle

from fedsim.results import ROUND_SCHEMA, write_table
from fedsim.tools import plots
from fedsim.tools.report import ReportError, write_report

from .conftest import SCENARIOS, assert_figure, cli_run, fedsim_here

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TINY = SCENARIOS / "ci" / "tiny-synthetic.yaml"
SYNC_FIGURES = ["metrics.png", "tau_by_group.png", "timeline.png"]


@pytest.fixture(scope="module")
def sync_run(tmp_path_factory) -> Path:
    # One epoch per round with an 8 s deadline: stragglers arrive late and are
    # dropped; evaluation every 2 rounds leaves NaN rows.
    return cli_run(
        tmp_path_factory.mktemp("runs") / "quickstart",
        "quickstart.yaml",
        [
            "rounds=4",
            "round={policy: fixed_epochs, epochs: 1, deadline_s: 8}",
            "eval.every_rounds=2",
        ],
    )


@pytest.fixture(scope="module")
def async_run(tmp_path_factory) -> Path:
    # FedBuff with max_staleness 2: updates staler than that are dropped.
    return cli_run(
        tmp_path_factory.mktemp("runs") / "fedbuff",
        "async-fedbuff.yaml",
        ["rounds=8", "round.max_staleness=2", "eval.every_rounds=3"],
    )


@pytest.fixture(scope="module")
def quadratic_run(tmp_path_factory) -> Path:
    return cli_run(
        tmp_path_factory.mktemp("runs") / "quadratic",
        "quadratic-objective-inconsistency.yaml",
        ["rounds=5", "algorithm={name: fedavg}"],
    )


def tables(run_dir: Path) -> tuple[list[dict], list[dict]]:
    rounds = pq.read_table(run_dir / "rounds.parquet").to_pylist()
    clients = pq.read_table(run_dir / "clients.parquet").to_pylist()
    return rounds, clients


def finite(x) -> bool:
    return x is not None and np.isfinite(x)


def linked_images(report: Path) -> list[str]:
    return re.findall(r"!\[[^\]]*\]\(([^)]+)\)", report.read_text())


def line_xy(ax, label: str) -> tuple[list[float], list[float]]:
    (line,) = [ln for ln in ax.get_lines() if ln.get_label() == label]
    return list(map(float, line.get_xdata())), list(map(float, line.get_ydata()))


def points(ax) -> list[tuple[float, float]]:
    """Every scattered point of an Axes, sorted."""
    out: list[tuple[float, float]] = []
    for c in ax.collections:
        if isinstance(c, PathCollection):
            out += [tuple(map(float, p)) for p in c.get_offsets()]
    return sorted(out)


def copy_run(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


# ---------------------------------------------------------------- report.md


@pytest.mark.parametrize("which", ["sync", "async", "quadratic"])
def test_report_links_the_figures_it_wrote(which, sync_run, async_run, quadratic_run):
    run_dir = {"sync": sync_run, "async": async_run, "quadratic": quadratic_run}[which]

    links = linked_images(run_dir / "report.md")

    expected = SYNC_FIGURES + (["staleness.png"] if which == "async" else [])
    # FedAvg/FedBuff/FedNova-with-FedAvg-weights on unequal tau or stale
    # arrivals: chi^2(p||w) > 0 is recorded, so it is drawn; the partition's
    # figure closes the report (the quadratic objectives have no partition).
    partition = [] if which == "quadratic" else ["partition.png"]
    share = [] if which == "quadratic" else ["weight_share.png"]
    assert links == [*expected, "chi2.png", *share, *partition]
    for name in links:
        assert (run_dir / name).read_bytes()[:8] == PNG_MAGIC


def test_report_text_of_a_sync_run(sync_run):
    text = (sync_run / "report.md").read_text()

    assert text.startswith("# Run report: quickstart")
    assert "| updates dropped | 6 (15.0%) |" in text  # 6 of 40 (counted below)
    assert "stragglers" in text
    _, clients = tables(sync_run)
    assert sum(c["dropped"] for c in clients) == 6 and len(clients) == 40


def test_report_says_a_run_did_not_complete_or_was_degenerate(sync_run, tmp_path):
    from fedsim.tools.report import write_report

    run_dir = copy_run(sync_run, tmp_path / "run")
    assert "This run is" not in (run_dir / "report.md").read_text()
    summary = json.loads((run_dir / "summary.json").read_text())
    summary |= {"status": "interrupted", "degenerate": "no update ever arrived"}
    (run_dir / "summary.json").write_text(json.dumps(summary))

    text = write_report(run_dir).read_text()

    assert "> **This run is interrupted**" in text
    assert "> **Degenerate run**: no update ever arrived." in text


def test_quadratic_run_without_accuracy_has_no_accuracy_rows(quadratic_run):
    rounds, _ = tables(quadratic_run)
    assert not any(finite(r["test_accuracy"]) for r in rounds)

    text = (quadratic_run / "report.md").read_text()

    assert "accuracy" not in text.split("## ")[0]  # no empty accuracy rows
    assert "| final test loss |" in text


def test_report_command_rewrites_the_report(sync_run, tmp_path):
    run_dir = copy_run(sync_run, tmp_path / "run")
    (run_dir / "report.md").unlink()

    path = write_report(run_dir)

    assert path == run_dir / "report.md"
    assert path.read_text() == (sync_run / "report.md").read_text().replace(
        "`quickstart`", "`run`"
    )


def test_a_run_without_report_draws_nothing_and_the_report_draws_the_partition(
    tmp_path,
):
    # The run writes the partition's table only; every figure, partition.png
    # included, is the report's (a --no-report run spends nothing on plots).
    run_dir = tmp_path / "run"
    tiny = str(SCENARIOS / "ci" / "tiny-synthetic.yaml")
    fedsim_here("run", tiny, "--workers", "0", "--out", str(run_dir), "--no-report",
                "-q", check=True)  # fmt: skip
    assert (run_dir / "partition.parquet").exists()
    assert not list(run_dir.glob("*.png")) and not (run_dir / "report.md").exists()

    write_report(run_dir)

    assert_figure(run_dir / "partition.png")  # bars in the classes' colors
    assert "![Data partition](partition.png)" in (run_dir / "report.md").read_text()


# ---------------------------------------------------------------- figure data


@pytest.mark.parametrize("which", ["sync", "async"])
def test_metrics_figure_plots_the_rounds_columns(which, sync_run, async_run):
    run_dir = sync_run if which == "sync" else async_run
    rounds, _ = tables(run_dir)
    evaluated = [r for r in rounds if finite(r["test_accuracy"])]
    assert 0 < len(evaluated) < len(rounds)

    fig = plots.figure_metrics(pq.read_table(run_dir / "rounds.parquet"))

    (acc_t, acc_r), (loss_t, loss_r) = fig.axes[0:2], fig.axes[2:4]
    for ax, x in ((acc_t, "sim_time"), (acc_r, "round")):
        xs, ys = line_xy(ax, "test accuracy")
        assert xs == [r[x] + (x == "round") for r in evaluated]
        assert ys == [r["test_accuracy"] for r in evaluated]
    for ax, x in ((loss_t, "sim_time"), (loss_r, "round")):
        xs, ys = line_xy(ax, "test loss")
        assert (xs, ys) == (
            [r[x] + (x == "round") for r in evaluated],
            [r["test_loss"] for r in evaluated],
        )
        xs, ys = line_xy(ax, "train loss")  # every round has a training loss
        assert (xs, ys) == (
            [r[x] + (x == "round") for r in rounds],
            [r["train_loss"] for r in rounds],
        )


def test_metrics_figure_of_a_run_without_accuracy(quadratic_run):
    rounds, _ = tables(quadratic_run)

    fig = plots.figure_metrics(pq.read_table(quadratic_run / "rounds.parquet"))

    assert len(fig.axes) == 2  # loss only
    xs, ys = line_xy(fig.axes[1], "test loss")
    assert xs == [r["round"] + 1 for r in rounds]  # rounds completed
    assert ys == [r["test_loss"] for r in rounds]


@pytest.mark.parametrize("which", ["sync", "async"])
def test_tau_figure_plots_completed_updates_per_group(which, sync_run, async_run):
    run_dir = sync_run if which == "sync" else async_run
    _, clients = tables(run_dir)

    fig = plots.figure_tau_by_group(pq.read_table(run_dir / "clients.parquet"))

    (ax,) = fig.axes
    labels = [t.get_text() for t in ax.get_xticklabels()]
    for i, coll in enumerate(
        c for c in ax.collections if isinstance(c, PathCollection)
    ):
        group = labels[i].split("\n")[0]
        want = sorted(
            c["tau"] for c in clients if c["device_group"] == group and not c["dropped"]
        )
        assert sorted(float(y) for _, y in coll.get_offsets()) == want, group
        assert labels[i].endswith(f"(n={len(want)})")
        # jitter stays within the group's box
        assert all(abs(x - (i + 1)) <= 0.18 for x, _ in coll.get_offsets())
    assert sum(int(lb.split("n=")[1][:-1]) for lb in labels) == sum(
        not c["dropped"] for c in clients
    )


@pytest.mark.parametrize("which", ["sync", "async"])
def test_timeline_draws_one_bar_per_client_row(which, sync_run, async_run):
    run_dir = sync_run if which == "sync" else async_run
    rounds, clients = tables(run_dir)

    fig = plots.figure_timeline(
        pq.read_table(run_dir / "clients.parquet"),
        pq.read_table(run_dir / "rounds.parquet"),
    )

    ax = fig.axes[0]
    ids = sorted({c["client_id"] for c in clients})
    bars = sorted(
        (
            p.get_x(),
            p.get_x() + p.get_width(),
            ids[round(p.get_y() + 0.35)],
            bool(p.get_hatch()),
        )
        for p in ax.patches
        if isinstance(p, Rectangle)
    )
    want = sorted(
        (c["t_start"], c["t_arrive"], c["client_id"], c["dropped"]) for c in clients
    )
    assert len(bars) == len(want)
    for got, exp in zip(bars, want, strict=True):
        assert got[0] == pytest.approx(exp[0], abs=1e-9)
        assert got[1] == pytest.approx(exp[1], abs=1e-9)
        assert got[2:] == exp[2:]
    # a red drop marker at each dropped update's arrival
    red = [
        tuple(map(float, p))
        for c in ax.collections
        if isinstance(c, PathCollection) and c.get_array() is None
        for p in c.get_offsets()
    ]
    assert sorted(x for x, _ in red) == sorted(
        c["t_arrive"] for c in clients if c["dropped"]
    )


def test_staleness_figure_plots_every_arrival(async_run):
    _, clients = tables(async_run)
    assert any(c["dropped"] for c in clients)

    fig = plots.figure_staleness(pq.read_table(async_run / "clients.parquet"))

    (ax,) = fig.axes
    assert points(ax) == sorted((c["t_arrive"], float(c["staleness"])) for c in clients)
    (drop,) = [c for c in ax.collections if c.get_label() == "dropped"]
    assert sorted(map(tuple, drop.get_offsets().tolist())) == sorted(
        (c["t_arrive"], float(c["staleness"])) for c in clients if c["dropped"]
    )


@pytest.mark.parametrize("which", ["sync", "async", "quadratic"])
def test_chi2_figure_plots_the_rounds_column(which, sync_run, async_run, quadratic_run):
    run_dir = {"sync": sync_run, "async": async_run, "quadratic": quadratic_run}[which]
    rounds, _ = tables(run_dir)
    want = [(r["round"], r["chi2_pw"]) for r in rounds if finite(r["chi2_pw"])]
    assert want
    # FedNova (quickstart) weighs by data size: chi^2 = 0 exactly; FedAvg on
    # unequal tau and FedBuff on stale arrivals do not.
    assert any(v > 0 for _, v in want) == (which != "sync")

    fig = plots.figure_chi2(pq.read_table(run_dir / "rounds.parquet"))

    xs, ys = fig.axes[0].get_lines()[0].get_data()
    assert list(zip(map(float, xs), map(float, ys), strict=True)) == want


def test_timeline_keeps_first_and_last_rounds(async_run):
    clients = pq.read_table(async_run / "clients.parquet")
    rounds = pq.read_table(async_run / "rounds.parquet")
    assert plots._round_blocks([0, 1, 2], max_rounds=2) == [[0], [2]]
    assert plots._round_blocks([0, 1, 2], max_rounds=20) == [[0, 1, 2]]

    fig = plots.figure_timeline(clients, rounds, max_rounds=2)

    # two panels: round 0 and round 7, with just their client rows
    assert [ax.get_title() for ax in fig.axes[:2]] == ["round 0", "round 7"]
    per_round = [
        sum(r == k for r in clients.column("round").to_pylist()) for k in (0, 7)
    ]
    assert [len(ax.patches) for ax in fig.axes[:2]] == per_round
    with pytest.raises(ValueError, match="max_rounds"):
        plots.figure_timeline(clients, rounds, max_rounds=0)


# ---------------------------------------------------------------- errors


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


def test_a_plugins_thousands_of_metrics_draw_a_bounded_figure_that_says_so(tmp_path):
    # Prepare / Execute: a plug-in reporting 40 metrics a round, reported
    out = tmp_path / "run"
    metrics = "algorithm={name: 'tests.hostile_plugins:ManyMetrics', count: 40}"
    fedsim_here(
        *("run", str(TINY), "--workers", "0", "--out", str(out), "-q"),
        *("--set", "rounds=2", "--set", metrics),
        check=True,
    )
    rounds = pq.read_table(out / "rounds.parquet")

    # Assert: every metric is in rounds.parquet, the figure draws the first
    # MAX_PLUGIN_PANELS and its title and report.md say what was left out
    assert len(plots.plugin_columns(rounds)) == 40
    fig = plots.figure_plugin_metrics(rounds, "t")
    assert len(fig.axes) == plots.MAX_PLUGIN_PANELS == 12
    assert fig.axes[0].get_title() == "t (first 12 of 40)"
    assert [ax.get_ylabel() for ax in fig.axes][-1] == "alg_m0011"
    text = " ".join((out / "report.md").read_text().split())
    note = "The figure shows the first 12 of 40 plug-in metrics; the other 28 are"
    assert f"{note} in rounds.parquet." in text
    assert_figure(out / "plugin_metrics.png")
