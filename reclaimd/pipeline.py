"""The per-notice runbook, read top to bottom.

The claim was written by intake before the transport acked the message; from there a notice goes

    resolve -> cordon/taint -> checkpoint every rank -> drain -> one ledger event per gang

Every step is idempotent (a resumed notice runs the runbook again from the top) and every step
watches the deadline: the checkpoint budget ends early enough to leave the drain its reserve,
and the drain escalates as the deadline nears (the eviction policy decides how). Side effects
sit behind the small protocols below so each step can be exercised alone.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol

from opentelemetry import trace

from reclaimd import checkpoint, logs, tracing
from reclaimd.model import (
    Gang,
    GangKey,
    Member,
    Notice,
    Plan,
    RankAck,
    Response,
    RestartWaste,
    Target,
    WorkloadRef,
    utcnow,
)
from reclaimd.scheduler import GangFlights

log = logging.getLogger(__name__)


# --- what the runbook needs from the world --------------------------------------------------


class ClusterView(Protocol):
    def resolve_node(self, target: Target) -> str | None: ...
    def gangs_on_nodes(self, nodes: Iterable[str]) -> tuple[Gang, ...]: ...
    def gangs_of_workload(self, ref: WorkloadRef) -> tuple[Gang, ...]: ...


class ClusterWriter(Protocol):
    async def cordon_and_taint(self, node: str, notice: Notice) -> None: ...

    async def evict(self, member: Member, *, deadline: datetime) -> str:
        """Evict (or, per policy, delete) one pod; returns a short outcome word."""
        ...

    async def wait_gone(self, member: Member, *, deadline: datetime) -> datetime | None:
        """When the pod was seen gone, or None if it outlived the deadline."""
        ...


class Signaller(Protocol):
    async def signal(
        self, gang: Gang, notice: Notice, *, budget_deadline: datetime
    ) -> tuple[RankAck, ...]: ...


class Ledger(Protocol):
    async def record(self, waste: RestartWaste) -> None: ...


class GangLock(Protocol):
    async def acquire(self, gang: Gang, notice: Notice) -> bool:
        """True when this notice charges the gang (cluster-wide, across replicas)."""
        ...


class Progress(Protocol):
    async def advance(self, notice: Notice, phase: str, **facts: Any) -> None: ...


WasteBuilder = Callable[..., RestartWaste]

# Eviction outcomes that leave the pod running (a PDB held to the end, an API refusal).
KEPT_RUNNING = frozenset({"blocked", "failed"})


@dataclass(frozen=True)
class Budget:
    """How the notice window is split: checkpoint first, then the drain's reserve."""

    drain_reserve_s: float
    drain_reserve_fraction: float
    no_deadline_horizon_s: float  # an early warning's checkpoint budget

    def checkpoint_deadline(self, notice: Notice, now: datetime) -> datetime:
        # Nothing to drain after a checkpoint-only or scheduler-reclaim notice: the whole
        # window is the workload's.
        reserve = (
            checkpoint.reserve_for(
                notice, max_s=self.drain_reserve_s, fraction=self.drain_reserve_fraction
            )
            if notice.response is Response.FULL
            else 0.0
        )
        return checkpoint.budget_for(
            notice, now, reserve_s=reserve, open_budget_s=self.no_deadline_horizon_s
        )


@dataclass(frozen=True)
class Stop:
    """When a pod (or, with ``last``, a whole gang) stopped, and whether before the deadline."""

    at: datetime
    in_time: bool

    @staticmethod
    def last(stops: Sequence[Stop]) -> Stop:
        if not stops:
            return Stop(utcnow(), in_time=True)
        return Stop(max(s.at for s in stops), in_time=all(s.in_time for s in stops))


@dataclass
class Report:
    """What happened to one notice, for logs, the demo, drills and metrics."""

    notice: Notice
    plan: Plan | None = None
    times: dict[str, datetime] = field(default_factory=dict)
    acks: dict[GangKey, tuple[RankAck, ...]] = field(default_factory=dict)
    evictions: dict[str, str] = field(default_factory=dict)  # ns/pod -> outcome
    wastes: list[RestartWaste] = field(default_factory=list)
    skipped_gangs: list[GangKey] = field(default_factory=list)

    def mark(self, step: str, at: datetime | None = None) -> None:
        self.times[step] = at or utcnow()

    @property
    def deadline_met(self) -> bool:
        return all(w.deadline_met for w in self.wastes)


