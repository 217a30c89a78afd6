"""A Flower strategy under fedsim's clock (fedsim/algorithms/flower.py and
flower_records.py): the same algorithm as fedsim's own, state checkpointed exactly,
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

from fedsim.algorithms.base import ClientChoice, ClientUpdate, Failure, RoundContext
from fedsim.algorithms.flower import Flower, _act_as
from fedsim.algorithms.flower_records import FlowerError, client_configs
from fedsim.runtime import run_scenario
from fedsim.scenario import ScenarioError, load_scenario

from .conftest import SCENARIOS, fedsim_here

pytest.importorskip("flwr", reason="Flower is the optional extra fedsim[flower]")
from flwr.app import ConfigRecord, Message, MessageType, RecordDict  # noqa: E402
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
    assert not torch.equal(a.final_params, start_of(a)), "the model moved"


def start_of(res) -> torch.Tensor:
    """The run's x_0: its network built as the run builds it."""
    from fedsim.models import NetworkSetup, make_model
    from fedsim.params import flatten

    sc = res.scenario
    setup = NetworkSetup(sc.model, sc.seed, sc.data.start_value)
    return flatten(make_model(setup, res.data))


def test_a_flower_fedavg_arm_meters_chi2_as_fedsim_s_fedavg():
    # Execute: the quickstart, the selector choosing, both arms
    ours = run_scenario(quick("{name: fedavg}"))
    theirs = run_scenario(quick(flower("FedAvg")))
    # Assert: the objective-inconsistency meter by one convention
    # (w_i = p_i ||a_i||_1), so the arms compare on it; it measures
    # something here (unequal local steps)
    chi = [[r["chi2_pw"] for r in res.rows] for res in (ours, theirs)]
    assert chi[1] == pytest.approx(chi[0], rel=1e-12)
    assert min(chi[0]) > 0.01


def test_a_field_the_rule_does_not_read_exits_2_naming_it():
    # Execute: server_lr means nothing to a Flower strategy (its own step)
    bad = "algorithm={name: flower, server_lr: 0.5}"
    r = fedsim_here("validate", str(TINY), "--set", bad)
    # Assert
    assert r.returncode == 2, r.stdout + r.stderr
    assert "algorithm.server_lr: algorithm.name 'flower' does not read it" in r.stderr
    # at its default it is no setting: accepted
    assert load_scenario(TINY, ["algorithm={name: flower, server_lr: 1.0}"])


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
    # the meter by fedsim's convention for the data-weighted average:
    # w_i = p_i ||a_i||_1 (p = 1/6, 2/6, 3/6; ||a_i||_1 = 4, 9, 1 here)
    w = [1 * 4, 2 * 9, 3 * 1]
    assert info.weights == pytest.approx({i: wi / sum(w) for i, wi in enumerate(w)})
    assert info.tau_eff == pytest.approx(sum(w) / 6)


class SkipStragglers(FedAvg):
    """A user's strategy: leaves out replies of fewer than ``min_tau`` local
    steps (the clock's tau, in the reply's metrics), and counts the error
    replies it got."""

    def __init__(self, min_tau: int = 5, **kwargs):
        super().__init__(**kwargs)
        self.min_tau = min_tau
        self.errors_seen = 0
        self.error_log = []  # [round, code, reason] of each error reply

    def aggregate_train(self, server_round, replies):
        replies = list(replies)
        self.errors_seen += sum(m.has_error() for m in replies)
        self.error_log += [
            [server_round, m.error.code, m.error.reason]
            for m in replies
            if m.has_error()
        ]
        kept = [
            m
            for m in replies
            if not m.has_error() and m.content["metrics"]["tau"] >= self.min_tau
        ]
        return super().aggregate_train(server_round, kept)


SKIP = "tests.test_flower:SkipStragglers"
ERROR_LOG: list = []  # what LogsErrors saw, for a test after its run


