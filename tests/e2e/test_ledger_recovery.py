"""Ledger events outlive a replica and its disk: cluster records, adoption, exactly once.

Against the stack's kube-apiserver and Kafka. A writer "cut off from Kafka" points at a closed
port (the shared broker is never stopped); a replica "gone" is one whose holder Lease is not
renewed (none is, here, for the first writer).
"""

from __future__ import annotations

import asyncio
import gc
import json
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client as k8s
from test_ledger_kafka import dead_port, new_topic, read_all, waste

from reclaimd.cluster import errors
from reclaimd.cluster.apiserver import ApiServer
from reclaimd.cluster.holders import HolderLeases
from reclaimd.cluster.ledgerlog import LedgerLog, PendingEvent
from reclaimd.cluster.ratelimit import RateLimiter
from reclaimd.ledger.writer import LedgerWriter
from reclaimd.model import RestartWaste
from reclaimd.settings.ledger import LedgerWriterSettings

WAIT_S = 90.0  # a bound on waiting for the writers, not a timing assertion


@pytest.fixture(autouse=True)
def _collect() -> Iterator[None]:
    """Collect each test's garbage (a fenced producer's and the writers' reference cycles)
    while the test ends: collected later, during pytest's own last import, their finalizers
    trip CPython 3.11's "AST constructor recursion depth mismatch" SystemError."""
    yield
    gc.collect()


@pytest.fixture
async def namespace(kube: k8s.ApiClient) -> AsyncIterator[str]:
    core = k8s.CoreV1Api(kube)
    name = f"ledger-{uuid.uuid4().hex[:8]}"
    body: Any = {"metadata": {"name": name}}
    await core.create_namespace(body)
    try:
        yield name
    finally:
        await core.delete_namespace(name)


def holder(tag: str) -> str:
    return f"replica-{tag}-{uuid.uuid4().hex[:6]}"


def writer(
    bootstrap: str,
    topic: str,
    path: Path,
    log: LedgerLog,
    alive: Callable[[str], Awaitable[bool]] | None = None,
) -> LedgerWriter:
    return LedgerWriter(
        bootstrap_servers=bootstrap,
        topic=topic,
        outbox_path=path,
        holder=log.holder,
        cluster=log,
        alive=alive,
        tuning=LedgerWriterSettings(
            backoff_initial_s=0.05,
            backoff_max_s=0.3,
            recover_every_s=0.3,
            request_timeout_ms=10_000,
        ),
    )


async def until(check: Callable[[], Awaitable[bool]], what: str) -> None:
    """Poll ``check`` (the writers' state and the cluster's records; nothing to wait on)."""
    async with asyncio.timeout(WAIT_S):
        while True:
            if await check():
                return
            await asyncio.sleep(0.1)
    raise AssertionError(what)


def delete_outbox(path: Path) -> None:
    for p in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        p.unlink(missing_ok=True)


def count_ids(records: list[Any]) -> Counter[str]:
    return Counter(json.loads(r.value)["EventId"] for r in records)


