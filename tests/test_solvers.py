"""Local solvers: ||a||_1 from the FedNova code's recursion (docs/algorithms.md 5.3)
against the closed forms of 5.2, and Delta = -lr G a for the accumulation
vectors a of 5.2."""

from __future__ import annotations

import pytest
import torch

from fedsim.scenario import ClientSpec
from fedsim.solvers import SGD, Decay, Momentum, Prox, make_solver

TAUS = [1, 2, 5, 10]


def run_solver(solver: SGD, grads: list[torch.Tensor], x0: torch.Tensor):
    """Apply the solver to a fixed gradient sequence; return (x, state)."""
    x = x0.clone()
    st = solver.begin(x0)
    for g in grads:
        solver.step(x, g, st)
    return x, st


def accumulation(solver: SGD, tau: int) -> list[float]:
    """a_k, oldest gradient first (docs/algorithms.md 5.2)."""
    if isinstance(solver, Momentum):
        r = solver.rho
        return [(1 - r ** (tau - k)) / (1 - r) for k in range(tau)]
    if isinstance(solver, Prox):
        a = solver.lr * solver.mu
        return [(1 - a) ** (tau - 1 - k) for k in range(tau)]
    if isinstance(solver, Decay):
        return [solver.gamma**k for k in range(tau)]
    return [1.0] * tau


SOLVERS = [
    SGD(lr=0.1),
    Momentum(lr=0.01, rho=0.9),
    Momentum(lr=0.05, rho=0.5),
    Prox(lr=0.1, mu=0.1),
    Prox(lr=0.1, mu=1.0),
    Decay(lr=0.1, gamma=0.9),
    Decay(lr=0.2, gamma=0.5),
]


@pytest.mark.parametrize("solver", SOLVERS, ids=repr)
@pytest.mark.parametrize("tau", TAUS)
def test_recursion_matches_closed_form_and_accumulation_vector(solver, tau):
    # Prepare: tau fixed gradients (independent of x, so G is known)
    gen = torch.Generator().manual_seed(tau)
    grads = [torch.randn(4, dtype=torch.float64, generator=gen) for _ in range(tau)]
    x0 = torch.randn(4, dtype=torch.float64, generator=gen)
    # Execute
    x, st = run_solver(solver, grads, x0)
    # Assert: the recursion, the closed form and sum(a) agree ...
    a = accumulation(solver, tau)
    assert st.norm_a == pytest.approx(solver.norm_a(tau), rel=1e-12)
    assert st.norm_a == pytest.approx(sum(a), rel=1e-12)
    assert st.steps == tau and st.lr == solver.lr
    # ... and Delta = -lr G a
    expected = -solver.lr * sum(ak * g for ak, g in zip(a, grads, strict=True))
    torch.testing.assert_close(x - x0, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    ("tau", "norm"), [(1, 1.0), (2, 2.9), (5, 13.1441), (10, 41.381059609)]
)
def test_momentum_reference_values(tau, norm):
    m = Momentum(lr=0.01, rho=0.9)
    _, st = run_solver(m, [torch.ones(1)] * tau, torch.zeros(1))
    assert st.norm_a == pytest.approx(norm, abs=1e-9)
    assert m.norm_a(tau) == pytest.approx(norm, abs=1e-9)
    # closed form [tau - rho (1 - rho^tau) / (1 - rho)] / (1 - rho)
    assert (tau - 0.9 * (1 - 0.9**tau) / 0.1) / 0.1 == pytest.approx(norm, abs=1e-9)


@pytest.mark.parametrize("alpha", [0.0, 0.01, 0.1, 0.5, 1.0])
def test_prox_norm_against_recursion(alpha):
    s = 0.0
    for tau in range(1, 12):
        s = (1 - alpha) * s + 1.0  # the code's recursion s <- (1 - alpha) s + 1
        p = Prox(lr=0.1, mu=alpha / 0.1)
        assert p.norm_a(tau) == pytest.approx(s, rel=1e-12)
        expected = tau if alpha == 0 else (1 - (1 - alpha) ** tau) / alpha
        assert s == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("gamma", [0.5, 0.9, 0.99])
