"""Guarded PutObject: prefix scope, token bucket, retry budget, deadline-bounded retries.

A mass interruption makes every gang save at once, and S3 answers a burst on one prefix with
503 SlowDown while it re-partitions (ARCHITECTURE §6). Retrying blindly turns that into a
storm, and a retry that ends after the notice deadline is wasted work on a dying node. So every
PutObject made through ``GuardedPut`` goes through, in order:

1. **Prefix scope.** An identity (a tenant) writes only under its prefixes, by default
   ``checkpoints/{tenant}/``. Absolute keys, ``.``/``..``/empty segments, unusual characters
   and other prefixes are refused before any request is made.
2. **Token bucket per identity** (default 20 PutObject/s): shapes first attempts and retries
   alike, as botocore's adaptive mode does, so the initial burst is shaped too. A wait that
   would end too late to finish the attempt before the deadline is not started. In a storm
   reclaimd hands each rank its share of the tenant's budget (``putbudget``, ``set_share``):
   the bucket then runs at that rate, changed while puts wait (0 = wait until raised or the
   deadline), never above the guard's own limits.
3. **Full-jitter exponential backoff** (``uniform(0, min(cap, base x 2^n, remaining / 2))``),
   a larger base for throttling, retrying only 5xx, throttling codes and connection errors,
   never any other 4xx. A retry is not started when its sleep plus the expected attempt time
   (the identity's recent attempt durations, floored) would pass the deadline.
4. **Retry budget per identity**: retries in a sliding window stay below
   ``floor + ratio x requests`` in that window (the SRE book's 10 % per-client budget, Envoy's
   minimum). So N callers failing together make at most ``N x (1 + ratio) + floor`` attempts
   per window, whatever their per-request attempt limit says.

tenacity runs the retry loop; the stop rule (attempts, deadline, budget) and the wait rule
(jitter clamped by the remaining time) are reclaimd's. boto3 is synchronous: each attempt runs
in a worker thread. The client's own retries must be off (``make_s3_client`` does that),
otherwise every attempt here would hide up to two more.
"""

from __future__ import annotations

import asyncio
import io
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, BinaryIO, Final, Protocol

import boto3
import botocore.config
import botocore.exceptions
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception

from reclaimd_trainer.budget import Share
from reclaimd_trainer.guard import (
    DEFAULT_PREFIX,
    MAX_KEY_BYTES,
    ObjectStoreError,
    PrefixScope,
    RetryBudget,
    ScopeRefused,
    TokenBucket,
    check_identity,
)
from reclaimd_trainer.times import utcnow

# Re-exported: the guard's pure parts (reclaimd_trainer.guard), where callers import them.
__all__ = [
    "DEFAULT_PREFIX",
    "MAX_KEY_BYTES",
    "ObjectStoreError",
    "PrefixScope",
    "RetryBudget",
    "ScopeRefused",
    "TokenBucket",
    "check_identity",
]

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

THROTTLE_CODES: Final = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottled",
        "RequestThrottledException",
        "TooManyRequestsException",
        "RequestLimitExceeded",
        "ProvisionedThroughputExceededException",
        "BandwidthLimitExceeded",
    }
)
_SERVER_CODES: Final = frozenset({"InternalError", "ServiceUnavailable"})
_CONNECTION_ERRORS: Final = (
    botocore.exceptions.ConnectionError,  # connect refused/timeout, endpoint unreachable
    botocore.exceptions.HTTPClientError,  # read timeout, connection closed mid-response
    ConnectionError,
    TimeoutError,
)


class PutFailed(ObjectStoreError):
    """The put was given up: ``reason`` is rejected | attempts | deadline | budget."""

    def __init__(self, reason: str, message: str, code: str = "") -> None:
        super().__init__(message)
        self.reason = reason
        self.code = code


# --- what a put may be called with -------------------------------------------------------


class HasPutObject(Protocol):
    def put_object(self, **kwargs: Any) -> Mapping[str, Any]: ...


PutObjectFn = Callable[..., Mapping[str, Any]]
Body = bytes | bytearray | memoryview | BinaryIO


class Clock(Protocol):
    """Time as the guard sees it; tests pass a virtual one."""

    def monotonic(self) -> float: ...

    def wall(self) -> datetime: ...

    async def sleep(self, seconds: float) -> None: ...


class SystemClock:
    def monotonic(self) -> float:
        return time.monotonic()

    def wall(self) -> datetime:
        return utcnow()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


