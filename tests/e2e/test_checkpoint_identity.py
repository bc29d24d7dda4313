"""reclaimd proves itself to the ranks it asks, with tokens the local API server really issues
(TokenRequest) and keys it really publishes (``/openid/v1/jwks``, read by the trainer's own
ServiceAccount through the default ``system:service-account-issuer-discovery`` binding).

reclaimd's checkpoint session (``checkpoint.session`` with a token file) asks the SDK's two
servers through its own signaller: a request with no token, a token for another audience, one
of another ServiceAccount, an expired one and forged signatures are each answered 401 and start
no save; reclaimd's own token is accepted and the save acked. The expired case is a real token
seen by a verifier whose clock is 11 minutes ahead: the API server issues none shorter than 10
minutes, and waiting that long is no test.
"""

from __future__ import annotations

import asyncio
import base64
import json
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import jwt
import pytest
import yaml
from cryptography.hazmat.primitives.asymmetric import rsa
from stack import Stack
from trainer_helpers import jobset_gang, spot_notice

from reclaimd import checkpoint
from reclaimd.checkpoint import signal_gang
from reclaimd.cluster.apiserver import ApiServer
from reclaimd.model import Member, RankAck, utcnow
from reclaimd_trainer import CheckpointResult, Signal
from reclaimd_trainer.auth import AUDIENCE, ApiServerJwks, TokenVerifier
from reclaimd_trainer.server import CheckpointServer


@dataclass
class Cluster:
    namespace: str
    tokens: Path  # a directory of token files, one per case
    jwks: ApiServerJwks  # as the trainer reads it: its own token, the cluster CA
    api: ApiServer

    async def token(self, sa: str, audience: str | None = AUDIENCE) -> str:
        spec: dict[str, Any] = {"expirationSeconds": 600}
        if audience is not None:
            spec["audiences"] = [audience]
        done = await self.api.post(
            f"/api/v1/namespaces/{self.namespace}/serviceaccounts/{sa}/token",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec},
        )
        return str(done["status"]["token"])

    def file(self, name: str, token: str) -> Path:
        path = self.tokens / name
        path.write_text(token)
        return path

    @property
    def reclaimd(self) -> str:
        return f"system:serviceaccount:{self.namespace}:reclaimd"


def server_and_ca(kubeconfig: Path, into: Path) -> tuple[str, Path]:
    doc = yaml.safe_load(kubeconfig.read_text())
    context = next(c for c in doc["contexts"] if c["name"] == doc["current-context"])["context"]
    cluster = next(c for c in doc["clusters"] if c["name"] == context["cluster"])["cluster"]
    if "certificate-authority-data" in cluster:
        ca = into / "ca.crt"
        ca.write_bytes(base64.b64decode(cluster["certificate-authority-data"]))
    else:
        ca = (kubeconfig.parent / cluster["certificate-authority"]).resolve()
    return str(cluster["server"]).rstrip("/"), ca


@pytest.fixture
async def cluster(stack: Stack, api: ApiServer, tmp_path: Path) -> AsyncIterator[Cluster]:
    ns = f"ident-{uuid.uuid4().hex[:8]}"
    await api.post("/api/v1/namespaces", {"metadata": {"name": ns}})
    try:
        for sa in ("reclaimd", "intruder", "trainer"):
            await api.post(f"/api/v1/namespaces/{ns}/serviceaccounts", {"metadata": {"name": sa}})
        server, ca = server_and_ca(stack.kubeconfig, tmp_path)
        tokens = tmp_path / "tokens"
        tokens.mkdir()
        made = Cluster(ns, tokens, ApiServerJwks(f"{server}/openid/v1/jwks"), api)
        # The trainer reads the keys as a pod does: its own token (the API server's audience).
        own = made.file("trainer-own", await made.token("trainer", audience=None))
        made.jwks = ApiServerJwks(f"{server}/openid/v1/jwks", ca_file=ca, token_file=own)
        yield made
    finally:
        await api.delete(f"/api/v1/namespaces/{ns}")


async def ask(url: str, token_file: Path | None) -> RankAck:
    """reclaimd's signaller, on its checkpoint session with ``token_file`` (None: no token)."""
    now = utcnow()
    member = Member(namespace="team-a", name="ident-0", uid="u0", node="n", gpus=1, rank=0,
                    pod_ip="127.0.0.1", checkpoint_url=url)  # fmt: skip
    async with checkpoint.session(8, token_file) as session:
        (ack,) = await signal_gang(
            jobset_gang("ident", (member,)),
            spot_notice("ident", now=now),
            budget_deadline=now + timedelta(seconds=20),
            session=session,
        )
    return ack


