"""Dedupe and durable claim, then tell the transport whether it may ack.

The claim is the first write for a notice (ARCHITECTURE §3), and on a node it is also the
cordon: one PATCH when the notice is admitted. A transport deletes, acks or commits its
message only when ``Admission.ack`` is true: a claim that could not be written (apiserver
down, conflict storm) leaves the message for redelivery, so nothing is lost.

What the runbook needs from the admission travels with it as one ``Admitted`` value: the
notice, the claimed object, when the claim was started and stored, and the receive span.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Protocol

from opentelemetry.trace import SpanContext

from reclaimd import logs
from reclaimd.heldnotices import HeldNotices
from reclaimd.model import Notice, Target, utcnow
from reclaimd.settings.intake import IntakeSettings

log = logging.getLogger(__name__)


class Admission(StrEnum):
    CLAIMED = "claimed"  # ours now: queued for the runbook
    RESUMED = "resumed"  # ours already (a redelivery after our own crash): queued again
    DUPLICATE = "duplicate"  # seen and held, by us or a peer
    SUPERSEDED = "superseded"  # an earlier notice already holds the node
    UNKNOWN_TARGET = "unknown_target"  # not in this cluster; dropped per policy
    EXPIRED = "expired"  # its deadline passed long ago (a replayed backlog): nothing to save
    RETRY = "retry"  # not claimed: leave the message for redelivery

    @property
    def ack(self) -> bool:
        return self is not Admission.RETRY


class ClaimLost(RuntimeError):
    """Another holder or notice owns the claim now: stop acting on this notice."""


@dataclass(frozen=True)
class Claimed:
    """What a claim attempt gave: the admission and, when ours, the object it is on."""

    admission: Admission
    on: object = None  # the claimed object, opaque here (``cluster.claimlog`` knows it)
    node: str = ""  # the doomed node, when the target is one
    cordoned: bool = False  # the claim's write also cordoned and tainted the node
    took_over_from: str = ""  # the holder whose claim this one took over (it stopped renewing)


@dataclass(frozen=True)
class Admitted:
    """A notice that is ours to act on, as the intake hands it to the runbook."""

    notice: Notice
    claim: Claimed
    claim_times: tuple[datetime, datetime] | None = None  # started, stored; None: resumed
    receipt: SpanContext | None = None  # the receive span, to link the notice's trace to
    admitted_at: datetime = field(default_factory=utcnow)  # when this process took it on

    @property
    def id(self) -> str:
        return self.notice.id


class ClaimWriter(Protocol):
    async def claim(self, notice: Notice, node: str | None) -> Claimed:
        """Write the claim for ``notice`` on ``node`` (or its workload)."""
        ...


class TargetResolver(Protocol):
    def resolve_node(self, target: Target) -> str | None: ...


class Intake:
    def __init__(
        self,
        *,
        claims: ClaimWriter,
        resolver: TargetResolver,
        submit: Callable[[Admitted], Awaitable[object]],
        drop_unknown: bool,
        expire_after: timedelta,  # policy.expired_after_s
        on_admission: Callable[[Notice, Admission], SpanContext | None] | None = None,
        settings: IntakeSettings = IntakeSettings(),
        held: HeldNotices | None = None,
    ) -> None:
        """``on_admission`` sees every admission (metrics, the receive span) and may return
        the receive span's context, which the ``Admitted`` carries to the notice's trace."""
        self.claims, self.resolver, self.submit = claims, resolver, submit
        self.drop_unknown = drop_unknown
        self.expire_after = expire_after
        self.on_admission = on_admission
        # Ids claimed by this process: a redelivery costs no apiserver round trip.
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._memory = settings.memory
        self._flights: dict[str, asyncio.Future[Admission]] = {}
        # Notices not claimed yet, on this disk: the next process here admits them at once.
        self.held = held

    async def admit(self, notice: Notice) -> Admission:
        """Admit ``notice``; concurrent deliveries of one notice share one admission."""
        flight = self._flights.get(notice.id)
        if flight is not None:
            return await asyncio.shield(flight)
        flight = asyncio.get_running_loop().create_future()
        self._flights[notice.id] = flight
        if self.held is not None and notice.id not in self._seen:
            self.held.hold(notice)  # before the claim, which may wait on a server out of reach
        try:
            admission = await self._admit_logged(notice)
        except BaseException:
            # A cancelled or failed admission tells the waiters to retry, never to ack.
            flight.set_result(Admission.RETRY)
            raise
        else:
            flight.set_result(admission)
            if self.held is not None and admission.ack:
                self.held.release(notice.id)
            return admission
        finally:
            del self._flights[notice.id]

    def in_flight(self, notice_id: str) -> bool:
        return notice_id in self._flights

    async def resume(self, notice: Notice, node: str | None) -> Admission:
        """Claim again a notice found open in the cluster (ours from before a restart, or a
        dead peer's) and queue it; a live peer's claim stays its own."""
        return await self._claim(notice, node, resumed=True)

    async def _admit_logged(self, notice: Notice) -> Admission:
        admission = await self._admit(notice)
        if admission not in (Admission.CLAIMED, Admission.RESUMED):
            self._observe(notice, admission)
        return admission

    def _observe(self, notice: Notice, admission: Admission) -> SpanContext | None:
        logs.event(
            log,
            "notice admitted",
            notice_id=notice.id,
            source=notice.source,
            kind=notice.kind.value,
            target=notice.target.describe(),
            admission=admission.value,
        )
        if self.on_admission is None:
            return None
        return self.on_admission(notice, admission)

    async def _admit(self, notice: Notice) -> Admission:
        if notice.id in self._seen:
            return Admission.DUPLICATE
        if notice.deadline is not None and notice.deadline + self.expire_after < utcnow():
            # A replayed backlog (new consumer group, outage): the capacity is long gone and
            # a node recreated under the same name must not be drained for it.
            return Admission.EXPIRED
        node: str | None = None
        if notice.target.workload is None:
            node = self.resolver.resolve_node(notice.target)
            if node is None:
                return Admission.UNKNOWN_TARGET if self.drop_unknown else Admission.RETRY
        return await self._claim(notice, node, resumed=False)

    async def _claim(self, notice: Notice, node: str | None, *, resumed: bool) -> Admission:
        started = utcnow()
        try:
            claimed = await self.claims.claim(notice, node)
        except Exception as e:
            # Whatever failed, the message stays with the transport and comes back.
            logs.event(
                log, "claim failed", logging.WARNING, notice_id=notice.id, error=str(e)[:200]
            )
            return Admission.RETRY
        admission = claimed.admission
        if admission is Admission.UNKNOWN_TARGET and not self.drop_unknown:
            return Admission.RETRY
        if admission in (Admission.CLAIMED, Admission.RESUMED):
            stored = utcnow()
            self._remember(notice.id)
            receipt = self._observe(notice, admission) if not resumed else None
            times = None if resumed else (started, stored)
            await self.submit(Admitted(notice, claimed, claim_times=times, receipt=receipt))
        return admission

    def _remember(self, notice_id: str) -> None:
        self._seen[notice_id] = None
        while len(self._seen) > self._memory:
            self._seen.popitem(last=False)
