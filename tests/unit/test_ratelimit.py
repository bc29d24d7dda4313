"""The write limiter: a token bucket whose waiters are served earliest deadline first."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest

from reclaimd.cluster.ratelimit import RateLimiter, RateSettings

T0 = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)


def at(seconds: int) -> datetime:
    return T0 + timedelta(seconds=seconds)


async def test_burst_is_served_at_once() -> None:
    limiter = RateLimiter(RateSettings(qps=1.0, burst=3))
    for _ in range(3):
        await limiter.acquire()
    assert limiter.waiting == 0


async def test_queued_writes_are_served_earliest_deadline_first() -> None:
    limiter = RateLimiter(RateSettings(qps=200.0, burst=1))
    await limiter.acquire()  # the bucket is empty: everyone below queues
    served: list[str] = []

    async def write(name: str, deadline: datetime | None) -> None:
        await limiter.acquire(deadline)
        served.append(name)

    tasks = [asyncio.create_task(write(n, d)) for n, d in
             [("late", at(110)), ("none", None), ("soon", at(20)), ("mid", at(60)),
              ("soon-too", at(20))]]
    await asyncio.sleep(0)  # every task queues before the first refill
    assert limiter.waiting == 5
    await asyncio.gather(*tasks)
    # Ties keep arrival order; a write without a deadline goes last.
    assert served == ["soon", "soon-too", "mid", "late", "none"]


async def test_a_cancelled_waiter_is_skipped_and_keeps_no_token() -> None:
    limiter = RateLimiter(RateSettings(qps=200.0, burst=1))
    await limiter.acquire()
    served: list[str] = []

    async def write(name: str, deadline: datetime) -> None:
        await limiter.acquire(deadline)
        served.append(name)

    first = asyncio.create_task(write("first", at(10)))
    second = asyncio.create_task(write("second", at(20)))
    await asyncio.sleep(0)
    first.cancel()
    await asyncio.gather(first, second, return_exceptions=True)
    assert served == ["second"]
    assert limiter.waiting == 0


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="qps"):
        RateLimiter(RateSettings(qps=0, burst=1))
