"""The per-notice runbook, read top to bottom.

The intake's claim was the first write, and on a node it also cordoned and tainted it, before
the transport acked the message. From there a notice goes

    resolve -> own its gangs -> per gang, at once: checkpoint every rank -> drain -> one event

Every step is idempotent (a resumed notice runs the runbook again from the top) and every step
watches the deadline: the checkpoint budget ends early enough to leave the drain its reserve,
and the drain escalates as the deadline nears (the eviction policy decides how). Gangs are
settled concurrently and independently: a gang whose rank hangs does not hold back the drain
of another. A gang that a notice in this process already owns is joined, not waited for
(``scheduler.GangOwners``). Side effects sit behind the small protocols below so each step
can be exercised alone. What a taken-over notice's gangs recorded, and the acks written back
to that record, are in ``gangbook``; the spans the steps open, in ``runbookspans``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol

from opentelemetry import trace

from reclaimd import checkpoint, gangbook, logs, runbookspans, tracing
from reclaimd.afterdrain import AfterDrain, NoAfterDrain
from reclaimd.gangbook import GangRecords
from reclaimd.intake import Admitted, ClaimLost
from reclaimd.model import (
    Gang,
    GangKey,
    Member,
    Notice,
    Plan,
    RankAck,
    Recorded,
    Response,
    RestartWaste,
    Target,
    WorkloadRef,
    utcnow,
)
from reclaimd.scheduler import GangFlight, GangOwners
from reclaimd.settings.policy import PolicySettings

log = logging.getLogger(__name__)


# --- what the runbook needs from the world --------------------------------------------------


class ClusterView(Protocol):
    """The cluster cache. ``since``: also the ranks that left since then (a notice's gang is
    still to charge when its pods went before the notice was resolved)."""

    def resolve_node(self, target: Target) -> str | None: ...
    def gangs_on_nodes(
        self, nodes: Iterable[str], *, since: datetime | None = None
    ) -> tuple[Gang, ...]: ...
    def gangs_of_workload(
        self, ref: WorkloadRef, *, since: datetime | None = None
    ) -> tuple[Gang, ...]: ...


class ClusterWriter(Protocol):
    async def evict(self, member: Member, *, deadline: datetime, saved: bool = False) -> str:
        """Evict (or, per policy, delete) one pod; returns a short outcome word. ``saved``: its
        gang's checkpoint ask is over, so a PDB guarding only that gang need not hold it."""
        ...

    async def wait_gone(self, member: Member, *, deadline: datetime) -> datetime | None:
        """When the pod was seen gone (at most the deadline, when it went unseen before we
        looked), or None if it outlived the deadline."""
        ...


class Signaller(Protocol):
    async def signal(
        self,
        gang: Gang,
        notice: Notice,
        *,
        budget_deadline: datetime,
        cut: asyncio.Event | None = None,
        on_ack: Callable[[RankAck], None] | None = None,
    ) -> tuple[RankAck, ...]:
        """Every rank's outcome by ``budget_deadline``, or earlier once ``cut`` is set;
        ``on_ack`` hears each as it is known."""
        ...


class Ledger(Protocol):
    async def record(self, waste: RestartWaste) -> None: ...


class Narrator(Protocol):
    """Tells operators what happened (Kubernetes Events, ``cluster.events.NoticeEvents``):
    every call returns at once and never raises; the runbook never waits for it."""

    def claimed(self, notice: Notice, nodes: tuple[str, ...], *, cordoned: bool) -> None: ...
    def checkpoint_requested(self, notice: Notice, gang: Gang, budget_end: datetime) -> None: ...
    def checkpoint_answered(self, acks: tuple[RankAck, ...]) -> None: ...
    def evicted(self, member: Member, outcome: str) -> None: ...
    def drained(self, notice: Notice, nodes: tuple[str, ...]) -> None: ...
    def recorded(self, waste: RestartWaste) -> None: ...


