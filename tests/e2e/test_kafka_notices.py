"""The Kafka notices topic end to end: CloudEvents produced to a real broker, a real reclaimd
in a consumer group, kube-apiserver + kwok, fake trainers, the ledger topic; and the consumer
itself (handlers/kafka_notices/transport.py) against the broker: offsets committed only up to
the first record whose notice is not claimed, which is read again."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest

from chaos import inject
from chaos import stack as stackenv
from chaos.fleet import NodeSpec
from chaos.harness import Harness
from chaos.process import DaemonProcess
from reclaimd.handlers.kafka_notices import transport as kafka_notices
from reclaimd.handlers.kafka_notices.settings import KafkaNoticeSettings
from reclaimd.handlers.kafka_notices.transport import KafkaNoticeSource
from reclaimd.intake import Admission
from reclaimd.model import Notice, Windows, parse_time, utcnow

TAINT = "reclaimd.io/interruption"
WINDOW_S = 60.0


@pytest.fixture
async def h(stack: Any) -> AsyncIterator[Harness]:
    async with Harness(stackenv.load()) as harness:
        yield harness


def group(h: Harness) -> str:
    return f"reclaimd-{h.run_id}"


def kafka_config(h: Harness, topic: str) -> dict[str, Any]:
    return {
        "sqs": {"enabled": False},
        "kafka_notices": {
            "enabled": True,
            "bootstrap": h.replica_kafka.bootstrap,
            "topic": topic,
            "group_id": group(h),
        },
    }


def spot_event(node: NodeSpec, *, event_id: str | None = None) -> dict[str, Any]:
    return inject.cloudevent_notice(
        "spot_interruption",
        {"node_name": node.name, "provider_id": node.provider_id},
        event_id=event_id,
        deadline=utcnow() + timedelta(seconds=WINDOW_S),
    )


def admissions_logged(d: DaemonProcess, notice_id: str) -> list[str]:
    out = []
    for line in d.log_path.read_text(errors="replace").splitlines():
        if '"notice admitted"' in line:
            fields = json.loads(line)
            if fields.get("notice_id") == notice_id:
                out.append(fields["admission"])
    return out


async def _until(cond: Any, timeout_s: float = 30, what: str = "condition") -> None:
    for _ in range(int(timeout_s / 0.1)):
        if await cond():
            return
        await asyncio.sleep(0.1)
    raise TimeoutError(f"{what} not reached in {timeout_s}s")


async def committed_becomes(h: Harness, topic: str, offset: int, partition: int = 0) -> None:
    async def reached() -> bool:
        return await h.committed_offset(topic, group(h), partition) == offset

    await _until(reached, what=f"committed offset {offset}")


# --- reclaimd, as a process ----------------------------------------------------------------------


async def test_cloud_event_notice_runs_the_runbook_and_commits(h: Harness) -> None:
    topic = await h.notices_topic()
    nodes = [h.node_spec(i) for i in range(2)]
    await h.add_nodes(nodes)
    gang = await h.add_gang("kafka", [n.name for n in nodes])
    pods = [gang.pod_name(0), gang.pod_name(1)]
    d = await h.start_daemon(**kafka_config(h, topic))

    event = spot_event(nodes[0])
    notice = await h.send_kafka_notice(topic, event)
    assert notice.source == f"kafka:{inject.CLOUDEVENT_SOURCE}"
    events = await h.ledger_events(count=1, timeout_s=90, settle_s=2.0)
    assert len(events) == 1, events
    (ledger,) = events
    assert notice.deadline is not None

    claim = await h.wait_phase(nodes[0].name, "done")
    assert claim["notice_id"] == notice.id
    node = await h.core.read_node(nodes[0].name)
    assert node.spec.unschedulable is True
    assert any(t.key == TAINT for t in node.spec.taints or [])
    assert h.trainers.asked(notice.id) == {f"{h.namespace}/{p}" for p in pods}
    assert await h.pods_left(pods) == []
    assert ledger["x_NoticeId"] == notice.id
    assert ledger["x_DeadlineMet"] is True
    assert parse_time(ledger["ChargePeriodEnd"]) <= notice.deadline
    await committed_becomes(h, topic, 1)
    print(f"\nKafka notices timings: {json.dumps(await h.timings(notice))}")

    # A producer's retry: the same CloudEvent (source, id) again. Committed, no second event.
    again = await h.send_kafka_notice(topic, event)
    assert again.id == notice.id
    await committed_becomes(h, topic, 2)
    assert admissions_logged(d, notice.id) == ["claimed", "duplicate"]
    assert len(await h.ledger_events(count=2, timeout_s=3)) == 1


async def test_offset_is_committed_only_after_the_claim(h: Harness) -> None:
    """A reclaimd that cannot write the claim leaves the group's offset where it was; one
    that can, in the same group, then handles the record and commits it."""
    topic = await h.notices_topic()
    nodes = [h.node_spec(0)]
    await h.add_nodes(nodes)
    await h.add_gang("held", [nodes[0].name])
    readonly = await h.readonly_kubeconfig()
    d = await h.start_daemon(
        "readonly", kube={"kubeconfig": str(readonly)}, **kafka_config(h, topic)
    )
    notice = await h.send_kafka_notice(topic, spot_event(nodes[0]))

    async def retried_twice() -> bool:
        return admissions_logged(d, notice.id)[:2] == ["retry", "retry"]

    await _until(retried_twice, what="two failed claims")  # read, sought back, read again
    assert await h.claim_of(nodes[0].name) is None
    assert await h.committed_offset(topic, group(h)) is None  # never committed
    assert await h.ledger_events(count=1, timeout_s=1) == []
    await d.stop()

    writer = await h.start_daemon("writer", **kafka_config(h, topic))
    events = await h.ledger_events(count=1, timeout_s=90)
    assert [e["x_NoticeId"] for e in events] == [notice.id]
    claim = await h.wait_phase(nodes[0].name, "done")
    assert claim["holder"] == h.holder("writer")
    await committed_becomes(h, topic, 1)
    assert admissions_logged(writer, notice.id) == ["claimed"]


# --- the consumer itself, against the broker ---------------------------------------------------


class Scripted:
    """An ``admit`` answering from a script; ``hold`` blocks one call until released."""

    def __init__(self, *answers: Admission) -> None:
        self.answers = list(answers)
        self.seen: list[Notice] = []
        self.hold_at: int | None = None
        self.held = asyncio.Event()
        self.release = asyncio.Event()

    async def __call__(self, notice: Notice) -> Admission:
        self.seen.append(notice)
        if self.hold_at == len(self.seen):
            self.held.set()
            await self.release.wait()
        return self.answers.pop(0) if self.answers else Admission.CLAIMED


async def test_consumer_commits_up_to_the_unclaimed_record_and_rereads_it(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kafka_notices, "RETRY_PAUSE_S", 0.2)
    topic = await h.notices_topic()
    node = h.node_spec(0)
    other_type = inject.cloudevent_notice("spot_interruption", {"node_name": node.name})
    other_type["type"] = "com.example.unrelated.v1"
    await inject.produce_kafka(h.stack.kafka, topic, b"{not json")  # offset 0: unreadable
    await inject.produce_kafka(h.stack.kafka, topic, spot_event(node))  # 1: the notice
    await inject.produce_kafka(h.stack.kafka, topic, other_type)  # 2: not a notice

    admit = Scripted(Admission.RETRY, Admission.RETRY, Admission.CLAIMED)
    admit.hold_at = 2  # hold the second attempt: the offset is observed mid-retry
    settings = KafkaNoticeSettings(
        enabled=True, bootstrap=h.stack.kafka, topic=topic, group_id=group(h)
    )
    src = KafkaNoticeSource(settings, admit=admit, windows=Windows())
    run = asyncio.create_task(src.run())
    try:
        await asyncio.wait_for(admit.held.wait(), 60)
        # the unreadable record before it is committed; the notice and what follows are not
        assert await h.committed_offset(topic, group(h)) == 1
        admit.release.set()
        await committed_becomes(h, topic, 3)
    finally:
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run
    assert len(admit.seen) == 3 and len({n.id for n in admit.seen}) == 1
    assert src.counters.by_admission == {"retry": 2, "claimed": 1}
    # The record after the notice is read with it each time (a batch is admitted at once):
    # three readings of a non-notice, counted each time; the unreadable one, committed, once.
    assert (src.counters.parse_errors, src.counters.ignored) == (1, 3)
    assert src.counters.left_for_redelivery == 2


async def test_a_stopping_consumer_leaves_the_group_and_a_peer_reads_on(h: Harness) -> None:
    """Two replicas in one group; the one holding an unclaimed record is cancelled (SIGTERM).
    Its stop() sends LeaveGroup: the peer takes the partition at its next heartbeat and reads
    the uncommitted record. The session is 30 s here, so only the LeaveGroup makes it quick."""
    topic = await h.notices_topic(partitions=2)
    settings = KafkaNoticeSettings(
        enabled=True,
        bootstrap=h.stack.kafka,
        topic=topic,
        group_id=group(h),
        session_timeout_ms=30_000,
    )
    consumers: dict[str, Any] = {}

    def built_as(name: str) -> Any:
        def build(s: KafkaNoticeSettings) -> Any:
            consumers[name] = kafka_notices._default_consumer(s)
            return consumers[name]

        return build

    def assigned(name: str) -> set[Any]:
        return set(consumers[name].assignment()) if name in consumers else set()

    held, peer_admit = Scripted(), Scripted()
    held.hold_at = 1  # the first replica's claim of the notice hangs
    first = KafkaNoticeSource(
        settings, admit=held, windows=Windows(), consumer_factory=built_as("first")
    )
    peer = KafkaNoticeSource(
        settings, admit=peer_admit, windows=Windows(), consumer_factory=built_as("peer")
    )
    runs = [asyncio.create_task(first.run())]
    try:
        await _until(_now(lambda: len(assigned("first")) == 2), 60, "first replica assigned")
        runs.append(asyncio.create_task(peer.run()))
        await _until(
            _now(lambda: len(assigned("first")) == len(assigned("peer")) == 1),
            60,
            "one partition each",
        )
        (tp,) = assigned("first")
        node = h.node_spec(0)
        await _produce_to(h, topic, tp.partition, spot_event(node))
        await asyncio.wait_for(held.held.wait(), 30)

        stopping = time.monotonic()
        runs[0].cancel()
        with pytest.raises(asyncio.CancelledError):
            await runs[0]
        stop_s = time.monotonic() - stopping
        await _until(_now(lambda: bool(peer_admit.seen)), 60, "the peer reading the record")
        back_s = time.monotonic() - stopping
        print(f"\nKafka hand-over: stop {stop_s:.2f} s, the peer read it {back_s:.2f} s after")
        assert [n.id for n in peer_admit.seen] == [held.seen[0].id]
        assert back_s < 20.0  # a member that left no word is waited for 30 s
        assert tp in assigned("peer") and len(assigned("peer")) == 2
        await committed_becomes(h, topic, 1, partition=tp.partition)
    finally:
        held.release.set()
        for run in runs:
            run.cancel()
        for run in runs:
            with contextlib.suppress(asyncio.CancelledError):
                await run


def _now(cond: Any) -> Any:
    """A plain condition as the async one ``_until`` polls."""

    async def check() -> bool:
        return bool(cond())

    return check


async def _produce_to(h: Harness, topic: str, partition: int, event: dict[str, Any]) -> None:
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=h.stack.kafka, acks="all")
    await producer.start()
    try:
        await producer.send_and_wait(topic, json.dumps(event).encode(), partition=partition)
    finally:
        await producer.stop()
