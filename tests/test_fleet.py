"""Tests for fedsim.fleet: drawing devices, links, availability, stragglers."""

from __future__ import annotations

import pickle
import re
import tracemalloc

import numpy as np
import pytest

from fedsim.fleet import AvailabilitySpec, Fleet, FleetSpec, SlowdownSpec, speed_spec


def group(name: str = "g", count: int = 10, **kw: object) -> dict:
    g: dict = {"name": name, "count": count}
    g["speed"] = kw.pop("speed", {"dist": "fixed", "steps_per_s": 4.0})
    g.update(kw)
    return g


def spec(*groups: dict) -> FleetSpec:
    return FleetSpec.model_validate({"groups": list(groups)})


ON_OFF = {"kind": "on_off", "mean_on_s": 60.0, "mean_off_s": 30.0}


def direct_fleet(p: list[float], slowdown: SlowdownSpec) -> Fleet:
    """A one-group fleet built field by field (as tests of other modules may)."""
    m = len(p)
    return Fleet(
        group=np.zeros(m, dtype=np.int32),
        group_names=("g",),
        speed=np.full(m, 4.0),
        down_bps=np.full(m, 8e6),
        up_bps=np.full(m, 8e6),
        latency_s=np.zeros(m),
        straggler_p=np.array(p),
        slowdowns=(slowdown,),
        availability=(AvailabilitySpec(),),
        seed=0,
    )


# ------------------------------------------------------------------ drawing
def test_devices_are_numbered_in_group_order():
    # Prepare
    s = spec(
        group("a", 2, speed={"dist": "fixed", "steps_per_s": 3.0}),
        group("b", 3, speed={"dist": "fixed", "steps_per_s": 5.0}),
    )

    # Execute
    fleet = Fleet.from_spec(s, seed=0)

    # Assert
    assert fleet.size == 5
    assert fleet.group.tolist() == [0, 0, 1, 1, 1]
    assert fleet.group.dtype == np.int32
    assert fleet.group_names == ("a", "b")
    assert fleet.speed.tolist() == [3.0, 3.0, 5.0, 5.0, 5.0]


def test_from_spec_is_deterministic_per_seed_and_differs_across_seeds():
    # Prepare
    s = spec(
        group(
            count=200,
            speed={"dist": "lognormal", "median_steps_per_s": 4.0, "sigma": 0.5},
            availability=ON_OFF,
        )
    )

    # Execute
    a, b, c = (Fleet.from_spec(s, seed) for seed in (7, 7, 8))

    # Assert
    np.testing.assert_array_equal(a.speed, b.speed)
    np.testing.assert_array_equal(a.online(500.0), b.online(500.0))
    assert not np.array_equal(a.speed, c.speed)
    assert not np.array_equal(a.online(500.0), c.online(500.0))


def test_lognormal_speed_median():
    # Prepare
    s = spec(
        group(
            count=10_000,
            speed={"dist": "lognormal", "median_steps_per_s": 4.0, "sigma": 0.5},
        )
    )

    # Execute
    fleet = Fleet.from_spec(s, seed=1)

    # Assert: the median of 10k draws is within ~2% (its sd is about 0.6%)
    assert np.median(fleet.speed) == pytest.approx(4.0, rel=0.03)
    assert np.std(np.log(fleet.speed)) == pytest.approx(0.5, rel=0.05)


def test_arrays_are_read_only():
    # Prepare
    fleet = Fleet.from_spec(spec(group()), seed=0)

    # Execute / Assert
    with pytest.raises(ValueError):
        fleet.speed[0] = 1.0


def test_direct_construction_checks_shapes():
    # Prepare
    good = direct_fleet([0.0, 0.0], SlowdownSpec())

    # Execute / Assert
    with pytest.raises(ValueError, match="speed"):
        Fleet(**{**_fields(good), "speed": np.ones(3)})
    with pytest.raises(ValueError, match="group"):
        Fleet(**{**_fields(good), "group": np.array([0, 1], dtype=np.int32)})


def _fields(fleet: Fleet) -> dict:
    names = (
        "group group_names speed down_bps up_bps latency_s straggler_p "
        "slowdowns availability seed"
    ).split()
    return {n: getattr(fleet, n) for n in names}


# ------------------------------------------------------------------ network
def test_comm_time_hand_computed():
    # Prepare: 1e6 bytes = 8e6 bits; at 8 Mbit/s that is 1 s, at 2 Mbit/s 4 s
    fleet = Fleet.from_spec(
        spec(group(count=2, network={"down_mbps": 8, "up_mbps": 2, "latency_s": 0.1})),
        seed=0,
    )

    # Execute
    down, up = fleet.comm_time(np.array([1, 0]), bytes_down=1_000_000, bytes_up=500_000)

    # Assert: down = 1 s + 0.1 s; up = 4e6 bits / 2e6 bit/s + 0.1 s
    np.testing.assert_allclose(down, [1.1, 1.1])
    np.testing.assert_allclose(up, [2.1, 2.1])


