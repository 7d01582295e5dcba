"""Summary statistics of step-time samples, in plain Python (no SciPy needed).

The median is the headline figure (robust to a stray slow step); its 95% confidence
interval is the distribution-free one from order statistics: the ranks j, k such that
the binomial(n, 1/2) probability of the median lying between x_(j) and x_(k) is >= 95%
(e.g. Conover, "Practical Nonparametric Statistics", 3rd ed., section 3.2).
"""

from __future__ import annotations

import math
import statistics
from typing import Sequence


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
