import asyncio
from dataclasses import dataclass
from datetime import timedelta

import pytest

from reclaimd.model import Gang, GangKey, Member, Notice, NoticeKind, Target, utcnow
from reclaimd.scheduler import EdfQueue, GangOwners, Scheduler


@dataclass(frozen=True)
class Item:
    notice: Notice

    @property
    def id(self) -> str:
        return self.notice.id


def notice(nid: str, in_s: float | None) -> Item:
    now = utcnow()
    return Item(
        Notice(
            id=nid,
            source="test",
            kind=NoticeKind.SPOT_INTERRUPTION,
            target=Target(node_name=nid),
            issued_at=now,
            deadline=now + timedelta(seconds=in_s) if in_s is not None else None,
            received_at=now,
        )
    )


async def test_edf_order_and_dedupe() -> None:
    q = EdfQueue(horizon_s=600)
    for nid, s in (("late", 100), ("none", None), ("soon", 5), ("mid", 50)):
        assert await q.put(notice(nid, s))
    assert not await q.put(notice("soon", 5))
    assert [(await q.get()).id for _ in range(4)] == ["soon", "mid", "late", "none"]


def gang(name: str, *uids: str) -> Gang:
    return Gang(
        GangKey("job", "ns", name),
        tuple(Member("ns", f"{name}-{u}", u, f"node-{u}", 8) for u in uids),
    )


class Lease:
    """The cluster-wide Lease: first notice wins; counts writes."""

    def __init__(self, fail: bool = False) -> None:
        self.owner: dict[GangKey, str] = {}
        self.writes = 0
        self.fail = fail

    async def acquire(self, g: Gang, n: Notice) -> bool:
        self.writes += 1
        await asyncio.sleep(0.01)  # a round trip: concurrent notices overlap here
        if self.fail:
            raise RuntimeError("apiserver down")
        return self.owner.setdefault(g.key, n.id) == n.id


async def test_a_later_notice_joins_the_gang_and_the_earliest_deadline_governs() -> None:
    lease = Lease()
    owners = GangOwners(lease)
    g = gang("g", "u1", "u2")
    late, soon = notice("late", 110).notice, notice("soon", 30).notice
    first, second = await asyncio.gather(
        owners.take([g], late, ["node-u1"]), owners.take([g], soon, ["node-u2"])
    )
    (flight,) = first.owned
    assert second.owned == [] and second.joined == [first.owned[0]] and second.skipped == [g.key]
    assert flight.owner == "late" and flight.joined == ["soon"]
    assert flight.deadline == soon.deadline and flight.nodes == {"node-u1", "node-u2"}
    assert lease.writes == 1  # the joiner wrote no Lease
    owners.release(flight)
    assert len(owners) == 0


async def test_a_joiner_dying_earlier_cuts_the_checkpoint_wait() -> None:
    owners = GangOwners(Lease())
    g = gang("g", "u1")
    (flight,) = (await owners.take([g], notice("late", 110).notice, ["a"])).owned
    flight.checkpoint_until(lambda d: utcnow() + timedelta(seconds=0.05 if d else 100))
    assert not flight.cut.is_set()
    await owners.take([g], notice("soon", 30).notice, ["b"])
    await asyncio.wait_for(flight.cut.wait(), 2)
    # a joiner dying later moves nothing
    x = notice("x", 30).notice
    (other,) = (await owners.take([gang("h", "u9")], x, ["c"])).owned
    other.checkpoint_until(lambda d: utcnow() + timedelta(seconds=0.01))
    await owners.take([gang("h", "u9")], notice("y", 110).notice, ["d"])
    await asyncio.sleep(0.05)
    assert not other.cut.is_set() and other.deadline == x.deadline and other.joined == ["y"]


async def test_a_restarted_gang_is_a_new_incarnation_and_another_replica_wins_the_lease() -> None:
    lease = Lease()
    owners = GangOwners(lease)
    (old,) = (await owners.take([gang("g", "u1")], notice("a", 60).notice, ["n"])).owned
    fresh = await owners.take([gang("g", "u7")], notice("b", 60).notice, ["m"])
    # new pods: not joined in-process; the Lease (here: first writer wins) decides
    assert fresh.joined == [] and fresh.owned == [] and fresh.skipped == [gang("g").key]
    owners.release(old)


