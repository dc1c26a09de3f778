"""Localizer parameters as the operator configured them (``pulse.settings``): what every
entry point that localizes (``pulse diagnose``, ``pulse eval``'s battery, the Faust worker's
localize agent) starts from, so one variable reaches them all."""

from __future__ import annotations

from typing import Any

from pulse.localization import LocalizeParams

from pulse.settings import Settings


def localize_params(settings: Settings | None = None, **overrides: Any) -> LocalizeParams:
    """``LocalizeParams`` with the settings' clock-skew bound (``PULSE_CLOCK_SKEW_US``) where
    one is set, then ``overrides``; ``settings`` defaults to the environment's."""
    s = settings if settings is not None else Settings.from_env()
    given: dict[str, Any] = {}
    if s.clock_skew_ns is not None:
        given["clock_skew_ns"] = s.clock_skew_ns
    return LocalizeParams(**{**given, **overrides})
