"""The global training objective F(x) = sum_i p_i F_i(x) (issue 24):
``Server.objective`` against a computation by hand, the ``train_objective``
column of rounds.parquet (on its rounds only, absent when off, identical
after a resume), and its figures in report.md and compare.png.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from fedsim.data import FederatedData
from fedsim.results import write_summary
from fedsim.runtime import run_scenario, run_setup
from fedsim.scenario import load_scenario
from fedsim.server import Server, objective_due

from .conftest import SCENARIOS, assert_figure

TINY = SCENARIOS / "ci" / "tiny-synthetic.yaml"
QUADRATIC = SCENARIOS / "quadratic-objective-inconsistency.yaml"


def _data(sizes: list[int], features: int = 4, classes: int = 3) -> FederatedData:
    """Clients of ``sizes`` rows each (random inputs and labels, seed 0)."""
    rng = np.random.default_rng(0)
    n = sum(sizes)
    x = rng.normal(size=(n, features)).astype(np.float32)
    y = rng.integers(0, classes, size=n).astype(np.int64)
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    return FederatedData(
        x=x,
        y=y,
        offsets=offsets,
        weights=np.array(sizes, dtype=np.float64),
        test_x=x[:2].copy(),
        test_y=y[:2].copy(),
        num_classes=classes,
    )


def _logreg_server(data: FederatedData, batch: int) -> tuple[Server, torch.Tensor]:
    """A logistic-regression server on ``data`` with random parameters."""
    sc = load_scenario(TINY, [f"eval.batch_size={batch}", "eval.objective_every=1"])
    server = Server(run_setup(sc).server, data)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(server.num_params, generator=gen, dtype=torch.float32)
    server.state["x"] = x
    return server, x


def _by_hand(data: FederatedData, x: torch.Tensor, p: np.ndarray) -> float:
    """sum_i p_i * mean cross-entropy of W x + b over client i's rows, in
    float64 from the flat parameters (nn.Linear's order: W row-major, b)."""
    classes, d = data.num_classes, data.x.shape[1]
    w = x[: classes * d].double().reshape(classes, d)
    b = x[classes * d :].double()
    total = 0.0
    for i in range(data.num_clients):
        rows = data.client_rows(i)
        if rows.stop == rows.start:
            continue
        logits = torch.from_numpy(data.x[rows]).double() @ w.T + b
        y = torch.from_numpy(data.y[rows])
        nll = torch.logsumexp(logits, dim=1) - logits[torch.arange(len(y)), y]
        total += float(p[i]) * float(nll.mean())
    return total


def test_the_objective_is_the_data_weighted_mean_of_the_clients_losses():
    # Prepare: 3 clients of 3, 5 and 9 rows; batches of 4 cross the clients
    data = _data([3, 5, 9])
    server, x = _logreg_server(data, batch=4)
    p = np.array([3, 5, 9]) / 17
    # Execute
    value = server.objective()
    # Assert: by hand, with p_i = n_i / n
    assert value == pytest.approx(_by_hand(data, x, p), rel=1e-6)
    # not the unweighted mean of the per-client means, nor the row mean alone
    assert value != pytest.approx(_by_hand(data, x, np.ones(3) / 3), rel=1e-6)
    assert server.objective() == value  # the same floats on every call


def test_the_batch_size_does_not_change_the_objective():
    data = _data([3, 5, 9])
    small = _logreg_server(data, batch=4)[0].objective()
    large = _logreg_server(data, batch=4096)[0].objective()
    assert small == pytest.approx(large, rel=1e-6)


def test_clients_without_rows_are_left_out_and_the_rest_renormalised():
    # client 1 holds no row but has a weight of its own
    data = replace(_data([4, 0, 6]), weights=np.array([1.0, 2.0, 1.0]))
    server, x = _logreg_server(data, batch=3)
    assert server.objective() == pytest.approx(
        _by_hand(data, x, np.array([0.5, 0.0, 0.5])), rel=1e-6
    )


def test_without_any_training_row_the_objective_is_nan():
    data = _data([0, 0])
    assert math.isnan(_logreg_server(data, batch=3)[0].objective())


def test_the_quadratic_objective_is_its_closed_form():
    from fedsim.data import build_data

    sc = load_scenario(QUADRATIC, ["eval.objective_every=1"])
    data = build_data(sc.data, sc.num_clients, sc.seed)
    server = Server(run_setup(sc).server, data)
    x = torch.full((server.num_params,), 0.3, dtype=server.params().dtype)
    server.state["x"] = x
    e, h, p = data.x, data.y, data.weights / data.weights.sum()
    closed = sum(
        p[i] * h[i] / 2 * float(((x.double().numpy() - e[i]) ** 2).sum())
        for i in range(data.num_clients)
    )
    assert server.objective() == pytest.approx(closed, rel=1e-6)
    # the quadratic test set is the same objectives: both columns agree
    assert server.objective() == pytest.approx(server.evaluate()[0], rel=1e-12)


def test_objective_rounds_mirror_the_evaluation_rounds():
    spec = load_scenario(TINY, ["eval.objective_every=3"]).eval
    assert [t for t in range(7) if objective_due(spec, 7, t)] == [2, 5, 6]
    off = load_scenario(TINY).eval
    assert off.objective_every == 0
    assert not any(objective_due(off, 7, t) for t in range(7))


# --------------------------------------------------------- the runtime column


def _strip(rows: list[dict[str, Any]], *drop: str) -> list[dict[str, Any]]:
    """Rows without the given columns and wall_time (real time), NaN as
    "nan" so that equal rows compare equal."""
    gone = {"wall_time", *drop}

    def plain(v: Any) -> Any:
        return "nan" if isinstance(v, float) and math.isnan(v) else v

    return [{k: plain(v) for k, v in r.items() if k not in gone} for r in rows]


@pytest.fixture(scope="module")
def objective_run(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Five rounds of tiny-synthetic with F(x) every 2 rounds, in a run dir."""
    out = tmp_path_factory.mktemp("objective")
    sc = load_scenario(TINY, ["rounds=5", "eval.objective_every=2"])
    res = run_scenario(sc, run_dir=out)
    write_summary(out / "summary.json", res.summary())  # as `fedsim run` does
    return sc, res, out


def test_rounds_parquet_has_the_objective_on_its_rounds_and_nan_elsewhere(
    objective_run: Any,
):
    sc, res, out = objective_run
    table = pq.read_table(out / "rounds.parquet")
    f = table.column("train_objective").to_pylist()
    assert [t for t, v in enumerate(f) if not math.isnan(v)] == [1, 3, 4]
    assert res.rows[-1]["train_objective"] == f[-1]
    # the last value is the final model's F(x), and the initial one x_0's
    server = Server(run_setup(sc).server, res.data)
    x0 = server.objective()
    assert res.summary()["initial"]["objective"] == x0
    server.state["x"] = res.final_params
    assert f[-1] == server.objective()
    assert f[-1] < x0  # five rounds of FedAvg lower the training objective


def test_the_option_off_leaves_the_tables_as_before(tmp_path):
    (tmp_path / "off").mkdir()
    off = run_scenario(load_scenario(TINY, ["rounds=3"]), run_dir=tmp_path / "off")
    on = run_scenario(load_scenario(TINY, ["rounds=3", "eval.objective_every=1"]))
    columns = pq.read_table(tmp_path / "off" / "rounds.parquet").column_names
    assert "train_objective" not in columns
    assert "objective" not in off.summary()["initial"]
    # computing F(x) changes nothing else: same rows, clients and model
    assert _strip(on.rows, "train_objective") == _strip(off.rows)
    assert on.clients == off.clients
    assert torch.equal(on.final_params, off.final_params)


def test_a_resumed_run_writes_the_same_table(tmp_path):
    over = ["rounds=5", "eval.objective_every=2", "checkpoint.every_rounds=2"]
    sc = load_scenario(TINY, over)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    run_scenario(sc, run_dir=tmp_path / "a")

    class Stop(Exception):
        pass

    def stop(row: dict[str, Any], clients: list[dict[str, Any]]) -> None:
        if row["round"] == 3:
            raise Stop

    with pytest.raises(Stop):
        run_scenario(sc, run_dir=tmp_path / "b", on_round=stop)
    run_scenario(sc, run_dir=tmp_path / "b", resume=True)
    a, b = (pq.read_table(tmp_path / d / "rounds.parquet") for d in "ab")
    assert a.column_names == b.column_names
    assert _strip(a.to_pylist()) == _strip(b.to_pylist())


def test_an_async_run_records_the_objective_per_version():
    asyn = ["round={policy: async, job_steps: max_steps, max_steps: 5, concurrency: 3}"]
    asyn += ["algorithm={name: fedbuff, buffer_size: 2}", "rounds=4"]
    res = run_scenario(load_scenario(TINY, [*asyn, "eval.objective_every=3"]))
    f = [r["train_objective"] for r in res.rows]
    assert [r["round"] for r in res.rows] == [0, 1, 2, 3]
    assert [t for t, v in enumerate(f) if not math.isnan(v)] == [2, 3]


# ------------------------------------------------------------------- figures


def test_report_draws_the_objective_when_present(objective_run: Any, tmp_path):
    from fedsim.tools.report import write_report

    out = objective_run[2]
    text = write_report(out).read_text()
    assert "![Global training objective F(x)](objective.png)" in text
    assert "| initial training objective F(x) |" in text
    assert "| final training objective F(x) |" in text
    assert_figure(out / "objective.png", (11, 4.2))
    # the same run without the column: no figure, no row
    table = pq.read_table(out / "rounds.parquet").drop_columns(["train_objective"])
    pq.write_table(table, tmp_path / "rounds.parquet")
    text = write_report(tmp_path).read_text()
    assert "objective.png" not in text and "training objective" not in text
    assert not (tmp_path / "objective.png").exists()


def test_the_objective_figure_starts_at_the_initial_model():
    import pyarrow as pa

    from fedsim.tools.plots import figure_objective

    rounds = pa.table(
        {
            "round": [0, 1, 2],
            "sim_time": [1.0, 2.0, 3.0],
            "train_objective": [math.nan, 0.5, 0.25],
        }
    )
    fig = figure_objective(rounds, initial={"t": 0.0, "objective": 1.0})
    by_round = fig.axes[1].lines[0].get_xydata().tolist()
    assert by_round == [[0.0, 1.0], [2.0, 0.5], [3.0, 0.25]]


def test_compare_adds_an_objective_panel_when_every_run_has_it(tmp_path):
    from fedsim.tools.compare import plot_compare

    def run(label: str, seed: int, f: list[float]) -> Any:
        rows = [
            {
                "round": t,
                "sim_time": float(t + 1),
                "test_accuracy": 0.5 + 0.1 * t,
                "bytes_up_cum": 1e6 * (t + 1),
                "train_objective": v,
            }
            for t, v in enumerate(f)
        ]
        return {"algorithm": label, "seed": seed}, rows

    both = [run("fedavg", 0, [1.0, math.nan, 0.5]), run("fednova", 0, [1.0, 0.7, 0.4])]
    plot_compare(both, None, tmp_path / "with.png")
    assert_figure(tmp_path / "with.png", (21.3, 4.2))
    # a run that did not record it: accuracy only
    one = [both[0], run("fedprox", 0, [math.nan] * 3)]
    plot_compare(one, None, tmp_path / "without.png")
    assert_figure(tmp_path / "without.png", (16, 4.2))


@pytest.mark.ray
def test_the_server_actor_gives_the_same_objective(ray_session):
    # resources.server.cpus 0: the embedded Ray of the tests has 2 CPUs
    over = ["rounds=2", "eval.objective_every=1"]
    actor = ["resources.server.home=actor", "resources.server.cpus=0"]
    # the driver's reference in process (results do not depend on workers)
    driver = run_scenario(load_scenario(TINY, over), workers=0)
    remote = run_scenario(load_scenario(TINY, [*over, *actor]), workers=2)
    assert remote.placement["server"]["home"] == "actor"
    assert [r["train_objective"] for r in remote.rows] == [
        r["train_objective"] for r in driver.rows
    ]
    assert remote.initial == driver.initial
