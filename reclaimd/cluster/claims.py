"""The durable claim: which notice owns a node (or Kueue Workload), who acts on it, how far.

A claim is the annotation ``reclaimd.io/claim`` on the doomed object, JSON:
``{notice_id, deadline, holder, phase, claimed_at, heartbeat_at, response, notice, ...}``.
It is the first write for a notice (the transport acks only after it), so it lives where the
cluster keeps state: a crash loses nothing, and a second replica reads the same truth.

Every write is a merge patch carrying the ``metadata.resourceVersion`` that was read, so the
API server refuses it (409) if anyone wrote in between; we then re-read and decide again.
Two replicas racing for one notice therefore end with exactly one ``CLAIMED``; the other
re-reads and finds the notice held (``DUPLICATE``).

The decision (``decide``) is a pure function of what is on the object:

- a notice an earlier claim on the object handled (``handled``: finished, or covered by the
  notice that replaced it) -> ``DUPLICATE``: a late copy must not cordon a node put back;
- nothing there, or a finished or abandoned claim -> ``CLAIMED``;
- the same notice: ours -> ``ALREADY_OURS`` (resume); finished -> ``DUPLICATE``; another
  holder whose lease is fresh -> ``DUPLICATE``; whose lease is stale -> ``TAKEN_OVER``
  (resume from its phase, as the new holder);
- another open notice with an earlier or equal deadline -> ``SUPERSEDED`` (it already covers
  ours); with a later deadline (or none: an early warning) -> ``CLAIMED``, the more urgent
  notice replaces it and the old holder finds out at its next ``advance``.

The claim write is the storm's fast path: for a full-response notice on a node it also
cordons and taints the node, in the same PATCH, computed from the cluster cache's copy of the
node (``NodeSnapshot``) so that no GET precedes it; a 409 means the copy was stale, and only
then is the node read. After that the claim is written once more, at ``done``: progress in
between is not recorded, since a resumed notice runs its runbook again from the top.

The lease: a claim is live while its holder is. Each replica renews one Lease of its own
(``holders``); ``liveness`` tells the last renewal seen for a holder, and a claim's own
``heartbeat_at`` (its last write) counts too. A claim whose holder has renewed neither within
``lease_s`` belongs to a holder presumed dead (crashed, or hung: a stopped process renews
nothing) and can be taken over; a claim is *abandoned* when its deadline has passed and its
lease is stale.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, Protocol

from reclaimd import kueueapi
from reclaimd.cluster import apiserver, client, objects, taints
from reclaimd.cluster.apiserver import ApiServer
from reclaimd.cluster.cache import WorkloadApi
from reclaimd.cluster.ratelimit import RateLimiter
from reclaimd.model import Notice, ParseError, frozen_map, parse_time, rfc3339, utcnow
from reclaimd.settings.claims import ClaimSettings

log = logging.getLogger(__name__)

CLAIM_ANNOTATION = "reclaimd.io/claim"


class Phase(StrEnum):
    CLAIMED = "claimed"
    CORDONED = "cordoned"
    SIGNALED = "signaled"
    DRAINED = "drained"
    RECORDED = "recorded"
    DONE = "done"

    @property
    def rank(self) -> int:
        return _PHASE_ORDER.index(self)

    @property
    def terminal(self) -> bool:
        return self is Phase.DONE


_PHASE_ORDER = tuple(Phase)


@dataclass(frozen=True)
class NodeObj:
    name: str

    def describe(self) -> str:
        return f"node/{self.name}"


@dataclass(frozen=True)
class WorkloadObj:
    namespace: str
    name: str

    def describe(self) -> str:
        return f"workload/{self.namespace}/{self.name}"


ClaimTarget = NodeObj | WorkloadObj


@dataclass(frozen=True)
class Claim:
    target: ClaimTarget
    notice_id: str
    deadline: datetime | None
    holder: str
    phase: Phase
    claimed_at: datetime
    heartbeat_at: datetime
    response: str = ""
    notice: Mapping[str, Any] = field(default_factory=dict)  # Notice.to_json()
    facts: Mapping[str, Any] = field(default_factory=frozen_map)  # from advance(**extra)
    # The replicas that may take this claim over (one deployment's): another deployment on
    # the same cluster (a canary with its own queue and ledger) never resumes it.
    group: str = ""
    # Notices this object's earlier claims finished or covered, by id (their deadlines): a
    # late copy of one (a Pub/Sub redelivery, a slot's seek back) is a duplicate, even after
    # a newer notice's claim replaced the one that handled it.
    handled: Mapping[str, str] = field(default_factory=frozen_map)  # "": no deadline

    def to_json(self) -> dict[str, Any]:
        return {
            **dict(self.facts),
            **({"group": self.group} if self.group else {}),
            "notice_id": self.notice_id,
            "deadline": rfc3339(self.deadline) if self.deadline else None,
            "holder": self.holder,
            "phase": self.phase.value,
            "claimed_at": rfc3339(self.claimed_at),
            "heartbeat_at": rfc3339(self.heartbeat_at),
            "response": self.response,
            "notice": dict(self.notice),
            **({"handled": dict(self.handled)} if self.handled else {}),
        }

    @classmethod
    def from_json(cls, target: ClaimTarget, text: str) -> Claim:
        """Read an annotation; ``ParseError`` (one line) when it is not a claim."""
        try:
            data = json.loads(text)
        except ValueError as e:
            raise ParseError(f"{target.describe()}: claim is not JSON") from e
        if not isinstance(data, dict):
            raise ParseError(f"{target.describe()}: claim is not an object")
        try:
            claimed_at = parse_time(str(data["claimed_at"]))
            deadline = data.get("deadline")
            notice = data.get("notice")
            known = {
                "notice_id",
                "deadline",
                "holder",
                "phase",
                "claimed_at",
                "heartbeat_at",
                "response",
                "notice",
                "group",
                "handled",
            }
            return cls(
                target=target,
                notice_id=str(data["notice_id"]),
                deadline=parse_time(str(deadline)) if deadline else None,
                holder=str(data["holder"]),
                phase=Phase(str(data["phase"])),
                claimed_at=claimed_at,
                heartbeat_at=parse_time(str(data.get("heartbeat_at") or data["claimed_at"])),
                response=str(data.get("response") or ""),
                notice=notice if isinstance(notice, dict) else {},
                facts=frozen_map({k: v for k, v in data.items() if k not in known}),
                group=str(data.get("group") or ""),
                handled=frozen_map(_handled(data.get("handled"))),
            )
        except (KeyError, ValueError) as e:
            raise ParseError(f"{target.describe()}: claim is missing or has a bad {e}") from e

    def stale(
        self, now: datetime, lease_s: float, renewed: datetime | None = None, dead: bool = False
    ) -> bool:
        """Neither the claim nor its holder's Lease (``renewed``) was written for ``lease_s``,
        or the holder is known dead (``dead``: its process refused a probe, or it handed its
        claims over on SIGTERM): then no Lease need run out first."""
        if dead:
            return True
        last = self.heartbeat_at if renewed is None else max(self.heartbeat_at, renewed)
        return now - last > timedelta(seconds=lease_s)

    def open(
        self, now: datetime, lease_s: float, renewed: datetime | None = None, dead: bool = False
    ) -> bool:
        """Still to be acted on: not finished, and not past its deadline with no live holder."""
        if self.phase.terminal:
            return False
        expired = self.deadline is not None and self.deadline <= now
        return not (expired and self.stale(now, lease_s, renewed, dead))


class ClaimStatus(StrEnum):
    CLAIMED = "claimed"  # we wrote it: run the runbook
    ALREADY_OURS = "already_ours"  # same notice, ours: resume from claim.phase
    TAKEN_OVER = "taken_over"  # same notice, its holder's lease ran out: resume, now ours
    DUPLICATE = "duplicate"  # same notice, held by a live peer or already done: nothing to do
    SUPERSEDED = "superseded"  # another open notice dies no later: it covers this one
    TARGET_NOT_FOUND = "target_not_found"


@dataclass(frozen=True)
class ClaimResult:
    status: ClaimStatus
    claim: Claim | None = None  # what is on the object now
    previous: Claim | None = None  # what was there before, when we replaced or took over


class AdvanceStatus(StrEnum):
    ADVANCED = "advanced"
    LOST = "lost"  # the claim is another notice's or another holder's now: stop
    TARGET_NOT_FOUND = "target_not_found"


@dataclass(frozen=True)
class AdvanceResult:
    status: AdvanceStatus
    claim: Claim | None = None


def _no_later(a: datetime | None, b: datetime | None) -> bool:
    """Deadline ``a`` is earlier than or equal to ``b``; no deadline is the latest of all."""
    if a is None:
        return b is None
    return b is None or a <= b


Liveness = Callable[[str], datetime | None]
"""The last renewal seen of a holder's Lease; None when none was seen."""

