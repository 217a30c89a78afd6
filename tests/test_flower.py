"""A Flower strategy under fedsim's clock (fedsim/algorithms/flower.py,
issue 41): the same algorithm as fedsim's own, state checkpointed exactly,
bad input refused with a message naming the field.

Equalities on the quickstart (3 rounds, fedsim's uniform selector choosing,
``sample_by: selector``): Flower's FedAvg, FedProx and FedAdam (with
beta_1 = beta_2 = 0) give fedsim's fedavg, fedprox and fedadam within float
tolerance, not bit for bit: Flower averages the clients' float32 *models*
(``sum_i w_i x_i`` in NumPy), fedsim adds the weighted *deltas* to x
(``x + sum_i w_i (x_i - x)``, summed in float64): the same number, rounded
differently (measured: at most 2.4e-7 on any parameter after 3 rounds).
With Flower's default betas FedAdam differs from fedsim's fedadam on
purpose: Flower bias-corrects the step (eta sqrt(1 - b2^(t+1)) / (1 -
b1^(t+1))) and starts v at 0, the paper's algorithm (fedsim's) at tau^2
without correction (docs/flower.md).
"""

from __future__ import annotations

import math
import random
import sys

import numpy as np
import pytest
import torch

from fedsim.algorithms.base import ClientUpdate
from fedsim.algorithms.flower import Flower, FlowerError
from fedsim.runtime import run_scenario
from fedsim.scenario import ScenarioError, load_scenario

from .conftest import SCENARIOS, fedsim_here

pytest.importorskip("flwr", reason="Flower is the optional extra fedsim[flower]")
from flwr.serverapp.strategy import FedAvg  # noqa: E402

QUICK = SCENARIOS / "quickstart.yaml"
TINY = SCENARIOS / "ci" / "tiny-synthetic.yaml"


def quick(alg: str, *more: str, rounds: int = 3):
    return load_scenario(
        QUICK,
        [f"rounds={rounds}", "checkpoint.every_rounds=0", f"algorithm={alg}"]
        + list(more),
    )


def flower(strategy: str, options: str = "{}", by: str = "selector") -> str:
    return (
        f"{{name: flower, strategy: {strategy}, sample_by: {by}, options: {options}}}"
    )


def assert_same_run(ours, theirs, atol: float) -> None:
    """The same rounds: tau, selection and drops exactly; the model and the
    test metrics within ``atol`` (float rounding, module docstring)."""
    key = ("round", "client_id", "tau", "dropped")
    assert [tuple(c[k] for k in key) for c in ours.clients] == [
        tuple(c[k] for k in key) for c in theirs.clients
    ]
    torch.testing.assert_close(
        ours.final_params, theirs.final_params, atol=atol, rtol=0
    )
    for a, b in zip(ours.rows, theirs.rows, strict=True):
        assert a["test_loss"] == pytest.approx(b["test_loss"], abs=1e-5)
        assert a["test_accuracy"] == pytest.approx(b["test_accuracy"], abs=0.003)


# --------------------------------------------------------------- equalities
@pytest.mark.parametrize(
    ("ours", "theirs"),
    [
        ("{name: fedavg}", flower("FedAvg")),
        ("{name: fedprox, mu: 0.1}", flower("FedProx", "{proximal_mu: 0.1}")),
        (
            "{name: fedadam, server_lr: 0.1, beta1: 0.0, beta2: 0.0, adaptivity: 0.01}",
            flower("FedAdam", "{eta: 0.1, beta_1: 0.0, beta_2: 0.0, tau: 0.01}"),
        ),
    ],
    ids=["fedavg", "fedprox", "fedadam"],
)
def test_flower_strategy_equals_fedsim_s_own_on_the_quickstart(ours, theirs):
    # Execute
    a = run_scenario(quick(ours))
    b = run_scenario(quick(theirs))
    # Assert: the same algorithm, rounded differently (module docstring)
    assert_same_run(a, b, atol=1e-6)
    assert not torch.equal(a.final_params, load_x0()), "the model moved"


def load_x0() -> torch.Tensor:
    return run_scenario(quick("{name: fedavg}", rounds=1)).final_params * 0


def test_fedprox_s_config_reaches_local_training():
    # Prepare: the same strategy with mu = 0 and mu = 1
    runs = [
        run_scenario(quick(flower("FedProx", f"{{proximal_mu: {mu}}}"), rounds=1))
        for mu in (0.0, 1.0)
    ]
    # Assert: the clients' proximal term changed their updates
    assert not torch.equal(runs[0].final_params, runs[1].final_params)


