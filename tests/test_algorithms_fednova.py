"""FedNova (docs/algorithms.md 5, 6.3, 13): solvers, tau_eff, server momentum,
sampling, FedNova-Prox, and the reconstructed FedNova-VR (5.5)."""

from __future__ import annotations

import math

import pytest
import torch

from fedsim.algorithms import FedAvg, FedNova, FedNovaVR
from fedsim.algorithms.base import ClientInfo, ClientUpdate
from fedsim.solvers import SolverState

from .test_algorithms import QUAD, Driver, final_x, fixed_point, make_update, run

E = (0.0, 1.0, 4.0)
P = (0.5, 0.3, 0.2)
EQUAL_STEPS = "round={policy: fixed_epochs, epochs: 5}"  # tau_i = 5 for all


@pytest.mark.parametrize(
    "solver",
    [
        [],
        ["client.solver=momentum", "client.momentum=0.9"],
        ["client.solver=decay", "client.step_decay=0.8"],
    ],
    ids=["sgd", "momentum", "decay"],
)
def test_equal_norm_a_makes_fednova_equal_fedavg(solver):
    nova = final_x(EQUAL_STEPS, "algorithm={name: fednova}", "rounds=10", *solver)
    avg = final_x(EQUAL_STEPS, "algorithm={name: fedavg}", "rounds=10", *solver)
    assert nova == pytest.approx(avg, abs=1e-13)
    assert nova != pytest.approx(0.0)


@pytest.mark.parametrize(
    "tau_eff",
    [
        "tau_eff: fedavg",
        "tau_eff: steps",
        "tau_eff: fixed, tau_eff_value: 1.5",
        "tau_eff: fixed, tau_eff_value: 6.0",
    ],
)
def test_fixed_point_does_not_depend_on_tau_eff(tau_eff):
    x = fixed_point(f"algorithm={{name: fednova, {tau_eff}}}")
    assert x == pytest.approx(0.875330176644, abs=1e-9)


def test_tau_eff_fixed_needs_a_value():
    with pytest.raises(ValueError, match="tau_eff_value"):
        FedNova(tau_eff="fixed")


def _k_decay(lr: float, gamma: float, tau: int) -> float:
    """K for H = I: 1 - prod_k (1 - lr gamma^k) (docs/algorithms.md 6.3)."""
    return 1.0 - math.prod(1.0 - lr * gamma**k for k in range(tau))


def test_decay_solver_quadratic_fixed_points():
    # Prepare: closed forms of 6.2/6.3 with K_i of the decayed-lr solver
    lr, gamma, taus = 0.1, 0.9, (1, 5, 10)
    ks = [_k_decay(lr, gamma, t) for t in taus]
    norms = [(1 - gamma**t) / (1 - gamma) for t in taus]
    avg = sum(p * k * e for p, k, e in zip(P, ks, E, strict=True)) / sum(
        p * k for p, k in zip(P, ks, strict=True)
    )
    nova_w = [p * k / a for p, k, a in zip(P, ks, norms, strict=True)]
    nova = sum(w * e for w, e in zip(nova_w, E, strict=True)) / sum(nova_w)
    decay = ["client.solver=decay", f"client.step_decay={gamma}"]
    # Execute / Assert: through the real code path
    assert fixed_point("algorithm={name: fedavg}", *decay) == pytest.approx(
        avg, abs=1e-9
    )
    assert fixed_point(*decay) == pytest.approx(nova, abs=1e-9)
    assert final_x(*decay, "rounds=200") == pytest.approx(nova, abs=1e-9)


# ---------------------------------------------------------- server momentum
def test_gmf_zero_is_no_server_momentum():
    # Prepare: a state whose momentum buffer holds garbage
    alg = FedNova(gmf=0.0)
    state = {"x": torch.tensor([1.0]), "mom": torch.tensor([123.0])}
    ups = [
        make_update(0, torch.tensor([2.0]), tau=2),
        make_update(1, torch.tensor([6.0]), tau=6),
    ]
    # Execute
    new, _ = alg.aggregate(state, ups)
    # Assert: x + tau_eff sum p Delta / ||a|| = 1 + 4 * (0.5 + 0.5)
    assert float(new["x"]) == 5.0
    # and the 6.4 trajectory with gmf: 0 spelled out
    assert final_x(
        "algorithm={name: fednova, tau_eff: steps, gmf: 0.0}", "rounds=10"
    ) == (pytest.approx(0.863616008462, abs=1e-9))


