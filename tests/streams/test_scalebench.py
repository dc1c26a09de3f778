"""``pulse bench scale``: the JSON it prints has the figures the issue names, each positive
and finite, on a tiny job (no timing is asserted: speed is what the bench reports)."""

from __future__ import annotations

import math

import orjson
from click.testing import CliRunner

from pulse.cli import main

KEYS = ("gpus", "trace_s", "segment_cpu_per_s", "localize_cpu_per_s", "segment_gpus_per_core",
        "localize_gpus_per_core", "kafka_bytes_per_gpu_s", "op_metrics_per_s", "hook_decode_cpu_per_s",
        "batch_decode_cpu_per_s", "epoch_rows_per_s", "numpy_pass_rows_per_s", "segment_ratio_to_numpy_pass",
        "kafka_bytes_per_gpu_s_v1", "edge_kafka_bytes_per_gpu_s")


def test_bench_scale_json_on_a_tiny_job() -> None:
    res = CliRunner().invoke(main, ["bench", "scale", "--gpus", "32", "--steps", "2", "--json"])
    assert res.exit_code == 0, res.output
    data = orjson.loads(res.stdout.strip().splitlines()[-1])
    (row,) = data["sizes"]
    assert row["gpus"] == 32 and row["source"].startswith("simulated")
    for k in KEYS:
        v = row[k]
        assert isinstance(v, (int, float)) and math.isfinite(v) and v > 0, (k, v)
    assert row["op_metrics"] > 0 and row["epoch_rows"] > 0
    assert row["anomalies"] == []  # a healthy job
    # version 2 batches are what is published: smaller than version 1 in the same run
    assert row["kafka_bytes_per_gpu_s"] < row["kafka_bytes_per_gpu_s_v1"]


def test_bench_scale_refuses_odd_sizes() -> None:
    res = CliRunner().invoke(main, ["bench", "scale", "--gpus", "48"])
    assert res.exit_code == 2 and "multiples of 32" in res.output
