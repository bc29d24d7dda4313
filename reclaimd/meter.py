"""The allocation meter: per hour and instance, what each label set held (ARCHITECTURE §10).

Every ``interval_s`` the meter looks at the GPU pods in the cluster cache and adds, per
(hour, node, cost labels, MIG profile), ``GPUs x seconds`` since the previous look. A closed
hour becomes one ``reclaimd.allocation/v1`` row per key, through the same outbox, idempotence
and label contract as the restart-waste events (``ledger.LedgerWriter``), on its own topic.

**Open hours.** Every ``open_every_s`` (300 s) the meter also writes the open hour's running
total of each key that changed: the same ``EventId`` as the key's closed row will have,
``x_HourClosed: false`` and ``x_Revision`` (the look's time in ms). A consumer keeps, per
``EventId``, the closed row, else the highest revision (``reclaimd report`` does); on the
topic and in the outbox each revision is a record of its own (``EventId~revision``).

* **GPU-hours** count whole GPUs (``nvidia.com/gpu`` and other ``*/gpu`` resources).
* **MIG-profile-hours** count slices (``nvidia.com/mig-1g.10gb``, or ``nvidia.com/gpu`` on a
  node whose GKE partition-size label says the GPUs are slices); a slice is never also
  counted as its parent GPU. ``x_MigGpuEquivalentHours`` = slice-hours x compute slices / 7,
  which is what the report prices a slice at.
* **HBM-GB-hours** = GPU-hours x the SKU's memory per GPU (``skus.SKUS``), plus slice-hours x
  the profile's memory.

**One replica per hour.** Before metering hour H a replica creates the Lease
``alloc-<cluster hash>-<YYYYMMDDHH>``; the API server's uniqueness of names is the lock (as
``cluster/gangclaims.py`` does for gangs). The replica that created it (its holderIdentity)
meters H; the others skip H. A replica that restarts finds its own Lease and carries on, but
the part of the hour before the restart is not metered (the ledger under-reports rather than
invents). A holder that dies leaves the rest of its hour unmetered: there is no takeover yet.

A gap between looks longer than ``max_gap_s`` (the event loop stalled, the cache lost its
watch) is not counted: allocation is only claimed for time the meter saw.

A row's instance facts (instance id, SKU, purchase option, zone) are those the node had when
it was last counted, not when the hour closes: a reclaimed spot node is usually gone by then,
and its hour must still be priced on its own instance.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Final, Protocol

from reclaimd import skus
from reclaimd.ledger.labels import LabelPolicy, bounded, cost_labels, placement, pricing_category
from reclaimd.ledger.writer import LedgerWriter
from reclaimd.model import rfc3339, stable_id, utcnow
from reclaimd.settings.allocation import AllocationSettings

if TYPE_CHECKING:
    from reclaimd.cluster.apiserver import ApiServer

log = logging.getLogger(__name__)

SCHEMA: Final = "reclaimd.allocation/v1"
MIG_PREFIX: Final = "nvidia.com/mig-"
_GKE_PARTITION: Final = "cloud.google.com/gke-gpu-partition-size"


@dataclass(frozen=True)
class NodeFacts:
    labels: Mapping[str, str]
    provider_id: str = ""


class FleetView(Protocol):
    """What the meter reads: the cache's GPU pods (slim dicts) and its nodes."""

    def gpu_pods(self) -> Iterable[Mapping[str, Any]]: ...

    def node(self, name: str) -> NodeFacts | None: ...


@dataclass(frozen=True)
class Key:
    hour: datetime
    node: str
    labels: tuple[tuple[str, str], ...]
    mig_profile: str  # "" for whole GPUs


@dataclass
class Usage:
    gpu_s: float = 0.0
    mig_s: float = 0.0  # slice-seconds
    mig_gpu_s: float = 0.0  # slice-seconds x slices / 7
    hbm_gb_s: float = 0.0


@dataclass(frozen=True)
class Holding:
    """What one node's pods of one label set hold right now."""

    node: str
    labels: tuple[tuple[str, str], ...]
    mig_profile: str
    gpus: int


def _resources(pod: Mapping[str, Any]) -> dict[str, int]:
    """GPU-like extended resources the running pod holds, summed over its app containers."""
    out: dict[str, int] = {}
    spec = pod.get("spec") or {}
    for c in spec.get("containers") or ():
        res = (c or {}).get("resources") or {}
        limits, requests = res.get("limits") or {}, res.get("requests") or {}
        for name in {*limits, *requests}:
            if name.endswith("/gpu") or name.startswith(MIG_PREFIX):
                n = max(_int(limits.get(name)), _int(requests.get(name)))
                if n:
                    out[name] = out.get(name, 0) + n
    return out


