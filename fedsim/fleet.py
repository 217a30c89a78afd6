"""Devices of a simulated fleet: speed, network, availability and stragglers.

A fleet is a pure function of ``(FleetSpec, seed)`` (and its trace files);
devices are numbered ``0..m-1`` in group order; availability is counter-based
(docs/fleets.md, "Fleet draws"). Imports numpy only: no torch, no Ray.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, ClassVar, Literal, NamedTuple, TypedDict

import numpy as np
from numpy.typing import ArrayLike
from pydantic import Field, ValidationInfo, model_validator

from fedsim.presets import NETWORK_PRESETS, SPEED_PRESETS, WORKLOADS, speed_preset
from fedsim.spec import NonNegFloat, PosFloat, Prob
from fedsim.spec import Spec as _Spec
from fedsim.traces import DeviceTrace, Intervals, load_trace, resolve_trace_path

SpeedPresetName = Literal[SPEED_PRESETS]  # type: ignore[valid-type]
WorkloadName = Literal[WORKLOADS]  # type: ignore[valid-type]
if TYPE_CHECKING:  # built from the preset table at import
    NetworkPresetName = str
else:
    NetworkPresetName = Literal[tuple(NETWORK_PRESETS)]


class _Choice(_Spec):
    """A spec whose ``CHOICE`` field picks a variant that reads only some of
    the other fields (``USES``: the variant's fields, space-separated).

    ``fedsim validate`` prints a section with :attr:`used_fields` only, so a
    field the chosen variant ignores (``sigma`` on fixed speeds) does not read
    as if it mattered; the table lives here, beside the fields it names.
    """

    CHOICE: ClassVar[str]
    USES: ClassVar[dict[str, str]]

    @property
    def used_fields(self) -> str:
        """The choosing field and the fields its value reads, space-separated."""
        return f"{self.CHOICE} {self.USES[getattr(self, self.CHOICE)]}".strip()


class SpeedTierSpec(_Spec):
    """One lognormal component of a ``mixture`` speed distribution, its
    median in steps/s or in FLOP/s (one of the two)."""

    name: str = Field("", max_length=200)
    share: PosFloat
    median_steps_per_s: PosFloat | None = None
    median_flops_per_s: PosFloat | None = None
    sigma: NonNegFloat = 0.0

    @model_validator(mode="after")
    def _one_median(self) -> SpeedTierSpec:
        """Exactly one of the two medians.

        Raises:
            ValueError: neither, or both.
        """
        given = [self.median_steps_per_s, self.median_flops_per_s]
        if given.count(None) != 1:
            raise ValueError(
                "a tier needs median_steps_per_s or median_flops_per_s (one of them)"
            )
        return self

    @property
    def median(self) -> float:
        """The tier's median in its own unit (steps/s or FLOP/s)."""
        m = self.median_steps_per_s or self.median_flops_per_s
        assert m is not None  # _one_median
        return m


# The field holding a distribution's speed, per unit: steps/s or FLOP/s.
_SPEED_FIELD = {
    "steps": {"fixed": "steps_per_s", "lognormal": "median_steps_per_s"},
    "flops": {"fixed": "flops_per_s", "lognormal": "median_flops_per_s"},
}


class SpeedSpec(_Choice):
    """Compute speed, drawn once per device, in local steps per simulated
    second or in FLOP/s (then divided by the model's FLOPs per step, which
    :mod:`fedsim.flops` counts before the run).

    ``fixed``, ``lognormal`` or ``mixture`` of lognormal ``tiers``;
    ``preset`` fills in the fields left out, ``unit: flops`` in FLOP/s
    (docs/fleets.md, "Speed").

    Example:
        >>> SpeedSpec(preset="flash-phones-mid").median_steps_per_s
        1.7006802721088434
        >>> SpeedSpec(preset="flash-phones-mid", unit="flops").median_flops_per_s
        1734983401.3605442
    """

    dist: Literal["fixed", "lognormal", "mixture"] = "fixed"
    steps_per_s: PosFloat | None = None
    median_steps_per_s: PosFloat | None = None
    flops_per_s: PosFloat | None = None
    median_flops_per_s: PosFloat | None = None
    sigma: NonNegFloat = 0.0
    tiers: list[SpeedTierSpec] | None = Field(None, min_length=1, max_length=100)
    preset: SpeedPresetName | None = None
    workload: WorkloadName | None = None
    scale: PosFloat = 1.0
    unit: Literal["steps", "flops"] | None = None

    CHOICE: ClassVar[str] = "dist"
    USES: ClassVar[dict[str, str]] = {
        "fixed": "steps_per_s",
        "lognormal": "median_steps_per_s sigma",
        "mixture": "tiers",
    }

    @property
    def per_flop(self) -> bool:
        """Whether the speed is in FLOP/s (a FLOP/s field or tier is given)."""
        tiers = [t.median_flops_per_s for t in self.tiers or []]
        given = [self.flops_per_s, self.median_flops_per_s, *tiers]
        return any(v is not None for v in given)

    @property
    def used_fields(self) -> str:
        """As :class:`_Choice`'s (with the FLOP/s fields when the speed is in
        FLOP/s), with ``preset workload scale unit`` when a preset filled the
        distribution in (they say where its numbers came from)."""
        uses = self.USES[self.dist]
        if self.per_flop:
            uses = uses.replace("steps_per_s", "flops_per_s")
        if not self.preset:
            return f"dist {uses}".strip()
        unit = " unit" if self.per_flop else ""
        return f"dist preset workload scale{unit} {uses}".strip()

    @model_validator(mode="before")
    @classmethod
    def _fill_from_preset(cls, data: object) -> object:
        """A ``preset`` (measured phones, docs/fleets.md "Speed") becomes the
        distribution it stands for: one tier a ``lognormal``, several a
        ``mixture``. Fields given in the scenario win over the preset's."""
        if not isinstance(data, dict) or data.get("preset") is None:
            return data
        name, workload = data["preset"], data.get("workload") or "femnist-cnn"
        scale = data.get("scale", 1.0)
        if not _preset_args_ok(name, workload, scale):
            return data  # the field validators say what is wrong
        # unit flops: the tier's FLOP/s on its workload (presets.SpeedTier)
        key = "median_flops_per_s" if data.get("unit") == "flops" else None
        key = key or "median_steps_per_s"
        tiers = [
            {"name": t.name, "share": t.share, key: getattr(t, key), "sigma": t.sigma}
            for t in speed_preset(name, workload, scale)
        ]
        if len(tiers) > 1:  # the fields given win
            return {"dist": "mixture", "tiers": tiers, **data}
        fill = {key: tiers[0][key], "sigma": tiers[0]["sigma"]}
        return {"dist": "lognormal", **fill, **data}

    @model_validator(mode="after")
    def _one_speed(self) -> SpeedSpec:
        """Each distribution has the fields it needs and no other's.

        Raises:
            ValueError: a missing median (``fixed``, ``lognormal``), tiers
                missing or misplaced, ``workload``/``scale`` without a preset.
        """
        steps = [k for k in ("steps_per_s", "median_steps_per_s") if getattr(self, k)]
        flops = [k for k in ("flops_per_s", "median_flops_per_s") if getattr(self, k)]
        if steps and flops:
            raise ValueError(
                f"{steps[0]} and {flops[0]} are both given: a speed is in steps/s "
                "or in FLOP/s, not both"
            )
        if self.tiers and len({t.median_flops_per_s is None for t in self.tiers}) > 1:
            raise ValueError("tiers: give every tier's median in the same unit")
        need = _SPEED_FIELD["flops" if flops else "steps"].get(self.dist)
        if need is not None and getattr(self, need) is None:
            other = _SPEED_FIELD["steps" if flops else "flops"][self.dist]
            raise ValueError(f"dist '{self.dist}' needs {need} (or {other})")
        if self.unit is not None and self.preset is None:
            raise ValueError(
                "unit goes with a preset (a field's name says its unit: "
                "median_steps_per_s or median_flops_per_s)"
            )
        if (self.dist == "mixture") != bool(self.tiers):
            if self.dist == "mixture":
                raise ValueError("dist 'mixture' needs tiers (or a preset)")
            if self.tiers is not None:
                raise ValueError("tiers go with dist 'mixture'")
        if self.preset is None and (self.workload is not None or self.scale != 1.0):
            raise ValueError("workload and scale go with a preset")
        return self

    @model_validator(mode="after")
    def _plausible_sigma(self) -> SpeedSpec:
        """A sigma above 5 is almost surely a unit mistake (speeds would
        span four orders of magnitude within one group)."""
        if max([self.sigma] + [t.sigma for t in self.tiers or []]) > 5:
            raise ValueError("sigma above 5 gives speeds spanning 10^4x; check units")
        return self

    @property
    def median(self) -> float:
        """The median speed in steps/s (of the mixture, for ``mixture``:
        found by bisection on its CDF, so selectors can rank groups); NaN
        for a speed in FLOP/s, whose steps/s depend on the model's FLOPs
        (:attr:`median_in_unit` holds its FLOP/s)."""
        return math.nan if self.per_flop else self.median_in_unit

    @property
    def median_in_unit(self) -> float:
        """The median speed in the spec's own unit: steps/s or FLOP/s."""
        return self.quantile_in_unit(0.5)

    def quantile_in_unit(self, q: float) -> float:
        """The q-quantile of the declared law, in the spec's own unit
        (a mixture's by bisection on its CDF).

        Example:
            >>> s = SpeedSpec(dist="lognormal", median_steps_per_s=2.0, sigma=0.5)
            >>> round(s.quantile_in_unit(0.9), 4)  # 2 exp(0.5 z_0.9)
            3.7959
        """
        if self.dist == "mixture":
            return _mixture_quantile(self.tiers or [], q)
        unit = "flops" if self.per_flop else "steps"
        median = float(getattr(self, _SPEED_FIELD[unit][self.dist]))
        if self.dist == "fixed" or q == 0.5:
            return median
        return median * math.exp(self.sigma * _normal_quantile(q))


def _preset_args_ok(name: object, workload: object, scale: object) -> bool:
    """Whether a speed preset's arguments have usable types and range (if
    not, the preset is left alone and the field validators report it)."""
    return (
        isinstance(name, str)
        and isinstance(workload, str)
        and isinstance(scale, int | float)
        and not isinstance(scale, bool)
        and 0 < scale < math.inf
    )


def _mixture_cdf(tiers: list[SpeedTierSpec], x: float) -> float:
    """P(speed <= x) under a mixture of lognormal tiers (a tier with sigma
    0 is a point mass at its median)."""
    total = sum(t.share for t in tiers)
    out = 0.0
    for t in tiers:
        if t.sigma == 0:
            out += t.share * (x >= t.median)
        else:
            z = math.log(x / t.median) / t.sigma
            out += t.share * 0.5 * (1 + math.erf(z / math.sqrt(2)))
    return out / total


def _mixture_quantile(tiers: list[SpeedTierSpec], q: float) -> float:
    """The mixture's q-quantile, by 100 bisections in log space between six
    sigmas below the slowest tier and six above the fastest (the CDF is
    monotone there, and 100 halvings reach float precision)."""
    lo = min(t.median * math.exp(-6 * t.sigma) for t in tiers)
    hi = max(t.median * math.exp(6 * t.sigma) for t in tiers)
    for _ in range(100):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if _mixture_cdf(tiers, mid) < q else (lo, mid)
    return math.sqrt(lo * hi)


def _normal_quantile(q: float) -> float:
    """z with Phi(z) = q, by bisection on erfc to float precision."""
    lo, hi = -40.0, 40.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if 0.5 * math.erfc(-mid / math.sqrt(2)) < q else (lo, mid)
    return 0.5 * (lo + hi)


class NetworkSpec(_Spec):
    """Link of a device: sending B bytes takes 8 B / (mbps * 1e6) + latency_s;
    ``down_sigma`` / ``up_sigma`` > 0 draw lognormal bandwidths around the
    medians, log-correlated by ``rho``; ``preset`` fills in the rest."""

    down_mbps: PosFloat = 100.0
    up_mbps: PosFloat = 100.0
    latency_s: NonNegFloat = 0.0
    down_sigma: Annotated[float, Field(ge=0, le=5)] = 0.0
    up_sigma: Annotated[float, Field(ge=0, le=5)] = 0.0
    rho: Annotated[float, Field(ge=-1, le=1)] = 0.0
    preset: NetworkPresetName | None = None

    @model_validator(mode="before")
    @classmethod
    def _fill_from_preset(cls, data: object) -> object:
        """A network ``preset`` fills in the fields left out (its medians
        become ``down_mbps`` / ``up_mbps``).

        Raises:
            ValueError: an unknown preset name (listing the known ones).
        """
        if not isinstance(data, dict):
            return data  # not a mapping: the field validation says so
        name = data.get("preset")
        if not isinstance(name, str):
            return data  # no preset, or the field validator says what is wrong
        if name not in NETWORK_PRESETS:
            raise ValueError(
                f"unknown network preset {name!r}; one of {sorted(NETWORK_PRESETS)}"
            )
        preset = asdict(NETWORK_PRESETS[name])  # down_median_mbps, ...
        return {**{k.replace("_median", ""): v for k, v in preset.items()}, **data}


class SlowdownSpec(_Choice):
    """A straggler's slowdown factor (>= 1; speed is divided by it): ``fixed``
    ``factor``, ``uniform`` U(low, high) or ``pareto`` 1 + Pareto(shape), at
    most ``max_factor``."""

    dist: Literal["fixed", "uniform", "pareto"] = "fixed"
    factor: Annotated[float, Field(ge=1)] = 4.0
    low: Annotated[float, Field(ge=1)] = 2.0
    high: Annotated[float, Field(ge=1)] = 10.0
    shape: PosFloat = 2.0
    max_factor: Annotated[float, Field(ge=1)] | None = None

    CHOICE: ClassVar[str] = "dist"
    USES: ClassVar[dict[str, str]] = {
        "fixed": "factor",
        "uniform": "low high",
        "pareto": "shape max_factor",
    }

    @model_validator(mode="after")
    def _range(self) -> SlowdownSpec:
        """A ``uniform`` slowdown's range is in order."""
        if self.dist == "uniform" and self.high < self.low:
            raise ValueError(f"high ({self.high}) must be >= low ({self.low})")
        return self


class StragglerSpec(_Spec):
    """Per round (or async job), each selected device is slowed with
    probability ``p`` by a factor from ``slowdown``, and drops out with
    probability ``dropout_p`` at a time uniform within its work."""

    p: Prob = 0.0
    slowdown: SlowdownSpec = SlowdownSpec()
    dropout_p: Prob = 0.0


class AvailabilitySpec(_Choice):
    """When a device is online: ``always``, ``on_off`` (exponential periods)
    or ``daily`` (docs/fleets.md, "Availability")."""

    kind: Literal["always", "on_off", "daily"] = "always"
    mean_on_s: PosFloat = 3600.0
    mean_off_s: PosFloat = 1800.0
    min_online: Prob = 0.06
    max_online: Prob = 0.12
    peak_hour: Annotated[float, Field(ge=0, lt=24)] = 2.0
    period_s: PosFloat = 86400.0

    CHOICE: ClassVar[str] = "kind"
    USES: ClassVar[dict[str, str]] = {
        "always": "",
        "on_off": "mean_on_s mean_off_s",
        "daily": "mean_on_s min_online max_online peak_hour period_s",
    }

    @model_validator(mode="after")
    def _profile(self) -> AvailabilitySpec:
        """A ``daily`` profile is one a Markov on/off chain can follow.

        The chain's online probability lags its input and is damped by the
        session length (docs/fleets.md, "Availability"); the input needed to
        produce the asked swing must itself stay a probability, which fails
        when sessions are long against the period.

        Raises:
            ValueError: the swing is inverted or degenerate, or too wide for
                sessions of ``mean_on_s``.
        """
        if self.kind == "daily":
            if self.max_online < self.min_online:
                raise ValueError(
                    f"max_online ({self.max_online}) must be >= min_online "
                    f"({self.min_online})"
                )
            if self.max_online == 0 or self.min_online == 1:
                raise ValueError(
                    "a daily cycle needs max_online > 0 and min_online < 1 "
                    "(use kind 'always' for a fleet that is always online)"
                )
            f_bar, amp_in, _, _ = _daily_input(self)
            if f_bar - amp_in / 2 < -1e-12 or f_bar + amp_in / 2 > 1 + 1e-12:
                raise ValueError(
                    f"sessions of mean_on_s={self.mean_on_s:g} s are too long to "
                    f"follow a daily swing from {self.min_online:g} to "
                    f"{self.max_online:g} online (the fleet cannot empty or fill "
                    "that fast); shorten mean_on_s or narrow the swing"
                )
        return self


class TraceSpec(_Spec):
    """A trace file of measured devices (:mod:`fedsim.traces`); ``period_s``
    repeats its availability intervals."""

    file: str = Field(min_length=1, max_length=4096)
    period_s: PosFloat | None = None


class DeviceGroup(_Spec):
    """A group of devices, drawn from ``speed`` and ``network`` or read from
    a ``trace``; without ``stragglers``, the fleet's apply."""

    name: str = Field(min_length=1, max_length=200)
    count: Annotated[int, Field(ge=1, le=10_000_000)]
    speed: SpeedSpec | None = None
    network: NetworkSpec = NetworkSpec()
    stragglers: StragglerSpec | None = None
    availability: AvailabilitySpec = AvailabilitySpec()
    trace: TraceSpec | None = None

    @model_validator(mode="before")
    @classmethod
    def _read_trace(cls, data: object, info: ValidationInfo) -> object:
        """Resolve a trace file (relative to the scenario's folder, from the
        validation context's ``base_dir``) and take ``count`` from its rows.

        Raises:
            ValueError: the file cannot be read as a trace, or ``count``
                disagrees with its number of rows.
        """
        if not isinstance(data, dict):
            return data  # not a mapping: the field validation says so
        trace = data.get("trace")
        if isinstance(trace, str):
            trace = {"file": trace}
        elif isinstance(trace, TraceSpec):
            trace = trace.model_dump()
        if not isinstance(trace, dict) or not isinstance(trace.get("file"), str):
            return data  # no trace, or field validation reports its shape
        context = info.context if isinstance(info.context, dict) else {}
        # a TraceError is a ValueError: pydantic reports its message as it is
        path = resolve_trace_path(trace["file"], context.get("base_dir"))
        rows = load_trace(path, trace.get("period_s")).size
        count = data.get("count")
        if count is not None and count != rows:
            raise ValueError(
                f"count is {count} but the trace {path} has {rows} rows "
                "(leave count out: a trace group has one device per row)"
            )
        return {**data, "trace": {**trace, "file": str(path)}, "count": rows}

    @model_validator(mode="after")
    def _speed_or_trace(self) -> DeviceGroup:
        """A group is drawn (``speed``, ``network``) or read from a trace,
        never both; a trace with availability intervals owns availability."""
        if self.trace is None:
            if self.speed is None:
                raise ValueError("speed is required (or read the group from a trace)")
            return self
        if self.speed is not None or self.network != NetworkSpec():
            raise ValueError("a trace group takes speed and network from its trace")
        custom = self.availability != AvailabilitySpec()
        if custom and self.load_trace().availability is not None:
            raise ValueError(
                "the trace has an availability column; drop the group's availability"
            )
        return self

    def load_trace(self) -> DeviceTrace:
        """The group's :class:`~fedsim.traces.DeviceTrace` (cached)."""
        assert self.trace is not None
        return load_trace(Path(self.trace.file), self.trace.period_s)


class FleetSpec(_Spec):
    """The devices; ``stragglers`` is the default of every group without its own."""

    groups: list[DeviceGroup] = Field(min_length=1, max_length=10_000)
    stragglers: StragglerSpec | None = None

    @property
    def size(self) -> int:
        """The number of devices m, over all groups."""
        return sum(g.count for g in self.groups)

    @property
    def per_flop(self) -> bool:
        """Whether some group's speed is in FLOP/s (the model's FLOPs per
        step are then needed to build the fleet)."""
        return any(g.speed is not None and g.speed.per_flop for g in self.groups)

    def stragglers_of(self, group: int) -> StragglerSpec:
        """Group ``group``'s straggler model: its own, else the fleet's."""
        return self.groups[group].stragglers or self.stragglers or StragglerSpec()

    @model_validator(mode="after")
    def _unique_names(self) -> FleetSpec:
        """Group names are unique (rows name them) and m is at most 10^7."""
        names = [g.name for g in self.groups]
        if len(set(names)) != len(names):
            raise ValueError(f"group names must be unique, got {names}")
        if self.size > 10_000_000:
            raise ValueError(f"fleet has {self.size} devices; the limit is 10,000,000")
        return self


# Tags that separate the random streams derived from one scenario seed: each
# kind of draw has its own stream, so adding a draw of one kind (or a group)
# never shifts the draws of another.
_TAG_SPEED = 0xF1EE7
_TAG_TIER = 0x71E5
_TAG_NETWORK = 0x9E7
_TAG_AVAILABILITY = 0xA7A11AB1E
# A device's behaviour in a synchronous round (common random numbers): the
# uniforms of device i in round t hash (seed, tag, i, t, slot).
_TAG_ROUND = 0x5D1CE
# The counter of the "on at t = 0?" draw: interval counters k never reach
# 2^63, so this hash input is never an interval's.
_INITIAL_STATE = np.uint64(1 << 63)
_MASK64 = (1 << 64) - 1
_EXP, _DAILY, _TRACE = 0, 1, 2  # kinds of availability process


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser, vectorised; uint64 arithmetic wraps by design.

    The availability kernel is counter-based: the uniform of device i's
    interval k is a hash of (seed, i, k), not the n-th output of a stream.
    Every interval of every device can then be drawn directly, in any order and
    any grouping of devices, with the same bits: what makes ``online(t)``
    cheap, resumable and independent of which devices were asked before.
    """
    z = x + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _stream_key(seed: int, tag: int) -> int:
    """The hash key of one kind of counter-based draw of the seed: kinds
    with different tags never share a uniform."""
    mixed_seed = _splitmix64(np.array([seed & _MASK64], dtype=np.uint64))
    return int(_splitmix64(mixed_seed ^ np.uint64(tag))[0])


def _unit(bits: np.ndarray) -> np.ndarray:
    """Top 53 bits of a hash as a float in the open interval (0, 1).

    The half-step offset keeps 0 out, so ``-log(u)`` is always finite.
    """
    return ((bits >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0**-53


def _daily_input(a: AvailabilitySpec) -> tuple[float, float, float, float]:
    """(f_bar, input amplitude, input peak time, time scale c) of the chain
    whose online probability follows ``a``'s profile.

    The on/off chain acts on its input as a first-order low-pass filter of
    time constant c: a sinusoid comes out damped by sqrt(1 + (omega c)^2)
    and late by atan(omega c) / omega. Inverting both gives the input that
    makes the online share peak at ``peak_hour`` with the asked swing.
    """
    f_bar = (a.min_online + a.max_online) / 2
    c = a.mean_on_s * (1 - f_bar)
    wc = 2 * math.pi / a.period_s * c
    amp_in = (a.max_online - a.min_online) * math.sqrt(1 + wc * wc)
    t_peak_in = a.peak_hour / 24.0 * a.period_s - math.atan(wc) / wc * c
    return f_bar, amp_in, t_peak_in, c


class _Walk(NamedTuple):
    """The devices :meth:`_OnOff._advance` is moving interval by interval,
    one entry each (``extra``: the per-device arrays its step reads).

    Each device's fields are updated by the same operations whatever the
    others do, which is what keeps the result bit for bit the same as
    advancing it alone; compacting (:meth:`only`) changes which devices
    are held, never a value.
    """

    pos: np.ndarray  # position in the ``idx`` being advanced
    first_on: np.ndarray  # on at t = 0
    k: np.ndarray  # interval counter
    start: np.ndarray  # when interval k began
    end: np.ndarray  # when it ends
    key: np.ndarray  # the device's hash key
    behind: np.ndarray  # its interval ends at or before t: move on
    extra: tuple[np.ndarray, ...]

    def only(self, keep: np.ndarray) -> _Walk:
        """The walk of the devices where ``keep`` holds, all behind."""
        return _Walk(
            self.pos[keep], self.first_on[keep], self.k[keep], self.start[keep],
            self.end[keep], self.key[keep], np.ones(np.count_nonzero(keep), bool),
            tuple(a[keep] for a in self.extra),
        )  # fmt: skip


class _OnOff:
    """Memo of each device's current on/off interval, advanced lazily, always
    by the same operations from interval 0 (docs/fleets.md, "Fleet draws").

    Device i's interval k is on when k is even and the device started on
    (odd, if it started off), and ends at a time drawn from a uniform hashed
    from (seed, i, k) (:func:`_splitmix64`). Guarantees: ``state_at(idx, t)``
    is a pure function of (seed, device, t), whatever was asked before and
    in whatever grouping; the memo only saves work. Asking about an earlier
    time replays those devices from interval 0, by the same operations.

    Args:
        seed: the scenario seed.
        group: each device's group index (``[m]``).
        specs: each group's availability.
        intervals: measured intervals per group index (traces), which
            replace that group's spec.
    """

    def __init__(
        self,
        seed: int,
        group: np.ndarray,
        specs: tuple[AvailabilitySpec, ...],
        intervals: dict[int, Intervals],
    ):
        self.group = group
        n = len(specs)
        self.kind = np.full(n, _EXP, dtype=np.int8)
        # daily: the chain's input f_in (docs/fleets.md, "Availability") has
        # F_in(t) = int f_in = f_bar t + beta sin(omega (t - t_peak_in)).
        self.mean_on, self.p_on = np.full(n, np.inf), np.ones(n)  # always on
        self.mean_off = np.array([a.mean_off_s for a in specs])
        self.f_bar, self.beta = np.zeros(n), np.zeros(n)
        self.omega, self.t_peak, self.c = np.ones(n), np.zeros(n), np.ones(n)
        for gi, a in enumerate(specs):
            if gi in intervals:
                self.kind[gi] = _TRACE
            elif a.kind == "daily":
                self.kind[gi] = _DAILY
                self.f_bar[gi], amp_in, self.t_peak[gi], self.c[gi] = _daily_input(a)
                omega = self.omega[gi] = 2 * math.pi / a.period_s
                self.beta[gi] = amp_in / (2 * omega)
                peak = a.peak_hour / 24.0 * a.period_s  # the profile at t = 0
                cos0 = math.cos(2 * math.pi * (0.0 - peak) / a.period_s)
                amp = a.max_online - a.min_online
                self.p_on[gi] = a.min_online + amp / 2 * (1 + cos0)
            elif a.kind == "on_off":
                self.mean_on[gi] = a.mean_on_s
                self.p_on[gi] = a.mean_on_s / (a.mean_on_s + a.mean_off_s)
        self.mixed = bool((self.kind != _EXP).any())
        self._init_traces(group, intervals, n)
        self.seed_key = _stream_key(seed, _TAG_AVAILABILITY)
        self._cache: tuple[np.ndarray, ...] | None = None

    def _init_traces(
        self, group: np.ndarray, intervals: dict[int, Intervals], n_groups: int
    ) -> None:
        """Pack every trace device's flip times into one flat array (CSR:
        ``tr_offsets[i]`` is device i's first flip), so that looking up the
        k-th flip of many devices at once is one gather."""
        self.tr_period = np.full(n_groups, np.inf)
        if not intervals:
            self.tr_first_on = self.tr_offsets = self.tr_times = None
            return
        starts = np.searchsorted(group, np.arange(n_groups))  # in group order
        first_on = np.zeros(group.size, dtype=bool)
        counts = np.zeros(group.size, dtype=np.int64)
        times = []
        for gi, iv in sorted(intervals.items()):
            fo, off, t = iv.flips()
            a = int(starts[gi])
            first_on[a : a + iv.size] = fo
            counts[a : a + iv.size] = np.diff(off)
            times.append(t)
            self.tr_period[gi] = iv.period_s or np.inf
        self.tr_first_on, self.tr_times = first_on, np.concatenate(times)
        self.tr_offsets = np.concatenate([[0], np.cumsum(counts)])

    def __getstate__(self) -> dict:
        # The memo can be tens of MB and is cheap to rebuild: do not ship it.
        return {**self.__dict__, "_cache": None}

    def _keys(self, idx: np.ndarray) -> np.ndarray:
        """Each device's hash key; interval k's uniform hashes key ^ k."""
        return _splitmix64(np.uint64(self.seed_key) ^ idx.astype(np.uint64))

    def _ends(
        self,
        dev: np.ndarray,
        g: np.ndarray,
        k: np.ndarray,
        start: np.ndarray,
        on: np.ndarray,
        key: np.ndarray,
    ) -> np.ndarray:
        """End of interval ``k`` (state ``on``, from ``start``) of each device.

        Args:
            dev: device ids; ``g`` their groups; ``key`` their hash keys.
            g: see ``dev``.
            k: each device's interval counter.
            start: when each interval began.
            on: whether each interval is an online one.
            key: see ``dev``.

        Returns:
            ``start + mean * E`` with E = -log u (exponential, memoryless),
            the daily chain's end for the same E, or the trace's k-th flip.
        """
        # every kind draws the same u, so a group's kind changes nothing else
        u = _unit(_splitmix64(key ^ k.astype(np.uint64)))
        end = start + -np.where(on, self.mean_on[g], self.mean_off[g]) * np.log(u)
        if not self.mixed:
            return end
        kind = self.kind[g]
        daily = np.flatnonzero(kind == _DAILY)
        if daily.size:
            end[daily] = self._daily_end(
                g[daily], start[daily], on[daily], -np.log(u[daily])
            )
        trace = np.flatnonzero(kind == _TRACE)
        if trace.size:
            end[trace] = self._trace_end(dev[trace], g[trace], k[trace])
        return end

    def _daily_end(
        self, g: np.ndarray, s: np.ndarray, on: np.ndarray, e: np.ndarray
    ) -> np.ndarray:
        """Solve H(t) = H(s) + c e, H = alpha t + beta sin(omega (t - t_peak))
        the integrated rate: safeguarded Newton within the bracket
        ``(y -+ |beta|) / alpha``, each element stopping on its own.

        An exponential E of a time-varying rate ends where the integrated
        rate has grown by E; H never decreases (alpha >= |beta omega|, which
        :meth:`AvailabilitySpec._profile` ensures), so the bracket holds the
        root. Each
        element runs the same iterations whichever other devices share the
        call (it stops on its own ``done``), keeping the result independent
        of the grouping.
        """
        f_bar, omega, t_peak = self.f_bar[g], self.omega[g], self.t_peak[g]
        alpha = np.where(on, 1.0 - f_bar, f_bar)
        beta = np.where(on, -self.beta[g], self.beta[g])

        def h(t: np.ndarray) -> np.ndarray:
            return alpha * t + beta * np.sin(omega * (t - t_peak))

        y = h(s) + self.c[g] * e
        lo = np.maximum(s, (y - np.abs(beta)) / alpha)
        hi = np.maximum(lo, (y + np.abs(beta)) / alpha)
        t = 0.5 * (lo + hi)
        active = np.ones(t.size, dtype=bool)
        for _ in range(200):
            r = h(t) - y
            lo = np.where(active & (r <= 0), t, lo)
            hi = np.where(active & (r >= 0), t, hi)
            slope = alpha + beta * omega * np.cos(omega * (t - t_peak))
            with np.errstate(divide="ignore", invalid="ignore"):
                nxt = t - r / slope
            # a Newton step outside the bracket falls back to bisection
            nxt = np.where((nxt > lo) & (nxt < hi), nxt, 0.5 * (lo + hi))
            done = np.abs(nxt - t) <= 1e-12 * np.maximum(1.0, np.abs(t))
            t = np.where(active, nxt, t)
            active &= ~done
            if not active.any():
                break
        return t

    def _trace_end(self, dev: np.ndarray, g: np.ndarray, k: np.ndarray) -> np.ndarray:
        """The k-th flip of each device's trace (``inf`` past the last one,
        without a period; with one, flip k is flip k mod n shifted by whole
        periods). A device with no flip keeps its first state forever."""
        assert self.tr_offsets is not None and self.tr_times is not None
        first = self.tr_offsets[dev]
        n = self.tr_offsets[dev + 1] - first
        period = self.tr_period[g]
        periodic = np.isfinite(period)
        n1 = np.maximum(n, 1)
        j = np.where(periodic, k % n1, np.minimum(k, n1 - 1))
        has = n > 0
        t = np.full(k.size, np.inf)
        t[has] = self.tr_times[(first + j)[has]]
        wraps = (k // n1) * np.where(periodic, period, 0.0)
        t = np.where(periodic & has, t + wraps, t)
        return np.where(~periodic & (k >= n), np.inf, t)

    def _first_interval(self, idx: np.ndarray) -> tuple[np.ndarray, ...]:
        """Interval 0 of devices ``idx``: (on at t = 0, k = 0, start 0, end).

        The first state is drawn from the stationary share ``p_on`` (the
        daily profile's value at t = 0), so the chain starts in equilibrium.
        """
        g = self.group[idx]
        key = self._keys(idx)
        u = _unit(_splitmix64(key ^ _INITIAL_STATE))
        first_on = u < self.p_on[g]
        if self.tr_first_on is not None:
            first_on = np.where(self.kind[g] == _TRACE, self.tr_first_on[idx], first_on)
        k = np.zeros(idx.size, dtype=np.int64)
        start = np.zeros(idx.size)
        return first_on, k, start, self._ends(idx, g, k, start, first_on, key)

    def _advance(self, idx: np.ndarray, t: float) -> tuple[np.ndarray, ...]:
        """The intervals of devices ``idx`` (all behind ``t``) that contain t;
        masked steps, compacted once most have caught up (gathers cost).

        Every device moves one interval per pass, masked where it has
        caught up, so each device's sequence of operations is the same
        whatever the batch: the same bits as advancing it alone.

        Returns:
            (k, start, end) of each device's interval containing ``t``.
        """
        assert self._cache is not None  # state_at filled it
        first_on, k, start, end = (a[idx] for a in self._cache)
        g = self.group[idx]
        step: Callable[[_Walk, np.ndarray], np.ndarray]
        if self.mixed:  # only the devices behind: a daily end costs a solve
            extra: tuple[np.ndarray, ...] = (g, idx)

            def step_mixed(w: _Walk, on: np.ndarray) -> np.ndarray:
                g_, dev = w.extra
                b = np.flatnonzero(w.behind)
                e = w.end.copy()
                e[b] = self._ends(dev[b], g_[b], w.k[b], w.start[b], on[b], w.key[b])
                return e

            step = step_mixed
        else:  # exponential only: the means travel along, no gathers per step
            extra = (self.mean_on[g], self.mean_off[g])

            def step_exp(w: _Walk, on: np.ndarray) -> np.ndarray:
                m_on, m_off = w.extra
                u = _unit(_splitmix64(w.key ^ w.k.astype(np.uint64)))
                drawn = w.start + -np.where(on, m_on, m_off) * np.log(u)
                return np.where(w.behind, drawn, w.end)

            step = step_exp

        walk = _Walk(
            np.arange(idx.size), first_on, k, start, end, self._keys(idx),
            np.ones(idx.size, dtype=bool), extra,
        )  # fmt: skip
        while True:
            n_behind = np.count_nonzero(walk.behind)
            if n_behind * 4 < walk.behind.size:  # flush caught-up devices, compact
                done = ~walk.behind
                p = walk.pos[done]
                k[p], start[p], end[p] = walk.k[done], walk.start[done], walk.end[done]
                walk = walk.only(walk.behind)
            if n_behind == 0:
                return k, start, end
            # only the devices behind move to their next interval
            kk = walk.k + walk.behind
            walk = walk._replace(
                k=kk, start=np.where(walk.behind, walk.end, walk.start)
            )
            on = walk.first_on ^ (kk & 1).astype(bool)
            e = step(walk, on)
            walk = walk._replace(end=e, behind=e <= t)

    def state_at(self, idx: np.ndarray, t: float) -> tuple[np.ndarray, np.ndarray]:
        """Whether each device in ``idx`` is on at ``t``, and when that ends.

        Args:
            idx: device ids (int64).
            t: a finite simulated time.

        Returns:
            (on, end): bool and float64 arrays like ``idx``; ``end`` is when
            the current state ends (inf: never).

        Raises:
            ValueError: ``t`` is not finite.
        """
        if not np.isfinite(t):
            raise ValueError(f"time must be finite, got {t}")
        if self._cache is None:
            self._cache = self._first_interval(np.arange(self.group.size))
        first_on, k, start, end = self._cache
        back = idx[start[idx] > t]  # asked about the past: replay from the start
        if back.size:
            _, k[back], start[back], end[back] = self._first_interval(back)
        todo = idx[end[idx] <= t]
        if todo.size:
            k[todo], start[todo], end[todo] = self._advance(todo, t)
        on = first_on[idx] ^ (k[idx] & 1).astype(bool)
        return on, end[idx]


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
    _onoff: _OnOff = field(init=False, repr=False)

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
        set_(self, "_onoff", _OnOff(self.seed, group, self.availability, intervals))

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
        (seed, i, t) (:func:`_splitmix64`, as availability's), not the n-th
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
        key = _splitmix64(
            np.uint64(_stream_key(self.seed, _TAG_ROUND)) ^ idx.astype(np.uint64)
        )
        cell = _splitmix64(key ^ np.uint64(t))  # device i in round t
        u = _unit(_splitmix64(cell[:, None] ^ _ROUND_SLOTS[None, :]))
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


def _stream(seed: int, tag: int) -> np.random.Generator:
    """The seed's stream for one kind of draw (see the ``_TAG_*`` values)."""
    return np.random.default_rng(np.random.SeedSequence([seed, tag]))


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
    z = _stream(seed, _TAG_SPEED).standard_normal(m)
    mixed = any(g.speed is not None and g.speed.dist == "mixture" for g in groups)
    spread = any(g.network.down_sigma or g.network.up_sigma for g in groups)
    tier_u = _stream(seed, _TAG_TIER).random(m) if mixed else np.zeros(m)
    net_z = np.zeros((m, 2))
    if spread:
        net_z = _stream(seed, _TAG_NETWORK).standard_normal((m, 2))
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
    if spec.dist != "mixture":  # a fixed speed is a lognormal with sigma 0
        spread = spec.sigma if spec.dist == "lognormal" else 0.0
        return spec.median_in_unit * np.exp(spread * z)
    assert spec.tiers is not None
    share = np.array([t.share for t in spec.tiers])
    cum = np.cumsum(share / share.sum())
    tier = np.minimum(np.searchsorted(cum, tier_u, side="right"), len(share) - 1)
    median = np.array([t.median for t in spec.tiers])[tier]
    sigma = np.array([t.sigma for t in spec.tiers])[tier]
    return median * np.exp(sigma * z)
