"""A replica is ready only while it can hear: real replicas (``reclaimd run``) on the stack whose
source cannot receive (a deleted SQS queue, a Pub/Sub subscription that does not exist, Kafka
notices on a topic that does not exist) answer ``/readyz`` with ``not ready: <source>`` and
``reclaimd_transport_deaf{transport=<source>} 1``, and are ready again once the queue,
subscription or topic is there."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from chaos import inject
from chaos import stack as stackenv
from chaos.harness import Harness, readyz, scrape
from chaos.ports import free_port
from chaos.process import DaemonProcess

pytestmark = pytest.mark.e2e

READY = (200, "ok")
# Deaf takes DEAF_AFTER_S (15 s) of failing receives; the cache and Lease come first.
DEAF_WITHIN_S = 90
# Mended, the source's next try (its backoff is capped at 30 s) hears.
MENDED_WITHIN_S = 90


@pytest.fixture
async def h() -> AsyncIterator[Harness]:
    async with Harness(stackenv.load()) as harness:
        yield harness


async def _until(port: int, expected: tuple[int, str], timeout_s: float) -> None:
    seen: tuple[int, str] = (0, "")
    for _ in range(int(timeout_s / 0.5)):
        seen = await asyncio.to_thread(readyz, port)
        if seen == expected:
            return
        await asyncio.sleep(0.5)
    raise TimeoutError(f"/readyz never said {expected} in {timeout_s}s; last {seen}")


async def _deaf(port: int) -> dict[str, float]:
    return {
        s.labels["transport"]: s.value
        for s in await scrape(port)
        if s.name == "reclaimd_transport_deaf"
    }


async def _start(h: Harness, **overrides: Any) -> tuple[DaemonProcess, int]:
    port = free_port()
    return await h.start_daemon(metrics_port=port, **overrides), port


async def test_a_deleted_queue_makes_the_replica_not_ready_until_it_is_back(h: Harness) -> None:
    daemon, port = await _start(h)
    await _until(port, READY, 90)
    assert await _deaf(port) == {"sqs": 0.0}
    await asyncio.to_thread(h.sqs.delete_queue, QueueUrl=h.queue_url)
    await _until(port, (503, "not ready: sqs"), DEAF_WITHIN_S)
    assert await _deaf(port) == {"sqs": 1.0}
    said = [
        line for line in daemon.log_path.read_text().splitlines() if "source cannot hear" in line
    ]
    assert len(said) == 1 and '"source":"sqs"' in said[0], said  # once, with why
    assert "The specified queue does not exist" in said[0]
    await asyncio.to_thread(h.create_queue)  # the same name: the same URL
    await _until(port, READY, MENDED_WITHIN_S)
    assert await _deaf(port) == {"sqs": 0.0}


async def test_a_missing_subscription_makes_the_replica_not_ready(h: Harness) -> None:
    name = f"reclaimd-missing-{h.run_id}"
    project = h.stack.values["PUBSUB_PROJECT_ID"]
    _, port = await _start(
        h,
        sqs={"enabled": False},
        pubsub={"enabled": True, "project": project, "subscription": name},
    )
    await _until(port, (503, "not ready: pubsub"), DEAF_WITHIN_S)
    assert await _deaf(port) == {"pubsub": 1.0}
    channel = await asyncio.to_thread(inject.PubSubChannel(project, name).create)
    try:
        await _until(port, READY, MENDED_WITHIN_S)
        assert await _deaf(port) == {"pubsub": 0.0}
    finally:
        await asyncio.to_thread(channel.delete)


async def test_kafka_notices_on_an_unknown_topic_make_the_replica_not_ready(h: Harness) -> None:
    topic = f"reclaimd.notices.missing-{h.run_id}"  # within reclaimd's ACLs, not created
    _, port = await _start(
        h,
        sqs={"enabled": False},
        kafka_notices={
            "enabled": True,
            "bootstrap": h.replica_kafka.bootstrap,
            "topic": topic,
            "group_id": f"reclaimd-{h.run_id}",
        },
    )
    await _until(port, (503, "not ready: kafka_notices"), DEAF_WITHIN_S)
    assert await _deaf(port) == {"kafka_notices": 1.0}
    await h.create_topics({topic: 1})
    await _until(port, READY, MENDED_WITHIN_S)
    assert await _deaf(port) == {"kafka_notices": 0.0}
