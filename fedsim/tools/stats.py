"""Paired comparisons over seeds: intervals, their verdicts, and the
sequences that stay valid however often they are looked at.

Two arms of a comparison (two algorithms, or one algorithm at two settings)
run on the same seeds; a seed fixes the fleet, the data, the selections and,
with common random numbers, every device's behaviour (docs/fleets.md, "Common
random numbers"). The per-seed difference ``d_s = arm_s - baseline_s`` is
then free of the seed-to-seed variation both arms share, and its mean gets a
Student t interval over seeds (docs/results.md, "Paired comparisons").

A firm verdict needs two tests to agree: the t interval must exclude 0 and
the exact paired sign-flip (randomization) test must reject "no effect" at
the same level. The sign-flip test assumes only that, with no effect, each
difference is as likely to be +d as -d; with n seeds its smallest p-value is
``2 / 2**n``, so no sample of fewer than 6 seeds (at 95%) can decide, however
small its spread. That is what stops ``[0.01, 0.01]`` (a zero-width t
interval) from reading "better". Differences within float rounding are ties
(:func:`paired_differences`), and arms equal on every seed read "identical
on every seed".

For adding seeds until decided, :func:`confidence_sequence` gives Lai's
scale-invariant mixture sequence: valid at every n at once, so it may be
re-checked after each batch (a t interval re-checked is not valid).

Pure functions of plain numbers: no numpy, no scipy. The t quantiles are
computed here from the regularized incomplete beta function, to about 1e-13
(tests/test_stats.py checks them against the closed forms for 1, 2 and 4
degrees of freedom).

Example:
    >>> iv = paired_interval([0.02, 0.03, 0.025, 0.035, 0.03, 0.028])
    >>> round(iv.mean, 4), round(iv.lo, 4), round(iv.hi, 4), iv.n, iv.verdict
    (0.028, 0.0226, 0.0334, 6, 'better')
    >>> paired_interval([0.01, 0.01]).verdict
    'inconclusive'
    >>> paired_interval([0.02, -0.01, 0.0]).verdict
    'no difference'
"""

from __future__ import annotations

import bisect
import functools
import math
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, TypeGuard

Verdict = Literal[
    "better",
    "worse",
    "no difference",
    "inconclusive",
    "identical on every seed",
    "n/a",
]
"""``better``/``worse``: the interval lies wholly on one side of 0 and the
sign-flip test agrees (which side is better is the metric's choice); ``no
difference``: the interval holds 0; ``inconclusive``: the interval excludes
0 but the sign-flip test does not reject (too few seeds for any firm
verdict, or one seed carries the mean); ``identical on every seed``: every
difference is 0 (within float rounding); ``n/a``: fewer than two paired
seeds, so there is no interval."""

FIRM: frozenset[str] = frozenset({"better", "worse"})
"""The verdicts that decide a comparison."""

ROUNDING = 1e-12
"""Relative size under which a difference is float rounding: ``|a - b| <=
ROUNDING * max(|a|, |b|)`` is a tie. Far above a double's 2.2e-16 (sums of
many terms carry a few ulp each), far below any effect a table prints."""

EXACT_SIGN_FLIPS = 30
"""Up to this many seeds the sign-flip p-value is exact (all ``2**n`` sign
patterns, met in the middle); beyond it, a Monte Carlo estimate from a fixed
generator (deterministic, and valid: ``(1 + hits) / (1 + draws)``)."""


@dataclass(frozen=True)
class PairedInterval:
    """A mean paired difference with its two-sided Student t interval.

    Attributes:
        mean: the mean of the per-seed differences (arm - baseline).
        lo: the interval's lower end (NaN with fewer than two seeds).
        hi: its upper end (NaN with fewer than two seeds).
        n: the number of paired seeds.
        verdict: see :data:`Verdict`.
        sd: the sample standard deviation of the differences (NaN below 2).
        level: the interval's confidence level, e.g. 0.95.
    """

    mean: float
    lo: float
    hi: float
    n: int
    verdict: Verdict
    sd: float = math.nan
    level: float = 0.95

    @property
    def half_width(self) -> float:
        """Half the interval's width, ``t * sd / sqrt(n)`` (NaN below 2)."""
        return (self.hi - self.lo) / 2


