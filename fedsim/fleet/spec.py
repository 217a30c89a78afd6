"""The laws of one device, as the scenario's ``fleet`` section states them:
speed, network, stragglers and availability, validated.

:mod:`fedsim.fleet.groups` gathers them into groups and the fleet;
:mod:`fedsim.fleet.devices` draws the devices from them. Imports pydantic
only: no torch, no Ray.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict
from typing import TYPE_CHECKING, Annotated, ClassVar, Literal

from pydantic import Field, model_validator

from fedsim.presets import NETWORK_PRESETS, SPEED_PRESETS, WORKLOADS, speed_preset
from fedsim.spec import NonNegFloat, PosFloat, Prob
from fedsim.spec import Spec as _Spec

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
    # a variant's range given as two fields (low, high) that must be in order
    ORDERED: ClassVar[dict[str, tuple[str, str]]] = {}

    @property
    def used_fields(self) -> str:
        """The choosing field and the fields its value reads, space-separated."""
        return f"{self.CHOICE} {self.USES[getattr(self, self.CHOICE)]}".strip()

    @model_validator(mode="after")
    def _in_order(self) -> _Choice:
        """The chosen variant's range (``ORDERED``) is in order.

        Raises:
            ValueError: naming both fields and their values.
        """
        pair = self.ORDERED.get(getattr(self, self.CHOICE))
        if pair is not None:
            lo, hi = (getattr(self, name) for name in pair)
            if hi < lo:
                raise ValueError(f"{pair[1]} ({hi}) must be >= {pair[0]} ({lo})")
        return self


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
    (docs/fleets.md, "Speed"). Each law reads only its own fields, in one
    unit (the checks of ``_SPEED_CHECKS`` refuse the rest).

    Attributes:
        dist: the law: ``fixed``, ``lognormal`` or ``mixture``.
        steps_per_s: a ``fixed`` speed in steps/s.
        median_steps_per_s: a ``lognormal`` speed's median in steps/s.
        flops_per_s: a ``fixed`` speed in FLOP/s (instead of steps/s).
        median_flops_per_s: a ``lognormal`` median in FLOP/s.
        sigma: a ``lognormal`` speed's log-space spread (0: the median).
        tiers: a ``mixture``'s lognormal components.
        preset: measured phones that fill in the law (the fields given win).
        workload: the preset's workload its speeds were measured on.
        scale: a factor on the preset's speeds.
        unit: ``flops``: the preset's medians in FLOP/s, not steps/s.

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
        """Each distribution has the fields it needs and no other's: the
        checks of :data:`_SPEED_CHECKS`, in order, the first problem found
        reported (one line naming the fields).

        Raises:
            ValueError: both units given, tiers in mixed units, a missing
                median (``fixed``, ``lognormal``), ``unit`` without a preset,
                tiers missing or misplaced, ``workload``/``scale`` without a
                preset.
        """
        for check in _SPEED_CHECKS:
            if (problem := check(self)) is not None:
                raise ValueError(problem)
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


def _given(spec: SpeedSpec, unit: str) -> list[str]:
    """The speed fields of ``unit`` (``steps`` or ``flops``) that ``spec``
    sets, fixed before lognormal."""
    names = (f"{unit}_per_s", f"median_{unit}_per_s")
    return [k for k in names if getattr(spec, k)]


def _both_units(spec: SpeedSpec) -> str | None:
    """A speed is in steps/s or in FLOP/s: fields of both units are refused."""
    steps, flops = _given(spec, "steps"), _given(spec, "flops")
    if steps and flops:
        return (
            f"{steps[0]} and {flops[0]} are both given: a speed is in steps/s "
            "or in FLOP/s, not both"
        )
    return None


def _mixed_tier_units(spec: SpeedSpec) -> str | None:
    """A mixture's tiers share one unit (their medians are compared)."""
    if spec.tiers and len({t.median_flops_per_s is None for t in spec.tiers}) > 1:
        return "tiers: give every tier's median in the same unit"
    return None


def _missing_speed(spec: SpeedSpec) -> str | None:
    """``fixed`` and ``lognormal`` have their speed field, in the unit given
    (steps/s when none is), naming the other unit's field as the way out."""
    unit, other = ("flops", "steps") if _given(spec, "flops") else ("steps", "flops")
    need = _SPEED_FIELD[unit].get(spec.dist)
    if need is not None and getattr(spec, need) is None:
        return f"dist '{spec.dist}' needs {need} (or {_SPEED_FIELD[other][spec.dist]})"
    return None


def _unit_without_preset(spec: SpeedSpec) -> str | None:
    """``unit`` picks a preset's unit; elsewhere a field's name says it."""
    if spec.unit is not None and spec.preset is None:
        return (
            "unit goes with a preset (a field's name says its unit: "
            "median_steps_per_s or median_flops_per_s)"
        )
    return None


