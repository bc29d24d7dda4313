"""The guarded put paced at reclaimd's share: rate changed while puts wait, 0 = wait."""

import asyncio
import random
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import botocore.exceptions
import pytest

from reclaimd.putbudget import Share
from reclaimd_trainer.s3 import GuardedPut, PutFailed, PutLimits, TokenBucket

BUCKET = "ckpt-bucket"
BASE = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)


class ManualClock:
    """Time moves only when the test advances it; sleepers wake when their time has come."""

    def __init__(self) -> None:
        self.t = 0.0
        self._sleepers: list[tuple[float, asyncio.Future[None]]] = []
        self.idle: Callable[[], bool] = lambda: True  # no put attempt is still in its thread

    def monotonic(self) -> float:
        return self.t

    def wall(self) -> datetime:
        return BASE + timedelta(seconds=self.t)

    def after(self, seconds: float) -> datetime:
        return self.wall() + timedelta(seconds=seconds)

    async def sleep(self, seconds: float) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (self.t + seconds, fut)
        self._sleepers.append(entry)
        try:
            await fut
        finally:
            self._sleepers.remove(entry)

    async def advance(self, seconds: float, step: float = 0.025) -> None:
        end = round(self.t + seconds, 9)
        await self.settle()  # what was started runs at the current time first
        while self.t < end:
            self.t = min(end, round(self.t + step, 9))
            for wake, fut in list(self._sleepers):
                if wake <= self.t + 1e-9 and not fut.done():
                    fut.set_result(None)
            await self.settle()

    async def settle(self) -> None:
        # Let woken tasks run, and every attempt's worker thread finish and hand its result
        # back, before time moves on.
        for _ in range(1000):
            for _ in range(10):
                await asyncio.sleep(0)
            if self.idle():
                break
            await asyncio.sleep(0.001)
        for _ in range(10):
            await asyncio.sleep(0)


def slow_down() -> botocore.exceptions.ClientError:
    response: Any = {
        "Error": {"Code": "SlowDown", "Message": "Please reduce your request rate."},
        "ResponseMetadata": {"HTTPStatusCode": 503},
    }
    return botocore.exceptions.ClientError(response, "PutObject")


class Recorder:
    """put_object that records when each attempt started; fails with ``errors`` first."""

    def __init__(self, clock: ManualClock, errors: list[Exception] | None = None) -> None:
        self.clock = clock
        self.errors = list(errors or [])
        self.starts: list[float] = []
        self.finished = 0

    def put_object(self, **kw: Any) -> Mapping[str, Any]:
        self.starts.append(self.clock.t)
        try:
            if self.errors:
                raise self.errors.pop(0)
            return {"ETag": '"e"'}
        finally:
            self.finished += 1


def guard(s3: Recorder, clock: ManualClock, **limits: Any) -> GuardedPut:
    g = GuardedPut(s3, limits=PutLimits(**limits), clock=clock, rng=random.Random(3))
    clock.idle = lambda: g.counters().attempts == s3.finished
    return g


def puts(g: GuardedPut, n: int, deadline: datetime) -> list[asyncio.Task[Any]]:
    keys = [f"checkpoints/acme/p{i}" for i in range(n)]
    return [asyncio.ensure_future(g.put("acme", BUCKET, k, b"x", deadline=deadline)) for k in keys]


# --- the bucket ------------------------------------------------------------------------------


def test_a_new_rate_keeps_the_tokens_clamped_and_adds_none() -> None:
    b = TokenBucket(rate=20, burst=20, now=0.0)
    b.set_rate(1.0, 2.0, now=0.0)  # a full pod bucket takes a share of burst 2: 2 tokens
    assert [b.take(0.0) for _ in range(2)] == [0.0, 0.0]
    assert b.take(0.0) == pytest.approx(1.0)
    b.set_rate(4.0, 8.0, now=0.5)  # raised: what accrued at the old rate stays, no gift
    assert b.take(0.5) == pytest.approx(0.5 / 4.0)
    b.set_rate(0.0, 0.0, now=0.5)
    assert b.take(100.0) == float("inf")


def test_a_bucket_always_has_room_for_the_token_it_sends() -> None:
    b = TokenBucket(rate=2.0, burst=0.0, now=0.0)  # burst 0 with a rate: pace, no saving up
    assert b.take(0.0) == pytest.approx(0.5)
    assert b.take(0.5) == 0.0
    assert b.take(10.0) == 0.0  # idle for long: still one token, not twenty
    assert b.take(10.0) == pytest.approx(0.5)


# --- the guarded put under a share ---------------------------------------------------------


async def test_puts_are_paced_at_the_share() -> None:
    clock = ManualClock()
    s3 = Recorder(clock)
    g = guard(s3, clock)
    g.set_share("acme", Share(2.0, 1))
    tasks = puts(g, 5, clock.after(30))
    await clock.advance(3.0)
    await asyncio.gather(*tasks)
    assert s3.starts == pytest.approx([0.0, 0.5, 1.0, 1.5, 2.0], abs=0.03)


