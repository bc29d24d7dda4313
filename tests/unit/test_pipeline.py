"""The runbook's order and bookkeeping, with the world behind its protocols kept in memory."""

import asyncio
import dataclasses
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider

from reclaimd import checkpoint, waste
from reclaimd.intake import Admission, Admitted, Claimed, ClaimLost
from reclaimd.model import (
    Gang,
    GangKey,
    Member,
    Notice,
    NoticeKind,
    RankAck,
    Recorded,
    Response,
    RestartWaste,
    Target,
    WorkloadRef,
    utcnow,
)
from reclaimd.pipeline import Budget, Runbook
from reclaimd.scheduler import GangOwners

T0 = utcnow()


def member(name: str, node: str, gpus: int = 8) -> Member:
    return Member("ns", name, f"uid-{name}", node, gpus, last_checkpoint=T0 - timedelta(minutes=10))


GANG = Gang(GangKey("jobset", "ns", "g"), (member("g-0", "n1"), member("g-1", "n2")))
SOLO = Gang(GangKey("job", "ns", "solo"), (member("solo-0", "n1", 1),))


class World:
    def __init__(self) -> None:
        self.log: list[str] = []
        self.recorded: list[RestartWaste] = []
        self.owners: dict[GangKey, str] = {}
        self.budgets: list[datetime] = []

    # ClusterView
    def resolve_node(self, target: Target) -> str | None:
        return {"i-1": "n1", "i-2": "n2"}.get(target.instance_id)

    def gangs_on_nodes(
        self, nodes: Iterable[str], *, since: datetime | None = None
    ) -> tuple[Gang, ...]:
        ns = set(nodes)
        return tuple(g for g in (GANG, SOLO) if g.nodes & ns)

    def gangs_of_workload(
        self, ref: WorkloadRef, *, since: datetime | None = None
    ) -> tuple[Gang, ...]:
        return (GANG,)

    # ClusterWriter
    async def evict(self, m: Member, *, deadline: datetime, saved: bool = False) -> str:
        self.log.append(f"evict {m.name}")
        return "evicted"

    async def wait_gone(self, m: Member, *, deadline: datetime) -> datetime | None:
        await asyncio.sleep(0)
        return utcnow()

    # Signaller
    async def signal(
        self,
        gang: Gang,
        notice: Notice,
        *,
        budget_deadline: datetime,
        cut: asyncio.Event | None = None,
        on_ack: Callable[[RankAck], None] | None = None,
    ) -> tuple[RankAck, ...]:
        self.log.append(f"signal {gang.key.name}")
        self.budgets.append(budget_deadline)
        now = utcnow()
        return tuple(RankAck(m, True, True, now) for m in gang.members)

    # GangLock: first notice wins, as the Lease create does
    async def acquire(self, gang: Gang, notice: Notice) -> bool:
        owner = self.owners.setdefault(gang.key, notice.id)
        return owner == notice.id

    # Ledger / Progress
    async def record(self, w: RestartWaste) -> None:
        self.recorded.append(w)

    async def done(self, admitted: Admitted, **facts: object) -> None:
        self.log.append("phase done")

    paused_past_lease = False  # a peer took our notices over while we were stopped

    async def still_ours(self, admitted: Admitted) -> bool:
        return not self.paused_past_lease


def runbook(world: World) -> Runbook:
    return Runbook(
        view=world,
        writer=world,
        signaller=world,
        ledger=world,
        progress=world,
        owners=GangOwners(world),
        budget=Budget(30, 0.34, 120),
        build_waste=waste.build_restart_waste,
        tracer=TracerProvider().get_tracer("t"),
        cluster_name="test",
    )


def admitted(n: Notice) -> Admitted:
    node = {"i-1": "n1", "i-2": "n2"}.get(n.target.instance_id, "")
    now = utcnow()
    return Admitted(n, Claimed(Admission.CLAIMED, node=node, cordoned=True), (now, now))


def spot(nid: str, instance: str, response: Response = Response.FULL) -> Notice:
    now = utcnow()
    return Notice(
        nid,
        "t",
        NoticeKind.SPOT_INTERRUPTION,
        Target(instance_id=instance),
        now,
        now + timedelta(seconds=120),
        now,
        response=response,
    )


