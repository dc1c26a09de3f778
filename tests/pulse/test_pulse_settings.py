"""Settings: every PULSE_* variable, the token file, redaction, bad values."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from pulse import settings as settings_mod
from pulse.errors import ConfigError
from pulse.settings import ENV_VARS, Settings

SECRET = "s3cr3t-token-value"


def test_defaults_without_environment() -> None:
    s = Settings.from_env({})
    assert s == Settings()
    assert s.broker is None and s.influx_url is None and s.influx_token is None
    assert s.epoch_ns == 32_000 and s.partitions == 8
    assert s.topics.samples == "pulse.samples" and s.topics.hook_events == "pulse.hook-events"


def test_every_variable_is_read(tmp_path: Path) -> None:
    env = {
        "PULSE_BROKER": "k1:9092,k2:9093", "PULSE_TOPIC_PREFIX": "lab", "PULSE_PARTITIONS": "16",
        "PULSE_EPOCH_NS": "4_000", "PULSE_INFLUX_URL": "http://127.0.0.1:8086", "PULSE_INFLUX_ORG": "o",
        "PULSE_INFLUX_BUCKET": "b", "PULSE_INFLUX_TOKEN": SECRET, "PULSE_SPOOL_DIR": str(tmp_path / "spool"),
        "PULSE_SPOOL_MAX_BYTES": "1024", "PULSE_WORKER_ID": "w7", "PULSE_WORKER_NAME": "w7-a", "PULSE_DATA_DIR": str(tmp_path / "data"),
        "PULSE_KAFKA_SECURITY_PROTOCOL": "sasl_ssl", "PULSE_KAFKA_SSL_CAFILE": "/ca.pem",
        "PULSE_KAFKA_SSL_CERTFILE": "/c.pem", "PULSE_KAFKA_SSL_KEYFILE": "/c.key", "PULSE_KAFKA_SASL_MECHANISM": "plain",
        "PULSE_KAFKA_SASL_USERNAME": "u", "PULSE_KAFKA_SASL_PASSWORD_FILE": str(tmp_path / "pw"),
        "PULSE_INFLUX_CA_FILE": "/influx-ca.pem", "PULSE_INFLUX_ALLOW_PLAIN_TOKEN": "1",
        "PULSE_HOOK_ALLOWED_UIDS": "0, 1000", "PULSE_JOB_CGROUP": "/sys/fs/cgroup/job",
        "PULSE_MAX_MESSAGE_BYTES": "1_000_000", "PULSE_MAX_EVENTS_PER_BATCH": "100", "PULSE_MAX_FLOWS_PER_NODE": "200",
        "PULSE_MAX_COMMS_PER_JOB": "300", "PULSE_MAX_NODES_PER_WORKER": "400", "PULSE_CLOCK_SKEW_US": "2_500.5",
        "PULSE_ALERT_URL": "http://127.0.0.1:9093/api/v2/alerts", "PULSE_ALERT_REPORT_URL": "http://g/d?job={job}",
    }
    (tmp_path / "pw").write_text("pw-secret\n")
    s = Settings.from_env(env)
    assert (s.kafka_security_protocol, s.kafka_ssl_cafile, s.kafka_ssl_certfile, s.kafka_ssl_keyfile) == (
        "SASL_SSL", Path("/ca.pem"), Path("/c.pem"), Path("/c.key"))
    assert (s.kafka_sasl_mechanism, s.kafka_sasl_username, s.kafka_sasl_password) == ("PLAIN", "u", "pw-secret")
    assert (s.influx_ca_file, s.influx_allow_plain_token) == (Path("/influx-ca.pem"), True)
    assert (s.alert_url, s.alert_report_url) == ("http://127.0.0.1:9093/api/v2/alerts", "http://g/d?job={job}")
    assert (s.hook_allowed_uids, s.job_cgroup) == ((0, 1000), Path("/sys/fs/cgroup/job"))
    assert (s.max_message_bytes, s.max_events_per_batch, s.max_flows_per_node, s.max_comms_per_job) == (
        1_000_000, 100, 200, 300)
    assert s.clock_skew_ns == 2_500_500
    assert "pw-secret" not in repr(s) and "pw-secret" not in str(s.redacted())
    assert (s.broker, s.topic_prefix, s.partitions, s.epoch_ns) == ("k1:9092,k2:9093", "lab", 16, 4000)
    assert (s.influx_url, s.influx_org, s.influx_bucket, s.influx_token) == (
        "http://127.0.0.1:8086", "o", "b", SECRET)
    assert (s.spool_dir, s.spool_max_bytes, s.worker_id, s.data_dir) == (
        tmp_path / "spool", 1024, "w7", tmp_path / "data")
    assert s.worker_name == "w7-a"
    assert s.topics.verdicts == "lab.verdicts" and s.topics.op_metrics == "lab.op-metrics"
    # ENV_VARS lists exactly what from_env reads: this test sets all but the alternatives
    assert set(env) | {"PULSE_EPOCH_US", "PULSE_INFLUX_TOKEN_FILE"} == set(ENV_VARS)


def test_env_vars_match_the_source() -> None:
    source = Path(settings_mod.__file__).read_text()
    read = {f"PULSE_{name}" for name in re.findall(r'(?:get|integer|path|flag|uids|micros_ns)\("([A-Z_]+)"', source)}
    assert read == set(ENV_VARS)
    assert len(ENV_VARS) == len(read), "a variable is listed twice"


def test_reads_os_environ_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PULSE_PARTITIONS", "3")
    monkeypatch.setenv("PULSE_TOPIC_PREFIX", "")  # empty means unset
    s = Settings.from_env()
    assert s.partitions == 3 and s.topic_prefix == "pulse"


def test_epoch_us_and_precedence() -> None:
    assert Settings.from_env({"PULSE_EPOCH_US": "64"}).epoch_ns == 64_000
    assert Settings.from_env({"PULSE_EPOCH_US": "64", "PULSE_EPOCH_NS": "8000"}).epoch_ns == 8000
    assert Settings.from_env({"PULSE_EPOCH_US": "1"}).epoch_ns == 1000


def test_token_from_file(tmp_path: Path) -> None:
    f = tmp_path / "token"
    f.write_text(SECRET + "\n")
    assert Settings.from_env({"PULSE_INFLUX_TOKEN_FILE": str(f)}).influx_token == SECRET
    # an explicit token wins over the file
    assert Settings.from_env({"PULSE_INFLUX_TOKEN_FILE": str(f), "PULSE_INFLUX_TOKEN": "t"}).influx_token == "t"


@pytest.mark.parametrize(("content", "match"), [(None, "cannot read"), (b"", "empty"), (b"  \n", "empty"),
                                                (b"\xff\xfe", "not UTF-8")])
def test_bad_token_file(tmp_path: Path, content: bytes | None, match: str) -> None:
    f = tmp_path / "token"
    if content is not None:
        f.write_bytes(content)
    with pytest.raises(ConfigError, match=f"PULSE_INFLUX_TOKEN_FILE={re.escape(str(f))}: {match}"):
        Settings.from_env({"PULSE_INFLUX_TOKEN_FILE": str(f)})


def test_token_is_never_shown() -> None:
    s = Settings.from_env({"PULSE_INFLUX_TOKEN": SECRET})
    assert SECRET not in repr(s) and SECRET not in str(s)
    red = s.redacted()
    assert red["influx_token"] == "***" and SECRET not in repr(red)
    assert Settings().redacted()["influx_token"] is None
    assert set(red) == {f.name for f in dataclasses.fields(Settings)}
    assert isinstance(red["spool_dir"], str)


def test_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        Settings().partitions = 3  # type: ignore[misc]


@pytest.mark.parametrize(("env", "match"), [
    ({"PULSE_PARTITIONS": "eight"}, "PULSE_PARTITIONS='eight': not an integer"),
    ({"PULSE_PARTITIONS": "0"}, "PULSE_PARTITIONS=0"),
    ({"PULSE_PARTITIONS": "-2"}, "PULSE_PARTITIONS=-2"),
    ({"PULSE_EPOCH_NS": "999"}, "PULSE_EPOCH_NS=999"),
    ({"PULSE_EPOCH_NS": "2000000000"}, "PULSE_EPOCH_NS"),
    ({"PULSE_EPOCH_NS": "1.5"}, "not an integer"),
    ({"PULSE_EPOCH_US": "0"}, "PULSE_EPOCH_NS=0"),
    ({"PULSE_SPOOL_MAX_BYTES": "-1"}, "PULSE_SPOOL_MAX_BYTES"),
    ({"PULSE_SPOOL_MAX_BYTES": "1G"}, "not an integer"),
    ({"PULSE_TOPIC_PREFIX": "a b"}, "PULSE_TOPIC_PREFIX"),
    ({"PULSE_TOPIC_PREFIX": "a/b"}, "PULSE_TOPIC_PREFIX"),
    ({"PULSE_BROKER": "kafka://host:9092"}, "PULSE_BROKER"),
    ({"PULSE_BROKER": "host:0"}, "PULSE_BROKER"),
    ({"PULSE_BROKER": "host:port"}, "PULSE_BROKER"),
    ({"PULSE_BROKER": "a:1,,b:2"}, "PULSE_BROKER"),
    ({"PULSE_INFLUX_URL": "127.0.0.1:8086"}, "PULSE_INFLUX_URL"),
    ({"PULSE_CLOCK_SKEW_US": "5ms"}, "PULSE_CLOCK_SKEW_US='5ms': not a number"),
    ({"PULSE_CLOCK_SKEW_US": "-1"}, "PULSE_CLOCK_SKEW_US='-1': must be between 0 and 1000000"),
    ({"PULSE_CLOCK_SKEW_US": "nan"}, "PULSE_CLOCK_SKEW_US='nan'"),
    ({"PULSE_CLOCK_SKEW_US": "inf"}, "PULSE_CLOCK_SKEW_US='inf'"),
    ({"PULSE_CLOCK_SKEW_US": "1e7"}, "PULSE_CLOCK_SKEW_US='1e7'"),
])
def test_bad_values(env: dict[str, str], match: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(match)):
        Settings.from_env(env)


def test_clock_skew_is_unset_by_default_and_zero_is_a_value() -> None:
    assert Settings.from_env({}).clock_skew_ns is None
    assert Settings.from_env({"PULSE_CLOCK_SKEW_US": "0"}).clock_skew_ns == 0
    assert Settings.from_env({"PULSE_CLOCK_SKEW_US": "1000000"}).clock_skew_ns == 1_000_000_000
    with pytest.raises(ConfigError, match="PULSE_CLOCK_SKEW_US"):
        Settings(clock_skew_ns=-1)


@pytest.mark.parametrize("broker", ["localhost", "127.0.0.1:9092", "k1:9092,k2:9092", "[::1]:9092"])
def test_good_brokers(broker: str) -> None:
    assert Settings.from_env({"PULSE_BROKER": broker}).broker == broker


def test_override_replaces_given_values_and_keeps_the_rest() -> None:
    base = Settings.from_env({"PULSE_BROKER": "127.0.0.1:9092", "PULSE_PARTITIONS": "4"})
    out = base.override(broker=None, partitions=12, topic_prefix="x")
    assert (out.broker, out.partitions, out.topic_prefix) == ("127.0.0.1:9092", 12, "x")
    assert base.override() is base
    with pytest.raises(ConfigError):
        base.override(partitions=0)


def test_bootstrap_needs_a_broker_from_settings_or_the_caller() -> None:
    with pytest.raises(ConfigError, match="PULSE_BROKER"):
        Settings().bootstrap()
    assert Settings(broker="a:1").bootstrap() == "a:1"
    assert Settings(broker="a:1").bootstrap("b:2") == "b:2"
    assert Settings().bootstrap("b:2") == "b:2"


def test_a_bad_alert_url_is_refused_naming_the_variable() -> None:
    with pytest.raises(ConfigError, match="PULSE_ALERT_URL"):
        Settings.from_env({"PULSE_ALERT_URL": "alertmanager:9093"})
