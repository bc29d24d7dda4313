"""Earliest-deadline-first work queue with one flight per gang.

In a zone-wide reclaim hundreds of notices arrive within seconds; the ones whose deadline is
nearest must get the workers and the Kubernetes write budget first. Notices without a deadline
(early warnings) sort last. A gang that spans two doomed nodes gets two notices; the second
waits for the first's flight on that gang and then finds the ranks already handled, so a gang
is checkpointed, drained and charged once.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable

from reclaimd.model import GangKey, Notice

log = logging.getLogger(__name__)


class EdfQueue:
    """An asyncio priority queue ordered by deadline, deduplicated by notice id.

    A notice becomes *due* ``horizon_s`` before its deadline: an AWS Health change two weeks
    out is claimed at once but not drained until then. A notice without a deadline (an early
    warning) is due at once and sorts as if its deadline were ``horizon_s`` after its receipt,
    so it never jumps ahead of a notice that is about to take capacity away.
    """

    def __init__(self, horizon_s: float = 600.0) -> None:
        self._horizon = horizon_s
        self._heap: list[tuple[float, int, Notice]] = []
        self._ids: set[str] = set()
        self._seq = itertools.count()
        self._ready = asyncio.Condition()

    def key(self, notice: Notice) -> float:
        if notice.deadline is not None:
            return notice.deadline.timestamp()
        return notice.received_at.timestamp() + self._horizon

    def __len__(self) -> int:
        return len(self._heap)

    async def put(self, notice: Notice) -> bool:
        """False when the notice is already queued."""
        async with self._ready:
            if notice.id in self._ids:
                return False
            self._ids.add(notice.id)
            heapq.heappush(self._heap, (self.key(notice), next(self._seq), notice))
            self._ready.notify_all()
            return True

    async def get(self) -> Notice:
        async with self._ready:
            while True:
                if not self._heap:
                    await self._ready.wait()
                    continue
                wait = self._heap[0][0] - self._horizon - time.time()
                if wait <= 0:
                    _, _, notice = heapq.heappop(self._heap)
                    self._ids.discard(notice.id)
                    return notice
                # Sleep until the head is due, or until a put brings an earlier one.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._ready.wait(), wait)


class GangFlights:
    """Per-gang locks taken in a fixed order, so two notices never deadlock on two gangs."""

    def __init__(self) -> None:
        # lock and the number of flights holding or waiting for it
        self._locks: dict[GangKey, tuple[asyncio.Lock, int]] = {}

    def _ref(self, key: GangKey, delta: int) -> asyncio.Lock:
        lock, users = self._locks.get(key, (asyncio.Lock(), 0))
        users += delta
        if users:
            self._locks[key] = (lock, users)
        else:
            # Keep the map small in a long-running daemon.
            self._locks.pop(key, None)
        return lock

    @contextlib.asynccontextmanager
    async def hold(self, keys: Iterable[GangKey]) -> AsyncIterator[None]:
        ordered = sorted(set(keys), key=str)
        locks = [self._ref(key, +1) for key in ordered]
        taken: list[asyncio.Lock] = []
        try:
            for lock in locks:
                await lock.acquire()
                taken.append(lock)
            yield
        finally:
            for lock in reversed(taken):
                lock.release()
            for key in ordered:
                self._ref(key, -1)

    def busy(self) -> int:
        return len(self._locks)


class Scheduler:
    """``workers`` tasks that take notices EDF and run ``handle`` on each."""

    def __init__(
        self,
        handle: Callable[[Notice], Awaitable[object]],
        *,
        workers: int,
        horizon_s: float = 600.0,
    ) -> None:
        self._handle = handle
        self._queue = EdfQueue(horizon_s)
        self._workers = workers
        self._running: set[str] = set()
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def depth(self) -> int:
        return len(self._queue) + len(self._running)

    async def submit(self, notice: Notice) -> bool:
        if notice.id in self._running:
            return False
        queued = await self._queue.put(notice)
        if queued:
            self._idle.clear()
        return queued

    async def wait_idle(self) -> None:
        await self._idle.wait()

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tg:
            for i in range(self._workers):
                tg.create_task(self._worker(), name=f"reclaimd-worker-{i}")

    async def _worker(self) -> None:
        while True:
            notice = await self._queue.get()
            self._running.add(notice.id)
            try:
                await self._handle(notice)
            except asyncio.CancelledError:
                raise
            except Exception:
                # The claim stays open: the resume loop or a peer replica picks it up again.
                log.exception("notice failed", extra={"fields": {"notice_id": notice.id}})
            finally:
                self._running.discard(notice.id)
                if not self._running and not len(self._queue):
                    self._idle.set()
