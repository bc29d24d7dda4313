"""When each notice runs, and who owns each gang.

In a zone-wide reclaim hundreds of notices arrive within seconds. Every due notice gets a
task of its own at once: waiting for acks or for pods to go is an awaiting task, never a held
worker, so the notices behind a slow one are not even delayed. What is scarce is the
Kubernetes write budget, and that is served earliest deadline first
(``cluster.ratelimit``). ``max_in_flight`` bounds memory, not throughput.

A notice is *due* ``horizon_s`` before its deadline (``EdfQueue``): an AWS Health change two
weeks out is claimed at once, acted on then.

A gang that spans two doomed nodes gets two notices. ``GangOwners`` makes the first one its
owner, in this process and (through the gang's Lease, ``GangLock``) across replicas; a later
notice *joins* the flight instead of waiting for it: its nodes join, and its deadline governs
if it is earlier (the owner's checkpoint wait is cut and its drain hurried accordingly). So a
gang is checkpointed, drained and charged once.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Generic, Protocol, TypeVar

from reclaimd.model import Gang, GangKey, Notice, utcnow

log = logging.getLogger(__name__)


class Due(Protocol):
    """What the queue orders by: a notice, or a value that carries one."""

    @property
    def id(self) -> str: ...
    @property
    def notice(self) -> Notice: ...


D = TypeVar("D", bound=Due)


class EdfQueue(Generic[D]):
    """An asyncio priority queue ordered by deadline, deduplicated by notice id.

    A notice becomes *due* ``horizon_s`` before its deadline: an AWS Health change two weeks
    out is claimed at once but not drained until then. A notice without a deadline (an early
    warning) is due at once and sorts as if its deadline were ``horizon_s`` after its receipt,
    so it never jumps ahead of a notice that is about to take capacity away.
    """

    def __init__(self, horizon_s: float) -> None:
        self._horizon = horizon_s
        self._heap: list[tuple[float, int, D]] = []
        self._ids: set[str] = set()
        self._seq = itertools.count()
        self._ready = asyncio.Condition()

    def key(self, notice: Notice) -> float:
        if notice.deadline is not None:
            return notice.deadline.timestamp()
        return notice.received_at.timestamp() + self._horizon

    def __len__(self) -> int:
        return len(self._heap)

    async def put(self, item: D) -> bool:
        """False when the notice is already queued."""
        async with self._ready:
            if item.id in self._ids:
                return False
            self._ids.add(item.id)
            heapq.heappush(self._heap, (self.key(item.notice), next(self._seq), item))
            self._ready.notify_all()
            return True

    async def get(self) -> D:
        async with self._ready:
            while True:
                if not self._heap:
                    await self._ready.wait()
                    continue
                wait = self._heap[0][0] - self._horizon - time.time()
                if wait <= 0:
                    _, _, item = heapq.heappop(self._heap)
                    self._ids.discard(item.id)
                    return item
                # Sleep until the head is due, or until a put brings an earlier one.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._ready.wait(), wait)


class GangLock(Protocol):
    async def acquire(self, gang: Gang, notice: Notice) -> bool:
        """True when this notice charges the gang (cluster-wide, across replicas)."""
        ...


def _earlier(a: datetime | None, b: datetime | None) -> bool:
    """Deadline ``a`` comes before ``b``; no deadline is the latest of all."""
    return a is not None and (b is None or a < b)


@dataclass(eq=False)
class GangFlight:
    """One gang in hand: the notice that owns (charges) it, who joined, what deadline governs."""

    gang: Gang
    owner: str  # notice id
    deadline: datetime | None
    nodes: set[str]
    joined: list[str] = field(default_factory=list)  # notice ids
    cut: asyncio.Event = field(default_factory=asyncio.Event)  # end the checkpoint wait now
    settled: asyncio.Event = field(default_factory=asyncio.Event)  # drained and charged
    drained: asyncio.Event = field(default_factory=asyncio.Event)  # its pods gone (or given up)
    drained_at: datetime | None = None  # when the owner's drain stopped
    decided: asyncio.Future[bool] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )  # the Lease's answer: does the owner charge it?
    _budget_of: Callable[[datetime | None], datetime] | None = None
    _timer: asyncio.TimerHandle | None = None

    def same_incarnation(self, gang: Gang) -> bool:
        """The same gang, not one restarted with new pods under the same name."""
        mine = {m.uid for m in self.gang.members}
        return not mine or bool(mine & {m.uid for m in gang.members})

    def checkpoint_until(self, budget_of: Callable[[datetime | None], datetime]) -> None:
        """The owner's checkpoint wait has begun; ``budget_of`` maps a deadline to the end of
        the wait, so that a joiner dying earlier can bring that end forward."""
        self._budget_of = budget_of

    def join(self, notice: Notice, nodes: Iterable[str]) -> None:
        self.joined.append(notice.id)
        self.nodes.update(nodes)
        if not _earlier(notice.deadline, self.deadline):
            return
        self.deadline = notice.deadline
        if self._budget_of is None or self.cut.is_set():
            return
        end = self._budget_of(self.deadline)
        if self._timer is not None:
            self._timer.cancel()
        delay = max(0.0, (end - utcnow()).total_seconds())
        self._timer = asyncio.get_running_loop().call_later(delay, self.cut.set)

    def stopped(self, at: datetime) -> None:
        """The owner's drain is over: a notice that joined is drained, whatever the charge."""
        self.drained_at = at
        self.drained.set()

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        # Whatever happened, nobody waits for it any longer.
        self.drained.set()
        self.settled.set()