class LogsErrors(SkipStragglers):
    """SkipStragglers that also tells the test its error log."""

    def aggregate_train(self, server_round, replies):
        replies = list(replies)
        out = super().aggregate_train(server_round, replies)
        ERROR_LOG[:] = self.error_log
        return out


LOGS = "tests.test_flower:LogsErrors"


def test_a_user_s_strategy_sees_tau_and_the_clients_that_delivered_nothing():
    # Prepare: four devices messaged, two deliver; device 0 did 2 steps;
    # the clock says device 1 was late and device 3 went offline
    alg = Flower(strategy=SKIP, options={"min_tau": 5})
    x0 = torch.tensor([0.5, 0.0, -1.0])
    state = alg.init(x0, num_clients=4)
    rng = np.random.default_rng(0)
    facts = quick("{name: fedavg}").facts
    chosen = alg.choose_clients(state, ClientChoice(0, (0, 1, 2, 3), rng, facts))
    ups = updates(2, 6, 8)
    ctx = RoundContext(failures=(Failure(1, "late"), Failure(3, "offline")))
    # Execute
    new, _ = alg.aggregate(state, [ups[0], ups[2]], ctx)
    # Assert: every node was messaged; devices 1 and 3 came back as error
    # replies whose code and reason are the clock's; device 0 (tau 2 < 5)
    # was left out, so x moves by device 2's delta
    assert chosen == [0, 1, 2, 3]
    assert torch.equal(new["x"], x0 + ups[2].delta)
    strategy = alg.live(new).strategy
    assert strategy.errors_seen == 2
    assert strategy.error_log == [
        [1, 4, "late: device 1 sent its update after the round's deadline"],
        [1, 5, "offline: device 3 went offline before its upload"],
    ]
    # its counter is state: checkpointed with the round
    again = Flower(strategy=SKIP, options={"min_tau": 5})
    assert again.live(dict(new)).strategy.errors_seen == 2


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


class DrawsGlobally(FedAvg):
    """Samples with Python's global generator, which fedsim does not seed."""

    def configure_train(self, server_round, arrays, config, grid):
        random.random()
        return super().configure_train(server_round, arrays, config, grid)


class Refuses(FedAvg):
    """Its aggregation raises."""

    def aggregate_train(self, server_round, replies):
        raise ValueError("no quorum")


@pytest.mark.parametrize(
    ("cls", "what"),
    [
        ("DrawsGlobally", "its configure_train drew from Python's or NumPy's global"),
        ("Refuses", "its aggregate_train raised ValueError: no quorum"),
    ],
)
def test_a_strategy_s_failure_names_the_strategy(cls, what):
    # Execute
    res = run_scenario(quick(flower(f"tests.test_flower:{cls}"), rounds=1))
    # Assert: the run fails, the message naming the strategy and its method
    assert res.status == "failed"
    assert (
        f"algorithm.strategy 'tests.test_flower:{cls}': {what}"
        in (res.failure["error"])
    )


def test_a_strategy_sampling_few_nodes_is_not_called_short_of_devices():
    # Prepare: FedAvg messaging a tenth of the online devices itself
    alg = flower("FedAvg", "{fraction_train: 0.1}", by="strategy")
    # Execute
    res = run_scenario(quick(alg, rounds=2))
    # Assert: fewer than clients_per_round train, by the strategy's own
    # sampling, not for want of devices online; the plug-in keeps only
    # its fields (the live strategy is kept with the server's state)
    k = res.scenario.selector.clients_per_round
    assert all(r["n_selected"] < k for r in res.rows)
    assert res.degenerate() is None
    kept = set(vars(res.scenario.algorithm))
    assert kept == {"name", "server_lr", "strategy", "options", "sample_by"}


