"""A device's compute speed, as the scenario's ``fleet`` section states it:
one typed form per law (``fixed``, ``lognormal``, ``mixture`` of lognormal
tiers), in steps/s or in FLOP/s, chosen by ``dist``; a ``preset`` (measured
phones) is resolved into one of them before validation (docs/fleets.md,
"Speed"). :data:`SpeedSpec` is their union; :func:`speed_spec` builds one
from keyword arguments.

The other laws of a device (network, stragglers, availability) are in
:mod:`fedsim.fleet.spec`. Imports pydantic only: no torch, no Ray.
"""

from __future__ import annotations

import math
from abc import abstractmethod
from typing import Annotated, Any, ClassVar, Literal, Self

from pydantic import (
    AfterValidator,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    SerializerFunctionWrapHandler,
    TypeAdapter,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WrapValidator,
    model_serializer,
    model_validator,
)
from pydantic_core import ErrorDetails, InitErrorDetails, PydanticCustomError

from fedsim.presets import SPEED_PRESETS, WORKLOADS, speed_preset
from fedsim.spec import NonNegFloat, PosFloat
from fedsim.spec import Spec as _Spec

SpeedPresetName = Literal[SPEED_PRESETS]  # type: ignore[valid-type]
WorkloadName = Literal[WORKLOADS]  # type: ignore[valid-type]


def _plausible_sigma(sigma: float) -> float:
    """A sigma above 5 is almost surely a unit mistake (speeds would span
    four orders of magnitude within one group)."""
    if sigma > 5:
        raise ValueError("sigma above 5 gives speeds spanning 10^4x; check units")
    return sigma


Sigma = Annotated[NonNegFloat, AfterValidator(_plausible_sigma)]


class SpeedTierSpec(_Spec):
    """One lognormal component of a ``mixture`` speed distribution, its
    median in steps/s or in FLOP/s (one of the two)."""

    name: str = Field("", max_length=200)
    share: PosFloat
    median_steps_per_s: PosFloat | None = None
    median_flops_per_s: PosFloat | None = None
    sigma: Sigma = 0.0

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
    def median_in_unit(self) -> float:
        """The tier's median in its own unit (steps/s or FLOP/s)."""
        m = self.median_steps_per_s or self.median_flops_per_s
        assert m is not None  # _one_median
        return m


# A speed's dump as when one model held every law: each form's own fields,
# the other laws' at these empty values, in this order (a run's fingerprint
# is its scenario's dump, so it stays the same); a resolved scenario read
# back drops them again (_resolve).
_DUMP: dict[str, object] = {
    "dist": None, "steps_per_s": None, "median_steps_per_s": None,
    "flops_per_s": None, "median_flops_per_s": None, "sigma": 0.0,
    "tiers": None, "preset": None, "workload": None, "scale": 1.0, "unit": None,
}  # fmt: skip


