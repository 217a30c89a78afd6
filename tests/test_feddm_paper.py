"""The FedDM paper scenario (scenarios/papers/feddm-fmnist.yaml), its CI-sized
variant through ``fedsim compare``, and compare's accuracy against bytes
uploaded (the paper's claim: fewer rounds AND fewer uploaded floats)."""

from __future__ import annotations

import warnings
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from fedsim.algorithms.feddm import upload_bytes
from fedsim.scenario import ScenarioWarning, load_scenario
from fedsim.tools.cli import app
from fedsim.tools.compare import (
    format_markdown,
    load_variant,
    summarize_runs,
    with_uploads,
)

from .conftest import SCENARIOS, assert_figure

PAPER = SCENARIOS / "papers" / "feddm-fmnist.yaml"
CI = SCENARIOS / "papers" / "feddm-fmnist-ci.yaml"
FMNIST = Path("/usr/share/datasets/fashion-mnist")


# --------------------------------------------------------------- the scenario
def test_the_paper_scenario_is_the_headline_setting():
    with warnings.catch_warnings():
        warnings.simplefilter("error", ScenarioWarning)  # no cut iterations
        sc = load_scenario(PAPER)
    alg = sc.algorithm
    assert sc.num_clients == 10 and sc.selector.clients_per_round == 10
    assert sc.data.dataset == "fashion_mnist"
    assert (sc.data.partition.kind, sc.data.partition.alpha) == ("dirichlet", 0.5)
    assert (sc.model.name, sc.model.width, sc.model.depth) == ("convnet", 128, 3)
    assert sc.rounds == 20 and alg.name == "feddm"
    assert (alg.ipc, alg.rho, alg.iterations, alg.dc_batch_size) == (10, 5.0, 1000, 256)
    assert (alg.server_epochs, alg.server_lr, alg.server_momentum) == (500, 0.01, 0.9)
    for label in ("feddm", "fedavg", "scaffold"):  # the comparison it documents
        assert load_variant(PAPER, label, 0)[0].algorithm.name == label


# ------------------------------------------------------ accuracy vs uploads
def run_row(alg: str, seed: int, hit_round: int | None, up_to: int | None) -> dict:
    return {
        "algorithm": alg,
        "mode": "sync",
        "seed": seed,
        "final_accuracy": 0.8,
        "best_accuracy": 0.8,
        "final_test_loss": 0.5,
        "final_train_loss": 0.4,
        "sim_time_s": 10.0,
        "mean_chi2_pw": 0.0,
        "rounds_to_target": hit_round,
        "time_to_target_s": None if hit_round is None else 5.0,
        "bytes_up_to_target": up_to,
        "bytes_down": 1_000,
        "bytes_up": 3_000_000,
        "diverged": False,
    }


def test_uploads_to_target_censor_a_miss_at_the_run_s_uploads():
    # Prepare: two seeds reach 70% after 2 MB and 4 MB uploaded, one never
    # (its run uploaded 3 MB in all: the miss is censored there)
    runs = [
        run_row("feddm", 0, 2, 2_000_000),
        run_row("feddm", 1, 4, 4_000_000),
        run_row("feddm", 2, None, None),
    ]
    # Execute
    (row,) = summarize_runs(runs, target_accuracy=0.7)
    md = format_markdown([row], "t")
    # Assert: every seed averaged, a lower bound, with how many reached
    assert row["bytes_up_to_target"] == 3_000_000
    assert row["bytes_up_to_target_std"] == pytest.approx(1e6)
    assert row["bytes_up_per_run"] == 3_000_000
    assert "| uploaded to 70% |" in md
    assert "| >= 3.00 MB ± 1.00 MB (reached in 2/3) | 3.00 MB |" in md


def test_cumulative_uploads_per_round():
    rows = [{"round": 0}, {"round": 1}, {"round": 2}]
    clients = [
        {"round": 0, "bytes_up": 5},
        {"round": 0, "bytes_up": 6},
        {"round": 2, "bytes_up": 7},  # nothing uploaded in round 1
    ]
    assert [r["bytes_up_cum"] for r in with_uploads(rows, clients)] == [11, 11, 18]


# ------------------------------------------------------------ end to end
@pytest.mark.slow
@pytest.mark.skipif(
    not (FMNIST / "train-images-idx3-ubyte.gz").is_file(),
    reason="Fashion-MNIST not installed: apt-get install dataset-fashion-mnist",
)
def test_the_ci_variant_compares_feddm_with_model_averaging(tmp_path):
    # Execute: fedsim compare, as the scenario's comment says
    out = tmp_path / "out"
    args = ["compare", str(CI), "-a", "feddm,fedavg,scaffold", "--seeds", "1"]
    r = CliRunner().invoke(app, [*args, "--target", "0.2", "--out", str(out), "-q"])
    assert r.exit_code == 0, r.output
    # Assert: every run learned something and the uploads are what was sent
    runs = {
        x["algorithm"]: x for x in pq.read_table(out / "compare.parquet").to_pylist()
    }
    assert sorted(runs) == ["fedavg", "feddm", "scaffold"]
    assert all(x["rounds"] == 3 and not x["diverged"] for x in runs.values())
    assert all(x["final_accuracy"] > 0.2 for x in runs.values())  # chance: 0.1
    sc = load_scenario(CI)
    from fedsim.data import build_data

    data = build_data(sc.data, sc.num_clients, sc.seed)
    classes = [len(set(data.y[data.client_rows(k)].tolist())) for k in range(10)]
    synthetic = sum(upload_bytes(c, 2, (1, 28, 28)) for c in classes)
    assert runs["feddm"]["bytes_up"] == 3 * synthetic  # every client, 3 rounds
    d = 5826  # convnet width 8, depth 2 on 1x28x28
    assert runs["fedavg"]["bytes_up"] == 3 * 10 * d * 4
    assert runs["scaffold"]["bytes_up"] == 2 * runs["fedavg"]["bytes_up"]
    for name, x in runs.items():
        curve = pq.read_table(out / "runs" / f"{name}-seed0.parquet").to_pylist()
        assert curve[-1]["bytes_up_cum"] == x["bytes_up"]
        if x["rounds_to_target"] is not None:
            hit = curve[x["rounds_to_target"] - 1]
            assert x["bytes_up_to_target"] == hit["bytes_up_cum"]
    md = (out / "compare.md").read_text()
    assert "uploaded to 20%" in md
    assert_figure(out / "compare.png", (16, 4.2))