@dataclass(frozen=True)
class PairedMetric:
    """A column of the run rows that arms are compared on, seed by seed
    (fedsim.tools.compare pairs them; fedsim.tools.plots draws them).

    Attributes:
        key: the column (a run row's key).
        label: how tables and figures name it.
        higher_is_better: whether a larger value is better (accuracy) or
            worse (objective, rounds and time to target).
        scale: the factor tables print it with (100: accuracy in points).
        unit: the printed unit.
        censor: for a target metric, the run row's key its length is in
            (a run that missed the target is censored there); "" for a value.
    """

    key: str
    label: str
    higher_is_better: bool
    scale: float = 1.0
    unit: str = ""
    censor: str = ""


def paired_differences(
    arm: Mapping[int, object], baseline: Mapping[int, object]
) -> list[float]:
    """``arm[s] - baseline[s]`` for every seed ``s`` both hold a finite value
    for, in increasing seed order; a difference within float rounding of
    the two values (:data:`ROUNDING`) is exactly 0, a tie.

    A seed where either value is missing (None), NaN or infinite has no
    difference: pairing it with anything would compare unlike things.
    Callers that know why a value is missing (a run that diverged, a target
    never reached) fill it in first (fedsim.tools.compare's ``paired_values``).

    Args:
        arm: seed -> the arm's value (a cell: anything not a finite number
            counts as missing).
        baseline: seed -> the baseline's value.

    Example:
        >>> paired_differences({0: 0.8, 1: 0.7, 2: None}, {0: 0.75, 1: 0.7, 2: 0.6})
        [0.050000000000000044, 0.0]
        >>> paired_differences({0: 0.1 + 0.2}, {0: 0.3})
        [0.0]
    """
    out = []
    for seed in sorted(set(arm) & set(baseline)):
        a, b = arm[seed], baseline[seed]
        if _finite(a) and _finite(b):
            a, b = float(a), float(b)
            tie = abs(a - b) <= ROUNDING * max(abs(a), abs(b))
            out.append(0.0 if tie else a - b)
    return out


def paired_interval(
    differences: Iterable[float],
    *,
    level: float = 0.95,
    higher_is_better: bool = True,
) -> PairedInterval:
    """The mean of ``differences`` with its Student t interval, and a verdict
    that a degenerate sample cannot fool.

    The interval is ``mean -+ t_{(1+level)/2, n-1} * sd / sqrt(n)``, ``sd``
    the sample standard deviation (n - 1 in the denominator). It covers the
    true mean difference with probability ``level`` when the differences
    are independent draws from a normal law. With few seeds that is an
    assumption a small sample cannot check: two equal differences give sd 0
    and a zero-width interval. So a firm verdict also needs the exact paired
    sign-flip test (:func:`sign_flip_p`) to reject at ``1 - level``; it
    assumes only symmetry under no effect, and cannot reject with fewer
    than ``1 + log2(1 / (1 - level))`` seeds (6 at 95%). Ends within float
    rounding of 0 count as touching it.

    Args:
        differences: per-seed ``arm - baseline``, finite values only (see
            :func:`paired_differences`).
        level: the confidence level, in (0, 1).
        higher_is_better: whether a positive difference means the arm is
            better (accuracy) or worse (loss, rounds or time to target).

    Returns:
        The interval; ``verdict`` ``n/a`` and NaN ends with fewer than two
        differences, ``identical on every seed`` when every difference is 0.

    Raises:
        ValueError: ``level`` outside (0, 1) or a non-finite difference.
    """
    d, mean = _checked(differences, level)
    n = len(d)
    if n < 2:
        return PairedInterval(mean, math.nan, math.nan, n, "n/a", level=level)
    sd = _sd(d, mean)
    half = t_quantile((1 + level) / 2, n - 1) * sd / math.sqrt(n)
    lo, hi = mean - half, mean + half
    verdict = _verdict(d, lo, hi, higher_is_better)
    if verdict in FIRM and sign_flip_p(d) > 1 - level:
        verdict = "inconclusive"
    return PairedInterval(mean, lo, hi, n, verdict, sd, level)


