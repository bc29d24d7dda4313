import asyncio
import io
import random
import threading
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import botocore.exceptions
import pytest

from reclaimd_trainer.s3 import (
    GuardedPut,
    PrefixScope,
    PutFailed,
    PutLimits,
    RetryBudget,
    ScopeRefused,
    TokenBucket,
    is_retryable,
)

BUCKET = "ckpt-bucket"


class VirtualClock:
    """Time moves only when someone sleeps; a sleep wakes no earlier than asked."""

    def __init__(self) -> None:
        self.t = 0.0
        self.base = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)

    def monotonic(self) -> float:
        return self.t

    def wall(self) -> datetime:
        return self.base + timedelta(seconds=self.t)

    async def sleep(self, seconds: float) -> None:
        target = self.t + seconds
        await asyncio.sleep(0)  # let the other callers run first, as a real sleep would
        self.t = max(self.t, target)

    def after(self, seconds: float) -> datetime:
        return self.wall() + timedelta(seconds=seconds)


def client_error(code: str, status: int) -> botocore.exceptions.ClientError:
    response: Any = {
        "Error": {"Code": code, "Message": "m"},
        "ResponseMetadata": {"HTTPStatusCode": status},
    }
    return botocore.exceptions.ClientError(response, "PutObject")


class FakeS3:
    """A put_object callable: fails with ``errors`` in turn, then succeeds; records starts."""

    def __init__(self, clock: VirtualClock, errors: list[Exception] | None = None) -> None:
        self.clock = clock
        self.errors = list(errors or [])
        self.starts: list[float] = []
        self.bodies: list[bytes] = []
        self._lock = threading.Lock()

    def put_object(self, **kw: Any) -> Mapping[str, Any]:
        with self._lock:
            self.starts.append(self.clock.monotonic())
            body = kw["Body"]
            self.bodies.append(body.read() if hasattr(body, "read") else bytes(body))
            if self.errors:
                raise self.errors.pop(0)
        return {"ETag": '"abc"'}


def guard(s3: Any, clock: VirtualClock, **limits: Any) -> GuardedPut:
    return GuardedPut(s3, limits=PutLimits(**limits), clock=clock, rng=random.Random(7))


# --- scope -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "key",
    [
        "checkpoints/acme/job/step-100/shard-0.pt",
        "checkpoints/acme/x",
        "checkpoints/acme/a=b/t:2026-03-01T12:00:00Z",
    ],
)
def test_default_scope_allows_the_tenant_prefix(key: str) -> None:
    PrefixScope.for_tenant("acme").check(BUCKET, key)


@pytest.mark.parametrize(
    "key",
    [
        "checkpoints/other/x",
        "checkpoints/acme-evil/x",
        "checkpoints/acme",
        "checkpoints/acme/",
        "/checkpoints/acme/x",
        "checkpoints/acme/../other/x",
        "checkpoints/acme/./x",
        "checkpoints/acme//x",
        "checkpoints\\acme\\x",
        "checkpoints/acme/ü",
        "checkpoints/acme/a b",
        "checkpoints/acme/" + "x" * 1020,
        "",
        "../checkpoints/acme/x",
    ],
)
def test_keys_outside_the_scope_are_refused(key: str) -> None:
    with pytest.raises(ScopeRefused):
        PrefixScope.for_tenant("acme").check(BUCKET, key)


@pytest.mark.parametrize("tenant", ["..", "a/b", "", "x" * 64, "ten ant", ".hidden"])
def test_unusable_tenant_names_are_refused(tenant: str) -> None:
    with pytest.raises(ScopeRefused):
        PrefixScope.for_tenant(tenant)


def test_bucket_allowlist_and_bucket_name_rules() -> None:
    scope = PrefixScope.for_tenant("acme", buckets=[BUCKET])
    scope.check(BUCKET, "checkpoints/acme/x")
    for bad in ("other-bucket", "Bad_Bucket", "a"):
        with pytest.raises(ScopeRefused):
            scope.check(bad, "checkpoints/acme/x")


def test_scope_prefixes_are_validated() -> None:
    with pytest.raises(ValueError, match="prefix"):
        PrefixScope(("no-trailing-slash",))
    with pytest.raises(ValueError, match="prefix"):
        PrefixScope(("a/../b/",))


async def test_refused_key_makes_no_request() -> None:
    clock = VirtualClock()
    s3 = FakeS3(clock)
    g = guard(s3, clock)
    with pytest.raises(ScopeRefused):
        await g.put("acme", BUCKET, "checkpoints/globex/x", b"data")
    with pytest.raises(ScopeRefused):
        await g.put("../acme", BUCKET, "checkpoints/acme/x", b"data")
    assert s3.starts == []
    assert g.counters("acme").scope_refused == 1
    assert g.counters("acme").puts == 0


