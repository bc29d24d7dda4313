"""The SQS transport itself (handlers/sqs/transport.py) against moto: visibility is the lease.
While a claim is under way the heartbeat keeps the message from a peer; a source that stops
(the daemon cancels it on SIGTERM) while a claim hangs makes the message visible again, and a
peer's receive gets it at once instead of after the visibility timeout."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from stack import REPO_DIR

from chaos import stack as stackenv
from reclaimd.handlers.sqs.settings import SqsSettings
from reclaimd.handlers.sqs.transport import SqsSource
from reclaimd.intake import Admission
from reclaimd.model import Notice, Windows

FIXTURES = REPO_DIR.parent / "shared" / "fixtures"
SPOT = json.loads((FIXTURES / "aws" / "eventbridge-spot-interruption-warning.json").read_text())


class Queue:
    def __init__(self, client: Any, url: str, endpoint: str, region: str) -> None:
        self.client, self.url, self.endpoint, self.region = client, url, endpoint, region

    def send(self, instance: str) -> str:
        detail = dict(SPOT["detail"], **{"instance-id": instance})
        body = json.dumps(dict(SPOT, id=str(uuid.uuid4()), detail=detail))
        return str(self.client.send_message(QueueUrl=self.url, MessageBody=body)["MessageId"])

    def receive(self, wait_s: int = 1) -> list[dict[str, Any]]:
        """A peer replica's receive (default visibility: the queue's)."""
        reply = self.client.receive_message(
            QueueUrl=self.url, MaxNumberOfMessages=10, WaitTimeSeconds=wait_s
        )
        messages: list[dict[str, Any]] = reply.get("Messages", [])
        return messages

    def settings(self, **kw: Any) -> SqsSettings:
        return SqsSettings(
            enabled=True,
            queue_url=self.url,
            endpoint_url=self.endpoint,
            region=self.region,
            wait_time_s=1,
            receivers=1,
            **kw,
        )


@pytest.fixture
def queue(stack: Any) -> Iterator[Queue]:
    env = stackenv.load()
    env.export()
    region = env.values.get("AWS_DEFAULT_REGION", "us-east-1")
    client = boto3.client("sqs", endpoint_url=env.aws_endpoint, region_name=region)
    url = client.create_queue(QueueName=f"reclaimd-sqs-{uuid.uuid4().hex[:8]}")["QueueUrl"]
    try:
        yield Queue(client, url, env.aws_endpoint, region)
    finally:
        client.delete_queue(QueueUrl=url)


class Gated:
    """An ``admit`` whose claims wait on ``gate``."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.called = asyncio.Event()
        self.seen: list[Notice] = []

    async def __call__(self, notice: Notice) -> Admission:
        self.seen.append(notice)
        self.called.set()
        await self.gate.wait()
        return Admission.CLAIMED


async def until(cond: Any, timeout_s: float = 30) -> None:
    for _ in range(int(timeout_s / 0.05)):
        if cond():
            return
        await asyncio.sleep(0.05)
    raise TimeoutError("condition not reached")


async def cancelled(run: asyncio.Task[None]) -> None:
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run


async def test_a_stopping_source_hands_its_message_to_a_peer_at_once(queue: Queue) -> None:
    message_id = await asyncio.to_thread(queue.send, "i-0000000000000001a")
    admit = Gated()  # the claim hangs: the message is received and unsettled
    src = SqsSource(queue.client, queue.settings(), admit=admit, windows=Windows())
    run = asyncio.create_task(src.run())
    try:
        await asyncio.wait_for(admit.called.wait(), 30)
        assert await asyncio.to_thread(queue.receive) == []  # invisible while held
    finally:
        stopping = time.monotonic()
        await cancelled(run)
    stop_s = time.monotonic() - stopping
    assert src.counters.released == 1

    got: list[dict[str, Any]] = []
    while not got and time.monotonic() - stopping < 2 * src.settings.visibility_timeout_s:
        got = await asyncio.to_thread(queue.receive)
    back_s = time.monotonic() - stopping
    print(f"\nSQS hand-back: stop {stop_s:.2f} s, a peer received it {back_s:.2f} s after")
    assert [m["MessageId"] for m in got] == [message_id]
    # Without the hand-back it would be invisible for the rest of its 10 s.
    assert back_s < 5.0


async def test_the_heartbeat_keeps_a_slow_claim_from_a_peer(queue: Queue) -> None:
    await asyncio.to_thread(queue.send, "i-0000000000000002b")
    admit = Gated()
    src = SqsSource(
        queue.client, queue.settings(visibility_timeout_s=5), admit=admit, windows=Windows()
    )
    run = asyncio.create_task(src.run())
    try:
        await asyncio.wait_for(admit.called.wait(), 30)
        held_since = time.monotonic()
        while time.monotonic() - held_since < 8.0:  # past the 5 s visibility it received with
            assert await asyncio.to_thread(queue.receive) == []
        admit.gate.set()
        await until(lambda: src.counters.acked == 1)
        assert await asyncio.to_thread(queue.receive) == []  # deleted
    finally:
        await cancelled(run)
    assert src.counters.released == 0
    assert len(admit.seen) == 1
