import asyncio
from datetime import timedelta

from reclaimd.model import GangKey, Notice, NoticeKind, Target, utcnow
from reclaimd.scheduler import EdfQueue, GangFlights, Scheduler


def notice(nid: str, in_s: float | None) -> Notice:
    now = utcnow()
    return Notice(
        id=nid,
        source="test",
        kind=NoticeKind.SPOT_INTERRUPTION,
        target=Target(node_name=nid),
        issued_at=now,
        deadline=now + timedelta(seconds=in_s) if in_s is not None else None,
        received_at=now,
    )


async def test_edf_order_and_dedupe() -> None:
    q = EdfQueue(horizon_s=600)
    for nid, s in (("late", 100), ("none", None), ("soon", 5), ("mid", 50)):
        assert await q.put(notice(nid, s))
    assert not await q.put(notice("soon", 5))
    assert [(await q.get()).id for _ in range(4)] == ["soon", "mid", "late", "none"]


async def test_gang_flights_serialize_one_gang_and_release_map() -> None:
    flights = GangFlights()
    a, b = GangKey("job", "ns", "a"), GangKey("job", "ns", "b")
    order: list[str] = []

    async def flight(name: str, keys: list[GangKey], hold_s: float) -> None:
        async with flights.hold(keys):
            order.append(f"{name}+")
            await asyncio.sleep(hold_s)
            order.append(f"{name}-")

    # Three flights on gang a (one also on b, in the other order): never interleaved on a.
    await asyncio.gather(
        flight("x", [a, b], 0.02), flight("y", [b, a], 0.01), flight("z", [a], 0.0)
    )
    for i in range(0, len(order), 2):
        assert order[i][0] == order[i + 1][0] and order[i].endswith("+")
    assert flights.busy() == 0


async def test_scheduler_runs_everything_and_survives_a_failure() -> None:
    done: list[str] = []

    async def handle(n: Notice) -> None:
        if n.id == "boom":
            raise RuntimeError("boom")
        done.append(n.id)

    s = Scheduler(handle, workers=2)
    task = asyncio.create_task(s.run())
    for nid in ("a", "boom", "b", "c"):
        await s.submit(notice(nid, 10))
    await asyncio.wait_for(s.wait_idle(), 5)
    task.cancel()
    assert sorted(done) == ["a", "b", "c"]


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
