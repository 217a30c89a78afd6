"""Paired comparisons over seeds: Student t intervals and their verdicts.

Two arms of a comparison (two algorithms, or one algorithm at two settings)
run on the same seeds; a seed fixes the fleet, the data, the selections and,
with common random numbers, every device's behaviour (docs/fleets.md, "Common
random numbers"). The per-seed difference ``d_s = arm_s - baseline_s`` is
then free of the seed-to-seed variation both arms share, and its mean gets a
Student t interval over seeds (docs/results.md, "Paired comparisons").

Pure functions of plain numbers: no numpy, no scipy. The t quantiles are
computed here from the regularized incomplete beta function, to about 1e-13
(tests/test_stats.py checks them against the closed forms for 1, 2 and 4
degrees of freedom).

Example:
    >>> iv = paired_interval([0.02, 0.03, 0.025, 0.035, 0.03])
    >>> round(iv.mean, 4), round(iv.lo, 4), round(iv.hi, 4), iv.n, iv.verdict
    (0.028, 0.0209, 0.0351, 5, 'better')
    >>> paired_interval([0.02, -0.01, 0.0]).verdict
    'no difference'
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal, TypeGuard

Verdict = Literal["better", "worse", "no difference", "n/a"]
"""``better``/``worse``: the interval lies wholly on one side of 0 (which
side is better is the metric's choice); ``no difference``: it holds 0;
``n/a``: fewer than two paired seeds, so there is no interval."""


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


def paired_differences(
    arm: Mapping[int, object], baseline: Mapping[int, object]
) -> list[float]:
    """``arm[s] - baseline[s]`` for every seed ``s`` both hold a finite value
    for, in increasing seed order.

    A seed where either value is missing (None), NaN or infinite (a run that
    diverged, a target never reached) has no difference: pairing it with
    anything would compare unlike things.

    Args:
        arm: seed -> the arm's value (a cell: anything not a finite number
            counts as missing).
        baseline: seed -> the baseline's value.

    Example:
        >>> paired_differences({0: 0.8, 1: 0.7, 2: None}, {0: 0.75, 1: 0.7, 2: 0.6})
        [0.050000000000000044, 0.0]
    """
    out = []
    for seed in sorted(set(arm) & set(baseline)):
        a, b = arm[seed], baseline[seed]
        if _finite(a) and _finite(b):
            out.append(float(a) - float(b))
    return out


def paired_interval(
    differences: Iterable[float],
    *,
    level: float = 0.95,
    higher_is_better: bool = True,
) -> PairedInterval:
    """The mean of ``differences`` with its Student t interval, and a verdict.

    The interval is ``mean -+ t_{(1+level)/2, n-1} * sd / sqrt(n)``, ``sd``
    the sample standard deviation (n - 1 in the denominator). It covers the
    true mean difference with probability ``level`` when the differences
    are independent draws from a normal law; with few seeds that is an
    assumption, which is why the t quantile (wider than the normal one for
    small n) is used.

    Args:
        differences: per-seed ``arm - baseline``, finite values only (see
            :func:`paired_differences`).
        level: the confidence level, in (0, 1).
        higher_is_better: whether a positive difference means the arm is
            better (accuracy) or worse (loss, rounds or time to target).

    Returns:
        The interval; ``verdict`` ``n/a`` and NaN ends with fewer than two
        differences. Equal differences (sd 0) give a zero-width interval.

    Raises:
        ValueError: ``level`` outside (0, 1) or a non-finite difference.
    """
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    d = [float(x) for x in differences]
    if not all(math.isfinite(x) for x in d):
        raise ValueError("paired_interval takes finite differences only")
    n = len(d)
    if n == 0:
        return PairedInterval(math.nan, math.nan, math.nan, 0, "n/a", level=level)
    mean = math.fsum(d) / n
    if n < 2:
        return PairedInterval(mean, math.nan, math.nan, n, "n/a", level=level)
    sd = math.sqrt(math.fsum((x - mean) ** 2 for x in d) / (n - 1))
    half = t_quantile((1 + level) / 2, n - 1) * sd / math.sqrt(n)
    lo, hi = mean - half, mean + half
    return PairedInterval(
        mean, lo, hi, n, _verdict(lo, hi, higher_is_better), sd, level
    )


def _verdict(lo: float, hi: float, higher_is_better: bool) -> Verdict:
    """``better``/``worse`` when [lo, hi] excludes 0, else ``no difference``."""
    if lo > 0:
        return "better" if higher_is_better else "worse"
    if hi < 0:
        return "worse" if higher_is_better else "better"
    return "no difference"


def seeds_needed(
    effect: float, sd: float, *, level: float = 0.95, power: float = 0.8
) -> int:
    """Seeds a paired comparison needs to call a true difference ``effect``
    real, at ``level``, in a fraction ``power`` of studies.

    The smallest n >= 2 with ``(t_{(1+level)/2, n-1} + t_{power, n-1}) sd /
    sqrt(n) <= |effect|``: the interval's half-width must leave room for the
    mean difference to fall short of ``effect`` by a t quantile of its own
    spread (the usual sample-size rule for a paired t test, with t rather
    than normal quantiles).

    Args:
        effect: the true mean difference to detect (any sign; not 0).
        sd: the standard deviation of the per-seed differences.
        level: the interval's confidence level.
        power: the probability of detecting it, in [0.5, 1).

    Example:
        >>> seeds_needed(0.01, 0.01), seeds_needed(0.01, 0.005)
        (10, 5)

    Raises:
        ValueError: a zero effect, a negative sd, or power outside [0.5, 1).
    """
    if effect == 0 or not math.isfinite(effect):
        raise ValueError(f"effect must be finite and non-zero, got {effect}")
    if sd < 0 or not 0.5 <= power < 1:
        raise ValueError(f"need sd >= 0 and power in [0.5, 1), got {sd}, {power}")
    n = 2
    while True:
        t = t_quantile((1 + level) / 2, n - 1) + t_quantile(power, n - 1)
        if t * sd / math.sqrt(n) <= abs(effect):
            return n
        n += 1


def t_quantile(p: float, df: float) -> float:
    """The p-quantile of Student's t with ``df`` degrees of freedom.

    Found by bisection on :func:`t_cdf` (monotone), to the last bits a
    double holds: the bracket is halved until it no longer shrinks.

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