Death = Callable[[str], bool]
"""Whether a holder is known dead now, before its Lease runs out (``holders.HolderLeases``)."""


def _never_renewed(_holder: str) -> datetime | None:
    return None


def never_dead(_holder: str) -> bool:
    return False


HANDLED_KEPT = 16  # a node or Workload sees a few notices an hour, not more
HANDLED_FOR = timedelta(minutes=15)  # past a notice's deadline by this, the intake expires it


def handled_after(replaced: Claim | None, now: datetime) -> dict[str, str]:
    """What a new claim keeps of the one it replaces: every notice that claim had handled
    (finished, or covered by the new notice's earlier deadline), its own included, less the
    ones so long past their deadline that the intake expires a copy anyway."""
    if replaced is None:
        return {}
    deadline = rfc3339(replaced.deadline) if replaced.deadline else ""
    kept = {**replaced.handled, replaced.notice_id: deadline}
    fresh = {nid: d for nid, d in kept.items() if not d or parse_time(d) + HANDLED_FOR > now}
    return dict(list(fresh.items())[-HANDLED_KEPT:])


def _handled(value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError("handled")
    return {str(k): str(v or "") for k, v in value.items()}


def decide(
    existing: Claim | None,
    notice: Notice,
    holder: str,
    now: datetime,
    lease_s: float,
    *,
    renewed: datetime | None = None,
    dead: bool = False,
) -> ClaimStatus:
    """What a claim attempt means, given what is on the object (see the module doc);
    ``renewed`` is the last renewal of the existing claim's holder, ``dead`` whether it is
    known dead."""
    if existing is None:
        return ClaimStatus.CLAIMED
    if notice.id in existing.handled:
        return ClaimStatus.DUPLICATE
    if existing.notice_id == notice.id:
        if existing.phase.terminal:
            return ClaimStatus.DUPLICATE
        if existing.holder == holder:
            return ClaimStatus.ALREADY_OURS
        if existing.stale(now, lease_s, renewed, dead):
            return ClaimStatus.TAKEN_OVER
        return ClaimStatus.DUPLICATE
    if not existing.open(now, lease_s, renewed, dead):
        return ClaimStatus.CLAIMED
    if _no_later(existing.deadline, notice.deadline):
        return ClaimStatus.SUPERSEDED
    return ClaimStatus.CLAIMED


class NodeSnapshot(Protocol):
    """The cache's copy of a node (``cache.NodeView`` fits): enough to write the claim and the
    cordon without reading the node first."""

    @property
    def resource_version(self) -> str: ...
    @property
    def unschedulable(self) -> bool: ...
    @property
    def taints(self) -> tuple[Mapping[str, Any], ...]: ...
    @property
    def claim_text(self) -> str | None: ...


@dataclass(frozen=True)
class _Read:
    """What is on the object: the claim (None: none) and what a write must be computed from."""

    claim: Claim | None
    version: str
    unschedulable: bool = False
    taints: tuple[Mapping[str, Any], ...] = ()


class ClaimStore:
    def __init__(
        self,
        api_client: ApiServer,
        holder: str,
        *,
        limiter: RateLimiter | None = None,
        lease_s: float,
        settings: ClaimSettings = ClaimSettings(),
        workloads: WorkloadApi = WorkloadApi(),
        clock: Callable[[], datetime] = utcnow,
        liveness: Liveness = _never_renewed,
        death: Death = never_dead,
        group: str = "",
    ) -> None:
        if not holder:
            raise ValueError("claim holder must not be empty")
        self.holder = holder
        self.group = group  # written on every claim; the resume scan takes over only its own
        self._api = api_client
        self._limiter = limiter or RateLimiter()
        self._settings = settings
        # Not settings: the lease is the replicas' claim_stale_s, the Workload API's version
        # is the one the cluster serves (looked up on first use).
        self._lease_s = lease_s
        self._workload_api = workloads
        self._clock = clock
        self._liveness = liveness
        self._death = death

    # --- public -------------------------------------------------------------------------

    async def claim(
        self,
        obj: ClaimTarget,
        notice: Notice,
        *,
        cordon: bool = False,
        seed: NodeSnapshot | None = None,
    ) -> ClaimResult:
        """Claim ``obj`` for ``notice``; retried on conflict, idempotent on redelivery.

        ``cordon``: a node is also cordoned and tainted in the same write (the notice's own
        claim, a resume or a takeover alike). ``seed``: the cache's copy of the node, used for
        the first attempt instead of a GET.
        """

        async def change(read: _Read) -> ClaimResult:
            existing = read.claim
            now = self._clock()
            lease_s = self._lease_s
            renewed = self._liveness(existing.holder) if existing is not None else None
            dead = existing is not None and self._death(existing.holder)
            status = decide(existing, notice, self.holder, now, lease_s, renewed=renewed, dead=dead)
            if status in (ClaimStatus.DUPLICATE, ClaimStatus.SUPERSEDED):
                return ClaimResult(status, existing)
            if status is ClaimStatus.CLAIMED:
                new = Claim(
                    target=obj,
                    notice_id=notice.id,
                    deadline=notice.deadline,
                    holder=self.holder,
                    phase=Phase.CLAIMED,
                    claimed_at=now,
                    heartbeat_at=now,
                    response=notice.response.value,
                    notice=notice.to_json(),
                    group=self.group,
                    handled=frozen_map(handled_after(existing, now)),
                    facts=frozen_map(
                        {"supersedes": existing.notice_id}
                        if existing is not None and existing.open(now, lease_s, renewed, dead)
                        else {}
                    ),
                )
            else:  # ours already, or taken over: keep its phase and history, renew the lease
                assert existing is not None
                new = replace(existing, holder=self.holder, heartbeat_at=now, group=self.group)
            spec = (
                taints.cordon_spec(read.unschedulable, read.taints, notice.kind.value)
                if cordon and isinstance(obj, NodeObj)
                else None
            )
            # A 409 (a stale copy, or a write in between) makes ``update`` read and decide again.
            await self._write(
                obj, read.version, new, claim_order(notice), spec=spec, until=notice.deadline
            )
            if status is not ClaimStatus.ALREADY_OURS:
                log.info(
                    "claim %s: %s %s (previous %s)",
                    obj.describe(),
                    status.value,
                    notice.id,
                    existing.notice_id if existing else "none",
                )
            return ClaimResult(status, new, existing)

        try:
            return await self._limiter.while_answered(
                self._settings.unanswered_s,
                self._limiter.update(
                    f"claim {obj.describe()}",
                    claim_order(notice),
                    lambda: self._fetch(obj),
                    change,
                    first=_seeded(obj, seed),
                    retry_until=notice.deadline,
                    conflicts=self._settings.max_conflicts,
                ),
            )
        except client.NotFound:
            return ClaimResult(ClaimStatus.TARGET_NOT_FOUND)

    async def advance(
        self, obj: ClaimTarget, notice_id: str, phase: Phase | str, **extra: Any
    ) -> AdvanceResult:
        """Move our claim forward to ``phase`` (never back) and renew the lease.

        ``extra`` facts are kept on the claim (e.g. ``gangs=3``); values must be JSON.
        ``LOST`` means another notice or holder owns the object now: stop acting on it.
        """
        target_phase = Phase(phase)

        async def change(found: _Read) -> AdvanceResult:
            existing = found.claim
            if (
                existing is None
                or existing.notice_id != notice_id
                or existing.holder != self.holder
            ):
                return AdvanceResult(AdvanceStatus.LOST, existing)
            new_phase = max(existing.phase, target_phase, key=lambda p: p.rank)
            new = replace(
                existing,
                phase=new_phase,
                heartbeat_at=self._clock(),
                facts=frozen_map({**existing.facts, **extra}),
            )
            await self._write(obj, found.version, new, existing.deadline)
            return AdvanceResult(AdvanceStatus.ADVANCED, new)

        try:
            return await self._limiter.update(
                f"advance {obj.describe()}",
                None,
                lambda: self._fetch(obj),
                change,
                conflicts=self._settings.max_conflicts,
            )
        except client.NotFound:
            return AdvanceResult(AdvanceStatus.TARGET_NOT_FOUND)

    async def heartbeat(self, obj: ClaimTarget, notice_id: str) -> AdvanceResult:
        """Renew the lease without moving the phase (during a long checkpoint wait)."""
        return await self.advance(obj, notice_id, Phase.CLAIMED)

    async def get(self, obj: ClaimTarget) -> Claim | None:
        found = await self._read(obj)
        return found.claim if found is not None else None

    async def list_open(
        self,
        namespaces: tuple[str, ...] = (),
        *,
        node_claims: Iterable[tuple[str, str]] | None = None,
    ) -> list[Claim]:
        """Every unfinished claim on nodes and Workloads (in ``namespaces``, or all).

        ``node_claims``: (node, claim annotation) pairs from the cache, instead of a LIST of
        every node (thousands, every scan, in the middle of a storm)."""
        claims: list[Claim] = []
        if node_claims is None:
            nodes = await self._limiter.read(
                "list nodes", None, lambda: self._api.get(apiserver.node())
            )
            node_claims = [
                (objects.name(n), _annotations(n).get(CLAIM_ANNOTATION, ""))
                for n in objects.items(nodes)
            ]
        for name, text in node_claims:
            if text:
                claims.extend(self._parse(NodeObj(name), {CLAIM_ANNOTATION: text}))
        wl = await self._workloads()

        async def workloads() -> list[Any]:
            if not namespaces:
                page = await self._api.get(_workloads_path(wl))
                return list(page.get("items") or ())
            found: list[Any] = []
            for ns in namespaces:
                page = await self._api.get(_workloads_path(wl, namespace=ns))
                found.extend(page.get("items") or ())
            return found

        try:
            items = await self._limiter.read("list workloads", None, workloads)
        except client.NotFound:
            items = []  # no Kueue in this cluster
        for item in items:
            meta = item.get("metadata") or {}
            target = WorkloadObj(str(meta.get("namespace")), str(meta.get("name")))
            claims.extend(self._parse(target, meta.get("annotations")))
        return [c for c in claims if not c.phase.terminal]

    # --- the object API -----------------------------------------------------------------

    async def _workloads(self) -> WorkloadApi:
        """Where Workloads are served: the version found by the process's one discovery."""
        wl = self._workload_api
        return replace(wl, version=await kueueapi.version_or(self._api, wl.version))

    def _parse(self, obj: ClaimTarget, annotations: Mapping[str, str] | None) -> list[Claim]:
        text = (annotations or {}).get(CLAIM_ANNOTATION)
        if not text:
            return []
        try:
            return [Claim.from_json(obj, text)]
        except ParseError as e:
            log.warning("ignoring unreadable claim: %s", e)
            return []

    async def _read(self, obj: ClaimTarget) -> _Read | None:
        """What is on ``obj`` now; None if it is absent (reads retried at the one call point)."""
        try:
            return await self._limiter.read(
                f"read {obj.describe()}", None, lambda: self._fetch(obj)
            )
        except client.NotFound:
            return None

    async def _fetch(self, obj: ClaimTarget) -> _Read:
        """One read of ``obj``: its claim or none, its version, its cordon; NotFound if absent.

        An unreadable annotation counts as no claim: a hand-edited value must not block every
        future notice for that node, and our write replaces it.
        """
        with client.kube_errors(f"read {obj.describe()}"):
            if isinstance(obj, NodeObj):
                node = await self._api.get(apiserver.node(obj.name))
                parsed = self._parse(obj, _annotations(node))
                spec = objects.spec(node)
                return _Read(
                    parsed[0] if parsed else None,
                    str(objects.meta(node).get("resourceVersion")),
                    bool(spec.get("unschedulable")),
                    tuple(t for t in spec.get("taints") or () if isinstance(t, Mapping)),
                )
            wl = await self._workloads()
            body = await self._api.get(_workloads_path(wl, obj.name, obj.namespace))
        meta = body.get("metadata") or {}
        parsed = self._parse(obj, meta.get("annotations"))
        return _Read(parsed[0] if parsed else None, str(meta.get("resourceVersion")))

    async def _write(
        self,
        obj: ClaimTarget,
        version: str,
        claim: Claim,
        deadline: datetime | None,
        *,
        spec: Mapping[str, Any] | None = None,
        until: datetime | None = None,
    ) -> None:
        """``deadline`` orders the write in the budget; ``until`` (default: the same) bounds
        its retries."""
        text = json.dumps(claim.to_json(), sort_keys=True, separators=(",", ":"))
        body: dict[str, Any] = {
            "metadata": {"resourceVersion": version, "annotations": {CLAIM_ANNOTATION: text}}
        }
        if spec:
            body["spec"] = dict(spec)
        what = f"write claim on {obj.describe()}"
        if isinstance(obj, NodeObj):
            await self._limiter.call(
                what,
                deadline,
                lambda: self._api.patch(apiserver.node(obj.name), body),
                retry_until=until,
            )
            return
        wl = await self._workloads()
        await self._limiter.call(
            what,
            deadline,
            lambda: self._api.patch(_workloads_path(wl, obj.name, obj.namespace), body),
            retry_until=until,
        )


def _annotations(obj: objects.Obj) -> Mapping[str, Any]:
    return objects.part(objects.meta(obj), "annotations")


def _workloads_path(wl: WorkloadApi, name: str = "", namespace: str = "") -> str:
    """Workloads (of ``namespace``, or every one), or the one named."""
    return apiserver.group(f"{wl.group}/{wl.version}", wl.plural, name, namespace)


CLAIM_LEAD_S = 120.0


def claim_order(notice: Notice) -> datetime | None:
    """Where a claim (the cordon) and the gang Leases the checkpoint requests wait for sit in
    the write budget: as if due when the notice was issued, so that in a storm they are served
    before the evictions of the notices already running, and a notice is cordoned and its
    ranks asked as it arrives. A change announced weeks ahead sorts ``CLAIM_LEAD_S`` before
    its own far deadline instead."""
    if notice.deadline is None:
        return None
    lead = notice.deadline - timedelta(seconds=CLAIM_LEAD_S)
    return min(notice.deadline, max(notice.issued_at, lead))


def _seeded(obj: ClaimTarget, seed: NodeSnapshot | None) -> _Read | None:
    """A first read from the cache's copy of the node, when there is one to trust."""
    if seed is None or not isinstance(obj, NodeObj) or not seed.resource_version:
        return None
    claim: Claim | None = None
    if seed.claim_text:
        try:
            claim = Claim.from_json(obj, seed.claim_text)
        except ParseError:
            claim = None
    return _Read(claim, seed.resource_version, seed.unschedulable, tuple(seed.taints))