def test_decay_closed_form(gamma):
    d = Decay(lr=0.1, gamma=gamma)
    for tau in TAUS:
        assert d.norm_a(tau) == pytest.approx((1 - gamma**tau) / (1 - gamma))


def test_decay_with_gamma_one_is_sgd_bit_for_bit():
    gen = torch.Generator().manual_seed(0)
    grads = [torch.randn(5, generator=gen) for _ in range(7)]
    x0 = torch.randn(5, generator=gen)
    xs, ss = run_solver(SGD(lr=0.1), grads, x0)
    xd, sd = run_solver(Decay(lr=0.1, gamma=1.0), grads, x0)
    assert torch.equal(xs, xd) and ss.norm_a == sd.norm_a == 7.0


def test_proximal_term_has_zero_gradient_at_step_zero():
    # Prepare: x = x0, so mu (x - x0) = 0
    g = torch.tensor([0.3, -1.2, 2.0])
    x0 = torch.tensor([1.0, 2.0, 3.0])
    # Execute: one step of each
    xp, _ = run_solver(Prox(lr=0.1, mu=5.0), [g], x0)
    xs, _ = run_solver(SGD(lr=0.1), [g], x0)
    # Assert
    assert torch.equal(xp, xs)


def test_momentum_buffer_starts_empty_every_round():
    m = Momentum(lr=0.1, rho=0.9)
    x0 = torch.zeros(2)
    first, st1 = run_solver(m, [torch.ones(2)] * 3, x0)
    again, st2 = run_solver(m, [torch.ones(2)] * 3, x0)  # a new round
    assert torch.equal(first, again)
    fresh = m.begin(x0)
    assert fresh.buf is None and fresh.norm_a == 0.0 and fresh.counter == 0.0
    assert st1.norm_a == st2.norm_a == pytest.approx(m.norm_a(3))


def test_weight_decay_is_coupled_into_the_gradient():
    x0 = torch.tensor([2.0])
    x, _ = run_solver(SGD(lr=0.1, weight_decay=0.5), [torch.tensor([1.0])], x0)
    assert float(x) == pytest.approx(2.0 - 0.1 * (1.0 + 0.5 * 2.0))


@pytest.mark.parametrize(
    ("fields", "cls", "attrs"),
    [
        ({"solver": "sgd"}, SGD, {}),
        ({"solver": "momentum", "momentum": 0.8}, Momentum, {"rho": 0.8}),
        ({"solver": "prox", "mu": 0.2}, Prox, {"mu": 0.2}),
        ({"solver": "decay", "step_decay": 0.95}, Decay, {"gamma": 0.95}),
    ],
)
def test_make_solver_builds_each_solver(fields, cls, attrs):
    spec = ClientSpec(lr=0.03, weight_decay=1e-4, **fields)
    s = make_solver(spec)
    assert type(s) is cls and s.lr == 0.03 and s.weight_decay == 1e-4
    for k, v in attrs.items():
        assert getattr(s, k) == v


def test_make_solver_fedprox_mu_forces_prox_and_refuses_undefined_mixes():
    assert type(make_solver(ClientSpec(), mu=0.1)) is Prox
    assert type(make_solver(ClientSpec(), mu=0.0)) is SGD  # mu = 0: plain solver
    for solver in ("momentum", "decay"):
        with pytest.raises(ValueError, match="no derived"):
            make_solver(ClientSpec(solver=solver), mu=0.1)


def test_a_stacked_rule_with_its_own_step_rows_is_not_fused_as_plain_sgd():
    """batched.py fuses a ``plain`` rule's step into the backward pass as
    x <- x - lr_at(s) g: a subclass that writes its own ``step_rows`` must
    not inherit SGD's ``plain``; one that keeps SGD's may."""
    from dataclasses import dataclass
    from typing import ClassVar

    @dataclass(frozen=True)
    class Halved(SGD):
        stacks: ClassVar[bool] = True

        def step_rows(self, s, theta, g, x0, buf):
            theta.add_(g, alpha=-self.lr / 2)

    @dataclass(frozen=True)
    class Scheduled(SGD):
        stacks: ClassVar[bool] = True

        def lr_at(self, s):
            return self.lr / (s + 1)

    assert not Halved.plain and Scheduled.plain
    assert [c.plain for c in (SGD, Momentum, Prox, Decay)] == [True, False, False, True]
