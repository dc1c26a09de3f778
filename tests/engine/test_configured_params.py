"""PULSE_CLOCK_SKEW_US reaches every localizer an operator runs: `pulse diagnose`, the
battery of `pulse eval`, and the Faust worker's localize agent (the sweep states its own)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from pulse.engine.configured import localize_params
from pulse.localization import LocalizeParams

from pulse.cli import main
from pulse.settings import Settings


def test_the_configured_bound_and_the_default() -> None:
    assert localize_params(Settings.from_env({})) == LocalizeParams()
    assert localize_params(Settings.from_env({"PULSE_CLOCK_SKEW_US": "4000"})).clock_skew_ns == 4_000_000
    assert localize_params(Settings.from_env({"PULSE_CLOCK_SKEW_US": "0"})).clock_skew_ns == 0
    # an explicit parameter wins over the environment
    p = localize_params(Settings(clock_skew_ns=4_000_000), clock_skew_ns=7, persist_ops=5)
    assert (p.clock_skew_ns, p.persist_ops) == (7, 5)


def test_the_environment_is_read_when_no_settings_are_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PULSE_CLOCK_SKEW_US", "2500")
    assert localize_params().clock_skew_ns == 2_500_000


def test_the_worker_localizes_with_the_configured_bound() -> None:
    from pulse.streams.app import Pipeline

    s = Settings.from_env({"PULSE_CLOCK_SKEW_US": "6000", "PULSE_BROKER": "127.0.0.1:1"})
    pipe = Pipeline(s, localize_process=False)  # builds the app; connects nowhere
    try:
        assert pipe.localize_state.params.clock_skew_ns == 6_000_000
    finally:
        pipe.close()
    pipe = Pipeline(Settings(broker="127.0.0.1:1"), localize_process=False)
    try:
        assert pipe.localize_state.params.clock_skew_ns == LocalizeParams().clock_skew_ns
    finally:
        pipe.close()


@pytest.mark.parametrize("argv", [["diagnose", "TRACE"], ["eval", "--scenarios", "healthy", "--seeds", "1"]])
def test_diagnose_and_eval_refuse_a_bad_bound_in_one_line(argv: list[str], tmp_path: Path) -> None:
    (tmp_path / "t").mkdir()
    argv = [str(tmp_path / "t") if a == "TRACE" else a for a in argv]
    r = CliRunner(env={"PULSE_CLOCK_SKEW_US": "-3"}).invoke(main, argv)
    assert r.exit_code == 1, r.output
    assert r.output.count("\n") == 1 and "PULSE_CLOCK_SKEW_US='-3'" in r.output
