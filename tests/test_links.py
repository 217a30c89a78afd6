"""Links between the fleet and the data (fedsim/links.py): the declared rank
correlation and per-group data are met, measured, refused when impossible,
and a pure function of (scenario, seed)."""

from __future__ import annotations

import json
import math
import statistics

import numpy as np
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from fedsim.data.partition import client_sizes
from fedsim.fleet import Fleet
from fedsim.links import (
    LinkError,
    LinksSpec,
    avg_ranks,
    group_parts,
    ndtri,
    online_fraction,
    rank_assignment,
    spearman,
)
from fedsim.runtime import run_scenario
from fedsim.scenario import ScenarioError, load_scenario, parse_scenario
from fedsim.tools.cli import app

from .conftest import SCENARIOS, assert_figure

STRESS = SCENARIOS / "stress" / "linked-speed-data.yaml"
TINY = [
    "rounds=3",
    "fleet.groups[0].count=30",
    "data.features=10",
    "eval.every_rounds=1",
    "checkpoint.every_rounds=1",
]


class _Stop(Exception):
    pass


def _fleet(m: int, seed: int = 0, **availability: float | str) -> Fleet:
    from fedsim.fleet import FleetSpec

    groups = [
        {
            "name": "slow",
            "count": m // 2,
            "speed": {"dist": "lognormal", "median_steps_per_s": 1, "sigma": 0.7},
            "availability": availability or {"kind": "always"},
        },
        {
            "name": "fast",
            "count": m - m // 2,
            "speed": {"dist": "lognormal", "median_steps_per_s": 6, "sigma": 0.3},
        },
    ]
    return Fleet.from_spec(FleetSpec.model_validate({"groups": groups}), seed)


# ------------------------------------------------------------ the maths


def test_ndtri_matches_the_standard_library():
    p = np.linspace(1e-5, 1 - 1e-5, 501)
    ref = [statistics.NormalDist().inv_cdf(float(v)) for v in p]
    assert np.allclose(ndtri(p), ref, atol=1e-4)


def test_average_ranks_and_spearman_handle_ties():
    assert avg_ranks(np.array([3.0, 1.0, 3.0, 2.0])).tolist() == [2.5, 0.0, 2.5, 1.0]
    assert math.isnan(spearman(np.ones(5), np.arange(5)))
    assert spearman(np.arange(5), -np.arange(5)) == pytest.approx(-1.0)


@pytest.mark.parametrize("target", [-0.8, -0.4, 0.0, 0.4, 0.8])
def test_rank_correlation_is_within_0_05_of_the_target_on_1000_devices(target):
    fleet = _fleet(1000)
    sizes = client_sizes(60_000, 1000, 1.0, np.random.default_rng(3))
    perm, r = rank_assignment(sizes, fleet.speed, target, seed=7)
    assert sorted(perm.tolist()) == list(range(1000))  # a permutation
    assert r == pytest.approx(spearman(sizes[perm], fleet.speed))
    assert abs(r - target) <= 0.05


def test_online_fraction_link_on_a_fleet_with_tied_availability():
    # every device of a group shares its expected online fraction: ties
    fleet = _fleet(1000, kind="on_off", mean_on_s=100.0, mean_off_s=300.0)
    online = online_fraction(fleet)
    assert set(np.round(online, 6).tolist()) == {0.25, 1.0}
    sizes = client_sizes(60_000, 1000, 1.0, np.random.default_rng(3))
    _, r = rank_assignment(sizes, online, 0.5, seed=0)
    assert abs(r - 0.5) <= 0.05


def test_the_assignment_is_a_pure_function_of_the_seed():
    fleet = _fleet(500)
    sizes = client_sizes(20_000, 500, 1.0, np.random.default_rng(0))
    a, _ = rank_assignment(sizes, fleet.speed, 0.3, seed=1)
    b, _ = rank_assignment(sizes, fleet.speed, 0.3, seed=1)
    c, _ = rank_assignment(sizes, fleet.speed, 0.3, seed=2)
    assert np.array_equal(a, b) and not np.array_equal(a, c)


# ------------------------------------------------------- per-group data


