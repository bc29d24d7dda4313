"""How every Kafka client of reclaimd connects: one ``kafka:`` settings section, one function.

The ledger writer and its scan readers, the allocation meter, the notices consumer, ``reclaimd
report --kafka`` and the drills all build their aiokafka clients with ``options(...)``, so a
broker that wants TLS, mTLS, SASL/SCRAM or Amazon MSK IAM is spoken to the same way by each.

Secrets never sit in the settings: the SASL password is a file (a mounted Secret), read again
each time a client is made (a rotated Secret is picked up at the next reconnect); an MSK IAM
token is signed from the pod's own AWS credentials (IRSA, EKS Pod Identity) and refreshed
before it expires. No secret is ever part of an error, a log line or ``check-config`` output.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import Any

from aiokafka.abc import AbstractTokenProvider
from pydantic import model_validator

from reclaimd.strict import Strict


class Protocol(StrEnum):
    PLAINTEXT = "PLAINTEXT"
    SSL = "SSL"
    SASL_PLAINTEXT = "SASL_PLAINTEXT"
    SASL_SSL = "SASL_SSL"

    @property
    def tls(self) -> bool:
        return self in (Protocol.SSL, Protocol.SASL_SSL)

    @property
    def sasl(self) -> bool:
        return self in (Protocol.SASL_PLAINTEXT, Protocol.SASL_SSL)


class Mechanism(StrEnum):
    PLAIN = "PLAIN"
    SCRAM_SHA_256 = "SCRAM-SHA-256"
    SCRAM_SHA_512 = "SCRAM-SHA-512"
    OAUTHBEARER = "OAUTHBEARER"


def _readable(path: Path | None, what: str) -> None:
    if path is not None and not path.is_file():
        raise ValueError(f"{what} {path}: no such file")


class KafkaTls(Strict):
    """TLS for SSL and SASL_SSL. With no ``ca_file`` the system's CAs are trusted (MSK and
    Confluent Cloud serve publicly trusted certificates); a private CA (Strimzi's cluster CA,
    a company PKI) is named here."""

    ca_file: Path | None = None
    # mTLS: the client certificate (PEM, chain included) and its unencrypted key.
    cert_file: Path | None = None
    key_file: Path | None = None
    # Off only for a broker whose certificate names no address the client uses: never the
    # default, and check-config says so.
    check_hostname: bool = True

    @model_validator(mode="after")
    def _files(self) -> KafkaTls:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file and key_file: give both (mTLS) or neither")
        _readable(self.ca_file, "ca_file")
        _readable(self.cert_file, "cert_file")
        _readable(self.key_file, "key_file")
        return self


class KafkaSasl(Strict):
    """SASL: PLAIN or SCRAM with a user and a password file, or OAUTHBEARER with Amazon MSK
    IAM (a token signed with the pod's AWS credentials for ``msk_iam_region``)."""

    mechanism: Mechanism = Mechanism.SCRAM_SHA_512
    username: str = ""
    password_file: Path | None = None
    msk_iam_region: str = ""

    @model_validator(mode="after")
    def _credentials(self) -> KafkaSasl:
        if self.mechanism is Mechanism.OAUTHBEARER:
            if not self.msk_iam_region:
                raise ValueError("OAUTHBEARER: set msk_iam_region (Amazon MSK IAM)")
            if self.username or self.password_file is not None:
                raise ValueError("OAUTHBEARER takes no username or password_file")
            return self
        if self.msk_iam_region:
            raise ValueError(f"msk_iam_region: only with OAUTHBEARER, not {self.mechanism}")
        if not self.username:
            raise ValueError(f"{self.mechanism}: set username")
        if self.password_file is None:
            raise ValueError(f"{self.mechanism}: set password_file (a mounted Secret)")
        _readable(self.password_file, "password_file")
        return self


class KafkaSettings(Strict):
    """``kafka:``, shared by every Kafka client (each names its own bootstrap and topic)."""

    security_protocol: Protocol = Protocol.PLAINTEXT
    tls: KafkaTls = KafkaTls()
    sasl: KafkaSasl | None = None

    @model_validator(mode="after")
    def _fits_protocol(self) -> KafkaSettings:
        p = self.security_protocol
        if p.sasl and self.sasl is None:
            raise ValueError(f"{p} needs a sasl section (mechanism, credentials)")
        if not p.sasl and self.sasl is not None:
            raise ValueError(f"sasl: {p} takes no SASL mechanism (SASL_SSL does)")
        if not p.tls and self.tls != KafkaTls():
            raise ValueError(f"tls: {p} is not TLS (SSL or SASL_SSL is)")
        if self.sasl is not None and self.sasl.mechanism is Mechanism.OAUTHBEARER and not p.tls:
            raise ValueError("OAUTHBEARER (MSK IAM) is served over TLS only: use SASL_SSL")
        return self

    def describe(self) -> str:
        """What ``check-config`` prints: the shape, never a secret."""
        parts = [str(self.security_protocol)]
        if self.security_protocol.tls:
            parts.append(f"ca={self.tls.ca_file or 'system'}")
            if self.tls.cert_file is not None:
                parts.append(f"client-cert={self.tls.cert_file}")
            if not self.tls.check_hostname:
                parts.append("hostname-check=OFF")
        if self.sasl is not None:
            who = (
                f"msk-iam:{self.sasl.msk_iam_region}"
                if self.sasl.mechanism is Mechanism.OAUTHBEARER
                else f"user={self.sasl.username}"
            )
            parts.append(f"{self.sasl.mechanism} {who}")
        return " ".join(parts)


class KafkaConfigError(ValueError):
    """A setting that fails when a client is made (a file gone, a key that does not load);
    one line, no secret."""


def ssl_context(tls: KafkaTls) -> ssl.SSLContext:
    try:
        context = ssl.create_default_context(
            cafile=str(tls.ca_file) if tls.ca_file is not None else None
        )
        if tls.cert_file is not None and tls.key_file is not None:
            context.load_cert_chain(str(tls.cert_file), str(tls.key_file))
    except (OSError, ssl.SSLError) as e:
        raise KafkaConfigError(f"kafka.tls: cannot load {_which(tls, e)}: {_short(e)}") from e
    context.check_hostname = tls.check_hostname
    return context


def _which(tls: KafkaTls, e: Exception) -> str:
    name = getattr(e, "filename", None)
    return str(name) if name else "the CA or client certificate"


def _short(e: BaseException) -> str:
    return (getattr(e, "strerror", None) or getattr(e, "reason", None) or type(e).__name__).lower()


def read_password(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8").strip()
    except OSError as e:
        raise KafkaConfigError(f"kafka.sasl.password_file {path}: {_short(e)}") from e


def options(settings: KafkaSettings | None, bootstrap: str) -> dict[str, Any]:
    """The aiokafka keywords (producer, consumer and admin client alike) to reach
    ``bootstrap`` as ``settings`` say; the password file is read now."""
    opts: dict[str, Any] = {"bootstrap_servers": bootstrap}
    if settings is None:
        return opts
    opts["security_protocol"] = str(settings.security_protocol)
    if settings.security_protocol.tls:
        opts["ssl_context"] = ssl_context(settings.tls)
    sasl = settings.sasl
    if sasl is not None:
        opts["sasl_mechanism"] = str(sasl.mechanism)
        if sasl.mechanism is Mechanism.OAUTHBEARER:
            opts["sasl_oauth_token_provider"] = msk_iam_tokens(sasl.msk_iam_region)
        else:
            assert sasl.password_file is not None  # the settings refuse it otherwise
            opts["sasl_plain_username"] = sasl.username
            opts["sasl_plain_password"] = read_password(sasl.password_file)
    return opts


# --- Amazon MSK IAM ----------------------------------------------------------------------

Signer = Callable[[str], tuple[str, int]]  # region -> (token, expiry in epoch ms)


def _aws_signer(region: str) -> tuple[str, int]:
    # Imported only where MSK IAM is configured.
    from aws_msk_iam_sasl_signer import MSKAuthTokenProvider

    token, expiry_ms = MSKAuthTokenProvider.generate_auth_token(region)
    return str(token), int(expiry_ms)


class MskIamTokens(AbstractTokenProvider):  # type: ignore[misc]
    """OAUTHBEARER tokens for Amazon MSK IAM: signed with the default AWS credential chain
    (IRSA's web identity, EKS Pod Identity), kept until ``refresh_before_s`` before they
    expire (a token lives 15 min), one signing at a time however many clients ask."""

    def __init__(
        self,
        region: str,
        *,
        signer: Signer = _aws_signer,
        refresh_before_s: float = 60.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.region = region
        self._signer = signer
        self._refresh_before_s = refresh_before_s
        self._clock = clock
        self._token = ""
        self._expires_at = 0.0
        self._lock = asyncio.Lock()
        self.signed = 0  # tokens signed so far

    def _fresh(self) -> bool:
        return bool(self._token) and self._clock() < self._expires_at - self._refresh_before_s

    async def token(self) -> str:
        if self._fresh():
            return self._token
        async with self._lock:
            if not self._fresh():
                # Signing reads credentials (an STS call for IRSA): off the event loop.
                token, expiry_ms = await asyncio.to_thread(self._signer, self.region)
                self._token, self._expires_at = token, expiry_ms / 1000
                self.signed += 1
        return self._token


_TOKENS: dict[str, MskIamTokens] = {}


def msk_iam_tokens(region: str) -> MskIamTokens:
    """One provider per region for the process: every client shares its cached token."""
    if region not in _TOKENS:
        _TOKENS[region] = MskIamTokens(region)
    return _TOKENS[region]
