"""fedsim.tools.stats: Student t quantiles against closed forms, paired intervals
and their verdicts computed by hand, the seeds rule."""

from __future__ import annotations

import math

import pytest

from fedsim.tools.stats import (
    PairedInterval,
    paired_differences,
    paired_interval,
    seeds_needed,
    t_cdf,
    t_quantile,
)

PROBS = (0.55, 0.8, 0.9, 0.95, 0.975, 0.995, 0.9995)


def t1(p: float) -> float:
    """Cauchy: t = tan(pi (p - 1/2))."""
    return math.tan(math.pi * (p - 0.5))


def t2(p: float) -> float:
    """df 2: t = (2p - 1) / sqrt(2 p (1 - p))."""
    return (2 * p - 1) / math.sqrt(2 * p * (1 - p))


def t4(p: float) -> float:
    """df 4: with a = 4p(1-p), q = cos(acos(sqrt a) / 3) / sqrt a,
    t = 2 sqrt(q - 1) (Hill 1970's closed form), for p > 1/2."""
    a = 4 * p * (1 - p)
    q = math.cos(math.acos(math.sqrt(a)) / 3) / math.sqrt(a)
    return 2 * math.sqrt(q - 1)


@pytest.mark.parametrize("df, closed", [(1, t1), (2, t2), (4, t4)])
def test_t_quantiles_match_the_closed_forms(df, closed):
    for p in PROBS:
        assert t_quantile(p, df) == pytest.approx(closed(p), rel=1e-12, abs=1e-14)
        assert t_quantile(1 - p, df) == -t_quantile(p, df)  # symmetric
    assert t_quantile(0.5, df) == 0.0


def test_t_cdf_matches_the_closed_forms_for_1_and_3_degrees():
    for t in (-7.0, -1.3, -0.2, 0.4, 1.0, 2.5, 30.0):
        assert t_cdf(t, 1) == pytest.approx(0.5 + math.atan(t) / math.pi, rel=1e-13)
        s = math.sqrt(3)
        closed = 0.5 + (t / (s * (1 + t * t / 3)) + math.atan(t / s)) / math.pi
        assert t_cdf(t, 3) == pytest.approx(closed, rel=1e-13)


def test_t_quantile_inverts_the_cdf_and_tends_to_the_normal():
    for df in (3, 7, 29, 200):
        for p in PROBS:
            assert t_cdf(t_quantile(p, df), df) == pytest.approx(p, rel=1e-13)
    qs = [t_quantile(0.975, df) for df in (1, 2, 5, 10, 100, 10_000)]
    assert qs == sorted(qs, reverse=True)
    assert qs[-1] == pytest.approx(1.959963984540054, abs=3e-4)  # z_0.975


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="p must be"):
        t_quantile(1.0, 3)
    with pytest.raises(ValueError, match="df must be"):
        t_quantile(0.9, 0)
    with pytest.raises(ValueError, match="level"):
        paired_interval([1.0, 2.0], level=95)
    with pytest.raises(ValueError, match="finite"):
        paired_interval([1.0, math.nan])
    with pytest.raises(ValueError, match="effect"):
        seeds_needed(0.0, 1.0)


def test_paired_interval_by_hand():
    # Prepare: n = 5, mean 3, sd = sqrt(10 / 4), t_{0.975, 4} from the closed form
    diffs = [1.0, 2.0, 3.0, 4.0, 5.0]
    half = t4(0.975) * math.sqrt(10 / 4) / math.sqrt(5)  # = 1.96324...

    # Execute
    up = paired_interval(diffs)
    down = paired_interval(diffs, higher_is_better=False)

    # Assert
    assert up.mean == 3.0 and up.n == 5
    assert up.sd == pytest.approx(math.sqrt(2.5), rel=1e-15)
    assert (up.lo, up.hi) == (pytest.approx(3 - half), pytest.approx(3 + half))
    assert up.half_width == pytest.approx(half, rel=1e-12)
    assert (up.verdict, down.verdict) == ("better", "worse")
    assert paired_interval([-d for d in diffs]).verdict == "worse"


def test_two_seeds_use_the_cauchy_quantile_and_zero_inside_is_no_difference():
    # n = 2: sd = |d1 - d2| / sqrt 2, half = t1(0.975) * sd / sqrt 2
    iv = paired_interval([0.1, 0.3])
    assert iv.half_width == pytest.approx(t1(0.975) * 0.1, rel=1e-12)
    assert iv.verdict == "no difference"
    # n = 3 with the df-2 quantile, at 90%
    iv = paired_interval([0.0, 0.3, 0.6], level=0.9)
    assert iv.half_width == pytest.approx(t2(0.95) * 0.3 / math.sqrt(3), rel=1e-12)


def test_degenerate_seed_sets():
    assert paired_interval([0.5, 0.5, 0.5]) == PairedInterval(
        0.5, 0.5, 0.5, 3, "better", 0.0
    )
    assert paired_interval([0.0, 0.0]).verdict == "no difference"
    one = paired_interval([0.2])
    assert (one.mean, one.n, one.verdict) == (0.2, 1, "n/a")
    assert math.isnan(one.lo) and math.isnan(one.hi)
    assert paired_interval([]).verdict == "n/a"


def test_paired_differences_pair_by_seed_and_skip_missing_values():
    arm = {2: 0.9, 0: 0.5, 1: None, 3: math.inf, 5: 0.1}
    base = {0: 0.25, 1: 0.4, 2: 0.8, 3: 0.1, 4: 0.3, 5: math.nan}
    assert paired_differences(arm, base) == [0.25, pytest.approx(0.1)]


def meets(k: int, effect: float, sd: float) -> bool:
    """The rule of seeds_needed, written out: k seeds detect ``effect``."""
    t = t_quantile(0.975, k - 1) + t_quantile(0.8, k - 1)
    return t * sd / math.sqrt(k) <= effect


def test_seeds_needed_is_the_smallest_n_meeting_the_rule():
    for effect, sd in ((0.01, 0.01), (0.02, 0.05), (1.0, 0.3)):
        n = seeds_needed(effect, sd)
        assert meets(n, effect, sd)
        assert n == 2 or not meets(n - 1, effect, sd)
    # twice the spread needs about four times the seeds, once n is large
    # enough for the t quantiles to be near the normal ones
    assert 3.6 < seeds_needed(0.01, 0.04) / seeds_needed(0.01, 0.02) < 4.1
    assert seeds_needed(-0.01, 0.01) == seeds_needed(0.01, 0.01)
