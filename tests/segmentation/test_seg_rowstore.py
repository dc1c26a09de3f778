"""The row-store merge kernel against a pure-Python reference."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from pulse.segmentation.batch import segment_trace
from pulse.segmentation.rowstore import merge_rows
from segbuilder import random_trace

from pulse.records import OpMetrics

_rows = st.dictionaries(st.tuples(st.integers(0, 6), st.integers(0, 40)), st.integers(1, 1000), max_size=60)


def _cols(d):
    keys = sorted(d)
    return (np.array([k[0] for k in keys], np.int64), np.array([k[1] for k in keys], np.int64),
            np.array([d[k] for k in keys], np.int64))


@settings(max_examples=200, deadline=None)
@given(_rows, _rows)
def test_merge_rows_equals_reference(a, b):
    want: dict = dict(a)
    for k, v in b.items():
        want[k] = want.get(k, 0) + v
    f, e, t = merge_rows(_cols(a), _cols(b))
    assert list(zip(f.tolist(), e.tolist(), t.tolist(), strict=True)) == [(k[0], k[1], want[k]) for k in sorted(want)]


def test_trusted_records_equal_validated_ones():
    """Records built with the trusted constructor are exactly what validation accepts."""
    tb = random_trace(5, hang_after=4)
    got = segment_trace(tb.batches(window=5), tb.events)
    assert got
    for m in got:
        again = OpMetrics.from_dict(m.to_dict())
        assert again == m and OpMetrics(**{f.name: getattr(m, f.name) for f in OpMetrics.FIELDS}) == m
        assert [type(getattr(again, f.name)) for f in OpMetrics.FIELDS] == \
            [type(getattr(m, f.name)) for f in OpMetrics.FIELDS]


def test_built_records_set_every_field():
    """metrics.build_many fills the record's __dict__ itself: every OpMetrics field, no
    other (a field added to OpMetrics later must be added there too)."""
    import dataclasses

    tb = random_trace(3)
    got = segment_trace(tb.batches(window=5), tb.events)
    assert got
    names = {f.name for f in dataclasses.fields(OpMetrics)}
    assert all(set(vars(m)) == names for m in got)
