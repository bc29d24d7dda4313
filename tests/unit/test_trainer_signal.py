"""The trainer SDK's synchronous facade (``reclaimd_trainer.Signal``) over real loopback HTTP,
and against reclaimd's own signaller (``reclaimd.checkpoint.signal_gang``)."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import aiohttp
import pytest
from trainer_helpers import jobset_gang, spot_notice

from reclaimd import putbudget
from reclaimd.checkpoint import signal_gang
from reclaimd.model import Member, rfc3339, utcnow
from reclaimd.putbudget import Share, TenantPutBudgets
from reclaimd_trainer import CheckpointResult, Signal


@pytest.fixture
def signal() -> Iterator[Signal]:
    with Signal(host="127.0.0.1", port=0, sync_window_s=0.3) as s:
        yield s


def body(notice_id: str = "n-1", **extra: Any) -> dict[str, Any]:
    return {
        "notice_id": notice_id,
        "deadline": rfc3339(utcnow() + timedelta(seconds=30)),
        "rank": 0,
        **extra,
    }


def post(url: str, doc: dict[str, Any], headers: dict[str, str] | None = None) -> tuple[int, Any]:
    req = urllib.request.Request(
        url,
        data=json.dumps(doc).encode(),
        headers={"Content-Type": "application/json", **(headers or {})},
    )
    return _send(req)


def get(url: str, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    return _send(urllib.request.Request(url, headers=headers or {}))


def _send(req: urllib.request.Request) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def result(step: int = 7, durable: bool = True) -> CheckpointResult:
    return CheckpointResult(utcnow(), step=step, uri="s3://b/ckpt/", durable=durable)


def origin(signal: Signal) -> str:
    return signal.url.rsplit("/", 1)[0]


def test_unanswered_request_is_202_then_the_ack_is_200_on_the_status_url(signal: Signal) -> None:
    assert not signal.requested
    status, doc = post(signal.url, body())
    assert status == 202 and doc["status_url"] == "/checkpoint/status/n-1"
    assert signal.requested and signal.request is not None
    assert signal.request.notice_id == "n-1"
    assert get(origin(signal) + doc["status_url"])[0] == 202
    assert signal.ack(result()) == ["n-1"]
    assert not signal.requested
    status, doc = get(origin(signal) + "/checkpoint/status/n-1")
    assert (status, doc["step"], doc["durable"]) == (200, 7, True)
    # a repeat gets the same answer, and is not a second save
    assert post(signal.url, body())[1]["step"] == 7
    assert signal.ack_count == 1 and len(signal.requests) == 2


def test_an_ack_inside_the_window_answers_the_post_itself(signal: Signal) -> None:
    def loop() -> None:
        signal.wait(5)
        signal.ack(result(step=11))

    t = threading.Thread(target=loop)
    t.start()
    status, doc = post(signal.url, body())
    t.join()
    assert (status, doc["step"]) == (200, 11)
    assert "n-1" in signal.answered


def test_covers_answers_a_notice_not_yet_asked_at_once(signal: Signal) -> None:
    post(signal.url, body("n-1"))
    signal.ack(result(step=3), covers=["n-2"])
    start = time.monotonic()
    status, doc = post(signal.url, body("n-2"))
    assert (status, doc["step"]) == (200, 3)
    assert time.monotonic() - start < 0.25  # not held for the window: already answered
    assert not signal.requested


def test_fail_answers_500_and_keeps_answering_so(signal: Signal) -> None:
    post(signal.url, body())
    signal.fail("disk full\nsecond line")
    for _ in range(2):
        status, doc = post(signal.url, body())
        assert (status, doc["error"]) == (500, "disk full second line")


def test_bad_requests_are_400_and_never_requested(signal: Signal) -> None:
    assert post(signal.url, {"deadline": "x"})[0] == 400
    assert post(signal.url, body(put_budget={"qps": "fast", "burst": 1}))[0] == 400
    assert post(signal.url, body(), {putbudget.HEADER: "qps=;burst"})[0] == 400
    assert get(origin(signal) + "/checkpoint/status/nobody")[0] == 404
    assert not signal.requested


def test_the_put_budget_share_follows_the_request_and_its_polls() -> None:
    seen: list[Share | None] = []
    with Signal(host="127.0.0.1", port=0, sync_window_s=0.05, on_share=seen.append) as signal:
        post(signal.url, body(put_budget={"qps": 2.5, "burst": 2}))
        assert signal.put_budget == Share(2.5, 2)
        status_url = origin(signal) + "/checkpoint/status/n-1"
        get(status_url, {putbudget.HEADER: "qps=5.0;burst=3"})
        assert signal.put_budget == Share(5.0, 3)
        get(status_url, {putbudget.HEADER: "nonsense"})  # ignored on a poll: the share stands
        assert signal.put_budget == Share(5.0, 3)
        signal.ack(result())
        assert signal.put_budget is None
    assert seen == [Share(2.5, 2), Share(5.0, 3), None]


def member(i: int, url: str) -> Member:
    return Member(
        namespace="team-a",
        name=f"llama-{i}",
        uid=f"uid-{i}",
        node="gpu-node-1",
        gpus=8,
        rank=i,
        pod_ip="127.0.0.1",
        checkpoint_url=url,
    )


async def test_reclaimds_signaller_gets_every_ranks_ack_from_the_loop_thread() -> None:
    """reclaimd's real fan-out (signal_gang: POST, 202, polls with the share) against two
    Signals whose 'training loops' ack at a step boundary 0.8 s and 1.6 s after the ask."""
    now = utcnow()
    notice = spot_notice("trainer-sdk", now=now, node_name="gpu-node-1", unique=False)
    signals = [Signal(host="127.0.0.1", port=0).start() for _ in range(2)]
    loops = []
    for i, s in enumerate(signals):

        def loop(s: Signal = s, delay: float = 0.8 * (i + 1)) -> None:
            if s.wait(10) is not None:
                time.sleep(delay)
                s.ack(result(step=42))

        loops.append(threading.Thread(target=loop))
        loops[-1].start()
    try:
        gang = jobset_gang("llama", (member(i, s.url) for i, s in enumerate(signals)))
        async with aiohttp.ClientSession() as session:
            acks = await signal_gang(
                gang,
                notice,
                budget_deadline=now + timedelta(seconds=20),
                session=session,
                put_budgets=TenantPutBudgets(qps_per_tenant=4.0),
            )
    finally:
        for t in loops:
            t.join()
        for s in signals:
            s.stop()
    assert [(a.acked, a.durable, a.step) for a in acks] == [(True, True, 42)] * 2, acks
    assert all(0.7 < a.latency_s < 5 for a in acks), [a.latency_s for a in acks]
    # the shares reclaimd handed out, never above the tenant's 4/s in sum
    firsts = [s.requests[0].put_budget for s in signals]
    assert all(f is not None for f in firsts)
    assert sum(f.qps for f in firsts if f) <= 4.0
