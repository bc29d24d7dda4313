"""The cluster side of the ledger: tombstones for published events, adoption of dead holders'.

``Tombstones`` marks the cluster records of published events (``mark_published``; swept hours
later), lazily: nothing waits on it. ``Recovery`` is the periodic pass that makes losing a
replica and its disk lose nothing: it adopts the records of holders whose Lease is stale (and
our own from an earlier life whose outbox is gone), fences their transactional ids before it
reads the topic (``fencing``), and puts what the topic lacks in this outbox to publish.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Final

from reclaimd.ledger.fencing import LedgerTopic
from reclaimd.ledger.records import ClusterLog
from reclaimd.ledger.signals import LedgerCounts, Signals, wait_for
from reclaimd.logs import event as log_event
from reclaimd.outbox import AsyncOutbox, Cluster

if TYPE_CHECKING:
    from reclaimd.cluster.ledgerlog import PendingEvent

log = logging.getLogger("reclaimd.ledger")

SWEEP_EVERY_S: Final = 600.0  # old tombstones of published events are deleted this often


class Tombstones:
    """Published events' cluster records, queued to become tombstones."""

    def __init__(self, cluster: ClusterLog | None, signals: Signals) -> None:
        self._cluster = cluster
        self._signals = signals
        self._to_delete: set[str] = set()
        self._wake = asyncio.Event()

    def forget(self, ids: Iterable[str]) -> None:
        """Queue published events' cluster records to become tombstones (lazy: nothing
        waits on it)."""
        if self._cluster is None:
            return
        before = len(self._to_delete)
        self._to_delete.update(ids)
        if len(self._to_delete) > before:
            self._wake.set()

    async def run(self) -> None:
        """Mark queued records published until ``close``, then what is still queued
        (``close``'s grace bounds it; a record left behind is found by a later recovery
        pass)."""
        assert self._cluster is not None
        closing = self._signals.closing
        while not closing.is_set() or self._to_delete:
            self._wake.clear()
            ids, self._to_delete = sorted(self._to_delete), set()
            for event_id in ids:
                try:
                    await self._cluster.mark_published(event_id)
                except Exception as e:  # the recovery pass finds it later
                    log_event(
                        log,
                        "ledger record not marked published",
                        logging.WARNING,
                        event_id=event_id,
                        error=f"{type(e).__name__}: {e}"[:200],
                    )
            if not self._to_delete and not closing.is_set():
                await wait_for(self._wake, closing)