# -------------------------------------------------------------- availability
def test_always_on_devices():
    # Prepare
    fleet = Fleet.from_spec(spec(group(count=4)), seed=0)

    # Execute / Assert
    assert fleet.online(123.0).all()
    assert np.isinf(fleet.offline_time(np.arange(4), 50.0)).all()
    assert fleet.next_online_time(77.0) == 77.0


def test_on_off_long_run_fraction_online():
    # Prepare: mean on 60 s, mean off 30 s -> online 2/3 of the time
    fleet = Fleet.from_spec(spec(group(count=2000, availability=ON_OFF)), seed=3)
    times = np.arange(0.0, 6000.0, 37.0)

    # Execute
    fraction = np.mean([fleet.online(t).mean() for t in times])

    # Assert
    assert fraction == pytest.approx(2 / 3, abs=0.02)


def test_on_off_starts_in_the_stationary_state():
    # Prepare
    fleet = Fleet.from_spec(spec(group(count=20_000, availability=ON_OFF)), seed=4)

    # Execute
    at_zero = fleet.online(0.0).mean()

    # Assert
    assert at_zero == pytest.approx(2 / 3, abs=0.015)


def test_online_is_a_pure_function_of_time():
    # Prepare: three fleets from the same spec and seed
    s = spec(
        group("a", 300, availability=ON_OFF),
        group(
            "b", 200, availability={"kind": "on_off", "mean_on_s": 5, "mean_off_s": 7}
        ),
        group("c", 50),
    )
    stepped, direct, rewound = (Fleet.from_spec(s, seed=11) for _ in range(3))

    # Execute: many small increasing steps / one query / a query from the future
    for t in np.arange(0.0, 1000.0, 3.3):
        stepped.online(t)
    rewound.online(5000.0)

    # Assert
    expected = direct.online(1000.0)
    np.testing.assert_array_equal(stepped.online(1000.0), expected)
    np.testing.assert_array_equal(rewound.online(1000.0), expected)
    np.testing.assert_array_equal(
        stepped.offline_time(np.arange(500), 1000.0),
        direct.offline_time(np.arange(500), 1000.0),
    )


def test_offline_time_is_consistent_with_online():
    # Prepare
    fleet = Fleet.from_spec(spec(group(count=60, availability=ON_OFF)), seed=5)
    t = 250.0
    on_now = fleet.online(t)
    devices = np.flatnonzero(on_now)
    assert devices.size > 10

    # Execute
    off = fleet.offline_time(devices, t)

    # Assert: online on [t, off), offline at off
    assert (off > t).all() and np.isfinite(off).all()
    for d, t_off in zip(devices, off, strict=True):
        assert fleet.online(np.nextafter(t_off, -np.inf))[d]
        assert not fleet.online(t_off)[d]
    offline_now = np.flatnonzero(~on_now)
    np.testing.assert_array_equal(fleet.offline_time(offline_now, t), t)


def test_next_online_time():
    # Prepare: rarely-online devices, and a time at which all are offline
    rare = {"kind": "on_off", "mean_on_s": 1.0, "mean_off_s": 100.0}
    fleet = Fleet.from_spec(spec(group(count=3, availability=rare)), seed=2)
    t = next(t for t in np.arange(0.0, 1000.0, 1.0) if not fleet.online(t).any())

    # Execute
    t_on = fleet.next_online_time(t)

    # Assert
    assert t_on > t
    assert fleet.online(t_on).any()
    assert not fleet.online(np.nextafter(t_on, -np.inf)).any()
    assert fleet.next_online_time(t_on) == t_on


def test_non_finite_time_is_rejected():
    fleet = Fleet.from_spec(spec(group(availability=ON_OFF)), seed=0)
    with pytest.raises(ValueError, match="finite"):
        fleet.online(np.inf)


def test_pickle_keeps_answers():
    # Prepare
    fleet = Fleet.from_spec(spec(group(count=100, availability=ON_OFF)), seed=9)
    before = fleet.online(400.0)

    # Execute
    copy = pickle.loads(pickle.dumps(fleet))

    # Assert
    np.testing.assert_array_equal(copy.online(400.0), before)
    np.testing.assert_array_equal(copy.speed, fleet.speed)


def million_device_spec():
    return spec(
        group("slow", 500_000, availability=ON_OFF),
        group("fast", 500_000, availability={"kind": "on_off", "mean_on_s": 600}),
    )


def test_million_device_fleet_is_right_and_small():
    # Prepare
    s = million_device_spec()
    tracemalloc.start()

    # Execute
    fleet = Fleet.from_spec(s, seed=0)
    fractions = [fleet.online(t).mean() for t in (0.0, 10.0, 60.0, 600.0, 3600.0)]
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()

    # Assert: online 2/3 and 1/(1 + 1800/600) = 1/4, half the fleet each
    assert fractions == pytest.approx([(2 / 3 + 1 / 4) / 2] * 5, abs=0.01)
    assert peak < 1e9


