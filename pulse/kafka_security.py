"""TLS and SASL options of every Kafka client, built from :class:`~pulse.settings.Settings`.

Two builders, used by every client Pulse makes: :func:`kafka_client_kwargs` (aiokafka
producers, consumers and admin clients) and :func:`faust_broker_credentials` (the Faust
worker). :func:`check_kafka` opens one connection the way the clients will and turns a
security failure (a CA that does not verify the broker, an expired certificate, a refused
password) into a :class:`ConfigError` naming the setting to fix; a broker that is merely
down is not an error there (producers spool until it comes back).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from typing import Any

from pulse.errors import ConfigError
from pulse.settings import Settings

_CONTEXTS: dict[tuple[object, ...], ssl.SSLContext] = {}


def _cert_not_after(path: str) -> float | None:
    """The certificate's expiry (epoch seconds), or None when it cannot be read here."""
    try:
        info = ssl._ssl._test_decode_cert(path)  # type: ignore[attr-defined]
        return float(ssl.cert_time_to_seconds(info["notAfter"]))
    except Exception:
        return None


def ssl_context(settings: Settings) -> ssl.SSLContext | None:
    """The client TLS context (None for PLAINTEXT / SASL_PLAINTEXT); errors name the setting."""
    if "SSL" not in settings.kafka_security_protocol:
        return None
    key = (settings.kafka_ssl_cafile, settings.kafka_ssl_certfile, settings.kafka_ssl_keyfile)
    if key in _CONTEXTS:
        return _CONTEXTS[key]
    cafile = str(settings.kafka_ssl_cafile) if settings.kafka_ssl_cafile else None
    try:
        ctx = ssl.create_default_context(cafile=cafile)
    except (OSError, ssl.SSLError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ConfigError(f"PULSE_KAFKA_SSL_CAFILE={cafile}: not a readable PEM CA bundle ({why})") from None
    if settings.kafka_ssl_certfile is not None:
        cert, keyfile = str(settings.kafka_ssl_certfile), str(settings.kafka_ssl_keyfile)
        try:
            ctx.load_cert_chain(cert, keyfile)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"PULSE_KAFKA_SSL_CERTFILE={cert} / PULSE_KAFKA_SSL_KEYFILE={keyfile}: cannot load the "
                              f"client certificate and key ({exc})") from None
        not_after = _cert_not_after(cert)
        if not_after is not None and not_after < time.time():
            raise ConfigError(f"PULSE_KAFKA_SSL_CERTFILE={cert}: the client certificate has expired "
                              f"({time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(not_after))})")
    _CONTEXTS[key] = ctx
    return ctx


def kafka_client_kwargs(settings: Settings) -> dict[str, Any]:
    """Keyword arguments for any aiokafka client (producer, consumer, admin)."""
    out: dict[str, Any] = {"security_protocol": settings.kafka_security_protocol}
    ctx = ssl_context(settings)
    if ctx is not None:
        out["ssl_context"] = ctx
    if settings.kafka_security_protocol.startswith("SASL"):
        out["sasl_mechanism"] = settings.kafka_sasl_mechanism
        out["sasl_plain_username"] = settings.kafka_sasl_username
        out["sasl_plain_password"] = settings.kafka_sasl_password
    return out


def faust_broker_credentials(settings: Settings) -> Any:
    """``broker_credentials`` for ``faust.App`` (None for PLAINTEXT)."""
    import faust

    proto = settings.kafka_security_protocol
    if proto == "PLAINTEXT":
        return None
    if proto == "SSL":
        return faust.SSLCredentials(ssl_context(settings))
    return faust.SASLCredentials(username=settings.kafka_sasl_username, password=settings.kafka_sasl_password,
                                 ssl_context=ssl_context(settings), mechanism=settings.kafka_sasl_mechanism)


def _first_server(bootstrap: str) -> tuple[str, int]:
    entry = bootstrap.split(",")[0].strip()
    host, _, port = entry.rpartition(":")
    return (host or entry), int(port or 9092)


def explain(exc: BaseException, settings: Settings, where: str) -> ConfigError | None:
    """The setting to blame for a failed connection, or None when it is not a security error."""
    from aiokafka import errors as kerr

    if isinstance(exc, ssl.SSLCertVerificationError):
        if exc.verify_code == 10:  # X509_V_ERR_CERT_HAS_EXPIRED
            return ConfigError(f"PULSE_KAFKA_SSL_CAFILE={settings.kafka_ssl_cafile}: the broker's certificate at "
                               f"{where} has expired ({exc.verify_message})")
        return ConfigError(f"PULSE_KAFKA_SSL_CAFILE={settings.kafka_ssl_cafile}: does not verify the broker's "
                           f"certificate at {where} ({exc.verify_message})")
    if isinstance(exc, ssl.SSLError):
        reason = (exc.reason or str(exc)).lower()
        if "certificate" in reason or "alert" in reason:
            return ConfigError(f"PULSE_KAFKA_SSL_CERTFILE={settings.kafka_ssl_certfile}: the broker at {where} "
                               f"rejected the client certificate ({exc.reason or exc})")
        return ConfigError(f"PULSE_KAFKA_SECURITY_PROTOCOL={settings.kafka_security_protocol}: TLS with the broker "
                           f"at {where} failed ({exc.reason or exc})")
    sasl = settings.kafka_security_protocol.startswith("SASL")
    if sasl and isinstance(exc, kerr.UnsupportedSaslMechanismError):
        return ConfigError(f"PULSE_KAFKA_SASL_MECHANISM={settings.kafka_sasl_mechanism}: not enabled on the broker "
                           f"at {where}")
    auth_failed = (kerr.SaslAuthenticationFailed, kerr.AuthenticationFailedError, kerr.IllegalSaslStateError)
    # aiokafka's SCRAM client raises KeyError('v') when the server-final message carries an
    # error (unknown user, wrong password) instead of the proof.
    if sasl and isinstance(exc, (*auth_failed, KeyError)):
        return ConfigError(f"PULSE_KAFKA_SASL_PASSWORD_FILE={settings.kafka_sasl_password_file}: the broker at "
                           f"{where} refused user {settings.kafka_sasl_username!r} "
                           f"({settings.kafka_sasl_mechanism}); check the password and the username")
    return None


