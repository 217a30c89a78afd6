"""SCAFFOLD, FedDyn and FedDC: the invariants of docs/algorithms.md section 13
(and 7, 8, 9.2), through the real worker and server code, on the quadratic
objectives F_i(x) = 1/2 (x - e_i)^2 with e = (0, 1, 4)."""

from __future__ import annotations

import pytest
import torch

from fedsim.algorithms import FedDC
from fedsim.algorithms.base import ClientInfo, ClientUpdate
from fedsim.solvers import SGD

from .test_algorithms import QUAD, TINY, Driver, final_x, run

E = (0.0, 1.0, 4.0)
P = (0.5, 0.3, 0.2)
REL = tuple(3 * p for p in P)  # relative weights n_i m / n
EQUAL = "data.weights=[1, 1, 1]"
MEAN = 5.0 / 3.0
ALL = {0: 1, 1: 5, 2: 10}  # the scenario's heterogeneous steps
PARTIAL = ({0: 1, 2: 10}, {1: 5}, {0: 3, 1: 2, 2: 7}, {2: 4}, {0: 6, 1: 1})


def client_states(d: Driver) -> dict[int, dict[str, torch.Tensor]]:
    return d.server.store.get(range(3))


def zeros() -> torch.Tensor:
    return torch.zeros(1, dtype=torch.float64)


# ----------------------------------------------------------------- SCAFFOLD
def test_scaffold_round_one_is_unweighted_fedavg():
    s = Driver("algorithm={name: scaffold}")
    a = Driver("algorithm={name: fedavg}", EQUAL)
    s.round(ALL)
    a.round(ALL)
    torch.testing.assert_close(s.x, a.x, rtol=0, atol=1e-15)


def test_scaffold_server_c_is_the_mean_of_all_client_c_i():
    d = Driver("algorithm={name: scaffold}")
    for taus in PARTIAL:
        d.round(taus)
        cs = client_states(d)
        mean = sum(cs[i].get("c", zeros()) for i in range(3)) / 3
        torch.testing.assert_close(d.state["c"], mean, rtol=0, atol=1e-15)


def test_scaffold_one_step_control_variate_is_the_gradient():
    # Prepare: non-zero c and c_i from heterogeneous rounds
    d = Driver("algorithm={name: scaffold}")
    for taus in PARTIAL[:3]:
        d.round(taus)
    x = float(d.x)
    # Execute: K = 1, deterministic gradients
    d.round({0: 1, 1: 1, 2: 1})
    # Assert: c_i^+ = grad F_i(x) = x - e_i, whatever c and c_i were
    for i, st in client_states(d).items():
        assert float(st["c"]) == pytest.approx(x - E[i], abs=1e-13)


@pytest.mark.parametrize(
    "steps", [[], ["round={policy: fixed_epochs, epochs: 5}"]], ids=["1-5-10", "5"]
)
def test_scaffold_converges_to_the_unweighted_mean(steps):
    # unlike FedAvg (2.1243 here), even with heterogeneous steps (1, 5, 10)
    d = Driver("algorithm={name: scaffold}", *steps)
    taus = ALL if not steps else {0: 5, 1: 5, 2: 5}
    for _ in range(150):
        d.round(taus)
    assert float(d.x) == pytest.approx(MEAN, abs=1e-9)
    assert float(d.state["c"]) == pytest.approx(0.0, abs=1e-9)
    assert final_x("algorithm={name: scaffold}", "rounds=150", *steps) == (
        pytest.approx(MEAN, abs=1e-9)
    )


def test_scaffold_meter_reports_the_unweighted_mean():
    d = Driver("algorithm={name: scaffold}")
    d.round(ALL)
    assert d.result.info.weights == pytest.approx({0: 1 / 3, 1: 1 / 3, 2: 1 / 3})
    assert d.result.info.tau_eff == pytest.approx(16 / 3)


# ------------------------------------------------------------------- FedDyn
@pytest.mark.parametrize("name", ["feddyn", "feddc"])
def test_round_one_local_problem_is_fedprox_with_mu_alpha_i(name):
    # Prepare: zero state; alpha_i = alpha / w_i with w_i = (1.5, 0.9, 0.6)
    alpha = 0.3
    ups = Driver(f"algorithm={{name: {name}, alpha: {alpha}}}").train(ALL)
    # Execute / Assert: each client's local model is FedProx's with mu = alpha_i
    for u in ups:
        mu = alpha / REL[u.client]
        prox = Driver(f"algorithm={{name: fedprox, mu: {mu}}}").train(
            {u.client: u.tau}
        )[0]
        torch.testing.assert_close(u.delta, prox.delta, rtol=0, atol=1e-15)


