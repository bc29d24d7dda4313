"""reclaimd's identity, checked by the rank it asks (docs/checkpoint-contract.md, "Who may ask").

A checkpoint request makes a trainer do real work (GPU time, PutObject spend), so a rank need
not take anyone's word for it. Every request reclaimd sends a rank (the POST, its status polls,
``/incarnation``) carries ``Authorization: Bearer <token>``: reclaimd's own short-lived projected
ServiceAccount token, audience ``reclaimd.io/checkpoint``. A rank that verifies checks it
offline, with no call per request:

- the signature, against the cluster's service-account issuer keys (``/openid/v1/jwks`` on the
  API server), fetched once and again only when a token names a key id not seen yet (the
  issuer rotated its key): once per unknown id per ``refetch_after_s``, and at most one fetch
  per ``min_refetch_s`` whatever the ids, so forged ids cannot make the rank hammer the
  issuer;
- the audience, the expiry (and ``nbf``), and the subject: reclaimd's ServiceAccount,
  ``system:serviceaccount:<namespace>:<name>``.

Anything else is refused (``Unauthorized``, one line): the servers answer ``401`` and start no
save. Whether a rank verifies is its pod's ``reclaimd.io/checkpoint-auth`` annotation (``token``
or ``none``), which the pod hands its process through the downward API as
``RECLAIMD_CHECKPOINT_AUTH``; ``from_environment()`` reads it.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import ssl
import threading
import time
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    import jwt

log = logging.getLogger(__name__)

AUDIENCE: Final = "reclaimd.io/checkpoint"
ANNOTATION: Final = "reclaimd.io/checkpoint-auth"  # token | none
ENV_AUTH: Final = "RECLAIMD_CHECKPOINT_AUTH"  # the annotation, through the downward API
ENV_SUBJECT: Final = "RECLAIMD_CHECKPOINT_SUBJECT"  # reclaimd's ServiceAccount, if not the chart's
ENV_JWKS_URL: Final = "RECLAIMD_JWKS_URL"  # the issuer keys, if not the API server's
DEFAULT_SUBJECT: Final = "system:serviceaccount:reclaimd:reclaimd"
SA_DIR: Final = Path("/var/run/secrets/kubernetes.io/serviceaccount")
# Asymmetric only: the API server signs with RSA or ECDSA keys; "none" and HMAC never pass.
ALGORITHMS: Final = ("RS256", "RS384", "RS512", "ES256", "ES384", "ES512")
_NAME = r"[a-z0-9]([-.a-z0-9]*[a-z0-9])?"  # a namespace's or a ServiceAccount's (DNS) name
_SUBJECT = re.compile(rf"system:serviceaccount:{_NAME}:{_NAME}")
_MAX_TOKEN = 16 * 1024


class Unauthorized(Exception):
    """The request does not prove it comes from reclaimd; the message says why, in one line."""


def check_subject(subject: str) -> str:
    if not _SUBJECT.fullmatch(subject):
        raise ValueError(
            f"{subject[:80]!r} is not a ServiceAccount (system:serviceaccount:<namespace>:<name>)"
        )
    return subject


# --- the issuer's keys ---------------------------------------------------------------------


@dataclass(frozen=True)
class ApiServerJwks:
    """``GET <url>`` of the API server's JWKS, as this pod: its own ServiceAccount token
    (re-read at each fetch: the kubelet rotates it) and the cluster's CA. Kubernetes binds the
    ``system:service-account-issuer-discovery`` ClusterRole to every ServiceAccount by default
    (``system:serviceaccounts``), so no RBAC of the tenant's is needed."""

    url: str
    ca_file: Path | None = None
    token_file: Path | None = None
    timeout_s: float = 5.0

    @classmethod
    def in_cluster(cls, env: Mapping[str, str] = os.environ) -> ApiServerJwks:
        """The API server this pod talks to (``RECLAIMD_JWKS_URL`` overrides it)."""
        url = env.get(ENV_JWKS_URL, "")
        if not url:
            host, port = env.get("KUBERNETES_SERVICE_HOST", ""), env.get("KUBERNETES_SERVICE_PORT")
            if not host:
                raise ValueError(
                    f"not in a cluster (no KUBERNETES_SERVICE_HOST): set {ENV_JWKS_URL}"
                )
            host = f"[{host}]" if ":" in host else host
            url = f"https://{host}:{port or 443}/openid/v1/jwks"
        ca, token = SA_DIR / "ca.crt", SA_DIR / "token"
        return cls(url, ca if ca.exists() else None, token if token.exists() else None)

    def __call__(self) -> Mapping[str, Any]:
        # The API server serves the JWKS as application/jwk-set+json only (406 to a plain JSON
        # Accept); other issuers say application/json.
        headers = {"Accept": "application/jwk-set+json, application/json"}
        if self.token_file is not None:
            headers["Authorization"] = f"Bearer {self.token_file.read_text().strip()}"
        context = ssl.create_default_context(cafile=str(self.ca_file) if self.ca_file else None)
        req = urllib.request.Request(self.url, headers=headers)
        with urllib.request.urlopen(req, timeout=self.timeout_s, context=context) as reply:
            doc = json.loads(reply.read(1 << 20))
        if not isinstance(doc, dict):
            raise ValueError("the JWKS is not a JSON object")
        return doc


