"""fedsim.algorithms.weighting: tau_eff, FedNova normalisation and server
momentum, each against numbers computed by hand."""

from __future__ import annotations

import pytest
import torch

from fedsim.algorithms.base import ClientUpdate
from fedsim.algorithms.weighting import (
    effective_steps,
    momentum_buffer,
    normalizers,
    updates_tau_eff,
    uploaded_lr,
    weighted_steps,
)


def test_weighted_steps_is_the_unnormalised_weighted_sum():
    # Prepare: p = (0.2, 0.8), ||a|| = (5, 10)
    # Execute / Assert: 0.2 * 5 + 0.8 * 10 = 1 + 8 = 9
    assert weighted_steps([0.2, 0.8], [5.0, 10.0]) == pytest.approx(9.0)


def test_effective_steps_normalises_the_weights():
    # w = (1, 3) (unnormalised), ||a|| = (2, 6): (1*2 + 3*6) / 4 = 20 / 4 = 5
    assert effective_steps("fedavg", [1.0, 3.0], [2.0, 6.0], [4, 8]) == 5.0
    # steps tau = (4, 8): (1*4 + 3*8) / 4 = 28 / 4 = 7
    assert effective_steps("steps", [1.0, 3.0], [2.0, 6.0], [4, 8]) == 7.0
    assert effective_steps("fixed", [1.0, 3.0], [2.0, 6.0], [4, 8], 2.5) == 2.5


def test_effective_steps_rejects_fixed_without_value_and_unknown_kinds():
    with pytest.raises(ValueError, match="tau_eff_value"):
        effective_steps("fixed", [1.0], [1.0], [1])
    with pytest.raises(ValueError, match="unknown"):
        effective_steps("mean", [1.0], [1.0], [1])  # type: ignore[arg-type]


def test_updates_tau_eff_reads_norm_a_and_tau_from_updates():
    ups = [
        ClientUpdate(0, torch.zeros(1), 1.0, tau=3, norm_a=2.5, train_loss=0.0),
        ClientUpdate(1, torch.zeros(1), 1.0, tau=5, norm_a=4.5, train_loss=0.0),
    ]
    # equal weights: mean ||a|| = (2.5 + 4.5) / 2 = 3.5, mean tau = 4
    assert updates_tau_eff("fedavg", [1.0, 1.0], ups) == 3.5
    assert updates_tau_eff("steps", [1.0, 1.0], ups) == 4.0


def test_normalizers_divide_by_norm_a_and_refuse_a_client_without_steps():
    # FedNova: w_i / ||a_i|| = 0.5 / 2, 0.5 / 4
    assert normalizers([0.5, 0.5], [2.0, 4.0]) == [0.25, 0.125]
    # async: tau_eff / ||a_i|| with tau_eff = 3: 3 / 1.5, 3 / 6
    assert normalizers([3.0, 3.0], [1.5, 6.0]) == [2.0, 0.5]
    with pytest.raises(ValueError, match="a step"):
        normalizers([1.0], [0.0])


def test_momentum_buffer_two_steps_and_rescale():
    # beta = 0.5, steps 1 then 1: m1 = 0.5 * 0 + 1 = 1, m2 = 0.5 * 1 + 1 = 1.5
    m1 = momentum_buffer(torch.zeros(1), torch.ones(1), 0.5)
    m2 = momentum_buffer(m1, torch.ones(1), 0.5)
    assert m2.item() == 1.5
    # the lr halves between rounds: rescale 0.5, m2 = 0.5 * 0.5 * 1 + 1 = 1.25
    assert momentum_buffer(m1, torch.ones(1), 0.5, rescale=0.5).item() == 1.25


def test_momentum_buffer_with_unit_rescale_is_bit_identical():
    gen = torch.Generator().manual_seed(0)
    buf, step = torch.randn(50, generator=gen), torch.randn(50, generator=gen)
    assert torch.equal(momentum_buffer(buf, step, 0.9), 0.9 * buf + step)


def test_uploaded_lr():
    u = ClientUpdate(0, torch.zeros(1), 1.0, 1, 1.0, 0.0, {"lr": torch.tensor(0.25)})
    assert uploaded_lr(u) == 0.25
    assert uploaded_lr(ClientUpdate(0, torch.zeros(1), 1.0, 1, 1.0, 0.0)) is None
