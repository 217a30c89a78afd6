"""fedsim.flops: FLOPs per local step counted by hand for mlp and cnn, the
FLASH workloads' table, and speeds in FLOP/s that follow the model."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedsim.fleet import Fleet, FleetSpec
from fedsim.flops import flash_workload_flops, model_step_flops
from fedsim.models import CNN, MLP, LogReg
from fedsim.presets import FLASH_STEP_FLOPS, FLASH_TRAIN_MS, TIERS

from .conftest import SCENARIOS, fedsim_here


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
    assert model_step_flops(MLP(), (784,), 10, 20) == hand
    wide = MLP(hidden=[50])
    assert model_step_flops(wide, (30,), 4, 8) == dense_flops([30, 50, 4], 8)
    assert model_step_flops(LogReg(), (60,), 10, 20) == (dense_flops([60, 10], 20))


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
    assert model_step_flops(CNN(), (1, 28, 28), 10, b) == hand
    # linear in the batch size
    assert model_step_flops(CNN(), (784,), 10, 2 * b) == 2 * hand


def test_the_count_follows_the_batch_size_alone():
    # The count is cached: the same model and sample shape at another batch
    # size is another count (the test above changes the input shape with
    # the batch, so a cache key without the batch size would pass it).
    # Prepare: an mlp whose count no other test asks for
    wide = MLP(hidden=[24])
    first = model_step_flops(wide, (40,), 5, 10)

    # Execute / Assert: the same section and shape at batch 30, then 10 again
    assert first == dense_flops([40, 24, 5], 10)
    assert model_step_flops(wide, (40,), 5, 30) == 3 * first
    assert model_step_flops(wide, (40,), 5, 10) == first


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
    small = model_step_flops(MLP(hidden=[20]), (100,), 10, 20)
    big = model_step_flops(MLP(hidden=[200]), (100,), 10, 20)
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


# ------------------------------------------------------- in runs and the CLI
FLOP_SPEED = "{dist: fixed, flops_per_s: 1.2e6}"


def flop_run(hidden: int):
    """quickstart, every group at 1.2 MFLOP/s, no stragglers, an mlp."""
    from fedsim.runtime import run_scenario
    from fedsim.scenario import load_scenario

    over = [
        "rounds=2",
        "eval.every_rounds=2",
        f"model={{name: mlp, hidden: [{hidden}]}}",
    ]
    for g in range(3):
        over += [f"fleet.groups[{g}].speed={FLOP_SPEED}"]
        over += [f"fleet.groups[{g}].stragglers=null"]
    return run_scenario(load_scenario(SCENARIOS / "quickstart.yaml", over))


def test_a_run_in_flops_makes_the_steps_its_model_allows():
    # Prepare: 60 features -> hidden -> 10 classes, batch 20; 20 vs 200 wide
    small_f = dense_flops([60, 20, 10], 20)
    assert small_f == 120_000  # so 1.2 MFLOP/s is 10 steps/s

    # Execute
    small, big = flop_run(20), flop_run(200)

    # Assert: the count is stored, and a tenth of the steps in the window
    assert small.summary()["compute"] == {
        "flops_per_step": small_f,
        "batch_size": 20,
        "groups": {
            g: {"median_flops_per_s": 1.2e6, "median_steps_per_s": 10.0}
            for g in ("low-end-phones", "mid-range-phones", "high-end-phones")
        },
    }
    assert big.summary()["compute"]["flops_per_step"] == 10 * small_f
    tau = {(c["round"], c["client_id"]): c["tau"] for c in small.clients}
    pairs = [(tau[c["round"], c["client_id"]], c["tau"]) for c in big.clients]
    assert len(pairs) == 20 and all(s > 50 for s, _ in pairs)
    # the window less each transfer, at 10 and at 1 step/s (the bigger
    # model's transfers take a little longer)
    assert all(abs(s - 10 * b) < 10 for s, b in pairs), pairs


def test_validate_prints_the_count_and_each_groups_steps(tmp_path):
    # Execute: the FLASH phones in FLOP/s, with the mlp (cheap to count)
    res = fedsim_here(
        "validate", str(SCENARIOS / "fleets" / "phones-flops.yaml"),
        "--set", "model.name=mlp", check=True,
    )  # fmt: skip

    # Assert: 784 -> 200 -> 200 -> 10 at batch 20, and the tiers' medians
    count = dense_flops([784, 200, 200, 10], 20)
    assert f"model: {count:,} FLOPs per local step" in res.stderr
    low = FLASH_STEP_FLOPS["femnist-cnn"] * 1000 / FLASH_TRAIN_MS["femnist-cnn"][0]
    assert f"low-end: median {low:.4g} FLOP/s = {low / count:.4g} local steps/s" in (
        res.stderr
    )


@pytest.mark.parametrize(
    "speed, field",
    [
        ("{dist: lognormal, median_steps_per_s: 2, median_flops_per_s: 1e9}", "both"),
        ("{dist: lognormal, median_flops_per_s: -2e9}", "median_flops_per_s"),
        ("{dist: fixed, flops_per_s: 0}", "flops_per_s"),
        ("{preset: flash-phones-mid, unit: flops, median_steps_per_s: 2}", "both"),
        ("{dist: fixed, steps_per_s: 2, unit: flops}", "unit goes with a preset"),
    ],
)
def test_bad_flop_speeds_are_refused_naming_the_field(speed, field, tmp_path):
    # Prepare: the speed in a scenario file (not --set: the file's own error)
    text = (SCENARIOS / "quickstart.yaml").read_text()
    old = "speed: {dist: lognormal, median_steps_per_s: 2.0, sigma: 0.5}"
    assert old in text
    path = tmp_path / "bad.yaml"
    path.write_text(text.replace(old, f"speed: {speed}"))

    # Execute
    res = fedsim_here("validate", str(path))

    # Assert: exit 2, no traceback, the group's speed and the field named
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "fleet.groups[0].speed" in res.stderr
    if field == "both":
        assert "median_steps_per_s and median_flops_per_s are both given" in res.stderr
    else:
        assert field in res.stderr


class _Stated(MLP):
    """An mlp that states its own forward FLOPs per sample (Model.flops)."""

    def flops(self, input_shape: tuple[int, ...], num_classes: int) -> int | None:
        return 1000


def test_a_model_stating_its_forward_flops_is_charged_three_forward_passes():
    # Prepare / Execute: 1000 forward FLOPs a sample, batch 20
    counted = model_step_flops(_Stated(), (100,), 10, 20)

    # Assert: forward plus a backward of twice its cost, for each of 20 samples
    assert counted == 3 * 20 * 1000