# --------------------------------------------------------------- stragglers
def test_slowdowns_fixed_and_none():
    # Prepare
    fleet = direct_fleet([1.0, 0.0, 1.0], SlowdownSpec(dist="fixed", factor=4.0))

    # Execute
    factors = fleet.draw_slowdowns(np.array([0, 1, 2]), np.full((3, 2), 0.5))

    # Assert
    assert factors.tolist() == [4.0, 1.0, 4.0]


@pytest.mark.parametrize(
    "slowdown",
    [
        SlowdownSpec(dist="uniform", low=2.0, high=3.0),
        SlowdownSpec(dist="pareto", shape=2.0),
    ],
)
def test_slowdown_distributions(slowdown: SlowdownSpec):
    # Prepare
    fleet = direct_fleet([1.0] * 20_000, slowdown)

    # Execute
    f = fleet.draw_slowdowns(
        np.arange(20_000), fleet.round_draws(np.arange(20_000), 0).slowdown
    )

    # Assert
    assert (f >= 1.0).all()
    if slowdown.dist == "uniform":
        assert f.min() >= 2.0 and f.max() <= 3.0
        assert f.mean() == pytest.approx(2.5, abs=0.02)
    else:  # 1 + Lomax(2): median 1 + (sqrt(2) - 1)
        assert np.median(f) == pytest.approx(np.sqrt(2), rel=0.02)


def test_one_device_outcome_does_not_shift_the_others():
    # Prepare: device 0 is a straggler in one fleet and never in the other
    slowdown = SlowdownSpec(dist="uniform", low=2.0, high=10.0)
    a = direct_fleet([1.0, 1.0, 0.5], slowdown)
    b = direct_fleet([0.0, 1.0, 0.5], slowdown)
    u = a.round_draws(np.arange(3), 5).slowdown

    # Execute
    fa = a.draw_slowdowns(np.arange(3), u)
    fb = b.draw_slowdowns(np.arange(3), u)

    # Assert
    assert fa[0] > 1.0 and fb[0] == 1.0
    assert fa[1:].tolist() == fb[1:].tolist()


def test_docstring_examples_run():
    import doctest
    import importlib
    import pkgutil

    import fedsim.fleet

    names = [m.name for m in pkgutil.iter_modules(fedsim.fleet.__path__)]
    assert {"spec", "availability", "devices"} <= set(names)
    attempted = 0
    for name in names:
        result = doctest.testmod(importlib.import_module(f"fedsim.fleet.{name}"))
        assert result.failed == 0, name
        attempted += result.attempted
    assert attempted >= 10  # the spec's and the fleet's examples ran


@pytest.mark.parametrize(
    "speed, message",
    [
        (
            {"steps_per_s": 1.0, "flops_per_s": 1e9},
            "steps_per_s and flops_per_s are both given: a speed is in steps/s "
            "or in FLOP/s, not both",
        ),
        (
            {"dist": "mixture", "tiers": [
                {"share": 1, "median_steps_per_s": 1.0},
                {"share": 1, "median_flops_per_s": 1e9}]},
            "tiers: give every tier's median in the same unit",
        ),
        ({"dist": "lognormal", "sigma": 0.5},
         "dist 'lognormal' needs median_steps_per_s (or median_flops_per_s)"),
        ({"dist": "fixed"}, "dist 'fixed' needs steps_per_s (or flops_per_s)"),
        (
            {"steps_per_s": 1.0, "unit": "flops"},
            "unit goes with a preset (a field's name says its unit: "
            "median_steps_per_s or median_flops_per_s)",
        ),
        ({"steps_per_s": 1.0, "scale": 2.0}, "workload and scale go with a preset"),
    ],
)  # fmt: skip
def test_each_bad_speed_section_gets_its_own_one_line_message(speed, message):
    # Act
    with pytest.raises(ValueError) as caught:
        speed_spec(**speed)

    # Assert: the one problem, said in full on one line
    errors = caught.value.errors()
    assert len(errors) == 1
    assert errors[0]["msg"] == f"Value error, {message}"


@pytest.mark.parametrize(
    "spec, fields, message",
    [
        (
            SlowdownSpec,
            {"dist": "uniform", "low": 5, "high": 3},
            "high (3.0) must be >= low (5.0)",
        ),
        (
            AvailabilitySpec,
            {"kind": "daily", "min_online": 0.5, "max_online": 0.0},
            "max_online (0.0) must be >= min_online (0.5)",
        ),
    ],
)
def test_a_chosen_variants_range_out_of_order_is_refused_naming_both_fields(
    spec, fields, message
):
    """The range the chosen variant reads is refused out of order, naming
    both fields (an inverted daily swing before it reads as degenerate);
    the same fields are free under a variant that does not read them."""
    with pytest.raises(ValueError, match=re.escape(message)):
        spec(**fields)
    other = {"dist": "fixed"} if spec is SlowdownSpec else {"kind": "on_off"}
    spec(**{**fields, **other})