async def test_explicit_scope_replaces_the_default() -> None:
    clock = VirtualClock()
    s3 = FakeS3(clock)
    g = guard(s3, clock)
    g.allow("reclaimd", PrefixScope(("ledger/", "spans/")))
    await g.put("reclaimd", BUCKET, "spans/2026/03/01.jsonl", b"{}")
    with pytest.raises(ScopeRefused):
        await g.put("reclaimd", BUCKET, "checkpoints/reclaimd/x", b"{}")
    assert len(s3.starts) == 1


# --- token bucket and retry budget (pure) ----------------------------------------------


def test_token_bucket_burst_then_rate() -> None:
    b = TokenBucket(rate=20, burst=20, now=0.0)
    assert [b.reserve(0.0, max_wait=10) for _ in range(20)] == [0.0] * 20
    assert b.reserve(0.0, max_wait=10) == pytest.approx(0.05)
    assert b.reserve(0.0, max_wait=10) == pytest.approx(0.10)
    # Refused reservations take nothing: the next caller's wait is unchanged.
    assert b.reserve(0.0, max_wait=0.1) is None
    assert b.reserve(0.0, max_wait=10) == pytest.approx(0.15)
    # After a long pause the bucket is full again, never fuller than the burst.
    assert [b.reserve(100.0, max_wait=0) for _ in range(20)] == [0.0] * 20
    assert b.reserve(100.0, max_wait=0) is None


def test_retry_budget_is_a_fraction_of_requests_plus_a_floor() -> None:
    rb = RetryBudget(ratio=0.1, floor=3, window_s=10)
    assert [rb.try_spend(0.0) for _ in range(4)] == [True, True, True, False]
    for _ in range(20):
        rb.note_request(1.0)
    # floor 3 + 10 % of 20 = 5 retries in the window, 3 already spent.
    assert [rb.try_spend(1.0) for _ in range(3)] == [True, True, False]


def test_retry_budget_window_slides() -> None:
    rb = RetryBudget(ratio=0.0, floor=2, window_s=10)
    assert rb.try_spend(0.0) and rb.try_spend(5.0)
    assert not rb.try_spend(9.0)
    assert rb.try_spend(10.5)  # the retry at t=0 left the window


@pytest.mark.parametrize(
    ("exc", "retry"),
    [
        (client_error("SlowDown", 503), True),
        (client_error("InternalError", 500), True),
        (client_error("ServiceUnavailable", 503), True),
        (client_error("Throttling", 400), True),
        (client_error("TooManyRequests", 429), True),
        (client_error("AccessDenied", 403), False),
        (client_error("NoSuchBucket", 404), False),
        (client_error("InvalidRequest", 400), False),
        (client_error("EntityTooLarge", 400), False),
        (botocore.exceptions.EndpointConnectionError(endpoint_url="http://x"), True),
        (botocore.exceptions.ReadTimeoutError(endpoint_url="http://x"), True),
        (ConnectionResetError(), True),
        (ValueError("bug"), False),
    ],
)
def test_retry_classification(exc: Exception, retry: bool) -> None:
    assert is_retryable(exc) is retry


# --- the guarded put -------------------------------------------------------------------


async def test_transient_error_is_retried_then_succeeds() -> None:
    clock = VirtualClock()
    s3 = FakeS3(clock, [client_error("SlowDown", 503)])
    g = guard(s3, clock)
    out = await g.put("acme", BUCKET, "checkpoints/acme/x", b"data", deadline=clock.after(30))
    assert out["ETag"] == '"abc"'
    c = g.counters("acme")
    assert (c.puts, c.attempts, c.retries, c.succeeded, c.failed) == (1, 2, 1, 1, 0)


async def test_4xx_is_never_retried() -> None:
    clock = VirtualClock()
    s3 = FakeS3(clock, [client_error("AccessDenied", 403)])
    g = guard(s3, clock)
    with pytest.raises(PutFailed) as err:
        await g.put("acme", BUCKET, "checkpoints/acme/x", b"data", deadline=clock.after(30))
    assert err.value.reason == "rejected" and err.value.code == "AccessDenied"
    assert "\n" not in str(err.value)
    assert len(s3.starts) == 1
    assert g.counters("acme").retries == 0


async def test_attempt_limit_per_request() -> None:
    clock = VirtualClock()
    s3 = FakeS3(clock, [client_error("InternalError", 500)] * 10)
    g = guard(s3, clock, max_attempts=3, retry_floor=10)
    with pytest.raises(PutFailed) as err:
        await g.put("acme", BUCKET, "checkpoints/acme/x", b"data", deadline=clock.after(60))
    assert err.value.reason == "attempts"
    assert len(s3.starts) == 3


