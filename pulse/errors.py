"""The one exception hierarchy of Pulse.

Every failure a user can cause (bad input, bad configuration, a missing service or
binary) raises a subclass of :class:`PulseError`; the CLI turns those into a one-line
message and exit status 1. Anything else escaping is a bug.
"""

from __future__ import annotations


class PulseError(Exception):
    """Root of every error Pulse raises on purpose."""


class DecodeError(PulseError):
    """Bytes or a record that a decoder does not understand (says what and where)."""


class EncodeError(PulseError):
    """A value that cannot be put on the wire (out of range, wrong type...)."""


class ConfigError(PulseError):
    """A setting or CLI option with a value Pulse cannot use."""


class TraceError(PulseError):
    """A trace directory that is missing, incomplete or malformed."""


class ServiceError(PulseError):
    """An external service or binary (broker, InfluxDB, tcpdump...) is missing or failed."""
