"""A loopback S3 proxy that answers a share of PutObject with 503 SlowDown, and logs them all.

Used by the upload bench and its e2e test: every object request goes through to the real S3
(moto) unchanged, except that a PutObject may be answered ``503 SlowDown`` by the proxy itself,
as S3 does while it re-partitions a hot prefix. The proxy records the arrival time (this
machine's monotonic clock, shared by all its processes) and outcome of every PutObject, so a
caller can count what the tenant really sent, per second, at the server.

Which attempts fail is decided by a hash of (seed, key, attempt number of that key), not by
arrival order: the same storm fails the same attempts however its requests interleave.
``max_faults_per_key`` caps the faults one object gets (a test can then know every object ends
stored, whatever retry limit the client has).

Run: ``python -m chaos.faultproxy --upstream http://127.0.0.1:15000 --fault-share 0.1``.
It prints ``listening on <url>`` once ready. ``GET /_faultproxy/log`` returns the log as JSON;
``POST /_faultproxy/reset`` clears it.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import signal
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit

import aiohttp
from aiohttp import web

ADMIN = "/_faultproxy"
_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "transfer-encoding",
        "te",
        "trailer",
        "upgrade",
        "content-length",  # recomputed from the body actually sent
    }
)
SLOW_DOWN_BODY = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n'
    b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message>"
    b"<RequestId>faultproxy</RequestId></Error>"
)


@dataclass
class FaultPlan:
    share: float = 0.1
    seed: int = 1
    max_faults_per_key: int | None = None
    attempts: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    faults: dict[str, int] = field(default_factory=lambda: defaultdict(int))

    def __post_init__(self) -> None:
        if not 0.0 <= self.share < 1.0:
            raise ValueError("fault share must be in [0, 1)")
        if self.max_faults_per_key is not None and self.max_faults_per_key < 0:
            raise ValueError("max faults per key must be non-negative")

    def fails(self, key: str) -> bool:
        """Whether this attempt at ``key`` is answered 503 (counts the attempt)."""
        n = self.attempts[key]
        self.attempts[key] = n + 1
        if self.max_faults_per_key is not None and self.faults[key] >= self.max_faults_per_key:
            return False
        digest = hashlib.blake2b(f"{self.seed}|{key}|{n}".encode(), digest_size=8).digest()
        if int.from_bytes(digest, "big") / 2**64 >= self.share:
            return False
        self.faults[key] += 1
        return True


def object_key(method: str, path: str, query: str) -> str | None:
    """The ``bucket/key`` a path-style PutObject (or UploadPart) writes; None for others."""
    if method != "PUT":
        return None
    bucket, _, key = unquote(path.lstrip("/")).partition("/")
    if not bucket or not key:
        return None  # CreateBucket, bucket configuration
    if query and not ("partNumber=" in query and "uploadId=" in query):
        return None  # ?tagging, ?acl ... on an object: not a write of its data
    return f"{bucket}/{key}"


class FaultProxy:
    def __init__(self, upstream: str, plan: FaultPlan) -> None:
        parts = urlsplit(upstream)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"upstream must be an http(s) URL: {upstream[:80]!r}")
        self.upstream = f"{parts.scheme}://{parts.netloc}"
        self.plan = plan
        self.log: list[tuple[float, str, int]] = []  # (monotonic arrival, bucket/key, status)
        self._session: aiohttp.ClientSession | None = None

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_get(ADMIN + "/log", self._get_log)
        app.router.add_post(ADMIN + "/reset", self._reset)
        app.router.add_route("*", "/{tail:.*}", self._forward)
        app.on_startup.append(self._open)
        app.on_cleanup.append(self._close)
        return app

    async def _open(self, app: web.Application) -> None:
        connector = aiohttp.TCPConnector(limit=0)
        self._session = aiohttp.ClientSession(connector=connector, auto_decompress=False)

    async def _close(self, app: web.Application) -> None:
        if self._session is not None:
            await self._session.close()

    async def _get_log(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "puts": self.log,
                "fault_share": self.plan.share,
                "faults": sum(self.plan.faults.values()),
            }
        )

    async def _reset(self, request: web.Request) -> web.Response:
        self.log.clear()
        self.plan.attempts.clear()
        self.plan.faults.clear()
        return web.json_response({"ok": True})

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        arrived = time.monotonic()
        key = object_key(request.method, request.path, request.query_string)
        data = await request.read()
        # The bucket is left out of the decision: a run in a fresh bucket fails the same.
        if key is not None and self.plan.fails(key.partition("/")[2]):
            self.log.append((arrived, key, 503))
            return web.Response(
                status=503, body=SLOW_DOWN_BODY, content_type="application/xml"
            )
        assert self._session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP}
        async with self._session.request(
            request.method,
            self.upstream + request.path_qs,
            headers=headers,
            data=data,
            allow_redirects=False,
        ) as up:
            body = await up.read()
            out = {k: v for k, v in up.headers.items() if k.lower() not in _HOP_BY_HOP}
            if key is not None:
                self.log.append((arrived, key, up.status))
            return web.Response(status=up.status, body=body, headers=out)


async def _serve(args: argparse.Namespace) -> None:
    plan = FaultPlan(share=args.fault_share, seed=args.seed, max_faults_per_key=args.max_faults)
    proxy = FaultProxy(args.upstream, plan)
    runner = web.AppRunner(proxy.app(), access_log=None)
    await runner.setup()
    host, _, port = args.listen.rpartition(":")
    site = web.TCPSite(runner, host or "127.0.0.1", int(port or 0))
    await site.start()
    bound = runner.addresses[0]
    print(f"listening on http://{bound[0]}:{bound[1]}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m chaos.faultproxy", description=__doc__)
    parser.add_argument("--upstream", required=True, help="S3 endpoint, e.g. moto's URL")
    parser.add_argument("--listen", default="127.0.0.1:0", help="host:port (0: any free port)")
    parser.add_argument("--fault-share", type=float, default=0.1, help="PutObject answered 503")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--max-faults", type=int, default=None, help="per object, at most")
    args = parser.parse_args(argv)
    try:
        FaultPlan(share=args.fault_share, max_faults_per_key=args.max_faults)
        FaultProxy(args.upstream, FaultPlan())
    except ValueError as e:
        print(f"faultproxy: {e}", file=sys.stderr)
        return 2
    try:
        asyncio.run(_serve(args))
    except OSError as e:
        print(f"faultproxy: cannot listen on {args.listen}: {e.strerror or e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
