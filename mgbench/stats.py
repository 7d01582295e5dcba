"""Summary statistics of step-time samples, in plain Python (no SciPy needed).

The median is the headline figure (robust to a stray slow step); its 95% confidence
interval is the distribution-free one from order statistics: the ranks j, k such that
the binomial(n, 1/2) probability of the median lying between x_(j) and x_(k) is >= 95%
(e.g. Conover, "Practical Nonparametric Statistics", 3rd ed., section 3.2).
"""

from __future__ import annotations

import math
import statistics
from typing import Any, Sequence


def percentile(xs: Sequence[float], q: float) -> float:
    """Percentile with linear interpolation between closest ranks (numpy's default)."""
    s = sorted(xs)
    if not s:
        raise ValueError("percentile of no samples")
    pos = (len(s) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def median_ci(xs: Sequence[float], confidence: float = 0.95) -> tuple[float | None, float | None]:
    """Distribution-free confidence interval of the median; (None, None) if n < 6.

    With fewer than 6 samples no pair of order statistics reaches 95% coverage
    (the widest interval, min to max, covers 1 - 2 * 0.5**n), so the CI is unknown.
    """
    s = sorted(xs)
    n = len(s)
    # cdf[i] = P(Binomial(n, 1/2) <= i)
    cdf, acc = [], 0.0
    for i in range(n + 1):
        acc += math.comb(n, i) / 2.0**n
        cdf.append(acc)
    alpha = 1.0 - confidence
    # Largest j (1-based lower rank) with P(B <= j - 1) <= alpha / 2.
    j = 0
    for i in range(n):
        if cdf[i] <= alpha / 2:
            j = i + 1
    if j == 0:
        return None, None
    k = n + 1 - j  # symmetric upper rank
    return s[j - 1], s[k - 1]


def summarize(xs: Sequence[float]) -> dict[str, float | None]:
    """median, p10, p90, mean, stddev, min, max and the 95% CI of the median."""
    if not xs:
        return {k: None for k in ("median", "p10", "p90", "mean", "stddev", "min", "max", "ci95_low", "ci95_high")}
    lo, hi = median_ci(xs)
    return {
        "median": statistics.median(xs),
        "p10": percentile(xs, 10),
        "p90": percentile(xs, 90),
        "mean": statistics.fmean(xs),
        "stddev": statistics.stdev(xs) if len(xs) > 1 else 0.0,
        "min": min(xs),
        "max": max(xs),
        "ci95_low": lo,
        "ci95_high": hi,
    }


# Record field of each summary statistic of the step times (Record: step_time_*_s).
STEP_TIME_FIELDS = {"median": "step_time_s", "p10": "step_time_p10_s", "p90": "step_time_p90_s",
                    "mean": "step_time_mean_s", "stddev": "step_time_stddev_s", "min": "step_time_min_s",
                    "max": "step_time_max_s", "ci95_low": "step_time_ci95_low_s", "ci95_high": "step_time_ci95_high_s"}


def step_time_fields(xs: Sequence[float]) -> dict[str, Any]:
    """The record's step-time statistics of ``xs`` (seconds), by field name; where the
    median's confidence interval is null, ``step_time_ci95_reason`` says why."""
    s = summarize(xs)
    out: dict[str, Any] = {field: s[key] for key, field in STEP_TIME_FIELDS.items()}
    if xs and s["ci95_low"] is None:
        out["step_time_ci95_reason"] = (f"{len(xs)} measured steps: the median's 95% interval from order statistics "
                                        f"needs {MIN_CI_SAMPLES} or more (raise measured_steps)")
    return out


# Samples per side from which the Mann-Whitney U normal approximation is used.
MIN_TEST_SAMPLES = 5
# Samples from which the median has a 95% interval from order statistics: the smallest
# n with P(B <= 0) = 2^-n <= 0.025 for B ~ Binomial(n, 1/2) (median_ci).
MIN_CI_SAMPLES = 6


def mann_whitney_u(a: Sequence[float], b: Sequence[float]) -> tuple[float, float]:
    """Two-sided Mann-Whitney U test: (U of ``a``, p-value).

    Normal approximation with tie correction and continuity correction (e.g. Conover,
    section 5.1), adequate from about 5 samples per side (MIN_TEST_SAMPLES); with fewer
    there is no test: U and p are NaN (not 1.0, which would read as "no difference").
    """
    n1, n2 = len(a), len(b)
    if n1 < MIN_TEST_SAMPLES or n2 < MIN_TEST_SAMPLES:
        return float("nan"), float("nan")
    pooled = sorted([(x, 0) for x in a] + [(x, 1) for x in b])
    ranks = [0.0] * len(pooled)
    ties = 0.0
    i = 0
    while i < len(pooled):
        j = i
        while j + 1 < len(pooled) and pooled[j + 1][0] == pooled[i][0]:
            j += 1
        avg = (i + j) / 2.0 + 1.0
        for k in range(i, j + 1):
            ranks[k] = avg
        t = j - i + 1
        ties += t**3 - t
        i = j + 1
    r1 = sum(r for r, (_, g) in zip(ranks, pooled) if g == 0)
    u1 = r1 - n1 * (n1 + 1) / 2.0
    mu = n1 * n2 / 2.0
    n = n1 + n2
    sigma = math.sqrt(n1 * n2 / 12.0 * ((n + 1) - ties / (n * (n - 1))))
    if sigma == 0:
        return u1, 1.0
    z = (abs(u1 - mu) - 0.5) / sigma
    p = math.erfc(max(z, 0.0) / math.sqrt(2.0))
    return u1, min(1.0, p)
