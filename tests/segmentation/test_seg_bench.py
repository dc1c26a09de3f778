"""`pulse bench segment` runs end to end through the real CLI (figures are not asserted)."""

from __future__ import annotations

import orjson
from click.testing import CliRunner
from pulse.segmentation.bench import synthetic_load
from pulse.segmentation.kernel import segment_rows

from pulse.cli import main


def test_bench_segment_json():
    r = CliRunner().invoke(main, ["bench", "segment", "--rows", "20000", "--flows", "50", "--repeats", "1",
                                  "--json"])
    assert r.exit_code == 0, r.output
    res = orjson.loads(r.stdout)
    for key in ("kernel_rows_per_s", "numpy_sum_rows_per_s", "ratio", "rows", "target_ratio"):
        assert key in res
    assert res["rows"] > 0 and res["ratio"] > 0
    assert res["complete_fraction"] == 1.0  # the synthetic load's operators all segment


def test_bench_segment_bad_arguments():
    r = CliRunner().invoke(main, ["bench", "segment", "--rows", "10", "--json"])
    assert r.exit_code == 1 and "error:" in r.output


def test_synthetic_load_is_valid_kernel_input():
    load = synthetic_load(5000, 20, seed=3)
    out = segment_rows(load["row_ptr"], load["epochs"], load["nbytes"], load["op_ptr"], load["need"],
                       gap=3, stall=10_000)
    assert (out.status == 1).all() and out.vol.sum() == load["nbytes"].sum()


def test_bench_segment_streaming_json():
    r = CliRunner().invoke(main, ["bench", "segment", "--streaming", "--nic-flows", "256,1024", "--active", "32",
                                  "--seconds", "0.3", "--json"])
    assert r.exit_code == 0, r.output
    res = orjson.loads(r.stdout)
    assert [x["flows_per_nic"] for x in res["runs"]] == [256, 1024]
    for x in res["runs"]:
        assert x["records"] > 0 and x["realtime_factor"] > 0 and x["stream_equals_batch"] is True
    assert "max_realtime_flows_per_nic" in res and "reference" in res


def test_bench_segment_streaming_bad_arguments():
    r = CliRunner().invoke(main, ["bench", "segment", "--streaming", "--nic-flows", "x", "--json"])
    assert r.exit_code == 1 and "error:" in r.output
