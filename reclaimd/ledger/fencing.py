"""Fencing on the ledger topic: transactional ids, producers under them, and committed look-ups.

Every holder writes under a transactional id derived from its name (``transactional_id``), so
an adopter can open a producer under a dead holder's id: the broker then aborts that holder's
open transaction and refuses any later commit of its producer (``LedgerTopic.fence``, the
epoch bump). ``LedgerTopic.committed`` answers "is this event on the topic already?" with a
``read_committed`` reader, the only truth for a row whose transaction outcome is unknown.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from reclaimd.kafkaconn import KafkaSettings, options
from reclaimd.ledger.event import record_event_id


def transactional_id(holder: str, topic: str) -> str:
    """The Kafka transactional id of ``holder``'s writer to ``topic``: derived, so an adopter
    can open a producer under a dead holder's id and so fence its unfinished transactions."""
    digest = hashlib.sha256(f"{holder}\0{topic}".encode("utf-8", "surrogatepass")).hexdigest()
    return "reclaimd-ledger-" + digest[:32]


@dataclass
class LedgerTopic:
    """The ledger's topic as exactly-once sees it: who may write (producers under derived
    transactional ids) and what is committed. Not frozen: the writer's ``bootstrap_servers``
    and ``connection`` are this object's, and a writer given a broker later (its way to Kafka
    healed) publishes from the next client on."""

    bootstrap_servers: str
    topic: str
    connection: KafkaSettings | None  # TLS, SASL: reclaimd.kafkaconn
    client_id: str
    request_timeout_ms: int
    # Producer timestamps come from the writer's clock: look this far before a row's time.
    scan_margin_s: float
    scan_timeout_s: float

    def client(self) -> dict[str, Any]:
        """Every client's connection keywords (the password file read anew: a rotated
        Secret is used from the next client on)."""
        return options(self.connection, self.bootstrap_servers)

    def producer(self, holder: str) -> AIOKafkaProducer:
        """A transactional producer under ``holder``'s id (not started)."""
        return AIOKafkaProducer(
            **self.client(),
            client_id=self.client_id,
            transactional_id=transactional_id(holder, self.topic),
            acks="all",
            request_timeout_ms=self.request_timeout_ms,
        )

    async def fence(self, holders: Iterable[str]) -> None:
        """Open and close a producer under each holder's transactional id: the broker aborts
        its open transaction and refuses any later commit of that holder's producer."""
        for holder in sorted(set(holders)):
            producer = self.producer(holder)
            try:
                async with asyncio.timeout(self.request_timeout_ms / 1000 * 2):
                    await producer.start()
            finally:
                await producer.stop()

    async def committed(self, ids: set[str], since: float) -> set[str]:
        """Which of ``ids`` are on the topic, committed, from ``since`` (epoch seconds, less the
        clock margin) to the partitions' high watermarks now. Raises if it cannot tell."""
        since_ms = max(0, int((since - self.scan_margin_s) * 1000))
        # The probe gives the high watermarks (a read_committed ListOffsets gives the last
        # stable offset, which an open transaction holds back, possibly below a commit we
        # must see); the reader reads only committed records, so an aborted copy is no copy.
        probe = AIOKafkaConsumer(
            self.topic,
            **self.client(),
            client_id=f"{self.client_id}-scan",
            group_id=None,
            enable_auto_commit=False,
            request_timeout_ms=self.request_timeout_ms,
        )
        reader = AIOKafkaConsumer(
            **self.client(),
            client_id=f"{self.client_id}-scan",
            group_id=None,
            enable_auto_commit=False,
            isolation_level="read_committed",
            request_timeout_ms=self.request_timeout_ms,
        )
        try:
            async with asyncio.timeout(self.scan_timeout_s):
                await probe.start()
                await reader.start()
                return await _scan(probe, reader, self.topic, ids, since_ms)
        finally:
            await probe.stop()
            await reader.stop()


def retrieve(fut: asyncio.Future[Any]) -> None:
    """Mark a future's exception read (a failed transaction fails every send)."""
    if not fut.cancelled():
        fut.exception()


def quiet_transaction(producer: AIOKafkaProducer) -> None:
    """A fenced aiokafka producer fails its transaction's waiter (twice: the second replaces
    the first) and nobody awaits it: mark the current one read, so a fence is not also logged
    as "exception never retrieved" when it is collected."""
    manager = getattr(producer, "_txn_manager", None)
    waiter = getattr(manager, "wait_for_transaction_end", lambda: None)()
    if isinstance(waiter, asyncio.Future):
        waiter.add_done_callback(retrieve)


async def _scan(
    probe: AIOKafkaConsumer,
    reader: AIOKafkaConsumer,
    topic: str,
    ids: set[str],
    since_ms: int,
) -> set[str]:
    parts = probe.partitions_for_topic(topic) or set()
    tps = [TopicPartition(topic, p) for p in sorted(parts)]
    if not tps:
        return set()
    high = await probe.end_offsets(tps)
    reader.assign(tps)
    starts = await reader.offsets_for_times({tp: since_ms for tp in tps})
    stable = await reader.end_offsets(tps)
    todo: dict[TopicPartition, int] = {}
    for tp in tps:
        at = starts.get(tp)
        # None: nothing at or after ``since`` below the stable offset; a commit may still sit
        # between it and the high watermark.
        start = at.offset if at is not None else stable[tp]
        if start < high[tp]:
            reader.seek(tp, start)
            todo[tp] = high[tp]
    found: set[str] = set()
    while todo:
        batch = await reader.getmany(*todo, timeout_ms=1000)
        for records in batch.values():
            for rec in records:
                eid = record_event_id(rec.headers, rec.value)
                if eid in ids:
                    found.add(eid)
        for tp in list(todo):
            if await reader.position(tp) >= todo[tp]:
                del todo[tp]
    return found