async def test_runbook_order_and_one_event_per_gang() -> None:
    world = World()
    report = await runbook(world).handle(admitted(spot("a", "i-1")))
    steps = [e.split()[0] for e in world.log]
    assert steps.index("signal") < steps.index("evict")
    assert "cordoned" in report.times  # the claim's write cordoned it
    # every rank of the gang, the one on the healthy node n2 too
    assert {e for e in world.log if e.startswith("evict")} == {
        "evict g-0",
        "evict g-1",
        "evict solo-0",
    }
    assert sorted(w.gang.key.name for w in world.recorded) == ["g", "solo"]
    assert all(w.deadline_met for w in world.recorded)
    assert report.deadline_met and world.log[-1] == "phase done"


async def test_second_notice_for_same_gang_charges_nothing_twice() -> None:
    world = World()
    rb = runbook(world)
    _, b = await asyncio.gather(
        rb.handle(admitted(spot("a", "i-1"))), rb.handle(admitted(spot("b", "i-2")))
    )
    assert sorted(w.gang.key.name for w in world.recorded) == ["g", "solo"]
    # b did not wait for a's runbook: it joined the gang a owns
    assert b.joined_gangs == [GANG.key] and b.wastes == []
    assert world.log.count("signal g") == 1


async def test_a_joined_notice_is_drained_with_the_owners_drain_not_its_charge() -> None:
    world = World()
    charging = asyncio.Event()  # the owner's ledger write hangs until set
    record = world.record

    async def slow_record(w: RestartWaste) -> None:
        if w.gang.key == GANG.key:
            await charging.wait()
        await record(w)

    world.record = slow_record  # type: ignore[method-assign]
    rb = runbook(world)
    a = asyncio.create_task(rb.handle(admitted(spot("a", "i-1"))))
    await asyncio.sleep(0)  # a owns the gang before b looks
    b = await asyncio.wait_for(rb.handle(admitted(spot("b", "i-2"))), 5)
    assert b.joined_gangs == [GANG.key] and not a.done()  # b is done, a still charging
    assert b.deadline_met and "drained" in b.times
    charging.set()
    await a
    assert sorted(w.gang.key.name for w in world.recorded) == ["g", "solo"]


async def test_checkpoint_only_neither_cordons_nor_drains() -> None:
    world = World()
    rb = runbook(world)
    await rb.handle(admitted(spot("r", "i-1", Response.CHECKPOINT_ONLY)))
    assert not [e for e in world.log if e.startswith("evict")]
    assert "signal g" in world.log and world.recorded == []
    # ...and it holds no gang: the interruption that follows still drains and charges them
    await rb.handle(admitted(spot("a", "i-1")))
    assert sorted(w.gang.key.name for w in world.recorded) == ["g", "solo"]


def test_budget_keeps_the_drain_reserve() -> None:
    n = spot("a", "i-1")
    b = Budget(30, 0.34, 120)
    assert n.deadline is not None
    assert b.checkpoint_deadline(n, n.issued_at) == n.deadline - timedelta(seconds=30)
    gce = Notice(
        "g",
        "t",
        NoticeKind.PREEMPTION,
        Target(node_name="x"),
        n.issued_at,
        n.issued_at + timedelta(seconds=30),
        n.issued_at,
    )
    assert gce.deadline is not None
    assert b.checkpoint_deadline(gce, gce.issued_at) == gce.deadline - timedelta(seconds=10.2)


class RecordingWorld(World):
    """A world whose gang Leases keep their records, as ``cluster.gangclaims`` does."""

    def __init__(self) -> None:
        super().__init__()
        self.records: dict[str, dict[GangKey, Recorded]] = {}
        self.gone: set[str] = set()  # pods the dead owner already evicted

    def gangs_on_nodes(
        self, nodes: Iterable[str], *, since: datetime | None = None
    ) -> tuple[Gang, ...]:
        left = []
        for g in super().gangs_on_nodes(nodes):
            members = tuple(m for m in g.members if m.name not in self.gone)
            if members:
                left.append(dataclasses.replace(g, members=members))
        return tuple(left)

    async def acked(self, gang: Gang, notice: Notice, acks: tuple[RankAck, ...]) -> None:
        self.log.append(f"acked {gang.key.name}")
        mine = self.records.setdefault(notice.id, {})
        mine[gang.key] = Recorded(gang, tuple(checkpoint.durable(acks)))

    async def owned_by(self, notice: Notice) -> dict[GangKey, Recorded]:
        return dict(self.records.get(notice.id, {}))


