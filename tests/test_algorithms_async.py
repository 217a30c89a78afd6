"""FedAsync's client half: the worker's proximal term (Xie et al., Algorithm 1),
computed by hand."""

from __future__ import annotations

import pytest
import torch

from fedsim.algorithms.base import ClientInfo
from fedsim.algorithms.fedasync import FedAsync
from fedsim.scenario import ClientSpec
from fedsim.solvers import Prox

F64 = torch.float64


def _local_update(alg: FedAsync, x_tau: float, target: float, lr: float, steps: int):
    """``steps`` local steps of the algorithm's client half on f(x) = (x - target)^2 / 2
    from the downloaded model ``x_tau``; returns (x, solver state)."""
    solver = alg.solver(ClientSpec(lr=lr))
    info = ClientInfo(client=0, n_samples=1, num_clients=1, relative_weight=1.0)
    client = alg.start_client(info, {"x": torch.tensor([x_tau], dtype=F64)}, {})
    theta = client.payload["x"].clone()
    st = solver.begin(client.payload["x"])
    for _ in range(steps):
        grad = theta - target
        alg.grad_hook(theta, grad, client)
        solver.step(theta, grad, st)
    return theta, st


def test_fedasync_worker_minimises_the_proximal_objective_by_hand():
    # Prepare: x_tau = 1, f(x) = (x - 3)^2 / 2, lr = 0.1, rho = 0.5
    alg = FedAsync(rho=0.5)

    # Execute: two local steps
    theta, st = _local_update(alg, x_tau=1.0, target=3.0, lr=0.1, steps=2)

    # Assert: step 1 at x = 1: g = -2 + 0.5 (1 - 1) = -2       -> x = 1.2
    #         step 2 at 1.2:  g = -1.8 + 0.5 (1.2 - 1) = -1.7 -> x = 1.37
    assert float(theta) == pytest.approx(1.37, abs=1e-12)
    # ||a||_1 of proximal SGD, alpha = lr rho = 0.05: 1 + (1 - 0.05) = 1.95
    assert st.norm_a == pytest.approx(1.95, abs=1e-12)


def test_fedasync_rho_zero_is_plain_sgd():
    theta, st = _local_update(FedAsync(rho=0.0), 1.0, 3.0, lr=0.1, steps=2)
    # x = 1 + 0.1 * 2 = 1.2, then 1.2 + 0.1 * 1.8 = 1.38; ||a||_1 = 2
    assert float(theta) == pytest.approx(1.38, abs=1e-12)
    assert st.norm_a == 2.0


def test_fedasync_default_rho_is_the_papers_and_uses_the_prox_solver():
    alg = FedAsync()
    assert alg.rho == 0.005
    solver = alg.solver(ClientSpec(lr=0.1))
    assert isinstance(solver, Prox) and solver.mu == 0.005


def test_fedasync_rho_with_momentum_is_refused():
    with pytest.raises(ValueError, match="no derived"):
        FedAsync().solver(ClientSpec(lr=0.1, solver="momentum"))
