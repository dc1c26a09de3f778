"""Kafka over TLS (and SASL where the broker here supports it), against real components: the
embedded Tansu broker behind stunnel4 with certificates made by openssl in the test, a real
worker process, the real producer CLI. Each misconfiguration is one line naming the setting."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pulse.producers.spool import Spool, read_segment
from services import find_binary
from streamkit import publish, read_topic, running_worker, unique_settings, verdicts_on_topic, wait_caught_up
from tlskit import Pki, make_pki, tls_broker

from pulse.errors import ConfigError
from pulse.kafka_security import check_kafka, kafka_client_kwargs
from pulse.settings import Settings
from pulse.trace import read_truth

if find_binary("stunnel4") is None and find_binary("stunnel") is None:
    pytestmark = pytest.mark.skip(reason="MISSING SERVICE: stunnel4 (apt-get install stunnel4)")


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def tls_env(pki: Pki, *, ca: str = "ca", client: str | None = "client") -> dict[str, str]:
    env = {"PULSE_KAFKA_SECURITY_PROTOCOL": "SSL", "PULSE_KAFKA_SSL_CAFILE": str(pki.path(f"{ca}.pem"))}
    if client:
        env |= {"PULSE_KAFKA_SSL_CERTFILE": str(pki.path(f"{client}.pem")),
                "PULSE_KAFKA_SSL_KEYFILE": str(pki.path(f"{client}.key"))}
    return env


def settings_for(bootstrap: str, tmp: Path, env: dict[str, str]) -> Settings:
    base = unique_settings(bootstrap, tmp)
    sec = Settings.from_env(env)
    return dataclasses.replace(base, **{f.name: getattr(sec, f.name) for f in dataclasses.fields(sec)
                                        if f.name.startswith("kafka_")})


def test_pipeline_end_to_end_over_mutual_tls(pki, sim_trace, tmp_path):
    trace = sim_trace("nic-slow")
    culprit = set(read_truth(trace)["culprit"]["nodes"])
    with tls_broker(tmp_path, pki, client_ca=True) as bootstrap:
        env = tls_env(pki)
        s = settings_for(bootstrap, tmp_path, env)
        with running_worker(s, tmp_path, env) as w:
            counts = publish(s, trace)
            rec = wait_caught_up(s, counts["batches"], worker=w)
        verdicts = verdicts_on_topic(s)
    hits = [v for v in verdicts if v["status"] == "anomaly" and culprit & set(v["nodes"])]
    assert hits, f"no verdict naming {culprit} over TLS: {[v['status'] for v in verdicts]}; pipeline {rec}"
    assert rec["dead_letters"] == 0


def produce_cli(bootstrap: str, spool: Path, trace: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("PULSE_")}
    full |= env | {"PULSE_TOPIC_PREFIX": spool.parent.name}
    return subprocess.run([sys.executable, "-m", "pulse.cli", "produce", "--broker", bootstrap, "--spool-dir",
                           str(spool), "trace", str(trace)], env=full, capture_output=True, text=True, timeout=120)


def one_line(res: subprocess.CompletedProcess[str]) -> str:
    assert res.returncode == 1, res.stderr[-2000:]
    assert "Traceback" not in res.stderr, res.stderr[-2000:]
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, res.stderr[-2000:]
    return lines[0]


def test_wrong_ca_is_one_line_and_the_spool_keeps_everything(pki, sim_trace, tmp_path):
    trace = sim_trace("healthy")
    work = tmp_path / "prod"
    work.mkdir()
    spool_dir = work / "spool"
    prefix = work.name
    seeded = Spool(spool_dir, 1 << 20)  # what an earlier run could not send
    seeded.append(f"{prefix}.dead-letter", b"k", b"spooled before the outage")
    seeded.close()
    before = [m for seg in seeded.segments() for m in read_segment(seg)]
    with tls_broker(tmp_path, pki) as bootstrap:
        res = produce_cli(bootstrap, spool_dir, trace, tls_env(pki, ca="other-ca", client=None))
        line = one_line(res)
        assert line.startswith(f"error: PULSE_KAFKA_SSL_CAFILE={pki.path('other-ca.pem')}: does not verify"), line
        assert [m for seg in Spool(spool_dir, 1 << 20).segments() for m in read_segment(seg)] == before
        # Fixed: the same spool drains first, then the trace goes out.
        env = tls_env(pki, client=None)
        res = produce_cli(bootstrap, spool_dir, trace, env)
        assert res.returncode == 0, res.stderr[-2000:]
        s = settings_for(bootstrap, tmp_path, env)
        got = asyncio.run(read_topic(bootstrap, f"{prefix}.dead-letter", client=kafka_client_kwargs(s)))
    assert got == [(b"k", b"spooled before the outage")]
    assert Spool(spool_dir, 1 << 20).empty


def test_expired_broker_certificate(pki, sim_trace, tmp_path):
    with tls_broker(tmp_path, pki, server="expired-server") as bootstrap:
        res = produce_cli(bootstrap, tmp_path / "p" / "spool", sim_trace("healthy"), tls_env(pki, client=None))
    line = one_line(res)
    assert line.startswith("error: PULSE_KAFKA_SSL_CAFILE=") and "has expired" in line, line


def test_client_certificate_problems(pki, sim_trace, tmp_path):
    with tls_broker(tmp_path, pki, client_ca=True) as bootstrap:
        res = produce_cli(bootstrap, tmp_path / "p" / "spool", sim_trace("healthy"),
                          tls_env(pki, client="expired-client"))
        line = one_line(res)
        assert line.startswith(f"error: PULSE_KAFKA_SSL_CERTFILE={pki.path('expired-client.pem')}: the client "
                               "certificate has expired"), line
        # No certificate at all where the broker requires one: the broker's refusal, named.
        s = settings_for(bootstrap, tmp_path, tls_env(pki, client=None))
        with pytest.raises(ConfigError, match=r"^PULSE_KAFKA_SSL_CERTFILE=None: the broker at .* rejected"):
            asyncio.run(check_kafka(s, bootstrap))
        asyncio.run(check_kafka(settings_for(bootstrap, tmp_path, tls_env(pki)), bootstrap))  # the right one passes


def test_sasl_refusals_against_tansu_authentication(pki, sim_trace, tmp_path):
    """Tansu 0.6 with --authentication refuses every SCRAM login here (its users can only be
    created through an authenticated connection: docs/security.md), which is exactly a
    wrong password as a client sees it."""
    secret = tmp_path / "kafka-password"
    secret.write_text("not-the-password\n")
    secret.chmod(0o600)
    with tls_broker(tmp_path, pki, authentication=True) as bootstrap:
        env = {**tls_env(pki, client=None), "PULSE_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
               "PULSE_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512", "PULSE_KAFKA_SASL_USERNAME": "pulse",
               "PULSE_KAFKA_SASL_PASSWORD_FILE": str(secret)}
        res = produce_cli(bootstrap, tmp_path / "p" / "spool", sim_trace("healthy"), env)
        line = one_line(res)
        assert line.startswith(f"error: PULSE_KAFKA_SASL_PASSWORD_FILE={secret}: the broker at"), line
        assert "not-the-password" not in res.stderr + res.stdout  # never echoed
        res = produce_cli(bootstrap, tmp_path / "q" / "spool", sim_trace("healthy"),
                          env | {"PULSE_KAFKA_SASL_MECHANISM": "PLAIN"})
        line = one_line(res)
        assert line.startswith("error: PULSE_KAFKA_SASL_MECHANISM=PLAIN: the broker at"), line


def test_settings_validate_security_options(tmp_path):
    secret = tmp_path / "pw"
    secret.write_text("s3cret\n")
    s = Settings.from_env({"PULSE_KAFKA_SECURITY_PROTOCOL": "sasl_plaintext", "PULSE_KAFKA_SASL_MECHANISM": "scram-sha-256",
                           "PULSE_KAFKA_SASL_USERNAME": "u", "PULSE_KAFKA_SASL_PASSWORD_FILE": str(secret)})
    assert s.kafka_sasl_password == "s3cret" and "s3cret" not in repr(s)
    assert s.redacted()["kafka_sasl_password"] == "***"
    kw = kafka_client_kwargs(s)
    assert kw["security_protocol"] == "SASL_PLAINTEXT" and kw["sasl_mechanism"] == "SCRAM-SHA-256"
    assert "ssl_context" not in kw
    bad = [({"PULSE_KAFKA_SECURITY_PROTOCOL": "TLS"}, "PULSE_KAFKA_SECURITY_PROTOCOL='TLS'"),
           ({"PULSE_KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "PULSE_KAFKA_SASL_MECHANISM": "GSSAPI"},
            "PULSE_KAFKA_SASL_MECHANISM='GSSAPI'"),
           ({"PULSE_KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "PULSE_KAFKA_SASL_MECHANISM": "PLAIN",
             "PULSE_KAFKA_SASL_USERNAME": "u"}, "PULSE_KAFKA_SASL_PASSWORD_FILE: required"),
           ({"PULSE_KAFKA_SASL_PASSWORD_FILE": str(tmp_path / "none")}, "PULSE_KAFKA_SASL_PASSWORD_FILE=.*cannot read"),
           ({"PULSE_KAFKA_SSL_CAFILE": "/x.pem"}, "does not use TLS"),
           ({"PULSE_KAFKA_SECURITY_PROTOCOL": "SSL", "PULSE_KAFKA_SSL_CERTFILE": "/c.pem"}, "give both")]
    for env, msg in bad:
        with pytest.raises(ConfigError, match=msg):
            Settings.from_env(env)
    garbage = tmp_path / "ca.pem"
    garbage.write_text("not a certificate")
    with pytest.raises(ConfigError, match=r"PULSE_KAFKA_SSL_CAFILE=.*not a readable PEM"):
        kafka_client_kwargs(Settings.from_env({"PULSE_KAFKA_SECURITY_PROTOCOL": "SSL",
                                               "PULSE_KAFKA_SSL_CAFILE": str(garbage)}))


def test_worker_refuses_a_wrong_ca_in_one_line(pki, tmp_path):
    with tls_broker(tmp_path, pki) as bootstrap:
        full = {k: v for k, v in os.environ.items() if not k.startswith("PULSE_")}
        full |= tls_env(pki, ca="other-ca", client=None) | {"PULSE_TOPIC_PREFIX": "wrongca"}
        res = subprocess.run([sys.executable, "-m", "pulse.cli", "worker", "--broker", bootstrap], env=full,
                             capture_output=True, text=True, timeout=120)
    lines = [ln for ln in res.stderr.splitlines() if ln.strip() and not ln.startswith("pulse worker ")]
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith("error: PULSE_KAFKA_SSL_CAFILE="), res.stderr[-2000:]


def test_refusal_after_the_tls_handshake_is_read_not_raced(pki, tmp_path):
    """With TLS 1.3 the broker checks the client certificate after the client's handshake has
    ended, so the first connection may see only a closed socket (the fresh-clone run once
    passed a certificate-less client as fine that way); the second look reads the answer
    to one request, which is the refusal whatever the timing."""
    from pulse.kafka_security import _tls_refusal

    with tls_broker(tmp_path, pki, client_ca=True) as bootstrap:
        host, _, port = bootstrap.rpartition(":")
        none = settings_for(bootstrap, tmp_path, tls_env(pki, client=None))
        err = asyncio.run(_tls_refusal(none, host, int(port), 10.0))
        assert err is not None and str(err).startswith("PULSE_KAFKA_SSL_CERTFILE=None: the broker at"), err
        good = settings_for(bootstrap, tmp_path, tls_env(pki))
        assert asyncio.run(_tls_refusal(good, host, int(port), 10.0)) is None