def test_group_label_distributions_match_their_declaration():
    fleet = _fleet(40)
    labels = np.random.default_rng(0).integers(0, 10, 20_000)
    declared = [4, 3, 2, 1, 0, 0, 0, 0, 0, 0]
    links = LinksSpec.model_validate(
        {"groups": {"slow": {"share": 0.25, "labels": declared, "label_alpha": 1.0}}}
    )
    parts = group_parts(links, fleet, labels, 10, seed=0)
    assert sorted(np.concatenate(parts).tolist()) == list(range(20_000))
    slow = np.concatenate(parts[:20])
    assert slow.size == 5000  # the declared share
    observed = np.bincount(labels[slow], minlength=10)[:4]
    expected = np.array(declared[:4]) / 10 * slow.size
    chi2 = float(((observed - expected) ** 2 / expected).sum())
    assert chi2 < 7.81  # chi-square, 3 degrees of freedom, p = 0.05
    assert np.bincount(labels[slow], minlength=10)[4:].sum() == 0
    # the other group holds the remaining samples of every class
    fast = np.concatenate(parts[20:])
    assert np.bincount(labels[fast], minlength=10)[4:].sum() > 0


def test_an_impossible_group_share_names_the_field():
    links = LinksSpec.model_validate({"groups": {"fast": {"share": 0.001}}})
    labels = np.zeros(1000, dtype=np.int64)
    with pytest.raises(LinkError, match=r"links\.groups\.fast\.share"):
        group_parts(links, _fleet(40), labels, 1, seed=0)


def test_links_are_validated_like_every_other_field():
    text = STRESS.read_text()
    for bad, field in [
        ("links.samples_vs_speed=1.5", "links.samples_vs_speed"),
        ("links.speed_corr=0.5", "links.speed_corr"),
        ("links.groups.phones.share=0.5", "links.groups"),
        ("links.samples_vs_online=0.2", "samples_vs_online"),
    ]:
        with pytest.raises(ScenarioError, match=field):
            parse_scenario(text, "s.yaml", [bad])


# ------------------------------------------------------------- in runs


def _cli(tmp_path, *overrides: str):
    args = ["run", str(STRESS), "--workers", "0", "--out", str(tmp_path), "--quiet"]
    for o in [*TINY, *overrides]:
        args += ["--set", o]
    return CliRunner().invoke(app, args)


def test_an_impossible_link_is_exit_2_naming_the_field(tmp_path):
    # all clients the same size: no order to correlate with speed
    res = _cli(tmp_path / "a", "data.max_samples=10", "links.samples_vs_speed=0.5")
    assert res.exit_code == 2, res.output
    assert "links.samples_vs_speed" in res.output
    assert "every client holds" in res.output


def test_summary_and_report_state_the_realised_links(tmp_path):
    out = tmp_path / "run"
    res = _cli(out, "links.samples_vs_speed=-0.6")
    assert res.exit_code == 0, res.output
    links = json.loads((out / "summary.json").read_text())["links"]
    assert links["declared"] == {"samples_vs_speed": -0.6}
    assert abs(links["spearman"]["samples_vs_speed"] + 0.6) <= 0.05
    assert links["groups"][0]["devices"] == 30
    assert links["groups"][0]["selections"] == 30  # 3 rounds of 10
    # the partition table holds the linked sizes: device i's samples
    n = np.asarray(pq.read_table(out / "partition.parquet").column("n_samples"))
    sc = load_scenario(STRESS, TINY)
    speed = Fleet.from_spec(sc.fleet, sc.seed).speed
    assert spearman(n, speed) == pytest.approx(links["spearman"]["samples_vs_speed"])
    # the aggregation weights moved with the data: FedAvg's renormalized
    # weight of each arrived client is n_i / sum_S n_j (docs/results.md),
    # with n_i the linked sizes (a device weighted by the data of the device
    # that held its partition before the permutation passed every test)
    clients = pq.read_table(out / "clients.parquet").to_pylist()
    for t in range(3):
        kept = [c for c in clients if c["round"] == t and not c["dropped"]]
        assert kept, t
        sizes = np.array([n[c["client_id"]] for c in kept], dtype=np.float64)
        got = np.array([c["agg_weight"] for c in kept])
        np.testing.assert_allclose(got, sizes / sizes.sum(), rtol=1e-12)
    assert CliRunner().invoke(app, ["report", str(out)]).exit_code == 0
    report = (out / "report.md").read_text()
    assert "## Fleet and data links" in report and "links.png" in report
    assert_figure(out / "links.png", (6.5, 5.0))  # 30 devices plotted