# ----------------------------------------------------------- checkpoints
def test_the_state_codec_gives_back_every_kind_exactly():
    from flwr.app import Array, ArrayRecord, MetricRecord

    from fedsim.algorithms.flower_records import (
        NotCheckpointable,
        decode_state,
        encode_state,
    )

    # Prepare: one value of each row of the codec's table, nested
    attrs = {
        "n": 3,
        "ok": True,
        "none": None,
        "text": "fedsim",
        "f": float("nan"),
        "f64": np.float64(0.1),
        "i32": np.int32(-7),
        "raw": bytes(range(256)),
        "m": np.arange(6, dtype=np.float32).reshape(2, 3),
        "pair": (1.5, [np.uint8(2), b"\x00"]),
        "rec": ArrayRecord({"w": Array(np.ones((2, 2), dtype=np.float64))}),
        "metrics": MetricRecord({"loss": 0.25, "tau": [1, 2]}),
        "nested": {"a": {"b": (np.zeros(1, dtype=np.int64),)}},
    }
    # Execute
    back = decode_state(encode_state(attrs, "S"))
    # Assert: the same types and bits
    assert back.keys() == attrs.keys()
    assert repr({k: back[k] for k in attrs}) == repr(attrs)
    assert type(back["f64"]) is np.float64 and type(back["i32"]) is np.int32
    assert back["raw"] == attrs["raw"] and back["m"].dtype == np.float32
    assert back["m"].flags.writeable
    # a value no row takes is refused, naming where it is
    for bad, what in (
        ({"k": [object()]}, r"S\.k\[0\] holds a builtins\.object"),
        ({"k": {1: 2.0}}, r"S\.k holds a dict with keys other than text"),
        ({"k": np.array(["a"])}, r"S\.k holds an array of dtype <U1"),
    ):
        with pytest.raises(NotCheckpointable, match=what):
            encode_state(bad, "S")


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
    for key in ("test_loss", "alg_train_loss", "alg_tau"):
        assert [r[key] for r in again.rows] == [r[key] for r in ref.rows]


def test_resume_gives_each_client_its_lr_again(tmp_path):
    # per-client instructions come from configure_train's messages, which a
    # resumed run makes again from the checkpointed state and the round
    alg = flower(LR, "{lr: 0.05, odd_factor: 2.0}")
    args = ["rounds=3", "checkpoint.every_rounds=1", f"algorithm={alg}"]
    ref = run_scenario(load_scenario(QUICK, args))

    def stop_after_round_1(row, clients):
        if row["round"] == 1:
            raise KeyboardInterrupt

    run_scenario(
        load_scenario(QUICK, args), run_dir=tmp_path, on_round=stop_after_round_1
    )
    again = run_scenario(load_scenario(QUICK, args), run_dir=tmp_path, resume=True)
    assert torch.equal(again.final_params, ref.final_params)
    assert per_client(again.clients) == per_client(ref.clients)


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


def message(node: int, **config) -> Message:
    """A train message to ``node`` with ``config``, as the server sends it."""
    _act_as(1)  # Flower's ServerApp identity (messages read it)
    return Message(
        RecordDict({"config": ConfigRecord(config)}),
        message_type=MessageType.TRAIN,
        dst_node_id=node,
    )


