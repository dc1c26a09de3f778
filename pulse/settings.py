"""All settings, read from ``PULSE_*`` environment variables in this one place.

``Settings.from_env()`` is the only reader of the environment; everything else takes a
``Settings`` (or explicit arguments). The object is frozen so it can be shared freely.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping
from pathlib import Path

from pulse.errors import ConfigError

MIN_EPOCH_NS = 1_000
MAX_CLOCK_SKEW_NS = 1_000_000_000
"""Largest clock-skew bound accepted (1 s): beyond it no cross-node comparison means anything."""
MAX_EPOCH_NS = 1_000_000_000
DEFAULT_EPOCH_NS = 32_000

KAFKA_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


def _read_secret(var: str, path: str) -> str:
    """A secret from a file (never from the environment or argv); the value is never echoed."""
    try:
        value = Path(path).read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ConfigError(f"{var}={path}: cannot read it ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{var}={path}: not UTF-8 text") from None
    if not value:
        raise ConfigError(f"{var}={path}: empty file")
    return value


def is_loopback_url(url: str) -> bool:
    import ipaddress
    from urllib.parse import urlsplit

    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclasses.dataclass(frozen=True)
class Topics:
    """Kafka topic names (a common prefix, then the role)."""

    samples: str
    hook_events: str
    op_metrics: str
    verdicts: str
    dead_letter: str
    pipeline: str
    incidents: str
    """Compacted, key = incident id: the latest state of every incident."""

    @classmethod
    def with_prefix(cls, prefix: str) -> Topics:
        return cls(
            samples=f"{prefix}.samples",
            hook_events=f"{prefix}.hook-events",
            op_metrics=f"{prefix}.op-metrics",
            verdicts=f"{prefix}.verdicts",
            dead_letter=f"{prefix}.dead-letter",
            pipeline=f"{prefix}.pipeline",
            incidents=f"{prefix}.incidents",
        )


def _check_bootstrap(value: str) -> None:
    """``host[:port][,host[:port]...]`` as Kafka clients take it."""
    for entry in value.split(","):
        host, port = entry.strip(), None
        if ":" in host:
            host, _, port = host.rpartition(":")
        ok = bool(host) and not any(c.isspace() for c in host) and "/" not in host
        if port is not None:
            ok = ok and port.isdigit() and 0 < int(port) < 65536
        if not ok:
            raise ConfigError(f"PULSE_BROKER={value!r}: expected host:port[,host:port...], bad entry {entry!r}")


@dataclasses.dataclass(frozen=True)
class Settings:
    broker: str | None = None
    """Kafka bootstrap servers ``host:port[,host:port]``; None = start the embedded broker."""
    topic_prefix: str = "pulse"
    partitions: int = 8
    """Partitions of the samples and hook-events topics (co-partitioned: same count)."""
    epoch_ns: int = DEFAULT_EPOCH_NS
    influx_url: str | None = None
    influx_org: str = "pulse"
    influx_bucket: str = "pulse"
    influx_token: str | None = dataclasses.field(default=None, repr=False)
    spool_dir: Path = Path("/var/tmp/pulse-spool")
    spool_max_bytes: int = 1 << 30
    worker_id: str = "pulse-worker"
    worker_name: str | None = None
    """This worker's own name among the workers of one group (``worker_id`` is the group);
    None: the group's name (one worker per group)."""
    data_dir: Path = Path("/var/tmp/pulse-data")
    alert_url: str | None = None
    """Where incident state changes are POSTed in Alertmanager's format (e.g.
    ``http://alertmanager:9093/api/v2/alerts``); None: no alerts."""
    alert_report_url: str | None = None
    """Link put in each alert (``{job}`` and ``{id}`` are replaced), e.g. a Grafana dashboard."""
    # Kafka security (every client builds its options from these: pulse.kafka_security).
    kafka_security_protocol: str = "PLAINTEXT"
    kafka_ssl_cafile: Path | None = None
    kafka_ssl_certfile: Path | None = None
    kafka_ssl_keyfile: Path | None = None
    kafka_sasl_mechanism: str | None = None
    kafka_sasl_username: str | None = None
    kafka_sasl_password: str | None = dataclasses.field(default=None, repr=False)
    kafka_sasl_password_file: Path | None = None
    # InfluxDB transport.
    influx_ca_file: Path | None = None
    influx_allow_plain_token: bool = False
    """Allow sending the token over plain http to a non-loopback host (off: refused)."""
    # Who may send hook records to the agent's socket.
    hook_allowed_uids: tuple[int, ...] | None = None
    """None: the agent's own uid (plus the owners of ``job_cgroup``'s processes)."""
    job_cgroup: Path | None = None
    """The job's cgroup v2 directory: uids owning its processes may send hook records."""
    # Bounds on hostile input (see docs/security.md).
    max_message_bytes: int = 16 << 20
    """Largest Kafka message a decoder accepts (pulse._schema.MAX_MESSAGE_BYTES)."""
    max_events_per_batch: int = 16_384
    """Most hook events in one packed message (producers pack at most 4,096)."""
    max_flows_per_node: int = 1 << 20
    """Most distinct (nic, flow) bindings kept per node."""
    max_comms_per_job: int = 4_096
    """Most communicators kept per job (and per plugin decoder)."""
    max_nodes_per_worker: int = 4_096
    """Most nodes one worker keeps segmentation state for."""
    clock_skew_ns: int | None = None
    """The largest difference between two nodes' clocks the localizer must tolerate
    (``LocalizeParams.clock_skew_ns``; ``PULSE_CLOCK_SKEW_US`` in µs). None: its default
    (1 ms, PTP-like). NTP-synchronised clusters: twice the largest offset from true time."""

    @property
    def topics(self) -> Topics:
        return Topics.with_prefix(self.topic_prefix)

    def bootstrap(self, override: str | None = None) -> str:
        """The broker to connect to: ``override`` if given, else ``broker``; neither is a
        :class:`ConfigError` (library callers; the CLIs start the embedded broker instead)."""
        bs = override or self.broker
        if not bs:
            raise ConfigError("no broker: set PULSE_BROKER (host:port) or pass a bootstrap address")
        return bs

    def __post_init__(self) -> None:
        if not MIN_EPOCH_NS <= self.epoch_ns <= MAX_EPOCH_NS:
            raise ConfigError(
                f"PULSE_EPOCH_NS={self.epoch_ns}: must be between {MIN_EPOCH_NS} and {MAX_EPOCH_NS}"
            )
        if self.partitions < 1:
            raise ConfigError(f"PULSE_PARTITIONS={self.partitions}: must be >= 1")
        if self.spool_max_bytes < 0:
            raise ConfigError("PULSE_SPOOL_MAX_BYTES must be >= 0")
        if not self.topic_prefix or any(c in self.topic_prefix for c in " /\\"):
            raise ConfigError(f"PULSE_TOPIC_PREFIX={self.topic_prefix!r}: not a valid topic prefix")
        if self.broker is not None:
            _check_bootstrap(self.broker)
        if self.alert_url is not None and not self.alert_url.startswith(("http://", "https://")):
            raise ConfigError(f"PULSE_ALERT_URL={self.alert_url!r}: must start with http:// or https://")
        if self.influx_url is not None and not self.influx_url.startswith(("http://", "https://")):
            raise ConfigError(f"PULSE_INFLUX_URL={self.influx_url!r}: must start with http:// or https://")
        if (self.influx_url is not None and self.influx_url.startswith("http://") and self.influx_token
                and not self.influx_allow_plain_token and not is_loopback_url(self.influx_url)):
            raise ConfigError(f"PULSE_INFLUX_URL={self.influx_url}: refusing to send the InfluxDB token over plain "
                              "http to a non-loopback host (use https://, or set PULSE_INFLUX_ALLOW_PLAIN_TOKEN=1)")
        self._check_kafka()
        if self.clock_skew_ns is not None and not 0 <= self.clock_skew_ns <= MAX_CLOCK_SKEW_NS:
            raise ConfigError(f"PULSE_CLOCK_SKEW_US={self.clock_skew_ns / 1000:g}: must be between 0 and "
                              f"{MAX_CLOCK_SKEW_NS // 1000} (µs)")
        for name in ("max_message_bytes", "max_events_per_batch", "max_flows_per_node", "max_comms_per_job",
                     "max_nodes_per_worker"):
            if getattr(self, name) < 1:
                raise ConfigError(f"PULSE_{name.upper()}={getattr(self, name)}: must be >= 1")

    def _check_kafka(self) -> None:
        proto = self.kafka_security_protocol
        if proto not in KAFKA_PROTOCOLS:
            raise ConfigError(f"PULSE_KAFKA_SECURITY_PROTOCOL={proto!r}: use one of {', '.join(KAFKA_PROTOCOLS)}")
        if (self.kafka_ssl_certfile is None) != (self.kafka_ssl_keyfile is None):
            raise ConfigError("PULSE_KAFKA_SSL_CERTFILE and PULSE_KAFKA_SSL_KEYFILE: give both (a client "
                              "certificate and its key) or neither")
        tls_files = (self.kafka_ssl_cafile, self.kafka_ssl_certfile)
        if "SSL" not in proto and any(f is not None for f in tls_files):
            raise ConfigError(f"PULSE_KAFKA_SSL_*: set, but PULSE_KAFKA_SECURITY_PROTOCOL={proto} does not use TLS")
        if proto.startswith("SASL"):
            if self.kafka_sasl_mechanism not in SASL_MECHANISMS:
                raise ConfigError(f"PULSE_KAFKA_SASL_MECHANISM={self.kafka_sasl_mechanism!r}: with {proto} use one "
                                  f"of {', '.join(SASL_MECHANISMS)}")
            if not self.kafka_sasl_username:
                raise ConfigError(f"PULSE_KAFKA_SASL_USERNAME: required with {proto}")
            if not self.kafka_sasl_password:
                raise ConfigError(f"PULSE_KAFKA_SASL_PASSWORD_FILE: required with {proto} (the password is read "
                                  "from a file only)")
        elif self.kafka_sasl_mechanism or self.kafka_sasl_username:
            raise ConfigError(f"PULSE_KAFKA_SASL_*: set, but PULSE_KAFKA_SECURITY_PROTOCOL={proto} does not use SASL")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Build settings from ``PULSE_*`` variables (``env`` defaults to ``os.environ``)."""
        env = os.environ if env is None else env

        def get(name: str) -> str | None:
            value = env.get(f"PULSE_{name}")
            return value if value not in (None, "") else None

        def integer(name: str, default: int) -> int:
            raw = get(name)
            if raw is None:
                return default
            try:
                return int(raw.replace("_", ""))
            except ValueError:
                raise ConfigError(f"PULSE_{name}={raw!r}: not an integer") from None

        def micros_ns(name: str) -> int | None:
            raw = get(name)
            if raw is None:
                return None
            try:
                us = float(raw.replace("_", ""))
            except ValueError:
                raise ConfigError(f"PULSE_{name}={raw!r}: not a number (µs)") from None
            if not math.isfinite(us) or not 0 <= us <= MAX_CLOCK_SKEW_NS / 1000:
                raise ConfigError(f"PULSE_{name}={raw!r}: must be between 0 and {MAX_CLOCK_SKEW_NS // 1000} (µs)")
            return round(us * 1000)

        def path(name: str) -> Path | None:
            raw = get(name)
            return Path(raw) if raw is not None else None

        def flag(name: str) -> bool:
            raw = (get(name) or "0").lower()
            if raw not in ("0", "1", "true", "false", "yes", "no"):
                raise ConfigError(f"PULSE_{name}={raw!r}: use 1 or 0")
            return raw in ("1", "true", "yes")

        def uids(name: str) -> tuple[int, ...] | None:
            raw = get(name)
            if raw is None:
                return None
            try:
                return tuple(int(u) for u in raw.replace(" ", "").split(",") if u)
            except ValueError:
                raise ConfigError(f"PULSE_{name}={raw!r}: expected numeric uids separated by commas") from None

        token = get("INFLUX_TOKEN")
        token_file = get("INFLUX_TOKEN_FILE")
        if token is None and token_file is not None:
            token = _read_secret("PULSE_INFLUX_TOKEN_FILE", token_file)
        password_file = get("KAFKA_SASL_PASSWORD_FILE")
        password = _read_secret("PULSE_KAFKA_SASL_PASSWORD_FILE", password_file) if password_file else None
        epoch_ns = integer("EPOCH_NS", DEFAULT_EPOCH_NS)
        if get("EPOCH_US") is not None and get("EPOCH_NS") is None:
            epoch_ns = integer("EPOCH_US", DEFAULT_EPOCH_NS // 1000) * 1000
        defaults = cls()
        return cls(
            broker=get("BROKER"),
            topic_prefix=get("TOPIC_PREFIX") or defaults.topic_prefix,
            partitions=integer("PARTITIONS", defaults.partitions),
            epoch_ns=epoch_ns,
            influx_url=get("INFLUX_URL"),
            influx_org=get("INFLUX_ORG") or defaults.influx_org,
            influx_bucket=get("INFLUX_BUCKET") or defaults.influx_bucket,
            influx_token=token,
            spool_dir=Path(get("SPOOL_DIR") or defaults.spool_dir),
            spool_max_bytes=integer("SPOOL_MAX_BYTES", defaults.spool_max_bytes),
            worker_id=get("WORKER_ID") or defaults.worker_id,
            worker_name=get("WORKER_NAME"),
            data_dir=Path(get("DATA_DIR") or defaults.data_dir),
            alert_url=get("ALERT_URL"),
            alert_report_url=get("ALERT_REPORT_URL"),
            kafka_security_protocol=(get("KAFKA_SECURITY_PROTOCOL") or defaults.kafka_security_protocol).upper(),
            kafka_ssl_cafile=path("KAFKA_SSL_CAFILE"),
            kafka_ssl_certfile=path("KAFKA_SSL_CERTFILE"),
            kafka_ssl_keyfile=path("KAFKA_SSL_KEYFILE"),
            kafka_sasl_mechanism=(get("KAFKA_SASL_MECHANISM") or "").upper() or None,
            kafka_sasl_username=get("KAFKA_SASL_USERNAME"),
            kafka_sasl_password=password,
            kafka_sasl_password_file=Path(password_file) if password_file else None,
            influx_ca_file=path("INFLUX_CA_FILE"),
            influx_allow_plain_token=flag("INFLUX_ALLOW_PLAIN_TOKEN"),
            hook_allowed_uids=uids("HOOK_ALLOWED_UIDS"),
            job_cgroup=path("JOB_CGROUP"),
            max_message_bytes=integer("MAX_MESSAGE_BYTES", defaults.max_message_bytes),
            max_events_per_batch=integer("MAX_EVENTS_PER_BATCH", defaults.max_events_per_batch),
            max_flows_per_node=integer("MAX_FLOWS_PER_NODE", defaults.max_flows_per_node),
            max_comms_per_job=integer("MAX_COMMS_PER_JOB", defaults.max_comms_per_job),
            max_nodes_per_worker=integer("MAX_NODES_PER_WORKER", defaults.max_nodes_per_worker),
            clock_skew_ns=micros_ns("CLOCK_SKEW_US"),
        )

    def override(self, **changes: object) -> Settings:
        """A copy with the given values; None (an option the user did not give) keeps ours."""
        given = {k: v for k, v in changes.items() if v is not None}
        return dataclasses.replace(self, **given) if given else self  # type: ignore[arg-type]

    def redacted(self) -> dict[str, object]:
        """A printable view: the token is never echoed."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["influx_token"] = "***" if self.influx_token else None
        out["kafka_sasl_password"] = "***" if self.kafka_sasl_password else None
        return {k: str(v) if isinstance(v, Path) else v for k, v in out.items()}


