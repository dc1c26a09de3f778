"""The simulator writes its truth's per-segment columns one at a time (millions of entries at
the largest shapes); the file must be byte for byte the one ``write_truth`` writes of the
whole dict, which the readers and earlier traces know."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from pulse.trace import TraceWriter

_scalar = st.one_of(st.none(), st.booleans(), st.integers(-(2**62), 2**62), st.text(max_size=8))
_truth = st.dictionaries(st.text(min_size=1, max_size=6).filter(lambda k: k != "segments"),
                         st.one_of(_scalar, st.lists(_scalar, max_size=3),
                                   st.dictionaries(st.text(max_size=4), _scalar, max_size=3)), max_size=5)
_columns = st.dictionaries(st.text(max_size=8), st.lists(_scalar, max_size=6), max_size=5)


def _write(d: Path, how: str, truth: dict[str, Any], columns: dict[str, list[Any]]) -> bytes:
    with TraceWriter(d, job="t", epoch_ns=32_000, meta={"source": "test"}) as w:
        if how == "whole":
            w.write_truth({**truth, "segments": columns})
        else:
            w.write_truth_columns(truth, "segments", {k: (lambda v=v: v) for k, v in columns.items()})
    return (d / "truth.json").read_bytes()


@settings(max_examples=150, deadline=None)
@given(_truth, _columns)
def test_truth_written_column_by_column_is_the_same_file(truth: dict[str, Any], columns: dict[str, list[Any]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        whole = _write(Path(tmp) / "a", "whole", truth, columns)
        by_column = _write(Path(tmp) / "b", "columns", truth, columns)
    assert by_column == whole
