"""The disk spool: order, bound, persistence across restarts, torn tails."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from pulse.producers.spool import Spool, read_segment

msg = st.tuples(st.sampled_from(["pulse.samples", "pulse.hook-events"]), st.binary(max_size=20),
                st.binary(max_size=300))


def drain(sp: Spool) -> list[tuple[str, bytes, bytes]]:
    out = []
    while (head := sp.oldest()) is not None:
        path, msgs = head
        out += msgs
        sp.release(path)
    return out


@given(st.lists(msg, max_size=60), st.integers(64, 2048))
def test_messages_come_back_in_order_across_segments(tmp_path_factory, messages, segment_bytes):
    sp = Spool(tmp_path_factory.mktemp("spool"), 1 << 30, segment_bytes=segment_bytes)
    for m in messages:
        assert sp.append(*m)
    assert drain(sp) == messages
    assert sp.empty and sp.bytes == 0


@given(st.lists(msg, min_size=1, max_size=40), st.integers(0, 4000))
def test_bound_drops_and_counts_only_what_does_not_fit(tmp_path_factory, messages, bound):
    sp = Spool(tmp_path_factory.mktemp("spool"), bound, segment_bytes=512)
    kept = [m for m in messages if sp.append(*m)]
    assert sp.bytes <= bound
    assert sp.dropped == len(messages) - len(kept)
    assert drain(sp) == kept


def test_survives_a_restart_and_keeps_appending_after_old_segments(tmp_path):
    a = Spool(tmp_path, 1 << 20, segment_bytes=100)
    first = [("t", b"k%d" % i, b"v" * i) for i in range(20)]
    for m in first:
        a.append(*m)
    a.close()
    b = Spool(tmp_path, 1 << 20, segment_bytes=100)
    assert b.bytes == a.bytes > 0
    b.append("t", b"late", b"x")
    assert drain(b) == [*first, ("t", b"late", b"x")]


def test_torn_tail_is_ignored_not_fatal(tmp_path):
    sp = Spool(tmp_path, 1 << 20)
    sp.append("t", b"k", b"complete")
    sp.close()
    seg = sp.segments()[0]
    with open(seg, "ab") as fh:
        fh.write(b"\x05\x00\x00")  # a writer that died mid-record
    assert list(read_segment(seg)) == [("t", b"k", b"complete")]