# --- the verifier --------------------------------------------------------------------------


class TokenVerifier:
    """Checks ``Authorization`` headers against ``keys()`` (a JWKS document); thread-safe.

    ``clock`` is the wall clock in seconds (tests move it to see a token expire).
    """

    def __init__(
        self,
        keys: Callable[[], Mapping[str, Any]],
        *,
        subject: str = DEFAULT_SUBJECT,
        audience: str = AUDIENCE,
        issuer: str | None = None,
        leeway_s: float = 30.0,
        refetch_after_s: float = 30.0,
        min_refetch_s: float = 1.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.subject = check_subject(subject)
        self.audience = audience
        self.issuer = issuer
        self.leeway_s = leeway_s
        self.refetch_after_s = refetch_after_s
        self.min_refetch_s = min_refetch_s
        self._tried: dict[str, float] = {}  # unknown key ids a fetch was made for, and when
        self._keys_source = keys
        self._clock = clock
        self._lock = threading.Lock()
        self._keys: dict[str, jwt.PyJWK] | None = None
        self._fetched_at = 0.0
        self.fetches = 0  # how often the JWKS was fetched

    @property
    def key_ids(self) -> frozenset[str]:
        """The key ids fetched so far (none before the first fetch)."""
        with self._lock:
            return frozenset(self._keys or ())

    def prefetch(self) -> None:
        """Fetch the keys now (a server's start), so the first request does not wait; a
        failure is logged and left for the first request to retry."""
        try:
            with self._lock:
                self._fetch()
        except Exception as e:
            log.warning("issuer keys not fetched yet: %s", _one_line(e))

    def verify(self, authorization: str | None) -> Mapping[str, Any]:
        """The token's claims, or ``Unauthorized``."""
        import jwt  # PyJWT (a dependency): loaded by a rank that verifies, not by every Signal

        token = _bearer(authorization)
        try:
            header = jwt.get_unverified_header(token)
        except jwt.InvalidTokenError:
            raise Unauthorized("the bearer token is not a JWT") from None
        alg, kid = header.get("alg"), header.get("kid")
        if alg not in ALGORITHMS:
            raise Unauthorized(f"token algorithm {str(alg)[:16]!r} is not accepted")
        if not isinstance(kid, str) or not kid:
            raise Unauthorized("token names no key id")
        key = self._key(kid)
        try:
            claims: dict[str, Any] = jwt.decode(
                token,
                key.key,
                algorithms=[alg],
                audience=self.audience,
                issuer=self.issuer,
                # exp and nbf are checked below, on this verifier's clock
                options={"verify_exp": False, "verify_nbf": False, "verify_iat": False,
                         "require": ["exp", "sub", "aud"]},
            )  # fmt: skip
        except jwt.InvalidAudienceError:
            raise Unauthorized(f"token is not for {self.audience}") from None
        except jwt.InvalidSignatureError:
            raise Unauthorized("token signature does not verify") from None
        except jwt.InvalidTokenError as e:
            raise Unauthorized(f"token refused: {_one_line(e)}") from None
        now = self._clock()
        exp, nbf = claims.get("exp"), claims.get("nbf")
        if not isinstance(exp, int | float) or now > exp + self.leeway_s:
            raise Unauthorized("token expired")
        if isinstance(nbf, int | float) and now + self.leeway_s < nbf:
            raise Unauthorized("token not valid yet")
        if claims.get("sub") != self.subject:
            raise Unauthorized(f"token subject {str(claims.get('sub'))[:120]!r} is not reclaimd's")
        return claims

    def _key(self, kid: str) -> jwt.PyJWK:
        with self._lock:
            now = self._clock()
            if self._keys is None or (
                kid not in self._keys
                and now - self._tried.get(kid, -math.inf) >= self.refetch_after_s
                and now - self._fetched_at >= self.min_refetch_s
            ):
                if self._keys is not None:
                    self._tried[kid] = now
                    while len(self._tried) > 256:  # forged ids: keep the newest only
                        del self._tried[next(iter(self._tried))]
                try:
                    self._fetch()
                except Exception as e:
                    raise Unauthorized(f"issuer keys unavailable: {_one_line(e)}") from None
            assert self._keys is not None
            key = self._keys.get(kid)
        if key is None:
            raise Unauthorized("token signed by a key the issuer does not publish")
        return key

    def _fetch(self) -> None:
        """Under the lock: fetch and replace the keys (a key the issuer dropped goes too)."""
        import jwt

        self._fetched_at = self._clock()
        self.fetches += 1
        doc = self._keys_source()
        keys: dict[str, jwt.PyJWK] = {}
        for raw in doc.get("keys", []):
            try:
                key = jwt.PyJWK.from_dict(raw)
            except jwt.PyJWKError:
                continue  # a key type this verifier cannot use: tokens signed with it fail
            if key.key_id:
                keys[key.key_id] = key
        self._keys = keys


def _bearer(authorization: str | None) -> str:
    if not authorization:
        raise Unauthorized("no bearer token")
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized("Authorization is not a bearer token")
    if len(token) > _MAX_TOKEN:
        raise Unauthorized("bearer token too long")
    return token.strip()


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) <= 200 else text[:197] + "..."