def test_client_configs_split_shared_and_own_values_and_refuse_the_rest():
    spec = quick("{name: fedavg}").client  # sgd, lr 0.05
    msgs = {
        0: message(1_000_000, lr=0.05, **{"proximal-mu": 0.1, "server-round": 1}),
        1: message(1_000_001, lr=0.1, **{"proximal-mu": 0.1, "server-round": 1}),
        2: message(1_000_002, **{"proximal-mu": 0.1, "server-round": 1}),
    }
    shared, own = client_configs(msgs, 0, spec)
    # mu alike: shared; lr differs: client 1's own ratio, 0 and 2 (the
    # scenario's lr, or none) get no entry; server-round alike: ignored
    assert shared == {"flwr.proximal_mu": 0.1}
    assert own == {1: {"flwr.lr_scale": 2.0}}
    # each client's own mu; one without (or mu 0) trains without the term
    mus = {0: message(1_000_000, **{"proximal-mu": 0.5}), 1: message(1_000_001),
           2: message(1_000_002, **{"proximal-mu": 0.0})}  # fmt: skip
    assert client_configs(mus, 0, spec) == ({}, {0: {"flwr.proximal_mu": 0.5}})
    # a key local training does not honour, differing: refused, named
    with pytest.raises(FlowerError, match=r"'local-epochs' differs between node "
                       r"1000000 \(1\) and node 1000001 \(2\)"):  # fmt: skip
        client_configs(
            {0: message(1_000_000, **{"local-epochs": 1}),
             1: message(1_000_001, **{"local-epochs": 2})}, 3, spec)  # fmt: skip
    # an lr where a gradient scale is not the learning rate: refused, named
    decayed = spec.model_copy(update={"weight_decay": 1e-4})
    with pytest.raises(FlowerError, match=r"'lr' for node 1000001 is 0.1.*"
                       r"client.weight_decay is 0.0001"):  # fmt: skip
        client_configs(msgs, 0, decayed)
    # ... unless it is the scenario's own lr for every client
    assert client_configs({0: msgs[0]}, 0, decayed) == ({"flwr.proximal_mu": 0.1}, {})
    with pytest.raises(FlowerError, match=r"'lr' for node 1000000 is 'fast', "
                       r"expected a number > 0"):  # fmt: skip
        client_configs({0: message(1_000_000, lr="fast")}, 0, spec)


class GivesLr(FedAvg):
    """A user's strategy giving each node its own learning rate: ``lr``,
    times ``odd_factor`` for odd device ids, and to every node alike
    FedProx's ``proximal-mu`` when ``proximal_mu`` is set."""

    def __init__(self, lr: float, odd_factor: float = 1.0, proximal_mu=0.0, **kw):
        super().__init__(**kw)
        self.lr, self.odd_factor, self.proximal_mu = lr, odd_factor, proximal_mu

    def lr_for(self, node: int) -> float:
        odd = (node - 1_000_000) % 2
        return self.lr * (self.odd_factor if odd else 1.0)

    def configure_train(self, server_round, arrays, config, grid):
        out = []
        # FedAvg's messages share one RecordDict: build each node its own
        for m in super().configure_train(server_round, arrays, config, grid):
            node = m.metadata.dst_node_id
            cfg = {**m.content["config"], "lr": self.lr_for(node)}
            if self.proximal_mu:
                cfg["proximal-mu"] = self.proximal_mu
            content = RecordDict(
                {"arrays": m.content["arrays"], "config": ConfigRecord(cfg)}
            )
            out.append(
                Message(content, message_type=MessageType.TRAIN, dst_node_id=node)
            )
        return out


LR = "tests.test_flower:GivesLr"


def per_client(clients):
    """Each client's round: who, its tau and its minibatch loss."""
    return {c: [r[c] for r in clients] for c in ("client_id", "tau", "train_loss")}


def test_each_client_trains_with_the_lr_the_strategy_gave_it():
    # Prepare: quickstart (sgd, lr 0.05), one round, the selector choosing
    base = quick("{name: fedavg}").client.lr
    plain = run_scenario(quick(flower("FedAvg"), rounds=1))
    # Execute: odd devices get 2 lr, even ones the scenario's lr
    mixed = run_scenario(
        quick(flower(LR, f"{{lr: {base}, odd_factor: 2.0}}"), rounds=1)
    )
    # ... and every device 2 lr, against the scenario's own lr set to 2 lr
    doubled = run_scenario(quick(flower(LR, f"{{lr: {2 * base}}}"), rounds=1))
    scenario_2lr = run_scenario(
        quick(flower("FedAvg"), f"client.lr={2 * base}", rounds=1)
    )
    # Assert: the same clients and tau (the clock decides them, not the lr)
    a, b = plain.clients, mixed.clients
    assert [(c["client_id"], c["tau"]) for c in a] == [
        (c["client_id"], c["tau"]) for c in b
    ]
    trained = [
        (x, y) for x, y in zip(a, b, strict=True) if not x["dropped"] and x["tau"] > 1
    ]
    odd = [(x, y) for x, y in trained if x["client_id"] % 2]
    even = [(x, y) for x, y in trained if not x["client_id"] % 2]
    assert odd and even
    # a client given the scenario's lr trains exactly as in the plain run;
    # one given 2 lr moves further
    assert all(x["train_loss"] == y["train_loss"] for x, y in even)
    assert all(x["update_norm"] == y["update_norm"] for x, y in even)
    assert all(x["update_norm"] < y["update_norm"] for x, y in odd)
    assert not torch.equal(plain.final_params, mixed.final_params)
    # lr / client.lr = 2 is exact: the strategy's 2 lr is, bit for bit,
    # the scenario's client.lr of 2 lr
    assert torch.equal(doubled.final_params, scenario_2lr.final_params)
    assert per_client(doubled.clients) == per_client(scenario_2lr.clients)


