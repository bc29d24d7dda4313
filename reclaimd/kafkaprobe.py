"""Why a Kafka client cannot work, in one line an operator can act on.

aiokafka reports a client that never connected as "Unable to bootstrap from [...]", whatever
stopped it: an untrusted broker certificate, a client certificate the broker refused, a wrong
password. ``diagnose`` connects once more itself and names the cause; ``explain`` names the
broker's refusals that do reach the client (ACL denials, SASL answers). Either is a problem
waiting does not fix (``/readyz`` says not ready); ``None`` means it may pass by itself (a
broker down or restarting, a timeout), which the writer's backoff rides out.

No line carries a secret: a user name and file paths at most, never a password or a token.
"""

from __future__ import annotations

import asyncio
import ssl
from typing import Any

from aiokafka import errors
from aiokafka.conn import create_conn
from aiokafka.protocol.metadata import MetadataRequest

from reclaimd.kafkaconn import KafkaConfigError, KafkaSettings, options

_ACL = {
    errors.TopicAuthorizationFailedError: "topic",
    errors.GroupAuthorizationFailedError: "consumer group",
    errors.TransactionalIdAuthorizationFailed: "transactional id",
    errors.ClusterAuthorizationFailedError: "cluster",
}


def _principal(settings: KafkaSettings | None) -> str:
    if settings is None or (settings.sasl is None and settings.tls.cert_file is None):
        return "our principal"
    if settings.sasl is not None:
        return f"user {settings.sasl.username}" if settings.sasl.username else "our IAM role"
    return f"our client certificate ({settings.tls.cert_file})"


def explain(e: BaseException, settings: KafkaSettings | None, what: str = "") -> str | None:
    """The operator's problem ``e`` shows, or None when it may pass by itself."""
    if isinstance(e, KafkaConfigError):
        return str(e)
    for kind, resource in _ACL.items():
        if isinstance(e, kind):
            on = f" {what}" if what and resource == "topic" else ""
            return f"ACL: the broker denies {_principal(settings)} on the {resource}{on}"
    if isinstance(e, errors.SaslAuthenticationFailed | errors.AuthenticationFailedError):
        return _sasl_refused(settings)
    if isinstance(
        e, errors.UnsupportedSaslMechanismError | errors.AuthenticationMethodNotSupported
    ):
        mechanism = settings.sasl.mechanism if settings and settings.sasl else "SASL"
        return f"SASL: the broker does not take {mechanism} on this listener"
    if isinstance(e, ssl.SSLCertVerificationError):
        return (
            f"TLS: the broker's certificate is not trusted ({e.verify_message}); "
            f"check kafka.tls.ca_file ({_ca(settings)})"
        )
    if isinstance(e, ssl.SSLError):
        reason = (e.reason or "").lower().replace("_", " ")
        if "alert" in reason:
            why = reason.split("alert")[-1].strip()
            return (
                f"TLS: the broker refused our client certificate ({why}); "
                f"check kafka.tls.cert_file ({_cert(settings)})"
            )
        return f"TLS: handshake failed ({reason or 'ssl error'})"
    return None


def _sasl_refused(settings: KafkaSettings | None) -> str:
    if settings is not None and settings.sasl is not None and settings.sasl.msk_iam_region:
        return "SASL: the broker refused our MSK IAM token (role, region or policy)"
    mechanism = settings.sasl.mechanism if settings and settings.sasl else "SASL"
    user = settings.sasl.username if settings and settings.sasl else "?"
    return (
        f"SASL: authentication failed for user {user} ({mechanism}); "
        "check kafka.sasl.username and password_file"
    )


def _ca(settings: KafkaSettings | None) -> str:
    return str(settings.tls.ca_file) if settings and settings.tls.ca_file else "system CAs"


def _cert(settings: KafkaSettings | None) -> str:
    return str(settings.tls.cert_file) if settings and settings.tls.cert_file else "none sent"


def _first_host(bootstrap: str) -> tuple[str, int]:
    host, _, port = bootstrap.split(",", maxsplit=1)[0].strip().rpartition(":")
    return host.strip("[]"), int(port)


async def diagnose(
    bootstrap: str, settings: KafkaSettings | None, *, timeout_s: float = 10.0
) -> str | None:
    """Connect to the first bootstrap broker as a client would and ask for metadata; the
    problem found, or None (it worked, or the broker is merely unreachable)."""
    try:
        host, port = _first_host(bootstrap)
        opts: dict[str, Any] = options(settings, bootstrap)
    except KafkaConfigError as e:
        return str(e)
    except ValueError:
        return f"bootstrap {bootstrap!r}: not host:port"
    opts.pop("bootstrap_servers")
    conn = None
    try:
        async with asyncio.timeout(timeout_s):
            conn = await create_conn(host, port, request_timeout_ms=int(timeout_s * 1000), **opts)
            # With TLS 1.3 the broker judges our certificate after the handshake: its refusal
            # arrives as the answer to the first request.
            await conn.send(MetadataRequest([]))
    except (OSError, errors.KafkaError, TimeoutError) as e:
        return explain(_cause(e), settings)
    finally:
        if conn is not None:
            conn.close()
    return None


async def problem(
    e: BaseException, bootstrap: str, settings: KafkaSettings | None, what: str = ""
) -> str | None:
    """What ``e`` from a client of ``bootstrap`` says waiting will not mend: ``explain``, and
    for a client that never connected (aiokafka's "Unable to bootstrap"), ``diagnose``."""
    found = explain(e, settings, what)
    if found is None and isinstance(e, errors.KafkaConnectionError):
        found = await diagnose(bootstrap, settings)
    return found


def _cause(e: BaseException) -> BaseException:
    """The TLS or SASL error under aiokafka's wrapping, if there is one."""
    wanted = (ssl.SSLError, errors.AuthenticationFailedError, errors.SaslAuthenticationFailed)
    seen: BaseException | None = e
    while seen is not None:
        if isinstance(seen, wanted):
            break
        seen = seen.__cause__ or seen.__context__
    return e if seen is None else seen
