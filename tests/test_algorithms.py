"""FedAvg (with the unbiased sampling schemes of docs/algorithms.md section 3),
FedProx (section 4), the server optimizers FedAvgM and FedAdam, and the
objective-inconsistency meter chi^2(p || w) (section 6.5).

The helpers at the top (``Driver``, ``final_x``, ``fixed_point``) are shared
by the other ``test_algorithms_*`` modules.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from fedsim.algorithms import FedAdam, FedAvg, FedAvgM, FedNova
from fedsim.algorithms.base import ClientContext, ClientInfo, ClientUpdate
from fedsim.algorithms.sampling import proportional_weights, uniform_weights
from fedsim.data import build_data
from fedsim.executors import InProcessExecutor
from fedsim.runtime import run_scenario, run_setup
from fedsim.scenario import load_scenario
from fedsim.server import Server, Step
from fedsim.solvers import SGD
from fedsim.workers import Task

from .conftest import SCENARIOS

QUAD = SCENARIOS / "quadratic-objective-inconsistency.yaml"
TINY = SCENARIOS / "ci" / "tiny-synthetic.yaml"


# ------------------------------------------------------------------ helpers
class Driver:
    """The server and an in-process worker, with rounds whose clients and
    local steps the test chooses (the runtime's round step, minus the clock)."""

    def __init__(self, *overrides: str, scenario=QUAD) -> None:
        self.sc = load_scenario(scenario, list(overrides))
        data = build_data(self.sc.data, self.sc.num_clients, self.sc.seed)
        setup = run_setup(self.sc)
        self.server = Server(setup.server, data)
        self.executor = InProcessExecutor(setup.worker, data)
        self.t = 0

    @property
    def state(self):
        return self.server.state

    @property
    def x(self) -> torch.Tensor:
        return self.server.state["x"]

    def train(self, taus: dict[int, int]) -> list[ClientUpdate]:
        """Local training only (nothing aggregated)."""
        tasks = [Task(c, self.t, tau) for c, tau in sorted(taus.items())]
        states = self.server.client_states(sorted(taus))
        return self.executor.train(tasks, {0: self.server.payload()}, states)

    def round(self, taus: dict[int, int]) -> list[ClientUpdate]:
        updates = self.train(taus)
        self.result = self.server.apply(updates)
        self.t += 1
        return updates


def run(path, *overrides: str) -> tuple[list[dict], torch.Tensor]:
    res = run_scenario(load_scenario(path, list(overrides)), workers=0)
    assert res.final_params is not None
    return res.rows, res.final_params


def final_x(*overrides: str) -> float:
    return float(run(QUAD, *overrides)[1][0])


def fixed_point(*overrides: str) -> float:
    """Fixed point of the (affine) one-round server map of the quadratic."""
    f0 = final_x("rounds=1", "data.x0=0.0", *overrides)
    f1 = final_x("rounds=1", "data.x0=1.0", *overrides)
    return f0 / (1.0 - (f1 - f0))


def make_update(client, delta, weight=1.0, tau=1, norm_a=None, **extras):
    ex = {k: torch.tensor(float(v), dtype=torch.float64) for k, v in extras.items()}
    na = float(tau) if norm_a is None else norm_a
    return ClientUpdate(client, delta, weight, tau, na, 0.0, ex)


# ------------------------------------------- the server's ordering contract
def test_a_round_reaches_aggregate_in_client_order_each_client_once():
    # Prepare: three clients' updates, handed over in reverse order
    d = Driver("algorithm={name: fedavg}")
    ups = d.train({0: 1, 1: 2, 2: 3})
    # Execute
    applied = d.server.apply(ups[::-1], Step("round 0"))
    # Assert: sorted by id, weights in that order; a client twice is refused
    assert applied.clients == (0, 1, 2)
    assert applied.weights == tuple(applied.info.weights[c] for c in (0, 1, 2))
    with pytest.raises(ValueError, match="round 0: client 1 has two updates"):
        d.server.apply([ups[1], ups[0], ups[1]], Step("round 0"))


# ------------------------------------------------------------------- FedAvg
def test_full_participation_is_the_weighted_average_of_local_models():
    # Prepare
    d = Driver("algorithm={name: fedavg}")
    x = d.x.clone()
    # Execute
    ups = d.round({0: 1, 1: 5, 2: 10})
    # Assert: x^{t+1} = sum_i p_i x_i^{t, tau_i}
    p = [0.5, 0.3, 0.2]
    expected = sum(pi * (x + u.delta) for pi, u in zip(p, ups, strict=True))
    torch.testing.assert_close(d.x, expected, rtol=0, atol=1e-15)


P4 = (0.1, 0.2, 0.3, 0.4)


def _deltas4() -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(4)
    return [torch.randn(3, dtype=torch.float64, generator=gen) for _ in P4]


def test_scheme_ii_uniform_without_replacement_is_unbiased():
    # Prepare: m = 4 clients, q = 2, every one of the C(4, 2) subsets
    deltas, m, q = _deltas4(), 4, 2
    alg = FedAvg(sampling="uniform")
    target = sum(p * dl for p, dl in zip(P4, deltas, strict=True))
    # Execute
    steps, biased = [], []
    for subset in itertools.combinations(range(m), q):
        ups = []
        for i in subset:
            info = ClientInfo(i, 10, m, relative_weight=P4[i] * m)
            extras, _ = alg.client_finish(deltas[i], None, ClientContext(info, {}))
            ups.append(ClientUpdate(i, deltas[i], P4[i], 1, 1.0, 0.0, extras))
        x0 = torch.zeros(3, dtype=torch.float64)
        steps.append(alg.aggregate({"x": x0}, ups)[0]["x"])
        biased.append(FedAvg().aggregate({"x": x0}, ups)[0]["x"])
    # Assert: E_S[update] = sum_i p_i Delta_i exactly; the common practice is biased
    n = math.comb(m, q)
    torch.testing.assert_close(sum(steps) / n, target, rtol=0, atol=1e-15)
    assert not torch.allclose(sum(biased) / n, target, atol=1e-3)


def test_scheme_i_with_replacement_is_unbiased():
    # Prepare: all m^q ordered draws, each with probability prod p_{l_j}
    deltas, m, q = _deltas4(), 4, 3
    alg = FedAvg(sampling="proportional")
    target = sum(p * dl for p, dl in zip(P4, deltas, strict=True))
    # Execute
    mean = torch.zeros(3, dtype=torch.float64)
    total_prob = 0.0
    for draw in itertools.product(range(m), repeat=q):
        prob = math.prod(P4[i] for i in draw)
        counts = {i: draw.count(i) for i in sorted(set(draw))}
        ups = [
            make_update(i, deltas[i], weight=P4[i], multiplicity=k)
            for i, k in counts.items()
        ]
        x = alg.aggregate({"x": torch.zeros(3, dtype=torch.float64)}, ups)[0]["x"]
        mean += prob * x
        total_prob += prob
    # Assert
    assert total_prob == pytest.approx(1.0)
    torch.testing.assert_close(mean, target, rtol=0, atol=1e-15)


def test_sampling_weight_functions():
    assert uniform_weights([0.4, 1.2], q=2) == [0.2, 0.6]
    assert proportional_weights([1, 3]) == [0.25, 0.75]
    with pytest.raises(ValueError):
        proportional_weights([0, 2])
    # scheme (i) without multiplicities from the selector: a clear error
    with pytest.raises(ValueError, match="multiplicity"):
        FedAvg(sampling="proportional").aggregate(
            {"x": torch.zeros(1)}, [make_update(0, torch.ones(1))]
        )


def test_uniform_scheme_under_full_participation_equals_plain_fedavg():
    base = final_x("algorithm={name: fedavg}", "rounds=5")
    uni = final_x("algorithm={name: fedavg, sampling: uniform}", "rounds=5")
    assert uni == pytest.approx(base, abs=1e-14)


def test_uniform_scheme_runs_with_partial_participation():
    rows, x = run(TINY, "algorithm={name: fedavg, sampling: uniform}", "rounds=3")
    assert all(math.isfinite(r["train_loss"]) for r in rows)
    assert bool(torch.isfinite(x).all())


def test_identical_data_makes_the_global_model_equal_every_local_model():
    # Prepare: every client has the same objective and takes the same steps
    d = Driver("algorithm={name: fedavg}", "data.centers=[2.0, 2.0, 2.0]")
    x = d.x.clone()
    # Execute
    ups = d.round({0: 3, 1: 3, 2: 3})
    # Assert
    for u in ups:
        torch.testing.assert_close(d.x, x + u.delta, rtol=0, atol=1e-15)


# ------------------------------------------------------------------ FedProx
def test_fedprox_mu_zero_is_fedavg_bit_for_bit():
    rows_a, xa = run(TINY, "algorithm={name: fedavg}", "rounds=3")
    rows_p, xp = run(TINY, "algorithm={name: fedprox, mu: 0.0}", "rounds=3")
    assert torch.equal(xa, xp)
    assert [r["test_loss"] for r in rows_a] == [r["test_loss"] for r in rows_p]


def test_fedprox_first_local_step_equals_fedavg():
    # the proximal gradient mu (x - x^t) is zero at step 0
    ua = Driver("algorithm={name: fedavg}", scenario=TINY).train({0: 1, 3: 1})
    up = Driver("algorithm={name: fedprox, mu: 5.0}", scenario=TINY).train({0: 1, 3: 1})
    for a, b in zip(ua, up, strict=True):
        assert torch.equal(a.delta, b.delta)


def test_fedprox_norm_a_from_the_worker_matches_closed_form():
    ups = Driver("algorithm={name: fedprox, mu: 0.5}").train({0: 1, 1: 5, 2: 10})
    alpha = 0.1 * 0.5
    for u in ups:
        assert u.norm_a == pytest.approx((1 - (1 - alpha) ** u.tau) / alpha)


@pytest.mark.parametrize(
    ("lr", "mu", "expected"),
    [(0.1, 0.1, 2.100871772382), (0.1, 1.0, 1.907031017474)],
)
def test_fedprox_quadratic_fixed_point(lr, mu, expected):
    alg = f"algorithm={{name: fedprox, mu: {mu}}}"
    assert fixed_point(alg, f"client.lr={lr}") == pytest.approx(expected, abs=1e-9)
    assert final_x(alg, f"client.lr={lr}", "rounds=200") == pytest.approx(
        expected, abs=1e-9
    )


# ------------------------------------------------------------------- meter
def sgd_update(client: int, tau: int, weight: float) -> ClientUpdate:
    """A real SGD run of tau steps (norm_a from the solver's recursion)."""
    solver = SGD(lr=0.1)
    x0 = torch.zeros(2)
    x, st = x0.clone(), solver.begin(x0)
    for k in range(tau):
        solver.step(x, torch.tensor([1.0, -1.0]) * (k + 1), st)
    return ClientUpdate(client, x - x0, weight, st.steps, st.norm_a, 0.0)


def test_chi2_fedavg_two_clients_tau_2_6_is_one_third():
    ups = [sgd_update(0, 2, 1.0), sgd_update(1, 6, 1.0)]
    assert [u.norm_a for u in ups] == [2.0, 6.0]
    _, info = FedAvg().aggregate({"x": torch.zeros(2)}, ups)
    # the definition: sum (p_i - w_i)^2 / w_i with w = (1/4, 3/4): 1/3
    # (the closed form printed in the paper's appendix is twice this)
    assert info.chi2_pw == pytest.approx(1.0 / 3.0, abs=1e-12)
    assert info.weights == pytest.approx({0: 0.25, 1: 0.75})
    assert info.tau_eff == pytest.approx(4.0)


def test_chi2_is_zero_for_fednova_and_for_fedavg_with_equal_tau():
    ups = [sgd_update(0, 2, 1.0), sgd_update(1, 6, 3.0)]
    nova = FedNova()
    _, info = nova.aggregate(nova.init(torch.zeros(2), 2), ups)
    assert info.chi2_pw == 0.0
    assert info.weights == pytest.approx({0: 0.25, 1: 0.75})
    equal = [sgd_update(0, 4, 1.0), sgd_update(1, 4, 3.0)]
    assert FedAvg().aggregate({"x": torch.zeros(2)}, equal)[1].chi2_pw == 0.0


def test_chi2_through_the_real_code_path():
    # Prepare: clients 0 and 1 of the quadratic, equal data weights, tau = (2, 6)
    d = Driver("algorithm={name: fedavg}", "data.weights=[1, 1, 1]")
    # Execute
    d.round({0: 2, 1: 6})
    # Assert
    assert d.result.info.chi2_pw == pytest.approx(1.0 / 3.0, abs=1e-12)
    rows, _ = run(QUAD, "rounds=2")  # FedNova
    assert [r["chi2_pw"] for r in rows] == [0.0, 0.0]


# -------------------------------------------------------- server optimizers
def test_fedavgm_without_momentum_is_fedavg_with_server_lr():
    _, xa = run(TINY, "algorithm={name: fedavg, server_lr: 0.7}")
    _, xm = run(TINY, "algorithm={name: fedavgm, server_lr: 0.7, server_momentum: 0}")
    assert torch.equal(xa, xm)


def test_fedavgm_hand_computed():
    alg = FedAvgM(server_momentum=0.9, server_lr=0.5)
    state = alg.init(torch.zeros(1, dtype=torch.float64), 2)
    x, v = 0.0, 0.0
    for delta in (1.0, -2.0, 0.5):
        ups = [
            make_update(0, torch.tensor([delta - 1]), weight=1.0),
            make_update(1, torch.tensor([delta + 1]), weight=1.0),
        ]
        state, _ = alg.aggregate(state, ups)
        v = 0.9 * v + delta
        x += 0.5 * v
        assert float(state["x"]) == pytest.approx(x, abs=1e-15)
        assert float(state["mom"]) == pytest.approx(v, abs=1e-15)


def test_fedadam_hand_computed():
    alg = FedAdam(server_lr=0.1, beta1=0.9, beta2=0.99, adaptivity=1e-3)
    state = alg.init(torch.zeros(2, dtype=torch.float64), 2)
    x, m, v = np.zeros(2), np.zeros(2), np.full(2, 1e-6)
    for delta in ([1.0, -0.5], [0.2, 0.3], [-1.0, 0.0]):
        d = np.array(delta)
        state, _ = alg.aggregate(state, [make_update(0, torch.tensor(d))])
        m = 0.9 * m + 0.1 * d
        v = 0.99 * v + 0.01 * d**2
        x = x + 0.1 * m / (np.sqrt(v) + 1e-3)
        np.testing.assert_allclose(state["x"].numpy(), x, rtol=1e-13, atol=0)
        np.testing.assert_allclose(state["v"].numpy(), v, rtol=1e-13, atol=0)


def test_server_optimizers_learn_on_tiny_synthetic():
    base, _ = run(TINY, "algorithm={name: fedavg}", "rounds=4")
    for alg in ("{name: fedavgm}", "{name: fedadam, server_lr: 0.03}"):
        rows, _ = run(TINY, f"algorithm={alg}", "rounds=4")
        assert rows[-1]["test_loss"] < rows[0]["test_loss"] or math.isclose(
            rows[-1]["test_loss"], rows[0]["test_loss"]
        )
        assert rows[-1]["test_accuracy"] > 1 / 3
    assert base[-1]["test_accuracy"] > 1 / 3