def test_server_momentum_matches_the_official_code_rule():
    # The code: v <- gmf v + D / lr (v = D / lr in round 1), x <- x - lr v,
    # with D = tau_eff sum p (-Delta) / ||a||.
    gmf, lr = 0.8, 0.05
    alg = FedNova(gmf=gmf)
    state = alg.init(torch.zeros(1, dtype=torch.float64), 2)
    x, v = 0.0, None
    for r, (d0, d1) in enumerate([(0.2, 0.6), (-0.1, 0.3), (0.05, -0.4)]):
        f64 = torch.float64
        ups = [
            make_update(0, torch.tensor([d0], dtype=f64), tau=2),
            make_update(1, torch.tensor([d1], dtype=f64), tau=6),
        ]
        state, info = alg.aggregate(state, ups)
        big_d = -info.tau_eff * (0.5 * d0 / 2 + 0.5 * d1 / 6)
        v = big_d / lr if r == 0 else gmf * v + big_d / lr
        x = x - lr * v
        assert float(state["x"]) == pytest.approx(x, abs=1e-15)


def test_server_momentum_follows_the_decayed_lr_as_the_official_code():
    # Prepare: gmf = 0.5; one client, ||a|| = 2, x0 = 1; round 1 at lr 0.1
    # moves by Delta = -0.2, round 2 at lr 0.05 by Delta = -0.1
    alg = FedNova(gmf=0.5)
    state = alg.init(torch.tensor([1.0], dtype=torch.float64), 1)
    info = ClientInfo(client=0, n_samples=1, num_clients=1, relative_weight=1.0)
    xs = []
    for lr, d in ((0.1, -0.2), (0.05, -0.1)):
        delta = torch.tensor([d], dtype=torch.float64)
        st = SolverState(x0=state["x"], lr=lr, steps=2, norm_a=2.0)
        client = alg.start_client(info, alg.payload(state), {})
        extras, _ = alg.client_finish(delta, st, client)
        up = ClientUpdate(0, delta, 1.0, 2, 2.0, 0.0, extras)

        # Execute
        state, _ = alg.aggregate(state, [up])
        xs.append(float(state["x"]))

    # Assert, in the code's gradient units (D = tau_eff Delta / ||a|| negated):
    # round 1: D = 0.2, v = D / 0.1 = 2,            x = 1 - 0.1 * 2 = 0.8
    # round 2: D = 0.1, v = 0.5 * 2 + 0.1 / 0.05 = 3, x = 0.8 - 0.05 * 3 = 0.65
    # (a buffer that ignored the lr change would give 0.8 - 0.2 = 0.6)
    assert xs == [pytest.approx(0.8, abs=1e-15), pytest.approx(0.65, abs=1e-15)]
    assert float(state["mom_lr"]) == 0.05


def test_server_momentum_converges_to_the_same_fixed_point():
    x = final_x("algorithm={name: fednova, gmf: 0.5}", "rounds=300")
    assert x == pytest.approx(0.875330176644, abs=1e-9)


# ----------------------------------------------------------------- FedNova-Prox
def test_fednova_prox_differs_from_fedprox_by_tau_over_norm_a():
    # Prepare: real proximal updates with equal steps
    d = Driver("client.solver=prox", "client.mu=0.1", "data.x0=0.3")
    ups = d.train({0: 5, 1: 5, 2: 5})
    tau, norm_a = 5, ups[0].norm_a
    assert norm_a == pytest.approx((1 - 0.99**5) / 0.01)
    x0 = {"x": d.x.clone(), "mom": torch.zeros_like(d.x)}
    # Execute
    prox_x = FedAvg().aggregate(x0, ups)[0]["x"]  # FedProx's server is FedAvg's
    nova_x = FedNova(tau_eff="steps").aggregate(x0, ups)[0]["x"]
    # Assert
    step_prox, step_nova = prox_x - d.x, nova_x - d.x
    torch.testing.assert_close(
        step_nova, step_prox * (tau / norm_a), rtol=1e-13, atol=0
    )


