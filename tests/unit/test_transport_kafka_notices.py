"""Kafka notices consumer (handlers/kafka_notices/transport.py): how it leaves the group. The
consumer is a dynamic member (never ``group_instance_id``) with the configured session and
heartbeat, and a cancelled source stops it (LeaveGroup), bounded. Against the broker:
tests/e2e/test_kafka_notices.py."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pydantic import ValidationError

from reclaimd.handlers.kafka_notices import transport as kafka_notices
from reclaimd.handlers.kafka_notices.settings import KafkaNoticeSettings
from reclaimd.handlers.kafka_notices.transport import KafkaNoticeSource
from reclaimd.intake import Admission
from reclaimd.model import Notice, Windows

SETTINGS = KafkaNoticeSettings(enabled=True, bootstrap="127.0.0.1:1", topic="t", group_id="g")


class FakeConsumer:
    """start, getmany (nothing, after a poll's wait), stop: each recorded."""

    def __init__(self, stop_hangs: bool = False) -> None:
        self.calls: list[str] = []
        self.polling = asyncio.Event()
        self.stop_hangs = stop_hangs

    async def start(self) -> None:
        self.calls.append("start")

    async def getmany(self, **kw: Any) -> dict[Any, Any]:
        self.polling.set()
        await asyncio.sleep(0.05)
        return {}

    async def stop(self) -> None:
        self.calls.append("stop")
        if self.stop_hangs:
            await asyncio.Event().wait()


async def never(notice: Notice) -> Admission:
    raise AssertionError("no record was produced")


async def cancelled(src: KafkaNoticeSource, consumer: FakeConsumer) -> None:
    """Run ``src`` until ``consumer`` polls, then cancel it (the daemon's SIGTERM)."""
    run = asyncio.create_task(src.run())
    await asyncio.wait_for(consumer.polling.wait(), 10)
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run


async def test_a_cancelled_source_stops_its_consumer() -> None:
    consumer = FakeConsumer()
    src = KafkaNoticeSource(
        SETTINGS, admit=never, windows=Windows(), consumer_factory=lambda _: consumer
    )
    await cancelled(src, consumer)
    assert consumer.calls == ["start", "stop"]  # stop() is what sends LeaveGroup


async def test_a_stop_the_broker_never_answers_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kafka_notices, "STOP_TIMEOUT_S", 0.1)
    consumer = FakeConsumer(stop_hangs=True)
    src = KafkaNoticeSource(
        SETTINGS, admit=never, windows=Windows(), consumer_factory=lambda _: consumer
    )
    await asyncio.wait_for(cancelled(src, consumer), 5)
    assert consumer.calls == ["start", "stop"]


async def test_the_consumer_is_a_dynamic_member_with_the_configured_session() -> None:
    settings = KafkaNoticeSettings(
        enabled=True,
        bootstrap="127.0.0.1:1",
        topic="t",
        group_id="g",
        session_timeout_ms=30_000,
        heartbeat_interval_ms=2_000,
    )
    consumer = kafka_notices._default_consumer(settings)  # builds; connects only on start()
    assert consumer._group_instance_id is None  # a static member would never leave
    assert consumer._session_timeout_ms == 30_000
    assert consumer._heartbeat_interval_ms == 2_000
    assert consumer._rebalance_timeout_ms == 30_000
    assert consumer._enable_auto_commit is False


def test_the_defaults_detect_a_dead_member_in_10_s_and_hear_of_a_leave_in_1_s() -> None:
    s = KafkaNoticeSettings()
    assert (s.session_timeout_ms, s.heartbeat_interval_ms) == (10_000, 1_000)


def test_a_heartbeat_longer_than_a_third_of_the_session_is_refused() -> None:
    with pytest.raises(ValidationError, match="heartbeat_interval_ms"):
        KafkaNoticeSettings(session_timeout_ms=6_000, heartbeat_interval_ms=2_001)


class Recorded:
    """A partition's consumer as ``_partition`` uses it: commit, seek, pause, resume."""

    def __init__(self) -> None:
        self.commits: list[int] = []
        self.seeks: list[int] = []

    async def commit(self, offsets: dict[Any, int]) -> None:
        self.commits.extend(offsets.values())

    def seek(self, tp: Any, offset: int) -> None:
        self.seeks.append(offset)

    def pause(self, tp: Any) -> None:
        pass

    def resume(self, tp: Any) -> None:
        pass


class Record:
    def __init__(self, offset: int) -> None:
        self.offset, self.value = offset, str(offset).encode()


class TP:
    topic, partition = "t", 0


async def test_a_batch_is_admitted_at_once_and_committed_up_to_its_first_unsettled_record(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Five records of one partition: every admission is in flight before any ends (one by
    one, each a claim write, a storm's partition took a minute); the third is not settled,
    so the offset stops before it and the partition is read again from it."""
    src = KafkaNoticeSource(SETTINGS, admit=never, windows=Windows())
    started: list[int] = []
    all_started = asyncio.Event()

    async def handle(value: bytes, *, where: str = "") -> bool:
        started.append(int(value))
        if len(started) == 5:
            all_started.set()
        await asyncio.wait_for(all_started.wait(), 5)  # sequential admission never gets here
        return int(value) != 12

    monkeypatch.setattr(src, "handle", handle)
    consumer = Recorded()
    await src._partition(consumer, TP(), [Record(o) for o in range(10, 15)])
    assert sorted(started) == [10, 11, 12, 13, 14]
    assert consumer.commits == [12] and consumer.seeks == [12]
    for task in list(src._resumes):
        task.cancel()
