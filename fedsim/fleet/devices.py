"""The realised fleet: every device drawn from a :class:`FleetSpec` and a seed.

A fleet is a pure function of ``(FleetSpec, seed)`` (and its trace files);
devices are numbered ``0..m-1`` in group order (docs/fleets.md, "Fleet
draws"). Its per-round draws are common random numbers. Imports numpy
only: no torch, no Ray.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple, TypedDict

import numpy as np
from numpy.typing import ArrayLike

from fedsim.fleet.availability import OnOff
from fedsim.fleet.groups import DeviceGroup, FleetSpec
from fedsim.fleet.spec import AvailabilitySpec, NetworkSpec, SlowdownSpec
from fedsim.fleet.speed import MixtureSpeed, SpeedSpec
from fedsim.fleet.streams import (
    TAG_NETWORK,
    TAG_ROUND,
    TAG_SPEED,
    TAG_TIER,
    seed_stream,
    splitmix64,
    stream_key,
    unit_uniform,
)
from fedsim.traces import DeviceTrace, Intervals


class RoundDraws(NamedTuple):
    """The uniforms, in (0, 1), that decide devices' behaviour in one
    synchronous round, one row per device (:meth:`Fleet.round_draws`).

    Attributes:
        slowdown: ``[n, 2]``: slowed when column 0 < ``straggler_p``; the
            factor by the inverse CDF of column 1 (:meth:`Fleet.draw_slowdowns`).
        epochs: ``[n]``: E_i in an epoch range, by its inverse CDF.
        dropout: ``[n, 2]``: drops out when column 0 < ``dropout_p``, after
            that fraction (column 1) of its work (:meth:`Fleet.draw_dropouts`).
    """

    slowdown: np.ndarray
    epochs: np.ndarray
    dropout: np.ndarray


# The slots of a device's round uniforms, in RoundDraws' field order.
_ROUND_SLOTS = np.arange(5, dtype=np.uint64)


@dataclass(frozen=True, eq=False)
class Fleet:
    """Per-device attributes, drawn once from the scenario seed.

    Arrays are read-only float64 ``[m]`` by device id (``group`` int32):
    ``speed`` in local steps/s before stragglers, bandwidths in bit/s,
    ``latency_s`` added to each transfer, per-round ``straggler_p`` and
    ``dropout_p``. ``slowdowns`` and ``availability`` are per group;
    ``intervals`` (per group index, from a trace) replace the latter.
    ``step_flops``: the model's FLOPs per local step that turned the groups
    declared in FLOP/s into steps/s (None: no such group).
    Availability is a pure function of ``(seed, device, t)``, and every
    per-round draw of a device of ``(seed, device, round)``
    (:meth:`round_uniforms`).

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
    dropout_p: np.ndarray | None = None
    intervals: Mapping[int, Intervals] | None = None
    step_flops: float | None = None
    _onoff: OnOff = field(init=False, repr=False)

    def __post_init__(self) -> None:
        """Check the shapes, freeze the arrays and build the availability
        kernel (the dataclass is frozen: fields are set through object).

        Raises:
            ValueError: per-group tuples of the wrong length, group indices
                out of range, per-device arrays of another shape than
                ``group``, or intervals that do not match their groups.
        """
        set_ = object.__setattr__
        group = np.array(self.group, dtype=np.int32)
        n_groups = len(self.group_names)
        if len(self.slowdowns) != n_groups or len(self.availability) != n_groups:
            raise ValueError(
                "group_names, slowdowns and availability need one entry per group"
            )
        if group.ndim != 1 or not np.all((group >= 0) & (group < n_groups)):
            raise ValueError(f"group must be a 1-d array of indices in [0, {n_groups})")
        set_(self, "group", group)
        if self.dropout_p is None:
            set_(self, "dropout_p", np.zeros(group.size))
        self._freeze_arrays(group)
        intervals = _checked_intervals(group, n_groups, dict(self.intervals or {}))
        set_(self, "intervals", intervals)
        for name in ("group_names", "slowdowns", "availability"):
            set_(self, name, tuple(getattr(self, name)))
        set_(self, "_onoff", OnOff(self.seed, group, self.availability, intervals))

    def _freeze_arrays(self, group: np.ndarray) -> None:
        """Per-device arrays as read-only float64 copies shaped like ``group``
        (a fleet is shared by the clock, selectors and rows: none may write)."""
        names = ("speed", "down_bps", "up_bps", "latency_s", "straggler_p", "dropout_p")
        for name in names:
            value = np.array(getattr(self, name), dtype=np.float64)
            if value.shape != group.shape:
                raise ValueError(f"{name} has shape {value.shape}, not {group.shape}")
            value.setflags(write=False)
            object.__setattr__(self, name, value)
        self.group.setflags(write=False)

    @classmethod
    def from_spec(
        cls, spec: FleetSpec, seed: int, step_flops: float | None = None
    ) -> Fleet:
        """Draw every device of ``spec`` from ``seed``.

        Devices are numbered in group order. Each kind of draw (speed
        normals, tier uniforms, bandwidth normals) is its own stream of the
        seed with one draw per device of the whole fleet, so editing one
        group never reshuffles another's devices (docs/fleets.md, "Fleet
        draws").

        Args:
            spec: the validated fleet section.
            seed: the scenario seed.
            step_flops: FLOPs of one local step of the model; a group whose
                speed is in FLOP/s runs ``flops_per_s / step_flops`` steps/s
                (:func:`fedsim.flops.scenario_fleet` counts them).

        Returns:
            The fleet, a pure function of (spec, seed, step_flops) and its
            trace files.

        Raises:
            ValueError: a trace file changed size since the scenario was
                read, or a group in FLOP/s without ``step_flops`` (> 0).
        """
        if spec.per_flop and not (step_flops is not None and step_flops > 0):
            raise ValueError(
                "a group's speed is in FLOP/s: the model's FLOPs per step are "
                f"needed (> 0, got {step_flops}); fedsim.flops.scenario_fleet "
                "counts them"
            )
        groups = spec.groups
        counts = [g.count for g in groups]
        group = np.repeat(np.arange(len(groups), dtype=np.int32), counts)
        m = group.size
        bounds = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        z, tier_u, net_z = _device_normals(groups, seed, m)
        speed, down, up, latency = (np.empty(m) for _ in range(4))
        intervals: dict[int, Intervals] = {}
        for gi, g in enumerate(groups):
            sl = slice(int(bounds[gi]), int(bounds[gi + 1]))
            drawn = _group_devices(g, z[sl], tier_u[sl], net_z[sl])
            speed[sl], down[sl], up[sl], latency[sl], measured = drawn
            if g.speed is not None and g.speed.per_flop:
                assert step_flops is not None  # checked above
                speed[sl] /= step_flops  # FLOP/s -> steps/s for this model
            if measured is not None:
                intervals[gi] = measured
        return cls(
            group=group,
            group_names=tuple(g.name for g in groups),
            speed=speed,
            down_bps=down,
            up_bps=up,
            latency_s=latency,
            availability=tuple(g.availability for g in groups),
            seed=seed,
            intervals=intervals,
            step_flops=step_flops if spec.per_flop else None,
            **_straggler_fields(spec, group),
        )

    @property
    def size(self) -> int:
        """Number of devices m."""
        return int(self.group.size)

    def online(self, t: float) -> np.ndarray:
        """Which devices are online at simulated time ``t`` (bool ``[m]``)."""
        return self._onoff.state_at(np.arange(self.size), float(t))[0]

    def offline_time(self, devices: np.ndarray, t: float) -> np.ndarray:
        """For each device, the first time ``>= t`` at which it is offline
        (``t`` if it is, ``inf`` if it never goes offline)."""
        idx = np.asarray(devices, dtype=np.int64).reshape(-1)
        on, end = self._onoff.state_at(idx, float(t))
        return np.where(on, end, float(t))

    def online_time(self, devices: np.ndarray, t: float) -> np.ndarray:
        """For each device, the first time ``>= t`` at which it is online
        (``t`` if it is, ``inf`` if it never comes back)."""
        idx = np.asarray(devices, dtype=np.int64).reshape(-1)
        on, end = self._onoff.state_at(idx, float(t))
        return np.where(on, float(t), end)

    def next_online_time(self, t: float) -> float:
        """The earliest time ``>= t`` at which some device is online
        (``inf`` if none ever is again)."""
        on, end = self._onoff.state_at(np.arange(self.size), float(t))
        return float(t) if on.any() else float(end.min())

    def comm_time(
        self, devices: np.ndarray, bytes_down: int, bytes_up: int | np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Seconds to download ``bytes_down`` and to upload ``bytes_up``.

        Args:
            devices: device ids.
            bytes_down: the payload's size.
            bytes_up: the upload's size, or one size per device.

        Returns:
            (down, up) seconds per device: 8 bytes / bit rate + latency_s
            each (no partial transfers, no contention between devices).
        """
        idx = np.asarray(devices, dtype=np.int64).reshape(-1)
        lat = self.latency_s[idx]
        down = 8.0 * bytes_down / self.down_bps[idx] + lat
        return down, 8.0 * bytes_up / self.up_bps[idx] + lat

    def round_draws(self, devices: ArrayLike, t: int) -> RoundDraws:
        """The uniforms deciding each device's behaviour in round ``t``.

        Common random numbers: device i's uniforms in round t are a hash of
        (seed, i, t) (:func:`splitmix64`, as availability's), not the n-th
        outputs of a stream. So the same device in the same round straggles,
        drops out and draws its epochs alike whoever else was selected, by
        whichever selector, for whichever algorithm, on any number of
        workers, and after a resume; and drawing them costs a few vector
        operations per selected device, whatever the fleet's size.

        Args:
            devices: device ids, any order (one row each, in that order).
            t: the round (0, 1, ...).

        Example:
            >>> from fedsim.fleet import FleetSpec
            >>> fleet = Fleet.from_spec(FleetSpec.model_validate({"groups": [
            ...     {"name": "g", "count": 9,
            ...      "speed": {"dist": "fixed", "steps_per_s": 1.0}}]}), seed=0)
            >>> a = fleet.round_draws([4, 7], t=3).slowdown
            >>> b = fleet.round_draws([1, 7, 2], t=3).slowdown
            >>> bool((a[1] == b[1]).all()), bool((a[0] != a[1]).all())
            (True, True)
        """
        idx = np.asarray(devices, dtype=np.int64).reshape(-1)
        key = splitmix64(
            np.uint64(stream_key(self.seed, TAG_ROUND)) ^ idx.astype(np.uint64)
        )
        cell = splitmix64(key ^ np.uint64(t))  # device i in round t
        u = unit_uniform(splitmix64(cell[:, None] ^ _ROUND_SLOTS[None, :]))
        return RoundDraws(slowdown=u[:, 0:2], epochs=u[:, 2], dropout=u[:, 3:5])

    def draw_slowdowns(self, devices: ArrayLike, u: np.ndarray) -> np.ndarray:
        """The straggler factor (>= 1) of each device for one round or job.

        Args:
            devices: device ids.
            u: ``[n, 2]`` uniforms per device, in the order of ``devices``:
                slowed when ``u[:, 0] < straggler_p``, the factor from
                ``u[:, 1]`` (each device's own, so one never shifts
                another's): :attr:`RoundDraws.slowdown`, or a job's stream.
        """
        idx = np.asarray(devices, dtype=np.int64).reshape(-1)
        u = np.asarray(u, dtype=np.float64).reshape(idx.size, 2)
        factor = np.ones(idx.size)
        g = self.group[idx]
        for gi in np.unique(g).tolist():  # only the groups drawn from
            spec = self.slowdowns[gi]
            mask = g == gi
            v = u[mask, 1]
            if spec.dist == "fixed":
                factor[mask] = spec.factor
            elif spec.dist == "uniform":
                factor[mask] = spec.low + (spec.high - spec.low) * v
            else:  # may overflow to inf for tiny shapes: an endless straggler
                with np.errstate(over="ignore"):
                    factor[mask] = (1.0 - v) ** (-1.0 / spec.shape)
            if spec.max_factor is not None:
                factor[mask] = np.minimum(factor[mask], spec.max_factor)
        slowed = u[:, 0] < self.straggler_p[idx]
        return np.where(slowed, factor, 1.0)

    def draw_dropouts(
        self, devices: ArrayLike, u: np.ndarray, work_s: ArrayLike
    ) -> np.ndarray:
        """Seconds after its start at which each device drops out of this
        round or job (uniform in ``[0, work_s)``), or ``inf``.

        Args:
            devices: device ids.
            u: ``[n, 2]`` uniforms per device: drops out when ``u[:, 0] <
                dropout_p``, after ``u[:, 1] * work_s`` (:attr:`RoundDraws.dropout`,
                or a job's stream).
            work_s: each device's job duration (scalar or per device); an
                endless job (inf) never drops out.
        """
        idx = np.asarray(devices, dtype=np.int64).reshape(-1)
        u = np.asarray(u, dtype=np.float64).reshape(idx.size, 2)
        work = np.broadcast_to(np.asarray(work_s, dtype=np.float64), idx.shape)
        assert self.dropout_p is not None  # __post_init__ fills it
        drop = (u[:, 0] < self.dropout_p[idx]) & np.isfinite(work)
        return np.where(drop, u[:, 1] * np.where(drop, work, 0.0), np.inf)


def _checked_intervals(
    group: np.ndarray, n_groups: int, intervals: dict[int, Intervals]
) -> dict[int, Intervals]:
    """``intervals`` after checking each names a group and covers exactly
    its devices (the kernel slices traces by group order).

    Raises:
        ValueError: devices out of group order, an unknown group, or a
            device count that differs from the group's.
    """
    counts = np.bincount(group, minlength=n_groups)
    if intervals and np.any(group[1:] < group[:-1]):
        raise ValueError("with intervals, devices must be numbered in group order")
    for gi, iv in intervals.items():
        if not 0 <= gi < n_groups:
            raise ValueError(f"intervals[{gi}]: there is no group {gi}")
        if iv.size != counts[gi]:
            raise ValueError(
                f"intervals[{gi}] has {iv.size} devices; group {gi} has {counts[gi]}"
            )
    return intervals


def _device_normals(
    groups: list[DeviceGroup], seed: int, m: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every device's speed normal, tier uniform and pair of bandwidth
    normals (``[m]``, ``[m]``, ``[m, 2]``).

    Every device gets a speed normal, trace devices too, so a group turned
    into a trace leaves the others' speeds alone. The tier and bandwidth
    streams are drawn only when some group uses them (zeros otherwise):
    three draws a device saved on large fleets, and the scenarios that use
    neither keep the draws they always had.
    """
    z = seed_stream(seed, TAG_SPEED).standard_normal(m)
    mixed = any(g.speed is not None and g.speed.dist == "mixture" for g in groups)
    spread = any(g.network.down_sigma or g.network.up_sigma for g in groups)
    tier_u = seed_stream(seed, TAG_TIER).random(m) if mixed else np.zeros(m)
    net_z = np.zeros((m, 2))
    if spread:
        net_z = seed_stream(seed, TAG_NETWORK).standard_normal((m, 2))
    return z, tier_u, net_z


class _StragglerFields(TypedDict):
    """:class:`Fleet`'s straggler fields (see its attributes)."""

    straggler_p: np.ndarray
    slowdowns: tuple[SlowdownSpec, ...]
    dropout_p: np.ndarray


def _straggler_fields(spec: FleetSpec, group: np.ndarray) -> _StragglerFields:
    """The fleet's straggler fields: per-device probabilities (each group's
    own model, else the fleet's) and per-group slowdown laws."""
    stragglers = [spec.stragglers_of(gi) for gi in range(len(spec.groups))]
    return _StragglerFields(
        straggler_p=np.array([s.p for s in stragglers])[group],
        slowdowns=tuple(s.slowdown for s in stragglers),
        dropout_p=np.array([s.dropout_p for s in stragglers])[group],
    )


def _group_devices(
    g: DeviceGroup, z: np.ndarray, tier_u: np.ndarray, net_z: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | float, Intervals | None]:
    """One group's (speed, down bit/s, up bit/s, latency, trace intervals),
    read from its trace or drawn from its devices' normals and uniforms."""
    if g.trace is not None:
        tr = _read_group_trace(g)
        down, up = tr.down_mbps * 1e6, tr.up_mbps * 1e6
        return tr.speed, down, up, tr.latency_s, tr.availability
    down, up = _draw_bandwidths(g.network, net_z)
    return _draw_speed(g.speed, z, tier_u), down, up, g.network.latency_s, None


def _read_group_trace(g: DeviceGroup) -> DeviceTrace:
    """A trace group's measured devices.

    Raises:
        ValueError: the file no longer has the rows the scenario counted.
    """
    tr = g.load_trace()
    if tr.size != g.count:
        raise ValueError(
            f"{tr.path} has {tr.size} rows, the scenario says "
            f"{g.count}: the file changed after the scenario was read"
        )
    return tr


def _draw_bandwidths(
    net: NetworkSpec, net_z: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Down and up bandwidths in bit/s from each device's two normals:
    lognormal around the medians, log-correlated by ``rho`` (sigma 0:
    exp(0 z) = 1, the median exactly)."""
    z1, z2 = net_z[:, 0], net_z[:, 1]
    z_up = net.rho * z1 + math.sqrt(1 - net.rho**2) * z2
    down = net.down_mbps * 1e6 * np.exp(net.down_sigma * z1)
    up = net.up_mbps * 1e6 * np.exp(net.up_sigma * z_up)
    return down, up


def _draw_speed(
    spec: SpeedSpec | None, z: np.ndarray, tier_u: np.ndarray
) -> np.ndarray:
    """Speeds of one group's devices from their normals (and tier uniforms)."""
    assert spec is not None
    if not isinstance(spec, MixtureSpeed):  # one law (fixed: sigma 0)
        ((m, s),) = spec.laws()  # its median and sigma
        return m * np.exp(s * z)
    share = np.array([t.share for t in spec.tiers])
    cum = np.cumsum(share / share.sum())
    tier = np.minimum(np.searchsorted(cum, tier_u, side="right"), len(share) - 1)
    median = np.array([t.median_in_unit for t in spec.tiers])[tier]
    sigma = np.array([t.sigma for t in spec.tiers])[tier]
    return median * np.exp(sigma * z)