# ------------------------------------------------- the adapter, by hand
def updates(*taus: int, d: int = 3) -> list[ClientUpdate]:
    """Client i: delta (i+1) * [1, -1, 2, ...], weight 10 (i+1), tau_i."""
    base = torch.tensor([1.0, -1.0, 2.0][:d])
    return [
        ClientUpdate(i, (i + 1) * base, 10.0 * (i + 1), tau, float(tau), 0.5)
        for i, tau in enumerate(taus)
    ]


def test_fedmedian_takes_the_coordinatewise_median_of_the_client_models():
    alg = Flower(strategy="FedMedian")
    state = alg.init(torch.tensor([0.5, 0.0, -1.0]), num_clients=3)
    ups = updates(4, 9, 1)
    new, info = alg.aggregate(state, ups)
    # models x + (i+1) [1, -1, 2]: the median is client 1's, x + 2 [1, -1, 2]
    assert torch.equal(new["x"], torch.tensor([2.5, -2.0, 3.0]))
    # the meter reports the data weights the strategy was given, and their tau
    assert info.weights == pytest.approx({0: 1 / 6, 1: 2 / 6, 2: 3 / 6})
    assert info.tau_eff == pytest.approx((4 + 2 * 9 + 3 * 1) / 6)


class SkipStragglers(FedAvg):
    """A user's strategy: leaves out replies of fewer than ``min_tau`` local
    steps (the clock's tau, in the reply's metrics), and counts the error
    replies it got."""

    def __init__(self, min_tau: int = 5, **kwargs):
        super().__init__(**kwargs)
        self.min_tau = min_tau
        self.errors_seen = 0

    def aggregate_train(self, server_round, replies):
        replies = list(replies)
        self.errors_seen += sum(m.has_error() for m in replies)
        kept = [
            m
            for m in replies
            if not m.has_error() and m.content["metrics"]["tau"] >= self.min_tau
        ]
        return super().aggregate_train(server_round, kept)


SKIP = "tests.test_flower:SkipStragglers"


def test_a_user_s_strategy_sees_tau_and_the_clients_that_delivered_nothing():
    # Prepare: three devices messaged, two deliver; device 0 did 2 steps
    alg = Flower(strategy=SKIP, options={"min_tau": 5})
    x0 = torch.tensor([0.5, 0.0, -1.0])
    state = alg.init(x0, num_clients=3)
    rng = np.random.default_rng(0)
    chosen = alg.configure(state, 0, [0, 1, 2], rng, [("x", (3,))])
    ups = updates(2, 6, 8)
    # Execute
    new, _ = alg.aggregate(state, [ups[0], ups[2]])
    # Assert: every node was messaged; device 1 came back as an error
    # reply; device 0 (tau 2 < 5) was left out, so x moves by device 2's delta
    assert chosen == [0, 1, 2]
    assert torch.equal(new["x"], x0 + ups[2].delta)
    strategy = alg.live(new).strategy
    assert strategy.errors_seen == 1
    # its counter is state: checkpointed with the round
    again = Flower(strategy=SKIP, options={"min_tau": 5})
    assert again.live(dict(new)).strategy.errors_seen == 1


@pytest.mark.slow
def test_robust_and_user_strategies_run_under_stragglers():
    # quickstart: a heavy-tailed straggler model; the strategies sample every
    # online device themselves (sample_by: strategy)
    for alg in (flower("FedMedian", by="strategy"), flower(SKIP, by="strategy")):
        sc = quick(alg, rounds=3)
        res = run_scenario(sc)
        assert res.status == "completed"
        assert all(math.isfinite(r["test_loss"]) for r in res.rows)
        taus = [c["tau"] for c in res.clients if not c["dropped"]]
        assert max(taus) >= 5 * max(1, min(taus)), "stragglers took part"
        online = [r["n_selected"] for r in res.rows]
        assert min(online) > sc.selector.clients_per_round, "every online device"
        assert res.rows[-1]["test_loss"] < res.initial["loss"]


def test_strategy_sampling_is_seeded_by_the_round():
    # FedAvg sampling half the online devices with random.sample: the same
    # choice in two runs, whatever Python's global generator holds
    alg = flower("FedAvg", "{fraction_train: 0.5}", by="strategy")
    random.seed(1)
    a = run_scenario(quick(alg, rounds=2))
    random.seed(2)
    b = run_scenario(quick(alg, rounds=2))
    pick = [[c["client_id"] for c in r.clients] for r in (a, b)]
    assert pick[0] == pick[1]
    assert a.rows[0]["n_selected"] < 20
    assert torch.equal(a.final_params, b.final_params)


