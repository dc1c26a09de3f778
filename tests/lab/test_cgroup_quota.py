"""The lab's CPU quota, as root on a real cgroup: a quota throttles a busy process and the run
reads that from cpu.stat (a cpu fault that never throttled fails the run instead of being
scored as a miss)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from pulse.lab.netns import cgroup_root

pytestmark = pytest.mark.root
if os.geteuid() != 0 or cgroup_root() is None:
    pytest.skip("needs root and the cgroup v1 cpu controller", allow_module_level=True)


def test_a_quota_throttles_and_cpu_stat_shows_it() -> None:
    from pulse.lab.runner import _Cgroups

    cg = _Cgroups(1, f"pulse-lab-test-{os.getpid()}")
    try:
        path = cg.paths[0]
        assert cg.cpu_stat(0)["nr_throttled"] == 0  # created unlimited
        period = int((path / "cpu.cfs_period_us").read_text())
        (path / "cpu.cfs_quota_us").write_text(str(period // 50))  # 2 % of a CPU
        # A busy loop for 0.5 s wall clock in the group: at 2 % it runs out of quota every period.
        busy = f"echo $$ > {path}/tasks; exec {sys.executable} -c " \
               "'import time\nt = time.monotonic()\nwhile time.monotonic() - t < 0.5: pass'"
        subprocess.run(["sh", "-c", busy], check=True, timeout=60)
        stat = cg.cpu_stat(0)
        assert stat["nr_throttled"] > 0 and stat["throttled_ns"] > 0, stat
        assert stat["nr_periods"] >= stat["nr_throttled"]
    finally:
        cg.close()
    assert not path.exists()