# --- what the pod says ---------------------------------------------------------------------


def from_environment(env: Mapping[str, str] = os.environ) -> TokenVerifier | None:
    """The verifier this pod asked for, or ``None`` (``RECLAIMD_CHECKPOINT_AUTH`` empty or
    ``none``: the pod's annotation is absent or says so). ``ValueError`` with one line for a
    value that is neither, or a subject that is no ServiceAccount."""
    mode = env.get(ENV_AUTH, "").strip().lower()
    if mode in ("", "none"):
        return None
    if mode != "token":
        raise ValueError(f"{ENV_AUTH}={mode[:20]!r}: {ANNOTATION} must be token or none")
    subject = env.get(ENV_SUBJECT, "").strip() or DEFAULT_SUBJECT
    return TokenVerifier(ApiServerJwks.in_cluster(env), subject=check_subject(subject))


class FromEnvironment:
    """The servers' default ``auth``: whatever ``from_environment()`` says when they start."""

    def __repr__(self) -> str:
        return "FROM_ENVIRONMENT"


FROM_ENVIRONMENT: Final = FromEnvironment()
Auth = TokenVerifier | FromEnvironment | None
_said_unauthenticated = False


def resolve(auth: Auth) -> TokenVerifier | None:
    """A server's ``auth`` argument as a verifier (or ``None``: requests are not checked, said
    once in the log, since a checkpoint request makes the trainer do real work)."""
    global _said_unauthenticated  # noqa: PLW0603 (once per process: a drill runs many servers)
    verifier = from_environment() if isinstance(auth, FromEnvironment) else auth
    if verifier is None and not _said_unauthenticated:
        _said_unauthenticated = True
        log.warning(
            "checkpoint requests are not authenticated: anyone who reaches this port can start "
            "a save (%s: token verifies reclaimd's identity)", ANNOTATION,
        )  # fmt: skip
    elif verifier is not None:
        verifier.prefetch()
    return verifier