def _misplaced_tiers(spec: SpeedSpec) -> str | None:
    """Tiers exactly when the distribution is a ``mixture``."""
    if spec.dist == "mixture" and not spec.tiers:
        return "dist 'mixture' needs tiers (or a preset)"
    if spec.dist != "mixture" and spec.tiers is not None:
        return "tiers go with dist 'mixture'"
    return None


def _preset_args_alone(spec: SpeedSpec) -> str | None:
    """``workload`` and ``scale`` only say how a preset is read."""
    if spec.preset is None and (spec.workload is not None or spec.scale != 1.0):
        return "workload and scale go with a preset"
    return None


# SpeedSpec._one_speed's checks, in the order their problems are reported.
_SPEED_CHECKS: tuple[Callable[[SpeedSpec], str | None], ...] = (
    _both_units,
    _mixed_tier_units,
    _missing_speed,
    _unit_without_preset,
    _misplaced_tiers,
    _preset_args_alone,
)


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
    ORDERED: ClassVar[dict[str, tuple[str, str]]] = {"uniform": ("low", "high")}


class StragglerSpec(_Spec):
    """Per round (or async job), each selected device is slowed with
    probability ``p`` by a factor from ``slowdown``, and drops out with
    probability ``dropout_p`` at a time uniform within its work."""

    p: Prob = 0.0
    slowdown: SlowdownSpec = SlowdownSpec()
    dropout_p: Prob = 0.0


class AvailabilitySpec(_Choice):
    """When a device is online: ``always``, ``on_off`` (exponential periods)
    or ``daily`` (docs/fleets.md, "Availability");
    :mod:`fedsim.fleet.availability` runs the process.

    Attributes:
        kind: ``always``, ``on_off`` or ``daily``.
        mean_on_s: mean length of an online session (``on_off``, ``daily``).
        mean_off_s: mean length of an offline spell (``on_off``).
        min_online: the daily profile's lowest share of devices online.
        max_online: its highest share.
        peak_hour: the hour of the period at which the share peaks.
        period_s: the profile's period (a day by default).
    """

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
    ORDERED: ClassVar[dict[str, tuple[str, str]]] = {
        "daily": ("min_online", "max_online")
    }

    @model_validator(mode="after")
    def _profile(self) -> AvailabilitySpec:
        """A ``daily`` profile is one a Markov on/off chain can follow.

        The chain's online probability lags its input and is damped by the
        session length (docs/fleets.md, "Availability"); the input needed to
        produce the asked swing must itself stay a probability, which fails
        when sessions are long against the period.

        Raises:
            ValueError: the swing is degenerate, or too wide for sessions of
                ``mean_on_s`` (an inverted one is refused by ``ORDERED``).
        """
        if self.kind == "daily":
            if self.max_online == 0 or self.min_online == 1:
                raise ValueError(
                    "a daily cycle needs max_online > 0 and min_online < 1 "
                    "(use kind 'always' for a fleet that is always online)"
                )
            f_bar, amp_in, _, _ = daily_input(self)
            if f_bar - amp_in / 2 < -1e-12 or f_bar + amp_in / 2 > 1 + 1e-12:
                raise ValueError(
                    f"sessions of mean_on_s={self.mean_on_s:g} s are too long to "
                    f"follow a daily swing from {self.min_online:g} to "
                    f"{self.max_online:g} online (the fleet cannot empty or fill "
                    "that fast); shorten mean_on_s or narrow the swing"
                )
        return self


def daily_input(a: AvailabilitySpec) -> tuple[float, float, float, float]:
    """(f_bar, input amplitude, input peak time, time scale c) of the chain
    whose online probability follows ``a``'s profile.

    The on/off chain acts on its input as a first-order low-pass filter of
    time constant c: a sinusoid comes out damped by sqrt(1 + (omega c)^2)
    and late by atan(omega c) / omega. Inverting both gives the input that
    makes the online share peak at ``peak_hour`` with the asked swing.
    It lives beside the spec because validating a ``daily`` section needs it
    (the input must stay a probability); :mod:`fedsim.fleet.availability`
    drives the chain with it.
    """
    f_bar = (a.min_online + a.max_online) / 2
    c = a.mean_on_s * (1 - f_bar)
    wc = 2 * math.pi / a.period_s * c
    amp_in = (a.max_online - a.min_online) * math.sqrt(1 + wc * wc)
    t_peak_in = a.peak_hour / 24.0 * a.period_s - math.atan(wc) / wc * c
    return f_bar, amp_in, t_peak_in, c
