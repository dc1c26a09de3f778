"""``pulse bench localize``: the tiled job, with one faulty copy among healthy ones."""

from __future__ import annotations

import json

from click.testing import CliRunner

from pulse.cli import main


def test_one_faulty_copy_among_healthy_ones_is_the_only_one_named():
    res = CliRunner().invoke(main, ["bench", "localize", "--scenario", "nic-slow", "--nodes", "4", "--steps", "6",
                                    "--tile", "3", "--faulty", "1", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["gpus"] == 3 * 4 * 8 and out["tile"] == 3 and out["faulty"] == 1
    assert out["localize_gpus_per_core"] > 0 and out["ratio"] > 0
    named = {n for _kind, nodes in out["incidents"] for n in nodes}
    assert named and all(n.startswith("t000-") for n in named), out["incidents"]


def test_every_copy_faulty_without_the_option():
    res = CliRunner().invoke(main, ["bench", "localize", "--scenario", "healthy", "--nodes", "4", "--steps", "2",
                                    "--tile", "2", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["faulty"] == 2 and out["incidents"] == []


def test_a_faulty_count_out_of_range_is_refused_before_anything_runs():
    for bad in ("0", "x", "-1"):
        res = CliRunner().invoke(main, ["bench", "localize", "--faulty", bad, "--json"])
        assert res.exit_code == 2, res.output
        assert "--faulty" in res.output
