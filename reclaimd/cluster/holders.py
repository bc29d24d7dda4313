"""Which replicas are alive: one Lease per holder, renewed while the process runs.

A claim names its holder. Rather than each claim heartbeating on its own (at 350 notices in
flight that alone exceeds a write budget), each replica renews one Lease,
``reclaimd-holder-<digest>`` in reclaimd's namespace, every ``renew_every_s``; a replica's
claims are live while its Lease is. ``renewed(holder)`` answers from the last LIST of those
Leases (every ``refresh_every_s``), so a claim decision costs no request. A process whose
loop hangs stops renewing and, ``lease_s`` later, its claims can be taken over.

Faster than the Lease: each Lease also names its holder's probe address (``probe``), and every
replica probes its peers' every ``probe_every_s``. A refused connection is a dead process now:
``dead(holder)`` turns true and ``deaths`` wakes the resume scan, so a SIGKILLed peer's claims
are taken over within a second or two, not ``lease_s`` later. A stopping replica ``release``s
its Lease (renewed "long ago") once it has stopped acting, and closes its probe port.

Silent: a peer whose probes go unanswered (not refused: a SIGSTOP, a dead node, a dropped
network) for ``silent_after_s`` and whose Lease, renewed every ``renew_every_s``, has not been
renewed for as long (read afresh) is presumed dead too. Its own side agrees: ``fresh`` holds for
``cut_after_s`` (at most ``silent_after_s``) after its last renewal, so a replica that wakes
after such a silence reads every claim before acting and finds the ones taken over. A peer we
cannot reach but that renews is alive (a partition between the replicas only).

Cut off: a replica that has not renewed its own Lease for ``cut_after_s`` cannot reach the API
server. It says so to a peer that probes it (``cut_off``), and the peer takes its claims over at
once; from that moment on the cut-off replica's fences read the claim before it acts (``fresh``,
and a renewal after such a gap marks the Lease lapsed), so the two never both act on a claim:
the self-report is the fence.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from reclaimd import logs
from reclaimd.cluster import apiserver, errors, leases, objects, probe, ratelimit
from reclaimd.cluster.apiserver import ApiServer
from reclaimd.cluster.ratelimit import RateLimiter
from reclaimd.model import rfc3339, utcnow
from reclaimd.settings.peers import PeerProbeSettings

log = logging.getLogger(__name__)

_PROBE = PeerProbeSettings()
HOLDER_LABEL = "reclaimd.io/holder-lease"
# A holder Lease not renewed for this long belongs to a replica that is gone: it is deleted.
GONE_AFTER_S = 3600.0
FIRST = ratelimit.FIRST  # sorts before any notice's deadline in the budget
# Of the Lease: at most this long without a renewal before a replica says it is cut off.
CUT_FRACTION = 0.6
HOLDER_ANNOTATION = "reclaimd.io/holder"
PROBE_ANNOTATION = "reclaimd.io/probe"  # host:port: refused there = this holder is dead
GROUP_ANNOTATION = "reclaimd.io/peer-group"  # the replicas that take each other's claims
# host:port of the replica's /metrics (its metrics_port, at the host peers dial): what
# ``reclaimd status`` scrapes. Not the probe's address: that port answers the probe only.
METRICS_ANNOTATION = "reclaimd.io/metrics"


def lease_name(holder: str) -> str:
    # Holder names (pod names, hostnames) need not be valid object names: hash them.
    return "reclaimd-holder-" + hashlib.sha256(holder.encode()).hexdigest()[:24]


@dataclass(frozen=True)
class HolderLease:
    """One replica's holder Lease, as read (``read``): what a viewer shows of it."""

    holder: str
    renewed: datetime  # FIRST or earlier: released
    probe: str  # host:port of its probe port; "" = none
    metrics: str  # host:port of its /metrics; "" = not served, or an older replica
    group: str
    released_at: datetime | None  # when it said it was gone (``release``)
    # its holder's silent_after_s: unrenewed this long (and silent to its peers' probes) it is
    # presumed gone, and its claims are taken over
    duration_s: float

    @property
    def released(self) -> bool:
        return self.renewed <= FIRST

    def alive(self, now: datetime) -> bool:
        """Renewed within its duration and not released: what a peer's claim decision trusts."""
        return not self.released and now - self.renewed <= timedelta(seconds=self.duration_s)


