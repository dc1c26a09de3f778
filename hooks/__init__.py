"""pulse.hooks: operator descriptors learned without touching the training code.

Sources, each producing ``comm`` / ``flow`` / ``op`` hook events (:mod:`pulse.events`):

* :mod:`pulse.hooks.plugin_reader` - records of the NCCL profiler plugin
  (``nccl_profiler_plugin.c``, built by :func:`build_plugin`);
* :mod:`pulse.hooks.nccl_log` - ``NCCL_DEBUG=INFO`` output (NCCL 2.3 - 2.30, also followed
  from the middle of a job);
* :mod:`pulse.hooks.rdma_res` - ``rdma res show qp`` output in any form, joined with the
  others, and ``rdma statistic qp show`` counters;
* ``torch_injection/sitecustomize.py`` - torch.distributed calls (see :func:`torch_injection_dir`).
"""

from __future__ import annotations

from pathlib import Path

from pulse.hooks.build import build_plugin

__all__ = ["build_plugin", "torch_injection_dir"]


def torch_injection_dir() -> Path:
    """The directory to put on ``PYTHONPATH`` for the torch.distributed injection."""
    return Path(__file__).resolve().parent / "torch_injection"
