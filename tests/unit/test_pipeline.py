"""The runbook's order and bookkeeping, with the world behind its protocols kept in memory."""

import asyncio
from collections.abc import Iterable
from datetime import datetime, timedelta

from opentelemetry.sdk.trace import TracerProvider

from reclaimd import waste
from reclaimd.intake import Admission, Admitted, Claimed
from reclaimd.model import (
    Gang,
    GangKey,
    Member,
    Notice,
    NoticeKind,
    RankAck,
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

    def gangs_on_nodes(self, nodes: Iterable[str]) -> tuple[Gang, ...]:
        ns = set(nodes)
        return tuple(g for g in (GANG, SOLO) if g.nodes & ns)

    def gangs_of_workload(self, ref: WorkloadRef) -> tuple[Gang, ...]:
        return (GANG,)

    # ClusterWriter
    async def evict(self, m: Member, *, deadline: datetime) -> str:
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
