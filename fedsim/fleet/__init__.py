"""Devices of a simulated fleet: speed, network, availability and stragglers.

Three parts, one idea each: :mod:`~fedsim.fleet.spec` (the scenario's
``fleet`` section, validated), :mod:`~fedsim.fleet.availability` (the on/off
process deciding when a device is online) and :mod:`~fedsim.fleet.devices`
(the realised :class:`Fleet`, drawn from a spec and a seed);
:mod:`~fedsim.fleet.streams` holds the random streams the last two share.
A fleet is a pure function of ``(FleetSpec, seed)`` (and its trace files)
(docs/fleets.md, "Fleet draws"). Imports numpy only: no torch, no Ray.
"""

from fedsim.fleet.devices import Fleet, RoundDraws
from fedsim.fleet.spec import (
    AvailabilitySpec,
    DeviceGroup,
    FleetSpec,
    NetworkSpec,
    SlowdownSpec,
    SpeedSpec,
    SpeedTierSpec,
    StragglerSpec,
    TraceSpec,
)

__all__ = [
    "AvailabilitySpec",
    "DeviceGroup",
    "Fleet",
    "FleetSpec",
    "NetworkSpec",
    "RoundDraws",
    "SlowdownSpec",
    "SpeedSpec",
    "SpeedTierSpec",
    "StragglerSpec",
    "TraceSpec",
]