class Recovery:
    """Adopts the events of holders that are gone (``recover_once``, every
    ``recover_every_s``, jittered), and settles rows left to peers."""

    def __init__(
        self,
        *,
        holder: str,
        outbox: AsyncOutbox,
        cluster: ClusterLog | None,
        alive: Callable[[str], Awaitable[bool]] | None,
        topic: LedgerTopic,
        signals: Signals,
        counts: LedgerCounts,
        tombstones: Tombstones,
        recover_every_s: float,
    ) -> None:
        self.holder = holder
        self._outbox = outbox
        self._cluster = cluster
        self._alive = alive
        self._topic = topic
        self._signals = signals
        self._counts = counts
        self._tombstones = tombstones
        self._recover_every_s = recover_every_s

    async def run(self) -> None:
        swept_at = 0.0
        while not self._signals.closing.is_set():
            now = asyncio.get_running_loop().time()
            if self._cluster is not None and now - swept_at > SWEEP_EVERY_S:
                swept_at = now
                with contextlib.suppress(Exception):  # the next sweep tries again
                    await self._cluster.sweep()
            if self._topic.bootstrap_servers:
                try:
                    await self.recover_once()
                except Exception as e:  # the records stay; the next pass tries again
                    log_event(
                        log,
                        "ledger recovery failed, will retry",
                        logging.WARNING,
                        error=f"{type(e).__name__}: {e}"[:200],
                    )
            # A jittered period, not a retry: the pass runs this often whether or not it failed.
            await self._signals.pause(random.uniform(0.5, 1.0) * self._recover_every_s)

    async def recover_once(self) -> int:
        """One pass over this topic's cluster records: adopt those whose holder is gone (and
        ours from an earlier life whose outbox is lost), publish what the topic does not have,
        delete the rest. Returns how many records were taken over."""
        if self._cluster is None or self._alive is None or not self._topic.bootstrap_servers:
            return 0
        # Before the records are listed: a row left to a peer whose record is not in a later
        # listing was published by that peer (records become tombstones only once on the
        # topic, and tombstones are swept hours later).
        left_to_peers = await self._outbox.peers()
        listed = await self._cluster.records()
        await self._settle_left(left_to_peers, {r.event_id: r for r in listed})
        orphans = await self._orphans([r for r in listed if r.published_at is None])
        # Our own earlier life is fenced once our producer has registered our id; until then
        # (Kafka unreachable) adopting is pointless anyway: the topic cannot be read.
        if not orphans or not self._signals.self_fenced.is_set():
            return 0
        async with self._signals.settling:
            return await self._adopt(orphans)

    async def _orphans(self, records: list[PendingEvent]) -> list[PendingEvent]:
        """The unpublished records whose holder is gone, or ours with no outbox row."""
        assert self._alive is not None
        orphans: list[PendingEvent] = []
        verdict: dict[str, bool] = {}
        for rec in records:
            if rec.holder == self.holder:
                got = await self._outbox.get(rec.event_id)
                if got is None:
                    orphans.append(rec)  # an earlier life of ours wrote it; its disk is gone
                elif got[1]:
                    self._tombstones.forget([rec.event_id])  # published; its deletion was lost
                continue
            if rec.holder not in verdict:
                verdict[rec.holder] = await self._alive(rec.holder)
            if not verdict[rec.holder]:
                orphans.append(rec)
        return orphans

    async def _adopt(self, orphans: list[PendingEvent]) -> int:
        """Take the orphans' records over, fence their earlier holders, publish what the topic
        lacks (``recover_once``, with the publisher's settling held off)."""
        assert self._cluster is not None
        taken: list[PendingEvent] = []
        for rec in orphans:
            mine = rec if rec.holder == self.holder else await self._cluster.adopt(rec)
            if mine is not None:
                taken.append(mine)
        if not taken:
            return 0
        # Fence every earlier holder before reading the topic: whatever they committed is then
        # visible, and none of them can commit a copy after we looked.
        await self._topic.fence(h for rec in taken for h in rec.holders if h != self.holder)
        found = await self._topic.committed(
            {rec.event_id for rec in taken}, min(rec.recorded_at.timestamp() for rec in taken)
        )
        # The topic, read after every earlier holder was fenced, is the only truth here: an
        # event it lacks is published from the record, whatever this outbox said of it.
        await self._outbox.mark_sent(sorted(found))
        for rec in taken:
            if rec.event_id in found:
                self._tombstones.forget([rec.event_id])
            else:
                await self._outbox.adopt(rec.event_id, rec.key, rec.value, rec.headers)
        self._counts.adopted += len(taken)
        self._counts.found_published += len(found)
        self._signals.wake.set()
        log_event(
            log,
            "ledger events adopted",
            count=len(taken),
            on_topic=len(found),
            holders=sorted({h for rec in taken for h in rec.holders}),
        )
        return len(taken)

    async def _settle_left(self, ids: list[str], records: Mapping[str, PendingEvent]) -> None:
        """Rows left to a peer: published once the record is gone or a tombstone; ours again
        if we hold it."""
        gone = [i for i in ids if i not in records or records[i].published_at is not None]
        if gone:
            await self._outbox.mark_sent(gone)
            await self._signals.notify()
        for i in ids:
            rec = records.get(i)
            if rec is not None and rec.published_at is None and rec.holder == self.holder:
                await self._outbox.set_cluster(i, Cluster.HELD)
                self._signals.wake.set()
