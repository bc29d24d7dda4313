"""The checkpoint server hands reclaimd's PutObject share to the uploader: request, then polls."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import aiohttp
import pytest

from reclaimd.model import rfc3339, utcnow
from reclaimd.putbudget import HEADER, Share
from reclaimd_trainer.server import (
    CheckpointRequest,
    CheckpointResult,
    CheckpointServer,
    upload_parts,
)


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


def body(notice_id: str = "ec2-abc", **extra: Any) -> dict[str, Any]:
    return {
        "notice_id": notice_id,
        "reason": "spot_interruption",
        "deadline": rfc3339(utcnow() + timedelta(seconds=90)),
        "rank": 3,
        **extra,
    }


class Sink:
    """What the uploader was told, in order."""

    def __init__(self) -> None:
        self.got: list[Share | None] = []

    def set_put_budget(self, share: Share | None) -> None:
        self.got.append(share)


class Gated:
    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.seen: list[CheckpointRequest] = []

    async def __call__(self, req: CheckpointRequest) -> CheckpointResult:
        self.seen.append(req)
        await self.release.wait()
        return CheckpointResult(checkpoint_time=utcnow(), step=1, uri="s3://b/k", durable=True)


async def _status(session: aiohttp.ClientSession, url: str, **headers: str) -> int:
    async with session.get(url, headers=headers) as resp:
        return resp.status


async def test_share_from_the_request_then_every_poll_then_back_to_own(
    session: aiohttp.ClientSession,
) -> None:
    sink, save = Sink(), Gated()
    async with CheckpointServer(save, host="127.0.0.1", port=0, sync_window_s=0.05,
                                put_budget=sink) as server:
        first = {"qps": 1.0, "burst": 1}
        async with session.post(server.url, json=body(put_budget=first)) as resp:
            assert resp.status == 202
            status_url = server.url + "/status/ec2-abc"
        assert save.seen[0].put_budget == Share(1.0, 1)
        assert await _status(session, status_url, **{HEADER: "qps=2.5;burst=2"}) == 202
        assert await _status(session, status_url) == 202  # no header: the share stands
        assert await _status(session, status_url, **{HEADER: "qps=0;burst=0"}) == 202
        assert server.put_budget == Share(0.0, 0)
        save.release.set()
        await asyncio.sleep(0.05)
        assert await _status(session, status_url, **{HEADER: "qps=9;burst=9"}) == 200
    # The share after the save ended is not taken: the uploader is back on its own limit.
    assert sink.got == [Share(1.0, 1), Share(2.5, 2), Share(0.0, 0), None]


async def test_no_share_in_the_request_means_the_uploaders_own_limit(
    session: aiohttp.ClientSession,
) -> None:
    sink, save = Sink(), Gated()
    save.release.set()
    server = CheckpointServer(save, host="127.0.0.1", port=0, put_budget=sink)
    async with server, session.post(server.url, json=body()) as resp:
        assert resp.status == 200
    assert save.seen[0].put_budget is None
    assert sink.got == [None, None]


async def test_a_repeated_post_takes_the_header_over_the_stale_body(
    session: aiohttp.ClientSession,
) -> None:
    sink, save = Sink(), Gated()
    async with CheckpointServer(save, host="127.0.0.1", port=0, sync_window_s=0.05,
                                put_budget=sink) as server:
        doc = body(put_budget={"qps": 4.0, "burst": 4})
        async with session.post(server.url, json=doc) as resp:
            assert resp.status == 202
        async with session.post(server.url, json=doc, headers={HEADER: "qps=0.5;burst=1"}) as r:
            assert r.status == 202
        save.release.set()
    assert sink.got[:2] == [Share(4.0, 4), Share(0.5, 1)]
    assert server.save_count == 1


@pytest.mark.parametrize(
    ("extra", "headers"),
    [
        ({"put_budget": {"qps": "fast", "burst": 1}}, {}),
        ({"put_budget": {"qps": 1.0, "burst": -1}}, {}),
        ({"put_budget": [1, 1]}, {}),
        ({}, {HEADER: "qps=1"}),
        ({}, {HEADER: "qps=1;burst=x"}),
    ],
)
async def test_a_malformed_share_in_the_request_is_refused_with_one_line(
    session: aiohttp.ClientSession, extra: dict[str, Any], headers: dict[str, str]
) -> None:
    sink, save = Sink(), Gated()
    server = CheckpointServer(save, host="127.0.0.1", port=0, put_budget=sink)
    async with server, session.post(server.url, json=body(**extra), headers=headers) as resp:
        assert resp.status == 400
        error = (await resp.json())["error"]
    assert error and "\n" not in error
    assert save.seen == [] and sink.got == []


async def test_a_malformed_header_on_a_poll_leaves_the_save_alone(
    session: aiohttp.ClientSession,
) -> None:
    sink, save = Sink(), Gated()
    async with CheckpointServer(save, host="127.0.0.1", port=0, sync_window_s=0.05,
                                put_budget=sink) as server:
        async with session.post(server.url, json=body(put_budget={"qps": 3.0, "burst": 2})):
            pass
        status_url = server.url + "/status/ec2-abc"
        assert await _status(session, status_url, **{HEADER: "qps=;burst=;"}) == 202
        assert server.put_budget == Share(3.0, 2)
        save.release.set()
    assert sink.got == [Share(3.0, 2), None]


class Store:
    def __init__(self, fail_on: str = "") -> None:
        self.fail_on = fail_on
        self.stored: list[str] = []

    async def put(self, key: str, body: bytes, *, deadline: Any) -> str:
        await asyncio.sleep(0)
        if key == self.fail_on:
            raise RuntimeError("SlowDown, given up")
        self.stored.append(key)
        return f"s3://b/{key}"


async def test_parts_are_durable_only_when_all_are_stored() -> None:
    req = CheckpointRequest.from_json(body())
    parts = [(f"checkpoints/acme/run/part-{i}", b"x") for i in range(5)]
    store = Store()
    ok = await upload_parts(req, parts, store=store, uri="s3://b/checkpoints/acme/run/")
    assert ok.durable and ok.uri == "s3://b/checkpoints/acme/run/"
    assert sorted(store.stored) == sorted(k for k, _ in parts)
    bad = await upload_parts(
        req, parts, store=Store(fail_on=parts[2][0]), stash_uri="file:///dev/shm/x"
    )
    assert not bad.durable and bad.uri == "file:///dev/shm/x"