async def test_a_lease_failure_fails_the_notice_and_leaves_no_flight() -> None:
    owners = GangOwners(Lease(fail=True))
    with pytest.raises(RuntimeError):
        await owners.take([gang("g", "u1")], notice("a", 60).notice, ["n"])
    assert len(owners) == 0


async def test_scheduler_runs_everything_and_survives_a_failure() -> None:
    done: list[str] = []

    async def handle(n: Item) -> None:
        if n.id == "boom":
            raise RuntimeError("boom")
        done.append(n.id)

    s = Scheduler(handle, max_in_flight=2, horizon_s=600.0)
    task = asyncio.create_task(s.run())
    for nid in ("a", "boom", "b", "c"):
        await s.submit(notice(nid, 10))
    await asyncio.wait_for(s.wait_idle(), 5)
    task.cancel()
    assert sorted(done) == ["a", "b", "c"]


async def test_a_waiting_notice_holds_no_one_back() -> None:
    gate = asyncio.Event()
    done: list[str] = []

    async def handle(n: Item) -> None:
        if n.id == "slow":
            await gate.wait()  # a checkpoint wait
        done.append(n.id)

    s = Scheduler(handle, max_in_flight=4096, horizon_s=600.0)
    task = asyncio.create_task(s.run())
    await s.submit(notice("slow", 5))  # the most urgent, and it waits
    for i in range(50):
        await s.submit(notice(f"n{i}", 100))
    for _ in range(100):
        if len(done) == 50:
            break
        await asyncio.sleep(0.01)
    assert len(done) == 50 and "slow" not in done and s.running("slow")
    gate.set()
    await asyncio.wait_for(s.wait_idle(), 5)
    task.cancel()


async def test_far_deadline_waits_until_its_horizon_but_urgent_work_does_not() -> None:
    q = EdfQueue(horizon_s=60)
    await q.put(notice("far", 3600))  # due in ~59 minutes
    got: list[str] = []

    async def take() -> None:
        got.append((await q.get()).id)

    taker = asyncio.create_task(take())
    await asyncio.sleep(0.05)
    assert got == []  # not due yet
    await q.put(notice("urgent", 30))  # inside the horizon: due now, wakes the taker
    await asyncio.wait_for(taker, 2)
    assert got == ["urgent"] and len(q) == 1


async def test_early_warning_is_due_at_once_and_sorts_after_imminent_deadlines() -> None:
    q = EdfQueue(horizon_s=600)
    await q.put(notice("rebalance", None))
    await q.put(notice("spot", 120))
    assert (await asyncio.wait_for(q.get(), 1)).id == "spot"
    assert (await asyncio.wait_for(q.get(), 1)).id == "rebalance"


class ExistingLease:
    """The gang's Lease names ``owner`` already (a paused or killed owner's notice)."""

    def __init__(self, owner: str) -> None:
        self.owner = owner

    async def acquire(self, g: Gang, n: Notice) -> bool:
        await asyncio.sleep(0.02)  # create, 409, read: a few round trips
        return n.id == self.owner


async def test_the_lease_owner_charges_a_gang_another_notice_of_this_process_asked_for_first() -> (
    None
):
    """Both notices resumed by one scan; the one that does not own the Lease reaches the gang
    first: the owner must not wait for it and then skip the gang (nobody would charge it)."""
    g = gang("llm", "u0", "u1")
    owners = GangOwners(ExistingLease(owner="n1"))
    first = asyncio.create_task(owners.take([g], notice("n2", 120).notice, ["node-u1"]))
    await asyncio.sleep(0.005)
    second = asyncio.create_task(owners.take([g], notice("n1", 120).notice, ["node-u0"]))
    by_n2, by_n1 = await first, await second
    assert by_n2.owned == [] and by_n2.skipped == [g.key]
    assert [f.gang.key for f in by_n1.owned] == [g.key] and by_n1.skipped == []
