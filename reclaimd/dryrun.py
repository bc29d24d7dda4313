"""Dry-run (``reclaimd run --dry-run``): every step decided as for real, nothing done.

The transports, the parser, the intake, the scheduler and the runbook run unchanged; only the
parts that write or signal are swapped for the "would" parts below. Each logs one JSON line
per action (``would claim``, ``would evict``, ...) with the notice's id, and counts it in
``DryRunCounters``. The claim is decided from the cache's copy of the node exactly as the real
claim would be (``claims.decide``), so the transport acks only what it would have acked.

Nothing is written: no claim or cordon, no Lease, no eviction, no checkpoint request, no
ledger row. ``wiring.DryRun`` builds these parts in place of the real ones, and no holder
Lease, resume scan, probe port, Events or meter at all.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import logging
from collections import Counter
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any, TypeVar

from reclaimd import logs
from reclaimd.cluster import claimlog, claims
from reclaimd.intake import Admission, Admitted, Claimed
from reclaimd.ledger.event import to_event
from reclaimd.ledger.labels import LabelPolicy
from reclaimd.model import (
    Gang,
    GangKey,
    Member,
    Notice,
    ParseError,
    RankAck,
    Response,
    RestartWaste,
    utcnow,
)

log = logging.getLogger(__name__)

# The notice a runbook task acts for: the evictor is told a pod, not a notice, and every
# line must name its notice. Tasks copy the context, so the runbook's gathers inherit it.
_NOTICE: contextvars.ContextVar[str] = contextvars.ContextVar("reclaimd_dry_run_notice")

_ADMISSION = {
    claims.ClaimStatus.CLAIMED: Admission.CLAIMED,
    claims.ClaimStatus.ALREADY_OURS: Admission.RESUMED,
    claims.ClaimStatus.TAKEN_OVER: Admission.RESUMED,
    claims.ClaimStatus.DUPLICATE: Admission.DUPLICATE,
    claims.ClaimStatus.SUPERSEDED: Admission.SUPERSEDED,
}

R = TypeVar("R")


class DryRunCounters(Counter[str]):
    """What a dry run would have done, by action (``claim``, ``evict``, ...)."""

    def as_dict(self) -> dict[str, int]:
        return dict(sorted(self.items()))


def _would(counters: DryRunCounters, action: str, notice_id: str, **fields: Any) -> None:
    counters[action] += 1
    logs.event(log, f"would {action}", notice_id=notice_id, dry_run=True, **fields)


def acting_for(
    handle: Callable[[Admitted], Awaitable[R]],
) -> Callable[[Admitted], Awaitable[R]]:
    """``handle`` (the runbook's) with the notice's id set for the would-parts' lines."""

    async def run(admitted: Admitted) -> R:
        _NOTICE.set(admitted.id)  # this task's own context: other notices are unaffected
        return await handle(admitted)

    return run


def _current_notice() -> str:
    return _NOTICE.get("")


class WouldClaimLog:
    """The intake's ``ClaimWriter`` and the runbook's ``Progress``, writing nothing.

    A claim is decided against what is on the object: this process's own would-claim if it
    made one (nothing reaches the cluster, so the cache never shows it), else the claim in
    the cache's copy of the node. A Workload has no cached copy: only this process's
    would-claims count there.
    """

    def __init__(
        self,
        nodes: claimlog.NodeCopies,
        holder: str,
        counters: DryRunCounters,
        *,
        lease_s: float,  # claim_stale_s, as the real claim store is given it
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self.nodes, self.holder, self.counters = nodes, holder, counters
        self.lease_s = lease_s
        self.clock = clock
        self._mine: dict[claims.ClaimTarget, claims.Claim] = {}

    def _existing(self, obj: claims.ClaimTarget) -> claims.Claim | None:
        mine = self._mine.get(obj)
        if mine is not None or not isinstance(obj, claims.NodeObj):
            return mine
        snapshot = self.nodes.node(obj.name)
        text = snapshot.claim_text if snapshot is not None else None
        if not text:
            return None
        try:
            return claims.Claim.from_json(obj, text)
        except ParseError:
            return None  # the real claim overwrites what it cannot read, too

    async def still_ours(self, admitted: Admitted) -> bool:
        return True  # nothing was claimed in the cluster: nobody can take it over

    async def claim(self, notice: Notice, node: str | None) -> Claimed:
        obj = claimlog.object_for(notice, node)
        if isinstance(obj, claims.NodeObj) and self.nodes.node(obj.name) is None:
            return Claimed(Admission.UNKNOWN_TARGET)
        existing = self._existing(obj)
        now = self.clock()
        status = claims.decide(existing, notice, self.holder, now, self.lease_s)
        admission = _ADMISSION[status]
        previous = existing.notice_id if existing is not None else ""
        if admission not in (Admission.CLAIMED, Admission.RESUMED):
            _would(
                self.counters,
                "not claim",
                notice.id,
                object=obj.describe(),
                admission=admission.value,
                held_by=previous,
            )
            return Claimed(admission, node=node or "")
        self._mine[obj] = claims.Claim(
            target=obj,
            notice_id=notice.id,
            deadline=notice.deadline,
            holder=self.holder,
            phase=claims.Phase.CLAIMED,
            claimed_at=now,
            heartbeat_at=now,
            response=notice.response.value,
        )
        _would(
            self.counters,
            "claim",
            notice.id,
            object=obj.describe(),
            admission=admission.value,
            cordon=isinstance(obj, claims.NodeObj) and notice.response is Response.FULL,
            previous=previous,
        )
        # Not cordoned: the runbook must not report (or span) a cordon that never happened.
        return Claimed(admission, on=obj, node=node or "", cordoned=False)

    async def done(self, admitted: Admitted, **facts: Any) -> None:
        obj = admitted.claim.on
        where = ""
        if isinstance(obj, claims.NodeObj | claims.WorkloadObj):
            where = obj.describe()
            mine = self._mine.get(obj)
            if mine is not None and mine.notice_id == admitted.id:
                # Done, as the real claim would say: a redelivery is then a duplicate.
                self._mine[obj] = dataclasses.replace(mine, phase=claims.Phase.DONE)
        _would(self.counters, "mark done", admitted.id, object=where, **facts)


class WouldLock:
    """The gang ``GangLock``: the first notice per gang in this process charges it (no
    Lease is written, so peers are not consulted)."""

    def __init__(self, counters: DryRunCounters) -> None:
        self.counters = counters
        self._owner: dict[GangKey, str] = {}

    async def acquire(self, gang: Gang, notice: Notice) -> bool:
        owner = self._owner.setdefault(gang.key, notice.id)
        ours = owner == notice.id
        _would(
            self.counters,
            "own gang" if ours else "skip gang",
            notice.id,
            gang=str(gang.key),
            owner=owner,
        )
        return ours


class WouldEvict:
    """The runbook's ``ClusterWriter``: nothing is evicted and nothing waited for."""

    def __init__(self, counters: DryRunCounters, *, policy: str = "") -> None:
        self.counters, self.policy = counters, policy

    async def evict(self, member: Member, *, deadline: datetime, saved: bool = False) -> str:
        _would(
            self.counters,
            "evict",
            _current_notice(),
            pod=f"{member.namespace}/{member.name}",
            node=member.node,
            policy=self.policy,
            deadline=deadline.isoformat(),
        )
        return "would-evict"

    async def wait_gone(self, member: Member, *, deadline: datetime) -> datetime | None:
        return utcnow()


class WouldSignal:
    """The runbook's ``Signaller``: asks nobody; every rank's answer says why."""

    def __init__(self, counters: DryRunCounters) -> None:
        self.counters = counters

    async def signal(
        self,
        gang: Gang,
        notice: Notice,
        *,
        budget_deadline: datetime,
        cut: asyncio.Event | None = None,
        on_ack: Callable[[RankAck], None] | None = None,
    ) -> tuple[RankAck, ...]:
        for m in gang.members:
            _would(
                self.counters,
                "signal",
                notice.id,
                gang=str(gang.key),
                pod=f"{m.namespace}/{m.name}",
                checkpoint_url=bool(m.checkpoint_url),
                budget_deadline=budget_deadline.isoformat(),
            )
        return tuple(RankAck(m, acked=False, error="dry-run") for m in gang.members)


class WouldRecord:
    """The runbook's ``Ledger``: the event is built as the real writer encodes it, and
    logged; no outbox row, nothing sent."""

    def __init__(self, counters: DryRunCounters, policy: LabelPolicy) -> None:
        self.counters, self.policy = counters, policy

    async def record(self, waste: RestartWaste) -> None:
        event = to_event(waste, self.policy)
        _would(self.counters, "record", waste.notice.id, event=event)


@dataclasses.dataclass(frozen=True)
class WouldParts:
    """Every would-part of one dry-running process, sharing its counters."""

    counters: DryRunCounters
    claim_log: WouldClaimLog
    gang_lock: WouldLock
    evictor: WouldEvict
    signaller: WouldSignal
    recorder: WouldRecord

    @classmethod
    def build(
        cls,
        nodes: claimlog.NodeCopies,
        holder: str,
        policy: LabelPolicy,
        *,
        lease_s: float,
        eviction_policy: str = "",
    ) -> WouldParts:
        counters = DryRunCounters()
        return cls(
            counters,
            WouldClaimLog(nodes, holder, counters, lease_s=lease_s),
            WouldLock(counters),
            WouldEvict(counters, policy=eviction_policy),
            WouldSignal(counters),
            WouldRecord(counters, policy),
        )
