"""The fast robust statistics against numpy's, on random and adversarial samples."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from pulse.localization.robust import RollingRef, leave_one_out_medians, median

values = st.sampled_from([0.0, 1.0, 1.0, 2.5, -3.0, 1e9, 32_000.0]) | st.floats(-1e12, 1e12, allow_nan=False)


@settings(max_examples=300, deadline=None)
@given(st.lists(values, min_size=0, max_size=40))
def test_median_equals_numpy(xs):
    a = np.array(xs, dtype=np.float64)
    want = float(np.median(a)) if xs else float("nan")
    for got in (median(a), median(xs)):
        assert got == want or (np.isnan(got) and np.isnan(want))


@settings(max_examples=300, deadline=None)
@given(st.lists(values, min_size=0, max_size=12))
def test_leave_one_out_medians_equal_the_naive_loop(xs):
    a = np.array(xs, dtype=np.float64)
    got = leave_one_out_medians(a)
    if a.size < 2:
        assert got.shape == a.shape and np.isnan(got).all()
        return
    want = np.array([np.median(np.delete(a, i)) for i in range(a.size)])
    assert np.array_equal(got, want), (a, got, want)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(values, min_size=0, max_size=30), min_size=1, max_size=12),
       st.integers(1, 64), st.sampled_from([0, 25, 50, 75, 100, 33.3]))
def test_rolling_percentile_equals_numpy_on_the_kept_window(chunks, size, q):
    ref = RollingRef(size)
    for c in chunks:
        ref.extend(np.array(c, dtype=np.float64))
        if len(ref):
            want = float(np.percentile(ref.array(), q))
            got = ref.percentile(q)
            assert got == want, (ref.array(), q, got, want)
    assert len(ref) == min(size, sum(map(len, chunks)))
    assert sorted(ref.array().tolist()) == ref._sorted


def test_rolling_percentile_with_many_ties_and_evictions():
    ref = RollingRef(4)
    for v in [5, 5, 5, 1, 1, 9, 5, 5]:
        ref.extend(np.array([v], dtype=np.float64))
    assert ref.array().tolist() == [1.0, 9.0, 5.0, 5.0]
    assert ref.percentile(25) == float(np.percentile([1, 9, 5, 5], 25))
