"""What the ledger writer's loops share: wake-ups, the close, the settling lock and the counts.

The publisher, the tombstone loop and the recovery pass are separate collaborators of
``LedgerWriter``; they meet only here: ``wake`` (a new or adopted row to publish), ``closing``,
``changed`` (the outbox's depth moved: ``flush`` waits on it), ``settling`` (the publisher's
reading of the records and an adoption never interleave), ``self_fenced`` (our producer has
registered our transactional id) and ``LedgerCounts``.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass


@dataclass
class LedgerCounts:
    """What the writer counts (``metrics.LedgerStats`` reads some; tests read the rest)."""

    published: int = 0
    publish_errors: int = 0
    given_away: int = 0  # rows a peer adopted: it publishes them, we do not
    found_published: int = 0  # rows in doubt that the topic already had
    adopted: int = 0  # peers' (or an earlier life's) events this writer took over
    cluster_write_errors: int = 0  # events that live in the outbox only


class Signals:
    """The events and the lock the loops coordinate on (see the module docstring)."""

    def __init__(self) -> None:
        self.wake = asyncio.Event()
        self.closing = asyncio.Event()
        self.changed = asyncio.Condition()
        # The publisher's reading of the records and the recovery pass's adoption never
        # interleave: a row read as ours between an adoption and its topic scan was sent
        # without a look (failover-4020099555: the adopted event was on the topic already).
        self.settling = asyncio.Lock()
        # Set once our producer registered its transactional id: from then on no transaction
        # of an earlier process under our holder name can still commit.
        self.self_fenced = asyncio.Event()

    async def idle(self) -> None:
        """Wait for a new event (``record``) or ``close``."""
        await wait_for(self.wake, self.closing)

    async def pause(self, seconds: float) -> None:
        """Sleep out a backoff; only ``close`` cuts it short, a new event does not."""
        await wait_for(self.closing, limit_s=seconds)

    async def notify(self) -> None:
        """The outbox's depth may have moved: wake ``flush``."""
        async with self.changed:
            self.changed.notify_all()


async def wait_for(*events: asyncio.Event, limit_s: float | None = None) -> None:
    """Until one of ``events`` is set, or ``limit_s`` passed."""
    waits = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waits, timeout=limit_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()
