"""Pub/Sub slots: each replica consumes a subscription of its own, held by a Lease.

With one subscription shared by every replica, a message leased to a replica that dies
(SIGKILL, a lost node) reaches a peer only when that lease runs out: 10 s against the real
service, 20-40 s on the emulator, either a large part of GCE's 30 s window. With a slot per
replica, every subscription on the sink's topic carries its own copy of each LogEntry: each
replica admits its copy, the durable claim decides which one acts (the other's is a
duplicate, acked), and a replica's death needs no transport failover at all.

A Deployment's pod names are random, so the subscriptions are named by *slot*, 0 .. N-1
(``PubSubSettings.slot_subscription``), and a replica takes a free slot by holding its Lease,
``reclaimd-pubsub-slot-<the slot's subscription id>`` in reclaimd's namespace (a digest when
the id is not a valid object name). The Lease is named for the subscription it guards, so two
deployments with subscriptions of their own never share slots. A slot is free when its Lease
does not exist, was released, expired (not renewed for ``lease_s``), or names a holder the
peer probe found dead (``holders.HolderLeases.dead``). Taking a Lease over is a write with the
resourceVersion read, so two replicas cannot both win it; the holder renews it every
``lease_s / 3`` with the version it last wrote, and stops consuming when it cannot (a peer
took it, or no renewal landed for ``lease_s``). A replica with no free slot (a surge pod of a
rolling upgrade) waits, and takes the first slot released or expired. A stopping replica
releases its slot after its transport handed back its unsettled messages (the Pub/Sub source
nacks them when cancelled).

Two replicas on one slot for a moment (a partition healed) are harmless: that is the shared
subscription of one slot. A slot nobody holds loses nothing either: its subscription keeps
its messages (retention) and the other slots carry the same notices.

A replica holding a slot also *minds* every slot that is free, without taking its Lease: it
consumes that subscription too, once it has been free for ``MIND_AFTER_S``, until a live
replica holds the slot again. Else a copy sits
unread there while the only live copy is leased to a dead stream: a replica restarted on its
own slot after a SIGKILL, its peer stopped for good, got its notice only when the emulator's
lease sweep let it go (20 s measured after a kill, 10 s after the seek; 67 s once in CI,
where the GCE window is 30 s), though the released slot held an unleased copy all along.
A guest does not seek the slot back (other replicas may be minding it too), and one that
fails is logged and minded again later: it never takes the replica's own consumer down.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import re
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from reclaimd import logs
from reclaimd.backoff import Backoff
from reclaimd.cluster import apiserver, errors, objects, ratelimit
from reclaimd.cluster.apiserver import ApiServer
from reclaimd.cluster.ratelimit import RateLimiter
from reclaimd.model import utcnow

log = logging.getLogger(__name__)

PREFIX = "reclaimd-pubsub-slot-"
SLOT_LABEL = "reclaimd.io/pubsub-slot"
HOLDER_ANNOTATION = "reclaimd.io/holder"
SUBSCRIPTION_ANNOTATION = "reclaimd.io/subscription"
# A released Lease is renewed "long ago" (as a released holder Lease is).
RELEASED = datetime(1970, 1, 2, tzinfo=UTC)
FIRST = ratelimit.FIRST  # sorts before any deadline in the write budget: renewals go first
WAIT_BASE_S, WAIT_CAP_S = 0.5, 2.0  # a replica with no slot (or an API error) looks again
RELEASE_S = 2.0  # a stopping replica's release is tried this long
# A free slot is minded once seen free this long (a surge pod takes a released slot within
# WAIT_CAP_S, so a rolling upgrade's hand-over is never read by a third replica), and looked
# at this often: a guest leaves a slot within that of a live replica taking it.
MIND_AFTER_S, MIND_EVERY_S = 5.0, 1.0
_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")


def lease_name(subscription: str) -> str:
    """The slot Lease guarding ``subscription`` (an id, not a path)."""
    name = PREFIX + subscription
    if len(name) <= 253 and _NAME.fullmatch(name):
        return name
    # Upper case, ``_``, ``~``, ``+``, ``%`` are valid in an id, not in an object name.
    return PREFIX + hashlib.sha256(subscription.encode()).hexdigest()[:24]


@dataclass(frozen=True)
class SlotLease:
    """What a slot's Lease says, as read."""

    holder: str  # "" when released
    renewed: datetime | None
    duration_s: float
    version: str | None = None  # resourceVersion: a takeover's precondition

    @classmethod
    def of(cls, lease: objects.Obj) -> SlotLease:
        spec = objects.spec(lease)
        return cls(
            holder=str(spec.get("holderIdentity") or ""),
            renewed=objects.time(spec.get("renewTime")),
            duration_s=float(spec.get("leaseDurationSeconds") or 0),
            version=objects.version(lease) or None,
        )