@dataclass(frozen=True)
class Taken:
    owned: list[GangFlight]  # this notice charges these
    joined: list[GangFlight]  # owned by another notice of this process: joined
    skipped: list[GangKey]  # charged by another notice (here or on another replica)


class GangOwners:
    """Which notice owns each gang, in this process; the Lease decides across replicas."""

    def __init__(self, lock: GangLock) -> None:
        self._lock = lock
        self._flights: dict[GangKey, GangFlight] = {}

    def __len__(self) -> int:
        return len(self._flights)

    async def take(self, gangs: Sequence[Gang], notice: Notice, nodes: Iterable[str]) -> Taken:
        nodes = tuple(nodes)
        mine: list[GangFlight] = []
        theirs: list[GangFlight] = []
        for gang in gangs:
            flight = self._flights.get(gang.key)
            if flight is not None and flight.same_incarnation(gang):
                theirs.append(flight)
                continue
            # Registered before the Lease answers, so a notice arriving meanwhile joins this
            # one rather than writing the Lease too.
            flight = GangFlight(gang, notice.id, notice.deadline, set(nodes))
            self._flights[gang.key] = flight
            mine.append(flight)
        answers = await asyncio.gather(
            *(self._lock.acquire(f.gang, notice) for f in mine), return_exceptions=True
        )
        owned: list[GangFlight] = []
        skipped: list[GangKey] = []
        failure: BaseException | None = None
        for flight, answer in zip(mine, answers, strict=True):
            ours = answer is True
            flight.decided.set_result(ours)
            if ours:
                owned.append(flight)
                continue
            self.release(flight)
            if isinstance(answer, BaseException):
                failure = failure or answer
            else:
                skipped.append(flight.gang.key)
        if failure is not None:
            for flight in owned:
                self.release(flight)
            raise failure  # the notice fails and is resumed; its claim stays open
        joined: list[GangFlight] = []
        again: list[Gang] = []
        for flight in theirs:
            if await asyncio.shield(flight.decided):
                flight.join(notice, nodes)
                joined.append(flight)
                skipped.append(flight.gang.key)
            else:
                # That notice did not get the Lease: perhaps this one holds it (a resumed
                # owner that came second in this process). Ask the Lease for it too.
                again.append(flight.gang)
        if again:
            try:
                more = await self.take(again, notice, nodes)
            except BaseException:
                # As for a failure above: a flight left registered would be joined by this
                # notice's own retry, and nobody would drain or charge its gang.
                for flight in owned:
                    self.release(flight)
                raise
            owned += more.owned
            joined += more.joined
            skipped += more.skipped
        return Taken(owned, joined, skipped)

    def release(self, flight: GangFlight) -> None:
        flight.close()
        if self._flights.get(flight.gang.key) is flight:
            del self._flights[flight.gang.key]


class Scheduler(Generic[D]):
    """A task per due notice, at once, running ``handle``; at most ``max_in_flight``."""

    def __init__(
        self,
        handle: Callable[[D], Awaitable[object]],
        *,
        max_in_flight: int,
        horizon_s: float,
    ) -> None:
        """``max_in_flight`` and ``horizon_s``: the settings' ``max_in_flight`` and
        ``schedule_horizon_s`` (their defaults are written there, once)."""
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be at least 1")
        self._handle = handle
        self._queue: EdfQueue[D] = EdfQueue(horizon_s)
        self._slots = asyncio.Semaphore(max_in_flight)
        self._running: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def depth(self) -> int:
        return len(self._queue) + len(self._running)

    def running(self, notice_id: str) -> bool:
        return notice_id in self._running

    async def submit(self, item: D) -> bool:
        if item.id in self._running:
            return False
        queued = await self._queue.put(item)
        if queued:
            self._idle.clear()
        return queued

    async def wait_idle(self) -> None:
        await self._idle.wait()

    async def run(self) -> None:
        try:
            while True:
                await self._slots.acquire()
                item = await self._queue.get()
                self._running.add(item.id)
                task = asyncio.create_task(self._one(item), name=f"notice {item.id[:60]}")
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
        finally:
            for task in self._tasks:
                task.cancel()
            with contextlib.suppress(Exception):
                await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _one(self, item: D) -> None:
        try:
            await self._handle(item)
        except Exception:
            # The claim stays open: the resume loop or a peer replica picks it up again.
            log.exception("notice failed", extra={"fields": {"notice_id": item.id}})
        finally:
            self._running.discard(item.id)
            self._slots.release()
            if not self._running and not len(self._queue):
                self._idle.set()
