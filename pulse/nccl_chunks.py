"""How NCCL cuts an operator into network messages: facts the simulator models and the
segmentation counts on (its CTS-burst rule needs to know when an operator's messages fill
every slot of a connection)."""

from __future__ import annotations

NET_STEP_BYTES = 512 * 1024
"""One step of the SIMPLE protocol (its 4 MiB buffer over NCCL_STEPS = 8 slots): the most
one network message carries."""


def tree_chunk_bytes(nbytes: int, nchannels: int, depth: int) -> int:
    """NCCL's SIMPLE tree chunk for an AllReduce of ``nbytes`` (the TreeUpDown pattern):
    one step, halved while the operator would give each channel fewer than ``depth`` x 8
    chunks (not below 128 KiB), then ``depth`` x 4 (64 KiB), then ``depth`` (32 KiB), so
    that a small operator still fills the tree's pipeline."""
    chunk = NET_STEP_BYTES
    for per_depth, floor in ((8, 128 * 1024), (4, 64 * 1024), (1, 32 * 1024)):
        while nbytes // (nchannels * chunk) < depth * per_depth and chunk > floor:
            chunk //= 2
    return chunk


def tree_depth_at_least(nranks: int) -> int:
    """A lower bound of a communicator's tree depth: NCCL sets localRanks - 1 +
    log2i(nNodes), which is at least log2i(nranks) (rounded down), and no binary tree over
    ``nranks`` ranks is shallower."""
    return max(int(nranks), 1).bit_length() - 1