def why_free(
    lease: SlotLease | None, me: str, now: datetime, dead: Callable[[str], bool]
) -> str | None:
    """Why ``me`` may take the slot now ("new", "released", "own", "dead", "expired"), or
    None while another live replica holds it."""
    if lease is None:
        return "new"
    if not lease.holder or lease.renewed is None or lease.renewed <= RELEASED:
        return "released"
    if lease.holder == me:
        return "own"  # ours already: a restart under the same name
    if dead(lease.holder):
        return "dead"
    if now - lease.renewed > timedelta(seconds=lease.duration_s):
        return "expired"
    return None


def pick(
    leases: Mapping[int, SlotLease | None], me: str, now: datetime, dead: Callable[[str], bool]
) -> list[tuple[int, str]]:
    """The slots ``me`` may try, in order: its own first, then the rest by index."""
    free = [
        (i, why) for i, lease in sorted(leases.items()) if (why := why_free(lease, me, now, dead))
    ]
    return sorted(free, key=lambda f: (f[1] != "own", f[0]))


class PubSubSlots:
    """Hold one slot at a time and run ``consume(slot)`` only while holding it; meanwhile
    run ``consume`` on every free slot too, each until a live replica holds it."""

    def __init__(
        self,
        api: ApiServer,
        namespace: str,
        holder: str,
        *,
        subscriptions: Sequence[str],
        lease_s: float,
        limiter: RateLimiter,
        dead: Callable[[str], bool] | None = None,
        backoff: Backoff | None = None,
    ) -> None:
        if not subscriptions:
            raise ValueError("pubsub slots: no subscription")
        self._api = api
        self.namespace, self.holder, self.lease_s = namespace, holder, lease_s
        self.subscriptions = tuple(subscriptions)
        self.names = tuple(lease_name(s) for s in self.subscriptions)
        self._limiter = limiter
        self._dead = dead or (lambda _holder: False)
        # Every retry here, a wait for a free slot as much as a failed call, uses this one.
        cap = max(WAIT_BASE_S, min(WAIT_CAP_S, lease_s / 3))
        self._backoff = backoff or Backoff(WAIT_BASE_S, cap, floor_s=WAIT_BASE_S / 2)
        self.held: int | None = None  # the slot held now
        self.minded: set[int] = set()  # free slots consumed as a guest, Lease not taken
        self._version: str | None = None  # its Lease's resourceVersion, as we last wrote it
        self._renewed_at: datetime | None = None

    async def run(self, consume: Callable[[int], Coroutine[Any, Any, None]]) -> None:
        """Take a slot, consume it while it is held, take one again when it is lost; until
        cancelled, when ``consume`` is cancelled (and has handed its messages back) before
        the slot is released. A ``consume`` that fails is raised."""
        try:
            while True:
                index = await self.acquire()
                consuming = asyncio.create_task(consume(index), name=f"pubsub-slot-{index}")
                keeping = asyncio.create_task(self.keep(), name=f"pubsub-slot-{index}-lease")
                minding = asyncio.create_task(self.mind(consume), name="pubsub-free-slots")
                tasks = (consuming, keeping, minding)
                try:
                    await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for task in tasks:
                        task.cancel()
                    # The source nacks what it holds when cancelled: only then may a
                    # successor take the slot.
                    await asyncio.gather(*tasks, return_exceptions=True)
                for task in (consuming, minding):
                    if task.done() and not task.cancelled() and task.exception():
                        raise cast(BaseException, task.exception())
                logs.event(
                    log,
                    "pubsub slot lost",
                    logging.WARNING,
                    slot=index,
                    subscription=self.subscriptions[index],
                )
                self.held = None
        finally:
            if self.held is not None:
                await _shielded(self.release())

    async def acquire(self) -> int:
        """Take the first free slot (our own first), waiting for one if none is."""
        while True:
            try:
                leases = await self._read_all()
                for index, why in pick(leases, self.holder, utcnow(), self._dead):
                    if await self._take(index, leases[index]):
                        previous = leases[index]
                        logs.event(
                            log,
                            "pubsub slot taken",
                            slot=index,
                            subscription=self.subscriptions[index],
                            lease=self.names[index],
                            why=why,
                            previous_holder=previous.holder if previous is not None else "",
                        )
                        self._backoff.reset()
                        return index
            except errors.KubeError as e:
                logs.event(log, "pubsub slot not taken", logging.WARNING, error=str(e)[:200])
            await self._backoff.sleep()

    async def keep(self) -> None:
        """Renew the held slot every ``lease_s / 3``; return when it is lost."""
        index = self.held
        assert index is not None, "keep() without a slot"
        while True:
            await asyncio.sleep(self.lease_s / 3)
            try:
                if not await self._renew(index):
                    return  # a peer holds it now
            except errors.KubeError as e:
                logs.event(log, "pubsub slot renewal failed", logging.WARNING, error=str(e)[:200])
                last = self._renewed_at
                if last is None or utcnow() - last > timedelta(seconds=self.lease_s):
                    return  # expired for everyone: a peer may take it now

    async def mind(self, consume: Callable[[int], Coroutine[Any, Any, None]]) -> None:
        """Every ``MIND_EVERY_S``: consume each other slot free for ``MIND_AFTER_S``, stop
        consuming each one a live replica holds again; until cancelled, when the guests are
        cancelled (and have handed their messages back). A guest that fails or ends is logged
        and minded again once its slot has stayed free ``MIND_AFTER_S`` more: one free slot's
        subscription never takes this replica's own consumer down."""
        guests: dict[int, asyncio.Task[None]] = {}
        free_since: dict[int, float] = {}  # monotonic time each free slot was first seen free
        try:
            while True:
                try:
                    leases = await self._read_all()
                except errors.KubeError as e:
                    logs.event(log, "pubsub slots not read", logging.WARNING, error=str(e)[:200])
                    leases = None
                if leases is not None:
                    now, seen = utcnow(), time.monotonic()
                    free = {
                        i
                        for i, lease in leases.items()
                        if i != self.held and why_free(lease, self.holder, now, self._dead)
                    }
                    free_since = {i: free_since.get(i, seen) for i in free}
                    ripe = {i for i in free if seen - free_since[i] >= MIND_AFTER_S}
                    for index in sorted(ripe - guests.keys()):
                        logs.event(log, "pubsub free slot minded", slot=index)
                        guests[index] = asyncio.create_task(
                            consume(index), name=f"pubsub-free-slot-{index}"
                        )
                    leaving = {i: guests.pop(i) for i in sorted(guests.keys() - free)}
                    for guest in leaving.values():
                        guest.cancel()
                    await asyncio.gather(*leaving.values(), return_exceptions=True)
                    for index in leaving:
                        logs.event(log, "pubsub free slot left to its holder", slot=index)
                    self.minded = set(guests)
                for index, guest in list(guests.items()):
                    if guest.done():
                        error = None if guest.cancelled() else guest.exception()
                        logs.event(
                            log,
                            "pubsub free slot guest ended",
                            logging.WARNING,
                            slot=index,
                            error=str(error)[:200] if error else None,
                        )
                        del guests[index]
                        free_since[index] = time.monotonic()  # minded again after MIND_AFTER_S
                        self.minded = set(guests)
                await asyncio.sleep(MIND_EVERY_S)
        finally:
            for guest in guests.values():
                guest.cancel()
            await asyncio.gather(*guests.values(), return_exceptions=True)
            self.minded = set()

    async def release(self) -> None:
        """Give the held slot up (renewed "long ago"): a waiting replica takes it at once.
        Best effort: unreleased, it expires in ``lease_s``."""
        index, self.held = self.held, None
        if index is None:
            return
        name = self.names[index]
        body = {
            "metadata": {"resourceVersion": self._version},
            "spec": {
                "holderIdentity": None,
                "renewTime": _micro(RELEASED),
                "leaseDurationSeconds": 1,
            },
        }
        try:
            await self._limiter.call(
                f"release lease/{name}",
                FIRST,
                lambda: self._api.patch(apiserver.lease(self.namespace, name), body),
                retry_until=utcnow() + timedelta(seconds=RELEASE_S),
            )
        except errors.KubeError as e:
            # A Conflict: a peer holds it already. Else it expires.
            logs.event(
                log, "pubsub slot not released", logging.WARNING, slot=index, error=str(e)[:200]
            )
            return
        logs.event(log, "pubsub slot released", slot=index, subscription=self.subscriptions[index])

    # --- the Lease calls --------------------------------------------------------------------

    async def _read_all(self) -> dict[int, SlotLease | None]:
        """Every slot's Lease (None: never created), from one LIST."""
        listed = await self._limiter.read(
            "list pubsub slot leases",
            None,
            lambda: self._api.get(
                apiserver.lease(self.namespace), labelSelector=f"{SLOT_LABEL}=true"
            ),
            retry_until=utcnow() + timedelta(seconds=self.lease_s / 3),
        )
        by_name = {objects.name(lease): SlotLease.of(lease) for lease in objects.items(listed)}
        return {i: by_name.get(name) for i, name in enumerate(self.names)}

    def _body(self, index: int, now: datetime, version: str | None) -> dict[str, Any]:
        metadata: dict[str, Any] = {
            "name": self.names[index],
            "labels": {SLOT_LABEL: "true"},
            "annotations": {
                HOLDER_ANNOTATION: self.holder,
                SUBSCRIPTION_ANNOTATION: self.subscriptions[index],
            },
        }
        if version is not None:
            metadata["resourceVersion"] = version  # the precondition: nobody wrote it since
        return {
            "metadata": metadata,
            "spec": {
                "holderIdentity": self.holder[:128],
                "leaseDurationSeconds": max(1, round(self.lease_s)),
                "renewTime": _micro(now),
            },
        }

    async def _take(self, index: int, seen: SlotLease | None) -> bool:
        """Create the slot's Lease, or take it over at the version read; False when a peer
        was first."""
        name, now = self.names[index], utcnow()
        body = self._body(index, now, seen.version if seen is not None else None)
        holding = (
            seen is not None
            and seen.holder == self.holder
            and (seen.renewed or RELEASED) > RELEASED
        )
        if seen is None or not holding:
            body["spec"]["acquireTime"] = _micro(now)
        until = now + timedelta(seconds=self.lease_s / 3)
        try:
            if seen is None:
                written = await self._limiter.call(
                    f"create lease/{name}",
                    FIRST,
                    lambda: self._api.post(apiserver.lease(self.namespace), body),
                    retry_until=until,
                )
            else:
                written = await self._limiter.call(
                    f"take lease/{name}",
                    FIRST,
                    lambda: self._api.patch(apiserver.lease(self.namespace, name), body),
                    retry_until=until,
                )
        except (errors.Conflict, errors.NotFound):
            return False  # created, taken or deleted since we read it
        self.held, self._version, self._renewed_at = index, objects.version(written) or None, now
        return True

    async def _renew(self, index: int) -> bool:
        """One renewal at the version we last wrote; False when the slot is no longer ours."""
        name, now = self.names[index], utcnow()
        body = self._body(index, now, self._version)
        try:
            written = await self._limiter.call(
                f"renew lease/{name}",
                FIRST,
                lambda: self._api.patch(apiserver.lease(self.namespace, name), body),
                retry_until=now + timedelta(seconds=self.lease_s / 3),
            )
        except errors.NotFound:
            return False
        except errors.Conflict:
            # Written since: by a peer that took it, or by our own renewal whose answer was
            # lost on the way back. The Lease says which.
            try:
                lease = await self._limiter.read(
                    f"read lease/{name}",
                    None,
                    lambda: self._api.get(apiserver.lease(self.namespace, name)),
                    retry_until=now + timedelta(seconds=self.lease_s / 3),
                )
            except errors.NotFound:
                return False
            current = SlotLease.of(lease)
            if current.holder != self.holder or (current.renewed or RELEASED) <= RELEASED:
                return False
            self._version = current.version
            return True
        self._version, self._renewed_at = objects.version(written) or None, now
        return True


async def _shielded(release: Awaitable[None]) -> None:
    """Finish the release even while the caller is being cancelled (bounded by its retry)."""
    task = asyncio.ensure_future(release)
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        # Cancelled again while releasing: finish it before giving in.
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.shield(task), RELEASE_S + 1)
        raise


def _micro(t: datetime) -> str:
    """MicroTime, as Lease.spec.renewTime wants it."""
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
