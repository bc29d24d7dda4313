"""The SDK's check of reclaimd's identity (``reclaimd_trainer.auth``): tokens signed here with
keys a real loopback JWKS server publishes (fetched over HTTP as in a pod), and the SDK's two
servers refusing what does not verify with 401 and no save. Tokens the real API server issues
are tests/e2e/test_checkpoint_identity.py's."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from jwt.algorithms import ECAlgorithm, RSAAlgorithm

from reclaimd_trainer import CheckpointResult, Signal
from reclaimd_trainer.auth import (
    AUDIENCE,
    ApiServerJwks,
    TokenVerifier,
    Unauthorized,
    from_environment,
)
from reclaimd_trainer.server import CheckpointServer
from reclaimd_trainer.times import rfc3339, utcnow

RECLAIMD = "system:serviceaccount:reclaimd:reclaimd"


class Jwks:
    """A JWKS on loopback, as the API server serves ``/openid/v1/jwks``; counts GETs."""

    def __init__(self) -> None:
        self.keys: list[dict[str, Any]] = []
        self.gets = 0
        self.seen_auth: list[str | None] = []
        jwks = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                return

            def do_GET(self) -> None:
                jwks.gets += 1
                jwks.seen_auth.append(self.headers.get("Authorization"))
                body = json.dumps({"keys": jwks.keys}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/openid/v1/jwks"

    def publish(self, kid: str, key: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey) -> None:
        if isinstance(key, rsa.RSAPrivateKey):
            jwk = RSAAlgorithm.to_jwk(key.public_key(), as_dict=True)
            jwk.update(alg="RS256")
        else:
            jwk = ECAlgorithm.to_jwk(key.public_key(), as_dict=True)
            jwk.update(alg="ES256")
        self.keys.append({**jwk, "kid": kid, "use": "sig"})


def rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def token(
    key: Any,
    kid: str,
    *,
    sub: str = RECLAIMD,
    aud: str = AUDIENCE,
    lifetime_s: int = 600,
    alg: str = "RS256",
    **claims: Any,
) -> str:
    now = int(time.time())
    body = {"iss": "https://kubernetes.default.svc.cluster.local", "sub": sub, "aud": [aud],
            "iat": now, "nbf": now, "exp": now + lifetime_s, **claims}  # fmt: skip
    return jwt.encode(body, key, algorithm=alg, headers={"kid": kid})


@pytest.fixture
def jwks() -> Iterator[Jwks]:
    served = Jwks()
    yield served
    served.server.shutdown()
    served.server.server_close()


def refused(verifier: TokenVerifier, header: str | None) -> str:
    with pytest.raises(Unauthorized) as e:
        verifier.verify(header)
    return str(e.value)


def test_a_good_token_verifies_and_the_keys_are_fetched_once(jwks: Jwks, tmp_path: Any) -> None:
    key = rsa_key()
    jwks.publish("k1", key)
    own = tmp_path / "token"
    own.write_text("the-rank's-own-sa-token\n")
    verifier = TokenVerifier(ApiServerJwks(jwks.url, token_file=own), subject=RECLAIMD)
    for _ in range(3):
        claims = verifier.verify(f"Bearer {token(key, 'k1')}")
        assert claims["sub"] == RECLAIMD
    assert jwks.gets == verifier.fetches == 1
    # the fetch is made as the pod: its own ServiceAccount token
    assert jwks.seen_auth == ["Bearer the-rank's-own-sa-token"]


def test_an_unknown_key_id_refetches_once_and_a_rotated_key_verifies(jwks: Jwks) -> None:
    old, new = rsa_key(), rsa_key()
    jwks.publish("old", old)
    now = [time.time()]
    verifier = TokenVerifier(
        ApiServerJwks(jwks.url), subject=RECLAIMD, refetch_after_s=30, min_refetch_s=1,
        clock=lambda: now[0],
    )  # fmt: skip
    verifier.verify(f"Bearer {token(old, 'old')}")
    assert jwks.gets == 1
    jwks.publish("new", new)  # the issuer rotates: a token names a key not fetched yet
    now[0] += 1
    verifier.verify(f"Bearer {token(new, 'new')}")
    assert jwks.gets == 2
    verifier.verify(f"Bearer {token(old, 'old')}")  # both published: no fetch
    verifier.verify(f"Bearer {token(new, 'new')}")
    assert jwks.gets == 2
    # An id nobody publishes: refused. The same id again within refetch_after_s, or any id
    # within min_refetch_s of a fetch, fetches nothing: forged ids do not hammer the issuer.
    now[0] += 1
    for _ in range(5):
        assert "does not publish" in refused(verifier, f"Bearer {token(new, 'forged-1')}")
    assert jwks.gets == 3
    assert "does not publish" in refused(verifier, f"Bearer {token(new, 'forged-2')}")
    assert jwks.gets == 3  # within a second of the last fetch
    now[0] += 1
    refused(verifier, f"Bearer {token(new, 'forged-2')}")
    refused(verifier, f"Bearer {token(new, 'forged-1')}")  # tried 2 s ago
    assert jwks.gets == 4
    now[0] += 30
    refused(verifier, f"Bearer {token(new, 'forged-1')}")
    assert jwks.gets == 5


def test_what_is_refused(jwks: Jwks) -> None:
    key, other = rsa_key(), rsa_key()
    jwks.publish("k1", key)
    now = [time.time()]
    verifier = TokenVerifier(ApiServerJwks(jwks.url), subject=RECLAIMD, clock=lambda: now[0])
    assert refused(verifier, None) == "no bearer token"
    assert "not a bearer token" in refused(verifier, f"Basic {token(key, 'k1')}")
    assert "not a JWT" in refused(verifier, "Bearer not.a.jwt")
    assert "not for reclaimd.io/checkpoint" in refused(
        verifier, f"Bearer {token(key, 'k1', aud='https://kubernetes.default.svc')}"
    )
    assert "is not reclaimd's" in refused(
        verifier, f"Bearer {token(key, 'k1', sub='system:serviceaccount:team-a:default')}"
    )
    # signed by another key under the published key's id
    assert "signature does not verify" in refused(verifier, f"Bearer {token(other, 'k1')}")
    # a good token's claims changed, the signature kept
    head, _, sig = token(key, "k1").split(".")
    forged = jwt.utils.base64url_encode(
        json.dumps({"sub": RECLAIMD, "aud": [AUDIENCE], "exp": int(now[0]) + 9999}).encode()
    ).decode()
    assert "signature does not verify" in refused(verifier, f"Bearer {head}.{forged}.{sig}")
    # no asymmetric signature at all
    assert "not accepted" in refused(
        verifier, f"Bearer {jwt.encode({'sub': RECLAIMD}, 'k' * 32, algorithm='HS256')}"
    )
    assert "not accepted" in refused(
        verifier, f"Bearer {jwt.encode({'sub': RECLAIMD}, None, algorithm='none')}"
    )
    good = f"Bearer {token(key, 'k1', lifetime_s=600)}"
    verifier.verify(good)
    now[0] += 600 + 31  # past exp and the 30 s leeway
    assert refused(verifier, good) == "token expired"


def test_ecdsa_keys_verify_too(jwks: Jwks) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    jwks.publish("ec", key)
    verifier = TokenVerifier(ApiServerJwks(jwks.url), subject=RECLAIMD)
    assert verifier.verify(f"Bearer {token(key, 'ec', alg='ES256')}")["sub"] == RECLAIMD


def test_issuer_keys_that_cannot_be_fetched_refuse_with_one_line() -> None:
    verifier = TokenVerifier(ApiServerJwks("http://127.0.0.1:9/openid/v1/jwks", timeout_s=2))
    key = rsa_key()
    assert refused(verifier, f"Bearer {token(key, 'k1')}").startswith("issuer keys unavailable")


def test_from_environment_reads_the_annotation_through_the_downward_api(jwks: Jwks) -> None:
    assert from_environment({}) is None
    assert from_environment({"RECLAIMD_CHECKPOINT_AUTH": "none"}) is None
    with pytest.raises(ValueError, match="must be token or none"):
        from_environment({"RECLAIMD_CHECKPOINT_AUTH": "yes"})
    with pytest.raises(ValueError, match="not in a cluster"):
        from_environment({"RECLAIMD_CHECKPOINT_AUTH": "token"})
    with pytest.raises(ValueError, match="is not a ServiceAccount"):
        from_environment({"RECLAIMD_CHECKPOINT_AUTH": "token", "RECLAIMD_JWKS_URL": jwks.url,
                          "RECLAIMD_CHECKPOINT_SUBJECT": "reclaimd"})  # fmt: skip
    verifier = from_environment(
        {"RECLAIMD_CHECKPOINT_AUTH": "Token", "KUBERNETES_SERVICE_HOST": "10.96.0.1",
         "KUBERNETES_SERVICE_PORT": "443",
         "RECLAIMD_CHECKPOINT_SUBJECT": "system:serviceaccount:ops:reclaimd"}
    )  # fmt: skip
    assert verifier is not None and verifier.subject == "system:serviceaccount:ops:reclaimd"
    assert isinstance(verifier._keys_source, ApiServerJwks)
    assert verifier._keys_source.url == "https://10.96.0.1:443/openid/v1/jwks"


# --- the servers: 401 and no save ---------------------------------------------------------


def post(url: str, body: dict[str, Any], auth: str | None) -> tuple[int, dict[str, Any]]:
    headers = {"Content-Type": "application/json"}
    if auth is not None:
        headers["Authorization"] = auth
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def get(url: str, auth: str | None) -> int:
    req = urllib.request.Request(url, headers={"Authorization": auth} if auth else {})
    try:
        with urllib.request.urlopen(req, timeout=10) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as e:
        return e.code


def test_signal_refuses_what_does_not_verify_and_starts_no_save(jwks: Jwks) -> None:
    key, other = rsa_key(), rsa_key()
    jwks.publish("k1", key)
    verifier = TokenVerifier(ApiServerJwks(jwks.url), subject=RECLAIMD)
    body = {"notice_id": "n-1", "deadline": rfc3339(utcnow() + timedelta(seconds=30))}
    with Signal(host="127.0.0.1", port=0, auth=verifier) as signal:
        bad = [None, f"Bearer {token(other, 'k1')}", f"Bearer {token(key, 'k1', aud='x')}"]
        for auth in bad:
            status, doc = post(signal.url, body, auth)
            assert status == 401 and doc["error"].startswith("unauthorized: "), doc
            assert get(signal.url + "/incarnation", auth) == 401
            assert get(signal.url + "/status/n-1", auth) == 401
        assert not signal.requested and not signal.requests
        assert signal.refused == 9

        def answer() -> None:
            signal.wait(10)
            signal.ack(CheckpointResult(utcnow(), step=3, durable=True))

        threading.Thread(target=answer).start()
        good = f"Bearer {token(key, 'k1')}"
        status, doc = post(signal.url, body, good)
        assert status == 200 and doc["step"] == 3
        assert get(signal.url + "/incarnation", good) == 200


async def test_checkpoint_server_refuses_what_does_not_verify_and_starts_no_save(
    jwks: Jwks,
) -> None:
    import asyncio

    key, other = rsa_key(), rsa_key()
    jwks.publish("k1", key)
    verifier = TokenVerifier(ApiServerJwks(jwks.url), subject=RECLAIMD)
    saves: list[str] = []

    async def on_checkpoint(req: Any) -> CheckpointResult:
        saves.append(req.notice_id)
        return CheckpointResult(utcnow(), step=5, durable=True)

    body = {"notice_id": "n-2", "deadline": rfc3339(utcnow() + timedelta(seconds=30))}
    async with CheckpointServer(on_checkpoint, host="127.0.0.1", port=0, auth=verifier) as s:
        for auth in (None, f"Bearer {token(other, 'k1')}",
                     f"Bearer {token(key, 'k1', sub='system:serviceaccount:x:y')}"):  # fmt: skip
            status, doc = await asyncio.to_thread(post, s.url, body, auth)
            assert status == 401 and "unauthorized" in doc["error"], doc
            assert await asyncio.to_thread(get, s.url + "/status/n-2", auth) == 401
        assert saves == [] and s.save_count == 0 and not s.requests and s.refused == 6
        status, doc = await asyncio.to_thread(post, s.url, body, f"Bearer {token(key, 'k1')}")
        assert status == 200 and doc["step"] == 5 and saves == ["n-2"]
