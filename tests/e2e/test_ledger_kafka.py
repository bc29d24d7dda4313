"""LedgerWriter against the real Kafka broker of the e2e stack."""

import json
import socket
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from reclaimd.ledger.event import SCHEMA, to_event
from reclaimd.ledger.labels import LabelPolicy
from reclaimd.ledger.writer import LedgerWriter
from reclaimd.model import (
    CheckpointScope,
    Gang,
    GangKey,
    Member,
    Notice,
    NoticeKind,
    RankAck,
    RestartWaste,
    Target,
    frozen_map,
)
from reclaimd.settings.ledger import LedgerWriterSettings
from reclaimd.waste import build_restart_waste

pytestmark = pytest.mark.e2e

T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def waste(notice_id: str, gang_name: str = "llm") -> RestartWaste:
    n = Notice(
        id=notice_id,
        source="aws.sqs",
        kind=NoticeKind.SPOT_INTERRUPTION,
        target=Target(instance_id="i-0abc"),
        issued_at=T0,
        deadline=T0 + timedelta(seconds=120),
        received_at=T0 + timedelta(seconds=1),
        attributes=frozen_map({"region": "us-east-1", "zone": "us-east-1a"}),
    )
    members = tuple(
        Member(
            namespace="team-a",
            name=f"{gang_name}-{i}",
            uid=f"u{i}",
            node="node-1",
            gpus=8,
            checkpoint_url="http://10.0.0.1/c",
            last_checkpoint=T0 - timedelta(minutes=10),
        )
        for i in range(2)
    )
    g = Gang(
        GangKey("jobset", "team-a", gang_name),
        members,
        CheckpointScope.RANK,
        frozen_map({"tenant": "acme", "purchase_option": "spot", "prompt": "secret"}),
    )
    acks = [RankAck(member=m, acked=True, durable=True, checkpoint_time=T0) for m in members]
    return build_restart_waste(
        n,
        g,
        acks,
        T0 + timedelta(seconds=90),
        deadline_met=True,
        traceparent=TRACEPARENT,
        cluster="e2e",
    )


async def new_topic(bootstrap: str) -> str:
    name = f"restart-waste-{uuid.uuid4().hex[:10]}"
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, num_partitions=1, replication_factor=1)])
    finally:
        await admin.close()
    return name


async def read_all(bootstrap: str, topic: str, expect: int) -> list[Any]:
    """Every committed record of the topic, read up to the end offset (so nothing past what we
    waited for hides). Transaction markers take offsets too: count records, not offsets."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        isolation_level="read_committed",
    )
    await consumer.start()
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        end = (await consumer.end_offsets([tp]))[tp]
        records: list[Any] = []
        while await consumer.position(tp) < end:
            batch = await consumer.getmany(tp, timeout_ms=1000)
            records.extend(batch.get(tp, []))
        assert len(records) == expect  # the whole topic, not just what we waited for
        return records
    finally:
        await consumer.stop()


def dead_port() -> str:
    # A port that was free a moment ago: nothing listens, connections are refused.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"127.0.0.1:{port}"


async def test_events_reach_kafka_with_json_key_and_headers(stack: Any, tmp_path: Path) -> None:
    topic = await new_topic(stack.kafka_bootstrap)
    a, b = waste("aws-1"), waste("aws-2", "vision")
    async with LedgerWriter(
        bootstrap_servers=stack.kafka_bootstrap, topic=topic, outbox_path=tmp_path / "o.sqlite"
    ) as writer:
        await writer.record(a)
        await writer.record(b)
        await writer.record(a)  # a replay of the same event: one record only
        assert await writer.flush(60)
        assert writer.depth() == 0
    records = await read_all(stack.kafka_bootstrap, topic, expect=2)
    by_id = {json.loads(r.value)["EventId"]: r for r in records}
    assert set(by_id) == {a.event_id, b.event_id}
    rec = by_id[a.event_id]
    assert json.loads(rec.value) == to_event(a, LabelPolicy())
    assert json.loads(rec.value)["Tags"] == {"purchase_option": "spot", "tenant": "acme"}
    assert rec.key == b"acme|jobset:team-a/llm"
    assert dict(rec.headers) == {
        "event_id": a.event_id.encode(),
        "traceparent": TRACEPARENT.encode(),
        "schema": SCHEMA.encode(),
    }


async def test_replay_after_publish_is_still_one_record(stack: Any, tmp_path: Path) -> None:
    topic = await new_topic(stack.kafka_bootstrap)
    w = waste("aws-replay")
    path = tmp_path / "o.sqlite"
    async with LedgerWriter(
        bootstrap_servers=stack.kafka_bootstrap, topic=topic, outbox_path=path
    ) as writer:
        await writer.record(w)
        assert await writer.flush(60)
        await writer.record(w)  # already sent: the outbox still knows the id
        assert await writer.flush(60)
    assert len(await read_all(stack.kafka_bootstrap, topic, expect=1)) == 1


async def test_events_recorded_while_kafka_is_unreachable_are_delivered_later(
    stack: Any, tmp_path: Path
) -> None:
    topic = await new_topic(stack.kafka_bootstrap)
    path = tmp_path / "o.sqlite"
    events = [waste(f"aws-outage-{i}") for i in range(3)]
    down = LedgerWriter(
        bootstrap_servers=dead_port(),
        topic=topic,
        outbox_path=path,
        tuning=LedgerWriterSettings(backoff_initial_s=0.05, backoff_max_s=0.2),
    )
    down.start()
    for e in events:
        await down.record(e)
    assert not await down.flush(1.0)
    assert down.depth() == 3
    assert down.published == 0
    await down.close()

    # A new writer on the same outbox file, pointed at the real broker.
    async with LedgerWriter(
        bootstrap_servers=stack.kafka_bootstrap, topic=topic, outbox_path=path
    ) as up:
        assert up.depth() == 3
        assert await up.flush(60)
        assert up.published == 3
    records = await read_all(stack.kafka_bootstrap, topic, expect=3)
    assert [json.loads(r.value)["EventId"] for r in records] == [e.event_id for e in events]
