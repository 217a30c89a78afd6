"""Devices of a simulated fleet: speed, network, availability and stragglers.

Three ideas, a module or two each: the schema (one device's laws:
:mod:`~fedsim.fleet.speed` and :mod:`~fedsim.fleet.spec`;
:mod:`~fedsim.fleet.groups`, the groups and the whole ``fleet`` section),
the on/off process deciding when a device is online
(:mod:`~fedsim.fleet.availability`) and the realised :class:`Fleet`, drawn
from a spec and a seed (:mod:`~fedsim.fleet.devices`);
:mod:`~fedsim.fleet.streams` holds the random streams the last two share.
A fleet is a pure function of ``(FleetSpec, seed)`` (and its trace files)
(docs/fleets.md, "Fleet draws"). Imports numpy only: no torch, no Ray.
"""

from fedsim.fleet.devices import Fleet, RoundDraws
from fedsim.fleet.groups import DeviceGroup, FleetSpec, TraceSpec
from fedsim.fleet.spec import AvailabilitySpec, NetworkSpec, SlowdownSpec, StragglerSpec
from fedsim.fleet.speed import (
    FixedSpeed,
    LognormalSpeed,
    MixtureSpeed,
    SpeedSpec,
    SpeedTierSpec,
    speed_spec,
)

__all__ = [
    "AvailabilitySpec",
    "DeviceGroup",
    "FixedSpeed",
    "Fleet",
    "FleetSpec",
    "LognormalSpeed",
    "MixtureSpeed",
    "NetworkSpec",
    "RoundDraws",
    "SlowdownSpec",
    "SpeedSpec",
    "SpeedTierSpec",
    "StragglerSpec",
    "TraceSpec",
    "speed_spec",
]