def _int(value: Any) -> int:
    try:
        f = float(str(value))
    except ValueError:
        return 0
    return int(f) if f >= 0 and f == int(f) else 0


def holdings(view: FleetView, policy: LabelPolicy) -> list[Holding]:
    """Every (node, labels, MIG profile) with the GPUs or slices held there now."""
    out: list[Holding] = []
    for pod in view.gpu_pods():
        meta = pod.get("metadata") or {}
        node_name = str((pod.get("spec") or {}).get("nodeName") or "")
        if not node_name or meta.get("deletionTimestamp"):
            continue
        node = view.node(node_name)
        node_labels = node.labels if node is not None else {}
        tags = policy.tags(cost_labels(meta.get("labels") or {}, node_labels))
        labels = tuple(sorted(tags.items()))
        partition = node_labels.get(_GKE_PARTITION, "")
        for resource, n in _resources(pod).items():
            if resource.startswith(MIG_PREFIX):
                profile = resource.removeprefix(MIG_PREFIX)
            elif partition and skus.mig_profile(partition):
                profile = partition  # GKE: nvidia.com/gpu on a partitioned node is a slice
            else:
                profile = ""
            out.append(Holding(node_name, labels, profile, n))
    return out


def _hour(t: datetime) -> datetime:
    return t.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


class HourLock(Protocol):
    async def acquire(self, hour: datetime) -> bool: ...


@dataclass
class Integrator:
    """GPU-seconds per key, split at hour boundaries. Pure: the clock is passed in."""

    max_gap_s: float = 120.0
    open: dict[Key, Usage] = field(default_factory=dict)
    last: datetime | None = None

    def add(self, now: datetime, held: Iterable[Holding], sku_of: Callable[[str], str]) -> None:
        """Count ``held`` for the time since the previous call (none the first time)."""
        prev, self.last = self.last, now
        if prev is None or now <= prev or (now - prev).total_seconds() > self.max_gap_s:
            return
        held = list(held)
        start = prev
        while start < now:
            boundary = _hour(start) + timedelta(hours=1)
            end = min(now, boundary)
            self._count(_hour(start), (end - start).total_seconds(), held, sku_of)
            start = end

    def _count(
        self, hour: datetime, dt: float, held: list[Holding], sku_of: Callable[[str], str]
    ) -> None:
        for h in held:
            u = self.open.setdefault(Key(hour, h.node, h.labels, h.mig_profile), Usage())
            if h.mig_profile:
                slices, mem = skus.mig_profile(h.mig_profile) or (0, 0.0)
                u.mig_s += h.gpus * dt
                u.mig_gpu_s += h.gpus * dt * slices / skus.MIG_SLICES_PER_GPU
                u.hbm_gb_s += h.gpus * dt * mem
            else:
                sku = skus.lookup(sku_of(h.node))
                u.gpu_s += h.gpus * dt
                u.hbm_gb_s += h.gpus * dt * (sku.hbm_gb if sku else 0.0)

    def closed(self, now: datetime) -> dict[Key, Usage]:
        """Remove and return every key of an hour that ended at or before ``now``."""
        current = _hour(now)
        done = {k: v for k, v in self.open.items() if k.hour < current}
        for k in done:
            del self.open[k]
        return done


