"""AckWrites: each durable ack recorded as it comes, one write at a time, latest set wins."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from reclaimd.ackwrites import AckWrites
from reclaimd.intake import ClaimLost
from reclaimd.model import Member, RankAck, utcnow

T0 = utcnow()


def ack(i: int, *, durable: bool = True, at_s: float = 0.0) -> RankAck:
    m = Member("ns", f"p-{i}", f"uid-{i}", "n1", 8)
    return RankAck(m, acked=True, durable=durable, checkpoint_time=T0 + timedelta(seconds=at_s))


class Record:
    """The write: what each one carried (every ack, durable or not) and whether two crossed."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.writes: list[set[str]] = []
        self.delay_s = delay_s
        self.in_flight = 0
        self.crossed = False
        self.started = asyncio.Event()  # a write is under way
        self._done = asyncio.Condition()

    async def __call__(self, acks: tuple[RankAck, ...]) -> None:
        self.in_flight += 1
        self.crossed |= self.in_flight > 1
        self.started.set()
        await asyncio.sleep(self.delay_s)
        self.in_flight -= 1
        async with self._done:
            self.writes.append({a.member.uid for a in acks})
            self._done.notify_all()

    async def written(self, n: int) -> None:
        """Until ``n`` writes have landed (a bound, not a timing)."""
        async with asyncio.timeout(5), self._done:
            await self._done.wait_for(lambda: len(self.writes) >= n)


async def test_the_first_durable_ack_is_written_at_once_and_a_non_durable_one_not() -> None:
    rec = Record()
    w = AckWrites(rec, every_s=10)
    w.add(ack(0, durable=False))
    w.add(ack(1))
    await rec.written(1)
    # one write, for the durable ack (it carries the other along); a write started by the
    # non-durable one would have landed first, with uid-0 alone
    assert rec.writes == [{"uid-0", "uid-1"}]
    await w.close((ack(0, durable=False), ack(1)))
    assert len(rec.writes) == 1  # nothing durable new for close to write


async def test_acks_that_come_during_a_write_go_together_in_the_next_and_close_adds_none() -> None:
    rec = Record(delay_s=0.05)
    w = AckWrites(rec, every_s=0.01)
    w.add(ack(0))
    await rec.started.wait()
    for i in range(1, 5):  # all while the first write is under way
        w.add(ack(i))
    await rec.written(2)
    await w.close(tuple(ack(i) for i in range(5)))
    assert not rec.crossed
    assert rec.writes == [{"uid-0"}, {f"uid-{i}" for i in range(5)}]  # not one per rank


async def test_close_waits_for_a_write_under_way_then_writes_what_is_new() -> None:
    rec = Record(delay_s=0.05)
    w = AckWrites(rec, every_s=10)
    w.add(ack(0))
    await rec.started.wait()
    await w.close((ack(0), ack(1)))
    assert not rec.crossed
    assert rec.writes == [{"uid-0"}, {"uid-0", "uid-1"}]


async def test_close_skips_the_pause_between_writes() -> None:
    rec = Record()
    w = AckWrites(rec, every_s=30)
    w.add(ack(0))
    await rec.written(1)
    await asyncio.wait_for(w.close((ack(0), ack(1))), 1.0)
    assert rec.writes == [{"uid-0"}, {"uid-0", "uid-1"}]


async def test_a_resumed_notice_writes_its_acks_merged_with_the_record() -> None:
    rec = Record()
    recorded = (ack(0, at_s=-5), ack(1, at_s=-5))
    w = AckWrites(rec, recorded, every_s=10)
    w.add(ack(1, at_s=0))  # newer than the record: worth a write, with rank 0's kept
    await rec.written(1)
    assert rec.writes == [{"uid-0", "uid-1"}]
    await w.close(recorded)  # the record has it all: no write
    assert len(rec.writes) == 1


async def test_a_fenced_write_stops_the_writes_and_close_says_so() -> None:
    calls = 0
    fenced_once = asyncio.Event()

    async def fenced(acks: tuple[RankAck, ...]) -> None:
        nonlocal calls
        calls += 1
        fenced_once.set()
        raise ClaimLost("taken over")

    w = AckWrites(fenced, every_s=0)
    w.add(ack(0))
    await asyncio.wait_for(fenced_once.wait(), 5)
    w.add(ack(1))  # a peer holds the notice: nothing more is written
    with pytest.raises(ClaimLost):
        await w.close((ack(0), ack(1)))
    assert calls == 1


async def test_a_failed_write_is_tried_again_by_close() -> None:
    writes: list[int] = []
    failed = asyncio.Event()

    async def flaky(acks: tuple[RankAck, ...]) -> None:
        writes.append(len(acks))
        if len(writes) == 1:
            failed.set()
            raise RuntimeError("apiserver down")

    w = AckWrites(flaky, every_s=0)
    w.add(ack(0))
    await asyncio.wait_for(failed.wait(), 5)
    await w.close((ack(0),))
    assert writes == [1, 1]
