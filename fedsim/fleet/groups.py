"""The fleet's groups of devices: how many, which laws, or which trace file.

:class:`FleetSpec` is the scenario's whole ``fleet`` section; the laws each
group names live in :mod:`fedsim.fleet.speed` and
:mod:`fedsim.fleet.spec`. Imports pydantic only: no
torch, no Ray.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import Field, ValidationInfo, model_validator

from fedsim.fleet.spec import AvailabilitySpec, NetworkSpec, StragglerSpec
from fedsim.fleet.speed import SpeedSpec
from fedsim.spec import PosFloat
from fedsim.spec import Spec as _Spec
from fedsim.traces import DeviceTrace, load_trace, resolve_trace_path


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
