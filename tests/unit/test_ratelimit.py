"""The write limiter: a token bucket whose waiters are served earliest deadline first."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta

import pytest

from reclaimd.cluster import errors
from reclaimd.cluster.apiserver import ApiStatus
from reclaimd.cluster.ratelimit import RateLimiter
from reclaimd.settings.kube import KubeSettings

T0 = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)


def at(seconds: int) -> datetime:
    return T0 + timedelta(seconds=seconds)


async def test_burst_is_served_at_once() -> None:
    limiter = RateLimiter(KubeSettings(qps=1.0, burst=3))
    for _ in range(3):
        await limiter.acquire()
    assert limiter.waiting == 0


async def test_queued_writes_are_served_earliest_deadline_first() -> None:
    # One write in flight at a time, and the test holds it: everyone below queues whatever
    # the machine's speed (a token bucket would refill under a slow test and serve early).
    limiter = RateLimiter(KubeSettings(qps=1000.0, burst=100, max_in_flight=1))
    await limiter.acquire()
    served: list[str] = []

    async def write(name: str, deadline: datetime | None) -> None:
        await limiter.acquire(deadline)
        served.append(name)
        limiter.release()

    tasks = [
        asyncio.create_task(write(n, d))
        for n, d in [
            ("late", at(110)),
            ("none", None),
            ("soon", at(20)),
            ("mid", at(60)),
            ("soon-too", at(20)),
        ]
    ]
    await asyncio.sleep(0)  # every task queues behind the write in flight
    assert limiter.waiting == 5
    limiter.release()
    await asyncio.gather(*tasks)
    # Ties keep arrival order; a write without a deadline goes last.
    assert served == ["soon", "soon-too", "mid", "late", "none"]


async def test_a_cancelled_waiter_is_skipped_and_keeps_no_token() -> None:
    limiter = RateLimiter(KubeSettings(qps=200.0, burst=1))
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
        RateLimiter(KubeSettings(qps=0, burst=1))


# --- adaptive: back off on the server's word, grow while it accepts ------------------------


def api_error(status: int, headers: dict[str, str] | None = None, message: str = "") -> Exception:
    """What ``ApiServer`` raises for an answer other than 2xx."""
    body = json.dumps({"message": message}).encode() if message else b""
    return ApiStatus(status, body=body, headers=headers or {})


def test_a_429_is_load_shedding_unless_a_pdb_says_no() -> None:
    apf = errors.error_for("w", 429, None, {"X-Kubernetes-PF-FlowSchema-UID": "abc"})
    retry = errors.error_for("w", 429, None, {"Retry-After": "2"})
    pdb = errors.error_for(
        "evict",
        429,
        {"message": "Cannot evict pod as it would violate the pod's disruption budget."},
    )
    assert isinstance(apf, errors.Throttled) and isinstance(retry, errors.Throttled)
    assert retry.retry_after_s == 2.0
    assert isinstance(pdb, errors.TooManyRequests) and not isinstance(pdb, errors.Throttled)


async def test_push_back_halves_the_rate_once_a_second_and_holds_for_retry_after() -> None:
    limiter = RateLimiter(KubeSettings(qps=400.0, start_qps=200.0, burst=1, min_qps=10))
    assert limiter.rate == 200.0
    limiter.pushed(None)
    limiter.pushed(None)  # the same wave of refusals: one cut
    assert limiter.rate == 100.0
    limiter.pushed(0.3)
    loop = asyncio.get_running_loop()
    started = loop.time()
    await limiter.acquire()
    assert loop.time() - started >= 0.25  # nobody is served before Retry-After has passed
    assert limiter.pushed_back == 3


async def test_the_rate_grows_under_demand_up_to_the_cap() -> None:
    limiter = RateLimiter(KubeSettings(qps=300.0, start_qps=100.0, burst=1, growth_per_s=4.0))
    for _ in range(150):  # more demand than the start rate serves in a second
        await limiter.acquire()
        limiter.release()  # each write answered at once
    assert 100.0 < limiter.rate <= 300.0


async def test_call_retries_what_the_server_asked_and_raises_the_rest() -> None:
    limiter = RateLimiter(KubeSettings(qps=1000.0, burst=10, retry_base_s=0.01, retry_cap_s=0.02))
    answers: list[Exception | str] = [
        api_error(429, {"Retry-After": "0"}, "Too many requests"),
        api_error(503),
        "ok",
    ]

    async def write() -> str:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    later = datetime.now(UTC) + timedelta(minutes=5)
    assert await limiter.call("patch node/x", later, write) == "ok"
    assert limiter.pushed_back == 2 and limiter.writes == 1 and answers == []

    async def conflict() -> str:
        raise api_error(409)

    with pytest.raises(errors.Conflict):
        await limiter.call("patch node/x", later, conflict)


async def test_call_gives_up_at_its_deadline() -> None:
    limiter = RateLimiter(KubeSettings(qps=1000.0, burst=10, retry_base_s=0.5, retry_cap_s=1.0))
    calls = 0

    async def down() -> None:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0.06)  # the answer comes back after the deadline
        raise api_error(503)

    soon = datetime.now(UTC) + timedelta(seconds=0.05)
    with pytest.raises(errors.ServerError):
        await limiter.call("patch node/x", soon, down)
    assert calls == 1  # the deadline has passed: no second try (a jittered delay may be ~0)


async def test_a_holder_renewal_is_served_before_writes_whose_deadlines_have_passed() -> None:
    from reclaimd.cluster.holders import FIRST

    limiter = RateLimiter(KubeSettings(qps=200.0, burst=1))
    await limiter.acquire()
    served: list[str] = []

    async def write(name: str, deadline: datetime) -> None:
        await limiter.acquire(deadline)
        served.append(name)

    past = datetime.now(UTC) - timedelta(seconds=30)  # an eviction still retrying, late
    tasks = [asyncio.create_task(write(f"evict-{i}", past)) for i in range(5)]
    tasks.append(asyncio.create_task(write("renew", FIRST)))
    await asyncio.sleep(0)
    await asyncio.gather(*tasks)
    assert served[0] == "renew"


async def test_a_read_is_retried_outside_the_write_budget() -> None:
    limiter = RateLimiter(KubeSettings(qps=1.0, burst=1, retry_base_s=0.001, retry_cap_s=0.002))
    await limiter.acquire()  # the write bucket is empty: a read must not wait for it
    answers: list[Exception | str] = [errors.ServerError("read x", 503), "ok"]

    async def fetch() -> str:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    assert await asyncio.wait_for(limiter.read("read x", None, fetch), 1.0) == "ok"
    assert limiter.reads == 2 and limiter.retried == 1 and not limiter.by_kind


async def test_an_attempt_that_hangs_is_timed_out_and_retried() -> None:
    limiter = RateLimiter(
        KubeSettings(attempt_timeout_s=0.2, retry_base_s=0.001, retry_cap_s=0.002)
    )
    calls = 0

    async def write() -> str:
        nonlocal calls
        calls += 1
        if calls == 1:
            await asyncio.sleep(10)  # a half-open connection: never answers
        return "written"

    assert await asyncio.wait_for(limiter.call("patch node/n", None, write), 2.0) == "written"
    assert calls == 2 and limiter.retried == 1


async def test_update_reads_again_after_a_conflict_and_decides_again() -> None:
    limiter = RateLimiter()
    versions = iter(["2", "3"])
    seen: list[str] = []

    async def fetch() -> str:
        return next(versions)

    async def change(version: str) -> str:
        seen.append(version)
        if version != "3":
            raise errors.Conflict("patch lease/x", 409)
        return f"wrote over {version}"

    result = await limiter.update("lease/x", None, fetch, change, first="1")
    assert result == "wrote over 3" and seen == ["1", "2", "3"]


async def test_update_gives_up_after_its_conflicts() -> None:
    limiter = RateLimiter(KubeSettings(max_conflicts=3))
    reads = 0

    async def fetch() -> int:
        nonlocal reads
        reads += 1
        return reads

    async def change(_: int) -> None:
        raise errors.Conflict("patch lease/x", 409)

    with pytest.raises(errors.Conflict, match="after 3 re-reads"):
        await limiter.update("lease/x", None, fetch, change)
    assert reads == 3


async def test_a_403_is_retried_briefly_then_taken_as_rbacs_answer() -> None:
    limiter = RateLimiter(
        KubeSettings(retry_base_s=0.001, retry_cap_s=0.002, forbidden_grace_s=0.5)
    )
    answers: list[Exception | str] = [errors.Forbidden("patch node/n", 403), "ok"]

    async def syncing() -> str:  # an API server whose authorizer syncs after one refusal
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    assert await limiter.call("patch node/n", None, syncing) == "ok"
    assert limiter.pushed_back == 0  # a 403 says nothing of the load

    async def denied() -> str:
        raise errors.Forbidden("patch node/n", 403)

    with pytest.raises(errors.Forbidden):
        await asyncio.wait_for(limiter.call("patch node/n", None, denied), 5.0)


async def test_writes_in_flight_are_capped_and_the_earliest_deadline_goes_next() -> None:
    limiter = RateLimiter(KubeSettings(qps=1000.0, burst=100, max_in_flight=2))
    await limiter.acquire(at(50))
    await limiter.acquire(at(60))  # both slots taken: the server works on two writes
    served: list[str] = []

    async def write(name: str, deadline: datetime) -> None:
        await limiter.acquire(deadline)
        served.append(name)

    event = asyncio.create_task(write("event", at(600)))
    cordon = asyncio.create_task(write("cordon", at(20)))
    await asyncio.sleep(0.05)
    assert served == []  # tokens to spare, but no slot
    limiter.release()
    await asyncio.wait_for(cordon, 5.0)
    assert served == ["cordon"] and not event.done()  # queued later, due sooner
    limiter.release()
    await asyncio.wait_for(event, 5.0)
    assert served == ["cordon", "event"]


async def test_a_call_to_a_server_that_answers_nothing_is_given_up() -> None:
    """A cut-off replica: every attempt hangs (its own timeout is long), nothing answers."""
    limiter = RateLimiter(KubeSettings(attempt_timeout_s=30.0))

    async def hang() -> None:
        await asyncio.sleep(60)

    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(errors.ServerError, match=r"no answer for 0\.5s"):
        await limiter.while_answered(0.5, limiter.call("claim node/n1", None, hang))
    assert loop.time() - started < 5.0  # given up on silence, not at the attempt's 30 s


async def test_a_slow_call_goes_on_while_the_server_answers_others() -> None:
    """A storm: this call waits behind others, but the server answers them all along."""
    limiter = RateLimiter()

    async def answered() -> None:
        return None

    async def chatter() -> None:
        for _ in range(20):
            await limiter.read("read node/n2", None, answered)
            await asyncio.sleep(0.1)

    async def slow() -> str:
        await asyncio.sleep(1.2)
        return "claimed"

    other = asyncio.create_task(chatter())
    got = await limiter.while_answered(0.5, limiter.call("claim node/n1", None, slow))
    await other
    assert got == "claimed"


async def test_a_refused_connection_is_not_an_answer() -> None:
    limiter = RateLimiter(KubeSettings(retry_cap_s=0.05))

    async def refused() -> None:
        raise errors.ServerError("claim node/n1", 0, "ClientConnectorError")

    until = datetime.now(UTC) + timedelta(days=1)  # retried all day, were it not for silence
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(errors.ServerError, match="no answer"):
        await limiter.while_answered(
            0.4, limiter.call("claim node/n1", None, refused, retry_until=until)
        )
    assert loop.time() - started >= 0.4


async def test_a_quarter_of_the_slots_is_kept_for_writes_already_due() -> None:
    # A storm's evictions (due minutes ahead) take every slot while no cordon is about; once
    # one is (the notice that arrives next, due as of its issue), it is served at the next
    # free slot and a quarter of the slots stays with such writes while they keep coming.
    limiter = RateLimiter(KubeSettings(qps=1000.0, burst=100, max_in_flight=4))
    now = datetime.now(UTC)
    later, due = now + timedelta(seconds=100), now - timedelta(seconds=2)
    for _ in range(4):
        await limiter.acquire(later)  # nothing due about: every slot
    served: list[str] = []

    async def write(name: str, deadline: datetime | None) -> None:
        await limiter.acquire(deadline)
        served.append(name)

    evict = asyncio.create_task(write("evict", later))
    await asyncio.sleep(0.05)
    cordon = asyncio.create_task(write("cordon", due))
    await asyncio.sleep(0.05)
    assert served == [] and limiter.busy_with_due
    limiter.release()
    await asyncio.wait_for(cordon, 5.0)
    assert served == ["cordon"]  # ahead of the eviction that queued first
    limiter.release()
    await asyncio.sleep(0.05)
    assert not evict.done()  # 3 in flight: the fourth slot is kept while cordons come
    limiter.release()
    await asyncio.wait_for(evict, 5.0)
    assert served == ["cordon", "evict"]


async def test_quiet_waits_for_the_writes_already_due_then_returns() -> None:
    limiter = RateLimiter(KubeSettings(qps=1000.0, burst=100, max_in_flight=1))
    assert not limiter.busy_with_due
    await asyncio.wait_for(limiter.quiet(5.0), 1.0)  # nothing due: at once
    now = datetime.now(UTC)
    await limiter.acquire(now + timedelta(seconds=100))  # the one slot, due later
    cordon = asyncio.create_task(limiter.acquire(now - timedelta(seconds=1)))
    await asyncio.sleep(0.05)
    assert limiter.busy_with_due  # a cordon waits
    loop = asyncio.get_running_loop()
    started = loop.time()
    await limiter.quiet(0.3)  # bounded: it gives up waiting
    assert 0.25 <= loop.time() - started < 2.0
    look = asyncio.create_task(limiter.quiet(30.0))
    limiter.release()
    await asyncio.wait_for(cordon, 5.0)
    limiter.release()
    await asyncio.wait_for(look, 5.0)  # the cordon went a second ago: quiet again
    assert not limiter.busy_with_due


async def test_renewals_are_never_a_storm_s_intake() -> None:
    """Holder and slot Lease renewals go first (``FIRST``), every second: were they writes
    already due, no housekeeping LIST would ever find the budget quiet."""
    from reclaimd.cluster.ratelimit import FIRST

    limiter = RateLimiter(KubeSettings(qps=1000.0, burst=100, max_in_flight=4))
    await limiter.acquire(FIRST)  # a renewal, served
    limiter.release()
    assert not limiter.busy_with_due
    await asyncio.wait_for(limiter.quiet(30.0), 1.0)
    await limiter.acquire(datetime.now(UTC) - timedelta(seconds=1))  # a cordon, served
    limiter.release()
    assert limiter.busy_with_due