# ----------------------------------------------------------- checkpoints
def test_resume_restores_fedadam_s_moments_exactly(tmp_path):
    # Prepare: Flower's FedAdam keeps m_t, v_t and the arrays it sent
    alg = flower("FedAdam", "{eta: 0.05}")
    args = ["rounds=4", "checkpoint.every_rounds=2", f"algorithm={alg}"]
    ref = run_scenario(load_scenario(QUICK, args))

    def stop_after_round_2(row, clients):
        if row["round"] == 2:
            raise KeyboardInterrupt

    # Execute: stopped after round 2 (checkpoint after round 1), resumed
    first = run_scenario(
        load_scenario(QUICK, args), run_dir=tmp_path, on_round=stop_after_round_2
    )
    again = run_scenario(load_scenario(QUICK, args), run_dir=tmp_path, resume=True)
    # Assert
    assert first.status == "interrupted" and again.status == "completed"
    assert torch.equal(again.final_params, ref.final_params)
    assert [r["test_loss"] for r in again.rows] == [r["test_loss"] for r in ref.rows]


class KeepsARandom(FedAvg):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.rng = random.Random(0)


def test_a_strategy_whose_state_cannot_be_checkpointed_is_refused():
    path = "tests.test_flower:KeepsARandom"
    with pytest.raises(ScenarioError) as err:
        quick(flower(path), "checkpoint.every_rounds=5")
    msg = str(err.value)
    assert "KeepsARandom.rng holds a random.Random" in msg
    assert "checkpoint.every_rounds: 0" in msg
    # without checkpoints it runs
    assert run_scenario(quick(flower(path), rounds=1)).status == "completed"


# ------------------------------------------------------------- bad input
def test_not_a_flower_strategy_exits_2_naming_the_field(tmp_path):
    bad = "{name: flower, strategy: 'fedsim.algorithms.fedavg:FedAvg'}"
    r = fedsim_here("validate", str(TINY), "--set", f"algorithm={bad}")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "not a Flower strategy" in r.stderr and "algorithm" in r.stderr
    r = fedsim_here("validate", str(TINY), "--set", "algorithm={name: flower, "
                    "strategy: FedAvg, options: {no_such: 1}}")  # fmt: skip
    assert r.returncode == 2 and "options" in r.stderr


def test_flower_not_installed_exits_2_naming_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "flwr.app", None)  # import fails
    with pytest.raises(FlowerError, match=r"fedsim\[flower\]"):
        Flower()
    r = fedsim_here("validate", str(TINY), "--set", "algorithm={name: flower}")
    assert r.returncode == 2 and "fedsim[flower]" in r.stderr


def test_async_and_a_server_actor_are_refused():
    with pytest.raises(ScenarioError, match="synchronous round"):
        load_scenario(
            TINY,
            ["algorithm={name: flower}", "round={policy: async, concurrency: 3}"],
        )
    with pytest.raises(ScenarioError, match="resources.server.home"):
        load_scenario(TINY, ["algorithm={name: flower}", "resources.server.home=actor"])


def test_per_client_configs_are_refused_until_the_runtime_can_send_them():
    # A strategy giving each node its own learning rate: the seam for the
    # per-client instructions the runtime does not have yet
    from flwr.app import ConfigRecord, Message, MessageType, RecordDict

    class PerClient(FedAvg):
        def configure_train(self, server_round, arrays, config, grid):
            return [
                Message(
                    RecordDict({"arrays": arrays, "config": ConfigRecord({"lr": n})}),
                    message_type=MessageType.TRAIN,
                    dst_node_id=n,
                )
                for n in grid.get_node_ids()
            ]

    alg = Flower()
    state = alg.init(torch.zeros(3), num_clients=3)
    object.__setattr__(alg.live(state), "strategy", PerClient(min_available_nodes=1))
    with pytest.raises(FlowerError, match="per-client instructions"):
        alg.configure(state, 0, [0, 1], np.random.default_rng(0), [("x", (3,))])


# -------------------------------------------------------------- Ray, compare
@pytest.mark.ray
def test_two_ray_workers_equal_the_in_process_run(ray_session):
    sc = quick(flower("FedProx", "{proximal_mu: 0.1}"), rounds=2)
    local = run_scenario(sc, workers=0)
    two = run_scenario(quick(flower("FedProx", "{proximal_mu: 0.1}"), rounds=2),
                       workers=2)  # fmt: skip
    assert torch.equal(local.final_params, two.final_params)
    assert [r["test_loss"] for r in local.rows] == [r["test_loss"] for r in two.rows]


def test_compare_runs_a_flower_arm_beside_fedsim_s(tmp_path):
    from fedsim.compare import compare

    rows = compare(
        QUICK,
        ["fedavg", "flower:strategy=FedAvg,sample_by=selector"],
        seeds=1,
        overrides=["rounds=2"],
        out_dir=tmp_path,
    )
    acc = [r["final_accuracy"] for r in rows]
    assert [r["algorithm"].split(":")[0] for r in rows] == ["fedavg", "flower"]
    assert acc[0] == pytest.approx(acc[1], abs=0.003)
