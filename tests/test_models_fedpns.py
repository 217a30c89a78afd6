"""FedPNS's CNN-M and the zero-initialised logistic regression."""

from __future__ import annotations

import math

import pytest
import torch

from fedsim.models import MODELS, batch_loss, build_model


def test_cnn_m_parameter_count_by_hand():
    # Prepare: 28x28x1 -> conv 5x5 (10) -> 24 -> pool 12 -> conv 5x5 (20) -> 8
    # -> pool 4: 20 * 4 * 4 = 320 features
    conv1 = 10 * 1 * 5 * 5 + 10  # 260
    conv2 = 20 * 10 * 5 * 5 + 20  # 5,020
    fc1 = 320 * 50 + 50  # 16,050
    fc2 = 50 * 10 + 10  # 510
    # Execute
    net = build_model(MODELS["cnn_m"](), 784, 10, 0, input_shape=(1, 28, 28))
    built = sum(p.numel() for p in net.parameters())
    formula = MODELS["cnn_m"]().param_count((1, 28, 28), 10)
    # Assert
    assert conv1 + conv2 + fc1 + fc2 == 21_840 == built == formula
    assert net(torch.zeros(3, 784)).shape == (3, 10)


def test_cnn_m_refuses_images_that_vanish():
    # 14x14: 10 -> 5 -> 1 -> 0 after the second pooling
    with pytest.raises(ValueError, match="too small"):
        MODELS["cnn_m"]().param_count((1, 14, 14), 10)


def test_zero_init_logreg_starts_at_zero_and_takes_the_closed_form_step():
    # Prepare: d = 2 features, 3 classes; zero weights give uniform softmax
    # p = 1/3, so dL/dW = (p - e_y) x^T and dL/db = p - e_y for one sample
    spec = MODELS["logreg"](zero_init=True, dtype="float64")
    net = build_model(spec, 2, 3, seed=0)
    x = torch.tensor([[1.0, 2.0]], dtype=torch.float64)
    y = torch.tensor([2])
    # Execute
    batch_loss(net, x, y).backward()
    w, b = (p for p in net.parameters())
    # Assert
    third = 1.0 / 3.0
    g = torch.tensor([third, third, third - 1.0], dtype=torch.float64)
    torch.testing.assert_close(w.grad, torch.outer(g, x[0]), rtol=0, atol=1e-15)
    torch.testing.assert_close(b.grad, g, rtol=0, atol=1e-15)
    assert float(batch_loss(net, x, y).detach()) == pytest.approx(math.log(3.0))
    assert all(float(p.abs().sum()) == 0 for p in net.parameters())


def test_default_logreg_init_is_unchanged():
    net = build_model(MODELS["logreg"](), 4, 2, seed=0)
    assert MODELS["logreg"]().zero_init is False
    assert any(float(p.abs().sum()) > 0 for p in net.parameters())
