"""The `pulse` command line: help, version, exit codes, error format."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

import pulse
from pulse.bench import BENCHES
from pulse.cli import COMMANDS, LazyGroup, main
from pulse.errors import ConfigError, PulseError

PULSE = [sys.executable, "-m", "pulse.cli"]


def _run(*args: str, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*PULSE, *args], capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL, **kw)  # type: ignore[call-overload]


def test_help_lists_every_command() -> None:
    r = _run("--help")
    assert r.returncode == 0
    for name, (_, summary) in COMMANDS.items():
        assert name in r.stdout and summary[:30] in r.stdout
    assert _run("-h").stdout == r.stdout


def test_console_script_is_installed() -> None:
    script = Path(sys.executable).with_name("pulse")
    if not script.exists():
        pytest.skip(f"no console script next to {sys.executable}")
    r = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "Usage: pulse" in r.stdout


def test_version() -> None:
    r = _run("--version")
    assert r.returncode == 0 and pulse.__version__ in r.stdout


def test_help_does_not_import_heavy_packages() -> None:
    code = ("import sys; from pulse.cli import main\n"
            "try:\n    main(['--help'], prog_name='pulse')\nexcept SystemExit:\n    pass\n"
            "heavy = [m for m in ('numba', 'faust', 'aiokafka', 'matplotlib', 'influxdb_client') if m in sys.modules]\n"
            "print('HEAVY', heavy)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "HEAVY []" in r.stdout, r.stdout + r.stderr


def test_broker_help() -> None:
    r = _run("broker", "--help")
    assert r.returncode == 0
    for opt in ("--port", "--check", "--json", "--log"):
        assert opt in r.stdout


@pytest.mark.parametrize("args", [("no-such-command",), ("--no-such-option",), ("broker", "--port", "x"),
                                  ("broker", "--port", "0"), ("broker", "extra-arg")])
def test_usage_errors_exit_2(args: tuple[str, ...]) -> None:
    r = _run(*args)
    assert r.returncode == 2, r.stderr
    assert "Usage:" in r.stderr or "Error:" in r.stderr
    assert r.stdout == ""


def _group_with(cmd: click.Command) -> click.Group:
    @click.group(cls=LazyGroup, lazy={"missing": ("pulse._no_such_module:cmd", "not built"),
                                      "needs-dep": ("nosuchdep_for_cli_test.x:cmd", "needs a package")})
    def g() -> None:
        pass

    g.add_command(cmd)
    return g


@pytest.mark.parametrize("exc", [ConfigError("PULSE_PARTITIONS=0: must be >= 1"), PulseError("plain")])
def test_pulse_error_is_one_line_and_exit_1(exc: PulseError) -> None:
    @click.command("boom")
    def boom() -> None:
        raise exc

    r = CliRunner().invoke(_group_with(boom), ["boom"])
    assert r.exit_code == 1
    assert r.stderr == f"error: {exc}\n"
    assert r.stdout == ""


@pytest.mark.parametrize(("exc", "line"), [
    (OSError(28, "No space left on device"), "error: No space left on device\n"),
    (PermissionError(13, "Permission denied", "/x/y"), "error: Permission denied (/x/y)\n")])
def test_the_machines_errors_are_one_line_and_exit_1(exc: OSError, line: str) -> None:
    # a full disk under `pulse eval --sweep` printed a 60-line traceback
    @click.command("full")
    def full() -> None:
        raise exc

    r = CliRunner().invoke(_group_with(full), ["full"])
    assert r.exit_code == 1 and r.stderr == line and r.stdout == ""


def test_other_exceptions_are_not_swallowed() -> None:
    @click.command("bug")
    def bug() -> None:
        raise KeyError("bug")

    r = CliRunner().invoke(_group_with(bug), ["bug"])
    assert r.exit_code == 1 and isinstance(r.exception, KeyError)


def test_unavailable_lazy_commands() -> None:
    @click.command("ok")
    def ok() -> None:
        click.echo("fine")

    g = _group_with(ok)
    r = CliRunner().invoke(g, ["missing"])
    assert r.exit_code == 1 and "'missing' is not available in this build" in r.stderr
    r = CliRunner().invoke(g, ["needs-dep"])
    assert r.exit_code == 1 and "needs the Python package 'nosuchdep_for_cli_test'" in r.stderr
    assert CliRunner().invoke(g, ["ok"]).stdout == "fine\n"


def test_settings_errors_from_the_environment_exit_1() -> None:
    env = {**os.environ, "PULSE_PARTITIONS": "zero"}
    code = ("import click\nfrom pulse.cli import main\nfrom pulse.settings import Settings\n"
            "@main.command('show-settings')\ndef s():\n    Settings.from_env()\n"
            "main(['show-settings'], prog_name='pulse')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 1
    assert r.stderr == "error: PULSE_PARTITIONS='zero': not an integer\n"


def _help_or_skip(*args: str) -> None:
    r = _run(*args, "--help")
    if r.returncode == 1 and "is not available in this build" in r.stderr:
        pytest.skip(f"pulse {' '.join(args)}: {r.stderr.strip()}")
    assert r.returncode == 0, r.stderr
    assert f"Usage: pulse {' '.join(args)}" in r.stdout


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_available_command_has_help(name: str) -> None:
    _help_or_skip(name)


@pytest.mark.parametrize("name", sorted(BENCHES))
def test_every_available_bench_has_help(name: str) -> None:
    _help_or_skip("bench", name)


def test_a_registered_but_missing_attribute_is_reported() -> None:
    @click.group(cls=LazyGroup, lazy={"half": ("pulse.errors:no_such_command", "half built")})
    def g() -> None:
        pass

    r = CliRunner().invoke(g, ["half"])
    assert r.exit_code == 1 and "pulse.errors:no_such_command is missing" in r.stderr


def test_main_is_a_group() -> None:
    assert isinstance(main, click.Group)
