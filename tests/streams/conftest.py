"""Fixtures for the pipeline tests live in ``streamkit`` (a unique module name, so test
modules can import its helpers without colliding with other folders' conftest)."""

from streamkit import *  # noqa: F403