async def test_share_zero_waits_until_raised() -> None:
    clock = ManualClock()
    s3 = Recorder(clock)
    g = guard(s3, clock)
    g.set_share("acme", Share(0.0, 0))
    tasks = puts(g, 2, clock.after(30))
    await clock.advance(5.0)
    assert s3.starts == []
    g.set_share("acme", Share(4.0, 1))  # raised: no tokens come with it, they accrue at 4/s
    await clock.advance(1.0)
    await asyncio.gather(*tasks)
    assert s3.starts == pytest.approx([5.25, 5.5], abs=0.03)
    assert g.counters("acme").throttled_waits == 2


async def test_share_zero_to_the_deadline_gives_up_without_a_request() -> None:
    clock = ManualClock()
    s3 = Recorder(clock)
    g = guard(s3, clock, min_attempt_s=0.25)
    g.set_share("acme", Share(0.0, 0))
    tasks = puts(g, 1, clock.after(3.0))
    await clock.advance(4.0)
    with pytest.raises(PutFailed) as err:
        await tasks[0]
    assert err.value.reason == "deadline"
    assert s3.starts == []
    assert clock.t <= 4.0


async def test_a_lowered_share_slows_puts_already_waiting() -> None:
    clock = ManualClock()
    s3 = Recorder(clock)
    g = guard(s3, clock)
    g.set_share("acme", Share(10.0, 1))
    tasks = puts(g, 4, clock.after(30))
    await clock.advance(0.05)
    assert s3.starts == [0.0]
    # Lowered: the waiters notice at once, not at their old wake-up. The half token accrued
    # at 10/s stays; the other half takes 0.5 s at 1/s.
    g.set_share("acme", Share(1.0, 1))
    await clock.advance(4.0)
    await asyncio.gather(*tasks)
    assert s3.starts[1:] == pytest.approx([0.55, 1.55, 2.55], abs=0.03)


async def test_retries_take_tokens_from_the_same_share() -> None:
    clock = ManualClock()
    s3 = Recorder(clock, [slow_down(), slow_down()])
    g = guard(s3, clock, max_attempts=5, throttle_backoff_base_s=0.01)
    g.set_share("acme", Share(1.0, 1))
    tasks = puts(g, 1, clock.after(30))
    await clock.advance(3.5)
    await asyncio.gather(*tasks)
    # Backoff alone would retry within 0.02 s; the share allows one attempt per second.
    assert s3.starts == pytest.approx([0.0, 1.0, 2.0], abs=0.03)
    c = g.counters("acme")
    assert (c.attempts, c.retries, c.succeeded) == (3, 2, 1)


async def test_retries_stay_inside_the_retry_budget_under_a_share() -> None:
    clock = ManualClock()
    s3 = Recorder(clock, [slow_down()] * 10)
    g = guard(s3, clock, max_attempts=10, retry_floor=2, retry_ratio=0.0, backoff_cap_s=0.1)
    g.set_share("acme", Share(5.0, 1))
    tasks = puts(g, 1, clock.after(30))
    await clock.advance(3.0)
    with pytest.raises(PutFailed) as err:
        await tasks[0]
    assert err.value.reason == "budget"
    assert len(s3.starts) == 3  # the first attempt and the two retries the budget allows


async def test_a_share_never_raises_the_guard_above_its_own_limit() -> None:
    clock = ManualClock()
    s3 = Recorder(clock)
    g = guard(s3, clock, rate_per_s=2.0, burst=1.0)
    g.set_share("acme", Share(100.0, 50))
    tasks = puts(g, 3, clock.after(30))
    await clock.advance(1.5)
    await asyncio.gather(*tasks)
    assert s3.starts == pytest.approx([0.0, 0.5, 1.0], abs=0.03)


async def test_no_share_goes_back_to_the_own_limit() -> None:
    clock = ManualClock()
    s3 = Recorder(clock)
    g = guard(s3, clock, rate_per_s=20.0, burst=20.0)
    g.set_share("acme", Share(0.0, 0))
    tasks = puts(g, 3, clock.after(30))
    await clock.advance(1.0)
    assert s3.starts == []
    g.set_share("acme", None)
    await clock.advance(0.5)
    await asyncio.gather(*tasks)
    assert g.share("acme") is None
    # The zero share kept no tokens; at the own 20/s they accrue again from 1.0 s on.
    assert s3.starts == pytest.approx([1.05, 1.1, 1.15], abs=0.03)


async def test_a_put_queued_behind_a_waiting_one_gives_up_at_its_own_deadline() -> None:
    clock = ManualClock()
    s3 = Recorder(clock)
    g = guard(s3, clock, min_attempt_s=0.25)
    g.set_share("acme", Share(0.0, 0))
    head = puts(g, 1, clock.after(30))[0]  # waits for a raise that does not come
    await clock.settle()
    queued = asyncio.ensure_future(
        g.put("acme", BUCKET, "checkpoints/acme/q", b"x", deadline=clock.after(0.5))
    )
    # Its queueing is bounded by its own deadline (in the loop's time), not the head's 30 s.
    with pytest.raises(PutFailed) as err:
        await asyncio.wait_for(queued, 5.0)
    assert err.value.reason == "deadline"
    assert not head.done() and s3.starts == []
    head.cancel()