async def check_kafka(settings: Settings, bootstrap: str, *, timeout_s: float = 10.0) -> None:
    """Connect once to the first bootstrap server with the clients' options; a security
    failure is a :class:`ConfigError` naming the setting, anything else (broker down) passes."""
    if settings.kafka_security_protocol == "PLAINTEXT":
        return
    from aiokafka.conn import create_conn

    host, port = _first_server(bootstrap)
    kw = kafka_client_kwargs(settings)
    conn = None
    try:
        conn = await asyncio.wait_for(create_conn(host, port, **kw), timeout_s)
    except Exception as exc:
        cause: BaseException = exc
        while cause.__cause__ is not None and not isinstance(cause, (ssl.SSLError, KeyError)):
            cause = cause.__cause__
        err = explain(cause, settings, f"{host}:{port}")
        if err is None and cause is not exc:
            err = explain(exc, settings, f"{host}:{port}")
        if err is None and "SSL" in settings.kafka_security_protocol:
            err = await _tls_refusal(settings, host, port, timeout_s)
        if err is None and settings.kafka_security_protocol.startswith("SASL"):
            err = await _blame_sasl(settings, host, port, timeout_s)
        if err is not None:
            raise err from None
    finally:
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()


# ApiVersions v0 (api key 18), correlation id 1, null client id: the smallest request every
# Kafka broker answers, so the broker's answer to our TLS client is read, not guessed.
_API_VERSIONS_V0 = (10).to_bytes(4, "big") + (18).to_bytes(2, "big") + (0).to_bytes(2, "big") + \
    (1).to_bytes(4, "big") + (-1).to_bytes(2, "big", signed=True)


async def _tls_refusal(settings: Settings, host: str, port: int, timeout_s: float) -> ConfigError | None:
    """With TLS 1.3 the client's handshake ends before the broker has checked the client
    certificate; a broker that refuses it then sends an alert and closes, and whether the
    client reads the alert or only the closed socket is a race. Ask once more, reading the
    answer to one request: an alert, or a close right after a good handshake, is the refusal."""
    ctx = ssl_context(settings)
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port, ssl=ctx, server_hostname=host),
                                                timeout_s)
    except ssl.SSLError as exc:
        return explain(exc, settings, f"{host}:{port}")
    except Exception:
        return None  # down or unreachable: not a settings problem
    try:
        writer.write(_API_VERSIONS_V0)
        await asyncio.wait_for(writer.drain(), timeout_s)
        await asyncio.wait_for(reader.readexactly(4), timeout_s)
    except ssl.SSLError as exc:
        return explain(exc, settings, f"{host}:{port}")
    except (asyncio.IncompleteReadError, ConnectionError):
        if settings.kafka_security_protocol.startswith("SASL"):
            return None  # the SASL step may be what the broker refused: _blame_sasl says so
        return ConfigError(f"PULSE_KAFKA_SSL_CERTFILE={settings.kafka_ssl_certfile}: the broker at {host}:{port} "
                           "rejected the connection right after the TLS handshake (it requires a client "
                           "certificate it trusts)")
    except Exception:
        return None
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()
    return None


async def _blame_sasl(settings: Settings, host: str, port: int, timeout_s: float) -> ConfigError | None:
    """Some brokers (Tansu) just close the connection on a SASL mechanism they lack: when the
    transport alone works, the SASL step is what failed."""
    try:
        _, writer = await asyncio.wait_for(
            asyncio.open_connection(host, port, ssl=ssl_context(settings),
                                    server_hostname=host if ssl_context(settings) else None), timeout_s)
    except Exception:
        return None  # the broker is down or unreachable: not a settings problem
    writer.close()
    with contextlib.suppress(Exception):
        await writer.wait_closed()
    return ConfigError(f"PULSE_KAFKA_SASL_MECHANISM={settings.kafka_sasl_mechanism}: the broker at {host}:{port} "
                       "closed the connection during SASL authentication (mechanism not enabled there, or "
                       f"user {settings.kafka_sasl_username!r} refused)")