class Silent(RecordingWorld):
    """Ranks that acked the dead owner do not answer its successor."""

    async def signal(
        self,
        gang: Gang,
        notice: Notice,
        *,
        budget_deadline: datetime,
        cut: asyncio.Event | None = None,
        on_ack: Callable[[RankAck], None] | None = None,
    ) -> tuple[RankAck, ...]:
        self.log.append(f"signal {gang.key.name}")
        return tuple(RankAck(m, False, error="no answer") for m in gang.members)


def recording_runbook(world: RecordingWorld) -> Runbook:
    rb = runbook(world)
    rb.records = world
    return rb


async def test_acks_are_recorded_before_the_drain() -> None:
    world = RecordingWorld()
    await recording_runbook(world).handle(admitted(spot("a", "i-1")))
    assert world.log.index("acked g") < world.log.index("evict g-0")
    assert {a.member.uid for a in world.records["a"][GANG.key].acks} == {"uid-g-0", "uid-g-1"}


class OneSlowRank(RecordingWorld):
    """g-0 acks a durable save at once; g-1 is still saving when the test looks."""

    def __init__(self) -> None:
        super().__init__()
        self.slow = asyncio.Event()

    async def signal(
        self,
        gang: Gang,
        notice: Notice,
        *,
        budget_deadline: datetime,
        cut: asyncio.Event | None = None,
        on_ack: Callable[[RankAck], None] | None = None,
    ) -> tuple[RankAck, ...]:
        fast, *slow = (RankAck(m, True, True, utcnow()) for m in gang.members)
        if on_ack is not None:
            on_ack(fast)
        await self.slow.wait()
        for a in slow:
            if on_ack is not None:
                on_ack(a)
        return fast, *slow


async def test_a_durable_ack_is_recorded_while_a_slower_rank_still_saves() -> None:
    """Killed while g-1 saves, the owner must not take g-0's ack with it: the record holds
    g-0's before g-1 answers (the old runbook wrote once, after every rank)."""
    world = OneSlowRank()
    run = asyncio.create_task(recording_runbook(world).handle(admitted(spot("a", "i-1"))))
    for _ in range(100):
        await asyncio.sleep(0.01)
        if GANG.key in world.records.get("a", {}):
            break
    assert {a.member.uid for a in world.records["a"][GANG.key].acks} == {"uid-g-0"}
    assert not run.done()
    world.slow.set()
    await run
    assert {a.member.uid for a in world.records["a"][GANG.key].acks} == {"uid-g-0", "uid-g-1"}
    assert world.log.index("evict g-0") > max(i for i, e in enumerate(world.log) if e == "acked g")


async def test_a_taken_over_notice_charges_from_what_the_dead_owner_recorded() -> None:
    world = Silent()
    notice = spot("a", "i-1")
    acked_at = utcnow() - timedelta(seconds=5)
    # The dead owner: both gangs owned, GANG's ranks acked a durable checkpoint, and SOLO's
    # only pod already evicted (it is no longer on the node for the successor to find).
    world.owners = {GANG.key: "a", SOLO.key: "a"}
    world.records["a"] = {
        GANG.key: Recorded(GANG, tuple(RankAck(m, True, True, acked_at) for m in GANG.members)),
        SOLO.key: Recorded(SOLO),
    }
    world.gone = {"solo-0", "g-0"}
    resumed = Admitted(notice, Claimed(Admission.RESUMED, node="n1", took_over_from="dead"))
    book = recording_runbook(world)
    report = await book.handle(resumed)
    assert (book.taken_over, book.fenced) == (1, 0)  # reclaimd_notices_taken_over_total
    charged = {w.gang.key: w for w in world.recorded}
    assert set(charged) == {GANG.key, SOLO.key}  # the gang with no pod left, too
    # every rank of GANG as owned (g-0 was evicted already), each from its acked checkpoint
    g = charged[GANG.key]
    assert {m.name for m in g.gang.members} == {"g-0", "g-1"}
    assert all(m.last_checkpoint == acked_at for m in g.gang.members)
    assert g.gpu_seconds_lost < 16 * 60  # 16 GPUs from 5 s ago, not from 10 minutes ago
    assert report.deadline_met


