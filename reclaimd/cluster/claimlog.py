"""The claim log: the intake's ``ClaimWriter``, the runbook's ``Progress``, the resume scan.

A notice's claim is written twice: when it is admitted (the claim, and on a node the cordon
and taint, in one write computed from the cache's copy of the node) and when it is done.
In between nothing is recorded: a resumed notice runs its runbook again from the top, and
every step of it is idempotent. The holder's liveness is its Lease (``holders``), not a
heartbeat per claim.

The resume scan finds every open claim this replica may finish, ours from before a restart
or a dead peer's, and hands it back to the intake.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol

from reclaimd import logs
from reclaimd.cluster import claims, claimstore
from reclaimd.intake import Admission, Admitted, Claimed, ClaimLost
from reclaimd.model import Notice, ParseError, Response, utcnow
from reclaimd.settings.policy import PolicySettings

log = logging.getLogger(__name__)


class NodeCopies(Protocol):
    """The cluster cache's nodes (``cacheview.CacheView`` fits)."""

    def node(self, name: str) -> claimstore.NodeSnapshot | None: ...
    def node_claims(self) -> Iterable[tuple[str, str]]: ...


_ADMISSION = {
    claims.ClaimStatus.CLAIMED: Admission.CLAIMED,
    claims.ClaimStatus.ALREADY_OURS: Admission.RESUMED,
    claims.ClaimStatus.TAKEN_OVER: Admission.RESUMED,
    claims.ClaimStatus.DUPLICATE: Admission.DUPLICATE,
    claims.ClaimStatus.SUPERSEDED: Admission.SUPERSEDED,
    claims.ClaimStatus.TARGET_NOT_FOUND: Admission.UNKNOWN_TARGET,
}


def object_for(notice: Notice, node: str | None) -> claims.ClaimTarget:
    w = notice.target.workload
    if w is not None:
        return claims.WorkloadObj(w.namespace, w.name)
    if node is None:
        raise ValueError(f"notice {notice.id}: no node and no workload to claim")
    return claims.NodeObj(node)


class ClaimLog:
    def __init__(
        self,
        store: claimstore.ClaimStore,
        nodes: NodeCopies,
        *,
        unbroken_since: Callable[[datetime], bool] = lambda _: True,
    ) -> None:
        self.store = store
        self.nodes = nodes
        # Our holder Lease fresh, and not lapsed since then (``HolderLeases.unbroken_since``).
        self.unbroken_since = unbroken_since

    async def claim(self, notice: Notice, node: str | None) -> Claimed:
        obj = object_for(notice, node)
        cordon = isinstance(obj, claims.NodeObj) and notice.response is Response.FULL
        seed = self.nodes.node(obj.name) if isinstance(obj, claims.NodeObj) else None
        result = await self.store.claim(obj, notice, cordon=cordon, seed=seed)
        admission = _ADMISSION[result.status]
        ours = admission in (Admission.CLAIMED, Admission.RESUMED)
        previous = result.previous.holder if result.previous is not None else ""
        return Claimed(
            admission,
            on=obj,
            node=node or "",
            cordoned=cordon and ours,
            took_over_from=previous if result.status is claims.ClaimStatus.TAKEN_OVER else "",
        )

    async def done(self, admitted: Admitted, **facts: Any) -> None:
        obj = admitted.claim.on
        if not isinstance(obj, claims.NodeObj | claims.WorkloadObj):
            raise TypeError(f"notice {admitted.id}: not a claim of this log")
        result = await self.store.advance(obj, admitted.id, claims.Phase.DONE, **facts)
        if result.status is claims.AdvanceStatus.LOST:
            raise ClaimLost(f"{obj.describe()} is no longer ours for {admitted.id}")

    async def still_ours(self, admitted: Admitted) -> bool:
        if self.unbroken_since(admitted.admitted_at):
            return True  # nobody may take over a claim whose holder's Lease never lapsed
        obj = admitted.claim.on
        if not isinstance(obj, claims.NodeObj | claims.WorkloadObj):
            return True
        claim = await self.store.get(obj)
        return (
            claim is not None
            and claim.notice_id == admitted.id
            and claim.holder == self.store.holder
        )


@dataclass(frozen=True)
class Resumer:
    """The resume scan: every open claim this holder may finish (ours from before a
    restart, or a dead peer's) goes back to the intake (``resume``)."""

    store: claimstore.ClaimStore
    nodes: NodeCopies
    resume: Callable[[Notice, str | None], Awaitable[Admission]]
    in_flight: Callable[[str], bool]
    renewed: claims.Liveness
    lease_s: float
    alive: Callable[[str], Awaitable[bool]] | None = None  # a fresh read of a holder's Lease
    dead: claims.Death = claims.never_dead  # known dead now: no need to wait out its Lease
    # Set when a peer is found dead (``HolderLeases.deaths``): the scan runs at once.
    wake: asyncio.Event | None = None
    # A claim past its deadline is still finished (its gangs charged) until this long after
    # it, as the intake admits a late message (``policy.expired_after_s``): a holder that
    # stopped or paused across the deadline leaves gangs that nobody else will charge.
    expire_after: timedelta = timedelta(seconds=PolicySettings().expired_after_s)
    # Between scans. The scan reads the cache and two LISTs, so it can run often: a hung
    # peer's claims are taken over this soon after its Lease runs out, not half a Lease later.
    interval_s: float = 3.0

    async def run(self) -> None:
        """Resume at start, then keep looking: a peer that dies mid-storm leaves claims
        whose messages are already acked, and only this scan finds them."""
        while True:
            if self.wake is not None:
                self.wake.clear()  # before the scan: a death during it scans again
            try:
                await self.once()
            except Exception as e:
                logs.event(log, "resume scan failed", logging.WARNING, error=str(e)[:200])
            pause = min(self.interval_s, self.lease_s / 2)
            if self.wake is None:
                await asyncio.sleep(pause)
            else:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.wake.wait(), pause)

    async def once(self) -> int:
        """One scan; the number resumed. Node claims come from the cache, Workload claims
        from a LIST."""
        now = utcnow()
        resumed = 0
        for claim in await self.store.list_open(node_claims=self.nodes.node_claims()):
            if self.in_flight(claim.notice_id):
                continue  # this process is on it: a resume would only write the claim again
            if claim.group and claim.group != self.store.group:
                continue  # another deployment's: its own replicas resume it
            try:
                notice = Notice.from_json(claim.notice)
            except ParseError:
                continue  # written by a newer or broken version: leave it to its holder
            if notice.deadline is not None and notice.deadline + self.expire_after < now:
                continue  # long gone: a node recreated under its name is not drained for it
            if claim.holder != self.store.holder:
                dead = self.dead(claim.holder)
                if not claim.stale(now, self.lease_s, self.renewed(claim.holder), dead):
                    continue
                if not dead and self.alive is not None and await self.alive(claim.holder):
                    continue  # it renewed after all: still its own
            node = claim.target.name if isinstance(claim.target, claims.NodeObj) else None
            if await self.resume(notice, node) is Admission.RESUMED:
                resumed += 1
                logs.event(log, "resuming notice", notice_id=notice.id, phase=claim.phase.value)
        return resumed