class _SpeedForm(_Spec):
    """What every speed form shares: ``dist``, where a preset's numbers came
    from, and the questions asked of any speed law (a form answers each for
    its own law, so callers need not branch on ``dist`` to ask them).

    Attributes:
        dist: the law: ``fixed``, ``lognormal`` or ``mixture``.
        preset: measured phones that filled the law in (the fields given win).
        workload: the preset's workload its speeds were measured on.
        scale: a factor on the preset's speeds.
        unit: ``flops``: the preset's medians in FLOP/s, not steps/s.
    """

    dist: str
    preset: SpeedPresetName | None = None
    workload: WorkloadName | None = None
    scale: PosFloat = 1.0
    unit: Literal["steps", "flops"] | None = None

    @model_validator(mode="after")
    def _preset_args_alone(self) -> Self:
        """``unit``, ``workload`` and ``scale`` only say how a preset is read
        (elsewhere a field's name says its unit)."""
        if self.preset is None and self.unit is not None:
            raise ValueError(
                "unit goes with a preset (a field's name says its unit: "
                "median_steps_per_s or median_flops_per_s)"
            )
        if self.preset is None and (self.workload is not None or self.scale != 1.0):
            raise ValueError("workload and scale go with a preset")
        return self

    @model_serializer(mode="wrap")
    def _dump_every_law(self, handler: SerializerFunctionWrapHandler) -> object:
        """The form's fields within every law's, as :data:`_DUMP` orders them."""
        return {**_DUMP, **handler(self)}

    @property
    @abstractmethod
    def per_flop(self) -> bool:
        """Whether the speed is in FLOP/s (its fields' names say the unit)."""

    @abstractmethod
    def laws(self) -> list[tuple[float, float]]:
        """(median in the spec's unit, sigma) of each lognormal the speed is
        made of (a ``fixed`` speed: its speed, sigma 0)."""

    @abstractmethod
    def quantile_in_unit(self, q: float) -> float:
        """The q-quantile of the declared law, in the spec's own unit."""

    @property
    def median_in_unit(self) -> float:
        """The median speed in the spec's own unit: steps/s or FLOP/s."""
        return self.quantile_in_unit(0.5)

    @property
    def median(self) -> float:
        """The median speed in steps/s (of the mixture, for ``mixture``, so
        selectors can rank groups); NaN for a speed in FLOP/s, whose steps/s
        depend on the model's FLOPs (:attr:`median_in_unit` holds its FLOP/s)."""
        return math.nan if self.per_flop else self.median_in_unit

    @property
    def used_fields(self) -> str:
        """``dist``, ``preset workload scale`` (and ``unit`` in FLOP/s) when a
        preset filled the law in (they say where its numbers came from), then
        the law's own fields in its unit: what ``fedsim validate`` prints."""
        own = [k for k in type(self).model_fields if k not in _SpeedForm.model_fields]
        given = [k for k in own if getattr(self, k) is not None]
        unit = ["unit"] * self.per_flop
        source = ["preset", "workload", "scale", *unit] if self.preset else []
        return " ".join(["dist", *source, *given])


class _OneLaw(_SpeedForm):
    """A ``fixed`` or ``lognormal`` speed: one value in one unit, by the
    field's name (``UNITS``: the field in steps/s, the field in FLOP/s)."""

    UNITS: ClassVar[tuple[str, str]]

    @model_validator(mode="after")
    def _one_unit(self) -> Self:
        """Exactly one of the two :attr:`UNITS` fields.

        Raises:
            ValueError: both (naming them), or neither (naming the law).
        """
        steps, flops = (getattr(self, name) for name in self.UNITS)
        if steps is not None and flops is not None:
            raise ValueError(
                f"{self.UNITS[0]} and {self.UNITS[1]} are both given: a speed "
                "is in steps/s or in FLOP/s, not both"
            )
        if steps is None and flops is None:
            raise ValueError(
                f"dist '{self.dist}' needs {self.UNITS[0]} (or {self.UNITS[1]})"
            )
        return self

    @property
    def per_flop(self) -> bool:
        """Whether the speed is in FLOP/s (the FLOP/s field is given)."""
        return getattr(self, self.UNITS[1]) is not None

    @property
    def value(self) -> float:
        """The speed (a ``lognormal``'s median) in its own unit."""
        return float(getattr(self, self.UNITS[self.per_flop]))

    def quantile_in_unit(self, q: float) -> float:
        """The q-quantile of the law, in its own unit.

        Example:
            >>> s = speed_spec(dist="lognormal", median_steps_per_s=2.0, sigma=0.5)
            >>> round(s.quantile_in_unit(0.9), 4)  # 2 exp(0.5 z_0.9)
            3.7959
        """
        ((median, sigma),) = self.laws()  # a fixed speed: exp(0 z) = 1
        return median if q == 0.5 else median * math.exp(sigma * _normal_quantile(q))


class FixedSpeed(_OneLaw):
    """Every device of the group at one speed, in steps/s or in FLOP/s."""

    dist: Literal["fixed"] = "fixed"
    steps_per_s: PosFloat | None = None
    flops_per_s: PosFloat | None = None

    UNITS: ClassVar[tuple[str, str]] = ("steps_per_s", "flops_per_s")

    def laws(self) -> list[tuple[float, float]]:
        """See :meth:`_SpeedForm.laws`: one point mass."""
        return [(self.value, 0.0)]