def row(
    key: Key,
    usage: Usage,
    node: NodeFacts | None,
    cluster: str,
    *,
    revision: int = 0,
    closed: bool = True,
) -> dict[str, Any]:
    """The ``reclaimd.allocation/v1`` row of one key's hour: closed, or its running total so
    far (``closed=False``). Every row of a key has the key's ``EventId``; ``x_Revision`` (the
    look's time, ms since the epoch) orders them and a closed row replaces every open one."""
    place = placement(node.labels, node.provider_id) if node is not None else {}
    labels = dict(key.labels)
    sku = place.get("sku") or labels.get("sku")
    purchase = place.get("purchase_option") or labels.get("purchase_option")
    spec = skus.lookup(sku)
    gpu_h = usage.gpu_s / 3600.0
    # GCE names an instance within its project: the bill's SubAccountId, from gce://p/z/name
    gce = node.provider_id.split("/") if node is not None else []
    project = bounded(gce[2]) if len(gce) > 4 and gce[0] == "gce:" else None
    event_id = stable_id(
        "al", cluster, rfc3339(key.hour), key.node, json.dumps(key.labels), key.mig_profile
    )
    return {
        "schema": SCHEMA,
        "EventId": event_id,
        "ChargePeriodStart": rfc3339(key.hour),
        "ChargePeriodEnd": rfc3339(key.hour + timedelta(hours=1)),
        "ChargeCategory": "Usage",
        "PricingCategory": pricing_category(purchase),
        "ConsumedQuantity": round(gpu_h, 6),
        "ConsumedUnit": "GPU-Hours",
        "ResourceId": place.get("instance_id"),
        "SubAccountId": project,
        "ResourceType": "GPU allocation",
        "SkuId": sku,
        "AvailabilityZone": place.get("zone"),
        "Tags": labels,
        "x_PurchaseOption": purchase,
        "x_K8sNodeName": bounded(key.node),
        "x_K8sClusterName": bounded(cluster),
        "x_GpuHours": round(gpu_h, 6),
        "x_MigProfile": bounded(key.mig_profile),
        "x_MigProfileHours": round(usage.mig_s / 3600.0, 6),
        "x_MigGpuEquivalentHours": round(usage.mig_gpu_s / 3600.0, 6),
        "x_HbmGbHours": round(usage.hbm_gb_s / 3600.0, 6),
        "x_NodeGpus": spec.gpus if spec else 0,
        "x_Revision": revision,
        "x_HourClosed": closed,
    }


def record_id(r: Mapping[str, Any]) -> str:
    """The outbox's and the topic's id of one row: a closed hour's is its ``EventId`` (a
    re-sent row dedupes), an open hour's running total has one per revision."""
    eid = str(r["EventId"])
    return eid if r.get("x_HourClosed", True) else f"{eid}~{r.get('x_Revision', 0)}"


def encode(r: Mapping[str, Any]) -> tuple[str, bytes, bytes, tuple[tuple[str, bytes], ...]]:
    """(record id, Kafka key ``tenant|node``, JSON value, headers)."""
    key = f"{r['Tags'].get('tenant', '-')}|{r['x_K8sNodeName'] or '-'}".encode()[:200]
    value = json.dumps(r, sort_keys=True, separators=(",", ":")).encode()
    rid = record_id(r)
    headers = (("event_id", rid.encode()), ("schema", SCHEMA.encode()))
    return rid, key, value, headers


