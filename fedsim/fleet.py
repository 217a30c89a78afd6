"""Devices of a simulated fleet: speed, network, availability and stragglers.

Every attribute is drawn once from the scenario seed, so a fleet is a pure
function of ``(FleetSpec, seed)``. Devices are numbered ``0..m-1`` in group
order (group 0's devices first). Imports numpy only: no torch, no Ray.

Availability of ``on_off`` devices is an alternating renewal process whose
interval ``k`` of device ``d`` has a length drawn by hashing
``(seed, d, k)`` (counter-based randomness). Nothing is stored per interval,
so a fleet of millions of devices answers ``online(t)`` from a few arrays,
and the answer never depends on which times were asked before.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Literal

import numpy as np
from pydantic import Field, model_validator

from fedsim.spec import NonNegFloat, PosFloat, Prob
from fedsim.spec import Spec as _Spec

__all__ = ["Fleet"]


# ------------------------------------------------------------------ the specs
class SpeedSpec(_Spec):
    """Compute speed in local steps per simulated second.

    ``fixed`` uses ``steps_per_s`` for every device; ``lognormal`` draws each
    device's speed once as median * exp(sigma * N(0, 1)).
    """

    dist: Literal["fixed", "lognormal"] = "fixed"
    steps_per_s: PosFloat | None = None
    median_steps_per_s: PosFloat | None = None
    sigma: NonNegFloat = 0.0

    @model_validator(mode="after")
    def _one_speed(self) -> SpeedSpec:
        if self.dist == "fixed" and self.steps_per_s is None:
            raise ValueError("dist 'fixed' needs steps_per_s")
        if self.dist == "lognormal" and self.median_steps_per_s is None:
            raise ValueError("dist 'lognormal' needs median_steps_per_s")
        if self.sigma > 5:
            raise ValueError("sigma above 5 gives speeds spanning 10^4x; check units")
        return self

    @property
    def median(self) -> float:
        assert self.steps_per_s is not None or self.median_steps_per_s is not None
        return float(self.steps_per_s or self.median_steps_per_s)  # type: ignore[arg-type]


class NetworkSpec(_Spec):
    """Link of a device: time to send B bytes = 8 B / (mbps * 1e6) + latency_s."""

    down_mbps: PosFloat = 100.0
    up_mbps: PosFloat = 100.0
    latency_s: NonNegFloat = 0.0


class SlowdownSpec(_Spec):
    """Distribution of a straggler's slowdown factor (>= 1; speed is divided by it).

    ``fixed``: ``factor``; ``uniform``: U(low, high); ``pareto``: 1 + Pareto(shape),
    i.e. heavy-tailed with minimum 1.
    """

    dist: Literal["fixed", "uniform", "pareto"] = "fixed"
    factor: Annotated[float, Field(ge=1)] = 4.0
    low: Annotated[float, Field(ge=1)] = 2.0
    high: Annotated[float, Field(ge=1)] = 10.0
    shape: PosFloat = 2.0

    @model_validator(mode="after")
    def _range(self) -> SlowdownSpec:
        if self.dist == "uniform" and self.high < self.low:
            raise ValueError(f"high ({self.high}) must be >= low ({self.low})")
        return self


class StragglerSpec(_Spec):
    """Each round, each selected device is slowed with probability ``p``."""

    p: Prob = 0.0
    slowdown: SlowdownSpec = SlowdownSpec()


class AvailabilitySpec(_Spec):
    """When a device is online: ``always``, or an alternating on/off process with
    exponentially distributed durations of means ``mean_on_s`` and ``mean_off_s``.
    A device that goes offline mid-round drops out of the round."""

    kind: Literal["always", "on_off"] = "always"
    mean_on_s: PosFloat = 3600.0
    mean_off_s: PosFloat = 1800.0


class DeviceGroup(_Spec):
    name: str = Field(min_length=1, max_length=200)
    count: Annotated[int, Field(ge=1, le=10_000_000)]
    speed: SpeedSpec
    network: NetworkSpec = NetworkSpec()
    stragglers: StragglerSpec = StragglerSpec()
    availability: AvailabilitySpec = AvailabilitySpec()


class FleetSpec(_Spec):
    groups: list[DeviceGroup] = Field(min_length=1, max_length=10_000)

    @property
    def size(self) -> int:
        return sum(g.count for g in self.groups)

    @model_validator(mode="after")
    def _unique_names(self) -> FleetSpec:
        names = [g.name for g in self.groups]
        if len(set(names)) != len(names):
            raise ValueError(f"group names must be unique, got {names}")
        if self.size > 10_000_000:
            raise ValueError(f"fleet has {self.size} devices; the limit is 10,000,000")
        return self


# Tags that separate the random streams derived from one scenario seed.
_TAG_SPEED = 0xF1EE7
_TAG_AVAILABILITY = 0xA7A11AB1E
_INITIAL_STATE = np.uint64(1 << 63)  # counter of the "on at t=0?" draw
_MASK64 = (1 << 64) - 1


def _splitmix64_int(x: int) -> int:
    """splitmix64 finaliser on a Python int (for deriving the seed key)."""
    z = (x + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser, vectorised; uint64 arithmetic wraps by design."""
    z = x + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _unit(bits: np.ndarray) -> np.ndarray:
    """Top 53 bits of a hash as a float in the open interval (0, 1)."""
    return ((bits >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0**-53


class _OnOff:
    """Memo of each device's current on/off interval, advanced lazily.

    Interval ``k`` of device ``d`` covers ``[start, end)``; it is "on" when
    ``k`` is even and the device started on (or ``k`` is odd and it started
    off). Its length is exponential with the mean of its state, from the hash
    of ``(device key, k)``; since exponentials are memoryless, starting
    interval 0 at t=0 with a fresh exponential length is exact for a process
    that has been running forever. The cache only saves work: advancing
    always repeats the same additions from interval 0, so results are the
    same bit for bit whatever the order of queries.
    """

    def __init__(
        self, seed: int, group: np.ndarray, specs: tuple[AvailabilitySpec, ...]
    ):
        self.group = group
        on_off = [a.kind == "on_off" for a in specs]
        # Always-on devices: an "on" interval that never ends.
        self.mean_on = np.array(
            [a.mean_on_s if f else np.inf for a, f in zip(specs, on_off, strict=True)]
        )
        self.mean_off = np.array([a.mean_off_s for a in specs])
        self.p_on = np.array(
            [
                a.mean_on_s / (a.mean_on_s + a.mean_off_s) if f else 1.0
                for a, f in zip(specs, on_off, strict=True)
            ]
        )
        self.seed_key = _splitmix64_int(_splitmix64_int(seed) ^ _TAG_AVAILABILITY)
        self._cache: tuple[np.ndarray, ...] | None = None

    def __getstate__(self) -> dict:
        # The memo can be tens of MB and is cheap to rebuild: do not ship it.
        return {**self.__dict__, "_cache": None}

    def _keys(self, idx: np.ndarray) -> np.ndarray:
        return _splitmix64(np.uint64(self.seed_key) ^ idx.astype(np.uint64))

    def _duration(
        self, idx: np.ndarray, k: np.ndarray, first_on: np.ndarray
    ) -> np.ndarray:
        on = first_on ^ (k & 1).astype(bool)
        g = self.group[idx]
        mean = np.where(on, self.mean_on[g], self.mean_off[g])
        u = _unit(_splitmix64(self._keys(idx) ^ k.astype(np.uint64)))
        return -mean * np.log(u)

    def _first_interval(self, idx: np.ndarray) -> tuple[np.ndarray, ...]:
        u = _unit(_splitmix64(self._keys(idx) ^ _INITIAL_STATE))
        first_on = u < self.p_on[self.group[idx]]
        k = np.zeros(idx.size, dtype=np.int64)
        start = np.zeros(idx.size)
        return first_on, k, start, self._duration(idx, k, first_on)

    def _advance(self, idx: np.ndarray, t: float) -> tuple[np.ndarray, ...]:
        """The intervals of devices ``idx`` (all behind ``t``) that contain t.

        A long jump in time can take thousands of steps for some devices, so
        this steps whole arrays with masks and compacts them only once most
        devices have caught up (numpy fancy indexing is the costly part).
        """
        first_on, k, start, end = (a[idx] for a in self._cache)
        g = self.group[idx]
        key, mean_on, mean_off = self._keys(idx), self.mean_on[g], self.mean_off[g]
        pos = np.arange(idx.size)
        behind = np.ones(idx.size, dtype=bool)
        work = (pos, first_on, k, start, end, key, mean_on, mean_off)
        while True:
            n_behind = np.count_nonzero(behind)
            if n_behind * 4 < behind.size:  # flush caught-up devices, compact
                p, _, kk, s, e = work[:5]
                done = ~behind
                k[p[done]], start[p[done]], end[p[done]] = kk[done], s[done], e[done]
                work = tuple(a[behind] for a in work)
                behind = np.ones(n_behind, dtype=bool)
            if n_behind == 0:
                return k, start, end
            p, fo, kk, s, e, key_, m_on, m_off = work
            kk = kk + behind  # only the devices behind move to their next interval
            on = fo ^ (kk & 1).astype(bool)
            u = _unit(_splitmix64(key_ ^ kk.astype(np.uint64)))
            s = np.where(behind, e, s)
            e = np.where(behind, s + -np.where(on, m_on, m_off) * np.log(u), e)
            behind = e <= t
            work = (p, fo, kk, s, e, key_, m_on, m_off)

    def state_at(self, idx: np.ndarray, t: float) -> tuple[np.ndarray, np.ndarray]:
        """Whether each device in ``idx`` is on at ``t``, and when that ends."""
        if not np.isfinite(t):
            raise ValueError(f"time must be finite, got {t}")
        if self._cache is None:
            self._cache = self._first_interval(np.arange(self.group.size))
        first_on, k, start, end = self._cache
        back = idx[start[idx] > t]  # asked about the past: replay from t=0
        if back.size:
            _, k[back], start[back], end[back] = self._first_interval(back)
        todo = idx[end[idx] <= t]
        if todo.size:
            k[todo], start[todo], end[todo] = self._advance(todo, t)
        on = first_on[idx] ^ (k[idx] & 1).astype(bool)
        return on, end[idx]


@dataclass(frozen=True, eq=False)
class Fleet:
    """Per-device attributes, drawn once from the scenario seed.

    Arrays are indexed by device id (``0..m-1``, in group order) and are
    read-only. Availability is answered lazily (see :meth:`online`); the
    answers are a pure function of ``(seed, device, t)``.

    Attributes:
        group: int32 ``[m]``, the group index of each device.
        group_names: the groups' names, by group index.
        speed: float64 ``[m]``, local steps per simulated second, before any
            straggler slowdown.
        down_bps: float64 ``[m]``, download bandwidth in bits per second.
        up_bps: float64 ``[m]``, upload bandwidth in bits per second.
        latency_s: float64 ``[m]``, added once to every download and upload.
        straggler_p: float64 ``[m]``, chance per round of being slowed down.
        slowdowns: each group's slowdown distribution.
        availability: each group's availability model.
        seed: the seed availability is derived from.

    Example:
        >>> from fedsim.fleet import FleetSpec
        >>> spec = FleetSpec.model_validate({"groups": [
        ...     {"name": "phones", "count": 3,
        ...      "speed": {"dist": "fixed", "steps_per_s": 4.0},
        ...      "network": {"down_mbps": 8, "up_mbps": 8, "latency_s": 0.5},
        ...      "availability": {"kind": "on_off", "mean_on_s": 60,
        ...                       "mean_off_s": 30}}]})
        >>> fleet = Fleet.from_spec(spec, seed=0)
        >>> fleet.size, fleet.speed.tolist()
        (3, [4.0, 4.0, 4.0])
        >>> down, up = fleet.comm_time([0], bytes_down=1_000_000, bytes_up=0)
        >>> down.tolist(), up.tolist()
        ([1.5], [0.5])
        >>> fleet.online(100.0).shape
        (3,)
    """

    group: np.ndarray
    group_names: tuple[str, ...]
    speed: np.ndarray
    down_bps: np.ndarray
    up_bps: np.ndarray
    latency_s: np.ndarray
    straggler_p: np.ndarray
    slowdowns: tuple[SlowdownSpec, ...]
    availability: tuple[AvailabilitySpec, ...]
    seed: int
    _onoff: _OnOff = field(init=False, repr=False)

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        group = np.array(self.group, dtype=np.int32)
        n_groups = len(self.group_names)
        if len(self.slowdowns) != n_groups or len(self.availability) != n_groups:
            raise ValueError(
                "group_names, slowdowns and availability need one entry per group"
            )
        if group.ndim != 1 or (
            group.size and (group.min() < 0 or group.max() >= n_groups)
        ):
            raise ValueError(f"group must be a 1-d array of indices in [0, {n_groups})")
        set_(self, "group", group)
        for name in ("speed", "down_bps", "up_bps", "latency_s", "straggler_p"):
            value = np.array(getattr(self, name), dtype=np.float64)
            if value.shape != group.shape:
                raise ValueError(
                    f"{name} has shape {value.shape}, expected {group.shape}"
                )
            set_(self, name, value)
        for name in (
            "group",
            "speed",
            "down_bps",
            "up_bps",
            "latency_s",
            "straggler_p",
        ):
            getattr(self, name).setflags(write=False)
        set_(self, "group_names", tuple(self.group_names))
        set_(self, "slowdowns", tuple(self.slowdowns))
        set_(self, "availability", tuple(self.availability))
        set_(self, "_onoff", _OnOff(self.seed, group, self.availability))

    @classmethod
    def from_spec(cls, spec: FleetSpec, seed: int) -> Fleet:
        """Draw every device of ``spec`` from ``seed``.

        Lognormal speeds are ``median * exp(sigma * z)`` with ``z`` the
        device's own standard normal: one draw per device (fixed-speed ones
        too), so editing one group does not reshuffle the others' speeds.
        """
        groups = spec.groups
        group = np.repeat(
            np.arange(len(groups), dtype=np.int32), [g.count for g in groups]
        )

        def per_device(values: list[float]) -> np.ndarray:
            return np.asarray(values, dtype=np.float64)[group]

        rng = np.random.default_rng(np.random.SeedSequence([seed, _TAG_SPEED]))
        z = rng.standard_normal(group.size)
        lognormal = [g.speed.dist == "lognormal" for g in groups]
        median = per_device(
            [
                g.speed.median_steps_per_s if ln else g.speed.steps_per_s
                for g, ln in zip(groups, lognormal, strict=True)
            ]
        )
        sigma = per_device(
            [
                g.speed.sigma if ln else 0.0
                for g, ln in zip(groups, lognormal, strict=True)
            ]
        )
        return cls(
            group=group,
            group_names=tuple(g.name for g in groups),
            speed=median * np.exp(sigma * z),
            down_bps=per_device([g.network.down_mbps * 1e6 for g in groups]),
            up_bps=per_device([g.network.up_mbps * 1e6 for g in groups]),
            latency_s=per_device([g.network.latency_s for g in groups]),
            straggler_p=per_device([g.stragglers.p for g in groups]),
            slowdowns=tuple(g.stragglers.slowdown for g in groups),
            availability=tuple(g.availability for g in groups),
            seed=seed,
        )

    @property
    def size(self) -> int:
        """Number of devices m."""
        return int(self.group.size)

    def online(self, t: float) -> np.ndarray:
        """Which devices are online at simulated time ``t`` (bool ``[m]``).

        Cost is proportional to the devices whose on/off interval ended since
        the last query, so a simulation moving forward pays little per query;
        a query about an earlier time replays those devices from t=0.
        """
        on, _ = self._onoff.state_at(np.arange(self.size), float(t))
        return on

    def offline_time(self, devices: np.ndarray, t: float) -> np.ndarray:
        """For each device, the first time ``>= t`` at which it is offline.

        ``inf`` for a device that never goes offline, and ``t`` itself for a
        device already offline at ``t``. A device is online on ``[t, result)``.
        """
        idx = np.asarray(devices, dtype=np.int64).reshape(-1)
        on, end = self._onoff.state_at(idx, float(t))
        return np.where(on, end, float(t))

    def next_online_time(self, t: float) -> float:
        """The earliest time ``>= t`` at which some device is online."""
        on, end = self._onoff.state_at(np.arange(self.size), float(t))
        return float(t) if on.any() else float(end.min())

    def comm_time(
        self, devices: np.ndarray, bytes_down: int, bytes_up: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Seconds to download ``bytes_down`` and to upload ``bytes_up``.

        Each is ``8 * bytes / bits_per_second + latency_s``, per device.
        """
        idx = np.asarray(devices, dtype=np.int64).reshape(-1)
        lat = self.latency_s[idx]
        return 8.0 * bytes_down / self.down_bps[
            idx
        ] + lat, 8.0 * bytes_up / self.up_bps[idx] + lat

    def draw_slowdowns(
        self, devices: np.ndarray, rng: np.random.Generator
    ) -> np.ndarray:
        """This round's straggler factor (>= 1) for each device, in the given order.

        Device ``i`` is slowed with probability ``straggler_p[i]`` by a factor
        from its group's :class:`SlowdownSpec`, else the factor is 1. Exactly
        two uniforms are drawn per device (one for "is it slowed", one turned
        into the factor by the inverse CDF), so one device's outcome never
        shifts another's draws. Pareto uses the inverse CDF
        ``(1 - u) ** (-1 / shape)``, the same law as ``1 + rng.pareto(shape)``.
        """
        idx = np.asarray(devices, dtype=np.int64).reshape(-1)
        u = rng.random((idx.size, 2))
        factor = np.ones(idx.size)
        g = self.group[idx]
        for gi, spec in enumerate(self.slowdowns):
            mask = g == gi
            if not mask.any():
                continue
            v = u[mask, 1]
            if spec.dist == "fixed":
                factor[mask] = spec.factor
            elif spec.dist == "uniform":
                factor[mask] = spec.low + (spec.high - spec.low) * v
            else:  # may overflow to inf for tiny shapes: an endless straggler
                with np.errstate(over="ignore"):
                    factor[mask] = (1.0 - v) ** (-1.0 / spec.shape)
        slowed = u[:, 0] < self.straggler_p[idx]
        return np.where(slowed, factor, 1.0)