@dataclass(frozen=True)
class PutLimits:
    rate_per_s: float = 20.0  # PutObject per second per identity
    burst: float = 20.0  # tokens the bucket holds: one second of the rate by default
    retry_ratio: float = 0.1  # retries allowed per request in the window
    retry_floor: int = 3  # ... plus this many, so a lone caller can still retry
    budget_window_s: float = 10.0
    max_attempts: int = 3  # per request, first attempt included
    backoff_base_s: float = 0.1
    throttle_backoff_base_s: float = 0.5  # SlowDown asks for room: start further back
    backoff_cap_s: float = 20.0
    min_attempt_s: float = 0.25  # the least an attempt is assumed to take
    default_timeout_s: float = 60.0  # for a caller that names no deadline


# --- classification ----------------------------------------------------------------------


def _error_code(exc: BaseException) -> tuple[str, int]:
    if isinstance(exc, botocore.exceptions.ClientError):
        err = exc.response.get("Error", {})
        meta = exc.response.get("ResponseMetadata", {})
        return str(err.get("Code", "")), int(meta.get("HTTPStatusCode", 0) or 0)
    return "", 0


def is_throttle(exc: BaseException) -> bool:
    code, status = _error_code(exc)
    return code in THROTTLE_CODES or status == 429


def is_retryable(exc: BaseException) -> bool:
    """5xx, throttling (SlowDown is a 503; some services say 400/429 "Throttling") and
    connection errors. No other 4xx: a refused request fails the same way when repeated."""
    if isinstance(exc, _CONNECTION_ERRORS):
        return True
    code, status = _error_code(exc)
    return status >= 500 or code in THROTTLE_CODES or code in _SERVER_CODES or status == 429


@dataclass
class PutCounters:
    puts: int = 0  # requests that passed the scope
    attempts: int = 0  # PutObject calls made
    succeeded: int = 0
    failed: int = 0
    throttled_waits: int = 0  # attempts that waited for a token
    retries: int = 0
    budget_refused: int = 0
    deadline_giveups: int = 0
    scope_refused: int = 0

    def add(self, other: PutCounters) -> None:
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))


@dataclass
class _Identity:
    scope: PrefixScope
    bucket: TokenBucket
    budget: RetryBudget
    counters: PutCounters = field(default_factory=PutCounters)
    recent_attempt_s: float = 0.0  # moving average of attempt durations
    share: Share | None = None  # reclaimd's share of the tenant budget; None: own limits
    # One waiter at a time computes its wait, the others queue behind it in order.
    turn: asyncio.Lock = field(default_factory=asyncio.Lock)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def observe(self, seconds: float) -> None:
        self.recent_attempt_s = 0.8 * self.recent_attempt_s + 0.2 * max(0.0, seconds)

    def set_rate(self, rate: float, burst: float, now: float) -> None:
        self.bucket.set_rate(rate, burst, now)
        # Wake the waiter so it recomputes its wait at the new rate.
        done, self.changed = self.changed, asyncio.Event()
        done.set()

    async def acquire(self, clock: Clock, latest: Callable[[], float]) -> bool:
        """Take a token, waiting for it; ``True`` if it had to wait. ``latest()`` is the last
        moment an attempt may start. With a fixed rate a wait that ends past it is not begun;
        under a share (which may be raised, or be 0 = wait) it waits until then."""
        try:
            # The queue is bounded by this put's own deadline, not by the head's.
            async with asyncio.timeout(max(0.0, latest() - clock.monotonic())):
                await self.turn.acquire()
        except TimeoutError:
            raise _NoTime("no token in time to finish before the deadline") from None
        try:
            waited = False
            while True:
                now = clock.monotonic()
                wait = self.bucket.take(now)
                if wait == 0.0:
                    return waited
                room = latest() - now
                if room <= 1e-9 or (wait > room and self.share is None):
                    raise _NoTime("no token in time to finish before the deadline")
                waited = True
                wake = self.changed if self.share is not None else None
                await _sleep_or(clock, min(wait, room), wake)
        finally:
            self.turn.release()