async def test_no_attempt_when_the_deadline_is_too_close() -> None:
    clock = VirtualClock()
    s3 = FakeS3(clock)
    g = guard(s3, clock, min_attempt_s=0.5)
    with pytest.raises(PutFailed) as err:
        await g.put("acme", BUCKET, "checkpoints/acme/x", b"data", deadline=clock.after(0.4))
    assert err.value.reason == "deadline"
    assert s3.starts == []
    assert g.counters("acme").deadline_giveups == 1


async def test_retries_never_start_past_the_deadline() -> None:
    clock = VirtualClock()
    s3 = FakeS3(clock, [client_error("SlowDown", 503)] * 100)
    g = guard(s3, clock, max_attempts=100, retry_floor=100, min_attempt_s=0.25)
    deadline_s = 3.0
    with pytest.raises(PutFailed) as err:
        await g.put("acme", BUCKET, "checkpoints/acme/x", b"d", deadline=clock.after(deadline_s))
    assert err.value.reason == "deadline"
    assert len(s3.starts) >= 2
    # It gave up without sleeping past the deadline: the caller hears it in time.
    assert clock.monotonic() <= deadline_s
    # Every attempt started with room for one whole attempt before the deadline.
    assert max(s3.starts) <= deadline_s - 0.25
    assert g.counters("acme").deadline_giveups == 1


async def test_file_body_is_rewound_for_each_attempt() -> None:
    clock = VirtualClock()
    s3 = FakeS3(clock, [client_error("InternalError", 500)])
    g = guard(s3, clock)
    body = io.BytesIO(b"HEADER|payload")
    body.seek(7)  # the caller wants to upload from here on
    await g.put("acme", BUCKET, "checkpoints/acme/x", body, deadline=clock.after(30))
    assert s3.bodies == [b"payload", b"payload"]


async def test_token_bucket_shapes_a_burst_of_first_attempts() -> None:
    clock = VirtualClock()
    s3 = FakeS3(clock)
    g = guard(s3, clock, rate_per_s=20, burst=20)
    deadline = clock.after(30)
    await asyncio.gather(
        *(
            g.put("acme", BUCKET, f"checkpoints/acme/{i}", b"d", deadline=deadline)
            for i in range(30)
        )
    )
    c = g.counters("acme")
    assert (c.succeeded, c.throttled_waits) == (30, 10)
    # 20 go at once on the burst, the other 10 queue at 20/s: the last starts at 0.5 s or later.
    assert max(s3.starts) >= 0.5 - 1e-9


async def test_bound_put_is_the_workload_helpers_shape() -> None:
    clock = VirtualClock()
    s3 = FakeS3(clock)
    store = guard(s3, clock).bind("acme", BUCKET)
    uri = await store.put("checkpoints/acme/s1.pt", b"w", deadline=clock.after(10))
    assert uri == f"s3://{BUCKET}/checkpoints/acme/s1.pt"
    with pytest.raises(ScopeRefused):
        await store.put("checkpoints/globex/s1.pt", b"w", deadline=clock.after(10))
    assert len(s3.starts) == 1


async def test_identities_have_separate_buckets() -> None:
    clock = VirtualClock()
    s3 = FakeS3(clock)
    g = guard(s3, clock, rate_per_s=1, burst=1)
    await g.put("acme", BUCKET, "checkpoints/acme/x", b"d", deadline=clock.after(30))
    await g.put("globex", BUCKET, "checkpoints/globex/x", b"d", deadline=clock.after(30))
    assert g.counters("acme").throttled_waits == g.counters("globex").throttled_waits == 0
    assert g.counters().succeeded == 2


async def test_storm_is_bounded_by_the_retry_budget() -> None:
    clock = VirtualClock()

    def always_slow_down(**kw: Any) -> Mapping[str, Any]:
        starts.append(clock.monotonic())
        raise client_error("SlowDown", 503)

    starts: list[float] = []
    callers, ratio, floor = 100, 0.1, 3
    limits = PutLimits(
        retry_ratio=ratio,
        retry_floor=floor,
        max_attempts=5,
        rate_per_s=1000,
        burst=1000,
        budget_window_s=60,
    )
    g = GuardedPut(always_slow_down, limits=limits, clock=clock)
    deadline_s = 20.0
    deadline = clock.after(deadline_s)
    results = await asyncio.gather(
        *(
            g.put("acme", BUCKET, f"checkpoints/acme/r{i}", b"d", deadline=deadline)
            for i in range(callers)
        ),
        return_exceptions=True,
    )
    assert all(isinstance(r, PutFailed) for r in results)
    c = g.counters("acme")
    # Without the budget this would be callers x max_attempts = 500 attempts.
    assert len(starts) == c.attempts <= callers * (1 + ratio) + floor
    assert c.retries <= callers * ratio + floor
    assert c.budget_refused >= callers - (callers * ratio + floor)
    assert max(starts) <= deadline_s
    assert {r.reason for r in results if isinstance(r, PutFailed)} <= {"budget", "attempts"}
