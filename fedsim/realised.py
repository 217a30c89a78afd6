"""Declared against realised: what the fleet actually did in a run, group by
group, beside what the scenario declared, with a warning for every value
outside its sampling interval (docs/results.md, "Declared against realised").

A fleet is drawn from distributions and its behaviour from probabilities, so
what a run's devices did differs from the scenario's numbers by sampling
noise, and sometimes by much more: a deadline that drops most updates, a
group never online when rounds start, dropouts pre-empted by devices going
offline first. This module measures, from the fleet and the run's rows:

- speed quantiles (10%, 50%, 90%) of the group's devices, in steps/s,
  against the declared law's (``fixed``, ``lognormal``, ``mixture``; FLOP/s
  laws divided by the model's FLOPs per step);
- the online fraction at round starts (asynchronous runs: at the times
  versions were made) against the availability's declared long-run share
  (``always`` 1, ``on_off`` ``mean_on / (mean_on + mean_off)``, ``daily``
  ``(min_online + max_online) / 2``), so that rounds which only ever see
  one part of the day are flagged;
- the straggler rate (selected updates with a slowdown > 1) against ``p``,
  the dropout rate (of the updates whose work started) against
  ``dropout_p``, and the shares dropped as ``late`` (a deadline),
  ``no_time`` (a window too short) and ``offline``, whose declared value is
  none: a scenario does not mean to drop updates.

Each declared value gets a 99.9% sampling interval (normal approximation
of a binomial share, with a continuity slack of 1/(2n)); the wide level
keeps the many checks of a run from crying wolf on noise. Imports numpy
and the fleet only: no torch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NotRequired, Protocol, TypedDict

import numpy as np

from fedsim.fleet import AvailabilitySpec, Fleet, FleetSpec, SpeedSpec, StragglerSpec
from fedsim.rows import Row, number, whole
from fedsim.secagg import secagg_summary
from fedsim.servertime import server_summary

# 99.9% two-sided normal quantile: z with Phi(z) = 0.9995.
_Z = 3.2905267314919255
_QUANTILES = (0.1, 0.5, 0.9)
# a drop reason with no declared rate warns when it takes this share or more
_MOST = 0.5


class _Policy(Protocol):
    """The ``round`` section, as far as this module reads it."""

    @property
    def policy(self) -> str:
        """``fixed_window``, ``fixed_epochs``, ``async``, ..."""


class _Client(Protocol):
    """The ``client`` section, as far as this module reads it."""

    @property
    def batch_size(self) -> int:
        """The local batch size (a FLOP/s speed's steps are of this size)."""


class RunSections(Protocol):
    """The scenario sections :func:`summary_entry` reads (a
    :class:`fedsim.scenario.Scenario` has them): the fleet as declared, the
    round policy and the client batch size."""

    @property
    def fleet(self) -> FleetSpec:
        """The fleet section."""

    @property
    def round(self) -> _Policy:
        """The round section."""

    @property
    def client(self) -> _Client:
        """The client section."""


class Speed(TypedDict):
    """A group's speed quantiles in steps/s (``declared`` None: a trace)."""

    quantiles: list[float]
    declared: list[float] | None
    realised: list[float]


class Online(TypedDict):
    """A group's mean online share at the start times, against the declared
    long-run share (None: a trace's measured intervals)."""

    declared: float | None
    realised: float
    starts: int


class Rate(TypedDict):
    """A share of ``n`` updates against its declared rate and that rate's
    99.9% sampling interval (None without any update)."""

    declared: float
    realised: float
    n: int
    interval: list[float] | None


class GroupEntry(TypedDict):
    """One device group's row of ``fleet_realised.groups``."""

    group: str
    devices: int
    selected: int
    speed_steps_per_s: Speed
    online_at_starts: Online
    straggler_rate: Rate
    dropout_rate: Rate
    dropped: dict[str, float]


class Realised(TypedDict):
    """summary.json's ``fleet_realised`` (``server``: a server that takes
    time, :func:`fedsim.servertime.server_summary`)."""

    groups: list[GroupEntry]
    warnings: list[str]
    server: NotRequired[dict[str, float]]
    # secure aggregation's failed rounds and unmasking (fedsim/secagg.py)
    secure_aggregation: NotRequired[dict[str, float]]


class _Rates(TypedDict):
    """What :func:`_rates` adds to a group's entry."""

    straggler_rate: Rate
    dropout_rate: Rate
    dropped: dict[str, float]


class GroupCompute(TypedDict):
    """A FLOP/s group's median speed, in FLOP/s and in steps/s."""

    median_flops_per_s: float
    median_steps_per_s: float


class Compute(TypedDict):
    """summary.json's ``compute``: the model's FLOPs per local step."""

    flops_per_step: float
    batch_size: int
    groups: dict[str, GroupCompute]


class SummaryEntry(TypedDict, total=False):
    """What :func:`summary_entry` adds to summary.json (nothing without a
    fleet; ``compute`` only when a speed is in FLOP/s)."""

    compute: Compute
    fleet_realised: Realised


def summary_entry(
    scenario: RunSections,
    fleet: Fleet | None,
    rows: Sequence[Row],
    clients: Sequence[Row],
) -> SummaryEntry:
    """summary.json's ``fleet_realised`` (and ``compute`` when a speed is in
    FLOP/s); {} without a fleet (a run interrupted during set-up).

    Args:
        scenario: the run's scenario (its ``fleet`` section, ``round``
            policy and client batch size are read).
        fleet: the fleet the run drew.
        rows: rounds.parquet's rows.
        clients: clients.parquet's rows.
    """
    out = SummaryEntry()
    if fleet is None:
        return out
    if fleet.step_flops is not None:
        out["compute"] = compute_entry(scenario, fleet)
    asynchronous = scenario.round.policy == "async"
    starts = _start_times(rows, clients, asynchronous)
    out["fleet_realised"] = realised_fleet(
        fleet, scenario.fleet, starts, clients, asynchronous
    )
    server = server_summary(rows)
    if server is not None:  # the server's busy share and queue
        out["fleet_realised"]["server"] = server
    secagg = secagg_summary(rows)
    if secagg is not None:  # the rounds secure aggregation lost
        out["fleet_realised"]["secure_aggregation"] = secagg
    return out


def compute_entry(scenario: RunSections, fleet: Fleet) -> Compute:
    """The model's FLOPs per local step and each FLOP/s group's median, in
    FLOP/s and in the steps/s it becomes (``validate`` prints the same).

    Raises:
        ValueError: ``fleet`` has no FLOPs per step (no speed is in FLOP/s).
    """
    flops = fleet.step_flops
    if flops is None:
        raise ValueError("compute_entry: the fleet has no FLOPs per step")
    groups = {}
    for g in scenario.fleet.groups:
        if g.speed is not None and g.speed.per_flop:
            median = g.speed.median_in_unit
            groups[g.name] = GroupCompute(
                median_flops_per_s=median, median_steps_per_s=median / flops
            )
    return Compute(
        flops_per_step=flops, batch_size=scenario.client.batch_size, groups=groups
    )


def _start_times(
    rows: Sequence[Row],
    clients: Sequence[Row],
    asynchronous: bool,
) -> np.ndarray:
    """When each round started (its devices' common ``t_start``), sorted;
    asynchronous runs: when each version was made."""
    if asynchronous:
        return np.sort(np.array([number(r["sim_time"], "sim_time") for r in rows]))
    first: dict[int, float] = {}
    for c in clients:
        t, rnd = number(c["t_start"], "t_start"), whole(c["round"], "round")
        first[rnd] = min(t, first.get(rnd, t))
    return np.sort(np.array(list(first.values()), dtype=np.float64))


def realised_fleet(
    fleet: Fleet,
    spec: FleetSpec,
    starts: np.ndarray,
    clients: Sequence[Row],
    asynchronous: bool,
) -> Realised:
    """Per group, each measured value beside its declared one, and the
    warnings (see the module's docstring).

    Args:
        fleet: the run's fleet.
        spec: the scenario's fleet section (``groups``, ``stragglers_of``).
        starts: the round start times (asynchronous: version times), sorted.
        clients: clients.parquet's rows (each names its ``device_group``).
        asynchronous: the run's mode (its starts are version times).

    Returns:
        ``{"groups": [...], "warnings": [...]}``: per group ``devices``,
        ``selected`` (its rows), ``speed_steps_per_s`` (the 10%, 50% and 90%
        quantiles, declared and realised), ``online_at_starts``,
        ``straggler_rate`` and ``dropout_rate`` (declared, realised, the
        updates counted ``n`` and the sampling ``interval``) and
        ``dropped`` (the shares dropped ``late``, ``no_time``, ``offline``).
    """
    online = [fleet.online(float(t)) for t in starts]
    by_group = _by_group(clients)
    groups: list[GroupEntry] = []
    warnings: list[str] = []
    when = "when versions were made" if asynchronous else "when rounds started"
    for gi, g in enumerate(spec.groups):
        devices = np.flatnonzero(fleet.group == gi)
        drawn = fleet.speed[devices]
        measured = fleet.intervals is not None and gi in fleet.intervals
        share = [float(np.mean(on[devices])) for on in online]
        rows = by_group.get(g.name, [])
        entry = GroupEntry(
            group=g.name,
            devices=int(devices.size),
            selected=len(rows),
            speed_steps_per_s=_speed(drawn, g.speed, fleet.step_flops),
            online_at_starts=_online(g.availability, measured, starts, share),
            **_rates(rows, spec.stragglers_of(gi)),
        )
        warnings += _speed_warnings(g.name, drawn, g.speed, entry)
        warnings += _online_warnings(g.name, entry, when)
        warnings += _rate_warnings(g.name, entry)
        groups.append(entry)
    return Realised(groups=groups, warnings=warnings)


def _by_group(clients: Sequence[Row]) -> dict[str, list[Row]]:
    """clients.parquet's rows by their ``device_group``, in row order."""
    by_group: dict[str, list[Row]] = {}
    for c in clients:
        by_group.setdefault(str(c["device_group"]), []).append(c)
    return by_group


def _speed(drawn: np.ndarray, speed: SpeedSpec | None, flops: float | None) -> Speed:
    """The group's speed quantiles in steps/s, realised and declared (None
    for a trace group: its speeds are measured)."""
    realised = [float(np.quantile(drawn, q)) for q in _QUANTILES]
    declared = None
    if speed is not None:
        per = flops if speed.per_flop and flops else 1.0
        declared = [speed.quantile_in_unit(q) / per for q in _QUANTILES]
    return Speed(quantiles=list(_QUANTILES), declared=declared, realised=realised)


def _continuous(speed: SpeedSpec) -> bool:
    """Whether a speed law has no point mass: lognormal tiers with sigma > 0."""
    return all(sigma > 0 for _, sigma in speed.laws())


def _online(
    a: AvailabilitySpec, measured: bool, starts: np.ndarray, share: list[float]
) -> Online:
    """The group's mean online share at the start times, and the declared
    long-run share (None for a trace's ``measured`` intervals)."""
    realised = float(np.mean(share)) if share else math.nan
    # a trace's own intervals are measured, not declared
    declared = None if measured else a.mean_online
    return Online(declared=declared, realised=realised, starts=int(starts.size))


def _rates(rows: Sequence[Row], s: StragglerSpec) -> _Rates:
    """The group's straggler and dropout rates against ``p`` and
    ``dropout_p``, and the shares of its updates dropped for reasons that
    have no declared rate."""
    n = len(rows)
    slowed = sum(number(r["slowdown"], "slowdown") > 1.0 for r in rows)
    reasons = [str(r.get("drop_reason") or "") for r in rows]
    started = sum(why not in ("no_time", "no_data") for why in reasons)
    return _Rates(
        straggler_rate=_rate(slowed, n, _visible_p(s)),
        dropout_rate=_rate(reasons.count("dropout"), started, s.dropout_p),
        dropped=_dropped_shares(reasons),
    )


def _visible_p(s: StragglerSpec) -> float:
    """The straggler probability a run can measure: a fixed factor of 1
    slows nobody, so its stragglers cannot be seen (0)."""
    return 0.0 if s.slowdown.dist == "fixed" and s.slowdown.factor == 1 else s.p


def _dropped_shares(reasons: Sequence[str]) -> dict[str, float]:
    """The shares of ``reasons`` (one per selected update, "" when it
    counted) that are ``late``, ``no_time`` and ``offline`` (NaN: none)."""
    n = len(reasons)
    return {
        why: reasons.count(why) / n if n else math.nan
        for why in ("late", "no_time", "offline")
    }


def _half(p: float, n: int) -> float:
    """Half the 99.9% sampling interval of a share p over n draws (normal
    approximation, with a continuity slack of 1/(2n))."""
    return _Z * math.sqrt(p * (1 - p) / n) + 0.5 / n


def _rate(k: int, n: int, declared: float) -> Rate:
    """``k`` of ``n`` as a share, beside ``declared`` and its sampling
    interval for n draws (None without any draw)."""
    interval = None
    if n:
        half = _half(declared, n)
        interval = [max(0.0, declared - half), min(1.0, declared + half)]
    share = k / n if n else math.nan
    return Rate(declared=declared, realised=share, n=n, interval=interval)


def _speed_warnings(
    name: str, drawn: np.ndarray, speed: SpeedSpec | None, e: GroupEntry
) -> list[str]:
    """A sentence per declared quantile whose share of devices below it is
    outside that share's sampling interval (continuous laws only: a point
    mass has any share below it)."""
    declared = e["speed_steps_per_s"]["declared"]
    if declared is None or speed is None or not _continuous(speed) or not drawn.size:
        return []
    out = []
    for q, x in zip(_QUANTILES, declared, strict=True):
        below, half = float(np.mean(drawn <= x)), _half(q, drawn.size)
        if abs(below - q) > half:
            out.append(
                f"group {name}: {below:.1%} of its devices are below the declared "
                f"{q:.0%} speed quantile {x:.4g} steps/s (99.9% sampling interval "
                f"{q - half:.1%} to {q + half:.1%})"
            )
    return out


def _online_warnings(name: str, e: GroupEntry, when: str) -> list[str]:
    """A sentence when the group's online share at the start times is
    outside the declared share's interval for its devices (its devices are
    the sample: the starts are correlated), or 0 against a declared share."""
    online, n = e["online_at_starts"], e["devices"]
    d, r = online["declared"], online["realised"]
    if not d or not online["starts"] or not n:
        return []
    half = _half(d, n)
    if abs(r - d) <= half:
        return []
    if r == 0:
        return [f"group {name} was never online {when} (declared {d:.1%})"]
    return [
        f"group {name} was online {r:.1%} of the time {when}, declared {d:.1%} "
        f"(99.9% sampling interval +-{half:.1%} for {n} devices)"
    ]


def _rate_warnings(name: str, e: GroupEntry) -> list[str]:
    """Sentences for straggler and dropout rates outside their intervals,
    and for most of the group's updates dropped late, without time or
    offline (no scenario means to drop them)."""
    out = []
    rates = ((e["straggler_rate"], "stragglers"), (e["dropout_rate"], "dropouts"))
    for rate, what in rates:
        lo_hi = rate["interval"]
        if lo_hi is not None and not lo_hi[0] <= rate["realised"] <= lo_hi[1]:
            out.append(
                f"group {name}: {rate['realised']:.1%} {what} in {rate['n']} "
                f"updates, declared {rate['declared']:.1%} (99.9% sampling "
                f"interval {lo_hi[0]:.1%} to {lo_hi[1]:.1%})"
            )
    return out + _drop_warnings(name, e)


# Why a drop reason with no declared rate happens: the warnings name it.
_CAUSES = {
    "late": "past the deadline (round.deadline_s)",
    "no_time": "with no whole step in the window (round.window_s)",
    "offline": "by devices going offline mid-work",
}


def _drop_warnings(name: str, e: GroupEntry) -> list[str]:
    """A sentence for each reason with no declared rate (late, no time,
    offline) that dropped most of the group's selected updates."""
    return [
        f"group {name}: {share:.0%} of its {e['selected']} selected updates "
        f"were dropped {_CAUSES[why]}"
        for why, share in e["dropped"].items()
        if e["selected"] and share >= _MOST
    ]
