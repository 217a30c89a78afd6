"""Links between the fleet and the data: who holds how much, and which labels.

Without a ``links`` section client i's partition goes to device i whatever
the device is like. The section declares a dependence instead
(docs/fleets.md, "Linking devices and data"):

- ``samples_vs_speed`` / ``samples_vs_online``: a target Spearman rank
  correlation between a device's sample count and its speed (or its mean
  online fraction), reached by *permuting* the partitions over the devices
  with a seeded noisy-rank (Gaussian copula) method, calibrated by bisection;
- ``groups``: per device group, its share of the training samples, its label
  distribution and its Dirichlet label skew (the data is pooled and split
  again, group by group, with :mod:`fedsim.data.partition`'s building blocks).

Every assignment is a pure function of (scenario, seed); the realised links
(rank correlations, and the participation a run obtained) are measured by
:func:`realised_links` for summary.json and report.md.

Example:
    >>> sizes = np.array([10, 20, 30, 40, 50])
    >>> speed = np.array([5.0, 4.0, 3.0, 2.0, 1.0])
    >>> perm, r = rank_assignment(sizes, speed, 1.0, seed=0)
    >>> sizes[perm].tolist(), r
    ([50, 40, 30, 20, 10], 1.0)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Annotated, Literal, Protocol

import numpy as np
from pydantic import Field, model_validator

from fedsim.data.base import FederatedData
from fedsim.data.errors import DataError
from fedsim.data.partition import dirichlet_feddc, iid, layout
from fedsim.rows import Row, whole
from fedsim.spec import NonNegFloat, PosFloat, Spec

if TYPE_CHECKING:
    from fedsim.facts import RunFacts
    from fedsim.fleet import Fleet, FleetSpec
    from fedsim.traces import Intervals

_TAG = 0x11A7C  # separates the links' random streams from other uses of the seed
Corr = Annotated[float, Field(ge=-1, le=1)]


class LinkError(DataError):
    """A declared link cannot be met by this data and fleet (CLI exit 2); the
    message names the field and says what was reached."""


class GroupDataSpec(Spec):
    """One device group's data (``links.groups.<name>``).

    ``share``: the group's fraction of the training samples (default: in
    proportion to its devices, among the groups without a share);
    ``labels``: its label distribution, one weight per class (normalised);
    ``label_alpha``: Dirichlet label skew among its devices (default: i.i.d.);
    ``size_sigma``: lognormal spread of its devices' sample counts.
    """

    share: Annotated[float, Field(gt=0, le=1)] | None = None
    labels: Annotated[list[NonNegFloat], Field(min_length=1, max_length=10_000)] | (
        None
    ) = None
    label_alpha: PosFloat | None = None
    size_sigma: Annotated[float, Field(ge=0, le=5)] = 0.0

    @model_validator(mode="after")
    def _some_weight(self) -> GroupDataSpec:
        """Reject all-zero ``labels``: they would give no class to draw from."""
        if self.labels is not None and sum(self.labels) <= 0:
            raise ValueError("labels: give at least one class a positive weight")
        return self


class LinksSpec(Spec):
    """The ``links`` section: how the data is tied to the devices."""

    samples_vs_speed: Corr | None = None
    samples_vs_online: Corr | None = None
    tolerance: Annotated[float, Field(ge=0.001, le=1)] = 0.05
    samples_from_trace: bool = False
    groups: dict[str, GroupDataSpec] = Field(default_factory=dict, max_length=10_000)

    @model_validator(mode="after")
    def _one_rank_link(self) -> LinksSpec:
        """Reject declarations that cannot all hold at once (see messages)."""
        if self.samples_vs_speed is not None and self.samples_vs_online is not None:
            raise ValueError(
                "declare one of samples_vs_speed and samples_vs_online: one "
                "permutation of the partitions sets one rank correlation"
            )
        if self.samples_from_trace and self.rank_link is not None:
            raise ValueError(
                "samples_from_trace fixes each trace device's samples; a rank "
                f"link ({self.rank_link[2]}) would move them to other devices"
            )
        shares = [g.share for g in self.groups.values() if g.share is not None]
        if sum(shares) > 1 + 1e-9:
            raise ValueError(f"groups: the shares add up to {sum(shares):g} > 1")
        return self

    @property
    def rank_link(self) -> tuple[Literal["speed", "online"], float, str] | None:
        """(device attribute, target, field name) of the rank link, or None."""
        if self.samples_vs_speed is not None:
            return "speed", self.samples_vs_speed, "links.samples_vs_speed"
        if self.samples_vs_online is not None:
            return "online", self.samples_vs_online, "links.samples_vs_online"
        return None

    def problem(self, fleet: FleetSpec) -> str | None:
        """What makes these links unusable with ``fleet`` (unknown group
        names, shares of every group not adding up to 1), or None."""
        names = [g.name for g in fleet.groups]
        unknown = sorted(set(self.groups) - set(names))
        if unknown:
            return f"links.groups names {unknown}, not groups of the fleet ({names})"
        if self.samples_from_trace and (problem := self._trace_problem(fleet)):
            return problem
        return self._shares_problem(names)

    def _shares_problem(self, names: Sequence[str]) -> str | None:
        """Shares given to every group that do not add up to 1, or None."""
        shares = [self.groups.get(n, GroupDataSpec()).share for n in names]
        # groups left without a share take what the others leave; if none is
        # left out, nothing can absorb a rounding of the shares to below 1
        total = math.fsum(s for s in shares if s is not None)
        if None not in shares and abs(total - 1) > 1e-6:
            return (
                "links.groups gives every group a share, so the shares must add "
                f"up to 1, not {total:g}"
            )
        return None

    def _trace_problem(self, fleet: FleetSpec) -> str | None:
        """What keeps ``samples_from_trace`` from working with ``fleet``."""
        traced = list(trace_samples(fleet))
        if not traced:
            return (
                "links.samples_from_trace is true but no trace group of the "
                "fleet has a 'samples' column"
            )
        for gi in traced:
            g = self.groups.get(fleet.groups[gi].name)
            if g is not None and (g.share, g.label_alpha, g.size_sigma) != (
                None,
                None,
                0.0,
            ):
                return (
                    f"links.groups.{fleet.groups[gi].name}: its trace's samples "
                    "column fixes its share and sizes; only labels may be set"
                )
        return None


def trace_samples(fleet: FleetSpec | None) -> dict[int, np.ndarray]:
    """Group index -> the per-device samples of its trace's ``samples``
    column (int64), for the trace groups that have one."""
    out: dict[int, np.ndarray] = {}
    for gi, g in enumerate(fleet.groups if fleet is not None else []):
        trace = g.load_trace() if g.trace is not None else None
        if trace is None or trace.samples is None:
            continue
        if not np.all(trace.samples == np.floor(trace.samples)):
            raise LinkError(
                f"links.samples_from_trace: {trace.path}: column 'samples' "
                "must hold whole numbers"
            )
        out[gi] = trace.samples.astype(np.int64)
    return out


# ----------------------------------------------------------------- ranks


def avg_ranks(x: np.ndarray) -> np.ndarray:
    """0-based ranks of ``x`` (float64), ties sharing their average rank."""
    return _ranks(x)[0]


def _ranks(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(average ranks, a stable sorting order) of ``x``."""
    x = np.asarray(x)
    if x.dtype.kind in "iu" and x.size and 0 <= x.min() and x.max() < 2**16:
        x = x.astype(np.uint16)  # sample counts: NumPy's stable radix sort
    order = np.argsort(x, kind="stable")
    xs = x[order]
    new = np.ones(xs.size, dtype=bool)
    new[1:] = xs[1:] != xs[:-1]
    starts = np.flatnonzero(new)
    ends = np.append(starts[1:], xs.size)
    avg = (starts + ends - 1) / 2.0
    out = np.empty(xs.size)
    out[order] = avg[np.cumsum(new) - 1]
    return out, order


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman's rank correlation (average ranks for ties); NaN when either
    side is constant or has fewer than two values."""
    ra, rb = avg_ranks(a), avg_ranks(b)
    return _pearson(ra - ra.mean(), rb - rb.mean())


def _pearson(a: np.ndarray, b: np.ndarray) -> float:
    """Pearson correlation of two centred vectors (NaN if one is constant)."""
    den = math.sqrt(float(a @ a) * float(b @ b))
    return float(a @ b) / den if den > 0 else math.nan


# Acklam's rational approximation of the standard normal quantile (absolute
# error < 1e-4 for p in [1e-6, 1 - 1e-6]; it only orders devices): vectorised,
# and no SciPy dependency for one function.
_A = (-39.69683028665376, 220.9460984245205, -275.9285104469687,
      138.3577518672690, -30.66479806614716, 2.506628277459239)  # fmt: skip
_B = (-54.47609879822406, 161.5858368580409, -155.6989798598866,
      66.80131188771972, -13.28068155288572, 1.0)  # fmt: skip
_C = (-7.784894002430293e-03, -0.3223964580411365, -2.400758277161838,
      -2.549671348086381, 4.374664141464968, 2.938163982698783)  # fmt: skip
_D = (7.784695709041462e-03, 0.3224671290700398, 2.445134137142996,
      3.754408661907416, 1.0)  # fmt: skip


def ndtri(p: np.ndarray) -> np.ndarray:
    """The standard normal quantile of ``p`` in (0, 1), elementwise.

    >>> [round(float(v), 6) for v in ndtri(np.array([0.025, 0.5, 0.975]))]
    [-1.959964, 0.0, 1.959964]
    """
    p = np.asarray(p, dtype=np.float64)
    q = np.minimum(p, 1 - p)  # the tails are symmetric
    r = (q - 0.5) ** 2
    z = (q - 0.5) * np.polyval(_A, r) / np.polyval(_B, r)
    tail = q < 0.02425  # few: the tail formula only where it is needed
    t = np.sqrt(-2 * np.log(np.maximum(q[tail], 1e-300)))
    z[tail] = np.polyval(_C, t) / np.polyval(_D, t)
    return np.where(p > 0.5, -z, z)


def rank_assignment(
    sizes: np.ndarray,
    key: np.ndarray,
    target: float,
    seed: int,
    blocks: np.ndarray | None = None,
    tol: float = 0.05,
) -> tuple[np.ndarray, float]:
    """Assign partitions to devices so that Spearman(sizes of the assignment,
    ``key``) is as close to ``target`` as bisection gets it.

    Noisy ranks: devices are sorted by ``c z + sqrt(1 - c^2) e`` (``z`` the
    normal scores of ``key``'s ranks, ``e`` seeded noise) and take the
    partitions sorted by size; ``c`` starts at ``2 sin(pi target / 6)`` (the
    Gaussian copula's Spearman-Pearson relation) and is bisected until the
    realised value is within ``tol / 5`` of the target (ties in ``sizes`` or
    ``key`` bend the relation).

    Args:
        sizes: samples of each partition, ``[m]``.
        key: each device's attribute (speed, online fraction), ``[m]``.
        target: the Spearman correlation sought, in [-1, 1].
        seed: the scenario seed (the noise is a pure function of it).
        blocks: optional group id per device and per partition (partition j
            belongs to device j's group); partitions then move only within
            their group.
        tol: the acceptable distance from the target (only sets how far the
            bisection goes; the caller decides what is acceptable).

    Returns:
        ``perm`` (device d gets partition ``perm[d]``) and the realised
        Spearman correlation (NaN when ``sizes`` or ``key`` is constant).
    """
    m = len(sizes)
    rk, _ = _ranks(key)
    rs, by_size = _ranks(sizes)
    # normal scores of the key's ranks: the copula's Gaussian margin
    z = ndtri((rk + 0.5) / m)
    rk -= rk.mean()
    rs -= rs.mean()
    # one noise draw for every c: the realised value moves with c alone
    noise = _rng(seed, 0).standard_normal(m)
    part_order = by_size if blocks is None else _order(np.asarray(sizes), blocks)
    best: tuple[float, np.ndarray, float] = (math.inf, np.arange(m), math.nan)
    lo, hi, c = -_C_MAX, _C_MAX, _copula_c(target)
    for _ in range(40):
        score = c * z + math.sqrt(1 - c * c) * noise
        perm = np.empty(m, dtype=np.int64)
        perm[_order(score, blocks)] = part_order
        # Spearman = Pearson of the ranks; the size ranks travel with perm
        r = _pearson(rs[perm], rk)
        if not math.isfinite(r):  # a constant side: nothing to calibrate
            return perm, r
        if abs(r - target) < best[0]:
            best = (abs(r - target), perm, r)
        if best[0] <= tol / 5 or hi - lo < 1e-9:
            break
        # more weight on z raises the correlation: keep a bracket of c
        lo, hi = (c, hi) if r < target else (lo, c)
        c = _next_c(c, r, target, lo, hi)
    return best[1], best[2]


# |c| < 1 keeps a little noise in every score, so tied keys are ordered by
# the seeded noise, never by the sort algorithm (which may differ by CPU)
_C_MAX = 1 - 1e-12


def _copula_c(rho: float) -> float:
    """The Gaussian copula's Pearson c giving Spearman ``rho`` (no ties)."""
    return max(-_C_MAX, min(_C_MAX, 2 * math.sin(math.pi * rho / 6)))


def _next_c(c: float, r: float, target: float, lo: float, hi: float) -> float:
    """The next c to try: ties shrink the realised correlation by a factor
    that barely depends on c, so aim at ``target`` divided by the factor seen
    at ``c``; the midpoint of the bracket when that falls outside it."""
    untied = 6 / math.pi * math.asin(c / 2)
    if abs(untied) > 1e-3 and r / untied > 0.05:
        guess = _copula_c(target * untied / r)
        if lo < guess < hi:
            return guess
    return (lo + hi) / 2


def _order(values: np.ndarray, blocks: np.ndarray | None) -> np.ndarray:
    """Indices sorting ``values`` ascending, within ``blocks`` if given (stable)."""
    if blocks is None:  # float scores: ties have probability 0, any sort will do
        return np.argsort(values)
    return np.lexsort((values, blocks))


def _rng(seed: int, k: int) -> np.random.Generator:
    """The links' stream ``k``: apart from the partition's and the fleet's,
    so declaring links shifts no draw of theirs."""
    return np.random.default_rng(np.random.SeedSequence([int(seed), _TAG, k]))


# ----------------------------------------------------------- the devices


def online_fraction(fleet: Fleet) -> np.ndarray:
    """Each device's expected fraction of time online (float64 ``[m]``).

    ``always``: 1; ``on_off``: ``mean_on / (mean_on + mean_off)``; ``daily``:
    the profile's mean ``(min_online + max_online) / 2``; a trace device: the
    time its intervals cover within the period, or without a period within
    ``[0, the group's last finite interval end]``.
    """
    frac = np.empty(fleet.size)
    for gi, a in enumerate(fleet.availability):
        frac[fleet.group == gi] = a.mean_online
    for gi, iv in (fleet.intervals or {}).items():
        frac[fleet.group == gi] = _trace_fraction(iv)
    return frac


def _trace_fraction(iv: Intervals) -> np.ndarray:
    """Covered fraction of each trace device."""
    finite = iv.end[np.isfinite(iv.end)]
    horizon = iv.period_s or max(float(finite.max()) if finite.size else 0.0, 1.0)
    owner = np.repeat(np.arange(iv.size), np.diff(iv.offsets))
    covered = np.clip(np.minimum(iv.end, horizon) - iv.start, 0.0, None)
    frac = np.bincount(owner, weights=covered, minlength=iv.size) / horizon
    frac[np.asarray(iv.always, dtype=bool)] = 1.0
    return np.minimum(frac, 1.0)


def device_key(fleet: Fleet, which: str) -> np.ndarray:
    """The device attribute a rank link uses: ``speed`` or ``online``."""
    return fleet.speed if which == "speed" else online_fraction(fleet)


# ------------------------------------------------------- the assignment


def apply_links(
    links: LinksSpec | None,
    fleet: Fleet,
    data: FederatedData,
    seed: int,
    fleet_spec: FleetSpec | None = None,
) -> FederatedData:
    """``data`` with its clients tied to ``fleet``'s devices as ``links``
    declares; ``data`` itself (the very object) when ``links`` is None.
    ``fleet_spec`` (``fleet``'s spec) is read for trace ``samples`` columns.

    Raises:
        LinkError: a link cannot be met; the message names the field and
            what was reached.
    """
    if links is None:
        return data
    if data.test_weights is not None:
        raise LinkError(
            "links: this dataset's clients are its objectives (quadratic); "
            "they cannot be reassigned"
        )
    blocks = None
    if links.groups or links.samples_from_trace:
        fixed = trace_samples(fleet_spec) if links.samples_from_trace else {}
        parts = group_parts(links, fleet, data.y, data.num_classes, seed, fixed)
        data, blocks = regroup(data, parts), fleet.group
    if (rank := links.rank_link) is None:
        return data
    which, target, name = rank
    key = device_key(fleet, which)
    tol = links.tolerance
    perm, r = rank_assignment(data.n_samples, key, target, seed, blocks, tol)
    _check_reached(name, which, target, r, tol, data, key, blocks is not None)
    return permute_clients(data, perm)


def _check_reached(
    name: str,
    which: str,
    target: float,
    r: float,
    tol: float,
    data: FederatedData,
    key: np.ndarray,
    grouped: bool,
) -> None:
    """Raise LinkError when the realised correlation ``r`` misses ``target``
    (``grouped``: partitions could only move within their device group)."""
    if math.isfinite(r) and abs(r - target) <= tol:
        return
    if np.unique(data.n_samples).size < 2:
        why = (
            f"every client holds {int(data.n_samples[0])} samples, so there "
            "is no order to correlate (give the partition, or links.groups, a "
            "size_sigma > 0)"
        )
    elif np.unique(key).size < 2:
        why = f"every device has the same {which}, so there is no order to follow"
    else:
        why = (
            f"the closest assignment reaches {r:+.3f} (the devices take "
            f"{np.unique(key).size} distinct values of {which}, the clients "
            f"{np.unique(data.n_samples).size} distinct sizes)"
        )
        if grouped:  # links.groups fixes which samples each group holds
            why += "; with links.groups, partitions move only within their group"

    raise LinkError(
        f"{name}: cannot reach a rank correlation of {target:+.3f} "
        f"(tolerance {tol:g}): {why}"
    )


def permute_clients(data: FederatedData, perm: np.ndarray) -> FederatedData:
    """``data`` whose client d holds what client ``perm[d]`` held (rows moved,
    each client's own row order kept; test and validation rows untouched)."""
    n = data.n_samples
    sizes = n[perm]
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    # row k of new client d is row k of old client perm[d]
    shift = np.repeat(data.offsets[:-1][perm] - offsets[:-1], sizes)
    rows = np.arange(int(offsets[-1]), dtype=np.int64) + shift
    return _with_rows(data, rows, offsets, np.asarray(data.weights)[perm])


def regroup(data: FederatedData, parts: Sequence[np.ndarray]) -> FederatedData:
    """``data`` with client j holding training rows ``parts[j]`` (indices into
    the pooled training rows), weighted by its sample count."""
    rows, offsets = layout(parts)
    return _with_rows(data, rows, offsets, np.diff(offsets).astype(np.float64))


def _with_rows(
    data: FederatedData, rows: np.ndarray, offsets: np.ndarray, weights: np.ndarray
) -> FederatedData:
    """``data`` with its training rows reordered to ``rows`` (client i owns
    ``offsets[i]:offsets[i + 1]``); test and validation sets kept as they are."""
    return FederatedData(
        x=data.x[rows],
        y=data.y[rows],
        offsets=offsets,
        weights=np.asarray(weights, dtype=np.float64),
        test_x=data.test_x,
        test_y=data.test_y,
        num_classes=data.num_classes,
        test_weights=data.test_weights,
        val_x=data.val_x,
        val_y=data.val_y,
    )


def _largest_remainder(total: int, weights: np.ndarray) -> np.ndarray:
    """Non-negative integers proportional to ``weights``, summing to ``total``."""
    q = np.asarray(weights, dtype=np.float64)
    q = q / q.sum() * total  # callers pass weights with a positive sum
    out = np.floor(q).astype(np.int64)
    out[np.argsort(-(q - out), kind="stable")[: total - int(out.sum())]] += 1
    return out


def group_sizes(
    links: LinksSpec,
    names: Sequence[str],
    counts: np.ndarray,
    n: int,
    fixed: Mapping[int, np.ndarray] | None = None,
) -> np.ndarray:
    """Samples per group: trace-given totals (``fixed``) and declared shares
    first, the rest in proportion to the devices of the groups without a
    share (largest remainders).

    Raises:
        LinkError: the traces ask for more samples than there are, or a group
            gets fewer samples than it has devices.
    """
    given = {gi: int(v.sum()) for gi, v in (fixed or {}).items()}
    if sum(given.values()) > n:
        raise LinkError(
            f"links.samples_from_trace: the traces' samples columns ask for "
            f"{sum(given.values())} samples; the training set has {n}"
        )
    weights = _group_weights(links, names, counts, given, n)
    sizes = np.zeros(len(names), dtype=np.int64)
    if weights.sum() > 0:  # else every group's size comes from its trace
        sizes = _largest_remainder(n - sum(given.values()), weights)
    for gi, total in given.items():
        sizes[gi] = total
    for g, size, count in zip(names, sizes, counts, strict=True):
        if size < count:
            raise LinkError(
                f"links.groups.{g}.share: the group gets {size} of the {n} "
                f"training samples, fewer than its {count} devices"
            )
    return sizes


def _group_weights(
    links: LinksSpec,
    names: Sequence[str],
    counts: np.ndarray,
    given: Mapping[int, int],
    n: int,
) -> np.ndarray:
    """Each group's weight in the samples the traces leave: its declared
    share, or for the groups without one (and no trace column) what the
    shares and the traces leave, in proportion to their devices; 0 for the
    groups whose trace gives their samples."""
    shares = [links.groups.get(g, GroupDataSpec()).share for g in names]
    free = np.array([s is None and i not in given for i, s in enumerate(shares)])
    weights = np.array([s or 0.0 for s in shares])
    if free.any():
        rest = max(0.0, 1.0 - weights.sum() - sum(given.values()) / n)
        weights[free] = rest * counts[free] / counts[free].sum()
    return weights


def _class_needs(
    links: LinksSpec,
    names: Sequence[str],
    sizes: np.ndarray,
    labels: np.ndarray,
    c: int,
) -> dict[int, np.ndarray]:
    """Per group with declared ``labels``: the samples of each class it takes."""
    have = np.bincount(labels, minlength=c)
    need: dict[int, np.ndarray] = {}
    for gi, g in enumerate(names):
        spec = links.groups.get(g)
        if spec is None or spec.labels is None:
            continue
        if len(spec.labels) != c:
            raise LinkError(
                f"links.groups.{g}.labels: {len(spec.labels)} weights for a "
                f"dataset of {c} classes"
            )
        need[gi] = _largest_remainder(int(sizes[gi]), np.array(spec.labels))
    total = sum(need.values(), np.zeros(c, dtype=np.int64))
    short = np.flatnonzero(total > have)
    if short.size:
        k = int(short[0])
        raise LinkError(
            f"links.groups: the declared label distributions need {total[k]} "
            f"samples of class {k}; the training set has {have[k]}"
        )
    return need


def group_parts(
    links: LinksSpec,
    fleet: Fleet,
    labels: np.ndarray,
    num_classes: int,
    seed: int,
    fixed: Mapping[int, np.ndarray] | None = None,
) -> list[np.ndarray]:
    """One array of pooled-row indices per device: each group's samples
    (share, label distribution) split among its devices (Dirichlet or i.i.d.;
    ``fixed``: group index -> each device's samples, from its trace).

    Raises:
        LinkError: a share or label distribution the data cannot give.
    """
    labels = np.asarray(labels, dtype=np.int64)
    names = list(fleet.group_names)
    counts = np.bincount(fleet.group, minlength=len(names))
    fixed = fixed or {}
    sizes = group_sizes(links, names, counts, labels.size, fixed)
    need = _class_needs(links, names, sizes, labels, max(num_classes, 1))
    pooled = _group_rows(need, sizes, labels, max(num_classes, 1), _rng(seed, 1))
    parts: list[np.ndarray] = []
    for gi, g in enumerate(names):
        spec = links.groups.get(g, GroupDataSpec())
        if gi in fixed:  # the trace gives each device's count: a random split
            cuts = np.cumsum(fixed[gi])[:-1]
            parts += np.split(_rng(seed, 2 + gi).permutation(pooled[gi]), cuts)
            continue
        parts += _split_group(pooled[gi], labels, int(counts[gi]), spec, seed, gi, g)
    return parts


def _group_rows(
    need: Mapping[int, np.ndarray],
    sizes: np.ndarray,
    labels: np.ndarray,
    num_classes: int,
    rng: np.random.Generator,
) -> list[np.ndarray]:
    """Each group's pooled rows: its declared class counts from shuffled
    per-class pools (groups in order), then the other groups' sizes from the
    shuffled rest."""
    pools = [rng.permutation(np.flatnonzero(labels == k)) for k in range(num_classes)]
    taken = np.zeros(num_classes, dtype=np.int64)
    pooled: dict[int, np.ndarray] = {}
    for gi, per_class in need.items():
        got = [pools[k][taken[k] : taken[k] + c] for k, c in enumerate(per_class)]
        taken += per_class
        pooled[gi] = rng.permutation(np.concatenate(got))
    left = [p[t:] for p, t in zip(pools, taken.tolist(), strict=True)]
    rest = rng.permutation(np.concatenate(left))
    start = 0
    for gi, size in enumerate(sizes.tolist()):
        if gi not in pooled:
            pooled[gi] = rest[start : start + size]
            start += size
    return [pooled[gi] for gi in range(len(sizes))]


def _split_group(
    rows: np.ndarray,
    labels: np.ndarray,
    count: int,
    spec: GroupDataSpec,
    seed: int,
    gi: int,
    name: str,
) -> list[np.ndarray]:
    """Split a group's rows among its ``count`` devices."""
    # a seed of its own per group: partition.py's splits take an int seed
    sub_seed = int(_rng(seed, 2 + gi).integers(2**62))
    try:
        if spec.label_alpha is not None:
            local = dirichlet_feddc(
                labels[rows], count, spec.label_alpha, sub_seed, spec.size_sigma
            )
        else:
            local = iid(len(rows), count, sub_seed, spec.size_sigma)
    except DataError as exc:
        raise LinkError(f"links.groups.{name}: {exc}") from None
    return [np.asarray(rows)[p] for p in local]


# -------------------------------------------------------- measurements


def _by_client(clients: Sequence[Row], m: int) -> tuple[np.ndarray, ...]:
    """(times selected, updates that reached the server) per client id."""
    ids = np.array([whole(c["client_id"], "client_id") for c in clients], np.int64)
    done = np.array([not c["dropped"] for c in clients], dtype=bool)
    return (
        np.bincount(ids, minlength=m),
        np.bincount(ids[done] if ids.size else ids, minlength=m),
    )


def _finite(x: float) -> float | None:
    """``x``, or None for NaN and infinities (summary.json's null)."""
    return x if math.isfinite(x) else None  # JSON has no NaN


def realised_links(
    links: LinksSpec | None,
    fleet: Fleet,
    data: FederatedData,
    clients: Sequence[Row],
) -> dict[str, object] | None:
    """summary.json's ``links``: the declared targets, the Spearman rank
    correlations the run realised between samples, speed, online fraction
    and updates obtained, and per group its devices and shares; None when no
    link is declared."""
    if links is None:
        return None
    n = data.n_samples.astype(np.float64)
    speed, online = fleet.speed, online_fraction(fleet)
    selected, updates = _by_client(clients, fleet.size)
    pairs = {
        "samples_vs_speed": (n, speed),
        "samples_vs_online": (n, online),
        "samples_vs_updates": (n, updates),
        "speed_vs_updates": (speed, updates),
        "online_vs_updates": (online, updates),
    }
    groups = []
    for gi, g in enumerate(fleet.group_names):
        mask = fleet.group == gi
        groups.append(
            {
                "name": g,
                "devices": int(mask.sum()),
                "sample_share": float(n[mask].sum() / n.sum()),
                "median_speed": float(np.median(speed[mask])),
                "online_fraction": float(online[mask].mean()),
                "selections": int(selected[mask].sum()),
                "update_share": float(updates[mask].sum() / max(updates.sum(), 1)),
            }
        )
    return {
        "declared": links.model_dump(mode="json", exclude_defaults=True),
        "spearman": {k: _finite(spearman(a, b)) for k, (a, b) in pairs.items()},
        "groups": groups,
    }


class LinkedRun(Protocol):
    """What this module reads of a scenario (a
    :class:`fedsim.scenario.Scenario` has both): its ``links`` section and
    the run's facts (seed, fleet, data, model: what the fleet is built from)."""

    @property
    def links(self) -> LinksSpec | None:
        """The ``links`` section, None when no link is declared."""

    @property
    def facts(self) -> RunFacts:
        """The run's facts."""


def summary_entry(
    scenario: LinkedRun, data: FederatedData | None, clients: Sequence[Row]
) -> dict[str, object]:
    """``{"links": realised_links(...)}`` for a run's summary.json, or ``{}``
    when the scenario declares no link (summary.json then stays as it was)."""
    if scenario.links is None or data is None:
        return {}
    from fedsim.flops import scenario_fleet  # the fleet as the run built it

    fleet = scenario_fleet(scenario.facts, data)
    return {"links": realised_links(scenario.links, fleet, data, clients)}


def build_linked_data(scenario: LinkedRun) -> FederatedData:
    """The scenario's training data tied to its fleet, as a run builds it
    (for workers that build the data on their own node)."""
    from fedsim.data import build_data
    from fedsim.flops import scenario_fleet

    facts = scenario.facts
    data = build_data(facts.data, facts.num_clients, facts.seed)
    fleet = scenario_fleet(facts, data)
    return apply_links(scenario.links, fleet, data, facts.seed, facts.fleet)
