"""The laws of one device, as the scenario's ``fleet`` section states them:
network, stragglers and availability, validated (the speed's forms are
:mod:`fedsim.fleet.speed`'s).

:mod:`fedsim.fleet.groups` gathers them into groups and the fleet;
:mod:`fedsim.fleet.devices` draws the devices from them. Imports pydantic
only: no torch, no Ray.
"""

from __future__ import annotations

import math
from dataclasses import asdict
from typing import TYPE_CHECKING, Annotated, ClassVar, Literal

from pydantic import (
    Field,
    model_validator,
)

from fedsim.presets import NETWORK_PRESETS
from fedsim.spec import NonNegFloat, PosFloat, Prob
from fedsim.spec import Spec as _Spec

if TYPE_CHECKING:  # built from the preset table at import
    NetworkPresetName = str
else:
    NetworkPresetName = Literal[tuple(NETWORK_PRESETS)]


class _Choice(_Spec):
    """A spec whose ``CHOICE`` field picks a variant that reads only some of
    the other fields (``USES``: the variant's fields, space-separated).

    ``fedsim validate`` prints a section with :attr:`used_fields` only, so a
    field the chosen variant ignores (``low`` on a fixed slowdown) does not read
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

    @property
    def mean_online(self) -> float:
        """The declared long-run share of time a device is online: 1
        (``always``), ``mean_on_s / (mean_on_s + mean_off_s)`` (``on_off``),
        or the daily profile's mean over a period, ``(min_online +
        max_online) / 2`` (``daily``)."""
        if self.kind == "on_off":
            return self.mean_on_s / (self.mean_on_s + self.mean_off_s)
        if self.kind == "daily":
            return (self.min_online + self.max_online) / 2
        return 1.0

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