class Runbook:
    def __init__(
        self,
        *,
        view: ClusterView,
        writer: ClusterWriter,
        signaller: Signaller,
        ledger: Ledger,
        progress: Progress,
        gang_lock: GangLock,
        budget: Budget,
        build_waste: WasteBuilder,
        tracer: trace.Tracer,
        cluster_name: str,
        evict_concurrency: int = 32,
        on_report: Callable[[Report], None] | None = None,
        claim_times: Callable[[str], tuple[datetime, datetime] | None] = lambda _: None,
        receipts: Callable[[str], trace.SpanContext | None] = lambda _: None,
        ledger_topic: str = "",
    ) -> None:
        self.view, self.writer, self.signaller = view, writer, signaller
        self.ledger, self.progress, self.budget = ledger, progress, budget
        self.gang_lock = gang_lock
        self.build_waste = build_waste
        self.tracer = tracer
        self.cluster_name = cluster_name
        self.evict_concurrency = evict_concurrency
        self.on_report = on_report
        self.claim_times = claim_times
        self.receipts = receipts  # the notice's receive span, to link the trace to its message
        self.ledger_topic = ledger_topic
        self.flights = GangFlights()

    async def handle(self, notice: Notice) -> Report:
        report = Report(notice)
        report.mark("received", notice.received_at)
        # The trace starts when the notice was received, so the window spent in the transport
        # and in the claim shows in the post-mortem; an exception is recorded on the root.
        with tracing.notice_span(
            self.tracer, notice, cluster=self.cluster_name, receipt=self.receipts(notice.id)
        ) as root:
            self._claim_span(notice, report)
            try:
                await self._run(notice, report)
            finally:
                root.set_attribute("reclaimd.deadline_met", report.deadline_met)
        if self.on_report is not None:
            self.on_report(report)
        return report

    async def _run(self, notice: Notice, report: Report) -> None:
        plan = self.resolve(notice)
        report.plan = plan
        report.mark("resolved")
        await self.cordon(plan, report)
        if notice.response is Response.CHECKPOINT_ONLY:
            # An early warning takes nothing away: it asks every gang to save and charges
            # none, so it must not hold the gangs against the notice that will.
            await self.checkpoint(notice, plan.gangs, report)
            await self.progress.advance(notice, "done", outcome="checkpoint-only")
            return
        async with self.flights.hold(g.key for g in plan.gangs):
            gangs = await self._ours(plan.gangs, report)
            acks = await self.checkpoint(notice, gangs, report)
            stopped = await self.drain(notice, gangs, report)
            await self.record(notice, gangs, acks, stopped, report)
        await self.progress.advance(notice, "done", deadline_met=report.deadline_met)

    def _claim_span(self, notice: Notice, report: Report) -> None:
        times = self.claim_times(notice.id)
        if times is None:
            return  # resumed after a restart: the claim was made by an earlier process
        span = self.tracer.start_span("reclaimd.claim", start_time=_ns(times[0]))
        span.end(end_time=_ns(times[1]))
        report.mark("claimed", times[1])

    # --- the steps ------------------------------------------------------------------------

    def resolve(self, notice: Notice) -> Plan:
        with self.tracer.start_as_current_span("reclaimd.resolve") as span:
            if notice.target.workload is not None:
                gangs = self.view.gangs_of_workload(notice.target.workload)
                nodes: tuple[str, ...] = ()
            else:
                node = self.view.resolve_node(notice.target)
                nodes = (node,) if node else ()
                gangs = self.view.gangs_on_nodes(nodes)
            span.set_attribute("reclaimd.gangs", len(gangs))
            span.set_attribute("reclaimd.ranks", sum(len(g.members) for g in gangs))
            if nodes:
                span.set_attribute("k8s.node.name", nodes[0])
            return Plan(notice=notice, nodes=nodes, gangs=gangs)

    async def cordon(self, plan: Plan, report: Report) -> None:
        if plan.notice.response is not Response.FULL:
            return
        nodes = {"k8s.node.name": plan.nodes[0]} if plan.nodes else {}
        with self.tracer.start_as_current_span("reclaimd.cordon", attributes=nodes):
            for node in plan.nodes:
                await self.writer.cordon_and_taint(node, plan.notice)
        report.mark("cordoned")
        await self.progress.advance(plan.notice, "cordoned")

    async def checkpoint(
        self, notice: Notice, gangs: Sequence[Gang], report: Report
    ) -> dict[GangKey, tuple[RankAck, ...]]:
        budget_end = self.budget.checkpoint_deadline(notice, utcnow())
        with self.tracer.start_as_current_span(
            "reclaimd.checkpoint", attributes={"reclaimd.budget_deadline": budget_end.isoformat()}
        ):
            results = await asyncio.gather(
                *(self.signaller.signal(g, notice, budget_deadline=budget_end) for g in gangs)
            )
        acks = {g.key: r for g, r in zip(gangs, results, strict=True)}
        report.acks.update(acks)
        report.mark("signaled")
        await self.progress.advance(notice, "signaled")
        return acks

    async def drain(
        self, notice: Notice, gangs: Sequence[Gang], report: Report
    ) -> dict[GangKey, Stop]:
        """Evict every rank of every gang; returns when each gang stopped, and if in time."""
        deadline = notice.deadline or utcnow() + timedelta(seconds=120)
        limit = asyncio.Semaphore(self.evict_concurrency)

        async def one(gang: Gang, member: Member) -> Stop:
            with self.tracer.start_as_current_span(
                "reclaimd.evict",
                attributes={
                    "k8s.namespace.name": member.namespace,
                    "k8s.pod.name": member.name,
                    "k8s.pod.uid": member.uid,
                    "k8s.node.name": member.node,
                    "reclaimd.gang": str(gang.key),
                },
            ) as span:
                async with limit:
                    if notice.response is Response.FULL:
                        outcome = await self.writer.evict(member, deadline=deadline)
                    else:
                        outcome = "left-to-scheduler"  # Kueue deletes the pods itself
                    span.set_attribute("reclaimd.eviction", outcome)
                    report.evictions[f"{member.namespace}/{member.name}"] = outcome
                if outcome in KEPT_RUNNING:
                    # The pod stays until the capacity goes: it stops with the node, unsaved.
                    span.set_status(trace.StatusCode.ERROR, outcome)
                    return Stop(deadline, in_time=False)
                gone = await self.writer.wait_gone(member, deadline=deadline)
                span.set_attribute("reclaimd.gone", gone is not None)
                if gone is None:
                    return Stop(max(utcnow(), deadline), in_time=False)
                return Stop(gone, in_time=gone <= deadline)

        with self.tracer.start_as_current_span("reclaimd.drain"):
            per_gang = await asyncio.gather(
                *(asyncio.gather(*(one(g, m) for m in g.members)) for g in gangs)
            )
        stopped = {g.key: Stop.last(stops) for g, stops in zip(gangs, per_gang, strict=True)}
        report.mark("drained", max((s.at for s in stopped.values()), default=utcnow()))
        await self.progress.advance(notice, "drained")
        return stopped

    async def record(
        self,
        notice: Notice,
        gangs: Sequence[Gang],
        acks: Mapping[GangKey, tuple[RankAck, ...]],
        stopped: Mapping[GangKey, Stop],
        report: Report,
    ) -> None:
        with self.tracer.start_as_current_span(
            "reclaimd.ledger",
            kind=trace.SpanKind.PRODUCER,  # it creates the events; the outbox sends them later
            attributes=tracing.producer_attributes("kafka", self.ledger_topic, len(gangs)),
        ) as span:
            traceparent = tracing.current_traceparent()
            for gang in gangs:
                waste = self.build_waste(
                    notice,
                    gang,
                    acks.get(gang.key, ()),
                    stopped[gang.key].at,
                    deadline_met=stopped[gang.key].in_time,
                    traceparent=traceparent,
                    cluster=self.cluster_name,
                )
                await self.ledger.record(waste)
                report.wastes.append(waste)
            span.set_attribute("reclaimd.events", len(gangs))
        report.mark("recorded")
        await self.progress.advance(notice, "recorded")
        logs.event(
            log,
            "notice handled",
            notice_id=notice.id,
            gangs=len(gangs),
            gpu_seconds_lost=round(sum(w.gpu_seconds_lost for w in report.wastes), 3),
            deadline_met=report.deadline_met,
        )

    async def _ours(self, gangs: Sequence[Gang], report: Report) -> tuple[Gang, ...]:
        """The gangs this notice charges; the others belong to an earlier notice (another node
        of the same gang), here or on another replica."""
        owned = await asyncio.gather(*(self.gang_lock.acquire(g, report.notice) for g in gangs))
        report.skipped_gangs.extend(g.key for g, mine in zip(gangs, owned, strict=True) if not mine)
        return tuple(g for g, mine in zip(gangs, owned, strict=True) if mine)


def _ns(t: datetime) -> int:
    return int(t.timestamp() * 1e9)
