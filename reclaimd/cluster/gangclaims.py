"""Which notice charges a gang: one Lease per gang, shared by every replica.

A gang with ranks on two doomed nodes gets two notices, and in a storm they may land on two
replicas. The node claims keep each notice single, but only something cluster-wide keeps the
*gang* single: the first notice to create the gang's Lease checkpoints, drains and charges it;
every other notice finds the Lease and leaves the gang alone. Creating is the whole protocol
in the common case (one write per gang): the API server's uniqueness of names is the lock.

The Lease is named for the gang's key and records the member pod uids it was taken for. A
later notice that sees the same gang *with fewer pods* (the owner is already draining it) still
finds one of those uids and leaves it alone. A gang restarted with all-new pods is a new
incarnation: it shares no uid with the Lease, and the first notice for it takes the Lease over
(a write with the resourceVersion it read, so two replicas cannot both win) and charges it.
A resumed notice finds its own id in the Lease and carries on.

The Lease is also the gang's durable record (``gangrecord``): created with the gang as owned
(its pods), and written once more, before the drain, with the durable checkpoints its ranks
acked. A replica that takes the notice over reads them back (``owned_by``): it charges a
gang whose pods the dead owner already evicted, and charges from the checkpoints the ranks
acked, not from older ones.

The Lease also says when the notice was received, and, once the gang came back and its
restart overhead is on the ledger (``restarts``), that it is (``charged``, ``restart_recorded``).

The acks are also kept in memory here, before the write (``held``): a replica cut off from the
API server cannot write them, and its peer, taking the notice over once its Lease runs out,
asks it for them through the peer probe port (``probe.ask``) as it reads the Leases.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from reclaimd import checkpoint, logs, tracing
from reclaimd.cluster import apiserver, errors, gangrecord, leases, objects
from reclaimd.cluster.apiserver import ApiServer
from reclaimd.cluster.claims import claim_order
from reclaimd.cluster.ratelimit import RateLimiter
from reclaimd.model import (
    Gang,
    GangKey,
    Notice,
    ParseError,
    RankAck,
    Recorded,
    parse_time,
    rfc3339,
    utcnow,
)

log = logging.getLogger(__name__)

NOTICE_ANNOTATION = "reclaimd.io/notice-id"
GANG_ANNOTATION = "reclaimd.io/gang"
PODS_ANNOTATION = "reclaimd.io/pod-uids"
RECORD_ANNOTATION = "reclaimd.io/gang-record"
ACKS_ANNOTATION = "reclaimd.io/acks"
TRACE_ANNOTATION = "reclaimd.io/traceparent"
RECEIVED_ANNOTATION = "reclaimd.io/notice-received-at"
# Set once the gang's restart overhead is on the ledger (``restarts``): the event's id.
RESTART_ANNOTATION = "reclaimd.io/restart-recorded"
NOTICE_LABEL = "reclaimd.io/notice"  # a digest of the notice id: a successor LISTs by it
# Set with RESTART_ANNOTATION: the restart watcher LISTs only the Leases without it.
RESTARTED_LABEL = "reclaimd.io/restarted"
# The acks are worth a bounded wait only: the drain must not stall on a slow API server.
ACKS_WRITE_S = 10.0
# A gang Lease outlives every notice of its incarnation (they come within one window) and
# every takeover of them; then it is deleted, or a busy cluster keeps one per gang forever.
KEEP_S = 6 * 3600.0
SWEEP_EVERY_S = 600.0
# The LISTs of every gang Lease (the sweep, the restart watcher's look) wait at most this long
# for a storm's intake to be over (``RateLimiter.quiet``): the restart watcher's interval.
QUIET_WAIT_S = 15.0
LIST_PAGE = 250  # gang Leases per page of those LISTs
HELD_NOTICES = 4096  # the acks kept in memory for a peer to ask: the latest notices'

# holder, notice label -> {gang lease name: acks json} (``probe.ask`` bound to an address)
PeerAcks = Callable[[str, str], Awaitable[Mapping[str, str]]]


@dataclass(frozen=True)
class Charged:
    """A gang as the notice that charged it recorded it: what its restart is measured from."""

    lease: str
    version: str  # the Lease's resourceVersion when read
    holder: str  # the replica that charged it
    notice_id: str
    received_at: datetime  # the notice's receipt
    key: GangKey
    uids: frozenset[str]  # the pods of the incarnation the notice stopped


def gang_key_of(text: str) -> GangKey | None:
    """``GangKey``'s ``str`` read back (``kind:namespace/name``); None if it is not one."""
    kind, _, rest = text.partition(":")
    namespace, _, name = rest.partition("/")
    return GangKey(kind, namespace, name) if kind and namespace and name else None