class Gated(LedgerLog):
    """A real cluster log whose reads can be held after they return: a replica paused between
    checking its records and committing its transaction (SIGSTOP at the worst moment)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.reached = asyncio.Event()
        self.gate = asyncio.Event()

    async def records(self) -> list[PendingEvent]:
        got = await super().records()
        self.reached.set()
        await self.gate.wait()
        return got


async def record_all(w: LedgerWriter, events: list[RestartWaste]) -> None:
    for e in events:
        await w.record(e)


async def test_events_of_a_replica_lost_with_its_disk_are_adopted_and_published_once(
    stack: Any, api: ApiServer, namespace: str, tmp_path: Path
) -> None:
    topic = await new_topic(stack.kafka_bootstrap)
    events = [waste(f"aws-lost-{i}", f"gang-{i}") for i in range(3)]
    limiter = RateLimiter()
    log_a = LedgerLog(api, namespace, holder("a"), topic, limiter=limiter)
    a = writer(dead_port(), topic, tmp_path / "a.sqlite", log_a)
    a.start()
    await record_all(a, events)
    # Write-through: each event is in the cluster once record() returned, held by A.
    held = await log_a.pending()
    assert sorted(p.event_id for p in held) == sorted(e.event_id for e in events)
    assert {p.holder for p in held} == {log_a.holder}
    assert a.depth() == 3 and a.published == 0
    await a.close()
    delete_outbox(tmp_path / "a.sqlite")  # the replica's disk is gone with it

    log_b = LedgerLog(api, namespace, holder("b"), topic, limiter=limiter)
    leases_b = HolderLeases(api, namespace, log_b.holder, lease_s=5.0, limiter=limiter)
    async with writer(
        stack.kafka_bootstrap, topic, tmp_path / "b.sqlite", log_b, leases_b.alive
    ) as b:

        async def done() -> bool:
            return b.published == 3 and b.depth() == 0 and not await log_b.pending()

        await until(done, "B published A's events and deleted their records")
        assert b.adopted == 3
    assert count_ids(await read_all(stack.kafka_bootstrap, topic, expect=3)) == Counter(
        {e.event_id: 1 for e in events}
    )


async def test_a_replica_that_reconnects_after_adoption_publishes_nothing_twice(
    stack: Any, api: ApiServer, namespace: str, tmp_path: Path
) -> None:
    topic = await new_topic(stack.kafka_bootstrap)
    events = [waste(f"aws-back-{i}", f"gang-{i}") for i in range(3)]
    limiter = RateLimiter()
    log_a = LedgerLog(api, namespace, holder("a"), topic, limiter=limiter)
    a = writer(dead_port(), topic, tmp_path / "a.sqlite", log_a)
    a.start()
    await record_all(a, events)

    log_b = LedgerLog(api, namespace, holder("b"), topic, limiter=limiter)
    leases_b = HolderLeases(api, namespace, log_b.holder, lease_s=5.0, limiter=limiter)
    async with writer(
        stack.kafka_bootstrap, topic, tmp_path / "b.sqlite", log_b, leases_b.alive
    ) as b:

        async def adopted() -> bool:
            return b.published == 3 and not await log_b.pending()

        await until(adopted, "B published A's events")
    # A was only cut off; its outbox still holds the three events. Its way to Kafka heals.
    a.bootstrap_servers = stack.kafka_bootstrap

    async def settled() -> bool:
        return a.depth() == 0

    await until(settled, "A settled its rows")
    await a.close()
    assert a.published == 0
    assert a.found_published + a.given_away == 3
    assert count_ids(await read_all(stack.kafka_bootstrap, topic, expect=3)) == Counter(
        {e.event_id: 1 for e in events}
    )


async def test_a_paused_replica_that_resumes_after_adoption_is_fenced(
    stack: Any, api: ApiServer, namespace: str, tmp_path: Path
) -> None:
    topic = await new_topic(stack.kafka_bootstrap)
    events = [waste(f"aws-zombie-{i}", f"gang-{i}") for i in range(3)]
    limiter = RateLimiter()
    log_a = Gated(api, namespace, holder("a"), topic, limiter=limiter)
    a = writer(stack.kafka_bootstrap, topic, tmp_path / "a.sqlite", log_a)
    await record_all(a, events)
    a.start()
    # A checked its records (still its own) and stops there, its producer registered: the
    # next thing it would do is send and commit them.
    async with asyncio.timeout(WAIT_S):
        await log_a.reached.wait()

    log_b = LedgerLog(api, namespace, holder("b"), topic, limiter=limiter)
    leases_b = HolderLeases(api, namespace, log_b.holder, lease_s=5.0, limiter=limiter)
    async with writer(
        stack.kafka_bootstrap, topic, tmp_path / "b.sqlite", log_b, leases_b.alive
    ) as b:

        async def adopted() -> bool:
            return b.published == 3 and not await log_b.pending()

        await until(adopted, "B published A's events")
    log_a.gate.set()  # A resumes, with what it read before B adopted

    async def settled() -> bool:
        return a.depth() == 0

    await until(settled, "A settled its rows")
    await a.close()
    assert a.publish_errors >= 1  # its commit was refused: B had fenced its transactional id
    assert a.published == 0
    assert a.found_published + a.given_away == 3
    assert count_ids(await read_all(stack.kafka_bootstrap, topic, expect=3)) == Counter(
        {e.event_id: 1 for e in events}
    )


async def test_normal_path_publishes_once_and_deletes_the_record(
    stack: Any, api: ApiServer, namespace: str, tmp_path: Path
) -> None:
    topic = await new_topic(stack.kafka_bootstrap)
    event = waste("aws-normal")
    limiter = RateLimiter()
    log_a = LedgerLog(api, namespace, holder("a"), topic, limiter=limiter)
    leases_a = HolderLeases(api, namespace, log_a.holder, lease_s=5.0, limiter=limiter)
    async with writer(
        stack.kafka_bootstrap, topic, tmp_path / "a.sqlite", log_a, leases_a.alive
    ) as a:
        await a.record(event)
        await a.record(event)  # a replay: one event, one record

        async def gone() -> bool:
            return a.published == 1 and not await log_a.pending()

        await until(gone, "published and its record deleted")
        assert a.adopted == 0 and a.given_away == 0 and a.found_published == 0
    assert count_ids(await read_all(stack.kafka_bootstrap, topic, expect=1)) == Counter(
        {event.event_id: 1}
    )


async def test_an_event_the_cluster_refuses_is_still_published_once(
    stack: Any, api: ApiServer, tmp_path: Path
) -> None:
    topic = await new_topic(stack.kafka_bootstrap)
    event = waste("aws-refused")
    # No such namespace: the API server refuses the record (404), for good.
    log_a = LedgerLog(
        api, f"absent-{uuid.uuid4().hex[:8]}", holder("a"), topic, limiter=RateLimiter()
    )
    async with writer(stack.kafka_bootstrap, topic, tmp_path / "a.sqlite", log_a) as a:
        await a.record(event)
        assert a.cluster_write_errors == 1
        assert await a.flush(WAIT_S)
        assert a.published == 1
    assert count_ids(await read_all(stack.kafka_bootstrap, topic, expect=1)) == Counter(
        {event.event_id: 1}
    )


async def test_a_replica_restarted_on_a_fresh_disk_under_its_name_recovers_its_own_events(
    stack: Any, api: ApiServer, namespace: str, tmp_path: Path
) -> None:
    topic = await new_topic(stack.kafka_bootstrap)
    events = [waste(f"aws-fresh-{i}", f"gang-{i}") for i in range(2)]
    limiter = RateLimiter()
    name = holder("a")
    log_a = LedgerLog(api, namespace, name, topic, limiter=limiter)
    a = writer(dead_port(), topic, tmp_path / "a.sqlite", log_a)
    await record_all(a, events)
    await a.close()
    delete_outbox(tmp_path / "a.sqlite")

    # The same holder name again (its holder Lease is live: no peer would adopt), new disk.
    again = LedgerLog(api, namespace, name, topic, limiter=limiter)
    leases = HolderLeases(api, namespace, name, lease_s=5.0, limiter=limiter)
    async with writer(
        stack.kafka_bootstrap, topic, tmp_path / "a.sqlite", again, leases.alive
    ) as a2:

        async def done() -> bool:
            return a2.published == 2 and not await again.pending()

        await until(done, "the restarted replica published its earlier life's events")
        assert a2.adopted == 2
    assert count_ids(await read_all(stack.kafka_bootstrap, topic, expect=2)) == Counter(
        {e.event_id: 1 for e in events}
    )


async def test_a_survivor_that_charged_the_same_gangs_still_publishes_a_dead_peer_s_events(
    stack: Any, api: ApiServer, namespace: str, tmp_path: Path
) -> None:
    """The survivor of a kill takes the notices over and records the same events (same ids)
    before it adopts the dead holder's records: its own copies must wait for the records, not
    be marked sent on the word of a peer that will never publish them."""
    topic = await new_topic(stack.kafka_bootstrap)
    events = [waste(f"aws-dead-{i}", f"gang-{i}") for i in range(3)]
    limiter = RateLimiter()
    log_a = LedgerLog(api, namespace, holder("a"), topic, limiter=limiter)
    a = writer(dead_port(), topic, tmp_path / "a.sqlite", log_a)
    await record_all(a, events)  # recorded in the cluster, never published: then A dies
    await a.close()

    a_alive = True  # until B's holder view catches up with the death

    async def alive(h: str) -> bool:
        return h == log_b.holder or a_alive

    log_b = LedgerLog(api, namespace, holder("b"), topic, limiter=limiter)
    async with writer(stack.kafka_bootstrap, topic, tmp_path / "b.sqlite", log_b, alive) as b:
        await record_all(b, events)  # the survivor's second charge of the same gangs

        async def left() -> bool:
            return b.given_away == 3

        await until(left, "B left the events to the holder of their records")
        assert b.published == 0 and b.depth() == 0
        a_alive = False

        async def done() -> bool:
            return b.published == 3 and b.depth() == 0 and not await log_b.pending()

        await until(done, "B adopted A's records and published them")
        assert b.adopted == 3
    assert count_ids(await read_all(stack.kafka_bootstrap, topic, expect=3)) == Counter(
        {e.event_id: 1 for e in events}
    )


async def test_rows_left_to_a_live_peer_are_settled_when_it_publishes(
    stack: Any, api: ApiServer, namespace: str, tmp_path: Path
) -> None:
    topic = await new_topic(stack.kafka_bootstrap)
    events = [waste(f"aws-both-{i}", f"gang-{i}") for i in range(2)]
    limiter = RateLimiter()
    log_a = LedgerLog(api, namespace, holder("a"), topic, limiter=limiter)
    a = writer(dead_port(), topic, tmp_path / "a.sqlite", log_a)
    a.start()
    await record_all(a, events)

    async def alive(_h: str) -> bool:
        return True

    log_b = LedgerLog(api, namespace, holder("b"), topic, limiter=limiter)
    async with writer(stack.kafka_bootstrap, topic, tmp_path / "b.sqlite", log_b, alive) as b:
        await record_all(b, events)

        async def left() -> bool:
            return b.given_away == 2

        await until(left, "B left the events to A")
        a.bootstrap_servers = stack.kafka_bootstrap  # A's way to Kafka heals: A publishes

        async def settled() -> bool:
            return a.published == 2 and (await b._outbox.peers()) == []

        await until(settled, "A published and B settled the rows it had left to A")
        assert b.published == 0 and b.adopted == 0
    await a.close()
    assert count_ids(await read_all(stack.kafka_bootstrap, topic, expect=2)) == Counter(
        {e.event_id: 1 for e in events}
    )


class CutOff(LedgerLog):
    """A real cluster log whose first writes have no answer: a replica cut off from the API
    server while it still reaches Kafka (a partition)."""

    def __init__(self, *args: Any, fail: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fail = fail

    async def put(self, *args: Any, **kwargs: Any) -> bool:
        if self.fail > 0:
            self.fail -= 1
            raise TimeoutErrorRetriable("no answer from the API server")
        return await super().put(*args, **kwargs)


class TimeoutErrorRetriable(Exception):
    retriable = True


async def test_an_event_charged_again_after_it_was_published_is_not_published_twice(
    stack: Any, api: ApiServer, namespace: str, tmp_path: Path
) -> None:
    """A partitioned replica's record write had no answer: it writes the record again before
    it publishes (the record is the event id's lock). Published, the record stays as a
    tombstone, so the peer that took the notice over and charged the same gang again
    publishes nothing."""
    topic = await new_topic(stack.kafka_bootstrap)
    event = waste("aws-again")
    limiter = RateLimiter()
    log_a = CutOff(api, namespace, holder("a"), topic, limiter=limiter, fail=1)
    async with writer(stack.kafka_bootstrap, topic, tmp_path / "a.sqlite", log_a) as a:
        await a.record(event)
        assert a.cluster_write_errors == 1
        assert await a.flush(WAIT_S) and a.published == 1

        async def tombstone() -> bool:
            recs = await log_a.records()
            return len(recs) == 1 and recs[0].published_at is not None

        await until(tombstone, "A's record written again, then marked published")
    assert await log_a.pending() == []

    log_b = LedgerLog(api, namespace, holder("b"), topic, limiter=limiter)

    async def alive(_h: str) -> bool:
        return False  # A is gone: B would adopt anything A left open

    async with writer(stack.kafka_bootstrap, topic, tmp_path / "b.sqlite", log_b, alive) as b:
        await b.record(event)  # the takeover's second charge of the same gang
        assert await b.flush(WAIT_S)
        assert b.published == 0 and b.found_published == 1 and b.adopted == 0
    assert count_ids(await read_all(stack.kafka_bootstrap, topic, expect=1)) == Counter(
        {event.event_id: 1}
    )


class Refusing(LedgerLog):
    """A real cluster log whose writes an API server just restarted refuses with 403 (its
    RBAC caches not filled yet) until ``allow`` is set."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.allow = asyncio.Event()
        self.refused = 0

    async def put(self, *args: Any, **kwargs: Any) -> bool:
        if not self.allow.is_set():
            self.refused += 1
            raise errors.Forbidden("create lease", 403, "leases.coordination.k8s.io is forbidden")
        return await super().put(*args, **kwargs)


async def test_an_event_refused_with_403_waits_for_its_record_and_is_published_once(
    stack: Any, api: ApiServer, namespace: str, tmp_path: Path
) -> None:
    """failover-4020099555: a 403 from a restarting API server was taken for a refusal for
    good, the event went out without its record (the event id's lock), and the peer that took
    the notice over recorded and published the same event again. A 403 now leaves the event
    in doubt: it waits for its record, and finds the peer holds it (and published it)."""
    topic = await new_topic(stack.kafka_bootstrap)
    event = waste("aws-forbidden")
    limiter = RateLimiter()
    log_a = Refusing(api, namespace, holder("a"), topic, limiter=limiter)
    log_b = LedgerLog(api, namespace, holder("b"), topic, limiter=limiter)

    async def alive(_h: str) -> bool:
        return True

    async with writer(stack.kafka_bootstrap, topic, tmp_path / "a.sqlite", log_a, alive) as a:
        await a.record(event)
        assert a.cluster_write_errors == 1
        async with writer(stack.kafka_bootstrap, topic, tmp_path / "b.sqlite", log_b, alive) as b:
            await b.record(event)  # the takeover's charge of the same gang, recorded first
            assert await b.flush(WAIT_S) and b.published == 1
        assert a.published == 0  # still waiting for its record, not sent unlocked
        log_a.allow.set()
        assert await a.flush(WAIT_S)
        assert a.published == 0 and a.given_away == 1  # b's record: b's to publish, and it did
    assert count_ids(await read_all(stack.kafka_bootstrap, topic, expect=1)) == Counter(
        {event.event_id: 1}
    )