def test_an_lr_the_solver_cannot_apply_fails_the_run_naming_the_key():
    base = quick("{name: fedavg}").client.lr
    sc = quick(flower(LR, f"{{lr: {base}, odd_factor: 2.0}}"), "client.solver=prox",
               "client.mu=0.01", rounds=1)  # fmt: skip
    res = run_scenario(sc)
    assert res.status == "failed"
    assert res.failure["plugin"] == "algorithm 'flower'"
    assert res.failure["hook"] == "choose_clients"
    assert "config 'lr' for node" in res.failure["error"]
    assert "client.solver is 'prox'" in res.failure["error"]


# ------------------------------------------------ plug-in metrics, evaluation
def test_the_strategy_s_aggregated_metrics_are_rounds_parquet_columns(tmp_path):
    import pyarrow.parquet as pq

    # Execute: FedAvg averages the replies' train_loss and tau by num-examples
    res = run_scenario(quick(flower("FedAvg"), rounds=2), run_dir=tmp_path)
    # Assert: read back from the file, they are the clients' weighted means
    rows = pq.read_table(tmp_path / "rounds.parquet").to_pylist()
    clients = pq.read_table(tmp_path / "clients.parquet").to_pylist()
    assert {"alg_train_loss", "alg_tau"} <= set(rows[0])
    for row in rows:
        done = [c for c in clients if c["round"] == row["round"] and not c["dropped"]]
        # agg_weight: each update's data share p_i in the step (the meter's
        # shares), the num-examples weights Flower's FedAvg averages by
        total = sum(c["agg_weight"] for c in done)
        tau = sum(c["agg_weight"] / total * c["tau"] for c in done)
        assert row["alg_tau"] == pytest.approx(tau, rel=1e-12)
        assert row["alg_tau"] != pytest.approx(row["tau_mean"], rel=1e-6)
    assert [r["alg_tau"] for r in rows] == [r["alg_tau"] for r in res.rows]


class EvaluatesItself(FedAvg):
    """Its own federated evaluation: the worst client's accuracy and how many
    replied; it also writes into itself, which must not last."""

    def aggregate_evaluate(self, server_round, replies):
        from flwr.app import MetricRecord

        replies = list(replies)
        self.evaluated = getattr(self, "evaluated", 0) + 1
        accs = [float(m.content["metrics"]["eval_acc"]) for m in replies]
        return MetricRecord({"worst_acc": min(accs), "replies": len(replies)})


FEDERATED = ("data.client_test_fraction=0.2", "eval.federated_every=1")


def test_a_strategy_s_own_federated_evaluation_is_named_as_not_run():
    import warnings

    from fedsim.scenario import ScenarioWarning

    # without federated evaluation the strategy's own rule is never called
    with pytest.warns(ScenarioWarning, match="defines aggregate_evaluate, which "
                      "fedsim calls only with federated evaluation"):  # fmt: skip
        quick(flower("tests.test_flower:EvaluatesItself"))
    with warnings.catch_warnings():
        warnings.simplefilter("error", ScenarioWarning)
        quick(flower("FedAvg"))  # Flower's own: nothing to say
        # with federated evaluation it is called: nothing to say either
        quick(flower("tests.test_flower:EvaluatesItself"), *FEDERATED)


