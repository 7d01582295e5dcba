import math
import statistics

import pytest

from mgbench import stats


def test_percentiles_interpolate_like_numpy():
    xs = [1.0, 2.0, 3.0, 4.0, 10.0]
    assert stats.percentile(xs, 50) == 3.0
    assert stats.percentile(xs, 10) == pytest.approx(1.4)
    assert stats.percentile(xs, 90) == pytest.approx(7.6)


@pytest.mark.parametrize("n,ranks", [(6, (1, 6)), (10, (2, 9)), (20, (6, 15)), (30, (10, 21))])
def test_median_ci_ranks_match_binomial_tables(n, ranks):
    # Published order-statistic ranks for a 95% CI of the median (e.g. Conover table A3
    # / Altman et al., "Statistics with Confidence", table 18.4).
    xs = [float(i) for i in range(1, n + 1)]
    assert stats.median_ci(xs) == (float(ranks[0]), float(ranks[1]))


def test_median_ci_unknown_below_six_samples():
    assert stats.median_ci([1.0, 2.0, 3.0, 4.0, 5.0]) == (None, None)


def test_summarize():
    xs = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7]
    s = stats.summarize(xs)
    assert s["median"] == 0.4
    assert s["mean"] == pytest.approx(0.4)
    assert s["stddev"] == pytest.approx(statistics.stdev(xs))
    assert s["ci95_low"] == 0.1 and s["ci95_high"] == 0.7


def test_mann_whitney_matches_a_hand_worked_example():
    # Fully separated samples of 6 and 6: U = 0; z = (18 - 0.5) / sqrt(6*6*13/12) = 2.8022;
    # two-sided p = erfc(z / sqrt 2) = 0.00508.
    u, p = stats.mann_whitney_u([1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12])
    assert u == 0.0
    assert p == pytest.approx(0.00508, abs=2e-5)


def test_mann_whitney_identical_samples_are_not_significant():
    u, p = stats.mann_whitney_u([1.0] * 8, [1.0] * 8)
    assert p == 1.0
    u, p = stats.mann_whitney_u([1, 3, 5, 7, 9, 11], [2, 4, 6, 8, 10, 12])
    assert p > 0.5


def test_the_median_has_an_interval_from_min_ci_samples_steps_on():
    assert stats.median_ci(list(range(stats.MIN_CI_SAMPLES - 1))) == (None, None)
    assert stats.median_ci(list(range(stats.MIN_CI_SAMPLES)))[0] is not None


def test_mann_whitney_needs_five_per_side():
    # Fewer than five a side: no test (NaN), not p = 1.0, which would read as "no difference".
    u, p = stats.mann_whitney_u([1, 2, 3, 4], [5, 6, 7, 8])
    assert math.isnan(u) and math.isnan(p)
    assert stats.mann_whitney_u([1, 2, 3, 4, 5], [6, 7, 8, 9, 10])[1] < 0.05


def test_step_time_fields_are_declared_record_fields_with_the_summary_values():
    # One mapping from summary statistics to record fields, used by built-in workloads
    # and user commands alike: every name must be a Record field.
    import dataclasses

    from mgbench.record import Record

    declared = {f.name for f in dataclasses.fields(Record)}
    got = stats.step_time_fields([4.0, 1.0, 3.0, 2.0])
    assert set(got) <= declared and len(got) == len(stats.STEP_TIME_FIELDS) + 1
    assert got["step_time_s"] == 2.5 and got["step_time_min_s"] == 1.0 and got["step_time_max_s"] == 4.0
    assert got["step_time_mean_s"] == 2.5 and got["step_time_ci95_low_s"] is None  # fewer than 6 samples
    assert got["step_time_ci95_reason"].startswith("4 measured steps")  # and why
    six = stats.step_time_fields([4.0, 1.0, 3.0, 2.0, 5.0, 6.0])
    assert six["step_time_ci95_low_s"] is not None and "step_time_ci95_reason" not in six