def notice_label(notice_id: str) -> str:
    return hashlib.sha256(notice_id.encode("utf-8", "surrogatepass")).hexdigest()[:40]


def lease_name(gang: Gang) -> str:
    digest = hashlib.sha256(str(gang.key).encode()).hexdigest()[:32]
    return f"gang-{digest}"


def _uids(gang: Gang) -> set[str]:
    return {m.uid for m in gang.members if m.uid}


class GangClaims:
    def __init__(
        self,
        api: ApiServer,
        namespace: str,
        holder: str,
        *,
        limiter: RateLimiter,
        peer_acks: PeerAcks | None = None,
    ) -> None:
        self._api = api
        self.namespace = namespace
        self.holder = holder
        self._limiter = limiter
        self._peer_acks = peer_acks
        self._held: OrderedDict[str, dict[str, str]] = OrderedDict()

    def held(self, label: str) -> dict[str, str]:
        """The acks this process saw for the notice labelled ``label``, by gang Lease name."""
        return dict(self._held.get(label, {}))

    def _hold(self, notice: Notice, name: str, acks_json: str) -> None:
        label = notice_label(notice.id)
        self._held.setdefault(label, {})[name] = acks_json
        self._held.move_to_end(label)
        while len(self._held) > HELD_NOTICES:
            self._held.popitem(last=False)

    async def acquire(self, gang: Gang, notice: Notice) -> bool:
        """True when ``notice`` charges ``gang`` (it holds the Lease, now or before)."""
        name = lease_name(gang)
        body = self._body(name, gang, notice)
        # Every rank's checkpoint request waits for this write: it goes with the claims,
        # before the storm's evictions, and is retried until the notice's deadline.
        order = claim_order(notice)
        try:
            await self._limiter.call(
                f"create lease/{name}",
                order,
                lambda: self._api.post(apiserver.lease(self.namespace), body),
                retry_until=notice.deadline,
            )
            return True
        except errors.Conflict:
            pass

        async def change(lease: objects.Obj) -> bool:
            notes = objects.annotations(lease)
            owner = notes.get(NOTICE_ANNOTATION, "")
            if owner == notice.id:
                return True
            taken_for = set(filter(None, notes.get(PODS_ANNOTATION, "").split(",")))
            if not taken_for or taken_for & _uids(gang):
                log.info("gang %s is charged by notice %s, not %s", gang.key, owner, notice.id)
                return False
            # A new incarnation of the gang: take the Lease over, if nobody wrote it since.
            body["metadata"]["resourceVersion"] = objects.version(lease)
            body["metadata"]["annotations"][ACKS_ANNOTATION] = ""  # the old pods' acks
            # the old incarnation's restart mark: this one's restart is not measured yet
            body["metadata"]["labels"] = {**body["metadata"]["labels"], RESTARTED_LABEL: None}
            await self._limiter.call(
                f"take over lease/{name}",
                order,
                lambda: self._api.patch(apiserver.lease(self.namespace, name), body),
                retry_until=notice.deadline,
            )
            return True

        # ``order`` is when the notice was issued (past): it sorts; the deadline bounds.
        return await self._limiter.update(
            f"lease/{name}",
            order,
            lambda: self._api.get(apiserver.lease(self.namespace, name)),
            change,
            conflicts=5,
            retry_until=notice.deadline,
        )

    async def acked(self, gang: Gang, notice: Notice, acks: tuple[RankAck, ...]) -> None:
        """Record the durable checkpoints ``gang``'s ranks acked, before the drain depends on
        them. Nothing durable, nothing written. A failure is logged, never raised: the drain
        matters more than the record."""
        if not checkpoint.durable(acks):
            return
        name = lease_name(gang)
        recorded = gangrecord.acks_json(acks)
        self._hold(notice, name, recorded)  # first: a peer may ask for them if this write fails
        body = {"metadata": {"annotations": {ACKS_ANNOTATION: recorded}}}
        try:
            # The drain waits for this write: it sorts with the claims, ahead of evictions.
            await self._limiter.call(
                f"record acks lease/{name}",
                claim_order(notice),
                lambda: self._api.patch(apiserver.lease(self.namespace, name), body),
                retry_until=utcnow() + timedelta(seconds=ACKS_WRITE_S),
            )
        except errors.KubeError as e:
            logs.event(
                log, "acks not recorded", logging.WARNING, gang=str(gang.key), error=str(e)[:200]
            )

    async def owned_by(self, notice: Notice) -> dict[GangKey, Recorded]:
        """Every gang ``notice`` owns, as its Leases recorded them (a taken-over notice)."""
        found = await self._limiter.read(
            f"list leases of notice {notice.id}",
            notice.deadline,
            lambda: self._api.get(
                apiserver.lease(self.namespace),
                labelSelector=f"{NOTICE_LABEL}={notice_label(notice.id)}",
            ),
        )
        mine = [
            lease
            for lease in objects.items(found)
            if objects.annotations(lease).get(NOTICE_ANNOTATION) == notice.id
            and objects.annotations(lease).get(RECORD_ANNOTATION)
        ]
        told = await self._told(notice, mine)
        out: dict[GangKey, Recorded] = {}
        for lease in mine:
            notes, name = objects.annotations(lease), objects.name(lease)
            try:
                gang = gangrecord.gang_from_json(notes[RECORD_ANNOTATION])
                acks = gangrecord.acks_from_json(notes.get(ACKS_ANNOTATION, ""), gang)
                if name in told:
                    said = gangrecord.acks_from_json(told[name], gang)
                    acks = checkpoint.merge_acks(said, acks)
            except ParseError as e:
                log.warning("lease %s: %s", name, e)
                continue
            out[gang.key] = Recorded(gang, acks, notes.get(TRACE_ANNOTATION, ""))
        return out

    async def _told(self, notice: Notice, found: list[objects.Obj]) -> dict[str, str]:
        """The acks the gangs' other holders still have in memory (one ask each, at once):
        those they could not write. Empty from a holder that does not answer."""
        if self._peer_acks is None:
            return {}
        label = notice_label(notice.id)
        others = {
            str(h)
            for lease in found
            if (h := objects.spec(lease).get("holderIdentity")) not in (None, self.holder)
        }
        answers = await asyncio.gather(*(self._peer_acks(h, label) for h in sorted(others)))
        told: dict[str, str] = {}
        for said in answers:
            told.update(said)
        return told

    async def sweep(self, keep_s: float = KEEP_S) -> int:
        """Delete the gang Leases acquired more than ``keep_s`` ago; how many went."""
        await self._limiter.quiet(QUIET_WAIT_S)  # every gang Lease of KEEP_S: after the intake
        found = await self._list_pages(NOTICE_LABEL)
        cutoff = utcnow() - timedelta(seconds=keep_s)
        deleted = 0
        for lease in found:
            acquired = objects.time(objects.spec(lease).get("acquireTime"))
            if acquired is None or acquired > cutoff:
                continue
            # The version it was read at: a Lease taken over since (a new incarnation) stays.
            if await leases.delete_unchanged(self._api, self._limiter, self.namespace, lease):
                deleted += 1
        return deleted

    async def run_sweeps(self, every_s: float = SWEEP_EVERY_S) -> None:
        """Sweep now and then, until cancelled; a failed sweep waits for the next."""
        while True:
            try:
                gone = await self.sweep()
                if gone:
                    logs.event(log, "gang leases swept", deleted=gone)
            except errors.KubeError as e:
                logs.event(log, "gang lease sweep failed", logging.WARNING, error=str(e)[:200])
            await asyncio.sleep(every_s)

    async def _list_pages(self, selector: str) -> list[objects.Obj]:
        """The gang Leases ``selector`` picks, ``LIST_PAGE`` at a time (one consistent list,
        continued): each page is decoded on its own, so the loop serves the intake in between
        instead of stalling on one answer of megabytes."""
        out: list[objects.Obj] = []
        token = ""
        while True:
            params: dict[str, Any] = {"labelSelector": selector, "limit": LIST_PAGE}
            if token:
                params["continue"] = token
            page = await self._limiter.read("list gang leases", None, partial(self._page, params))
            out.extend(objects.items(page))
            token = str((page.get("metadata") or {}).get("continue") or "")
            if not token:
                return out

    async def _page(self, params: dict[str, Any]) -> objects.Obj:
        return await self._api.get(apiserver.lease(self.namespace), **params)

    async def charged(self) -> list[Charged]:
        """Every gang a notice charged whose restart is not on the ledger yet (a storm
        leaves hundreds of Leases for hours)."""
        selector = f"{NOTICE_LABEL},!{RESTARTED_LABEL}"
        # Hundreds of Leases (thousands after a day of storms): megabytes the API server
        # encodes and this loop decodes while a storm's cordons wait, so after the intake.
        await self._limiter.quiet(QUIET_WAIT_S)
        found = await self._list_pages(selector)
        out = []
        for lease in found:
            meta, spec = lease.get("metadata") or {}, lease.get("spec") or {}
            notes = meta.get("annotations") or {}
            uids = frozenset(filter(None, str(notes.get(PODS_ANNOTATION, "")).split(",")))
            key = gang_key_of(str(notes.get(GANG_ANNOTATION, "")))
            if notes.get(RESTART_ANNOTATION) or not notes.get(RECORD_ANNOTATION) or not uids:
                continue
            try:
                # a Lease written before the annotation: created as the notice was handled
                at = parse_time(str(notes.get(RECEIVED_ANNOTATION) or spec.get("acquireTime")))
            except ParseError:
                continue
            if key is not None:
                out.append(
                    Charged(
                        lease=str(meta.get("name")),
                        version=str(meta.get("resourceVersion")),
                        holder=str(spec.get("holderIdentity") or ""),
                        notice_id=str(notes.get(NOTICE_ANNOTATION, "")),
                        received_at=at,
                        key=key,
                        uids=uids,
                    )
                )
        return out

    async def restart_recorded(self, c: Charged, event_id: str) -> bool:
        """Mark ``c``'s Lease: its restart is on the ledger. False when the Lease changed since
        it was read (taken over by a new incarnation's notice, whose restart is its own)."""
        body = {
            "metadata": {
                "resourceVersion": c.version,
                "labels": {RESTARTED_LABEL: "true"},
                "annotations": {RESTART_ANNOTATION: event_id},
            }
        }
        try:
            await self._limiter.call(
                f"restart recorded lease/{c.lease}",
                None,
                lambda: self._api.patch(apiserver.lease(self.namespace, c.lease), body),
            )
        except (errors.Conflict, errors.NotFound):
            return False
        return True

    def _body(self, name: str, gang: Gang, notice: Notice) -> dict[str, Any]:
        return {
            "metadata": {
                "name": name,
                "labels": {NOTICE_LABEL: notice_label(notice.id)},
                "annotations": {
                    NOTICE_ANNOTATION: notice.id,
                    GANG_ANNOTATION: str(gang.key),
                    PODS_ANNOTATION: ",".join(sorted(_uids(gang))),
                    RECORD_ANNOTATION: gangrecord.gang_json(gang),
                    TRACE_ANNOTATION: tracing.current_traceparent(),
                    RECEIVED_ANNOTATION: rfc3339(notice.received_at),
                    RESTART_ANNOTATION: "",  # a new incarnation's restart is not measured yet
                },
            },
            "spec": {"holderIdentity": self.holder[:128], "acquireTime": rfc3339(utcnow())},
        }
