"""reclaimd's identity token (``reclaimd.identity``): read from its file, re-read when the
file changes and before the token held expires, and put on every request of the checkpoint
session (the POST, status polls, /incarnation) as a real aiohttp server receives it."""

from __future__ import annotations

import base64
import json
import logging
import os
from pathlib import Path

import pytest
from aiohttp import web

from reclaimd import checkpoint
from reclaimd.identity import TokenFile


def jwt_like(iat: float, exp: float, n: int = 0) -> str:
    """A JWT's shape (what the reader looks at: iat, exp); the signature is the rank's business."""

    def part(doc: object) -> str:
        return base64.urlsafe_b64encode(json.dumps(doc).encode()).decode().rstrip("=")

    return f"{part({'alg': 'RS256', 'kid': 'k'})}.{part({'iat': iat, 'exp': exp, 'n': n})}.sig"


def test_read_once_then_again_when_the_file_changes(tmp_path: Path) -> None:
    path = tmp_path / "token"
    now = [1_000.0]
    first, second = jwt_like(1_000, 1_600, 1), jwt_like(1_300, 1_900, 2)
    path.write_text(first + "\n")
    identity = TokenFile(path, clock=lambda: now[0])
    for _ in range(3):
        assert identity.token() == first
    assert identity.reads == 1
    # the kubelet swaps in a new token (a new file behind the ..data symlink)
    (tmp_path / "new").write_text(second)
    os.replace(tmp_path / "new", path)
    now[0] = 1_300
    assert identity.token() == second and identity.reads == 2


def test_read_again_at_80_percent_of_the_lifetime_even_if_the_file_looks_the_same(
    tmp_path: Path,
) -> None:
    path = tmp_path / "token"
    now = [1_000.0]
    path.write_text(jwt_like(1_000, 1_600))
    stat = path.stat()
    identity = TokenFile(path, clock=lambda: now[0])
    identity.token()
    now[0] = 1_479  # 80 % of 600 s is 1_480
    identity.token()
    assert identity.reads == 1
    # a change the stat cannot see (same inode, size and mtime): the expiry still forces a read
    renewed = jwt_like(1_470, 2_070)
    assert len(renewed) == len(jwt_like(1_000, 1_600))
    path.write_text(renewed)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    now[0] = 1_480
    assert identity.token() == renewed and identity.reads == 2


def test_no_token_without_a_readable_unexpired_one_said_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "token"
    now = [1_000.0]
    identity = TokenFile(path, clock=lambda: now[0])
    with caplog.at_level(logging.ERROR, logger="reclaimd.identity"):
        assert identity.token() is None
        assert identity.token() is None
    assert len(caplog.records) == 1 and "cannot read reclaimd's identity token" in caplog.text
    path.write_text("not a jwt")
    now[0] += 20
    assert identity.token() is None
    path.write_text(jwt_like(1_000, 1_600))
    assert identity.token() is not None
    path.unlink()  # the token held is still good until it expires
    assert identity.token() is not None
    now[0] = 1_601
    assert identity.token() is None


async def test_every_request_of_the_checkpoint_session_carries_it(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text(jwt_like(0, 4_000_000_000))
    seen: list[tuple[str, str | None]] = []

    async def record(request: web.Request) -> web.Response:
        seen.append((request.path, request.headers.get("Authorization")))
        return web.json_response({})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", record)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        async with checkpoint.session(8, path) as session:
            for method, where in [("POST", "/checkpoint"), ("GET", "/checkpoint/status/n"),
                                  ("GET", "/checkpoint/incarnation")]:  # fmt: skip
                async with session.request(method, f"http://127.0.0.1:{port}{where}") as r:
                    assert r.status == 200
        async with (
            checkpoint.session(8) as session,  # no file set: no header
            session.post(f"http://127.0.0.1:{port}/checkpoint") as r,
        ):
            assert r.status == 200
    finally:
        await runner.cleanup()
    bearer = f"Bearer {path.read_text()}"
    assert seen == [
        ("/checkpoint", bearer),
        ("/checkpoint/status/n", bearer),
        ("/checkpoint/incarnation", bearer),
        ("/checkpoint", None),
    ]