def test_feddyn_h_is_minus_alpha_mean_of_all_hist():
    # Prepare: the paper form, kept alongside: h^t = h^{t-1} - alpha/m sum_S delta_i
    alpha, m = 0.2, 3
    d = Driver(f"algorithm={{name: feddyn, alpha: {alpha}}}", EQUAL)
    h = zeros()
    for taus in PARTIAL:
        # Execute
        w = d.x.clone()
        ups = d.round(taus)
        # Assert: the code form's running sum, the store, and the paper form agree
        h = h - alpha / m * sum(u.delta for u in ups)
        hist = client_states(d)
        store_mean = sum(hist[i].get("hist", zeros()) for i in range(m)) / m
        torch.testing.assert_close(
            -alpha * d.state["hist_sum"] / m, h, rtol=0, atol=1e-14
        )
        torch.testing.assert_close(-alpha * store_mean, h, rtol=0, atol=1e-14)
        theta_mean = sum(w + u.delta for u in ups) / len(ups)
        torch.testing.assert_close(d.x, theta_mean - h / alpha, rtol=0, atol=1e-13)


@pytest.mark.parametrize(
    ("alpha", "steps", "rounds"),
    [(0.1, 50, 400), (1.0, 50, 100), (1.0, None, 250)],
)
def test_feddyn_quadratic_converges_to_the_mean(alpha, steps, rounds):
    # 50 local steps: close to the exact local minimisation of docs/algorithms.md 8
    d = Driver(f"algorithm={{name: feddyn, alpha: {alpha}}}", EQUAL)
    taus = ALL if steps is None else {0: steps, 1: steps, 2: steps}
    for _ in range(rounds):
        d.round(taus)
    assert float(d.x) == pytest.approx(MEAN, abs=1e-9)
    # client states: grad L_i = -alpha hist_i -> grad F_i(x*) = x* - e_i, sum 0
    grads = [-alpha * float(st["hist"]) for st in client_states(d).values()]
    assert grads == pytest.approx([MEAN - e for e in E], abs=1e-8)
    assert sum(grads) == pytest.approx(0.0, abs=1e-8)


def test_feddyn_with_unbalanced_data_converges_to_the_weighted_optimum():
    # alpha_i = alpha / w_i makes the fixed point the data-weighted optimum x* = 1.1
    x = final_x("algorithm={name: feddyn, alpha: 1.0}", "rounds=200")
    assert x == pytest.approx(1.1, abs=1e-9)


def test_feddyn_rejects_a_server_lr():
    with pytest.raises(ValueError, match="server_lr"):
        FedDC(server_lr=0.5)


# -------------------------------------------------------------------- FedDC
@pytest.mark.parametrize(
    ("path", "overrides"),
    [(TINY, ["rounds=4"]), (QUAD, ["rounds=20", "selector.clients_per_round=2"])],
    ids=["tiny-synthetic", "quadratic"],
)
def test_feddc_without_correction_is_feddyn_bit_for_bit(path, overrides):
    rows_dyn, x_dyn = run(path, "algorithm={name: feddyn, alpha: 0.05}", *overrides)
    rows_dc, x_dc = run(
        path, "algorithm={name: feddc, alpha: 0.05, correction: false}", *overrides
    )
    assert torch.equal(x_dyn, x_dc)
    assert [r["test_loss"] for r in rows_dyn] == [r["test_loss"] for r in rows_dc]


@pytest.mark.parametrize(
    ("alpha", "reference"),
    [(0.0, "{name: fedavg}"), (0.4, "{name: fedprox, mu: 0.4}")],
)
def test_feddc_with_zero_drift_and_no_correction_is_fedavg_or_fedprox(alpha, reference):
    # Prepare: FedDC with h forced to 0 every round: clients start from no
    # state, and the server's mean of h (here, the sum of this round's deltas
    # that aggregate just added) is taken back out of the model
    dc = Driver(f"algorithm={{name: feddc, alpha: {alpha}, correction: false}}", EQUAL)
    ref = Driver(f"algorithm={reference}", EQUAL)
    for taus in (ALL, ALL, ALL):
        # Execute
        tasks_x = dc.x.clone()
        ups = dc.executor.train(_tasks(dc, taus), {0: dc.server.payload()}, {})
        dc.state["hist_sum"].zero_()
        new, _ = dc.server.algorithm.aggregate(dc.state, ups)
        new["x"] = new["x"] - new["hist_sum"].to(new["x"].dtype) / 3
        dc.server.state = {**new, "hist_sum": torch.zeros_like(new["hist_sum"])}
        dc.t += 1
        ref.round(taus)
        # Assert: unweighted FedAvg (alpha = 0) or FedProx with mu = alpha
        torch.testing.assert_close(dc.x, ref.x, rtol=0, atol=1e-14)
        assert not torch.equal(dc.x, tasks_x)


def _tasks(d: Driver, taus: dict[int, int]):
    from fedsim.workers import Task

    return [Task(c, d.t, t) for c, t in sorted(taus.items())]


