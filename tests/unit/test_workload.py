"""The workload-side helper: a real ``CheckpointServer`` on loopback, spoken to over HTTP."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp
import pytest

from reclaimd.model import rfc3339, utcnow
from reclaimd_trainer.server import (
    CheckpointRequest,
    CheckpointResult,
    CheckpointServer,
    upload_checkpoint,
)

T0 = datetime(2026, 11, 30, 1, 0, 0, tzinfo=UTC)
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


def body(notice_id: str = "ec2-abc", **extra: Any) -> dict[str, Any]:
    return {
        "notice_id": notice_id,
        "reason": "spot_interruption",
        "deadline": rfc3339(utcnow() + timedelta(seconds=90)),
        "notice_deadline": rfc3339(utcnow() + timedelta(seconds=120)),
        "gang": "jobset:team-a/llama",
        "rank": 3,
        "namespace": "team-a",
        "pod": "llama-3",
        **extra,
    }


class Gated:
    """A trainer whose save finishes when the test says so; counts its calls."""

    def __init__(self, *, fail: bool = False) -> None:
        self.release = asyncio.Event()
        self.calls = 0
        self.cancelled = False
        self.fail = fail

    async def __call__(self, req: CheckpointRequest) -> CheckpointResult:
        self.calls += 1
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        if self.fail:
            raise OSError("No space left on device")
        return CheckpointResult(checkpoint_time=T0, step=42, uri="s3://ckpt/42", durable=True)


def server_for(save: Gated, *, sync_window_s: float = 1.0) -> CheckpointServer:
    return CheckpointServer(save, host="127.0.0.1", port=0, sync_window_s=sync_window_s)


async def post(
    session: aiohttp.ClientSession, url: str, payload: Any, **headers: str
) -> tuple[int, Any, str | None]:
    async with session.post(url, json=payload, headers=headers) as resp:
        return resp.status, await resp.json(), resp.headers.get("Location")


async def get(session: aiohttp.ClientSession, url: str) -> tuple[int, Any]:
    async with session.get(url) as resp:
        return resp.status, await resp.json()


def status_url(server: CheckpointServer, location: str | None) -> str:
    assert location is not None
    return f"http://127.0.0.1:{server.port}{location}"


async def test_a_quick_save_answers_200(session: aiohttp.ClientSession) -> None:
    save = Gated()
    save.release.set()
    async with server_for(save) as server:
        assert server.port != 0
        assert server.url == f"http://127.0.0.1:{server.port}/checkpoint"
        status, reply, _ = await post(session, server.url, body(), traceparent=TRACEPARENT)
        assert status == 200
        assert reply == {
            "checkpoint_time": "2026-11-30T01:00:00Z",
            "step": 42,
            "uri": "s3://ckpt/42",
            "durable": True,
        }
        (req,) = server.requests
        assert (req.notice_id, req.reason, req.gang, req.rank, req.namespace, req.pod) == (
            "ec2-abc",
            "spot_interruption",
            "jobset:team-a/llama",
            3,
            "team-a",
            "llama-3",
        )
        assert req.traceparent == TRACEPARENT
        assert req.notice_deadline is not None and req.notice_deadline > req.deadline
        assert server.result_of("ec2-abc") == CheckpointResult(
            checkpoint_time=T0, step=42, uri="s3://ckpt/42", durable=True
        )


async def test_a_long_save_answers_202_and_its_status_url(session: aiohttp.ClientSession) -> None:
    save = Gated()
    async with server_for(save, sync_window_s=0.0) as server:
        status, reply, location = await post(session, server.url, body("gce-1/x"))
        assert status == 202
        assert location == "/checkpoint/status/gce-1%2Fx"
        assert reply == {"status": "saving", "status_url": location}
        poll = status_url(server, location)
        assert (await get(session, poll))[0] == 202
        save.release.set()
        await asyncio.sleep(0)  # let the save finish
        assert "gce-1/x" not in server.answered  # nothing answered done yet
        status, reply = await get(session, poll)
        assert status == 200 and reply["step"] == 42
        assert save.calls == 1
        first = server.answered["gce-1/x"]
        assert (await get(session, poll))[0] == 200
        assert server.answered["gce-1/x"] == first  # the first answer is the one kept


async def test_duplicate_posts_share_one_save(session: aiohttp.ClientSession) -> None:
    save = Gated()
    async with server_for(save, sync_window_s=0.0) as server:
        first, second = await asyncio.gather(
            post(session, server.url, body()), post(session, server.url, body())
        )
        assert first[0] == second[0] == 202
        assert first[2] == second[2]
        save.release.set()
        await asyncio.sleep(0)
        done = [await post(session, server.url, body()) for _ in range(2)]
        assert [d[0] for d in done] == [200, 200]
        assert done[0][1] == done[1][1]
        assert save.calls == 1 and server.save_count == 1
        assert len(server.requests) == 4
        # Another notice is another save.
        await post(session, server.url, body("ec2-def"))
        assert save.calls == 2


async def test_a_failed_save_answers_500_every_time(session: aiohttp.ClientSession) -> None:
    save = Gated(fail=True)
    save.release.set()
    async with server_for(save) as server:
        for _ in range(2):
            status, reply, _ = await post(session, server.url, body())
            assert status == 500
            assert reply["error"] == "checkpoint save failed: OSError: No space left on device"
        assert save.calls == 1
        assert server.result_of("ec2-abc") is None


async def test_a_save_returning_the_wrong_type_is_a_500(session: aiohttp.ClientSession) -> None:
    async def sloppy(req: CheckpointRequest) -> Any:
        return {"checkpoint_time": "2026-11-30T01:00:00Z"}

    async with CheckpointServer(sloppy, host="127.0.0.1", port=0) as server:
        status, reply, _ = await post(session, server.url, body())
        assert status == 500 and "not CheckpointResult" in reply["error"]


@pytest.mark.parametrize(
    ("payload", "says"),
    [
        ({**body(), "notice_id": ""}, "notice_id is missing"),
        ({k: v for k, v in body().items() if k != "deadline"}, "deadline is missing"),
        (body(deadline="soon"), "not an RFC 3339 time"),
        (body(rank="3"), "rank is not"),
        (body(rank=-1), "rank is not"),
        (body(pod=["a"]), "pod is not a string"),
        ([1, 2], "not a JSON object"),
    ],
)
async def test_bad_requests_answer_400_and_start_nothing(
    session: aiohttp.ClientSession, payload: Any, says: str
) -> None:
    save = Gated()
    async with server_for(save) as server:
        status, reply, _ = await post(session, server.url, payload)
        assert status == 400
        assert says in reply["error"] and "\n" not in reply["error"]
        assert save.calls == 0 and len(server.requests) == 0


async def test_a_body_that_is_not_json_answers_400(session: aiohttp.ClientSession) -> None:
    save = Gated()
    async with server_for(save) as server, session.post(server.url, data=b"{not json") as resp:
        assert resp.status == 400
        assert (await resp.json())["error"] == "request body is not JSON"


async def test_status_of_an_unknown_notice_is_404(session: aiohttp.ClientSession) -> None:
    async with server_for(Gated()) as server:
        status, _ = await get(session, server.url + "/status/nothing")
        assert status == 404


async def test_stop_cancels_a_running_save_and_closes_the_port(
    session: aiohttp.ClientSession,
) -> None:
    save = Gated()
    server = server_for(save, sync_window_s=0.0)
    await server.start()
    status, _, _ = await post(session, server.url, body())
    assert status == 202
    await server.stop()
    assert save.cancelled
    with pytest.raises(aiohttp.ClientConnectionError):
        await post(session, server.url, body())
    await server.stop()  # idempotent


async def test_start_twice_is_refused() -> None:
    async with server_for(Gated()) as server:
        with pytest.raises(RuntimeError, match="already started"):
            await server.start()


def test_the_path_must_be_a_path() -> None:
    with pytest.raises(ValueError, match="path"):
        CheckpointServer(Gated(), path="checkpoint")


def test_a_wildcard_host_announces_loopback() -> None:
    assert CheckpointServer(Gated(), port=9000).url == "http://127.0.0.1:9000/checkpoint"
    assert CheckpointServer(Gated(), host="::", port=9000).url == "http://[::1]:9000/checkpoint"


# --- stash, then upload -------------------------------------------------------------------


def request(deadline_in_s: float) -> CheckpointRequest:
    return CheckpointRequest(
        notice_id="ec2-abc", deadline=utcnow() + timedelta(seconds=deadline_in_s), pod="llama-3"
    )


class Store:
    def __init__(self, *, fail: bool = False, hang: bool = False) -> None:
        self.fail = fail
        self.hang = hang
        self.puts: list[tuple[str, bytes, datetime]] = []

    async def put(self, key: str, body: bytes, *, deadline: datetime) -> str:
        self.puts.append((key, body, deadline))
        if self.hang:
            await asyncio.Event().wait()
        if self.fail:
            raise ConnectionResetError("connection reset by peer")
        return f"s3://ckpt/{key}"


async def test_upload_that_finishes_is_durable() -> None:
    req = request(30)
    store = Store()
    got = await upload_checkpoint(
        req, b"state", store=store, key="checkpoints/team-a/llama/42", step=42, checkpoint_time=T0
    )
    assert got == CheckpointResult(
        checkpoint_time=T0, step=42, uri="s3://ckpt/checkpoints/team-a/llama/42", durable=True
    )
    ((key, sent, deadline),) = store.puts
    assert (key, sent) == ("checkpoints/team-a/llama/42", b"state")
    # The upload must end early enough for the answer to reach reclaimd.
    assert deadline == req.deadline - timedelta(seconds=0.5)


async def test_upload_that_fails_acks_the_stash_not_durable() -> None:
    got = await upload_checkpoint(
        request(30),
        b"state",
        store=Store(fail=True),
        key="k",
        step=42,
        checkpoint_time=T0,
        stash_uri="file:///stash/42",
    )
    assert got == CheckpointResult(
        checkpoint_time=T0, step=42, uri="file:///stash/42", durable=False
    )


async def test_upload_that_hangs_is_abandoned_at_the_deadline() -> None:
    req = request(0.8)
    got = await upload_checkpoint(
        req, b"state", store=Store(hang=True), key="k", stash_uri="file:///stash/1"
    )
    assert not got.durable and got.uri == "file:///stash/1"
    # Abandoned by the deadline, so the ack can still be sent before reclaimd stops waiting.
    assert utcnow() < req.deadline + timedelta(seconds=1.5)
