"""The asynchronous timeline's chooser hook (AsyncTimeline(choose=...)):
which idle online devices take the free slots."""

from __future__ import annotations

import numpy as np
import pytest

from fedsim.clock import AsyncTimeline, RunContext, Version, uniform_choice
from fedsim.fleet import Fleet
from fedsim.scenario import FleetSpec, RoundSpec

MB = 1_000_000  # bytes: 1 s over an 8 Mbit/s link


def run(choose=None, *, count=6, concurrency=2, versions=4, seed=0) -> list[Version]:
    """Identical devices: each job is 1 s down + 8 steps at 4/s + 1 s up = 4 s."""
    group = {
        "name": "g",
        "count": count,
        "speed": {"dist": "fixed", "steps_per_s": 4.0},
        "network": {"down_mbps": 8, "up_mbps": 8},
    }
    fleet = Fleet.from_spec(FleetSpec.model_validate({"groups": [group]}), seed=0)
    tl = AsyncTimeline(
        fleet,
        RoundSpec(policy="async", max_steps=8),
        versions=versions,
        buffer_size=1,
        concurrency=concurrency,
        seed=seed,
        ctx=RunContext(MB, MB, np.full(count, 100), 20),
        choose=choose,
    )
    return list(tl)


def started(versions: list[Version]) -> list[tuple[float, int]]:
    return [(j.t_start, j.device) for v in versions for j in v.started]


def test_a_chooser_of_the_highest_ids_starts_only_those():
    # Prepare: record the calls; pick the highest ids, in decreasing order
    calls = []

    def highest(candidates, free, n):
        calls.append((candidates.tolist(), candidates.dtype, free, n))
        return candidates[::-1][:free]

    # Execute: 2 slots, 6 idle devices
    versions = run(highest)

    # Assert: devices 4 and 5 start at t = 0 (in increasing id), arrive at
    # t = 4 and are chosen again; nobody else ever trains
    assert started(versions) == [(0.0, 4), (0.0, 5), (4.0, 4), (4.0, 5)]
    assert [v.t for v in versions] == [4.0, 4.0, 8.0, 8.0]
    assert calls[:2] == [
        (list(range(6)), np.dtype(np.int64), 2, 0),
        (list(range(6)), np.dtype(np.int64), 2, 1),
    ]


def test_a_chooser_may_pick_fewer_than_the_free_slots():
    # Execute: 2 slots, the chooser takes only the lowest id
    versions = run(lambda c, free, n: c[:1])

    # Assert: device 0 alone, one job after the other
    assert started(versions) == [(0.0, 0), (4.0, 0), (8.0, 0), (12.0, 0)]


def test_the_chooser_is_not_called_when_every_idle_device_fits():
    # Prepare
    def never(candidates, free, n):
        raise AssertionError("called")

    # Execute: 6 slots for 6 devices
    versions = run(never, concurrency=6, versions=6)

    # Assert
    assert sorted(d for _, d in started(versions)) == list(range(6))


def test_the_default_is_uniform_choice_of_the_seed():
    # Execute
    default = run(seed=5, versions=8)
    explicit = run(uniform_choice(5), seed=5, versions=8)
    other = run(uniform_choice(6), seed=5, versions=8)

    # Assert
    assert default == explicit
    assert started(default) != started(other)


def test_uniform_choice_is_sorted_distinct_and_seeded_by_the_counter():
    # Prepare
    choose = uniform_choice(3)
    candidates = np.arange(10, 30, dtype=np.int64)

    # Execute
    picks = [choose(candidates, 5, n) for n in range(20)]

    # Assert
    for p in picks:
        assert p.tolist() == sorted(set(p.tolist())) and len(p) == 5
        assert set(p.tolist()) <= set(candidates.tolist())
    assert (choose(candidates, 5, 7) == picks[7]).all()
    assert len({tuple(p.tolist()) for p in picks}) > 1


def too_many(candidates, free, n):
    return candidates[: free + 1]


def repeated(candidates, free, n):
    return np.array([candidates[0], candidates[0]])


def stranger(candidates, free, n):
    return np.array([candidates[-1] + 1])


def floats(candidates, free, n):
    return candidates[:free].astype(np.float64)


@pytest.mark.parametrize("bad", [too_many, repeated, stranger, floats])
def test_a_bad_chooser_raises_naming_it(bad):
    with pytest.raises(ValueError, match=bad.__name__):
        run(bad)


def nothing(candidates, free, n):
    return None


def nested(candidates, free, n):
    return candidates[:free].reshape(1, -1)


@pytest.mark.parametrize("bad", [nothing, nested])
def test_a_chooser_returning_no_id_array_raises_naming_it(bad):
    with pytest.raises(ValueError, match=bad.__name__):
        run(bad)
