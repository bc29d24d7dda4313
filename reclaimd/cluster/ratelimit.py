"""One client-side limiter for every Kubernetes write, served earliest deadline first.

A mass interruption (a zone's Spot capacity reclaimed) turns into hundreds of claims,
cordons and evictions at once. The API server protects itself (priority and fairness, 429),
but then the order of our writes is whatever the retries make it. A token bucket here keeps
us under the server's limits, and its queue is a heap keyed by the notice deadline, so the
node that dies in 20 s is cordoned before the one that dies in 110 s.

Tokens refill at ``qps`` up to ``burst``. A caller takes a token at once when nobody waits;
otherwise it queues and one dispatcher task hands out tokens as they refill, always to the
earliest deadline (ties: first come). A waiter cancelled after being served gives its token
back, so cancellation never leaks capacity.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True)
class RateSettings:
    qps: float = 50.0
    """Sustained writes per second; client-go's controllers default lower (5 to 20), but a
    storm is exactly when we want to spend the server's headroom."""

    burst: int = 100
    """Writes allowed at once after a quiet period: one storm's claims and cordons."""


class RateLimiter:
    def __init__(self, settings: RateSettings = RateSettings()) -> None:
        if settings.qps <= 0 or settings.burst < 1:
            raise ValueError("rate limiter: qps must be > 0 and burst >= 1")
        self._qps = settings.qps
        self._burst = float(settings.burst)
        self._tokens = float(settings.burst)
        self._stamp: float | None = None
        self._waiters: list[tuple[float, int, asyncio.Future[None]]] = []
        self._order = itertools.count()
        self._dispatcher: asyncio.Task[None] | None = None
        self.throttled = 0  # acquisitions that had to wait

    @property
    def waiting(self) -> int:
        return sum(1 for *_, fut in self._waiters if not fut.done())

    async def acquire(self, deadline: datetime | None = None) -> None:
        """Wait for a token; among waiters, the earliest ``deadline`` is served first."""
        loop = asyncio.get_running_loop()
        self._refill(loop.time())
        if not self._waiters and self._tokens >= 1:
            self._tokens -= 1
            return
        key = deadline.timestamp() if deadline is not None else math.inf
        fut: asyncio.Future[None] = loop.create_future()
        self.throttled += 1  # had to queue: the client-side limit, not the server, held it
        heapq.heappush(self._waiters, (key, next(self._order), fut))
        if self._dispatcher is None or self._dispatcher.done():
            self._dispatcher = loop.create_task(self._dispatch(), name="k8s-rate-limiter")
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                # Served, then cancelled before running: the token was never used.
                self._tokens = min(self._burst, self._tokens + 1)
            raise

    def _refill(self, now: float) -> None:
        if self._stamp is not None:
            self._tokens = min(self._burst, self._tokens + (now - self._stamp) * self._qps)
        self._stamp = now

    async def _dispatch(self) -> None:
        loop = asyncio.get_running_loop()
        while self._waiters:
            self._refill(loop.time())
            if self._tokens < 1:
                await asyncio.sleep((1 - self._tokens) / self._qps)
                continue
            _, _, fut = heapq.heappop(self._waiters)
            if fut.done():  # its caller was cancelled while queued
                continue
            self._tokens -= 1
            fut.set_result(None)
