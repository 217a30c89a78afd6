"""What both loops (synchronous rounds, asynchronous versions) hand to the
run's rows: each client's record before training, each trained update with
its weight, and the selector's calls, its answers checked as input.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
from numpy.typing import NDArray

from fedsim import clock, hooks
from fedsim.algorithms.base import ClientUpdate
from fedsim.hooks import PluginFailure
from fedsim.secagg import ABORTED
from fedsim.selectors import Draw, Selector
from fedsim.selectors.base import SelectorState
from fedsim.tasks import UpdateSummary

# A row of rounds.parquet or clients.parquet: each column's cells have that
# column's own type (fedsim.results' schemas), which one dict type cannot
# name, so rows are typed loosely under this name.
Row = dict[str, Any]  # type: ignore[explicit-any]

# what the driver holds of an update: the update, or its summary (server actor)
Kept = ClientUpdate | UpdateSummary


class Pair(NamedTuple):
    """A trained update and its effective aggregation weight w_i."""

    update: Kept
    weight: float


Trained = Sequence[Pair]
# device ids, as selectors and the timeline's chooser take and give them
Ids = NDArray[np.int64]


class JobColumns(NamedTuple):
    """An asynchronous job's columns of clients.parquet (field names are
    the column names, in column order)."""

    version_started: int  # the version the device downloaded
    version_applied: int | None  # the version its update made; None: dropped
    staleness: int | None  # versions made while it trained; None: it left
    job: int  # the device's job index (its seed's "round")


@dataclass(frozen=True)
class ClientRecord:
    """One client row before training: the clock's plan, whether the upload
    reached the server (and is billed), and in asynchronous mode the job.

    Attributes:
        round: the round, or in asynchronous mode the version at arrival.
        plan: what the clock decided for this device.
        uploaded: whether the upload reached the server (bytes_up billed).
        job: asynchronous mode's job columns; None in rounds.
    """

    round: int
    plan: clock.Plan
    uploaded: bool
    job: JobColumns | None = None

    @classmethod
    def from_plan(cls, t: int, p: clock.Plan) -> ClientRecord:
        """Round ``t``'s record of plan ``p``."""
        # Late and surplus updates were uploaded; the server did not use them.
        # (and a failed secure aggregation's survivors: their masked inputs)
        uploaded = not p.dropped or p.reason in ("late", "surplus", ABORTED)
        return cls(t, p, uploaded=uploaded)

    @classmethod
    def from_arrival(cls, a: clock.Arrival) -> ClientRecord:
        """The record of an asynchronous job's end."""
        applied = None if a.dropped else a.version
        job = JobColumns(a.job.version, applied, a.staleness, a.job.index)
        # a stale update was sent, then refused
        return cls(a.version, a.plan, a.status in ("applied", "stale"), job)


def select(
    sel: Selector, state: SelectorState, draw: Draw
) -> tuple[Ids, SelectorState]:
    """``sel.select(state, draw)``, its result checked (a plug-in's answer
    is input): integer ids, each once, among the draw's candidates, and a
    JSON state.

    Raises:
        PluginFailure: the hook raised or broke that contract, naming the
            selector, the hook and what was expected.
    """
    plugin = hooks.selector_label(getattr(sel, "name", type(sel).__name__))
    got = hooks.call(plugin, "select", sel.select, state, draw)
    if not isinstance(got, tuple | list) or len(got) != 2:
        raise PluginFailure(
            plugin, "select", f"returned a {type(got).__name__}, expected (ids, state)"
        )
    ids, new = got
    hooks.check_selection(plugin, "select", ids, new, draw.candidates)
    return ids, new


def selector_columns(sel: Selector, state: SelectorState, t: int) -> Row:
    """The selector's own scalars after round (or version) ``t``
    (``Selector.metrics``), as rounds.parquet columns ``sel_<name>``.

    Raises:
        PluginFailure: the hook raised or returned anything but named
            real numbers.
    """
    # the base reports nothing (no call per round)
    if getattr(type(sel), "metrics", Selector.metrics) is Selector.metrics:
        return {}
    plugin = hooks.selector_label(sel.name)
    got = hooks.call(plugin, "metrics", sel.metrics, state, t)
    return {
        f"sel_{k}": v for k, v in hooks.check_metrics(plugin, "metrics", got).items()
    }
