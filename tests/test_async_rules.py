"""FedAsync and FedBuff server rules: hand-computed cases."""

from __future__ import annotations

import pytest
import torch

from fedsim.algorithms import REGISTRY
from fedsim.algorithms.base import ClientUpdate
from fedsim.algorithms.fedasync import FedAsync, staleness_weight
from fedsim.algorithms.fedbuff import FedBuff


def up(client, delta, tau=2, norm_a=None, weight=1.0):
    d = torch.tensor(delta, dtype=torch.float64)
    return ClientUpdate(
        client, d, weight, tau, float(tau if norm_a is None else norm_a), 0.0
    )


def x(*v):
    return torch.tensor(v, dtype=torch.float64)


@pytest.mark.parametrize(
    ("kind", "s", "expected"),
    [
        ("constant", 0, 1.0),
        ("constant", 9, 1.0),
        ("polynomial", 0, 1.0),
        ("polynomial", 3, 0.5),  # (1 + 3)^-0.5
        ("polynomial", 8, 1 / 3),  # (1 + 8)^-0.5
        ("hinge", 4, 1.0),  # s <= b
        ("hinge", 5, 1 / 11),  # 1 / (10 (5 - 4) + 1)
    ],
)
def test_staleness_functions(kind, s, expected):
    assert staleness_weight(kind, s, a=0.5 if kind == "polynomial" else 10, b=4) == (
        pytest.approx(expected)
    )


def test_staleness_must_be_non_negative():
    with pytest.raises(ValueError):
        staleness_weight("constant", -1)


def test_fedasync_mixes_the_client_model_built_on_its_start_version():
    # Prepare: server at x = 1; the client started from x_start = 0 and moved
    # by Delta = 2, so its model is 2; staleness 3 -> a = 0.8 * 0.5 = 0.4
    alg = FedAsync(alpha=0.8)
    state = alg.init(x(1.0), 4)

    # Execute
    new, info = alg.aggregate_async(state, [up(0, [2.0])], [3], [x(0.0)])

    # Assert: (1 - 0.4) * 1 + 0.4 * 2
    assert float(new["x"]) == pytest.approx(1.4)
    assert info.per_update == (1.0,) and info.chi2_pw == 0.0
    assert float(new["count"]) == 1.0 and float(new["norm_a_sum"]) == 2.0


def test_fedasync_normalize_scales_by_the_running_mean_of_norm_a():
    # Prepare: two updates in turn; ||a|| = 2 then 6 -> running means 2, 4
    alg = FedAsync(alpha=0.5, staleness="constant", normalize=True)
    state = alg.init(x(0.0), 4)

    # Execute
    s1, _ = alg.aggregate_async(state, [up(0, [2.0], tau=2)], [0], [x(0.0)])
    s2, info = alg.aggregate_async(s1, [up(1, [6.0], tau=6)], [0], [s1["x"]])

    # Assert: 0.5 * (0 + 2 * 2/2) = 1; then 1 + 0.5 * (1 + 6 * 4/6 - 1) = 3
    assert float(s1["x"]) == pytest.approx(1.0)
    assert float(s2["x"]) == pytest.approx(3.0)
    assert info.tau_eff == pytest.approx(4.0)


def test_fedasync_synchronous_round_mixes_the_weighted_mean():
    alg = FedAsync(alpha=0.5)
    ups = [up(0, [1.0], weight=1.0), up(1, [4.0], weight=3.0)]
    new, info = alg.aggregate(alg.init(x(0.0), 2), ups)
    # x <- 0.5 * 0 + 0.5 * (0.25 * 1 + 0.75 * 4)
    assert float(new["x"]) == pytest.approx(1.625)
    assert info.weights == pytest.approx({0: 0.25, 1: 0.75})


def test_fedasync_rejects_server_lr_and_fixed_without_value():
    with pytest.raises(ValueError, match="alpha"):
        FedAsync(server_lr=0.5)
    with pytest.raises(ValueError, match="tau_eff_value"):
        FedAsync(tau_eff="fixed")


def test_fedbuff_averages_the_staleness_weighted_buffer():
    # Prepare: K = 3; staleness 0, 3, 8 -> S = 1, 1/2, 1/3; server_lr 0.5
    alg = FedBuff(buffer_size=3, server_lr=0.5)
    ups = [up(0, [3.0]), up(1, [6.0]), up(2, [9.0])]

    # Execute
    new, info = alg.aggregate_async({"x": x(1.0)}, ups, [0, 3, 8], [x(0.0)] * 3)

    # Assert: 1 + 0.5 * (3 + 3 + 3) / 3
    assert float(new["x"]) == pytest.approx(2.5)
    assert info.per_update == pytest.approx((6 / 11, 3 / 11, 2 / 11))


def test_fedbuff_normalize_is_fednova_on_the_buffer():
    # ||a|| = 1 and 3: Delta / ||a|| = 2 and 2, tau_eff = mean ||a|| = 2
    alg = FedBuff(buffer_size=2, staleness="constant", normalize=True)
    ups = [up(0, [2.0], tau=1), up(1, [6.0], tau=3)]
    new, info = alg.aggregate_async({"x": x(0.0)}, ups, [0, 0], [x(0.0)] * 2)
    assert float(new["x"]) == pytest.approx(4.0)  # 2 * (2 + 2) / 2
    assert info.tau_eff == pytest.approx(2.0) and info.chi2_pw == pytest.approx(0.0)
    fixed = FedBuff(normalize=True, tau_eff="fixed", tau_eff_value=5.0)
    new, _ = fixed.aggregate_async({"x": x(0.0)}, ups, [0, 0], [x(0.0)] * 2)
    assert float(new["x"]) == pytest.approx(10.0)


def test_fedbuff_counts_a_device_twice_in_one_buffer():
    alg = FedBuff(buffer_size=2, staleness="constant")
    ups = [up(4, [1.0]), up(4, [3.0])]
    new, info = alg.aggregate_async({"x": x(0.0)}, ups, [0, 0], [x(0.0)] * 2)
    assert float(new["x"]) == pytest.approx(2.0)
    assert info.weights == pytest.approx({4: 1.0})
    assert info.per_update == pytest.approx((0.5, 0.5))


def test_both_are_registered_and_pickle():
    import pickle

    for name, cls in (("fedasync", FedAsync), ("fedbuff", FedBuff)):
        assert REGISTRY[name] is cls
        alg = cls()
        assert pickle.loads(pickle.dumps(alg)) == alg
    assert FedAsync.buffer_size == 1 and FedBuff().buffer_size == 10
