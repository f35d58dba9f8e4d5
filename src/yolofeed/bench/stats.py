"""The statistics of a parity comparison: means, spreads, Welch's interval for a difference of means.

A few seeds a side is all a training comparison can afford, so intervals use Student's t with
Welch's degrees of freedom, not a normal approximation (at 4 seeds a side the 95 % quantile is ~2.5,
not 1.96). The t distribution is computed here (its CDF through the regularised incomplete beta
function, by Lentz's continued fraction) rather than pulling in scipy for one quantile.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

TINY = 1e-300  # keeps the continued fraction's denominators off zero


def _beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz)."""
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > TINY else TINY)
    h = d
    for m in range(1, 300):
        for num in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                    -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > TINY else TINY)
            c = 1.0 + num / c
            c = c if abs(c) > TINY else TINY
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """The regularised incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _beta_fraction(a, b, x) / a
    return 1.0 - front * _beta_fraction(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """Student's t cumulative distribution at ``t`` with ``df`` (any real > 0) degrees of freedom."""
    tail = 0.5 * betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


def t_ppf(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom (bisection on ``t_cdf``)."""
    if not 0.0 < p < 1.0 or not df > 0:
        raise ValueError(f"t quantile needs 0 < p < 1 and df > 0, got p={p}, df={df}")
    if p < 0.5:
        return -t_ppf(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        lo, hi = hi, hi * 2.0
    for _ in range(200):
        mid = (lo + hi) / 2.0
        lo, hi = (mid, hi) if t_cdf(mid, df) < p else (lo, mid)
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    return (lo + hi) / 2.0


def mean_sd(values) -> tuple[float, float]:
    """Mean and sample standard deviation (n - 1); the sd is nan below two values."""
    v = np.asarray(values, dtype=np.float64)
    return float(v.mean()) if len(v) else math.nan, float(v.std(ddof=1)) if len(v) > 1 else math.nan


@dataclass(frozen=True)
class Difference:
    """``b - a`` of two sample means with Welch's confidence interval.

    ``low``/``high`` are nan when either side has fewer than two values or one that is not a number, or when
    neither side varies (no spread to go by: a zero-width interval would claim a certainty that a few equal runs do
    not give).
    """

    diff: float
    low: float
    high: float
    df: float
    level: float


def welch(a, b, level: float = 0.95) -> Difference:
    """Mean of ``b`` minus mean of ``a``, with a two-sided ``level`` interval (Welch-Satterthwaite df)."""
    (ma, sa), (mb, sb) = mean_sd(a), mean_sd(b)
    na, nb = len(a), len(b)
    diff = mb - ma
    if na < 2 or nb < 2 or not math.isfinite(diff):  # too few values, or one that is not a number
        return Difference(diff, math.nan, math.nan, math.nan, level)
    va, vb = sa * sa / na, sb * sb / nb
    se2 = va + vb
    if se2 == 0.0:  # every run of both sides agreed exactly: no interval
        return Difference(diff, math.nan, math.nan, math.nan, level)
    df = se2 * se2 / (va * va / (na - 1) + vb * vb / (nb - 1))
    half = t_ppf(0.5 + level / 2.0, df) * math.sqrt(se2)
    return Difference(diff, diff - half, diff + half, df, level)


def bands_overlap(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per column (epoch), whether the mean +- sd bands of two (runs, epochs) arrays overlap.

    A column with a single run a side has no spread: the bands are points, overlapping only if equal.
    """
    ma, mb = a.mean(0), b.mean(0)
    sa = a.std(0, ddof=1) if len(a) > 1 else np.zeros_like(ma)
    sb = b.std(0, ddof=1) if len(b) > 1 else np.zeros_like(mb)
    return np.abs(ma - mb) <= sa + sb


__all__ = ["Difference", "bands_overlap", "betainc", "mean_sd", "t_cdf", "t_ppf", "welch"]
