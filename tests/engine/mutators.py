"""Trace mutators: copies of a trace directory with one kind of damage, as a careless
tool, a dying writer or a hostile user would leave it. Each returns the damaged copy."""

from __future__ import annotations

import dataclasses
import shutil
import struct
from collections.abc import Callable
from pathlib import Path

import numpy as np
import orjson

from pulse import samples
from pulse.samples import EpochBatch
from pulse.trace import FILE_MAGIC, FILE_VERSION, read_batch_file

Edit = Callable[[list[EpochBatch]], list[EpochBatch]]


def copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def nic_file(trace: Path, node: str, nic: str | None = None) -> Path:
    files = sorted((trace / "samples" / node).glob("*.batches"))
    return next(p for p in files if nic is None or p.stem == nic)


def write_nic_file(path: Path, batches: list[EpochBatch]) -> None:
    out = bytearray(struct.pack("<8sI", FILE_MAGIC, FILE_VERSION))
    for b in batches:
        raw = samples.encode(b)
        out += struct.pack("<I", len(raw)) + raw
    path.write_bytes(bytes(out))


def edit_nic(trace: Path, node: str, edit: Edit, nic: str | None = None) -> Path:
    p = nic_file(trace, node, nic)
    write_nic_file(p, edit(list(read_batch_file(p))))
    return p


def drop_every_other(bs: list[EpochBatch]) -> list[EpochBatch]:
    return bs[::2]


def duplicate_all(bs: list[EpochBatch]) -> list[EpochBatch]:
    return [x for b in bs for x in (b, b)]


def swap_pairs(bs: list[EpochBatch]) -> list[EpochBatch]:
    out = list(bs)
    for i in range(0, len(out) - 1, 2):
        out[i], out[i + 1] = out[i + 1], out[i]
    return out


def wild_t0(value: int, at: int = -1) -> Edit:
    def edit(bs: list[EpochBatch]) -> list[EpochBatch]:
        out = list(bs)
        k = at % len(out)
        out[k] = dataclasses.replace(out[k], t0_ns=value)
        return out
    return edit


def over_capacity(bs: list[EpochBatch]) -> list[EpochBatch]:
    """Every row of the fullest batch claims 4 GB in one epoch."""
    out = list(bs)
    k = max(range(len(out)), key=lambda i: out[i].n_rows)
    b = out[k]
    out[k] = dataclasses.replace(b, tx_bytes=np.full_like(b.tx_bytes, 0xFFFFFFF0))
    return out


def renamed(node: str, nic: str) -> Edit:
    def edit(bs: list[EpochBatch]) -> list[EpochBatch]:
        return [dataclasses.replace(b, node=node, nic=nic) for b in bs]
    return edit


def op_bytes(trace: Path, node: str, value: int) -> None:
    """The first op event of ``node`` claims ``value`` bytes."""
    p = trace / "hook-events.jsonl"
    lines = p.read_bytes().splitlines()
    for i, line in enumerate(lines):
        ev = orjson.loads(line)
        if ev.get("type") == "op" and ev.get("node") == node:
            ev["bytes"] = value
            lines[i] = orjson.dumps(ev)
            break
    p.write_bytes(b"\n".join(lines) + b"\n")


def cut_tail(path: Path, nbytes: int) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: max(0, len(data) - nbytes)])