class LognormalSpeed(_OneLaw):
    """``median * exp(sigma * z)``, z standard normal per device; the median
    in steps/s or in FLOP/s."""

    dist: Literal["lognormal"] = "lognormal"
    median_steps_per_s: PosFloat | None = None
    median_flops_per_s: PosFloat | None = None
    sigma: Sigma = 0.0

    UNITS: ClassVar[tuple[str, str]] = ("median_steps_per_s", "median_flops_per_s")

    def laws(self) -> list[tuple[float, float]]:
        """See :meth:`_SpeedForm.laws`: one lognormal."""
        return [(self.value, self.sigma)]


class MixtureSpeed(_SpeedForm):
    """A tier per device (probability proportional to its ``share``), then
    that tier's lognormal; every tier's median in one unit."""

    dist: Literal["mixture"] = "mixture"
    tiers: list[SpeedTierSpec] = Field(min_length=1, max_length=100)

    @model_validator(mode="after")
    def _one_unit(self) -> Self:
        """The tiers share one unit (their medians are compared)."""
        if len({t.median_flops_per_s is None for t in self.tiers}) > 1:
            raise ValueError("tiers: give every tier's median in the same unit")
        return self

    @property
    def per_flop(self) -> bool:
        """Whether the tiers' medians are in FLOP/s."""
        return self.tiers[0].median_flops_per_s is not None

    def laws(self) -> list[tuple[float, float]]:
        """See :meth:`_SpeedForm.laws`: each tier's."""
        return [(t.median_in_unit, t.sigma) for t in self.tiers]

    def quantile_in_unit(self, q: float) -> float:
        """The mixture's q-quantile, by bisection on its CDF."""
        return _mixture_quantile(self.tiers, q)


_FORMS: dict[str, type[_SpeedForm]] = {
    "fixed": FixedSpeed,
    "lognormal": LognormalSpeed,
    "mixture": MixtureSpeed,
}


def _resolve(data: object) -> object:
    """The ``speed`` section as its form reads it: a ``preset`` filled in
    (:func:`_fill_from_preset`), ``dist`` fixed when left out, and another
    law's field at its empty value (as a resolved scenario's dump writes
    it, :data:`_DUMP`) dropped."""
    if not isinstance(data, dict):
        return data  # not a mapping: the form says so
    if data.get("preset") is not None:
        data = _fill_from_preset(data)
    data = {"dist": "fixed", **data}
    form = _FORMS.get(data["dist"]) if isinstance(data["dist"], str) else None
    if form is None:
        return data  # the union says the law is unknown
    return {k: v for k, v in data.items() if k in form.model_fields or not _empty(k, v)}


def _empty(key: str, value: object) -> bool:
    """Whether ``value`` is ``key``'s empty value in :data:`_DUMP` (a number
    equal to it, or None)."""
    if key not in _DUMP or _DUMP[key] is None:
        return key in _DUMP and value is None
    return type(value) in (int, float) and value == _DUMP[key]


def _fill_from_preset(data: dict[str, Any]) -> dict[str, Any]:
    """A ``preset`` (measured phones, docs/fleets.md "Speed") becomes the
    law it stands for: one tier a ``lognormal``, several a ``mixture``.
    Fields given in the scenario win over the preset's.

    Raises:
        ValueError: an unknown preset or workload, or a ``dist`` that is not
            the preset's law.
    """
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
    law = "mixture" if len(tiers) > 1 else "lognormal"
    if data.get("dist", law) != law:
        raise ValueError(f"preset {name!r} is a {law} speed: leave dist out")
    if len(tiers) > 1:  # the fields given win
        return {"dist": law, "tiers": tiers, **data}
    return {"dist": law, key: tiers[0][key], "sigma": tiers[0]["sigma"], **data}


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


