"""The one write budget for every Kubernetes write: adaptive, served earliest deadline first.

A mass interruption (a zone's Spot capacity reclaimed) turns into hundreds of claims,
evictions and Leases at once. The API server protects itself (API Priority and Fairness
answers 429 with ``Retry-After``), but then the order of our writes is whatever the retries
make it. So every write takes a token here first, and the queue of waiters is a heap keyed by
the notice deadline: the node that dies in 20 s is served before the one that dies in 110 s.

The rate adapts (AIMD): it starts at ``start_qps`` (near what an API server takes), grows
while the server accepts, halves when the server pushes back (429 from priority and fairness,
``Retry-After``, 5xx overload), and every waiter holds off until a ``Retry-After`` has passed.
``qps`` is the operator's cap and is never exceeded. Each replica adapts on its own signals.

``call`` is the one place that makes a Kubernetes call and retries it: a write takes the
token, a read (``read``) does not; both turn failures into ``KubeError``
(``errors.kube_errors``), bound each attempt by a timeout (a half-open connection must not
outlive the deadline), feed the outcome back into the rate, and retry transient failures (429
from priority and fairness, 5xx, timeouts, resets) with full jitter, never sooner than
``Retry-After`` and never past the deadline. Logic-level answers (404, a PDB's refusal) go
back to the caller, who knows what they mean; a 409 conflict is handled by ``update``, the
one read-modify-write loop.

Writes already due (their order is past: a notice's claim and cordon, its gangs' Leases and
their acks, sorted as of the notice's issue) may use every slot in flight. While such writes
are about (one waits, or went in the last second), writes due later (evictions due by a
deadline minutes away, events, ledger records) leave a quarter of the slots
(``URGENT_RESERVE``) to them; once they are gone, the later ones take every slot again (an
eviction's answer takes seconds: its share of the slots is the drain's pace). Served
earliest-deadline-first alone, a storm's evictions filled every slot once the queue ahead
was empty, and each notice arriving next waited for one of them to be answered (and behind
them at the server) before its cordon was sent: a second or more per write at a loaded
server, twice on the way to the checkpoint ask.

A waiter cancelled after being served gives its token back, so cancellation never leaks
capacity.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import math
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

from reclaimd.backoff import RetryPolicy
from reclaimd.cluster import errors
from reclaimd.settings.kube import KubeSettings

T = TypeVar("T")
R = TypeVar("R")

# The share of the writes in flight that only writes already due may take (see above).
URGENT_RESERVE = 0.25
# Housekeeping's order (holder and slot Lease renewals): before any notice's deadline, so it is
# served first, and never taken for a storm's intake (``busy_with_due``): renewed every second,
# it would keep every housekeeping LIST waiting its whole ``quiet``.
FIRST = datetime(1970, 1, 2, tzinfo=UTC)
_FIRST_KEY = FIRST.timestamp()
# ``quiet``: a write already due sent this recently means the intake is still busy.
QUIET_AFTER_S = 1.0
QUIET_POLL_S = 0.25


class RateLimiter:
    def __init__(self, settings: KubeSettings = KubeSettings()) -> None:
        if settings.qps <= 0 or settings.burst < 1:
            raise ValueError("rate limiter: qps must be > 0 and burst >= 1")
        if settings.min_qps <= 0:
            raise ValueError("rate limiter: min_qps must be > 0")
        if settings.max_in_flight < 1:
            raise ValueError("rate limiter: max_in_flight must be >= 1")
        self.settings = settings
        self.rate = min(settings.qps, settings.start_qps)
        self._burst = float(settings.burst)
        self._tokens = float(settings.burst)
        self._stamp: float | None = None
        self._hold_until = 0.0  # loop time before which nobody is served (Retry-After)
        self._last_cut = -math.inf
        self._waiters: list[tuple[float, int, asyncio.Future[None]]] = []
        self._order = itertools.count()
        self._dispatcher: asyncio.Task[None] | None = None
        self._busy = 0  # writes in flight (served, not yet released)
        self._freed = asyncio.Event()  # a slot was freed, or a write already due came to wait
        reserve = int(settings.max_in_flight * URGENT_RESERVE)
        self._later_cap = max(1, settings.max_in_flight - reserve)  # slots for writes due later
        self._due_sent_at = -math.inf  # monotonic time a write already due was last served
        self.throttled = 0  # acquisitions that had to wait for a token
        self.pushed_back = 0  # writes the server refused as overload (429 APF, 5xx)
        self.writes = 0  # writes the server answered (accepted, or refused for the object)
        self.by_kind: Counter[str] = Counter()  # attempts by kind: "evict pod", "create lease"
        self.reads = 0  # read attempts (outside the budget)
        self.retried = 0  # attempts that failed transiently and were tried again
        self._answered_at: float | None = None  # loop time the server last answered anything
        # By kind: [attempts, seconds queued for the budget, seconds with the server, worst
        # queued]: where a storm's write time goes (ours, the queue; the server's, the call).
        self.timing: dict[str, list[float]] = {}

    def tally(self) -> dict[str, Any]:
        """How the budget fared (a storm's post-mortem): writes that waited, were pushed back
        by the server or retried, reads, the rate it ended at, and by kind the mean seconds a
        write queued for the budget and spent with the server (and the worst queueing)."""
        return {
            "throttled": self.throttled,
            "pushed_back": self.pushed_back,
            "retried": self.retried,
            "reads": self.reads,
            "rate": round(self.rate, 1),
            "by_kind_s": {
                kind: {
                    "n": int(n),
                    "queued_mean": round(queued / n, 3),
                    "server_mean": round(server / n, 3),
                    "queued_max": round(worst, 3),
                }
                for kind, (n, queued, server, worst) in sorted(self.timing.items())
                if n
            },
        }

    @property
    def waiting(self) -> int:
        return sum(1 for *_, fut in self._waiters if not fut.done())

    @property
    def busy_with_due(self) -> bool:
        """A write already due waits for the budget, or was sent in the last second: a storm's
        intake (claims, cordons, gang Leases) is under way."""
        now = time.time()
        if self._waiters and _FIRST_KEY < self._waiters[0][0] <= now:
            return True
        return time.monotonic() - self._due_sent_at < QUIET_AFTER_S

    async def quiet(self, max_s: float) -> None:
        """Return once no write already due is waiting or just sent (``busy_with_due``), or
        after ``max_s``: a housekeeping read of hundreds of objects (a LIST whose answer
        takes seconds to encode at the server and to decode on the loop) waits for the
        intake it would slow down."""
        end = time.monotonic() + max_s
        while time.monotonic() < end:
            if not self.busy_with_due:
                return
            await asyncio.sleep(QUIET_POLL_S)

    async def acquire(self, deadline: datetime | None = None) -> None:
        """Wait for a token and a slot in flight (give it back with ``release``); among
        waiters, the earliest ``deadline`` is served first."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        self._refill(now)
        key = deadline.timestamp() if deadline is not None else math.inf
        free = self._busy < self._cap(key)
        if not self._waiters and self._tokens >= 1 and now >= self._hold_until and free:
            self._tokens -= 1
            self._busy += 1
            return
        fut: asyncio.Future[None] = loop.create_future()
        self.throttled += 1
        heapq.heappush(self._waiters, (key, next(self._order), fut))
        if self._busy < self.settings.max_in_flight:
            self._freed.set()  # a dispatcher holding the reserve may serve this one now
        if self._dispatcher is None or self._dispatcher.done():
            self._dispatcher = loop.create_task(self._dispatch(), name="k8s-write-budget")
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                # Served, then cancelled before running: the token was never used.
                self._tokens = min(self._burst, self._tokens + 1)
                self.release()
            raise

    def release(self) -> None:
        """A write served by ``acquire`` was answered (or given up): its slot is free."""
        self._busy = max(0, self._busy - 1)
        self._freed.set()

    # --- feedback from the server ---------------------------------------------------------

    def accepted(self) -> None:
        """A write went through: the rate may grow (``_refill`` applies it with time)."""
        self.writes += 1

    def pushed(self, retry_after_s: float | None) -> None:
        """The server said "too many": halve the rate (once per second at most, since every
        write in flight gets the same answer) and hold everyone until ``Retry-After``."""
        self.pushed_back += 1
        now = asyncio.get_running_loop().time()
        if now - self._last_cut >= 1.0:
            self._last_cut = now
            self.rate = max(self.settings.min_qps, self.rate / 2)
            self._tokens = min(self._tokens, 1.0)
        if retry_after_s:
            self._hold_until = max(self._hold_until, now + min(retry_after_s, 30.0))

    async def while_answered(self, silent_s: float, call: Awaitable[T]) -> T:
        """``call``, given up (``errors.ServerError``, status 0) once the server has answered
        nothing of ours for ``silent_s`` since the call began: a call queued behind a storm
        goes on (a loaded server still answers every second), one whose server is out of reach
        (a partition, a black-holed connection) does not hold what waits on it, such as a
        transport's message, until a deadline."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        task = asyncio.ensure_future(call)
        try:
            while True:
                heard = max(started, self._answered_at or started)
                left = heard + silent_s - loop.time()
                if left <= 0:
                    raise errors.ServerError("api server", 0, f"no answer for {silent_s:g}s")
                done, _ = await asyncio.wait({task}, timeout=min(1.0, left))
                if done:
                    return task.result()
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, errors.KubeError):
                    await task

    # --- the one retry point ----------------------------------------------------------------

    async def call(
        self,
        what: str,
        deadline: datetime | None,
        write: Callable[[], Awaitable[T]],
        *,
        retry_until: datetime | None = None,
    ) -> T:
        """Make one Kubernetes write under the budget; retry what the server asked us to retry.

        Retried: 429 from priority and fairness (``errors.Throttled``), 5xx, timeouts and
        transport failures, with full-jitter backoff (at least ``Retry-After``), until
        ``retry_until`` (default: ``deadline``, which also orders the queue) or, without
        either, ``max_attempts``; a 403 for ``forbidden_grace_s`` (a restarted API server's
        authorizer). Everything else is raised as ``KubeError``.
        """
        return await self._attempts(what, deadline, write, retry_until, budgeted=True)

    async def read(
        self,
        what: str,
        deadline: datetime | None,
        fetch: Callable[[], Awaitable[T]],
        *,
        retry_until: datetime | None = None,
    ) -> T:
        """A read, retried like a write but outside the write budget (reads are cheap for the
        server and a storm's writes must not wait behind them)."""
        return await self._attempts(what, deadline, fetch, retry_until, budgeted=False)

    async def update(
        self,
        what: str,
        deadline: datetime | None,
        fetch: Callable[[], Awaitable[R]],
        change: Callable[[R], Awaitable[T]],
        *,
        first: R | None = None,
        retry_until: datetime | None = None,
        conflicts: int | None = None,
    ) -> T:
        """The one read-modify-write loop: ``change(current)`` makes a conditional write (it
        sends the resourceVersion it read); a 409 means someone wrote in between, so the object
        is read again (``fetch``) and ``change`` decides again. ``first``: a copy to try before
        any read (the cache's). ``change`` may raise ``errors.Conflict`` itself to ask for a
        fresh read; anything ``change`` returns ends the loop."""
        current = first
        tries = conflicts or self.settings.max_conflicts
        for _ in range(tries):
            if current is None:
                current = await self.read(f"read {what}", deadline, fetch, retry_until=retry_until)
            try:
                return await change(current)
            except errors.Conflict:
                current = None
        raise errors.Conflict(what, 409, f"still conflicting after {tries} re-reads")

    async def _attempts(
        self,
        what: str,
        deadline: datetime | None,
        fn: Callable[[], Awaitable[T]],
        retry_until: datetime | None,
        *,
        budgeted: bool,
    ) -> T:
        s = self.settings
        until = retry_until or deadline
        kind = what.split("/", 1)[0]
        forbidden_until: float | None = None  # the grace counts from the first 403
        loop = asyncio.get_running_loop()
        for attempt in itertools.count(1):
            asked = loop.time()
            if budgeted:
                await self.acquire(deadline)
                self.by_kind[kind] += 1
            else:
                self.reads += 1
            served = loop.time()
            try:
                with errors.kube_errors(what):
                    # Against a connection that never answers, not against a slow server: a
                    # loaded API server answers in seconds, and a write cut short is only
                    # sent again (a renewal cut at its deadline never lands at all).
                    async with asyncio.timeout(s.attempt_timeout_s):
                        try:
                            result = await fn()
                        finally:
                            if budgeted:
                                self.release()
                            self._timed(kind, served - asked, loop.time() - served)
            except errors.KubeError as e:
                if e.status:
                    self._answered_at = asyncio.get_running_loop().time()
                if not (e.transient or e.retried_in_grace):
                    if budgeted:
                        self.accepted()  # an answer about the object, not about the load
                    raise
                if e.retried_in_grace:
                    if forbidden_until is None:
                        forbidden_until = time.time() + s.forbidden_grace_s
                    if time.time() >= forbidden_until:
                        raise
                # Overload slows everyone down; a 403 in the grace says nothing of the load.
                overload = isinstance(e, errors.Throttled) or (
                    budgeted and isinstance(e, errors.ServerError)
                )
                if overload:
                    self.pushed(e.retry_after_s if isinstance(e, errors.Throttled) else None)
                # Full jitter, never sooner than the server's Retry-After.
                policy = RetryPolicy(s.retry_base_s, s.retry_cap_s)
                delay = policy.delay(attempt, hint_s=e.retry_after_s)
                left = None if until is None else until.timestamp() - time.time()
                if not policy.allows(delay, attempt, left_s=left, max_attempts=s.max_attempts):
                    raise
                self.retried += 1
                await asyncio.sleep(delay)
                continue
            self._answered_at = asyncio.get_running_loop().time()
            if budgeted:
                self.accepted()
            return result
        raise AssertionError("unreachable")  # pragma: no cover

    def _timed(self, kind: str, queued: float, server: float) -> None:
        t = self.timing.get(kind)
        if t is None:
            t = self.timing[kind] = [0, 0.0, 0.0, 0.0]
        t[0] += 1
        t[1] += queued
        t[2] += server
        t[3] = max(t[3], queued)

    def _cap(self, key: float) -> int:
        """Slots in flight a write ordered at ``key`` may use: all of them once it is due, or
        while no write already due is about (``busy_with_due``: the drains of a storm whose
        intake is over take every slot)."""
        if key <= time.time():
            if key > _FIRST_KEY:
                self._due_sent_at = time.monotonic()  # asked for a due write: intake is busy
            return self.settings.max_in_flight
        return self._later_cap if self.busy_with_due else self.settings.max_in_flight

    # --- the bucket -------------------------------------------------------------------------

    def _refill(self, now: float) -> None:
        if self._stamp is not None:
            elapsed = max(0.0, now - self._stamp)
            self._tokens = min(self._burst, self._tokens + elapsed * self.rate)
            if self._waiters and now - self._last_cut > 1.0:
                # Demand above the rate and no push-back for a second: probe for more.
                grown = self.rate * (1 + self.settings.growth_per_s * elapsed)
                self.rate = min(self.settings.qps, grown)
        self._stamp = now

    async def _dispatch(self) -> None:
        loop = asyncio.get_running_loop()
        while self._waiters:
            now = loop.time()
            self._refill(now)
            if now < self._hold_until:
                await asyncio.sleep(self._hold_until - now)
                continue
            if self._tokens < 1:
                await asyncio.sleep((1 - self._tokens) / self.rate)
                continue
            key, _, fut = self._waiters[0]
            if fut.done():  # its caller was cancelled while queued
                heapq.heappop(self._waiters)
                continue
            if self._busy >= self._cap(key):
                self._freed.clear()
                await self._freed.wait()
                continue
            heapq.heappop(self._waiters)
            self._tokens -= 1
            self._busy += 1
            fut.set_result(None)
