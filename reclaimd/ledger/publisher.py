"""The outbox publisher: the ledger's rows to Kafka, one transaction per batch, exactly once.

Every batch is one Kafka transaction under this holder's transactional id (``fencing``).
Before a batch, the rows' cluster records are read (after the producer's epoch is set, so a
peer that adopts later fences this producer first): a row a peer adopted is given away. A row
whose transaction outcome is unknown (tried before, or its record vanished) is looked up on
the topic with a ``read_committed`` consumer before it is sent again. Kafka errors back off
(``backoff``: doubling, capped, half jitter) and retry; rows stay queued.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError, ProducerFenced

from reclaimd import kafkaprobe
from reclaimd.backoff import Backoff
from reclaimd.ledger.adoption import Tombstones
from reclaimd.ledger.fencing import LedgerTopic, quiet_transaction, retrieve
from reclaimd.ledger.records import ClusterLog, ClusterUnreadable, in_cluster, settle
from reclaimd.ledger.signals import LedgerCounts, Signals
from reclaimd.logs import event as log_event
from reclaimd.outbox import AsyncOutbox, Cluster, Row

if TYPE_CHECKING:
    from reclaimd.cluster.ledgerlog import PendingEvent

# One logger for the whole ledger: its lines read as they did when it was one module.
log = logging.getLogger("reclaimd.ledger")

PRUNE_EVERY_S = 3600.0  # sent rows past their retention are deleted this often


class Publisher:
    """Publishes the outbox until ``close`` (``LedgerWriter.run``)."""

    def __init__(
        self,
        *,
        holder: str,
        outbox: AsyncOutbox,
        cluster: ClusterLog | None,
        topic: LedgerTopic,
        signals: Signals,
        counts: LedgerCounts,
        tombstones: Tombstones,
        batch_size: int,
        backoff: Backoff,
        retention_s: float,
    ) -> None:
        self.holder = holder
        self._outbox = outbox
        self._cluster = cluster
        self._topic = topic
        self._signals = signals
        self._counts = counts
        self._tombstones = tombstones
        self._batch = batch_size
        self._backoff = backoff
        # Sent rows are kept this long so a replay of their id stays a no-op, then pruned.
        self._retention_s = retention_s
        self._pruned_at: float | None = None
        self._producer: AIOKafkaProducer | None = None
        # What stops publishing that waiting will not mend (a refused password or certificate,
        # an untrusted broker, an ACL): /readyz's kafka check; None while it works or may.
        self.kafka_problem: str | None = None

    async def run(self) -> None:
        """Kafka errors back off (capped, jittered) and retry; rows stay queued."""
        published = self._counts.published
        while not self._signals.closing.is_set():
            if not self._topic.bootstrap_servers:
                self._signals.wake.clear()  # nothing to publish to: only close() ends this wait
                await self._signals.idle()
                continue
            try:
                await self._publish()
            except Exception as e:  # this loop must outlive any one failure: rows stay queued
                if self._counts.published > published:  # it worked since the last failure
                    self._backoff.reset()
                    published = self._counts.published
                await self._failed(e)

    async def _failed(self, e: Exception) -> None:
        self._counts.publish_errors += 1
        log_event(
            log,
            # Fenced: a peer took our records over (or we were paused past the transaction
            # timeout); the next batch reads the cluster records again.
            "ledger publish fenced, will re-check"
            if isinstance(e, ProducerFenced)
            else "ledger records unreadable, events with one wait"
            if isinstance(e, ClusterUnreadable)
            else "ledger publish failed, will retry",
            logging.WARNING,
            error=f"{type(e).__name__}: {e}"[:200],
            depth=self._outbox.depth(),
            retry_in_s=round(self._backoff.ceiling(), 2),
        )
        if not isinstance(e, ClusterUnreadable):  # Kafka itself is fine then
            await self.stop_producer()
            await self._judge(e)
        await self._signals.pause(self._backoff.next_delay())

    async def _publish(self) -> None:
        producer = await self._ensure_producer()
        signals = self._signals
        while not signals.closing.is_set():
            # Clear before reading: a record() after the read sets it again, so no wake is lost.
            signals.wake.clear()
            rows = await self._outbox.pending(self._batch)
            if not rows:
                self._works()  # connected and authorized: nothing left to wait for
                await signals.notify()
                await self._prune()
                await signals.idle()
                continue
            async with signals.settling:
                ours, unreadable = await self._settle(rows)
            if ours:
                await self._send_batch(producer, ours)
            if unreadable is not None:
                raise ClusterUnreadable(str(unreadable)) from unreadable

    async def _settle(self, rows: list[Row]) -> tuple[list[Row], Exception | None]:
        """The rows of this batch that are ours to send now (see ``settle``), and the error
        that kept rows with a cluster record back (they wait until the cluster answers)."""
        records: dict[str, PendingEvent] | None = None
        unreadable: Exception | None = None
        if self._cluster is not None and any(in_cluster(r) for r in rows):
            # Read after our producer's epoch was set: a peer adopting from here on fences
            # this producer before it looks at the topic, so no commit of ours slips past it.
            try:
                records = {p.event_id: p for p in await self._cluster.records()}
            except Exception as e:  # rows only this outbox knows need no cluster: go on
                unreadable = e
                rows = [r for r in rows if not in_cluster(r)]
        if records:
            rows = await self._settle_published(rows, records)
        ours, doubt, gone = settle(rows, records, self.holder)
        if gone:
            await self._give_away(gone)
        if doubt:
            unreadable = await self._settle_doubt(doubt, records, ours) or unreadable
        if gone or doubt:
            await self._signals.notify()
        return sorted(ours, key=lambda r: r.seq), unreadable

    async def _give_away(self, gone: list[Row]) -> None:
        """Left to the peer that holds the record, not marked sent: if that peer is dead, the
        recovery pass adopts the record and this row is published after all."""
        for r in gone:
            await self._outbox.set_cluster(r.id, Cluster.PEER)
        self._counts.given_away += len(gone)
        log_event(log, "ledger events held by a peer", count=len(gone))

    async def _settle_doubt(
        self, doubt: list[Row], records: Mapping[str, PendingEvent] | None, ours: list[Row]
    ) -> Exception | None:
        """Rows whose outcome is unknown: marked sent if on the topic, else added to ``ours``
        (once their record is written again, if it vanished). Returns what cut us off."""
        unreadable: Exception | None = None
        found = await self._topic.committed({r.id for r in doubt}, min(r.created_at for r in doubt))
        if found:
            await self._outbox.mark_sent(sorted(found))
            self._counts.found_published += len(found)
            self._tombstones.forget(
                r.id for r in doubt if r.id in found and r.cluster != Cluster.NONE
            )
            log_event(log, "ledger events found on the topic", count=len(found))
        for r in doubt:
            if r.id in found:
                continue
            missing = records is not None and in_cluster(r) and r.id not in records
            try:
                if not missing or await self._record_again(r):
                    ours.append(r)
            except Exception as e:  # still cut off: it waits (and the loop backs off)
                unreadable = e
        return unreadable

    async def _settle_published(
        self, rows: list[Row], records: Mapping[str, PendingEvent]
    ) -> list[Row]:
        """Rows whose record is a tombstone are on the topic already (a peer, or an earlier
        life of ours, published them: a charge repeated after a takeover): marked sent."""
        done = [r.id for r in rows if (rec := records.get(r.id)) and rec.published_at]
        if not done:
            return rows
        await self._outbox.mark_sent(done)
        self._counts.found_published += len(done)
        log_event(log, "ledger events published before", count=len(done))
        return [r for r in rows if r.id not in done]

    async def _record_again(self, r: Row) -> bool:
        """A row meant to have a cluster record that has none, and not on the topic: its
        record's write had no answer (a partition), or it vanished. The record is the lock
        on the event id, so it is written again before the event may be sent: created, the
        row is ours; already there, a peer recorded the same event meanwhile (it took the
        notice over while we were cut off) and the next round sees whose it is."""
        assert self._cluster is not None
        created = await self._cluster.put(r.id, r.key, r.value, r.headers, deadline=None)
        if not created:
            await self._outbox.set_cluster(r.id, Cluster.HELD)
        return created

    async def _send_batch(self, producer: AIOKafkaProducer, rows: list[Row]) -> None:
        """One transaction: every row of the batch is on the topic, or none is."""
        ids = [r.id for r in rows]
        await self._outbox.mark_tried(ids)  # from here a crash leaves the outcome in doubt
        await producer.begin_transaction()
        quiet_transaction(producer)
        try:
            futures: list[asyncio.Future[Any]] = []
            for row in rows:
                fut = await producer.send(
                    self._topic.topic, value=row.value, key=row.key, headers=list(row.headers)
                )
                # A failed transaction fails every send: the first error is raised below,
                # the others are read here so none is reported as never retrieved.
                fut.add_done_callback(retrieve)
                futures.append(fut)
            await asyncio.gather(*futures)
            await producer.commit_transaction()
        except BaseException:
            await self._abort(producer)
            raise
        await self._outbox.mark_sent(ids)
        self._works()
        self._counts.published += len(ids)
        self._tombstones.forget(r.id for r in rows if r.cluster != Cluster.NONE)
        await self._signals.notify()

    async def _abort(self, producer: AIOKafkaProducer) -> None:
        # An open transaction holds back every read_committed reader of its partitions until
        # it times out: end it now if the producer still can (a fenced one cannot).
        try:
            async with asyncio.timeout(self._topic.request_timeout_ms / 1000):
                await producer.abort_transaction()
        except Exception:
            quiet_transaction(producer)

    async def _prune(self) -> None:
        now = asyncio.get_running_loop().time()
        if self._pruned_at is None or now - self._pruned_at > PRUNE_EVERY_S:
            self._pruned_at = now
            await self._outbox.prune(self._retention_s)

    async def _judge(self, e: BaseException) -> None:
        """Name what stops publishing, once per change (one log line, no secret): a client
        that never connected is diagnosed by a connection of our own."""
        t = self._topic
        problem = await kafkaprobe.problem(e, t.bootstrap_servers, t.connection, t.topic)
        if problem is not None and problem != self.kafka_problem:
            log_event(
                log,
                "ledger cannot publish",
                logging.ERROR,
                problem=problem,
                depth=self._outbox.depth(),
            )
        self.kafka_problem = problem or self.kafka_problem

    def _works(self) -> None:
        if self.kafka_problem is not None:
            log_event(log, "ledger publishes again", was=self.kafka_problem)
            self.kafka_problem = None

    async def _ensure_producer(self) -> AIOKafkaProducer:
        if self._producer is None:
            producer = self._topic.producer(self.holder)
            try:
                # Registers the transactional id: aborts what an earlier process under our
                # name left open, and fences it.
                await producer.start()
            except BaseException:
                await producer.stop()
                raise
            self._producer = producer
            self._signals.self_fenced.set()
        return self._producer

    async def stop_producer(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            with contextlib.suppress(KafkaError, OSError):
                await producer.stop()