class Silent:
    """A ``Narrator`` that tells nobody."""

    def claimed(self, notice: Notice, nodes: tuple[str, ...], *, cordoned: bool) -> None:
        return None

    def checkpoint_requested(self, notice: Notice, gang: Gang, budget_end: datetime) -> None:
        return None

    def checkpoint_answered(self, acks: tuple[RankAck, ...]) -> None:
        return None

    def evicted(self, member: Member, outcome: str) -> None:
        return None

    def drained(self, notice: Notice, nodes: tuple[str, ...]) -> None:
        return None

    def recorded(self, waste: RestartWaste) -> None:
        return None


class Progress(Protocol):
    async def done(self, admitted: Admitted, **facts: Any) -> None:
        """The notice is finished: its claim says so (the resume scan skips it)."""
        ...

    async def still_ours(self, admitted: Admitted) -> bool:
        """The claim is still this process's: false after a pause long enough for a peer to
        take the notice over (a resumed SIGSTOP, a frozen VM). Cheap while our Lease is
        fresh; a read of the claim otherwise."""
        ...


WasteBuilder = Callable[..., RestartWaste]

# Eviction outcomes that leave the pod running (a PDB held to the end, an API refusal).
KEPT_RUNNING = frozenset({"blocked", "failed"})


@dataclass(frozen=True)
class Budget:
    """How the notice window is split: checkpoint first, then the drain's reserve."""

    drain_reserve_s: float
    drain_reserve_fraction: float
    no_deadline_horizon_s: float  # an early warning's checkpoint budget

    def checkpoint_deadline(
        self, notice: Notice, now: datetime, *, deadline: datetime | None = None
    ) -> datetime:
        """When the checkpoint wait ends; ``deadline`` overrides the notice's own (a gang
        joined by a notice that dies earlier)."""
        if deadline is not None and deadline != notice.deadline:
            notice = dataclasses.replace(notice, deadline=deadline)
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
    skipped_gangs: list[GangKey] = field(default_factory=list)  # another notice charges them
    joined_gangs: list[GangKey] = field(default_factory=list)  # ...one in this process

    def mark(self, step: str, at: datetime | None = None) -> None:
        self.times[step] = at or utcnow()

    @property
    def deadline_met(self) -> bool:
        return all(w.deadline_met for w in self.wastes)


