"""infra/'s shell scripts and compose file, run by the real tools that can run here:
shellcheck; Debian's docker-compose (1.29, validates and resolves a file without a daemon);
and the DBRP script against the influx CLI's list output.

InfluxDB 2.x and its influx CLI cannot run here, so `influx` is a stand-in on PATH that
prints the CLI's output for each case (fixtures/influx-cli, built from the CLI's source:
see their headers) and records the arguments it was called with.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from infra_compose import COMPOSE, DBRP_SCRIPT, INFRA, TOPICS_SCRIPT, load_compose, read_env_file, service_env

FIXTURES = Path(__file__).parent / "fixtures" / "influx-cli"
SECRETS = {"PULSE_INFLUX_TOKEN": "tok-123", "INFLUX_ADMIN_PASSWORD": "pw-test-123",
           "GRAFANA_ADMIN_PASSWORD": "pw-grafana"}
BUCKET_ID = "bc926b463de1d39a"

FAKE_INFLUX = r"""#!/bin/bash
# Stand-in for the influx CLI: records its arguments, prints a fixture (header stripped).
printf '%s\n' "$*" >>"$FAKE_INFLUX_LOG"
if [[ -n "${FAKE_INFLUX_FAIL:-}" ]]; then
  echo 'Error: failed to list dbrps: 401 Unauthorized: unauthorized access' >&2
  exit 1
fi
case "$1 $2 $3" in
  "v1 dbrp list")
    [[ " $* " == *" --hide-headers "* ]] || { echo "fake influx: fixtures are --hide-headers output" >&2; exit 3; }
    sed '/^#/d' "$FAKE_INFLUX_LIST" ;;
  "v1 dbrp create") sed '/^#/d' "$FAKE_INFLUX_CREATE" ;;
  *) echo "fake influx: unexpected: $*" >&2; exit 3 ;;
esac
"""


def _tool(name: str, package: str) -> str:
    path = shutil.which(name)
    if path is None:
        msg = f"MISSING TOOL: {name} is not installed (Debian package {package}; scripts/dev.sh test installs it)"
        if os.environ.get("CI"):
            pytest.fail(msg + "; CI must not skip it", pytrace=False)
        pytest.skip(msg)
    return path


def _env_file(tmp: Path, **overrides: str) -> Path:
    env = read_env_file()
    env.update(SECRETS)
    env.update(overrides)
    p = tmp / "env"
    p.write_text("".join(f"{k}={v}\n" for k, v in env.items()))
    return p


# -- shellcheck ---------------------------------------------------------------------------

def test_shell_scripts_pass_shellcheck() -> None:
    shellcheck = _tool("shellcheck", "shellcheck")
    for script in (DBRP_SCRIPT, TOPICS_SCRIPT):
        r = subprocess.run([shellcheck, "--shell=bash", "--severity=style", str(script)],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stdout + r.stderr


def test_scripts_are_executable() -> None:
    # The influxdb image runs its init scripts as programs; kafka-topics runs bash on its own.
    assert os.access(DBRP_SCRIPT, os.X_OK)


# -- docker-compose (1.29, Debian) ----------------------------------------------------------

def _compose_v1(tmp: Path, env_file: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`docker-compose config` on the file less its top-level `name:` (a Compose v2 key that
    1.29 rejects), paths resolved from infra/ as for the real file."""
    exe = _tool("docker-compose", "docker-compose")
    raw = COMPOSE.read_text()
    lines = raw.splitlines(keepends=True)
    assert "name: pulse\n" in lines
    copy = tmp / "docker-compose.yml"
    copy.write_text("".join(line for line in lines if line != "name: pulse\n"))
    return subprocess.run([exe, "--project-directory", str(INFRA), "-f", str(copy), "--env-file", str(env_file),
                           *args], capture_output=True, text=True, timeout=120)


def test_docker_compose_validates_the_file_and_resolves_it_as_our_reader_does(tmp_path: Path) -> None:
    env_file = _env_file(tmp_path)
    r = _compose_v1(tmp_path, env_file, "config")
    assert r.returncode == 0, r.stderr
    resolved = yaml.safe_load(r.stdout)
    ours = load_compose({**read_env_file(), **SECRETS})
    assert set(resolved["services"]) == set(ours["services"])
    for name, svc in ours["services"].items():
        theirs = resolved["services"][name]
        # `config` prints a literal $ escaped as $$ (so its output reads back the same)
        assert {k: str(v).replace("$$", "$") for k, v in service_env(theirs).items()} == service_env(svc), name
        assert theirs.get("healthcheck", {}).get("test") == svc.get("healthcheck", {}).get("test"), name
        deps = {k: v["condition"] for k, v in (theirs.get("depends_on") or {}).items()}
        assert deps == {k: v["condition"] for k, v in (svc.get("depends_on") or {}).items()}, name
    assert set(resolved["volumes"]) == set(ours["volumes"])


def test_docker_compose_refuses_a_missing_secret(tmp_path: Path) -> None:
    r = _compose_v1(tmp_path, _env_file(tmp_path, PULSE_INFLUX_TOKEN=""), "config", "-q")
    assert r.returncode != 0 and "set PULSE_INFLUX_TOKEN in the env file" in r.stderr


