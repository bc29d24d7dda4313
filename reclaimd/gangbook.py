"""A notice's gangs as their Leases record them (``cluster.gangclaims``), for the runbook.

A notice taken over from a dead owner, or resumed after a restart, starts from that record:
the gangs it owned (with every rank they had, though the owner may have evicted some), their
acked checkpoints and the earlier trace. While a gang's ranks answer, its durable acks are
written back to the record as they come (``ackwrites``), each write fenced like every step.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Protocol

from reclaimd import logs
from reclaimd.ackwrites import AckWrites
from reclaimd.intake import Admission, Admitted
from reclaimd.model import Gang, GangKey, Notice, Plan, RankAck, Recorded

log = logging.getLogger(__name__)


class GangRecords(Protocol):
    """The gangs' durable record in the cluster (``cluster.gangclaims``): what a replica
    taking a notice over needs to charge its gangs as the dead owner would have."""

    async def acked(self, gang: Gang, notice: Notice, acks: tuple[RankAck, ...]) -> None:
        """Record the durable checkpoints acked (never raises)."""
        ...

    async def owned_by(self, notice: Notice) -> Mapping[GangKey, Recorded]:
        """The gangs ``notice`` owns, as recorded when they were owned."""
        ...


async def recorded_gangs(
    records: GangRecords | None, admitted: Admitted
) -> Mapping[GangKey, Recorded]:
    """What the gangs' Leases recorded for ``admitted`` ({} for a fresh claim)."""
    if admitted.claim.admission is Admission.CLAIMED or records is None:
        return {}  # a fresh claim: nobody owned its gangs for it before
    # Ours already or taken over, by the resume scan or by a redelivered message alike.
    try:
        return await records.owned_by(admitted.notice)
    except Exception as e:  # without the records the notice is still worth running
        logs.event(
            log, "gang records unreadable", logging.WARNING, notice_id=admitted.id, error=str(e)
        )
        return {}


def ack_writes(
    records: GangRecords | None,
    admitted: Admitted,
    gang: Gang,
    recorded: Recorded | None,
    *,
    fence: Callable[[Admitted], Awaitable[None]],
) -> AckWrites:
    """The gang's durable acks written to its record as they come, each write fenced;
    starting from what the record already holds."""

    async def write(acks: tuple[RankAck, ...]) -> None:
        if records is None:
            return
        await fence(admitted)  # a write for the notice, fenced as every step is
        await records.acked(gang, admitted.notice, acks)

    return AckWrites(write, recorded.acks if recorded is not None else ())


def with_recorded(plan: Plan, recorded: Mapping[GangKey, Recorded]) -> Plan:
    """A resumed notice's plan: each gang with every rank it had when owned (the dead owner
    may have evicted some of its pods, or all: such a gang is no longer on the node, but is
    still to charge)."""
    if not recorded:
        return plan
    seen = {g.key for g in plan.gangs}
    gangs = tuple(
        _with_gone(g, recorded[g.key].gang) if g.key in recorded else g for g in plan.gangs
    )
    gangs += tuple(r.gang for key, r in sorted(recorded.items(), key=str) if key not in seen)
    return dataclasses.replace(plan, gangs=gangs)


def _with_gone(live: Gang, owned: Gang) -> Gang:
    """The live gang (its ranks are asked again: they have URLs, the record has none) plus
    the ranks the record has that are gone already (charged from their recorded acks)."""
    here = {m.uid for m in live.members}
    gone = tuple(m for m in owned.members if m.uid not in here)
    return dataclasses.replace(live, members=live.members + gone) if gone else live
