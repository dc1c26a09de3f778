"""Feed the segment agent's state a hostile stream in a process of its own and print its peak
RSS and counters as JSON (run by test_hostile_input.py; ``python hostile_feed.py MODE``).

MODE ``baseline`` feeds a small legitimate stream; ``hostile`` adds huge messages, deep JSON,
two million distinct flow ids, a million communicators, and thousands of node names. The limits
come from the PULSE_MAX_* environment, like a worker's."""

from __future__ import annotations

import json
import resource
import sys

import numpy as np
import orjson
from pulse.streams.state import Message, SegmentState

from pulse.bounds import InputBounds
from pulse.samples import encode, make_batch
from pulse.settings import Settings


def batch(node: str, flows: np.ndarray, seq: int) -> bytes:
    n = flows.size
    return encode(make_batch(node=node, nic="mlx5_0", t0_ns=0, epoch_ns=32_000, batch_seq=seq, flow=flows,
                             epoch=np.zeros(n, np.uint32), tx_bytes=np.full(n, 100, np.uint32), job="j"))


def comm_pack(node: str, first: int, n: int) -> bytes:
    evs = [orjson.dumps({"type": "comm", "v": 1, "job": "j", "node": node, "comm_id": f"{first + i:#x}",
                         "rank": 0, "nranks": 2}) for i in range(n)]
    return b'{"type":"batch","v":1,"events":[' + b",".join(evs) + b"]}"


def main(mode: str) -> None:
    settings = Settings.from_env()
    st = SegmentState(settings.topics, bounds=InputBounds.from_settings(settings))
    t = settings.topics
    off = 0

    def feed(topic: str, value: bytes) -> None:
        nonlocal off
        off += 1
        st.handle([Message(topic, b"k", value, 0, off, None)])

    # The legitimate part (both modes): a few nodes, a few flows, a communicator.
    for node in ("n0", "n1"):
        feed(t.hook_events, comm_pack(node, 0x10, 1))
        for seq in range(20):
            feed(t.samples, batch(node, np.arange(64, dtype=np.uint32), seq))
    if mode == "hostile":
        huge = b"\x00" * (64 << 20)  # one object, fed again and again
        for _ in range(8):
            feed(t.samples, huge)
            feed(t.hook_events, huge)
        deep = b"[" * 200_000 + b"]" * 200_000
        feed(t.hook_events, deep)
        feed(t.hook_events, b'{"type":"batch","v":1,"events":' + b"[" * 5000 + b"]" * 5000 + b"}")
        # 2,000,000 distinct flow ids on one node's NIC
        for seq in range(40):
            feed(t.samples, batch("n0", np.arange(seq * 50_000, (seq + 1) * 50_000, dtype=np.uint32), 100 + seq))
        # 1,000,000 distinct communicators in one job
        for i in range(100):
            feed(t.hook_events, comm_pack("n1", 0x100000 + i * 10_000, 10_000))
        # 5,000 node names, one small batch each
        for i in range(5_000):
            feed(t.samples, batch(f"x{i}", np.arange(4, dtype=np.uint32), 0))
    print(json.dumps({"peak_rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, **st.stats}))


if __name__ == "__main__":
    main(sys.argv[1])