def test_compose_v1_rejects_the_file_as_is_so_v2_is_required(tmp_path: Path) -> None:
    # What docs/deploy.md states: Compose 1.x refuses the top-level `name:`.
    exe = _tool("docker-compose", "docker-compose")
    r = subprocess.run([exe, "-f", str(COMPOSE), "--env-file", str(_env_file(tmp_path)), "config", "-q"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "'name' does not match" in r.stderr
    assert "Docker Compose v2" in " ".join((INFRA.parent / "docs" / "deploy.md").read_text().split())


# -- the DBRP script against the influx CLI's output ----------------------------------------

def _run_dbrp(tmp: Path, listing: str, *args: str, fail: bool = False,
              script: list[str] | None = None) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "influx"
    fake.write_text(FAKE_INFLUX)
    fake.chmod(0o755)
    log = tmp / "influx-calls.log"
    log.write_text("")
    compose = load_compose({**read_env_file(), **SECRETS})
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_INFLUX_LOG": str(log),
           "FAKE_INFLUX_LIST": str(FIXTURES / listing), "FAKE_INFLUX_CREATE": str(FIXTURES / "dbrp-create.txt"),
           # What the container has: the service's environment, plus what the image's
           # entrypoint exports while running the init scripts.
           **service_env(compose["services"]["influxdb"]), "DOCKER_INFLUXDB_INIT_BUCKET_ID": BUCKET_ID}
    if fail:
        env["FAKE_INFLUX_FAIL"] = "1"
    r = subprocess.run(script or ["bash", str(DBRP_SCRIPT), *args], capture_output=True, text=True,
                       env=env, timeout=30)
    return r, [line for line in log.read_text().splitlines() if line]


def _create_calls(calls: list[str]) -> list[str]:
    return [c for c in calls if c.startswith("v1 dbrp create")]


def test_dbrp_absent_when_only_the_virtual_mapping_is_listed(tmp_path: Path) -> None:
    r, calls = _run_dbrp(tmp_path, "dbrp-list-absent.txt")
    assert r.returncode == 0, r.stderr
    [create] = _create_calls(calls)
    for part in (f"--bucket-id {BUCKET_ID}", "--db pulse", "--rp autogen", "--default", "--org pulse",
                 f"--token {SECRETS['PULSE_INFLUX_TOKEN']}", "--host http://localhost:8086"):
        assert part in create, (part, create)
    assert "database pulse / rp autogen -> bucket pulse" in r.stdout
    check, _ = _run_dbrp(tmp_path, "dbrp-list-absent.txt", "--check")
    assert check.returncode == 1


def test_dbrp_present_is_left_alone(tmp_path: Path) -> None:
    r, calls = _run_dbrp(tmp_path, "dbrp-list-present.txt")
    assert r.returncode == 0, r.stderr
    assert not _create_calls(calls) and "exists" in r.stdout
    assert calls == [f"v1 dbrp list --host http://localhost:8086 --token {SECRETS['PULSE_INFLUX_TOKEN']} "
                     "--org pulse --db pulse --hide-headers"]
    check, _ = _run_dbrp(tmp_path, "dbrp-list-present.txt", "--check")
    assert check.returncode == 0, check.stderr


def test_dbrp_of_another_retention_policy_is_not_ours(tmp_path: Path) -> None:
    r, calls = _run_dbrp(tmp_path, "dbrp-list-other-rp.txt")
    assert r.returncode == 0 and len(_create_calls(calls)) == 1
    assert _run_dbrp(tmp_path, "dbrp-list-other-rp.txt", "--check")[0].returncode == 1


def test_dbrp_script_fails_when_influx_fails_instead_of_creating(tmp_path: Path) -> None:
    r, calls = _run_dbrp(tmp_path, "dbrp-list-present.txt", fail=True)
    assert r.returncode == 2 and not _create_calls(calls) and "cannot list" in r.stderr
    assert _run_dbrp(tmp_path, "dbrp-list-present.txt", "--check", fail=True)[0].returncode == 2


def test_the_old_test_was_always_true_on_this_output() -> None:
    # Regression guard for what issue 23 found: `--hide-headers | grep -q .` matches the
    # title and dashes that follow the (empty) explicit table.
    body = "".join(line for line in (FIXTURES / "dbrp-list-absent.txt").read_text().splitlines(keepends=True)
                   if not line.startswith("#"))
    assert subprocess.run(["grep", "-q", "."], input=body, text=True).returncode == 0


def test_the_influxdb_healthcheck_runs_the_check(tmp_path: Path) -> None:
    compose = load_compose({**read_env_file(), **SECRETS})
    influx = compose["services"]["influxdb"]
    test = influx["healthcheck"]["test"]
    assert test[0] == "CMD"
    mounts = {v.split(":")[1]: (COMPOSE.parent / v.split(":")[0]).resolve() for v in influx["volumes"]
              if v.startswith(".")}
    container_path = Path(test[1])
    host_path = mounts[str(container_path.parent)] / container_path.name
    assert host_path == DBRP_SCRIPT.resolve()
    cmd = [str(host_path), *test[2:]]
    assert _run_dbrp(tmp_path, "dbrp-list-present.txt", script=cmd)[0].returncode == 0
    assert _run_dbrp(tmp_path, "dbrp-list-absent.txt", script=cmd)[0].returncode == 1