async def _sleep_or(clock: Clock, seconds: float, event: asyncio.Event | None) -> None:
    """Sleep, or less if ``event`` is set meanwhile."""
    if event is None:
        await clock.sleep(seconds)
        return
    sleeper = asyncio.ensure_future(clock.sleep(seconds))
    waker = asyncio.ensure_future(event.wait())
    try:
        await asyncio.wait({sleeper, waker}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (sleeper, waker):
            task.cancel()
        await asyncio.gather(sleeper, waker, return_exceptions=True)


# --- the guard ---------------------------------------------------------------------------


class GuardedPut:
    """PutObject through scope, rate, budget and deadline; state is kept per identity.

    ``client`` is a boto3 S3 client or any callable taking ``put_object``'s keywords.
    An identity without an explicit ``allow`` gets ``PrefixScope.for_tenant(identity)``.
    """

    def __init__(
        self,
        client: HasPutObject | PutObjectFn,
        *,
        limits: PutLimits | None = None,
        clock: Clock | None = None,
        rng: random.Random | None = None,
    ) -> None:
        put = getattr(client, "put_object", None)
        self._put: PutObjectFn = put if callable(put) else client  # type: ignore[assignment]
        self.limits = limits or PutLimits()
        self._clock: Clock = clock or SystemClock()
        self._rng = rng or random.Random()
        self._ids: dict[str, _Identity] = {}

    def allow(self, identity: str, scope: PrefixScope) -> None:
        """Set the scope of an identity (replacing the default)."""
        self._identity(identity).scope = scope

    def counters(self, identity: str | None = None) -> PutCounters:
        """One identity's counters, or the sum over all of them."""
        if identity is not None:
            return self._identity(identity).counters
        total = PutCounters()
        for st in self._ids.values():
            total.add(st.counters)
        return total

    def _identity(self, identity: str) -> _Identity:
        st = self._ids.get(identity)
        if st is None:
            lim = self.limits
            st = _Identity(
                scope=PrefixScope.for_tenant(check_identity(identity)),
                bucket=TokenBucket(lim.rate_per_s, lim.burst, self._clock.monotonic()),
                budget=RetryBudget(lim.retry_ratio, lim.retry_floor, lim.budget_window_s),
            )
            self._ids[identity] = st
        return st

    async def put(
        self,
        identity: str,
        bucket: str,
        key: str,
        body: Body,
        *,
        deadline: datetime | None = None,
        **extra: Any,
    ) -> Mapping[str, Any]:
        """PutObject ``body`` at ``bucket/key`` for ``identity``, done before ``deadline``.

        Raises ``ScopeRefused`` (no request made) or ``PutFailed``; returns boto3's response.
        ``extra`` goes to ``put_object`` as is (ContentType, Metadata, checksums...).
        """
        st = self._identity(identity)
        try:
            st.scope.check(bucket, key)
        except ScopeRefused:
            st.counters.scope_refused += 1
            raise
        clock = self._clock
        if deadline is not None:
            remaining = (deadline - clock.wall()).total_seconds()
        else:
            remaining = self.limits.default_timeout_s
        call = _Call(self, st, end=clock.monotonic() + remaining, body=body)
        st.counters.puts += 1
        kwargs = {**extra, "Bucket": bucket, "Key": key, "Body": body}
        retrying = AsyncRetrying(
            retry=retry_if_exception(is_retryable),
            wait=call.wait,
            stop=call.stop,
            sleep=clock.sleep,
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    result = await call.attempt(attempt.retry_state.attempt_number, kwargs)
        except _NoTime as e:
            st.counters.failed += 1
            raise PutFailed("deadline", f"put {bucket}/{key}: {e}") from None
        except Exception as e:
            st.counters.failed += 1
            code, status = _error_code(e)
            reason = call.gave_up or "rejected"
            what = code or type(e).__name__
            raise PutFailed(
                reason, f"put {bucket}/{key}: {reason} after {what} ({status or '-'})", code
            ) from e
        st.counters.succeeded += 1
        return result

    def set_share(self, identity: str, share: Share | None) -> None:
        """Pace ``identity`` at reclaimd's share of its tenant's budget, changeable while puts
        wait (rate 0: they wait until it is raised or their deadline). Never above this guard's
        own limits; ``None`` goes back to them. Tokens are kept (clamped to the new burst)."""
        st = self._identity(identity)
        lim = self.limits
        st.share = share
        if share is None:
            st.set_rate(lim.rate_per_s, lim.burst, self._clock.monotonic())
        else:
            rate, burst = min(share.qps, lim.rate_per_s), min(float(share.burst), lim.burst)
            st.set_rate(rate, burst, self._clock.monotonic())

    def share(self, identity: str) -> Share | None:
        return self._identity(identity).share

    def bind(self, identity: str, bucket: str) -> BoundPut:
        """This guard as one identity writing one bucket (the workload helper's ``ObjectPut``)."""
        check_identity(identity)
        return BoundPut(self, identity, bucket)


class BoundPut:
    """``async put(key, body, *, deadline) -> uri`` for one identity and bucket."""

    def __init__(self, guard: GuardedPut, identity: str, bucket: str) -> None:
        self.guard = guard
        self.identity = identity
        self.bucket = bucket

    async def put(self, key: str, body: Body, *, deadline: datetime | None = None) -> str:
        await self.guard.put(self.identity, self.bucket, key, body, deadline=deadline)
        return f"s3://{self.bucket}/{key}"

    def set_put_budget(self, share: Share | None) -> None:
        """The workload helper's hook: reclaimd's share for this identity (``None``: own)."""
        self.guard.set_share(self.identity, share)


class _NoTime(Exception):
    """An attempt could not start early enough to finish before the deadline."""


class _Call:
    """One ``put``: its deadline, the reason it gave up, and tenacity's stop/wait hooks."""

    def __init__(self, guard: GuardedPut, st: _Identity, end: float, body: Body) -> None:
        self.limits = guard.limits
        self.clock = guard._clock
        self.rng = guard._rng
        self.put_fn = guard._put
        self.st = st
        self.end = end
        self.gave_up = ""
        # A file body is consumed by each attempt: every attempt starts where the first did.
        self.body_start = body.tell() if isinstance(body, io.IOBase) else None

    def estimate(self) -> float:
        return max(self.limits.min_attempt_s, self.st.recent_attempt_s)

    def wait(self, rs: RetryCallState) -> float:
        lim = self.limits
        exc = rs.outcome.exception() if rs.outcome is not None else None
        throttled = exc is not None and is_throttle(exc)
        base = lim.throttle_backoff_base_s if throttled else lim.backoff_base_s
        high = min(lim.backoff_cap_s, base * 2 ** (rs.attempt_number - 1))
        high = min(high, max(0.0, (self.end - self.clock.monotonic()) / 2))
        return self.rng.uniform(0.0, high)

    def stop(self, rs: RetryCallState) -> bool:
        """Runs after ``wait`` chose the sleep; granting a retry spends budget."""
        c = self.st.counters
        now = self.clock.monotonic()
        if rs.attempt_number >= self.limits.max_attempts:
            self.gave_up = "attempts"
            return True
        if now + rs.upcoming_sleep + self.estimate() > self.end:
            self.gave_up = "deadline"
            c.deadline_giveups += 1
            return True
        if not self.st.budget.try_spend(now):
            self.gave_up = "budget"
            c.budget_refused += 1
            return True
        c.retries += 1
        return False

    async def attempt(self, number: int, kwargs: dict[str, Any]) -> Mapping[str, Any]:
        st, c = self.st, self.st.counters
        try:
            # Retries take tokens too: a storm of 503s is paced like first attempts.
            if await st.acquire(self.clock, lambda: self.end - self.estimate()):
                c.throttled_waits += 1
        except _NoTime:
            c.deadline_giveups += 1
            raise
        estimate = self.estimate()
        now = self.clock.monotonic()
        if now + estimate > self.end:
            c.deadline_giveups += 1
            raise _NoTime("deadline too close to start an attempt")
        if number == 1:
            st.budget.note_request(now)
        if self.body_start is not None:
            kwargs["Body"].seek(self.body_start)
        c.attempts += 1
        # The thread cannot be stopped, but the caller is not kept past its deadline.
        guard = asyncio.timeout(self.end - now)
        try:
            async with guard:
                return await asyncio.to_thread(self.put_fn, **kwargs)
        except TimeoutError as e:
            if guard.expired():
                c.deadline_giveups += 1
                raise _NoTime("attempt outlived the deadline") from e
            raise
        finally:
            st.observe(self.clock.monotonic() - now)


def make_s3_client(
    *,
    endpoint_url: str | None = None,
    region: str = "us-east-1",
    connect_timeout_s: float = 5.0,
    read_timeout_s: float = 60.0,
    max_pool_connections: int = 32,
) -> S3Client:
    """A boto3 S3 client for ``GuardedPut``: its own retries off, path-style on a custom
    endpoint (moto, MinIO, a VPC endpoint by IP)."""
    config = botocore.config.Config(
        retries={"total_max_attempts": 1, "mode": "standard"},
        connect_timeout=connect_timeout_s,
        read_timeout=read_timeout_s,
        max_pool_connections=max_pool_connections,
        s3={"addressing_style": "path"} if endpoint_url else None,
    )
    return boto3.client("s3", endpoint_url=endpoint_url, region_name=region, config=config)