def evaluations(*accuracies: float):
    """Client i: i + 1 held-out rows, loss 2 - accuracy."""
    from fedsim.algorithms.base import ClientEvaluation

    return [ClientEvaluation(i, i + 1, 2.0 - a, a) for i, a in enumerate(accuracies)]


def evaluating(strategy: str, options: str = "{}") -> tuple[Flower, dict]:
    """The scenario's Flower algorithm and its state after ``init``, as a
    run holds them (the live strategy lasts as long as the state)."""
    alg = quick(flower(strategy, options), *FEDERATED).algorithm
    return alg, alg.init(torch.zeros(3), 4)


def test_federated_evaluation_by_hand_through_flower_s_fedavg():
    # Prepare: weights 1, 2, 3, 4; accuracies 0, 1, 0.5, 0.25
    results = evaluations(0.0, 1.0, 0.5, 0.25)
    # Execute
    alg, _state = evaluating("FedAvg")
    out = alg.aggregate_evaluation(results, 0)
    # Assert: Flower's weighted average by num-examples, by hand:
    # accuracy (0 + 2 + 1.5 + 1) / 10 = 0.45, loss 2 - 0.45 = 1.55; the
    # quickstart's eval_loss and eval_acc named as fedsim's own columns
    assert out == pytest.approx({"loss": 1.55, "accuracy": 0.45}, rel=1e-12)


def test_the_strategy_s_own_rule_runs_on_a_copy_and_samples_by_the_round():
    # Prepare
    results = evaluations(0.0, 1.0, 0.5, 0.25)
    alg, state = evaluating("tests.test_flower:EvaluatesItself")
    # Execute: every evaluator replies (fraction_evaluate 1.0, the default)
    out = alg.aggregate_evaluation(results, 0)
    # Assert: its own columns; what it wrote into itself is dropped
    assert out == {"worst_acc": 0.0, "replies": 4.0}
    assert not hasattr(alg.live(state).strategy, "evaluated")
    # Execute: fraction_evaluate 0.5 samples 2 of the 4, seeded by the round
    half, _half = evaluating(
        "tests.test_flower:EvaluatesItself", "{fraction_evaluate: 0.5}"
    )
    picks = [half.aggregate_evaluation(results, t)["worst_acc"] for t in range(8)]
    again = [half.aggregate_evaluation(results, t)["worst_acc"] for t in range(8)]
    # Assert: 2 replies, the same pick again, not always the same pick
    assert half.aggregate_evaluation(results, 0)["replies"] == 2.0
    assert picks == again and len(set(picks)) > 1
    # fewer evaluators than the strategy's minimum: Flower would wait, no column
    needy, _needy = evaluating("FedAvg", "{min_evaluate_nodes: 5}")
    assert needy.aggregate_evaluation(results, 0) == {}


def test_federated_evaluation_in_a_run_equals_fedsim_s_own_rule(tmp_path):
    import pyarrow.parquet as pq

    # Execute: the same run with fedsim's FedAvg and Flower's
    ours = run_scenario(quick("{name: fedavg}", *FEDERATED, rounds=2))
    theirs = run_scenario(
        quick(flower("FedAvg"), *FEDERATED, rounds=2), run_dir=tmp_path
    )
    # Assert: the columns fedsim's rule writes, from Flower's aggregate_evaluate,
    # equal within the models' float rounding (module docstring)
    rows = pq.read_table(tmp_path / "rounds.parquet").to_pylist()
    for a, b in zip(ours.rows, rows, strict=True):
        assert a["fed_accuracy"] == pytest.approx(b["fed_accuracy"], abs=1e-6)
        assert a["fed_loss"] == pytest.approx(b["fed_loss"], abs=1e-6)
    assert [r["fed_loss"] for r in rows] == [r["fed_loss"] for r in theirs.rows]