def read(lease: objects.Obj) -> HolderLease | None:
    """A holder Lease's facts; None when it names no holder or renewal (not one of ours)."""
    notes = objects.annotations(lease)
    holder = notes.get(HOLDER_ANNOTATION)
    at = objects.time(objects.spec(lease).get("renewTime"))
    if not holder or at is None:
        return None
    return HolderLease(
        holder=holder,
        renewed=at,
        probe=notes.get(PROBE_ANNOTATION, ""),
        metrics=notes.get(METRICS_ANNOTATION, ""),
        group=notes.get(GROUP_ANNOTATION, ""),
        released_at=_released_at(lease) if at <= FIRST else None,
        duration_s=float(objects.spec(lease).get("leaseDurationSeconds") or 0),
    )


def host_port(host: str, port: int) -> str:
    """``host:port`` as a peer dials it (an IPv6 host in brackets)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class HolderLeases:
    def __init__(
        self,
        api: ApiServer,
        namespace: str,
        holder: str,
        *,
        lease_s: float,
        limiter: RateLimiter,
        probe_address: Callable[[], str] = str,
        metrics_address: Callable[[], str] = str,
        probe_every_s: float = _PROBE.every_s,
        probe_timeout_s: float = _PROBE.timeout_s,
        renew_every_s: float = _PROBE.renew_every_s,
        silent_after_s: float = _PROBE.silent_after_s,
        group: str = "",
    ) -> None:
        self._api = api
        self.namespace, self.holder, self.lease_s = namespace, holder, lease_s
        # Never longer than a peer waits on our silence: by the time it may take our claims
        # over, we read every claim before acting on it.
        self.silent_after_s = silent_after_s
        self.cut_after_s = min(lease_s * CUT_FRACTION, silent_after_s)
        self.renew_every_s = min(renew_every_s, lease_s / 3)
        self.refresh_every_s = min(2 * self.renew_every_s, lease_s / 3)
        self._limiter = limiter
        self._probe_address = probe_address  # ours, as peers should dial it ("" = none)
        self._metrics_address = metrics_address  # our /metrics, for ``reclaimd status``
        self._probe_every_s, self._probe_timeout_s = probe_every_s, probe_timeout_s
        self._seen: dict[str, datetime] = {}
        self.group = group
        self._addresses: dict[str, str] = {}  # peers' probe addresses, from their Leases
        self._peers: set[str] = set()  # holders of our group, from their Leases
        self._dead: dict[str, datetime] = {}  # holder -> its last renewal seen when it died
        self._silent: dict[str, datetime] = {}  # holder -> when its probes stopped answering
        self.deaths = asyncio.Event()  # set when a peer is found dead
        self.renewed_at: datetime | None = None  # our own last successful renewal
        self.lapsed_at: datetime | None = None  # the last renewal after a gap past the Lease
        self._sweeping: asyncio.Task[None] | None = None

    def renewed(self, holder: str) -> datetime | None:
        """The last renewal seen of ``holder``'s Lease (ours: the last one we made)."""
        if holder == self.holder:
            return self.renewed_at
        return self._seen.get(holder)

    def address(self, holder: str) -> str:
        """``holder``'s probe address as its Lease last named it ("" = none known)."""
        return self._addresses.get(holder, "")

    def dead(self, holder: str) -> bool:
        """``holder`` refused our probe, or said it is cut off, since its last renewal: it no
        longer acts on its claims, whatever its Lease says."""
        return holder != self.holder and holder in self._dead

    def peer_alive(self) -> bool:
        """A replica of our group renewed within the Lease and is not known dead: one that
        can take our claims over now (as of the last LIST)."""
        now = utcnow()
        return any(
            h != self.holder
            and not self.dead(h)
            and now - self._seen[h] <= timedelta(seconds=self.lease_s)
            for h in self._peers
            if h in self._seen
        )

    def fresh(self) -> bool:
        """Our Lease was renewed within ``cut_after_s``: no peer may take our claims over
        (past it we say we are cut off, and a peer may)."""
        last = self.renewed_at
        return last is not None and utcnow() - last <= timedelta(seconds=self.cut_after_s)

    def cut_off(self) -> bool:
        """No renewal of our Lease landed for ``cut_after_s``, and no answer of any kind from
        the API server for as long: we cannot reach it (what the probe port answers to
        ``GET /reach``). A storm's API server answers late but answers: renewals queued
        behind its load are no partition, and a peer must not take live claims over for them.
        Before the first renewal: no."""
        if self.renewed_at is None or self.fresh():
            return False
        answered = self._api.answered_at
        return answered is None or time.monotonic() - answered > self.cut_after_s

    def unbroken_since(self, since: datetime) -> bool:
        """Fresh now, and never lapsed since ``since``: no peer can have taken over a claim
        we made then. (An API server down longer than the Lease lapses it for everyone: a
        peer may have taken our claims over before we renewed again.)"""
        return self.fresh() and (self.lapsed_at is None or self.lapsed_at < since)

    async def run(self) -> None:
        """Renew our Lease every ``renew_every_s`` and refresh the others' every
        ``refresh_every_s``, until cancelled. Apart: a slow LIST in a storm must not delay a
        renewal past ``cut_after_s``, or this replica would call itself cut off."""
        await self.renew_or_log()
        await asyncio.gather(
            self._every(self.renew_or_log, self.renew_every_s, first=False),
            # The peers, from the start, and often: a peer is probed only once a LIST named
            # its address, and one started with us (or a successor) would otherwise go
            # unprobed, its silence unheard, for a third of the Lease.
            self._every(self._refresh_or_log, self.refresh_every_s, first=True),
        )

    @staticmethod
    async def _every(step: Callable[[], Awaitable[None]], period: float, *, first: bool) -> None:
        if first:
            await step()
        while True:
            await asyncio.sleep(period)
            await step()

    async def renew_or_log(self) -> None:
        try:
            await self.renew()
        except errors.KubeError as e:
            # Keep trying: our claims survive a missed renewal or two (cut_after_s).
            log.warning("holder lease: %s", e)

    async def _refresh_or_log(self) -> None:
        try:
            await self.refresh()
        except errors.KubeError as e:
            log.warning("holder leases: %s", e)

    async def renew(self) -> None:
        now = utcnow()
        name = lease_name(self.holder)
        notes = {
            HOLDER_ANNOTATION: self.holder,
            PROBE_ANNOTATION: self._probe_address(),
            GROUP_ANNOTATION: self.group,
            METRICS_ANNOTATION: self._metrics_address(),
        }
        body: dict[str, Any] = {
            "metadata": {
                "name": name,
                "labels": {HOLDER_LABEL: "true"},
                "annotations": notes,
            },
            "spec": {
                "holderIdentity": self.holder[:128],
                # What a peer waits on our silence: the cluster's view of us says the same.
                "leaseDurationSeconds": max(1, math.ceil(self.silent_after_s)),
                "renewTime": _micro(now),
            },
        }
        # Served before every other write, whatever their deadlines (in a storm the queue
        # fills with writes whose deadlines are seconds away or past): a late renewal lets a
        # peer take over claims this replica is still acting on, and both would charge.
        until = now + timedelta(seconds=self.renew_every_s)
        try:
            await self._limiter.call(
                f"renew lease/{name}",
                FIRST,
                lambda: self._api.patch(apiserver.lease(self.namespace, name), body),
                retry_until=until,
            )
        except errors.NotFound:
            await self._limiter.call(
                f"create lease/{name}",
                FIRST,
                lambda: self._api.post(apiserver.lease(self.namespace), body),
                retry_until=until,
            )
        done = utcnow()
        # Renewed again after a gap in which we said we were cut off, or the Lease ran out: a
        # peer may have taken our claims over. From when it landed, not when it was sent (a
        # request held by a partition lands late).
        if self.renewed_at is not None and done - self.renewed_at > timedelta(
            seconds=self.cut_after_s
        ):
            self.lapsed_at = done
        self.renewed_at = now

    async def alive(self, holder: str) -> bool:
        """Read ``holder``'s Lease now: the last word before taking its claims over (the LIST
        behind ``renewed`` may be seconds old, and a busy peer renews late but renews)."""
        if holder == self.holder:
            return True
        if self.dead(holder):
            return False
        at = await self._read_renewal(holder, self.lease_s / 2)
        return utcnow() - at <= timedelta(seconds=self.lease_s)

    async def refresh(self) -> None:
        listed = await self._limiter.read(
            "list holder leases",
            None,
            lambda: self._api.get(
                apiserver.lease(self.namespace), labelSelector=f"{HOLDER_LABEL}=true"
            ),
            retry_until=utcnow() + timedelta(seconds=self.lease_s / 2),
        )
        seen: dict[str, datetime] = {}
        addresses: dict[str, str] = {}
        peers: set[str] = set()
        gone_before = utcnow() - timedelta(seconds=GONE_AFTER_S)
        gone: list[objects.Obj] = []
        for lease in objects.items(listed):
            h = read(lease)
            if h is None:
                continue
            holder, at = h.holder, h.renewed
            if h.released and holder != self.holder and holder not in self._dead:
                # Released (``release``): it said it no longer acts, so no Lease need run
                # out, even for a replica that never saw it alive (a rolling upgrade's successor).
                self._dead[holder] = at
                self.deaths.set()
            # A released Lease is kept as long as any other (from its release, in
            # acquireTime): a successor that starts later still learns from it.
            since = h.released_at if h.released_at is not None else at
            if since < gone_before and holder != self.holder:
                gone.append(lease)
                continue
            seen[holder] = at
            if h.group == self.group:
                peers.add(holder)
            if h.probe and holder != self.holder:
                addresses[holder] = h.probe
            if holder in self._dead and at > self._dead[holder]:
                del self._dead[holder]  # renewed since it refused: back (a restart, same name)
        self._seen, self._addresses, self._peers = seen, addresses, peers
        if gone and (self._sweeping is None or self._sweeping.done()):
            # Off the renewal loop: the deletes are last in the write budget, and in a storm
            # a renewal waiting behind them would let peers take every live claim over.
            self._sweeping = asyncio.create_task(self._forget_all(gone), name="holder-sweep")

    async def run_probes(self) -> None:
        """Probe every peer with a fresh Lease, every ``probe_every_s``, until cancelled; the
        ones presumed dead too (one that answers again and renewed since is back at once)."""
        while True:
            now = utcnow()
            peers = {
                h: a
                for h, a in self._addresses.items()
                if now - self._seen.get(h, FIRST) <= timedelta(seconds=self.lease_s)
            }
            await self._probe(peers)
            await asyncio.sleep(self._probe_every_s)

    async def peer_alive_now(self) -> bool:
        """``peer_alive`` after one more probe of each peer: a stopping replica hands its
        claims and its ranks' answers over only to a peer alive now, not one that died since
        the last round (it would leave them to a successor that cannot learn them)."""
        await self._probe(
            {h: a for h, a in self._addresses.items() if h in self._peers and not self.dead(h)}
        )
        return self.peer_alive()

    async def _probe(self, peers: dict[str, str]) -> None:
        verdicts = await asyncio.gather(
            *(probe.probe(a, self._probe_timeout_s) for a in peers.values())
        )
        now = utcnow()
        for holder, verdict in zip(peers, verdicts, strict=True):
            if holder in self._dead:
                if verdict is probe.Verdict.ALIVE and await self._back(holder):
                    # Renewed since we presumed it dead: it knows its Lease lapsed and reads
                    # every older claim before acting. Not back, its fresh claims (a write
                    # a partition held) would be taken over until our next LIST.
                    del self._dead[holder]
                    logs.event(log, "peer back", holder=holder, address=peers[holder])
                continue
            if verdict is probe.Verdict.ALIVE:
                self._silent.pop(holder, None)
                continue
            if verdict is probe.Verdict.SILENT:
                since = self._silent.setdefault(holder, now)
                if now - since < timedelta(seconds=self.silent_after_s):
                    continue
                renewed = await self._renewed_now(holder)
                if renewed is None or now - renewed < timedelta(seconds=self.silent_after_s):
                    self._silent[holder] = now  # it renews (or who knows): only out of reach
                    continue
            # Dead as of now: only a renewal made after this brings it back (a LIST that shows
            # a renewal from before its death, newer than the last LIST, must not).
            self._dead[holder] = now
            self._silent.pop(holder, None)
            what = {
                probe.Verdict.DEAD: "peer found dead",
                probe.Verdict.CUT: "peer cut off",
            }.get(verdict, "peer silent")
            logs.event(log, what, holder=holder, address=peers[holder])
            self.deaths.set()

    async def _back(self, holder: str) -> bool:
        """``holder``'s Lease, read now, renewed after we presumed it dead."""
        renewed = await self._renewed_now(holder)
        return renewed is not None and renewed > self._dead.get(holder, FIRST)

    async def _renewed_now(self, holder: str) -> datetime | None:
        """``holder``'s last renewal, its Lease read now (``FIRST`` when gone or released);
        None when the API server does not answer."""
        try:
            return await self._read_renewal(holder, self.silent_after_s)
        except errors.KubeError as e:
            log.info("holder lease of %s not read: %s", holder, e)
            return None

    async def _read_renewal(self, holder: str, retry_s: float) -> datetime:
        """``holder``'s last renewal, its Lease read now, retried for ``retry_s``; ``FIRST``
        when it has none or no Lease."""
        name = lease_name(holder)
        try:
            lease = await self._limiter.read(
                f"read lease/{name}",
                None,
                lambda: self._api.get(apiserver.lease(self.namespace, name)),
                retry_until=utcnow() + timedelta(seconds=retry_s),
            )
        except errors.NotFound:
            return FIRST
        at = objects.time(objects.spec(lease).get("renewTime"))
        if at is None:
            return FIRST
        self._seen[holder] = at
        return at

    async def release(self) -> None:
        """Say we are gone (renewed "long ago"): a stopping replica, once it no longer acts on
        any claim. Peers that cannot probe us see it at their next LIST or read."""
        name = lease_name(self.holder)
        body = {
            "spec": {
                "renewTime": _micro(FIRST),
                "leaseDurationSeconds": 1,
                "acquireTime": _micro(utcnow()),  # when it was released: kept an hour
            }
        }
        self.renewed_at = None
        await self._limiter.call(
            f"release lease/{name}",
            FIRST,
            lambda: self._api.patch(apiserver.lease(self.namespace, name), body),
            retry_until=utcnow() + timedelta(seconds=2),
        )

    async def _forget_all(self, leases: list[objects.Obj]) -> None:
        for lease in leases:
            await self._forget(lease)

    async def _forget(self, lease: objects.Obj) -> None:
        """Delete the Lease of a replica gone for good (a pod name of an old rollout): one
        per replica ever run would pile up. Its claims are long taken over (no Lease reads as
        not alive); the version read is a precondition, so a holder back since keeps it."""
        try:
            await leases.delete_unchanged(self._api, self._limiter, self.namespace, lease)
        except errors.KubeError as e:
            log.info("holder lease %s not deleted: %s", objects.name(lease), e)


def _released_at(lease: objects.Obj) -> datetime:
    return objects.time(objects.spec(lease).get("acquireTime")) or FIRST


def _micro(t: datetime) -> str:
    """MicroTime, as Lease.spec.renewTime wants it."""
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ") if t.tzinfo else rfc3339(t)
