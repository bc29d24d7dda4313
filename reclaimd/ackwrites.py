"""A gang's durable acks, written as they come in rather than once every rank has answered.

The record is what a successor charges from (``cluster.gangclaims``). Written only after the
last rank answered, it waited on the slowest rank (or one that never answers, to the end of
the budget): an owner killed in that wait took every ack it had with it, and the successor
charged ranks that had saved as if they had not. Here the first durable ack is written at
once, later ones together at most every ``every_s``; one write is in flight at a time and the
latest set wins, so a storm costs a few writes per gang, not one per rank.

Every set written is this run's acks merged with the recorded ones (``checkpoint.merge_acks``):
a resumed notice never writes over its dead owner's record with less.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable

from reclaimd import checkpoint
from reclaimd.intake import ClaimLost
from reclaimd.model import RankAck

log = logging.getLogger(__name__)

EVERY_S = 0.5  # the checkpoint poll interval: acks seldom come closer than that

Write = Callable[[tuple[RankAck, ...]], Awaitable[None]]


def _durable_key(acks: Iterable[RankAck]) -> frozenset[tuple[str, str, str]]:
    return frozenset(
        (a.member.uid or a.member.name, a.uri, str(a.checkpoint_time))
        for a in checkpoint.durable(acks)
    )


class AckWrites:
    """``add`` each rank's ack as it is known; ``close`` with the final set."""

    def __init__(
        self, write: Write, recorded: Iterable[RankAck] = (), *, every_s: float = EVERY_S
    ) -> None:
        self._write, self._recorded, self._every_s = write, tuple(recorded), every_s
        self._fresh: dict[str, RankAck] = {}
        self._written = _durable_key(self._recorded)  # already in the record
        self._task: asyncio.Task[None] | None = None
        self._writing = False  # the task is in a write, not in its pause between writes
        self._lost = False  # fenced: a peer holds the notice now; write nothing more
        self._closing = False  # ``close`` writes the rest: the task stops after its write

    def add(self, ack: RankAck) -> None:
        self._fresh[ack.member.uid or ack.member.name] = ack
        if self._lost or not checkpoint.durable((ack,)):
            return
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._catch_up())

    def _current(self) -> tuple[RankAck, ...]:
        return checkpoint.merge_acks(tuple(self._fresh.values()), self._recorded)

    async def _catch_up(self) -> None:
        """Write until the record holds every durable ack known (a background task)."""
        while not (self._lost or self._closing):
            acks = self._current()
            key = _durable_key(acks)
            if key <= self._written:
                return
            self._writing = True
            try:
                await self._write(acks)
            except ClaimLost:
                self._lost = True
                return
            except Exception as e:  # the final write in ``close`` tries again
                log.warning("acks not recorded yet: %s", str(e)[:200])
                return
            finally:
                self._writing = False
            self._written |= key
            if not self._closing:
                await asyncio.sleep(self._every_s)

    async def close(self, acks: tuple[RankAck, ...]) -> None:
        """Write ``acks`` (the final, merged set) unless the record already holds them all.
        Raises ``ClaimLost`` from the write's fence."""
        self._closing = True
        task, self._task = self._task, None
        if task is not None and not task.done():
            # A write under way finishes first (two writes of one Lease must not cross); a
            # pause between writes is moot now.
            if not self._writing:
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._lost:
            raise ClaimLost("the notice was taken over while its acks were recorded")
        if not _durable_key(acks) <= self._written:
            await self._write(acks)
            self._written |= _durable_key(acks)

    def cancel(self) -> None:
        if self._task is not None:
            self._task.cancel()
