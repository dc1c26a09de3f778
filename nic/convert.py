"""Capture file -> batches, flow events and a summary (and optionally a trace directory)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from pulse.nic.binner import CaptureBinner, Chunk
from pulse.nic.pcapfile import Capture, open_capture

from pulse.errors import DecodeError
from pulse.events import FlowEvent
from pulse.samples import EpochBatch
from pulse.settings import DEFAULT_EPOCH_NS
from pulse.trace import TraceWriter

CHUNK_PACKETS = 1 << 20
DEFAULT_WINDOW_NS = 100_000_000


@dataclasses.dataclass
class Conversion:
    batches: list[EpochBatch]
    events: list[FlowEvent]
    summary: dict


def convert_capture(cap: Capture, *, epoch_ns: int = DEFAULT_EPOCH_NS,
                    window_ns: int = DEFAULT_WINDOW_NS, local: Sequence[str] | None = None,
                    node: str = "local", job: str = "",
                    sink: Callable[[list[EpochBatch], list[FlowEvent]], None] | None = None,
                    progress: Callable[[int, int], None] | None = None) -> Conversion:
    """Decode and bin every packet of ``cap``. With ``sink`` the batches and events are
    handed over chunk by chunk (and not kept); raises DecodeError when nothing usable is
    left."""
    binner = CaptureBinner(epoch_ns=epoch_ns, window_ns=window_ns, iface_names=cap.if_names,
                           local=local, node=node, job=job, lateness_ns=1_000_000_000)
    batches: list[EpochBatch] = []
    events: list[FlowEvent] = []

    def emit(b: list[EpochBatch], e: list[FlowEvent]) -> None:
        if sink is not None:
            sink(b, e)
        else:
            batches.extend(b)
            events.extend(e)

    for ts, iface, dec, done in cap.chunks(CHUNK_PACKETS):
        binner.feed(Chunk(ts, iface, dec))
        emit(binner.flush(), binner.take_events())
        if progress is not None:
            progress(done, cap.size_hint)
    emit(binner.flush(final=True), binner.take_events())
    for name, c in cap.skip_counts().items():
        binner.skip(name, c)
    summary = binner.summary()
    summary["format"] = cap.fmt
    summary["linktypes"] = sorted({int(x) for x in cap.if_linktype})
    summary["batches"] = sum(binner.batch_seq.values())
    if not binner.n_flows:
        skipped = ", ".join(f"{k} {v}" for k, v in summary["skipped"].items()) or "none"
        raise DecodeError(f"{cap.path}: no usable RoCE or TCP packets among {binner.packets} packets "
                          f"(skipped: {skipped})")
    return Conversion(batches, events, summary)


def convert_file(path: str | Path, out: str | Path | None = None, **kwargs) -> Conversion:  # type: ignore[no-untyped-def]
    """Convert a pcap/pcapng file; with ``out`` write a trace directory there."""
    cap = open_capture(path)
    if out is None:
        return convert_capture(cap, **kwargs)
    epoch_ns = kwargs.get("epoch_ns", DEFAULT_EPOCH_NS)
    with TraceWriter(out, job=kwargs.get("job", ""), epoch_ns=epoch_ns,
                     meta={"source": "capture", "capture": str(path)}) as tw:
        def sink(b: list[EpochBatch], e: list[FlowEvent]) -> None:
            tw.write_events(e)
            for x in b:
                tw.write_batch(x)
        return convert_capture(cap, sink=sink, **kwargs)


def total_bytes(batches: Sequence[EpochBatch]) -> tuple[int, int]:
    tx = sum(int(np.asarray(b.tx_bytes, np.int64).sum()) for b in batches)
    rx = sum(int(np.asarray(b.rx_bytes, np.int64).sum()) for b in batches if b.rx_bytes is not None)
    return tx, rx