ENV_VARS = (
    "PULSE_BROKER", "PULSE_TOPIC_PREFIX", "PULSE_PARTITIONS", "PULSE_EPOCH_NS", "PULSE_EPOCH_US",
    "PULSE_INFLUX_URL", "PULSE_INFLUX_ORG", "PULSE_INFLUX_BUCKET", "PULSE_INFLUX_TOKEN",
    "PULSE_INFLUX_TOKEN_FILE", "PULSE_SPOOL_DIR", "PULSE_SPOOL_MAX_BYTES", "PULSE_WORKER_ID",
    "PULSE_WORKER_NAME",
    "PULSE_ALERT_URL", "PULSE_ALERT_REPORT_URL",
    "PULSE_DATA_DIR", "PULSE_KAFKA_SECURITY_PROTOCOL", "PULSE_KAFKA_SSL_CAFILE", "PULSE_KAFKA_SSL_CERTFILE",
    "PULSE_KAFKA_SSL_KEYFILE", "PULSE_KAFKA_SASL_MECHANISM", "PULSE_KAFKA_SASL_USERNAME",
    "PULSE_KAFKA_SASL_PASSWORD_FILE", "PULSE_INFLUX_CA_FILE", "PULSE_INFLUX_ALLOW_PLAIN_TOKEN",
    "PULSE_HOOK_ALLOWED_UIDS", "PULSE_JOB_CGROUP", "PULSE_MAX_MESSAGE_BYTES", "PULSE_MAX_EVENTS_PER_BATCH",
    "PULSE_MAX_FLOWS_PER_NODE", "PULSE_MAX_COMMS_PER_JOB", "PULSE_MAX_NODES_PER_WORKER", "PULSE_CLOCK_SKEW_US",
)
"""Every variable ``from_env`` reads (infra tests check compose files against this)."""
