"""``LedgerWriter``: the ledger's front door (record, flush, run, close) over its three loops.

``record`` commits the event to the SQLite outbox (fsync'd, idempotent on the event id) and,
given a cluster log (``cluster.ledgerlog``), records it in the cluster before it returns;
``run`` runs the loops: the publisher (``publisher``: outbox -> Kafka in transactions under a
transactional id derived from the holder), and with a cluster log the tombstones and the
recovery pass (``adoption``). A Kafka outage delays events, never loses them; losing the
replica and its disk during one loses nothing either: a peer adopts the cluster records of a
holder whose Lease is stale, fences that holder's transactional id (``fencing``), reads the
topic (``read_committed``) for what already made it, and publishes the rest. Exactly once,
replays included: a row whose transaction outcome is unknown (a crash between commit and mark,
a fence) is looked up on the topic before it is sent again, and a row whose record a peer
holds waits for it: published once the record is gone, adopted (and published here) if that
peer dies first. Consumers must read with ``isolation.level=read_committed`` (an aborted
transaction's records stay in the log); ``EventId`` still identifies each event.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path
from types import TracebackType

from reclaimd.backoff import Backoff
from reclaimd.kafkaconn import KafkaSettings
from reclaimd.ledger.adoption import Recovery, Tombstones
from reclaimd.ledger.event import encode
from reclaimd.ledger.fencing import LedgerTopic
from reclaimd.ledger.labels import LabelPolicy
from reclaimd.ledger.publisher import Publisher
from reclaimd.ledger.records import ClusterLog, refused_for_good
from reclaimd.ledger.signals import LedgerCounts, Signals
from reclaimd.logs import event as log_event
from reclaimd.model import RestartWaste
from reclaimd.outbox import AsyncOutbox, Cluster
from reclaimd.settings.ledger import LedgerWriterSettings

# One logger for the whole ledger: its lines read as they did when it was one module.
log = logging.getLogger("reclaimd.ledger")
# The tuning of ``ledger.writer`` as a file that sets none has it.
DEFAULT_TUNING = LedgerWriterSettings()


class LedgerWriter:
    """Durable, exactly-once publication of restart-waste events to a Kafka topic.

    ``record`` may be called before ``run`` starts and while Kafka is down: the event waits in
    the outbox, and (with a ``cluster`` log) in the cluster, where a peer finds it if this
    replica and its disk are lost (``run`` also adopts such events of dead peers when given
    ``alive``). An empty ``bootstrap_servers`` keeps events in the outbox until a writer with a
    broker opens the same file.
    """

    def __init__(
        self,
        *,
        bootstrap_servers: str,
        topic: str,
        outbox_path: str | Path,
        connection: KafkaSettings | None = None,
        policy: LabelPolicy | None = None,
        tuning: LedgerWriterSettings = DEFAULT_TUNING,
        holder: str | None = None,
        cluster: ClusterLog | None = None,
        alive: Callable[[str], Awaitable[bool]] | None = None,
    ) -> None:
        self.topic = topic
        self.policy = policy or LabelPolicy()
        self.holder = holder or (cluster.holder if cluster is not None else socket.gethostname())
        if cluster is not None and cluster.holder != self.holder:
            raise ValueError("ledger: the cluster log must record under the writer's holder")
        self._outbox = AsyncOutbox.open(outbox_path)
        self._cluster = cluster
        self._alive = alive
        self._signals = Signals()
        self._counts = LedgerCounts()
        self._ledger_topic = ledger_topic = LedgerTopic(
            bootstrap_servers,
            topic,
            connection,
            tuning.client_id,
            tuning.request_timeout_ms,
            tuning.scan_margin_s,
            tuning.scan_timeout_s,
        )
        self._tombstones = Tombstones(cluster, self._signals)
        self._publisher = Publisher(
            holder=self.holder,
            outbox=self._outbox,
            cluster=cluster,
            topic=ledger_topic,
            signals=self._signals,
            counts=self._counts,
            tombstones=self._tombstones,
            batch_size=tuning.batch_size,
            # Doubling from the initial pause to the cap, half jitter (never retried early).
            backoff=Backoff(
                tuning.backoff_initial_s,
                max(tuning.backoff_initial_s, tuning.backoff_max_s),
                jitter="half",
            ),
            retention_s=tuning.retention_s,
        )
        self._recovery = Recovery(
            holder=self.holder,
            outbox=self._outbox,
            cluster=cluster,
            alive=alive,
            topic=ledger_topic,
            signals=self._signals,
            counts=self._counts,
            tombstones=self._tombstones,
            recover_every_s=tuning.recover_every_s,
        )
        self._task: asyncio.Task[None] | None = None

    # --- where it publishes --------------------------------------------------------------

    @property
    def bootstrap_servers(self) -> str:
        """The brokers; empty: events stay in the outbox. Settable: the loops read it anew."""
        return self._ledger_topic.bootstrap_servers

    @bootstrap_servers.setter
    def bootstrap_servers(self, value: str) -> None:
        self._ledger_topic.bootstrap_servers = value

    @property
    def connection(self) -> KafkaSettings | None:
        """TLS, SASL: reclaimd.kafkaconn."""
        return self._ledger_topic.connection

    # --- what it counts ------------------------------------------------------------------

    @property
    def published(self) -> int:
        return self._counts.published

    @property
    def publish_errors(self) -> int:
        return self._counts.publish_errors

    @property
    def given_away(self) -> int:
        """Rows a peer adopted: it publishes them, we do not."""
        return self._counts.given_away

    @property
    def found_published(self) -> int:
        """Rows in doubt that the topic already had."""
        return self._counts.found_published

    @property
    def adopted(self) -> int:
        """Peers' (or an earlier life's) events this writer took over."""
        return self._counts.adopted

    @property
    def cluster_write_errors(self) -> int:
        """Events that live in the outbox only."""
        return self._counts.cluster_write_errors

    @property
    def kafka_problem(self) -> str | None:
        """What stops publishing that waiting will not mend: /readyz's kafka check."""
        return self._publisher.kafka_problem

    # --- the pipeline side ---------------------------------------------------------------

    async def record(self, w: RestartWaste) -> None:
        """Commit the event to the outbox (a repeat of its id is a no-op) and to the cluster,
        then wake ``run``."""
        event_id, key, value, headers = encode(w, self.policy)
        new = await self._put(event_id, key, value, headers, w.notice.deadline)
        log_event(log, "restart waste recorded", event_id=event_id, new=new)

    async def record_encoded(
        self, event_id: str, key: bytes, value: bytes, headers: tuple[tuple[str, bytes], ...]
    ) -> bool:
        """``record`` for a row already encoded (the allocation meter's); True if new."""
        return await self._put(event_id, key, value, headers, None)

    async def _put(
        self,
        event_id: str,
        key: bytes | None,
        value: bytes,
        headers: tuple[tuple[str, bytes], ...],
        deadline: datetime | None,
    ) -> bool:
        wake = self._signals.wake
        if self._cluster is None:
            new = await self._outbox.put(event_id, key, value, headers)
            if new:
                wake.set()
            return new
        # Outbox first (fast, local); the publisher skips the row until its cluster write ends.
        new = await self._outbox.put(event_id, key, value, headers, Cluster.PENDING)
        if not new:
            return False
        state = Cluster.UNKNOWN  # if we are cancelled mid-write
        try:
            await self._cluster.put(event_id, key, value, headers, deadline=deadline)
            state = Cluster.HELD
        except Exception as e:  # the outbox has it: a failed cluster write must not fail the step
            # Refused for good (too large, invalid, no such namespace): no record can exist,
            # the event goes out with the outbox alone. Anything else may pass later, and a
            # peer may record the same event meanwhile: the publisher looks before it sends.
            state = Cluster.NONE if refused_for_good(e) else Cluster.UNKNOWN
            self._counts.cluster_write_errors += 1
            log_event(
                log,
                "ledger event not recorded in the cluster",
                logging.WARNING,
                event_id=event_id,
                error=f"{type(e).__name__}: {e}"[:200],
            )
        finally:
            await self._outbox.set_cluster(event_id, state)
            wake.set()
        return True

    def depth(self) -> int:
        """Events waiting for the broker's ack."""
        return self._outbox.depth()

    def oldest_age_s(self) -> float:
        """How long the oldest of them has waited, in seconds (0: none waits)."""
        return self._outbox.oldest_age_s()

    async def flush(self, timeout_s: float) -> bool:
        """Wait until the outbox is empty; ``False`` if it is not within ``timeout_s``."""
        changed = self._signals.changed
        try:
            async with asyncio.timeout(timeout_s), changed:
                await changed.wait_for(lambda: self.depth() == 0)
        except TimeoutError:
            return False
        return True

    # --- the loops -----------------------------------------------------------------------

    def start(self) -> asyncio.Task[None]:
        """Run the loops as a task of this writer (``close`` ends it)."""
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self.run(), name="ledger-publisher")
        return self._task

    async def run(self) -> None:
        """Publish until ``close``; with a cluster log, also mark published events' records
        (tombstones, deleted hours later) and (given ``alive``) adopt the events of holders
        that are gone."""
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self._publisher.run(), name="ledger-publish")
            if self._cluster is not None:
                tg.create_task(self._tombstones.run(), name="ledger-delete")
                if self._alive is not None:
                    tg.create_task(self._recovery.run(), name="ledger-recover")

    async def recover_once(self) -> int:
        """One recovery pass now (``adoption.Recovery.recover_once``)."""
        return await self._recovery.recover_once()

    # --- lifecycle -----------------------------------------------------------------------

    async def close(self, grace_s: float = 5.0) -> None:
        """Stop publishing and close the outbox; unsent events stay in it for the next start."""
        self._signals.closing.set()
        task, self._task = self._task, None
        if task is not None:
            done, _ = await asyncio.wait({task}, timeout=grace_s)
            if not done:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await self._publisher.stop_producer()
        await self._outbox.close()

    async def __aenter__(self) -> LedgerWriter:
        self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