class Runbook:
    """A notice from its claim to its gangs charged: ``handle`` runs the steps below in order
    (``resolve``, ``own``, then per gang ``settle``: ``checkpoint``, ``drain``, ``record``;
    ``follow`` for a gang another notice here owns)."""

    def __init__(
        self,
        *,
        view: ClusterView,
        writer: ClusterWriter,
        signaller: Signaller,
        ledger: Ledger,
        progress: Progress,
        owners: GangOwners,
        budget: Budget,
        build_waste: WasteBuilder,
        tracer: trace.Tracer,
        cluster_name: str,
        evict_concurrency: int = PolicySettings().evict_concurrency,
        on_report: Callable[[Report], None] | None = None,
        ledger_topic: str = "",
        narrator: Narrator | None = None,
        records: GangRecords | None = None,
        after_drain: AfterDrain | None = None,
        flush_spans: Callable[[], Awaitable[object]] | None = None,
    ) -> None:
        self.view, self.writer, self.signaller = view, writer, signaller
        # Before a claim is marked done: its trace must outlive a SIGKILL that follows, since
        # nobody runs a done notice again (a crash before ``done`` is resumed and traced anew).
        self.flush_spans = flush_spans
        self.narrator: Narrator = narrator or Silent()
        self.ledger, self.progress, self.budget = ledger, progress, budget
        self.owners, self.build_waste, self.tracer = owners, build_waste, tracer
        self.cluster_name, self.ledger_topic = cluster_name, ledger_topic
        self.evict_concurrency, self.on_report, self.records = evict_concurrency, on_report, records
        # What the notice's source does around the drain (an ASG lifecycle hook's heartbeats
        # while it runs, CONTINUE once it is done).
        self.after_drain: AfterDrain = after_drain or NoAfterDrain()
        self.taken_over = 0  # notices taken over from a holder that stopped renewing
        self.fenced = 0  # notices given up: a fence found that a peer holds them now

    async def handle(self, admitted: Admitted) -> Report:
        if admitted.claim.took_over_from:
            self.taken_over += 1
        try:
            return await self._handle(admitted)
        except ClaimLost:
            self.fenced += 1  # the peer that holds it records, drains and charges
            raise

    async def _handle(self, admitted: Admitted) -> Report:
        notice = admitted.notice
        report = Report(notice)
        report.mark("received", notice.received_at)
        # A notice taken over (or resumed after a restart) starts from what its gangs' Leases
        # recorded: the gangs owned, their acked checkpoints, the earlier trace to link to.
        recorded = await gangbook.recorded_gangs(self.records, admitted)
        # The trace starts when the notice was received, so the window spent in the transport
        # and in the claim shows in the post-mortem; an exception is recorded on the root.
        with runbookspans.notice_span(
            self.tracer,
            admitted,
            report.mark,
            cluster=self.cluster_name,
            earlier=[r.traceparent for r in recorded.values()],
        ) as root:
            try:
                facts = await self._run(admitted, report, recorded)
            finally:
                root.set_attribute("reclaimd.deadline_met", report.deadline_met)
        await self._flush_spans()
        await self.progress.done(admitted, **facts)
        if self.on_report is not None:
            self.on_report(report)
        return report

    async def _run(
        self, admitted: Admitted, report: Report, recorded: Mapping[GangKey, Recorded]
    ) -> dict[str, Any]:
        """The runbook; what the claim records as done (``handle`` writes it, last)."""
        notice = admitted.notice
        plan = gangbook.with_recorded(self.resolve(notice), recorded)
        report.plan = plan
        report.mark("resolved")
        self.narrator.claimed(notice, plan.nodes, cordoned=admitted.claim.cordoned)
        if notice.response is Response.CHECKPOINT_ONLY:
            # An early warning takes nothing away: it asks every gang to save and charges
            # none, so it must not own the gangs the interruption that follows will charge.
            await asyncio.gather(*(self.checkpoint(notice, g, None, report) for g in plan.gangs))
            return {"outcome": "checkpoint-only"}
        flights, joined = await self.own(plan, report)
        if not flights and not joined:
            # Every gang here was charged by another notice, already done or on another
            # replica: the node has nothing left for this notice to drain.
            with self.tracer.start_as_current_span(
                "reclaimd.drain", attributes={"reclaimd.skipped_gangs": len(report.skipped_gangs)}
            ):
                report.mark("drained")
        try:
            async with self.after_drain.holding(notice):
                await asyncio.gather(
                    *(self.settle(admitted, f, report, recorded.get(f.gang.key)) for f in flights),
                    *(self.follow(notice, f, report) for f in joined),
                )
        finally:
            for flight in flights:
                self.owners.release(flight)
        # Before ``done``: a crash in between completes again on resume ("already done").
        drained = not KEPT_RUNNING.intersection(report.evictions.values())
        await self.after_drain.finished(notice, drained=drained)
        return {"deadline_met": report.deadline_met}

    # --- the steps ------------------------------------------------------------------------

    def resolve(self, notice: Notice) -> Plan:
        with self.tracer.start_as_current_span("reclaimd.resolve") as span:
            # Pods that left since the notice was issued are still its gang's: Kueue deletes
            # a reclaimed Workload's pods itself, a dead owner may have evicted some.
            since = notice.issued_at
            if notice.target.workload is not None:
                gangs = self.view.gangs_of_workload(notice.target.workload, since=since)
                nodes: tuple[str, ...] = ()
            else:
                node = self.view.resolve_node(notice.target)
                nodes = (node,) if node else ()
                gangs = self.view.gangs_on_nodes(nodes, since=since)
            span.set_attribute("reclaimd.gangs", len(gangs))
            span.set_attribute("reclaimd.ranks", sum(len(g.members) for g in gangs))
            if nodes:
                span.set_attribute("k8s.node.name", nodes[0])
            return Plan(notice=notice, nodes=nodes, gangs=gangs)

    async def own(self, plan: Plan, report: Report) -> tuple[list[GangFlight], list[GangFlight]]:
        """The gangs this notice charges, and those it joins. The others are owned by an
        earlier notice (another node of the same gang): in this process the notice joins that
        flight (its deadline governs if earlier), on another replica the gang's Lease says who
        charges it."""
        taken = await self.owners.take(plan.gangs, plan.notice, plan.nodes)
        report.skipped_gangs.extend(k for k in taken.skipped)
        report.joined_gangs.extend(f.gang.key for f in taken.joined)
        return taken.owned, taken.joined

    async def settle(
        self,
        admitted: Admitted,
        flight: GangFlight,
        report: Report,
        recorded: Recorded | None = None,
    ) -> None:
        """One gang, start to end: every rank asked to checkpoint, the durable acks recorded
        (a successor charges from them), drained, charged once."""
        notice = admitted.notice
        # Each durable ack is recorded as it comes: killed while a slow rank still saves,
        # this process must not take the fast ranks' acks with it.
        writes = gangbook.ack_writes(
            self.records, admitted, flight.gang, recorded, fence=self._fence
        )
        try:
            acks = await self.checkpoint(notice, flight.gang, flight, report, on_ack=writes.add)
            if recorded is not None:
                acks = checkpoint.merge_acks(acks, recorded.acks)
                report.acks[flight.gang.key] = acks
            await writes.close(acks)  # all of them, before the drain depends on them
            # The fence, before each step that acts for the notice: paused (or cut off) past
            # our Lease, a peer took the notice over; it records, drains and charges the gang.
            # Free while our Lease never lapsed; a read of the claim otherwise.
            await self._fence(admitted)
            stopped = await self.drain(notice, flight, report)
            flight.stopped(stopped.at)
            await self._fence(admitted)
            await self.record(notice, flight.gang, acks, stopped, report)
        finally:
            writes.cancel()
            flight.settled.set()

    async def _flush_spans(self) -> None:
        await runbookspans.flush(self.flush_spans)  # never raises

    async def _fence(self, admitted: Admitted) -> None:
        if not await self.progress.still_ours(admitted):
            raise ClaimLost(f"notice {admitted.id} was taken over while this process paused")

    async def follow(self, notice: Notice, flight: GangFlight, report: Report) -> None:
        """A joined gang: its owner drains and charges it; this notice's node is drained when
        the owner's drain is over, so the notice waits for that (a cheap await, no worker
        held), not for the charge after it."""
        deadline = notice.deadline or utcnow() + timedelta(seconds=120)
        with self.tracer.start_as_current_span(
            "reclaimd.drain",
            attributes={"reclaimd.gang": str(flight.gang.key), "reclaimd.joined": flight.owner},
        ) as span:
            left = (deadline - utcnow()).total_seconds()
            try:
                await asyncio.wait_for(flight.drained.wait(), max(0.0, left) + 5.0)
            except TimeoutError:
                span.set_status(trace.StatusCode.ERROR, "the owner did not finish in time")
        at = flight.drained_at or utcnow()
        report.mark("drained", max(at, report.times.get("drained", at)))

    async def checkpoint(
        self,
        notice: Notice,
        gang: Gang,
        flight: GangFlight | None,
        report: Report,
        *,
        on_ack: Callable[[RankAck], None] | None = None,
    ) -> tuple[RankAck, ...]:
        deadline_of = flight.deadline if flight is not None else notice.deadline
        budget_end = self.budget.checkpoint_deadline(notice, utcnow(), deadline=deadline_of)
        with self.tracer.start_as_current_span(
            "reclaimd.checkpoint",
            attributes={
                "reclaimd.budget_deadline": budget_end.isoformat(),
                "reclaimd.gang": str(gang.key),
            },
        ):
            if flight is not None:
                flight.checkpoint_until(
                    lambda d: self.budget.checkpoint_deadline(notice, utcnow(), deadline=d)
                )
            self.narrator.checkpoint_requested(notice, gang, budget_end)
            acks = await self.signaller.signal(
                gang,
                notice,
                budget_deadline=budget_end,
                cut=flight.cut if flight is not None else None,
                on_ack=on_ack,
            )
        self.narrator.checkpoint_answered(acks)
        report.acks[gang.key] = acks
        report.mark("signaled")
        return acks

    async def drain(self, notice: Notice, flight: GangFlight, report: Report) -> Stop:
        """Evict every rank of the gang; when it stopped, and whether in time. The deadline is
        the earliest of every notice that joined the gang."""
        gang = flight.gang
        deadline = flight.deadline or utcnow() + timedelta(seconds=120)
        limit = asyncio.Semaphore(self.evict_concurrency)

        async def one(member: Member) -> Stop:
            with runbookspans.evict_span(self.tracer, member, gang) as span:
                async with limit:
                    if notice.response is Response.FULL:
                        # The drain follows the checkpoint ask: the gang is saved or never will be.
                        outcome = await self.writer.evict(member, deadline=deadline, saved=True)
                    else:
                        outcome = "left-to-scheduler"  # Kueue deletes the pods itself
                    span.set_attribute("reclaimd.eviction", outcome)
                    # When the API server answered: the rest of the span is the pod going.
                    span.add_event("reclaimd.evict.answered", {"reclaimd.eviction": outcome})
                    report.evictions[f"{member.namespace}/{member.name}"] = outcome
                    self.narrator.evicted(member, outcome)
                if outcome in KEPT_RUNNING:
                    # The pod stays until the capacity goes: it stops with the node, unsaved.
                    span.set_status(trace.StatusCode.ERROR, outcome)
                    return Stop(deadline, in_time=False)
                gone = await self.writer.wait_gone(member, deadline=deadline)
                span.set_attribute("reclaimd.gone", gone is not None)
                if gone is None:
                    return Stop(max(utcnow(), deadline), in_time=False)
                # Strictly before: a pod gone unseen is charged to the deadline, not known
                # to have left in time (``ClusterWriter.wait_gone``).
                return Stop(gone, in_time=gone < deadline)

        with self.tracer.start_as_current_span(
            # The notice named here too: the trace is found without its root (``record``).
            "reclaimd.drain",
            attributes={"reclaimd.gang": str(gang.key), "reclaimd.notice.id": notice.id},
        ):
            stopped = Stop.last(await asyncio.gather(*(one(m) for m in gang.members)))
        self.narrator.drained(notice, tuple(sorted(flight.nodes)))
        report.mark("drained", max(stopped.at, report.times.get("drained", stopped.at)))
        return stopped

    async def record(
        self,
        notice: Notice,
        gang: Gang,
        acks: tuple[RankAck, ...],
        stopped: Stop,
        report: Report,
    ) -> None:
        with runbookspans.ledger_span(self.tracer, self.ledger_topic, notice, gang) as span:
            waste = self.build_waste(
                notice,
                gang,
                acks,
                stopped.at,
                deadline_met=stopped.in_time,
                traceparent=tracing.current_traceparent(),
                cluster=self.cluster_name,
            )
            # Out before the event exists anywhere: what ended so far (the claim, the asks, the
            # drain) is the trace the event names, should the process die before the root ends.
            await self._flush_spans()
            await self.ledger.record(waste)
            self.narrator.recorded(waste)
            report.wastes.append(waste)
            span.set_attribute("reclaimd.events", 1)
        report.mark("recorded")
        logs.event(
            log,
            "gang charged",
            notice_id=notice.id,
            gang=str(gang.key),
            gpu_seconds_lost=round(waste.gpu_seconds_lost, 3),
            deadline_met=stopped.in_time,
        )