def test_feddc_drift_update_is_the_local_model_change():
    d = Driver("algorithm={name: feddc, alpha: 0.1}")
    for taus in PARTIAL:
        before = client_states(d)
        w = d.x.clone()
        ups = d.round(taus)
        after = client_states(d)
        for u in ups:
            h_old = before[u.client].get("hist", zeros())
            theta = w + u.delta
            torch.testing.assert_close(
                after[u.client]["hist"] - h_old, theta - w, rtol=0, atol=1e-15
            )


def test_feddc_server_c_is_the_weighted_mean_of_client_c_i():
    # c = (1/m) sum_i w_i c_i with w_i = n_i m / n = (1.5, 0.9, 0.6)
    d = Driver("algorithm={name: feddc, alpha: 0.1}")
    for taus in PARTIAL:
        d.round(taus)
        cs = client_states(d)
        mean = sum(REL[i] * cs[i].get("c", zeros()) for i in range(3)) / 3
        torch.testing.assert_close(d.state["c"], mean, rtol=0, atol=1e-14)


def test_feddc_paper_aggregation_equals_code_under_full_balanced_participation():
    code = Driver("algorithm={name: feddc, alpha: 0.1}", EQUAL)
    paper = Driver("algorithm={name: feddc, alpha: 0.1, aggregation: paper}", EQUAL)
    for _ in range(5):
        code.round(ALL)
        paper.round(ALL)
        torch.testing.assert_close(code.x, paper.x, rtol=0, atol=1e-13)
    # ... and differs when only some clients take part (stale h_i not included)
    code.round({0: 3})
    paper.round({0: 3})
    assert not torch.allclose(code.x, paper.x)
    assert paper.result.info.chi2_pw == 0.0


@pytest.mark.parametrize(
    ("weights", "target"), [(EQUAL, MEAN), ("data.weights=[0.5, 0.3, 0.2]", 1.1)]
)
def test_feddc_quadratic_fixed_point(weights, target):
    # the unweighted mean for balanced data; the data-weighted optimum otherwise
    x = final_x("algorithm={name: feddc, alpha: 0.1}", weights, "rounds=300")
    assert x == pytest.approx(target, abs=1e-9)


# ------------------------------------------- FedDC's correction, one round by hand
def test_feddc_one_round_with_a_correction_by_hand():
    # Prepare: m = 2 clients, client 0 in S with w_0 = n_0 m / n = 2 and
    # F_0(theta) = (theta - 3)^2 / 2; server x = 1, c = 0.2, sum of h = 0.5;
    # client state h_0 = 0.5, c_0 = 0.3; alpha = 0.1; one SGD step, lr 0.5.
    f64 = torch.float64
    alg = FedDC(alpha=0.1)
    state = alg.init(torch.tensor([1.0], dtype=f64), num_clients=2)
    state["c"] = torch.tensor([0.2], dtype=f64)
    state["hist_sum"] = torch.tensor([0.5], dtype=f64)
    info = ClientInfo(client=0, n_samples=10, num_clients=2, relative_weight=2.0)
    own = {"hist": torch.tensor([0.5], dtype=f64), "c": torch.tensor([0.3], dtype=f64)}
    solver = SGD(lr=0.5)

    # Execute: the client half, then the server
    client = alg.start_client(info, alg.payload(state), own)
    theta = state["x"].clone()
    st = solver.begin(state["x"])
    grad = theta - 3.0
    alg.grad_hook(theta, grad, client)
    solver.step(theta, grad, st)
    delta = theta - state["x"]
    extras, new_state = alg.client_finish(delta, st, client)
    up = ClientUpdate(0, delta, 10.0, 1, st.norm_a, 0.0, extras, new_state)
    new, _ = alg.aggregate(state, [up])

    # Assert. alpha_0 = 0.1 / 2 = 0.05, anchor w - h = 0.5, r = c / w_0 - c_0
    # = 0.1 - 0.3 = -0.2; gradient -2 + 0.05 (1 - 0.5) - 0.2 = -2.175, so
    # theta = 1 + 0.5 * 2.175 = 2.0875 and delta = 1.0875
    assert float(delta) == pytest.approx(1.0875, abs=1e-12)
    # h_0 = 0.5 + 1.0875; c_0+ = c_0 - c / w_0 - delta / lr = 0.3 - 0.1 - 2.175
    assert float(new_state["hist"]) == pytest.approx(1.5875, abs=1e-12)
    assert float(new_state["c"]) == pytest.approx(-1.975, abs=1e-12)
    # uploaded w_0 (c_0+ - c_0) = 2 (-1.975 - 0.3) = -4.55
    assert float(extras["dc"]) == pytest.approx(-4.55, abs=1e-12)
    # server: x = theta + (0.5 + 1.0875) / 2 = 2.88125; c = 0.2 - 4.55 / 2
    assert float(new["x"]) == pytest.approx(2.88125, abs=1e-12)
    assert float(new["c"]) == pytest.approx(-2.075, abs=1e-12)