# ------------------------------------------------------------------ sampling
def test_sampling_weights_and_tau_eff_follow_the_recommendation():
    # Prepare: 2 of m = 4 clients, uniform scheme (ii): w = p_i m / q
    ups = [
        make_update(0, torch.tensor([1.0]), weight=0.1, tau=3, p_m=0.4),
        make_update(1, torch.tensor([2.0]), weight=0.3, tau=3, p_m=1.2),
    ]
    # Execute
    nova = FedNova(sampling="uniform")
    new_n, info = nova.aggregate(nova.init(torch.zeros(1), 4), ups)
    new_a, _ = FedAvg(sampling="uniform").aggregate({"x": torch.zeros(1)}, ups)
    # Assert: tau_eff = sum w ||a|| / sum w = 3; equal ||a||: FedNova == FedAvg
    assert info.tau_eff == pytest.approx(3.0)
    assert float(new_n["x"]) == pytest.approx(0.2 * 1 + 0.6 * 2)
    torch.testing.assert_close(new_n["x"], new_a["x"])
    assert info.chi2_pw == pytest.approx(0.0, abs=1e-15)


# ------------------------------------------------------------------ FedNova-VR
def _vr_update(i, delta_raw, norm_a, c, c_i, p, lr):
    corr = delta_raw - lr * norm_a * (c - c_i)  # Delta with g - c_i + c
    dc = (-corr / (lr * norm_a) - (c - c_i)) - c_i
    return ClientUpdate(
        i,
        corr,
        p,
        int(norm_a),
        norm_a,
        0.0,
        {"dc": dc, "p": torch.tensor(p, dtype=torch.float64)},
    )


def test_vr_corrections_cancel_under_full_participation():
    # Prepare: c = sum p_i c_i, raw deltas, and the corrected ones clients send
    gen = torch.Generator().manual_seed(1)
    p, lr, norms = [0.5, 0.3, 0.2], 0.1, [1.0, 5.0, 10.0]
    c_i = [torch.randn(3, dtype=torch.float64, generator=gen) for _ in p]
    c = sum(pi * ci for pi, ci in zip(p, c_i, strict=True))
    raw = [torch.randn(3, dtype=torch.float64, generator=gen) for _ in p]
    ups = [_vr_update(i, raw[i], norms[i], c, c_i[i], p[i], lr) for i in range(3)]
    plain = [
        ClientUpdate(i, raw[i], p[i], int(norms[i]), norms[i], 0.0) for i in range(3)
    ]
    vr, nova = FedNovaVR(), FedNova()
    state = {**vr.init(torch.zeros(3, dtype=torch.float64), 3), "c": c}
    # Execute
    new_vr, _ = vr.aggregate(state, ups)
    new_nova, _ = nova.aggregate(
        nova.init(torch.zeros(3, dtype=torch.float64), 3), plain
    )
    # Assert
    torch.testing.assert_close(new_vr["x"], new_nova["x"], rtol=0, atol=1e-14)


def test_vr_server_c_is_the_p_weighted_mean_of_client_c_i():
    d = Driver("algorithm={name: fednova_vr}")
    for taus in ({0: 1, 2: 10}, {1: 5}, {0: 3, 1: 2, 2: 7}, {2: 4}):
        d.round(taus)
        states = d.server.store.get(range(3))
        mean = sum(
            p * states[i].get("c", torch.zeros(1, dtype=torch.float64))
            for i, p in enumerate(P)
        )
        torch.testing.assert_close(d.state["c"], mean, rtol=0, atol=1e-14)


def test_vr_control_variate_is_the_raw_normalised_gradient():
    # One step, deterministic gradients: c_i^+ = grad F_i(x) = x - e_i
    d = Driver("algorithm={name: fednova_vr}", "data.x0=0.7")
    d.round({0: 1, 1: 1, 2: 1})
    x1 = float(d.x)
    d.round({0: 1, 1: 1, 2: 1})
    for i, st in d.server.store.get(range(3)).items():
        assert float(st["c"]) == pytest.approx(x1 - E[i], abs=1e-12)


def test_vr_removes_the_finite_lr_bias_on_the_quadratic():
    # heterogeneous steps (1, 5, 10): FedNova stops at 0.8753, FedNova-VR at x*
    rows, x = run(QUAD, "algorithm={name: fednova_vr}", "rounds=150")
    assert float(x) == pytest.approx(1.1, abs=1e-9)
    assert rows[-1]["chi2_pw"] == 0.0