def test_error_replies_carry_the_clock_s_reasons_in_a_run():
    # quickstart with a 15 s deadline (a straggler is late) and half the
    # mid-range phones dropping out mid-work
    late = "round={policy: fixed_epochs, epochs: 1, deadline_s: 15}"
    drops = "fleet.groups.1.stragglers.dropout_p=0.5"
    sc = quick(flower(LOGS, "{min_tau: 1}"), late, drops, rounds=2)
    ERROR_LOG.clear()
    res = run_scenario(sc)
    log = list(ERROR_LOG)
    dropped = [
        [c["round"] + 1, c["client_id"], c["drop_reason"]]
        for c in res.clients
        if c["dropped"]
    ]
    assert dropped, "the scenario drops someone"
    got = [[r, int(why.split()[2]), why.split(":")[0]] for r, _, why in log]
    assert sorted(got) == sorted(dropped)
    codes = {why.split(":")[0]: code for _, code, why in log}
    assert codes == {"late": 4, "dropout": 5}  # Flower's ErrorCode


# -------------------------------------------------------------- Ray, compare
@pytest.mark.ray
def test_two_ray_workers_equal_the_in_process_run(ray_session):
    # FedProx's mu alike for every client (the shared payload), each odd
    # device's own lr (instructions), the aggregated metrics (columns)
    alg = flower(LR, "{lr: 0.05, odd_factor: 1.5, proximal_mu: 0.1}")
    local = run_scenario(quick(alg, rounds=2), workers=0)
    two = run_scenario(quick(alg, rounds=2), workers=2)
    assert torch.equal(local.final_params, two.final_params)
    assert local.rows[0]["alg_tau"] > 0
    for key in ("test_loss", "alg_tau", "alg_train_loss"):
        assert [r[key] for r in local.rows] == [r[key] for r in two.rows]
    assert per_client(local.clients) == per_client(two.clients)


def test_compare_runs_a_flower_arm_beside_fedsim_s(tmp_path):
    from fedsim.tools.compare import compare

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


def test_an_arm_names_a_strategy_by_its_path():
    from fedsim.tools.compare import _parse_label, split_algorithms

    # Execute: a user's strategy in -a, its import path's colon inside a value
    arms = split_algorithms(f"fedavg,flower:strategy={SKIP},sample_by=selector")
    # Assert: two arms, the path kept whole, the scenario loads with it
    assert arms == ["fedavg", f"flower:strategy={SKIP},sample_by=selector"]
    name, values = _parse_label(arms[1])
    assert (name, values) == ("flower", {"strategy": SKIP, "sample_by": "selector"})
    assert quick(flower(values["strategy"])).algorithm.strategy == SKIP


def test_stress_runs_a_flower_arm_beside_fedsim_s(tmp_path):
    import pyarrow.parquet as pq

    from fedsim.tools.stress import run_stress

    # Execute: the tiny scenario, stragglers swept, one seed, in-process
    out = run_stress(
        TINY,
        {"fleet.groups.0.stragglers.p": [0.0, 0.5]},
        ["fedavg", "flower:strategy=FedAvg,sample_by=selector"],
        seeds=1,
        out_dir=tmp_path,
        workers=0,
    )
    # Assert: one row per cell and arm; Flower's FedAvg is fedsim's in each
    table = pq.read_table(out / "stress.parquet").to_pylist()
    arms = [r["algorithm"].split(":")[0] for r in table]
    assert sorted(arms) == ["fedavg", "fedavg", "flower", "flower"]
    for cell in (0, 1):
        acc = {r["algorithm"].split(":")[0]: r["final_accuracy"] for r in table
               if r["cell"] == cell}  # fmt: skip
        assert math.isfinite(acc["flower"])
        assert acc["flower"] == pytest.approx(acc["fedavg"], abs=0.003)
    assert "flower" in (out / "stress.md").read_text()
