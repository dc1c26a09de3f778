"""infra/grafana/make_dashboards.py as a command: --help and bad arguments write nothing,
--out writes elsewhere, --check compares without writing."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from infra_compose import DASHBOARDS, GRAFANA

SCRIPT = GRAFANA / "make_dashboards.py"


def _run(script: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=60)


def _copy(tmp: Path) -> Path:
    # A copy whose default output directory (beside it) does not exist: anything written shows.
    d = tmp / "repo" / "infra" / "grafana"
    d.mkdir(parents=True)
    return Path(shutil.copy(SCRIPT, d / SCRIPT.name))


def _files(root: Path) -> set[Path]:
    return {p for p in root.rglob("*") if p.is_file()}


def test_help_prints_usage_and_writes_nothing(tmp_path: Path) -> None:
    script = _copy(tmp_path)
    before = _files(tmp_path)
    r = _run(script, "--help")
    assert r.returncode == 0 and r.stdout.startswith("usage: make_dashboards.py")
    assert "--check" in r.stdout and "--out" in r.stdout
    assert _files(tmp_path) == before


def test_bad_arguments_are_a_usage_error_and_write_nothing(tmp_path: Path) -> None:
    script = _copy(tmp_path)
    before = _files(tmp_path)
    for args in (["--bogus"], ["extra"], ["--out"]):
        r = _run(script, *args)
        assert r.returncode == 2 and "usage:" in r.stderr, args
    assert _files(tmp_path) == before


def test_out_writes_the_committed_dashboards_elsewhere_and_check_compares(tmp_path: Path) -> None:
    out = tmp_path / "dash"
    assert _run(SCRIPT, "--check", "--out", str(out)).returncode == 1  # nothing there yet
    assert not out.exists()
    assert _run(SCRIPT, "--out", str(out)).returncode == 0
    committed = {p.name: p.read_bytes() for p in DASHBOARDS.glob("*.json")}
    assert {p.name: p.read_bytes() for p in out.glob("*.json")} == committed
    assert _run(SCRIPT, "--check", "--out", str(out)).returncode == 0
    (out / "pulse-overview.json").write_text("{}\n")
    r = _run(SCRIPT, "--check", "--out", str(out))
    assert r.returncode == 1 and "pulse-overview.json" in r.stderr and "pulse-pipeline.json" not in r.stderr
    assert (out / "pulse-overview.json").read_text() == "{}\n"  # --check wrote nothing
