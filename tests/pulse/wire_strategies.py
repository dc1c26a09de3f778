"""Hypothesis strategies for every wire record, derived from the records' FIELDS tables so
a field added to a record is exercised without touching the tests."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
from hypothesis import strategies as st

from pulse import events, records
from pulse._schema import Field, Record
from pulse.samples import EpochBatch, make_batch

U32 = st.integers(0, (1 << 32) - 1)
NAME = st.from_regex(r"\A[A-Za-z0-9_.:@+-]{1,24}\Z", fullmatch=True).filter(lambda s: set(s) != {"."})
JOB = st.one_of(st.just(""), NAME)
COMM_ID = st.text(st.characters(codec="utf-8", categories=("L", "N", "P", "S", "Zs")),
                  min_size=1, max_size=64).filter(str.isprintable)
JSON_INT = st.integers(-(1 << 63), (1 << 63) - 1)
JSON_SCALAR = st.one_of(st.none(), st.booleans(), JSON_INT,
                        st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=12))
JSON_VALUE = st.recursive(JSON_SCALAR, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)), max_leaves=12)
JSON_OBJECT = st.dictionaries(st.text(max_size=8), JSON_VALUE, max_size=5)


@st.composite
def batches(draw: st.DrawFn, *, with_rx: bool | None = None, max_rows: int = 60) -> EpochBatch:
    """A valid batch: strictly sorted unique (flow, epoch) rows, each carrying bytes."""
    rx_present = draw(st.booleans()) if with_rx is None else with_rx
    small = draw(st.booleans())  # small ids make repeated flows (several epochs per flow) likely
    ids = st.integers(0, 20) if small else U32
    keys = sorted(draw(st.sets(st.tuples(ids, ids), max_size=max_rows)))
    n = len(keys)
    tx = draw(st.lists(U32, min_size=n, max_size=n))
    rx = draw(st.lists(U32, min_size=n, max_size=n)) if rx_present else None
    for i in range(n):
        if tx[i] == 0 and (rx is None or rx[i] == 0):
            tx[i] = 1
    return make_batch(
        node=draw(NAME), nic=draw(NAME), job=draw(JOB),
        t0_ns=draw(st.integers(-(1 << 63), (1 << 63) - 1)),
        epoch_ns=draw(st.integers(1_000, 1_000_000_000)),
        batch_seq=draw(st.integers(0, (1 << 64) - 1)),
        flow=np.array([k[0] for k in keys], dtype=np.uint32),
        epoch=np.array([k[1] for k in keys], dtype=np.uint32),
        tx_bytes=np.array(tx, dtype=np.uint32),
        rx_bytes=None if rx is None else np.array(rx, dtype=np.uint32),
    )


def _int_strategy(f: Field) -> st.SearchStrategy[int]:
    lo, hi = f.bounds if f.bounds is not None else (-(1 << 63), (1 << 63) - 1)
    return st.integers(int(lo), int(hi))


def field_strategy(f: Field) -> st.SearchStrategy[Any]:
    if f.choices is not None:
        return st.sampled_from(list(f.choices))
    if f.kind == "str":
        if f.name == "job":
            return JOB
        if f.name in ("node", "nic"):
            return NAME
        if f.name == "comm_id":
            return COMM_ID
        if f.name == "ptr":
            return st.integers(0, (1 << 64) - 1).map(hex)
        return st.text(max_size=20)
    if f.kind == "int":
        return _int_strategy(f)
    if f.kind == "float":
        lo, hi = f.bounds if f.bounds is not None else (-1e300, 1e300)
        return st.floats(float(lo), float(hi), allow_nan=False, allow_infinity=False)
    if f.kind == "bool":
        return st.booleans()
    if f.kind == "list[int]":
        return st.lists(_int_strategy(f), max_size=6)
    if f.kind == "list[str]":
        return st.lists(st.text(max_size=10), max_size=4)
    if f.kind == "list[list[int]]":
        return st.lists(st.lists(st.integers(-1, 1 << 20), max_size=6), max_size=4)
    if f.kind == "json":
        return JSON_OBJECT
    raise AssertionError(f"no strategy for field kind {f.kind}")


def _fix_comm(v: dict[str, Any], draw: st.DrawFn) -> None:
    if v["rank"] is not None and v["rank"] >= v["nranks"]:
        v["rank"] = min(v["rank"], (1 << 24) - 1)
        v["nranks"] = v["rank"] + 1


def _fix_op(v: dict[str, Any], draw: st.DrawFn) -> None:
    if v["kind"] in events.P2P and v["peer"] is None:
        v["peer"] = draw(st.integers(0, 1 << 24))
    if v["kind"] == events.GROUPED and v["peers"] is None:
        v["peers"] = draw(st.lists(st.integers(0, 1 << 24), max_size=6))
    n = None if v["peers"] is None else len(v["peers"])
    for name in ("peer_send_bytes", "peer_recv_bytes"):
        if v[name] is not None:
            v[name] = None if n is None else draw(st.lists(st.integers(0, 1 << 62), min_size=n, max_size=n))


def _fix_metrics(v: dict[str, Any], draw: st.DrawFn) -> None:
    if v["end_ns"] < v["start_ns"]:
        v["start_ns"], v["end_ns"] = v["end_ns"], v["start_ns"]
    # per-peer figures come as lists of one length, or not at all; their first bytes are
    # optional beside them (producers before them omit it)
    if v["peer_ranks"] is None:
        v["peer_done_ns"] = v["peer_bytes"] = v["peer_expected_bytes"] = v["peer_start_ns"] = None
    else:
        n = len(v["peer_ranks"])
        v["peer_ranks"] = [abs(x) for x in v["peer_ranks"]]
        v["peer_done_ns"] = draw(st.lists(st.integers(0, v["duration_ns"]), min_size=n, max_size=n))
        v["peer_bytes"] = draw(st.lists(st.integers(0, 1 << 62), min_size=n, max_size=n))
        v["peer_expected_bytes"] = draw(st.lists(st.integers(0, 1 << 62), min_size=n, max_size=n))
        if v["peer_start_ns"] is not None:
            v["peer_start_ns"] = [draw(st.integers(0, d)) for d in v["peer_done_ns"]]


def _fix_verdict(v: dict[str, Any], draw: st.DrawFn) -> None:
    if v["status"] == "anomaly":
        v["kind"] = v["kind"] or draw(st.sampled_from(records.VERDICT_KINDS))
        v["level"] = v["level"] or draw(st.sampled_from(records.LEVELS))


FIXUPS = {
    events.CommEvent: _fix_comm,
    events.OpEvent: _fix_op,
    records.OpMetrics: _fix_metrics,
    records.Verdict: _fix_verdict,
}


@st.composite
def record_of(draw: st.DrawFn, cls: type[Record]) -> Record:
    values: dict[str, Any] = {}
    for f in cls.FIELDS:
        if not f.required and draw(st.booleans()):
            values[f.name] = None
        else:
            values[f.name] = draw(field_strategy(f))
    fix = FIXUPS.get(cls)
    if fix is not None:
        fix(values, draw)
    init = {fl.name for fl in dataclasses.fields(cls)}  # type: ignore[arg-type]
    return cls(**{k: v for k, v in values.items() if k in init})


HOOK_EVENT_TYPES = (events.CommEvent, events.FlowEvent, events.OpEvent)
RECORD_TYPES = (records.OpMetrics, records.Verdict, records.OpLevel)
hook_events = st.one_of(*(record_of(c) for c in HOOK_EVENT_TYPES))
