"""perf.distinct_pairs: the distinct (a, b) pairs a plan's terms price once each. Its
counting path (perf._counted_pairs) must give exactly what the sort it replaced gives
(np.unique of a + b i): the same pairs in the same order and the same index for every
element, or hand the arrays to that sort where it cannot count them."""

from __future__ import annotations

import numpy as np
import pytest

from mgbench.planner.perf import _counted_pairs, distinct_pairs


def by_sort(a, b):  # the reference: what distinct_pairs did before it counted
    a, b = np.broadcast_arrays(np.asarray(a, dtype=float), np.asarray(b, dtype=float))
    pairs, inverse = np.unique(a.ravel() + 1j * b.ravel(), return_inverse=True)
    return pairs.real, pairs.imag, inverse.reshape(a.shape)


def same(x, y) -> bool:
    return all(p.dtype == q.dtype and np.array_equal(p, q, equal_nan=True) for p, q in zip(x, y))


@pytest.mark.parametrize("seed", range(5))
def test_counting_matches_the_sort_on_plan_shaped_arrays(seed):
    rng = np.random.default_rng(seed)
    a = rng.choice([1, 2, 3, 4, 8, 16, 64], 20_000).astype(np.int64)
    b = rng.integers(0, 3000, 20_000)
    assert _counted_pairs(a.astype(float), b.astype(float)) is not None  # the counting path ran
    assert same(distinct_pairs(a, b), by_sort(a, b))


def test_broadcast_shapes_keep_their_shape():
    a = np.array([[1], [2], [4]])
    b = np.array([[3, 1, 3, 7]])
    got = distinct_pairs(a, b)
    assert got[2].shape == (3, 4)
    assert same(got, by_sort(a, b))
    # a worked case by hand: pairs sorted by a, then b
    pa, pb, index = distinct_pairs([2, 1, 2, 1], [5, 5, 0, 5])
    assert pa.tolist() == [1.0, 2.0, 2.0] and pb.tolist() == [5.0, 0.0, 5.0] and index.tolist() == [2, 0, 1, 0]


@pytest.mark.parametrize("a, b, why", [
    ([1.0, np.nan, 2.0], [3.0, 3.0, 4.0], "NaN"),
    ([1.5, 2.0], [1.0, 1.0], "not integers"),
    ([1.0, -2.0], [1.0, 1.0], "negative"),
    ([1.0, 2.0**40], [1.0, 2.0**20], "a table far larger than the arrays"),
    ([1.0, np.inf], [1.0, 1.0], "infinite"),
])
def test_what_cannot_be_counted_goes_to_the_sort(a, b, why):
    assert _counted_pairs(np.asarray(a, dtype=float), np.asarray(b, dtype=float)) is None, why
    assert same(distinct_pairs(a, b), by_sort(a, b)), why


def test_empty_arrays():
    got = distinct_pairs(np.zeros(0), np.zeros(0))
    assert got[0].size == 0 and got[2].shape == (0,)


def test_the_table_size_limit():
    # the table holds (max a + 1) x (max b + 1) keys: up to max(4 n, 2**20) are counted
    b_max = (1 << 20) // 2 - 1  # (1 + 1) x 2**19 = 2**20 keys: counted
    assert _counted_pairs(np.array([0.0, 1.0, 1.0]), np.array([0.0, 5.0, float(b_max)])) is not None
    assert _counted_pairs(np.array([0.0, 1.0, 1.0]), np.array([0.0, 5.0, float(b_max + 1)])) is None
    a, b = np.array([0.0, 1.0, 1.0]), np.array([0.0, 5.0, float(b_max + 1)])
    assert same(distinct_pairs(a, b), by_sort(a, b))