class Meter:
    """Looks, integrates, and records closed hours; ``run`` until cancelled."""

    def __init__(
        self,
        view: FleetView,
        writer: LedgerWriter,
        lock: HourLock,
        *,
        cluster: str,
        settings: AllocationSettings = AllocationSettings(),
        policy: LabelPolicy | None = None,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self.view, self.writer, self.lock = view, writer, lock
        self.cluster = cluster
        self.interval_s = interval_s = settings.interval_s
        self.policy = policy or writer.policy
        self.clock = clock
        self.integrator = Integrator(max_gap_s=max(4 * interval_s, 60.0))
        self._held_hours: dict[datetime, bool] = {}
        self._seen: dict[str, NodeFacts] = {}  # node -> its facts when last counted
        self.rows_recorded = 0  # closed hours' rows
        self.open_rows_recorded = 0  # running totals of the open hour
        # Hours metered here whose rows are all in the outbox, and the end of the newest (from
        # the first look, the start of its hour: nothing before that is owed by this process).
        self.hours_closed = 0
        self.last_closed_hour_end = 0.0
        self._metering: datetime | None = None  # the hour the integrator counts for us
        self.open_every_s = settings.open_every_s
        self._open_at: datetime | None = None  # when the open hour's totals were last written
        self._open_written: dict[Key, tuple[float, float]] = {}

    async def _mine(self, hour: datetime) -> bool:
        if hour not in self._held_hours:
            try:
                self._held_hours[hour] = await self.lock.acquire(hour)
            except Exception as e:  # the API is down: try again next look, count nothing
                log.warning("allocation lease for %s: %s", rfc3339(hour), str(e)[:200])
                return False
            for old in [h for h in self._held_hours if h < hour - timedelta(hours=2)]:
                del self._held_hours[old]
        return self._held_hours[hour]

    async def tick(self) -> int:
        """One look; returns the rows recorded (closed hours)."""
        now = self.clock()
        hour = _hour(now)
        self.last_closed_hour_end = self.last_closed_hour_end or hour.timestamp()
        mine = await self._mine(hour)
        ended = self._metering if self._metering is not None and self._metering < hour else None
        self._metering = hour if mine else None  # an ended hour is closed once, or never
        if not mine:
            self.integrator.last = None  # not ours: the next hour starts afresh
        else:
            held = holdings(self.view, self.policy)
            for h in held:
                if (facts := self.view.node(h.node)) is not None:
                    self._seen[h.node] = facts
            self.integrator.add(now, held, self._sku_of)
        n = 0
        revision = int(now.timestamp() * 1000)
        for key, usage in sorted(self.integrator.closed(now).items(), key=lambda kv: str(kv[0])):
            r = row(key, usage, self._node(key.node), self.cluster, revision=revision)
            await self.writer.record_encoded(*encode(r))
            self._open_written.pop(key, None)
            n += 1
        self.rows_recorded += n
        if ended is not None:  # its rows are in the outbox: the hour is closed
            self.hours_closed += 1
            self.last_closed_hour_end = (ended + timedelta(hours=1)).timestamp()
        due = self._open_at is None or (now - self._open_at).total_seconds() >= self.open_every_s
        if self.integrator.open and due:
            await self._record_open(now, revision)
        if n:  # forget nodes no open hour needs any more
            still = {k.node for k in self.integrator.open}
            self._seen = {k: v for k, v in self._seen.items() if k in still}
        return n

    async def _record_open(self, now: datetime, revision: int) -> None:
        """The open hour's running total of every key that changed since it was last written
        (replaced on the topic by a later revision, and by the closed row)."""
        self._open_at = now
        for key, usage in sorted(self.integrator.open.items(), key=lambda kv: str(kv[0])):
            seen = (usage.gpu_s, usage.mig_s)
            if self._open_written.get(key) == seen:
                continue
            r = row(key, usage, self._node(key.node), self.cluster, revision=revision, closed=False)
            await self.writer.record_encoded(*encode(r))
            self._open_written[key] = seen
            self.open_rows_recorded += 1

    def _node(self, name: str) -> NodeFacts | None:
        return self._seen.get(name) or self.view.node(name)

    def _sku_of(self, node: str) -> str:
        facts = self._node(node)
        return placement(facts.labels).get("sku", "") if facts is not None else ""

    async def run(self) -> None:
        while True:
            try:
                await self.tick()
            except Exception as e:  # one bad look must not end metering
                log.warning("allocation meter: %s: %s", type(e).__name__, str(e)[:200])
            await asyncio.sleep(self.interval_s)


def lease_name(cluster: str, hour: datetime) -> str:
    digest = hashlib.sha256(cluster.encode()).hexdigest()[:10]
    return f"alloc-{digest}-{hour.astimezone(UTC):%Y%m%d%H}"


class LeaseHourLock:
    """One Lease per hour; whoever created it meters that hour."""

    def __init__(
        self, api: ApiServer, namespace: str, holder: str, cluster: str, *, limiter: Any = None
    ) -> None:
        from reclaimd.cluster.ratelimit import RateLimiter

        self._api = api
        self.namespace, self.holder, self.cluster = namespace, holder[:128], cluster
        # The one call point (its retries); a meter's own budget when none is shared.
        self._limiter: RateLimiter = limiter or RateLimiter()

    async def acquire(self, hour: datetime) -> bool:
        from reclaimd.cluster import apiserver, errors, objects

        name = lease_name(self.cluster, hour)
        body = {
            "metadata": {"name": name, "labels": {"reclaimd.io/lease": "allocation-hour"}},
            "spec": {"holderIdentity": self.holder, "acquireTime": rfc3339(utcnow())},
        }
        try:
            # No deadline: the hour's rows wait behind every notice's writes.
            await self._limiter.call(
                f"create lease/{name}",
                None,
                lambda: self._api.post(apiserver.lease(self.namespace), body),
            )
            return True
        except errors.Conflict:
            lease = await self._limiter.read(
                f"read lease/{name}",
                None,
                lambda: self._api.get(apiserver.lease(self.namespace, name)),
            )
            return bool(objects.spec(lease).get("holderIdentity") == self.holder)


class CacheFleet:
    """``FleetView`` over ``cluster.cacheview.CacheView`` (``ClusterCache.view``).

    Everything comes through the cache's public queries (``gpu_pods``, ``node``,
    ``provider_id``).
    """

    def __init__(self, cache: Any) -> None:
        self._cache = cache

    def gpu_pods(self) -> Iterable[Mapping[str, Any]]:
        return list(self._cache.gpu_pods())

    def node(self, name: str) -> NodeFacts | None:
        view = self._cache.node(name)
        return NodeFacts(view.labels, self._cache.provider_id(name)) if view is not None else None