async def test_a_notice_taken_over_through_its_redelivered_message_reads_the_records() -> None:
    """Not the resume scan but the transport (a relisted Workload, a redelivered message)
    took the dead owner's claim over: the admission has claim times, and still the gangs
    the dead owner recorded are charged (the pods Kueue deleted meanwhile included)."""
    world = Silent()
    notice = spot("a", "i-1")
    world.owners = {SOLO.key: "a"}
    world.records["a"] = {SOLO.key: Recorded(SOLO)}
    world.gone = {"solo-0"}
    now = utcnow()
    taken = Admitted(
        notice, Claimed(Admission.RESUMED, node="n1", took_over_from="dead"), (now, now)
    )
    await recording_runbook(world).handle(taken)
    assert SOLO.key in {w.gang.key for w in world.recorded}


def test_merge_keeps_the_newer_durable_checkpoint() -> None:
    m0, m1 = GANG.members
    old, new = T0 - timedelta(seconds=30), T0
    fresh = (RankAck(m0, False, error="timeout"), RankAck(m1, True, True, new))
    recorded = (RankAck(m0, True, True, old), RankAck(m1, True, True, old))
    merged = {a.member.uid: a for a in checkpoint.merge_acks(fresh, recorded)}
    assert merged["uid-g-0"].checkpoint_time == old and merged["uid-g-0"].durable
    assert merged["uid-g-1"].checkpoint_time == new
    # a rank this run did not ask still has its recorded checkpoint
    only = checkpoint.merge_acks((), recorded)
    assert {a.member.uid for a in only} == {"uid-g-0", "uid-g-1"}


async def test_a_process_paused_past_its_lease_charges_nothing_its_successor_charges() -> None:
    world = World()
    world.paused_past_lease = True
    book = runbook(world)
    with pytest.raises(ClaimLost):
        await book.handle(admitted(spot("a", "i-1")))
    assert (book.taken_over, book.fenced) == (0, 1)  # reclaimd_notices_fenced_total
    assert world.recorded == []  # the successor charges the gangs, once
    assert not [line for line in world.log if line.startswith("evict")]  # and drains them


class PausedInTheDrain(World):
    """Our Lease lapses while the pods go (a SIGSTOP mid-drain): the successor charges."""

    async def wait_gone(self, m: Member, *, deadline: datetime) -> datetime | None:
        self.paused_past_lease = True
        return await super().wait_gone(m, deadline=deadline)


async def test_a_process_paused_in_the_drain_charges_nothing() -> None:
    world = PausedInTheDrain()
    with pytest.raises(ClaimLost):
        await runbook(world).handle(admitted(spot("a", "i-1")))
    assert [line for line in world.log if line.startswith("evict")]  # it had begun to drain
    assert world.recorded == []


def traced(world: World) -> tuple[Runbook, Any]:
    """A runbook over ``world`` whose spans are kept in memory as they end."""
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exported = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exported))
    rb = runbook(world)
    rb.tracer = provider.get_tracer("t")
    return rb, exported


async def test_the_trace_is_written_out_before_the_claim_is_done() -> None:
    """A SIGKILL right after ``done`` must not take the notice's trace with it: nobody runs
    a done notice again. So the root span has ended, and the spans are flushed, first."""
    world = World()
    rb, exported = traced(world)
    seen_at_done: list[str] = []

    async def flush() -> None:
        world.log.append("flush")

    async def done(admitted: Admitted, **facts: object) -> None:
        seen_at_done.extend(s.name for s in exported.get_finished_spans())
        world.log.append("phase done")

    rb.flush_spans = flush
    world.done = done  # type: ignore[method-assign]
    await rb.handle(admitted(spot("a", "i-1")))
    assert world.log[-2:] == ["flush", "phase done"]
    from reclaimd.tracing import ROOT_SPAN

    assert ROOT_SPAN in seen_at_done and "reclaimd.drain" in seen_at_done


async def test_each_event_names_a_trace_that_is_written_out_with_it() -> None:
    """A SIGKILL after a gang's event went to the outbox but before the notice's root span
    ended would leave the event naming a trace nobody has: the spans ended so far go out
    before each event is recorded, and the drain span names the notice (no root needed)."""
    world = World()
    rb, exported = traced(world)
    flushes: list[int] = []

    async def flush() -> None:
        flushes.append(len(world.recorded))

    rb.flush_spans = flush
    await rb.handle(admitted(spot("a", "i-1")))
    assert world.recorded and flushes[0] == 0  # written out before the event was recorded
    named = [s for s in exported.get_finished_spans() if s.name == "reclaimd.drain"]
    assert named and all(
        (s.attributes or {}).get("reclaimd.notice.id") == world.recorded[0].notice.id for s in named
    )