def _checked(differences: Iterable[float], level: float) -> tuple[list[float], float]:
    """The differences as floats and their mean (NaN when none), checked."""
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    d = [float(x) for x in differences]
    if not all(math.isfinite(x) for x in d):
        raise ValueError("paired intervals take finite differences only")
    return d, (math.fsum(d) / len(d) if d else math.nan)


def _sd(d: Sequence[float], mean: float) -> float:
    """The sample standard deviation (n - 1 in the denominator)."""
    return math.sqrt(math.fsum((x - mean) ** 2 for x in d) / (len(d) - 1))


def _verdict(
    d: Sequence[float], lo: float, hi: float, higher_is_better: bool
) -> Verdict:
    """``identical on every seed`` when every difference is 0;
    ``better``/``worse`` when [lo, hi] excludes 0 by more than float
    rounding of the larger end; else ``no difference``."""
    if not any(d):
        return "identical on every seed"
    fuzz = 64 * _EPS * max(abs(lo), abs(hi))  # a few ulp of the ends' sums
    if lo > fuzz:
        return "better" if higher_is_better else "worse"
    if hi < -fuzz:
        return "worse" if higher_is_better else "better"
    return "no difference"


_EPS = 2.220446049250313e-16  # a double's unit roundoff times 2


def sign_flip_p(differences: Sequence[float]) -> float:
    """The two-sided p-value of the exact paired sign-flip test of "no
    effect": the share of the ``2**n`` sign patterns whose sum is at least
    as far from 0 as the observed one.

    Under no effect, each difference is as likely to come out +d as -d
    (the two arms could be swapped on that seed), so every sign pattern is
    equally likely and the share is exact: no normal law assumed. The
    observed pattern is one of them, so p >= ``2 / 2**n`` (0 differences
    flip to themselves). Sums within float rounding of the observed one
    count as reaching it.

    Exact (meet in the middle: two halves' sums, one sorted) up to
    :data:`EXACT_SIGN_FLIPS` differences; beyond it, 9,999 random patterns
    from a fixed generator, ``(1 + hits) / (1 + 9999)`` (still a valid
    p-value, and deterministic).

    Args:
        differences: per-seed differences (finite).

    Example:
        >>> sign_flip_p([0.01, 0.01]), sign_flip_p([1.0] * 6)
        (0.5, 0.03125)
    """
    d = [abs(float(x)) for x in differences]
    if not d:
        return 1.0
    observed = abs(
        math.fsum(x if s >= 0 else -x for x, s in zip(d, differences, strict=True))
    )
    bar = observed - 64 * _EPS * math.fsum(d)  # sums this close reach it
    if len(d) > EXACT_SIGN_FLIPS:
        gen = random.Random(0)
        draws = 9999
        hits = sum(
            abs(math.fsum(x if gen.random() < 0.5 else -x for x in d)) >= bar
            for _ in range(draws)
        )
        return (1 + hits) / (1 + draws)
    left, right = d[: len(d) // 2], d[len(d) // 2 :]
    sums = sorted(_all_sums(right))
    hits = 0
    for a in _all_sums(left):
        # |a + b| >= bar  <=>  b >= bar - a  or  b <= -bar - a
        hits += len(sums) - bisect.bisect_left(sums, bar - a)
        hits += bisect.bisect_right(sums, -bar - a)
    if bar <= 0:  # every pattern reaches 0 (counted twice above when so)
        return 1.0
    return hits / 2 ** len(d)


def _all_sums(d: Sequence[float]) -> list[float]:
    """The ``2**len(d)`` signed sums of ``d``, built by doubling (each sum
    has a few ulp of rounding: :func:`sign_flip_p` allows for it)."""
    sums = [0.0]
    for x in d:
        sums = [s + x for s in sums] + [s - x for s in sums]
    return sums


def confidence_sequence(
    differences: Iterable[float],
    *,
    level: float = 0.95,
    higher_is_better: bool = True,
    g: float = 1.0,
) -> PairedInterval:
    """An anytime-valid interval for the mean paired difference: with
    probability ``level`` it covers the true mean at every n at once, so
    seeds may be added until it excludes 0 and the verdict stays valid.

    Lai's (1976) scale-invariant mixture: for a trial mean ``mu``, the
    likelihood ratio of the t statistic ``t = (mean - mu) sqrt(n) / sd``
    between a normal prior ``N(0, g)`` on the effect size and no effect,

        B_n = (1 + n g)^(-1/2) [(1 + t^2/v) / (1 + t^2 / (v (1 + n g)))]^((v+1)/2),

    ``v = n - 1``, is a nonnegative martingale in n under ``mu`` (it depends
    on the data only through their scale-free shape), so by Ville's
    inequality ``P(B_n >= 1 / (1 - level) for some n) <= 1 - level``. The
    interval is every ``mu`` with ``B_n`` below that bar: ``mean -+ c_n sd /
    sqrt(n)`` with ``c_n`` in closed form, or the whole line while even an
    infinite t cannot reach the bar (``(1 + n g)^(v/2) < 1 / (1 - level)``:
    four seeds at 95% with g = 1). The assumption is the t interval's
    (normal differences), with no bound on their range.

    The verdict also needs the exact sign-flip test, as in
    :func:`paired_interval` (which only narrows it, so it stays valid).

    Args:
        differences: per-seed differences so far, in seed order.
        level: the coverage at every n together, in (0, 1).
        higher_is_better: as in :func:`paired_interval`.
        g: the prior's variance of the effect size (mean / sd); 1 puts the
            sequence's power on effects about one spread wide.

    Example:
        >>> confidence_sequence([0.01, 0.012]).verdict
        'no difference'
        >>> round(confidence_sequence([1.0, 1.2, 0.9, 1.1, 1.0, 1.05]).lo, 3)
        0.815
    """
    d, mean = _checked(differences, level)
    n = len(d)
    if n < 2:
        return PairedInterval(mean, math.nan, math.nan, n, "n/a", level=level)
    sd = _sd(d, mean)
    half = cs_quantile(n, level, g) * sd / math.sqrt(n)
    lo, hi = mean - half, mean + half
    verdict = _verdict(d, lo, hi, higher_is_better)
    if verdict in FIRM and sign_flip_p(d) > 1 - level:
        verdict = "inconclusive"
    return PairedInterval(mean, lo, hi, n, verdict, sd, level)


def cs_quantile(n: int, level: float = 0.95, g: float = 1.0) -> float:
    """The multiplier ``c_n`` of :func:`confidence_sequence`: the |t| at
    which the mixture ratio reaches ``1 / (1 - level)``; inf while no t can.

    With ``G = 1 + n g``, ``q = (sqrt(G) / (1 - level))^(2 / n)``, solving
    ``(1 + u) / (1 + u / G) = q`` for ``u = t^2 / (n - 1)`` gives
    ``u = (q - 1) / (1 - q / G)``, real while ``q < G``.

    Example:
        >>> cs_quantile(4), round(cs_quantile(10), 3), round(cs_quantile(20), 3)
        (inf, 3.87, 3.425)
    """
    big = 1 + n * g
    q = (math.sqrt(big) / (1 - level)) ** (2 / n)
    if n < 2 or q >= big:
        return math.inf
    return math.sqrt((n - 1) * (q - 1) / (1 - q / big))


def seeds_needed(
    effect: float, sd: float, *, level: float = 0.95, power: float = 0.8
) -> int:
    """Seeds a paired comparison needs to call a true difference ``effect``
    real, at ``level``, in a fraction ``power`` of studies.

    The smallest n with ``(t_{(1+level)/2, n-1} + t_{power, n-1}) sd /
    sqrt(n) <= |effect|``: the interval's half-width must leave room for the
    mean difference to fall short of ``effect`` by a t quantile of its own
    spread (the usual sample-size rule for a paired t test, with t rather
    than normal quantiles), and at least :func:`fewest_seeds` (below it the
    sign-flip test can never agree, whatever the effect).

    Args:
        effect: the true mean difference to detect (any sign; not 0).
        sd: the standard deviation of the per-seed differences.
        level: the interval's confidence level.
        power: the probability of detecting it, in [0.5, 1).

    Example:
        >>> seeds_needed(0.01, 0.01), seeds_needed(0.01, 0.005)
        (10, 6)

    Raises:
        ValueError: a zero effect, a negative sd, or power outside [0.5, 1).
    """
    if effect == 0 or not math.isfinite(effect):
        raise ValueError(f"effect must be finite and non-zero, got {effect}")
    if sd < 0 or not 0.5 <= power < 1:
        raise ValueError(f"need sd >= 0 and power in [0.5, 1), got {sd}, {power}")
    n = fewest_seeds(level)
    while True:
        t = t_quantile((1 + level) / 2, n - 1) + t_quantile(power, n - 1)
        if t * sd / math.sqrt(n) <= abs(effect):
            return n
        n += 1


def fewest_seeds(level: float = 0.95) -> int:
    """The fewest seeds that can give a firm verdict at ``level``: the
    sign-flip test's smallest p-value, ``2 / 2**n``, must reach
    ``1 - level`` (6 at 95%, 8 at 99%).

    Example:
        >>> fewest_seeds(), fewest_seeds(0.99)
        (6, 8)
    """
    n = 2
    while 2.0 ** (1 - n) > 1 - level:
        n += 1
    return n


@functools.lru_cache(maxsize=4096)
def t_quantile(p: float, df: float) -> float:
    """The p-quantile of Student's t with ``df`` degrees of freedom.

    Found by bisection on :func:`t_cdf` (monotone), to the last bits a
    double holds: the bracket is halved until it no longer shrinks. Cached:
    a verdict needs one per seed count, and simulations ask the same ones
    thousands of times.

    Args:
        p: a probability in (0, 1).
        df: degrees of freedom, > 0 (not necessarily whole).

    Example:
        >>> round(t_quantile(0.975, 1), 10), round(t_quantile(0.975, 4), 10)
        (12.7062047362, 2.7764451052)

    Raises:
        ValueError: ``p`` outside (0, 1) or ``df`` <= 0.
    """
    if not 0 < p < 1:
        raise ValueError(f"p must be in (0, 1), got {p}")
    if not df > 0:
        raise ValueError(f"df must be > 0, got {df}")
    if p == 0.5:
        return 0.0
    if p < 0.5:  # the law is symmetric
        return -t_quantile(1 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        lo, hi = hi, 2 * hi
    while True:
        mid = 0.5 * (lo + hi)
        if mid in (lo, hi):  # no double left between them
            return mid
        lo, hi = (mid, hi) if t_cdf(mid, df) < p else (lo, mid)


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with ``df`` degrees of freedom.

    ``P(|T| > t) = I_x(df/2, 1/2)`` with ``x = df / (df + t^2)``, the
    regularized incomplete beta function (Abramowitz and Stegun 26.7.1).

    Example:
        >>> t_cdf(0.0, 5), round(t_cdf(1.0, 1), 12)
        (0.5, 0.75)
    """
    if t == 0:
        return 0.5
    t2 = t * t
    # both x and 1 - x computed directly: neither loses digits to 1 - x
    tail = 0.5 * _betainc(df / 2, 0.5, df / (df + t2), t2 / (df + t2))
    return 1.0 - tail if t > 0 else tail


def _betainc(a: float, b: float, x: float, y: float) -> float:
    """I_x(a, b), with ``y = 1 - x`` given exactly.

    The continued fraction converges fast for ``x < (a + 1) / (a + b + 2)``;
    past that, ``I_x(a, b) = 1 - I_y(b, a)`` (Numerical Recipes, 6.4).
    """
    if x <= 0:
        return 0.0
    if y <= 0:
        return 1.0
    if x > (a + 1) / (a + b + 2):
        return 1.0 - _betainc(b, a, y, x)
    log_front = (
        a * math.log(x)
        + b * math.log(y)
        + math.lgamma(a + b)
        - math.lgamma(a)
        - math.lgamma(b)
    )
    return math.exp(log_front) * _beta_fraction(a, b, x) / a


def _beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of I_x(a, b) (A&S 26.5.8), by the modified
    Lentz method: each convergent from the last, stopping when a step
    changes it by less than 1e-15 relative."""
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 10_000):
        for coef in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),  # even step
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),  # odd
        ):
            d = 1.0 + coef * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + coef / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            return h
    raise ArithmeticError(f"incomplete beta did not converge (a={a}, b={b}, x={x})")


def _finite(x: object) -> TypeGuard[float]:
    """A finite real number (None, NaN and inf are not)."""
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)
