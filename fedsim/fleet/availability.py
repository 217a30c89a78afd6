"""The on/off availability process: when each device of a fleet is online.

Counter-based (docs/fleets.md, "Fleet draws"): device i's k-th on/off
interval ends at a time hashed from (seed, i, k), so ``state_at`` is a pure
function of (seed, device, t) whatever was asked before. Exponential
periods, the daily chain and measured trace intervals share one kernel.
Imports numpy and the schema: no torch, no Ray.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from fedsim.fleet.spec import AvailabilitySpec, daily_input
from fedsim.fleet.streams import TAG_AVAILABILITY, splitmix64, stream_key, unit_uniform

if TYPE_CHECKING:
    from fedsim.traces import Intervals

# The counter of the "on at t = 0?" draw: interval counters k never reach
# 2^63, so this hash input is never an interval's.
_INITIAL_STATE = np.uint64(1 << 63)
_EXP, _DAILY, _TRACE = 0, 1, 2  # kinds of availability process


class _Walk(NamedTuple):
    """The devices :meth:`OnOff._advance` is moving interval by interval,
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


class OnOff:
    """Memo of each device's current on/off interval, advanced lazily, always
    by the same operations from interval 0 (docs/fleets.md, "Fleet draws").

    Device i's interval k is on when k is even and the device started on
    (odd, if it started off), and ends at a time drawn from a uniform hashed
    from (seed, i, k) (:func:`splitmix64`). Guarantees: ``state_at(idx, t)``
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
                self.f_bar[gi], amp_in, self.t_peak[gi], self.c[gi] = daily_input(a)
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
        self.seed_key = stream_key(seed, TAG_AVAILABILITY)
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
        return splitmix64(np.uint64(self.seed_key) ^ idx.astype(np.uint64))

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
        u = unit_uniform(splitmix64(key ^ k.astype(np.uint64)))
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
        :meth:`fedsim.fleet.spec.AvailabilitySpec._profile` ensures), so the
        bracket holds the root. Each element runs the same iterations
        whichever other devices share the call (it stops on its own
        ``done``), keeping the result independent of the grouping.
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
        u = unit_uniform(splitmix64(key ^ _INITIAL_STATE))
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
                u = unit_uniform(splitmix64(w.key ^ w.k.astype(np.uint64)))
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
