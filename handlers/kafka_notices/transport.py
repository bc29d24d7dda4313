"""Kafka notices-topic transport (aiokafka): CloudEvents in, one consumer group for all replicas.

Kafka's unit of acknowledgement is an offset, and committing offset N says "everything
before N is done". So a batch's records are admitted all at once (each admission is a claim
write: one after another, a partition's 300 notices of a storm took a minute), and after the
batch each partition's offset is committed up to the first record that is not settled: a
record is settled when every notice in it is admitted for good (claimed, duplicate,
superseded, dropped), or when it is no notice at all (a parse error or another event type:
counted, since re-reading cannot fix it). The claim, not the order of admission, decides
between two notices for one node.

A record whose admission says retry (the claim was not stored) is not skipped: the consumer
seeks its partition back to that record and pauses the partition for a moment, so the record
is read again shortly, while the other partitions go on. Until then nothing at or after it is
committed, so a crash or a rebalance hands it to the next owner; the records after it that
were admitted are read again too, and answer duplicate.

Failover: each replica is a dynamic member of the group (no ``group_instance_id``: a static
member never leaves, and its partitions would wait out its session). A replica that dies
loses its partitions after ``session_timeout_ms``; a stopping one (the source cancelled on
SIGTERM) stops its consumer, which sends LeaveGroup, so a peer takes its partitions at its
next heartbeat. Nothing is committed on the way out: what was not settled is read again.

A new group starts from the earliest offset: a notice produced before the group first joined
(the first deploy, a renamed group) must still be seen. A notice handled before is cheap to
see again: its claim on the node answers duplicate. Dedupe is by notice id: the parser
derives it from the CloudEvent ``source`` and ``id``, which a producer's retry keeps.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import Any

from reclaimd import kafkaprobe, logs
from reclaimd.backoff import Backoff
from reclaimd.handlers.base import Parser
from reclaimd.handlers.entry import Entry
from reclaimd.handlers.kafka_notices.parser import parse
from reclaimd.handlers.kafka_notices.settings import KafkaNoticeSettings
from reclaimd.handlers.transport import Admit, Counters, Supplies, deliver
from reclaimd.kafkaconn import KafkaSettings, options
from reclaimd.model import Windows

log = logging.getLogger(__name__)

RETRY_PAUSE_S = 1.0  # a record whose claim failed is read again after this pause
MAX_BACKOFF_S = 30.0
POLL_TIMEOUT_MS = 1000
MAX_RECORDS = 500  # a batch, admitted at once: the write budget paces the claims
STOP_TIMEOUT_S = 5.0  # LeaveGroup is best effort: an unreachable broker must not hold the stop


def commit_point(offsets: Sequence[int], settled: Sequence[bool]) -> tuple[int | None, int | None]:
    """``(commit, retry)`` for one partition's records in order: commit up to (excluding) the
    first unsettled record, and re-read from it. Either may be None."""
    commit: int | None = None
    for offset, ok in zip(offsets, settled, strict=True):
        if not ok:
            return commit, offset
        commit = offset + 1
    return commit, None


class KafkaNoticeSource:
    def __init__(
        self,
        settings: KafkaNoticeSettings,
        *,
        admit: Admit,
        windows: Windows,
        consumer_factory: Any = None,
        parser: Parser = parse,
        kafka: KafkaSettings | None = None,
    ) -> None:
        if not settings.bootstrap:
            raise ValueError("kafka_notices: bootstrap is required")
        self.settings, self.admit, self.windows = settings, admit, windows
        self.parser = parser
        self.counters = Counters()
        self.kafka = kafka
        self._factory = consumer_factory or (lambda s: _default_consumer(s, kafka))
        # What stops the consumer that waiting will not mend (kafkaprobe), else None.
        self.problem: str | None = None
        self._resumes: set[asyncio.Task[None]] = set()

    async def run(self) -> None:
        backoff = Backoff(1.0, MAX_BACKOFF_S)
        while True:
            try:
                await self._consume(on_started=backoff.reset)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                self.counters.transport_errors += 1
                await self._judge(e)
                self.counters.failed(self.problem or f"{type(e).__name__}: {e}")
                delay = backoff.next_delay()
                logs.event(
                    log,
                    "kafka notices consumer failed; restarting",
                    logging.WARNING,
                    error=f"{type(e).__name__}: {e}"[:200],
                    backoff_s=round(delay, 2),
                )
                await asyncio.sleep(delay)

    async def _judge(self, e: BaseException) -> None:
        problem = await kafkaprobe.problem(
            e, self.settings.bootstrap, self.kafka, self.settings.topic
        )
        if problem is not None and problem != self.problem:
            logs.event(log, "kafka notices cannot be read", logging.ERROR, problem=problem)
        self.problem = problem or self.problem

    async def _consume(self, on_started: Callable[[], None] = lambda: None) -> None:
        consumer = self._factory(self.settings)
        await consumer.start()
        self.problem = None
        logs.event(
            log,
            "kafka notices consumer started",
            topic=self.settings.topic,
            group_id=self.settings.group_id,
        )
        try:
            while True:
                batch = await consumer.getmany(timeout_ms=POLL_TIMEOUT_MS, max_records=MAX_RECORDS)
                on_started()  # a consumer that fetched is healthy: the next failure starts over
                self.counters.heard()
                if not batch:
                    continue
                async with asyncio.TaskGroup() as tg:
                    for tp, records in batch.items():
                        tg.create_task(self._partition(consumer, tp, records))
        finally:
            for task in self._resumes:
                task.cancel()
            await _stop(consumer)

    async def _partition(self, consumer: Any, tp: Any, records: Sequence[Any]) -> None:
        where = f"{tp.topic}/{tp.partition}"
        settled = await asyncio.gather(*(self.handle(r.value or b"", where=where) for r in records))
        # The offset must not pass an unsettled record: committed up to it, re-read from it.
        commit, retry = commit_point([r.offset for r in records], settled)
        if commit is not None:
            try:
                await consumer.commit({tp: commit})
                self.counters.acked += 1
            except Exception as e:
                # A rebalance took the partition: its next owner re-reads, the intake dedupes.
                self.counters.transport_errors += 1
                logs.event(log, "kafka commit failed", logging.WARNING, error=str(e)[:200])
        if retry is not None:
            self.counters.left_for_redelivery += 1
            try:
                consumer.seek(tp, retry)
                consumer.pause(tp)
            except Exception as e:
                # Revoked meanwhile: uncommitted, the record goes to the partition's next owner.
                logs.event(log, "kafka seek failed", logging.WARNING, error=str(e)[:200])
                return
            task = asyncio.create_task(self._resume_later(consumer, tp))
            self._resumes.add(task)
            task.add_done_callback(self._resumes.discard)

    @staticmethod
    async def _resume_later(consumer: Any, tp: Any) -> None:
        await asyncio.sleep(RETRY_PAUSE_S)
        with contextlib.suppress(Exception):  # revoked meanwhile: nothing to resume
            consumer.resume(tp)

    async def handle(self, value: bytes, *, where: str = "") -> bool:
        """Parse and admit one record; True when it is settled (may be committed past)."""
        delivered = await deliver(
            self.parser,
            value,
            admit=self.admit,
            windows=self.windows,
            counters=self.counters,
            what="kafka record",
            at=where,
        )
        return delivered.settled


async def _stop(consumer: Any) -> None:
    """Stop the consumer (LeaveGroup included), bounded; never raises but a cancellation."""
    with contextlib.suppress(Exception):
        async with asyncio.timeout(STOP_TIMEOUT_S):
            await consumer.stop()


def _default_consumer(settings: KafkaNoticeSettings, kafka: KafkaSettings | None = None) -> Any:
    from aiokafka import AIOKafkaConsumer

    return AIOKafkaConsumer(
        settings.topic,
        **options(kafka, settings.bootstrap),
        group_id=settings.group_id,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        # Only what a transactional producer committed: an aborted notice was never sent.
        isolation_level="read_committed",
        session_timeout_ms=settings.session_timeout_ms,
        heartbeat_interval_ms=settings.heartbeat_interval_ms,
        # group_instance_id stays unset: see the module docstring.
    )


# --- built by the registry (reclaimd.handlers.build), for an enabled source ----------------


def build(entry: Entry[KafkaNoticeSettings], w: Supplies) -> KafkaNoticeSource:
    s = entry.section(w.settings)
    return KafkaNoticeSource(
        s, admit=w.admit, windows=w.windows, parser=entry.parse, kafka=w.settings.kafka
    )