def _untagged(data: object, handler: ValidatorFunctionWrapHandler) -> object:
    """Validate by the union, its errors said as of the ``speed`` section:
    without the law pydantic puts first in a form's error locations, an
    unknown ``dist`` as the field's own error, and a field of another law
    named with the law it goes with (the scenario's formatter then writes
    each as one line)."""
    try:
        return handler(data)
    except ValidationError as err:
        errors = [_plain(e) for e in err.errors(include_url=False)]
        raise ValidationError.from_exception_data(err.title, errors) from None


def _plain(e: ErrorDetails) -> InitErrorDetails:
    """One error of the union as one of the ``speed`` section."""
    tag = e["loc"][0] if e["loc"] else None  # the form pydantic validated
    loc = e["loc"][1:] if tag in _FORMS else e["loc"]
    if e["type"] == "union_tag_invalid":  # an unknown dist
        expected = {"expected": "'fixed', 'lognormal' or 'mixture'"}
        dist = e["input"]["dist"]  # a tag is read from a mapping
        return {
            "type": "literal_error",
            "loc": ("dist",),
            "input": dist,
            "ctx": expected,
        }
    if e["type"] == "extra_forbidden" and (law := _law_of(loc)) is not None:
        why = "goes with dist '{law}', not '{dist}'"
        error = PydanticCustomError("speed_law", why, {"law": law, "dist": tag})
        return {"type": error, "loc": loc, "input": e["input"]}
    out: InitErrorDetails = {"type": e["type"], "loc": loc, "input": e["input"]}
    if "ctx" in e:
        out["ctx"] = e["ctx"]
    return out


def _law_of(loc: tuple[int | str, ...]) -> str | None:
    """The law whose field ``loc`` (of a speed section) is, if any."""
    key = loc[0] if len(loc) == 1 else None
    return next((d for d, form in _FORMS.items() if key in form.model_fields), None)


# A group's ``speed``: one of the three forms, chosen by ``dist`` (fixed when
# left out), each with its own fields only, in steps/s or in FLOP/s (the
# fields' names say which); a ``preset`` becomes the law it stands for
# (docs/fleets.md, "Speed"). speed_spec builds one from keyword arguments.
SpeedSpec = Annotated[
    Annotated[FixedSpeed | LognormalSpeed | MixtureSpeed, Discriminator("dist")],
    BeforeValidator(_resolve),
    WrapValidator(_untagged),
]
_SPEED: TypeAdapter[SpeedSpec] = TypeAdapter(
    SpeedSpec, config=ConfigDict(title="speed")
)


def speed_spec(**fields: object) -> SpeedSpec:
    """A speed from the fields a scenario's ``speed`` section takes, checked
    as a scenario's are.

    Raises:
        pydantic.ValidationError: a field missing, wrong, or of another law.

    Example:
        >>> speed_spec(preset="flash-phones-mid").median_steps_per_s
        1.7006802721088434
        >>> speed_spec(preset="flash-phones-mid", unit="flops").median_flops_per_s
        1734983401.3605442
    """
    return _SPEED.validate_python(fields)


def _mixture_cdf(tiers: list[SpeedTierSpec], x: float) -> float:
    """P(speed <= x) under a mixture of lognormal tiers (a tier with sigma
    0 is a point mass at its median)."""
    total = sum(t.share for t in tiers)
    out = 0.0
    for t in tiers:
        if t.sigma == 0:
            out += t.share * (x >= t.median_in_unit)
        else:
            z = math.log(x / t.median_in_unit) / t.sigma
            out += t.share * 0.5 * (1 + math.erf(z / math.sqrt(2)))
    return out / total


def _mixture_quantile(tiers: list[SpeedTierSpec], q: float) -> float:
    """The mixture's q-quantile, by 100 bisections in log space between six
    sigmas below the slowest tier and six above the fastest (the CDF is
    monotone there, and 100 halvings reach float precision)."""
    lo = min(t.median_in_unit * math.exp(-6 * t.sigma) for t in tiers)
    hi = max(t.median_in_unit * math.exp(6 * t.sigma) for t in tiers)
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
