"""Two lab networks with one prefix: the second refuses, and the first keeps its namespaces
(before, the second's stale-namespace cleanup deleted the live run's, and its capture died
with "No such file or directory: '/run/netns/...'")."""

from __future__ import annotations

import os
import subprocess

import pytest
from pulse.lab.netns import LabNetwork

from pulse.errors import ConfigError

pytestmark = [pytest.mark.root]

if os.geteuid() != 0:
    pytest.skip("network namespaces need root", allow_module_level=True)


def _names() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False).stdout
    return {ln.split()[0] for ln in out.splitlines() if ln.strip()}


def test_a_live_prefix_is_refused_and_left_alone() -> None:
    prefix = f"plock{os.getpid() % 100000}"
    with LabNetwork(2, prefix=prefix) as net:
        mine = {net.switch_ns, *(n.netns for n in net.nodes)}
        assert mine <= _names()
        with pytest.raises(ConfigError, match="another lab run holds"):
            LabNetwork(2, prefix=prefix).__enter__()
        assert mine <= _names()  # untouched
    assert not mine & _names()
    with LabNetwork(2, prefix=prefix):  # free again once the first is closed
        pass


def test_namespaces_of_a_dead_run_are_cleaned_up() -> None:
    prefix = f"pdead{os.getpid() % 100000}"
    subprocess.run(["ip", "netns", "add", f"{prefix}-n0"], check=True)  # a killed run's leftover
    try:
        with LabNetwork(2, prefix=prefix) as net:  # `ip netns add` of a leftover name would fail
            assert f"{prefix}-n0" in _names() and net.nodes[0].netns == f"{prefix}-n0"
    finally:
        subprocess.run(["ip", "netns", "del", f"{prefix}-n0"], check=False)
    assert not {n for n in _names() if n.startswith(prefix)}
