"""fedsim.flops: FLOPs per local step counted by hand for mlp and cnn, the
FLASH workloads' table, and speeds in FLOP/s that follow the model."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedsim.fleet import Fleet, FleetSpec
from fedsim.flops import flash_workload_flops, model_step_flops
from fedsim.presets import FLASH_STEP_FLOPS, FLASH_TRAIN_MS, TIERS
from fedsim.spec import ModelSpec


def dense_flops(widths: list[int], batch: int) -> int:
    """Dense layers widths[0] -> ... -> widths[-1] on a minibatch of B: a
    multiply-add (2 FLOPs) per weight and sample forward, as many for the
    weights' gradient, and as many for the inputs' gradient of every layer
    but the first (its input needs none)."""
    macs = [a * b for a, b in zip(widths[:-1], widths[1:], strict=True)]
    return 2 * batch * (2 * sum(macs) + sum(macs[1:]))


def test_mlp_flops_match_a_hand_count():
    # Prepare: 784 -> 200 -> 200 -> 10 (the mlp's default hidden layers)
    hand = dense_flops([784, 200, 200, 10], 20)
    assert hand == 17_584_000  # 2 * 20 * (2 * 198,800 + 42,000)

    # Execute / Assert
    assert model_step_flops(ModelSpec(name="mlp"), (784,), 10, 20) == hand
    wide = ModelSpec(name="mlp", hidden=[50])
    assert model_step_flops(wide, (30,), 4, 8) == dense_flops([30, 50, 4], 8)
    assert model_step_flops(ModelSpec(name="logreg"), (60,), 10, 20) == (
        dense_flops([60, 10], 20)
    )


def conv_macs(c_in: int, c_out: int, k: int, side: int) -> int:
    """Multiply-adds of a k x k convolution with a ``side`` x ``side`` output."""
    return side * side * c_out * c_in * k * k


def test_cnn_flops_match_a_hand_count():
    # Prepare: the FedAvg CNN on 1 x 28 x 28: conv5x5 1->32 (28 x 28 out),
    # pool, conv5x5 32->64 (14 x 14), pool, dense 3136 -> 512 -> 10
    layers = [
        conv_macs(1, 32, 5, 28),
        conv_macs(32, 64, 5, 14),
        7 * 7 * 64 * 512,
        512 * 10,
    ]
    b = 20
    hand = 2 * b * (2 * sum(layers) + sum(layers[1:]))
    assert hand == 1_447_690_240

    # Execute / Assert: pooling and ReLU cost nothing by the convention
    assert model_step_flops(ModelSpec(name="cnn"), (1, 28, 28), 10, b) == hand
    # linear in the batch size
    assert model_step_flops(ModelSpec(name="cnn"), (784,), 10, 2 * b) == 2 * hand


def test_flash_workload_table_is_the_count_of_leaf_models():
    # FEMNIST's CNN by hand: conv 32 and 64 ("same", 28 and 14 wide), dense
    # 3136 -> 2048 -> 62, batch 10
    layers = [
        conv_macs(1, 32, 5, 28),
        conv_macs(32, 64, 5, 14),
        3136 * 2048,
        2048 * 62,
    ]
    assert FLASH_STEP_FLOPS["femnist-cnn"] == 2 * 10 * (
        2 * sum(layers) + sum(layers[1:])
    )
    for workload in ("femnist-cnn", "celeba-cnn", "reddit-lstm"):
        assert flash_workload_flops(workload) == FLASH_STEP_FLOPS[workload]


@pytest.mark.slow
def test_flash_shakespeare_lstm_count():
    # 80 steps of two LSTM layers (the costliest count: about 3 s)
    assert (
        flash_workload_flops("shakespeare-lstm") == FLASH_STEP_FLOPS["shakespeare-lstm"]
    )


def flop_fleet(speed: dict, step_flops: float, count: int = 1) -> Fleet:
    spec = FleetSpec.model_validate(
        {"groups": [{"name": "g", "count": count, "speed": speed}]}
    )
    return Fleet.from_spec(spec, seed=0, step_flops=step_flops)


@pytest.mark.parametrize("workload", sorted(FLASH_TRAIN_MS))
def test_the_flops_preset_gives_back_the_steps_table_on_its_workload(workload):
    for tier, ms in zip(TIERS, FLASH_TRAIN_MS[workload], strict=True):
        # Prepare: the tier in FLOP/s, run with its own workload's model
        speed = {"preset": f"flash-phones-{tier}", "workload": workload}
        fleet = flop_fleet({**speed, "unit": "flops"}, FLASH_STEP_FLOPS[workload], 4000)
        steps = flop_fleet(speed, 1.0, 4000)

        # Assert: FLASH's measured steps/s (1000 / ms per batch) come back
        table = 1000.0 / ms
        assert np.median(fleet.speed) == pytest.approx(table, rel=0.05)
        # ... device by device, as the steps/s preset draws them
        np.testing.assert_allclose(fleet.speed, steps.speed, rtol=1e-12)


def test_ten_times_the_flops_gives_a_tenth_of_the_steps():
    # Prepare: two mlps whose FLOPs differ by exactly 10x (hidden 20 vs 200:
    # every layer's cost is linear in the hidden width)
    small = model_step_flops(ModelSpec(name="mlp", hidden=[20]), (100,), 10, 20)
    big = model_step_flops(ModelSpec(name="mlp", hidden=[200]), (100,), 10, 20)
    assert big == 10 * small
    speed = {"dist": "lognormal", "median_flops_per_s": 2.0e9, "sigma": 0.5}

    # Execute: the same devices (seed, normals) under each model
    fast, slow = flop_fleet(speed, small, 50), flop_fleet(speed, big, 50)

    # Assert: a tenth of the steps per second, so of the steps in a window
    np.testing.assert_allclose(slow.speed * 10, fast.speed, rtol=1e-12)
    window = 30.0
    ratio = np.floor(window * fast.speed) / np.floor(window * slow.speed)
    assert np.all(np.abs(ratio - 10) <= 10 / np.floor(window * slow.speed))
    assert math.isclose(float(np.median(fast.speed)), 2.0e9 / small, rel_tol=0.3)