def forged(good: str) -> dict[str, str]:
    """Two forgeries of a good token: signed by a key of ours under the issuer's key id, and
    its claims changed with the issuer's signature kept."""
    header = jwt.get_unverified_header(good)
    claims = jwt.decode(good, options={"verify_signature": False})
    mine = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    resigned = jwt.encode(claims, mine, algorithm="RS256", headers={"kid": header["kid"]})
    head, _, sig = good.split(".")
    longer = jwt.utils.base64url_encode(
        json.dumps({**claims, "exp": claims["exp"] + 86_400}).encode()
    ).decode()
    return {"forged-resigned": resigned, "forged-claims": f"{head}.{longer}.{sig}"}


async def refused_cases(c: Cluster) -> list[tuple[str, Path | None]]:
    """(why it is refused, the token file reclaimd's session sends; None: no token)."""
    good = await c.token("reclaimd")
    resigned, changed = forged(good).values()
    not_ours = "is not for reclaimd.io/checkpoint"
    return [
        ("no bearer token", None),
        (not_ours, c.file("aud", await c.token("reclaimd", audience="other.example/x"))),
        (not_ours, c.file("api-aud", await c.token("reclaimd", audience=None))),
        (f"'system:serviceaccount:{c.namespace}:intruder' is not reclaimd's",
         c.file("intruder", await c.token("intruder"))),
        ("signature does not verify", c.file("resigned", resigned)),
        ("signature does not verify", c.file("changed", changed)),
    ]  # fmt: skip


def assert_refused(why: str, ack: RankAck) -> None:
    """Not acked: a 401 from the rank, for that reason."""
    assert not ack.acked, (why, ack)
    assert "HTTP 401" in ack.error and "unauthorized: " in ack.error, (why, ack.error)
    assert why in ack.error, (why, ack.error)


def shifted_verifier(c: Cluster) -> tuple[TokenVerifier, Callable[[float], None]]:
    ahead = [0.0]

    def shift(seconds: float) -> None:
        ahead[0] = seconds

    return (
        TokenVerifier(c.jwks, subject=c.reclaimd, clock=lambda: time.time() + ahead[0]),
        shift,
    )


async def test_a_signal_rank_refuses_all_but_reclaimds_own_token(cluster: Cluster) -> None:
    verifier, shift = shifted_verifier(cluster)
    with Signal(host="127.0.0.1", port=0, auth=verifier) as signal:
        # fetched at start, as the trainer's ServiceAccount
        assert verifier.fetches == 1 and verifier.key_ids
        for why, token_file in await refused_cases(cluster):
            assert_refused(why, await ask(signal.url, token_file))
        own = cluster.file("reclaimd", await cluster.token("reclaimd"))
        shift(660)  # 11 minutes on: reclaimd's own token has expired
        assert_refused("expired", await ask(signal.url, own))
        shift(0)
        assert not signal.requests and not signal.requested and signal.refused == 7

        def loop() -> None:  # the training loop: saves when asked
            if signal.wait(20):
                signal.ack(CheckpointResult(utcnow(), step=11, uri="s3://b/k", durable=True))

        saver = threading.Thread(target=loop)
        saver.start()
        ack = await ask(signal.url, own)
        await asyncio.to_thread(saver.join, 20)
        assert ack.acked and ack.durable and ack.step == 11, ack
        assert len(signal.requests) == 1 and verifier.fetches == 1


async def test_a_checkpoint_server_rank_refuses_all_but_reclaimds_own_token(
    cluster: Cluster,
) -> None:
    verifier, shift = shifted_verifier(cluster)
    saves: list[str] = []

    async def on_checkpoint(req: Any) -> CheckpointResult:
        saves.append(req.notice_id)
        return CheckpointResult(utcnow(), step=4, uri="s3://b/k", durable=True)

    async with CheckpointServer(on_checkpoint, host="127.0.0.1", port=0, auth=verifier) as s:
        assert verifier.fetches == 1 and verifier.key_ids
        for why, token_file in await refused_cases(cluster):
            assert_refused(why, await ask(s.url, token_file))
        own = cluster.file("reclaimd", await cluster.token("reclaimd"))
        shift(660)
        assert_refused("expired", await ask(s.url, own))
        shift(0)
        assert saves == [] and s.save_count == 0 and not s.requests and s.refused == 7
        ack = await ask(s.url, own)
        assert ack.acked and ack.durable and ack.step == 4, ack
        assert len(saves) == 1


async def test_service_accounts_read_the_issuer_keys_by_default(cluster: Cluster) -> None:
    """What the SDK relies on, on this API server: every ServiceAccount may GET the JWKS (the
    default binding of system:service-account-issuer-discovery to system:serviceaccounts)."""
    binding = await cluster.api.get(
        "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/"
        "system:service-account-issuer-discovery"
    )
    assert binding["roleRef"]["name"] == "system:service-account-issuer-discovery"
    assert {"kind": "Group", "name": "system:serviceaccounts"} in [
        {"kind": s["kind"], "name": s["name"]} for s in binding["subjects"]
    ]
    doc = await asyncio.to_thread(cluster.jwks)
    assert doc["keys"] and all("kid" in k for k in doc["keys"])
