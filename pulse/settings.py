"""All settings, read from ``PULSE_*`` environment variables in this one place.

``Settings.from_env()`` is the only reader of the environment; everything else takes a
``Settings`` (or explicit arguments). The object is frozen so it can be shared freely.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path

from pulse.errors import ConfigError

MIN_EPOCH_NS = 1_000
MAX_EPOCH_NS = 1_000_000_000
DEFAULT_EPOCH_NS = 32_000


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
    data_dir: Path = Path("/var/tmp/pulse-data")
    alert_url: str | None = None
    """Where incident state changes are POSTed in Alertmanager's format (e.g.
    ``http://alertmanager:9093/api/v2/alerts``); None: no alerts."""
    alert_report_url: str | None = None
    """Link put in each alert (``{job}`` and ``{id}`` are replaced), e.g. a Grafana dashboard."""

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

        token = get("INFLUX_TOKEN")
        token_file = get("INFLUX_TOKEN_FILE")
        if token is None and token_file is not None:
            try:
                token = Path(token_file).read_text(encoding="utf-8").strip()
            except OSError as exc:
                raise ConfigError(
                    f"PULSE_INFLUX_TOKEN_FILE={token_file}: cannot read it ({exc.strerror})"
                ) from None
            except UnicodeDecodeError:
                raise ConfigError(f"PULSE_INFLUX_TOKEN_FILE={token_file}: not UTF-8 text") from None
            if not token:
                raise ConfigError(f"PULSE_INFLUX_TOKEN_FILE={token_file}: empty file")
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
            data_dir=Path(get("DATA_DIR") or defaults.data_dir),
            alert_url=get("ALERT_URL"),
            alert_report_url=get("ALERT_REPORT_URL"),
        )

    def override(self, **changes: object) -> Settings:
        """A copy with the given values; None (an option the user did not give) keeps ours."""
        given = {k: v for k, v in changes.items() if v is not None}
        return dataclasses.replace(self, **given) if given else self  # type: ignore[arg-type]

    def redacted(self) -> dict[str, object]:
        """A printable view: the token is never echoed."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["influx_token"] = "***" if self.influx_token else None
        return {k: str(v) if isinstance(v, Path) else v for k, v in out.items()}


ENV_VARS = (
    "PULSE_BROKER", "PULSE_TOPIC_PREFIX", "PULSE_PARTITIONS", "PULSE_EPOCH_NS", "PULSE_EPOCH_US",
    "PULSE_INFLUX_URL", "PULSE_INFLUX_ORG", "PULSE_INFLUX_BUCKET", "PULSE_INFLUX_TOKEN",
    "PULSE_INFLUX_TOKEN_FILE", "PULSE_SPOOL_DIR", "PULSE_SPOOL_MAX_BYTES", "PULSE_WORKER_ID",
    "PULSE_ALERT_URL", "PULSE_ALERT_REPORT_URL",
    "PULSE_DATA_DIR",
)
"""Every variable ``from_env`` reads (infra tests check compose files against this)."""
