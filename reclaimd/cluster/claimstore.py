"""The claim store: reads and writes the claim annotation on a node or a Kueue Workload.

``ClaimStore`` makes the decisions of ``claims`` (``decide``) durable: every write is a merge
patch with the ``resourceVersion`` it read, re-read and decided again on a 409; a claim on a
node for a full-response notice cordons and taints it in the same PATCH, computed from the
cache's copy of the node (``NodeSnapshot``) so that no GET precedes it. Its writes go through
the adaptive write budget (``ratelimit``), ordered by ``claims.claim_order``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Protocol

from reclaimd import kueueapi
from reclaimd.cluster import apiserver, errors, objects, taints
from reclaimd.cluster.apiserver import ApiServer
from reclaimd.cluster.cache import WorkloadApi
from reclaimd.cluster.claims import (
    CLAIM_ANNOTATION,
    AdvanceResult,
    AdvanceStatus,
    Claim,
    ClaimResult,
    ClaimStatus,
    ClaimTarget,
    Death,
    Liveness,
    NodeObj,
    Phase,
    WorkloadObj,
    claim_order,
    decide,
    handled_after,
    never_dead,
    never_renewed,
)
from reclaimd.cluster.ratelimit import RateLimiter
from reclaimd.model import Notice, ParseError, frozen_map, utcnow
from reclaimd.settings.claims import ClaimSettings

# The claims' logger: the store's lines read as they did before it had a module of its own.
log = logging.getLogger("reclaimd.cluster.claims")

DEFAULTS = ClaimSettings()  # one instance, as the default argument it replaces was


class NodeSnapshot(Protocol):
    """The cache's copy of a node (``indexes.NodeView`` fits): enough to write the claim and the
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
        settings: ClaimSettings = DEFAULTS,
        workloads: WorkloadApi = WorkloadApi(),
        clock: Callable[[], datetime] = utcnow,
        liveness: Liveness = never_renewed,
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
        except errors.NotFound:
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
        except errors.NotFound:
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
        except errors.NotFound:
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
        except errors.NotFound:
            return None

    async def _fetch(self, obj: ClaimTarget) -> _Read:
        """One read of ``obj``: its claim or none, its version, its cordon; NotFound if absent.

        An unreadable annotation counts as no claim: a hand-edited value must not block every
        future notice for that node, and our write replaces it.
        """
        with errors.kube_errors(f"read {obj.describe()}"):
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