def test_without_links_the_data_is_the_very_same_object():
    from fedsim.links import apply_links

    sc = load_scenario(STRESS, [*TINY, "links=null"])
    assert sc.links is None
    sentinel = object()
    assert apply_links(None, None, sentinel, 0) is sentinel  # type: ignore[arg-type]


def test_the_assignment_is_the_same_after_resume(tmp_path):
    sc = load_scenario(STRESS, [*TINY, "links.samples_vs_speed=0.7"])
    ref = run_scenario(sc)

    def stop(row, clients):
        if row["round"] == 1:
            raise _Stop

    with pytest.raises(_Stop):
        run_scenario(sc, run_dir=tmp_path, on_round=stop)
    resumed = run_scenario(sc, run_dir=tmp_path, resume=True)
    assert np.array_equal(resumed.data.offsets, ref.data.offsets)
    assert np.array_equal(resumed.data.y, ref.data.y)
    assert resumed.rows[-1]["test_accuracy"] == ref.rows[-1]["test_accuracy"]


@pytest.mark.ray
def test_the_assignment_is_the_same_with_0_and_2_ray_workers(ray_session):
    sc = load_scenario(STRESS, [*TINY, "links.samples_vs_speed=-0.7"])
    local, ray2 = run_scenario(sc, workers=0), run_scenario(sc, workers=2)
    assert np.array_equal(local.data.offsets, ray2.data.offsets)
    assert np.array_equal(local.data.x, ray2.data.x)
    assert local.summary()["links"] == ray2.summary()["links"]
    assert [r["test_accuracy"] for r in local.rows] == [
        r["test_accuracy"] for r in ray2.rows
    ]


def _trace_scenario(tmp_path, links: str) -> str:
    from fedsim.traces import write_trace

    rows = [
        {"speed_steps_per_s": 1 + i, "down_mbps": 10, "up_mbps": 5, "samples": s}
        for i, s in enumerate([5, 40, 15, 90, 30])
    ]
    write_trace(tmp_path / "phones.csv", rows)
    text = STRESS.read_text().replace(
        "    - name: devices\n      count: 100\n",
        "    - name: traced\n      trace: phones.csv\n"
        "    - name: devices\n      count: 25\n",
    )
    return text.replace("  samples_vs_speed: 0.0\n", links)


def test_a_trace_samples_column_gives_each_device_its_samples(tmp_path):
    links = (
        "  samples_from_trace: true\n  groups: {traced: {labels: [1, 1, 0, 0, 0]}}\n"
    )
    sc = parse_scenario(_trace_scenario(tmp_path, links), "s.yaml", [], tmp_path)
    from fedsim.links import build_linked_data

    data = build_linked_data(sc)
    assert data.n_samples[:5].tolist() == [5, 40, 15, 90, 30]
    traced = data.y[: data.offsets[5]]
    assert set(np.unique(traced).tolist()) <= {0, 1}  # the declared labels
    assert data.n_samples[5:].min() >= 1 and data.num_clients == 30


def test_samples_from_trace_is_refused_without_a_samples_column_or_with_a_rank_link(
    tmp_path,
):
    text = _trace_scenario(tmp_path, "  samples_from_trace: true\n")
    with pytest.raises(ScenarioError, match="samples_vs_speed"):
        parse_scenario(text, "s.yaml", ["links.samples_vs_speed=0.5"], tmp_path)
    plain = text.replace("samples_from_trace: true", "samples_from_trace: true\n  x: 1")
    with pytest.raises(ScenarioError, match=r"links\.x"):
        parse_scenario(plain, "s.yaml", [], tmp_path)
    (tmp_path / "sub").mkdir()
    from fedsim.traces import write_trace

    write_trace(
        tmp_path / "sub" / "phones.csv",
        [{"speed_steps_per_s": 1, "down_mbps": 10, "up_mbps": 5}] * 5,
    )
    with pytest.raises(ScenarioError, match="no trace group"):
        parse_scenario(text, "s.yaml", [], tmp_path / "sub")
