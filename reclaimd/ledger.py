"""The restart-waste ledger: label contract, event shape, and the outbox-backed publisher.

Three parts, in the order data flows:

* **Labels.** ``cost_labels`` maps pod and node labels to the five cost keys (tenant, queue,
  sku, cell, purchase_option); ``LabelPolicy`` decides which of them reach an event. Keys
  outside the allowlist, and keys that carry user data whatever the allowlist says (``prompt``,
  ``user_email``, ``session_raw``), are dropped and counted; a value longer than 63 characters
  or outside ``[A-Za-z0-9._-]`` is dropped and counted. Nothing here raises into the pipeline
  or logs a refused value: the ledger is joined with billing data and kept for months, so what
  gets in must be bounded in cardinality and free of user content.
* **Event.** ``to_event`` writes one FOCUS-aligned row per gang (FinOps FOCUS column names,
  reclaimd's own facts in ``x_`` columns). Only enums, ids, times, numbers and allowed labels
  go in: no pod names, no workload free text. The event id comes from notice + gang, so a
  consumer dedupes replays on ``EventId``. Since v2 the row also splits the loss by the
  instance each rank ran on (``x_WasteByInstance``), so a gang spanning spot and on-demand
  nodes is priced part by part (docs/ledger.md).
* **Publisher.** ``LedgerWriter.record`` commits the event to the SQLite outbox (fsync'd,
  idempotent on the event id) and, given a cluster log (``cluster.ledgerlog``), records it in
  the cluster before it returns; ``run`` publishes the outbox to Kafka in transactions under
  a transactional id derived from the holder, and marks a row sent once its transaction
  committed. A Kafka outage delays events, never loses them; losing the replica and its disk
  during one loses nothing either: a peer adopts the cluster records of a holder whose Lease
  is stale, fences that holder's transactional id, reads the topic (``read_committed``) for
  what already made it, and publishes the rest. Exactly once, replays included: a row whose
  transaction outcome is unknown (a crash between commit and mark, a fence) is looked up on
  the topic before it is sent again, and a row whose record a peer holds waits for it: published
  once the record is gone, adopted (and published here) if that peer dies first. Consumers
  must read with ``isolation.level=read_committed`` (an aborted transaction's records stay
  in the log); ``EventId`` still identifies each event.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import random
import re
import socket
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, Protocol

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError, ProducerFenced

from reclaimd import kafkaprobe
from reclaimd import waste as waste_math
from reclaimd.handlers import instance_of
from reclaimd.kafkaconn import KafkaSettings, options
from reclaimd.logs import event as log_event
from reclaimd.model import Cause, Placement, RestartWaste, rfc3339
from reclaimd.outbox import AsyncOutbox, Cluster, Row

if TYPE_CHECKING:  # the Kafka side knows the cluster records by shape only
    from reclaimd.cluster.ledgerlog import PendingEvent

log = logging.getLogger(__name__)

SCHEMA: Final = "reclaimd.restart-waste/v2"
DEFAULT_ALLOW: Final = ("tenant", "queue", "sku", "cell", "purchase_option")
# Refused whatever the allowlist says: a misconfigured allowlist must not open these.
ALWAYS_REFUSED: Final = frozenset({"prompt", "user_email", "session_raw"})
# Facts the cluster side passes beside the cost labels; they feed x_ columns, not Tags.
FACT_KEYS: Final = frozenset({"mig_profile"})
MAX_VALUE_LEN: Final = 63  # a Kubernetes label value's limit
_VALUE = re.compile(r"[A-Za-z0-9._-]+")
_TRACEPARENT = re.compile(r"[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")
MAX_KEY_BYTES: Final = 200
SWEEP_EVERY_S: Final = 600.0  # old tombstones of published events are deleted this often

PURCHASE_OPTIONS: Final = ("spot", "on_demand", "reserved", "capacity_block")
_PURCHASE_ALIASES: Final = {
    "spot": "spot",
    "preemptible": "spot",
    "on_demand": "on_demand",
    "ondemand": "on_demand",
    "reserved": "reserved",
    "capacity_block": "capacity_block",
    "capacityblock": "capacity_block",
}
# FOCUS PricingCategory: Dynamic is "interruptible or low priority resources", i.e. spot.
_PRICING_CATEGORY: Final = {
    "spot": "Dynamic",
    "on_demand": "Standard",
    "reserved": "Committed",
    "capacity_block": "Committed",
}

# Where each cost key comes from, first match wins: explicit reclaimd labels before the
# scheduler's or the provisioner's.
_POD_SOURCES: Final = {
    "tenant": ("reclaimd.io/tenant",),
    "queue": ("reclaimd.io/queue", "kueue.x-k8s.io/queue-name"),
    "cell": ("reclaimd.io/cell",),
}
_NODE_SOURCES: Final = {
    "sku": ("node.kubernetes.io/instance-type", "beta.kubernetes.io/instance-type"),
    "cell": ("reclaimd.io/cell",),  # a cell is often a node-pool fact: used when pods say none
}
_PURCHASE_SOURCES: Final = (
    "reclaimd.io/purchase-option",
    "karpenter.sh/capacity-type",  # spot | on-demand | reserved
    "eks.amazonaws.com/capacityType",  # SPOT | ON_DEMAND | CAPACITY_BLOCK
    # AKS: spot on Spot pools' nodes, absent on regular pools' (pay-as-you-go or reserved,
    # which the node cannot tell: left unknown, as a GKE node without gke-spot is).
    "kubernetes.azure.com/scalesetpriority",
)
_GKE_SPOT: Final = ("cloud.google.com/gke-spot", "cloud.google.com/gke-preemptible")
_MIG_SOURCES: Final = ("cloud.google.com/gke-gpu-partition-size", "nvidia.com/mig.config")


def bounded(value: object) -> str | None:
    """``value`` if it is a short ``[A-Za-z0-9._-]`` string, else ``None``."""
    if isinstance(value, str) and len(value) <= MAX_VALUE_LEN and _VALUE.fullmatch(value):
        return value
    return None


def normalize_purchase_option(value: str | None) -> str | None:
    """spot | on_demand | reserved | capacity_block, or ``None`` when unknown."""
    if not value:
        return None
    return _PURCHASE_ALIASES.get(value.strip().lower().replace("-", "_"))


def pricing_category(purchase_option: str | None) -> str:
    return _PRICING_CATEGORY.get(normalize_purchase_option(purchase_option) or "", "Other")


def cost_labels(pod_labels: Mapping[str, str], node_labels: Mapping[str, str]) -> dict[str, str]:
    """The raw cost labels of one rank, for ``Gang.labels``: mapped, not yet policed.

    ``purchase_option`` is normalized here because its sources disagree on spelling; an
    unrecognized spelling is left out rather than guessed. ``mig_profile`` (a fact, not a
    tag) is taken from the node's GPU partition label when MIG is on.
    """
    out: dict[str, str] = {}
    for name, keys in _POD_SOURCES.items():
        if (v := _first(pod_labels, keys)) is not None:
            out[name] = v
    for name, keys in _NODE_SOURCES.items():
        if name not in out and (v := _first(node_labels, keys)) is not None:
            out[name] = v
    purchase = normalize_purchase_option(_first(node_labels, _PURCHASE_SOURCES))
    if purchase is None and any(node_labels.get(k, "").lower() == "true" for k in _GKE_SPOT):
        purchase = "spot"
    if purchase is not None:
        out["purchase_option"] = purchase
    mig = _first(node_labels, _MIG_SOURCES)
    if mig is not None and mig != "all-disabled":
        out["mig_profile"] = mig
    return out


# Node metadata naming the cloud instance (the cluster cache reads the same keys, plus the
# providerID, which ``placement`` takes as an argument because it is not a label).
_INSTANCE_SOURCES: Final = (
    "reclaimd.io/instance-id",
    "alpha.eksctl.io/instance-id",
    "container.googleapis.com/instance_id",
)
_ZONE_SOURCES: Final = ("topology.kubernetes.io/zone", "failure-domain.beta.kubernetes.io/zone")
PLACEMENT_KEYS: Final = ("instance_id", "sku", "purchase_option", "zone", "cell")


def placement(node_labels: Mapping[str, str], provider_id: str = "") -> dict[str, str]:
    """Where a node is, for pricing: instance_id, sku, purchase_option, zone, cell.

    Only bounded values are kept (an instance id is an id, not a label, but it is joined with
    the bill and must be as tame); an unknown fact is left out.
    """
    labels = cost_labels({}, node_labels)
    raw = {
        "instance_id": instance_of(provider_id) or _first(node_labels, _INSTANCE_SOURCES),
        "sku": labels.get("sku"),
        "purchase_option": labels.get("purchase_option"),
        "zone": _first(node_labels, _ZONE_SOURCES),
        "cell": labels.get("cell"),
    }
    return {k: ok for k, v in raw.items() if (ok := bounded(v)) is not None}


def _first(labels: Mapping[str, str], keys: Iterable[str]) -> str | None:
    for k in keys:
        v = labels.get(k)
        if v:
            return v
    return None


class LabelPolicy:
    """The allowlist and value rules for ``Tags``; counts what it drops, never what it saw.

    ``dropped`` counts by reason (``refused_key``, ``bad_value``) so metrics can show that
    something is being refused without the refused content reaching any sink.
    """

    def __init__(self, allowed: Iterable[str] = DEFAULT_ALLOW) -> None:
        self.allowed = frozenset(allowed) - ALWAYS_REFUSED
        self.dropped: Counter[str] = Counter()

    def tags(self, labels: Mapping[str, str]) -> dict[str, str]:
        out: dict[str, str] = {}
        for key, value in labels.items():
            if key in FACT_KEYS:
                continue
            if key not in self.allowed:
                self.dropped["refused_key"] += 1
                continue
            if key == "purchase_option":
                ok = bounded(normalize_purchase_option(value))
            else:
                ok = bounded(value)
            if ok is None:
                self.dropped["bad_value"] += 1
                continue
            out[key] = ok
        return dict(sorted(out.items()))


def _seconds(a: datetime | None, b: datetime | None) -> float | None:
    return None if a is None or b is None else round((b - a).total_seconds(), 3)


def _time(t: datetime | None) -> str | None:
    return rfc3339(t) if t is not None else None


def to_event(w: RestartWaste, policy: LabelPolicy) -> dict[str, Any]:
    """The ledger row of one gang (see the module docstring for what may go in)."""
    notice, gang = w.notice, w.gang
    where = Placement.of(notice)
    target = notice.target
    purchase = normalize_purchase_option(gang.labels.get("purchase_option"))
    start = w.last_good_checkpoint or w.stopped_at
    return {
        "schema": SCHEMA,
        "EventId": w.event_id,
        "ChargePeriodStart": rfc3339(start),
        "ChargePeriodEnd": rfc3339(w.stopped_at),
        "ChargeCategory": "Usage",
        "PricingCategory": pricing_category(purchase),
        "ConsumedQuantity": round(w.gpu_seconds_lost / 3600.0, 6),
        "ConsumedUnit": "GPU-Hours",
        "ResourceId": target.instance_id or target.provider_id or target.node_name or str(gang.key),
        "ResourceType": "GPU training gang",
        "SkuId": bounded(gang.labels.get("sku")) or bounded(where.instance_type or None),
        "RegionId": bounded(where.region or None),
        "AvailabilityZone": bounded(where.zone or where.availability_zone or None),
        "Tags": policy.tags(gang.labels),
        "x_WastedGpuSeconds": round(w.gpu_seconds_lost, 3),
        "x_GangId": str(gang.key),
        "x_GangSize": len(gang.members),
        "x_GpuCount": gang.gpus,
        "x_MigProfile": bounded(gang.labels.get("mig_profile")),
        "x_NoticeId": notice.id,
        "x_NoticeSource": notice.source,
        "x_NoticeKind": notice.kind.value,
        "x_NoticeReason": bounded(Cause.of(notice).reason or None),
        "x_NoticeWindowS": _seconds(notice.issued_at, notice.deadline),
        "x_NoticeReceivedAt": rfc3339(notice.received_at),
        "x_NoticeDeadline": _time(notice.deadline),
        "x_CheckpointOutcome": w.outcome.value,
        "x_DeadlineMet": w.deadline_met,
        "x_K8sClusterName": bounded(w.cluster),
        "x_K8sNamespaceName": gang.key.namespace,
        "x_K8sNodeNames": sorted(gang.nodes),
        "x_TraceParent": _traceparent(w.traceparent),
        "x_WasteByInstance": waste_by_instance(w),
    }


def waste_by_instance(w: RestartWaste) -> list[dict[str, Any]]:
    """The gang's loss split by node, each part with the instance facts to price it.

    A node the builder placed carries its own facts (``x_PlacementSource: node``); one it did
    not falls back to the gang's labels (``gang``), which is exact only for a gang on one kind
    of node. The parts' ``x_WastedGpuSeconds`` sum to the event's (to rounding).
    """
    gang_facts = {
        "sku": bounded(w.gang.labels.get("sku")),
        "purchase_option": bounded(normalize_purchase_option(w.gang.labels.get("purchase_option"))),
        "zone": bounded(Placement.of(w.notice).zone or None),
        "cell": bounded(w.gang.labels.get("cell")),
    }
    return [
        {
            **instance_part(
                part.node, w.placements.get(part.node), gang_facts, ranks=part.ranks, gpus=part.gpus
            ),
            "x_WastedGpuSeconds": round(part.gpu_seconds, 3),
        }
        for part in waste_math.by_node(w.gang.members, w.stopped_at)
    ]


def instance_part(
    node: str,
    placed: Mapping[str, str] | None,
    gang_facts: Mapping[str, str | None],
    *,
    ranks: int,
    gpus: int,
) -> dict[str, Any]:
    """One node's part of a gang's event, priced by the node's own facts when it was placed
    (``placed``, from ``placement``), else by ``gang_facts``; the caller adds its seconds.
    Shared by restart waste (``x_WasteByInstance``) and restart overhead."""
    facts: Mapping[str, str | None] = (
        {k: bounded(placed.get(k)) for k in PLACEMENT_KEYS} if placed else gang_facts
    )
    purchase = normalize_purchase_option(facts.get("purchase_option"))
    return {
        "ResourceId": facts.get("instance_id"),
        "SkuId": bounded(facts.get("sku")),  # gang facts may come unbounded
        "PricingCategory": pricing_category(purchase),
        "AvailabilityZone": facts.get("zone"),
        "x_PurchaseOption": purchase,
        "x_Cell": facts.get("cell"),
        "x_K8sNodeName": bounded(node),
        "x_PlacementSource": "node" if placed else "gang",
        "x_Ranks": ranks,
        "x_GpuCount": gpus,
    }


def _traceparent(value: str) -> str | None:
    return value if _TRACEPARENT.fullmatch(value) else None


def gang_kafka_key(tags: Mapping[str, str], gang_id: str) -> bytes:
    """``tenant|gang``: one gang's events (restart waste and restart overhead alike) stay
    ordered on one partition; bounded in length."""
    key = f"{tags.get('tenant', '-')}|{gang_id}".encode()
    if len(key) <= MAX_KEY_BYTES:
        return key
    # Too long for a key: keep a readable head and make it unique again with a hash.
    return key[: MAX_KEY_BYTES - 17] + b"~" + hashlib.sha256(key).hexdigest()[:16].encode()


def kafka_key(w: RestartWaste, tags: Mapping[str, str]) -> bytes:
    """The Kafka key of a restart-waste event (``gang_kafka_key``)."""
    return gang_kafka_key(tags, str(w.gang.key))


def encode(
    w: RestartWaste, policy: LabelPolicy
) -> tuple[str, bytes, bytes, tuple[tuple[str, bytes], ...]]:
    """(event id, Kafka key, JSON value, headers) for one restart-waste event."""
    ev = to_event(w, policy)
    value = json.dumps(ev, sort_keys=True, separators=(",", ":")).encode()
    headers = [("event_id", w.event_id.encode()), ("schema", SCHEMA.encode())]
    if ev["x_TraceParent"]:
        # An empty traceparent is invalid W3C context: send none rather than a bad one.
        headers.append(("traceparent", ev["x_TraceParent"].encode()))
    return w.event_id, kafka_key(w, ev["Tags"]), value, tuple(headers)


def transactional_id(holder: str, topic: str) -> str:
    """The Kafka transactional id of ``holder``'s writer to ``topic``: derived, so an adopter
    can open a producer under a dead holder's id and so fence its unfinished transactions."""
    digest = hashlib.sha256(f"{holder}\0{topic}".encode("utf-8", "surrogatepass")).hexdigest()
    return "reclaimd-ledger-" + digest[:32]


class ClusterLog(Protocol):
    """Where pending events are recorded in the cluster (``cluster.ledgerlog.LedgerLog``)."""

    holder: str

    async def put(
        self,
        event_id: str,
        key: bytes | None,
        value: bytes,
        headers: Iterable[tuple[str, bytes]],
        *,
        deadline: datetime | None,
    ) -> bool: ...

    async def records(self) -> list[PendingEvent]: ...

    async def adopt(self, ev: PendingEvent) -> PendingEvent | None: ...

    async def mark_published(self, event_id: str) -> None: ...

    async def sweep(self) -> int: ...


# 400, 404, 422: the request itself, or the namespace, is wrong. Not 401/403: an API server
# just restarted answers 403 until its RBAC caches fill (failover-4020099555: a record
# refused so was published unlocked, and the peer that took the notice over published the
# same event again).
_FOR_GOOD_STATUS: Final = frozenset({400, 404, 422})


def refused_for_good(e: BaseException) -> bool:
    """A cluster record write that can never succeed: too large for an annotation, or a
    status that no retry changes."""
    if getattr(e, "retriable", False):
        return False
    if isinstance(e, ValueError):  # ledgerlog.TooLarge: the encoded event is over the limit
        return True
    return getattr(e, "status", None) in _FOR_GOOD_STATUS


class _ClusterUnreadable(Exception):
    """The cluster records could not be read: rows that have one wait for the next round."""


def _in_cluster(r: Row) -> bool:
    return r.cluster in (Cluster.HELD, Cluster.UNKNOWN)


def settle(
    rows: Iterable[Row], records: Mapping[str, PendingEvent] | None, holder: str
) -> tuple[list[Row], list[Row], list[Row]]:
    """Split rows about to be published into (ours, in doubt, given away).

    Given away: a peer holds the cluster record (it recorded the event first, or adopted it),
    so it publishes the event; the row waits (``Cluster.PEER``) until then. In doubt: a
    transaction carrying the row was begun before (it may have committed), the row's record
    is gone or its write had no answer (a peer may have published and deleted it), or the
    record is ours by adoption (its first holder may have published it before it died:
    failover-4020099555 published such a row again); the topic decides. ``records`` is
    ``None`` when no row needed the cluster (it was not read).
    """
    ours: list[Row] = []
    doubt: list[Row] = []
    gone: list[Row] = []
    for r in rows:
        in_cluster = _in_cluster(r)
        rec = records.get(r.id) if records is not None and in_cluster else None
        if rec is not None and rec.holder != holder:
            gone.append(r)
        elif (
            r.tried
            or (in_cluster and rec is None)
            or (rec is not None and any(h != holder for h in rec.holders))
        ):
            doubt.append(r)
        else:
            ours.append(r)
    return ours, doubt, gone


class LedgerWriter:
    """Durable, exactly-once publication of restart-waste events to a Kafka topic.

    ``record`` may be called before ``run`` starts and while Kafka is down: the event waits in
    the outbox, and (with a ``cluster`` log) in the cluster, where a peer finds it if this
    replica and its disk are lost (``run`` also adopts such events of dead peers when given
    ``alive``). An empty ``bootstrap_servers`` keeps events in the outbox until a writer with a
    broker opens the same file.

    Exactly once: every batch is one Kafka transaction under this holder's transactional id.
    Before a batch, the rows' cluster records are read (after the producer's epoch is set, so a
    peer that adopts later fences this producer first): a row a peer adopted is given away. A
    row whose transaction outcome is unknown (tried before, or its record vanished) is looked
    up on the topic with a ``read_committed`` consumer before it is sent again.
    """

    def __init__(
        self,
        *,
        bootstrap_servers: str,
        topic: str,
        outbox_path: str | Path,
        connection: KafkaSettings | None = None,
        policy: LabelPolicy | None = None,
        batch_size: int = 100,
        backoff_initial_s: float = 0.5,
        backoff_max_s: float = 30.0,
        request_timeout_ms: int = 30_000,
        client_id: str = "reclaimd-ledger",
        retention_s: float = 7 * 86_400,
        holder: str | None = None,
        cluster: ClusterLog | None = None,
        alive: Callable[[str], Awaitable[bool]] | None = None,
        recover_every_s: float = 10.0,
        scan_margin_s: float = 600.0,
        scan_timeout_s: float = 120.0,
    ) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.connection = connection  # TLS, SASL: reclaimd.kafkaconn
        self.topic = topic
        self.policy = policy or LabelPolicy()
        self.holder = holder or (cluster.holder if cluster is not None else socket.gethostname())
        if cluster is not None and cluster.holder != self.holder:
            raise ValueError("ledger: the cluster log must record under the writer's holder")
        self._outbox = AsyncOutbox.open(outbox_path)
        self._cluster = cluster
        self._alive = alive
        self._batch = batch_size
        self._backoff = (backoff_initial_s, backoff_max_s)
        self._request_timeout_ms = request_timeout_ms
        self._client_id = client_id
        # Sent rows are kept this long so a replay of their id stays a no-op, then pruned.
        self._retention_s = retention_s
        self._recover_every_s = recover_every_s
        # Producer timestamps come from the writer's clock: look this far before a row's time.
        self._scan_margin_s = scan_margin_s
        self._scan_timeout_s = scan_timeout_s
        # The publisher's reading of the records and the recovery pass's adoption never
        # interleave: a row read as ours between an adoption and its topic scan was sent
        # without a look (failover-4020099555: the adopted event was on the topic already).
        self._settling = asyncio.Lock()
        self._pruned_at: float | None = None
        self._producer: AIOKafkaProducer | None = None
        self._wake = asyncio.Event()
        self._closing = asyncio.Event()
        self._changed = asyncio.Condition()
        # Set once our producer registered its transactional id: from then on no transaction
        # of an earlier process under our holder name can still commit.
        self._self_fenced = asyncio.Event()
        self._to_delete: set[str] = set()
        self._delete_wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.published = 0
        self.publish_errors = 0
        self.given_away = 0  # rows a peer adopted: it publishes them, we do not
        self.found_published = 0  # rows in doubt that the topic already had
        self.adopted = 0  # peers' (or an earlier life's) events this writer took over
        self.cluster_write_errors = 0  # events that live in the outbox only
        # What stops publishing that waiting will not mend (a refused password or certificate,
        # an untrusted broker, an ACL): /readyz's kafka check; None while it works or may.
        self.kafka_problem: str | None = None

    # --- the pipeline side ---------------------------------------------------------------

    async def record(self, w: RestartWaste) -> None:
        """Commit the event to the outbox (a repeat of its id is a no-op) and to the cluster,
        then wake ``run``."""
        event_id, key, value, headers = encode(w, self.policy)
        new = await self._put(event_id, key, value, headers, w.notice.deadline)
        log_event(log, "restart waste recorded", event_id=event_id, new=new)

    async def record_encoded(
        self, event_id: str, key: bytes, value: bytes, headers: tuple[tuple[str, bytes], ...]
    ) -> bool:
        """``record`` for a row already encoded (the allocation meter's); True if new."""
        return await self._put(event_id, key, value, headers, None)

    async def _put(
        self,
        event_id: str,
        key: bytes | None,
        value: bytes,
        headers: tuple[tuple[str, bytes], ...],
        deadline: datetime | None,
    ) -> bool:
        if self._cluster is None:
            new = await self._outbox.put(event_id, key, value, headers)
            if new:
                self._wake.set()
            return new
        # Outbox first (fast, local); the publisher skips the row until its cluster write ends.
        new = await self._outbox.put(event_id, key, value, headers, Cluster.PENDING)
        if not new:
            return False
        state = Cluster.UNKNOWN  # if we are cancelled mid-write
        try:
            await self._cluster.put(event_id, key, value, headers, deadline=deadline)
            state = Cluster.HELD
        except Exception as e:  # the outbox has it: a failed cluster write must not fail the step
            # Refused for good (too large, invalid, no such namespace): no record can exist,
            # the event goes out with the outbox alone. Anything else may pass later, and a
            # peer may record the same event meanwhile: the publisher looks before it sends.
            state = Cluster.NONE if refused_for_good(e) else Cluster.UNKNOWN
            self.cluster_write_errors += 1
            log_event(
                log,
                "ledger event not recorded in the cluster",
                logging.WARNING,
                event_id=event_id,
                error=f"{type(e).__name__}: {e}"[:200],
            )
        finally:
            await self._outbox.set_cluster(event_id, state)
            self._wake.set()
        return True

    def depth(self) -> int:
        """Events waiting for the broker's ack."""
        return self._outbox.depth()

    def oldest_age_s(self) -> float:
        """How long the oldest of them has waited, in seconds (0: none waits)."""
        return self._outbox.oldest_age_s()

    async def flush(self, timeout_s: float) -> bool:
        """Wait until the outbox is empty; ``False`` if it is not within ``timeout_s``."""
        try:
            async with asyncio.timeout(timeout_s), self._changed:
                await self._changed.wait_for(lambda: self.depth() == 0)
        except TimeoutError:
            return False
        return True

    # --- the publisher -------------------------------------------------------------------

    def start(self) -> asyncio.Task[None]:
        """Run the publisher as a task of this writer (``close`` ends it)."""
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self.run(), name="ledger-publisher")
        return self._task

    async def run(self) -> None:
        """Publish until ``close``; with a cluster log, also mark published events' records
        (tombstones, deleted hours later) and (given ``alive``) adopt the events of holders
        that are gone."""
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self._publish_loop(), name="ledger-publish")
            if self._cluster is not None:
                tg.create_task(self._delete_loop(), name="ledger-delete")
                if self._alive is not None:
                    tg.create_task(self._recover_loop(), name="ledger-recover")

    async def _publish_loop(self) -> None:
        """Kafka errors back off (capped, jittered) and retry; rows stay queued."""
        delay = self._backoff[0]
        published = self.published
        while not self._closing.is_set():
            if not self.bootstrap_servers:
                self._wake.clear()  # nothing to publish to: only close() ends this wait
                await self._idle()
                continue
            try:
                await self._publish()
            except Exception as e:  # this loop must outlive any one failure: rows stay queued
                if self.published > published:  # it worked since the last failure: start over
                    delay, published = self._backoff[0], self.published
                self.publish_errors += 1
                log_event(
                    log,
                    # Fenced: a peer took our records over (or we were paused past the
                    # transaction timeout); the next batch reads the cluster records again.
                    "ledger publish fenced, will re-check"
                    if isinstance(e, ProducerFenced)
                    else "ledger records unreadable, events with one wait"
                    if isinstance(e, _ClusterUnreadable)
                    else "ledger publish failed, will retry",
                    logging.WARNING,
                    error=f"{type(e).__name__}: {e}"[:200],
                    depth=self.depth(),
                    retry_in_s=round(delay, 2),
                )
                if not isinstance(e, _ClusterUnreadable):  # Kafka itself is fine then
                    await self._stop_producer()
                    await self._judge(e)
                await self._backoff_sleep(random.uniform(delay / 2, delay))
                delay = min(delay * 2, self._backoff[1])

    async def _publish(self) -> None:
        producer = await self._ensure_producer()
        while not self._closing.is_set():
            # Clear before reading: a record() after the read sets it again, so no wake is lost.
            self._wake.clear()
            rows = await self._outbox.pending(self._batch)
            if not rows:
                self._works()  # connected and authorized: nothing left to wait for
                await self._notify()
                await self._prune()
                await self._idle()
                continue
            async with self._settling:
                ours, unreadable = await self._settle(rows)
            if ours:
                await self._send_batch(producer, ours)
            if unreadable is not None:
                raise _ClusterUnreadable(str(unreadable)) from unreadable

    async def _settle(self, rows: list[Row]) -> tuple[list[Row], Exception | None]:
        """The rows of this batch that are ours to send now (see ``settle``), and the error
        that kept rows with a cluster record back (they wait until the cluster answers)."""
        records: dict[str, PendingEvent] | None = None
        unreadable: Exception | None = None
        if self._cluster is not None and any(_in_cluster(r) for r in rows):
            # Read after our producer's epoch was set: a peer adopting from here on fences
            # this producer before it looks at the topic, so no commit of ours slips past it.
            try:
                records = {p.event_id: p for p in await self._cluster.records()}
            except Exception as e:  # rows only this outbox knows need no cluster: go on
                unreadable = e
                rows = [r for r in rows if not _in_cluster(r)]
        if records:
            rows = await self._settle_published(rows, records)
        ours, doubt, gone = settle(rows, records, self.holder)
        if gone:
            # Left to the peer that holds the record, not marked sent: if that peer is dead,
            # the recovery pass adopts the record and this row is published after all.
            for r in gone:
                await self._outbox.set_cluster(r.id, Cluster.PEER)
            self.given_away += len(gone)
            log_event(log, "ledger events held by a peer", count=len(gone))
        if doubt:
            found = await self._committed({r.id for r in doubt}, min(r.created_at for r in doubt))
            if found:
                await self._outbox.mark_sent(sorted(found))
                self.found_published += len(found)
                self._forget(r.id for r in doubt if r.id in found and r.cluster != Cluster.NONE)
                log_event(log, "ledger events found on the topic", count=len(found))
            for r in doubt:
                if r.id in found:
                    continue
                missing = records is not None and _in_cluster(r) and r.id not in records
                try:
                    if not missing or await self._record_again(r):
                        ours.append(r)
                except Exception as e:  # still cut off: it waits (and the loop backs off)
                    unreadable = e
        if gone or doubt:
            await self._notify()
        return sorted(ours, key=lambda r: r.seq), unreadable

    async def _settle_published(
        self, rows: list[Row], records: Mapping[str, PendingEvent]
    ) -> list[Row]:
        """Rows whose record is a tombstone are on the topic already (a peer, or an earlier
        life of ours, published them: a charge repeated after a takeover): marked sent."""
        done = [r.id for r in rows if (rec := records.get(r.id)) and rec.published_at]
        if not done:
            return rows
        await self._outbox.mark_sent(done)
        self.found_published += len(done)
        log_event(log, "ledger events published before", count=len(done))
        return [r for r in rows if r.id not in done]

    async def _record_again(self, r: Row) -> bool:
        """A row meant to have a cluster record that has none, and not on the topic: its
        record's write had no answer (a partition), or it vanished. The record is the lock
        on the event id, so it is written again before the event may be sent: created, the
        row is ours; already there, a peer recorded the same event meanwhile (it took the
        notice over while we were cut off) and the next round sees whose it is."""
        assert self._cluster is not None
        created = await self._cluster.put(r.id, r.key, r.value, r.headers, deadline=None)
        if not created:
            await self._outbox.set_cluster(r.id, Cluster.HELD)
        return created

    async def _send_batch(self, producer: AIOKafkaProducer, rows: list[Row]) -> None:
        """One transaction: every row of the batch is on the topic, or none is."""
        ids = [r.id for r in rows]
        await self._outbox.mark_tried(ids)  # from here a crash leaves the outcome in doubt
        await producer.begin_transaction()
        _quiet_transaction(producer)
        try:
            futures: list[asyncio.Future[Any]] = []
            for row in rows:
                fut = await producer.send(
                    self.topic, value=row.value, key=row.key, headers=list(row.headers)
                )
                # A failed transaction fails every send: the first error is raised below,
                # the others are read here so none is reported as never retrieved.
                fut.add_done_callback(_retrieve)
                futures.append(fut)
            await asyncio.gather(*futures)
            await producer.commit_transaction()
        except BaseException:
            await self._abort(producer)
            raise
        await self._outbox.mark_sent(ids)
        self._works()
        self.published += len(ids)
        self._forget(r.id for r in rows if r.cluster != Cluster.NONE)
        await self._notify()

    async def _abort(self, producer: AIOKafkaProducer) -> None:
        # An open transaction holds back every read_committed reader of its partitions until
        # it times out: end it now if the producer still can (a fenced one cannot).
        try:
            async with asyncio.timeout(self._request_timeout_ms / 1000):
                await producer.abort_transaction()
        except Exception:
            _quiet_transaction(producer)

    async def _prune(self) -> None:
        now = asyncio.get_running_loop().time()
        if self._pruned_at is None or now - self._pruned_at > 3600:
            self._pruned_at = now
            await self._outbox.prune(self._retention_s)

    async def _judge(self, e: BaseException) -> None:
        """Name what stops publishing, once per change (one log line, no secret): a client
        that never connected is diagnosed by a connection of our own."""
        problem = await kafkaprobe.problem(e, self.bootstrap_servers, self.connection, self.topic)
        if problem is not None and problem != self.kafka_problem:
            log_event(
                log, "ledger cannot publish", logging.ERROR, problem=problem, depth=self.depth()
            )
        self.kafka_problem = problem or self.kafka_problem

    def _works(self) -> None:
        if self.kafka_problem is not None:
            log_event(log, "ledger publishes again", was=self.kafka_problem)
            self.kafka_problem = None

    def _client(self) -> dict[str, Any]:
        """Every client's connection keywords (the password file read anew: a rotated
        Secret is used from the next client on)."""
        return options(self.connection, self.bootstrap_servers)

    def _new_producer(self, holder: str) -> AIOKafkaProducer:
        return AIOKafkaProducer(
            **self._client(),
            client_id=self._client_id,
            transactional_id=transactional_id(holder, self.topic),
            acks="all",
            request_timeout_ms=self._request_timeout_ms,
        )

    async def _ensure_producer(self) -> AIOKafkaProducer:
        if self._producer is None:
            producer = self._new_producer(self.holder)
            try:
                # Registers the transactional id: aborts what an earlier process under our
                # name left open, and fences it.
                await producer.start()
            except BaseException:
                await producer.stop()
                raise
            self._producer = producer
            self._self_fenced.set()
        return self._producer

    async def _stop_producer(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            with contextlib.suppress(KafkaError, OSError):
                await producer.stop()

    # --- exactly once: fencing and reading the topic -------------------------------------

    async def _fence(self, holders: Iterable[str]) -> None:
        """Open and close a producer under each holder's transactional id: the broker aborts
        its open transaction and refuses any later commit of that holder's producer."""
        for holder in sorted(set(holders)):
            producer = self._new_producer(holder)
            try:
                async with asyncio.timeout(self._request_timeout_ms / 1000 * 2):
                    await producer.start()
            finally:
                await producer.stop()

    async def _committed(self, ids: set[str], since: float) -> set[str]:
        """Which of ``ids`` are on the topic, committed, from ``since`` (epoch seconds, less the
        clock margin) to the partitions' high watermarks now. Raises if it cannot tell."""
        since_ms = max(0, int((since - self._scan_margin_s) * 1000))
        # The probe gives the high watermarks (a read_committed ListOffsets gives the last
        # stable offset, which an open transaction holds back, possibly below a commit we
        # must see); the reader reads only committed records, so an aborted copy is no copy.
        probe = AIOKafkaConsumer(
            self.topic,
            **self._client(),
            client_id=f"{self._client_id}-scan",
            group_id=None,
            enable_auto_commit=False,
            request_timeout_ms=self._request_timeout_ms,
        )
        reader = AIOKafkaConsumer(
            **self._client(),
            client_id=f"{self._client_id}-scan",
            group_id=None,
            enable_auto_commit=False,
            isolation_level="read_committed",
            request_timeout_ms=self._request_timeout_ms,
        )
        try:
            async with asyncio.timeout(self._scan_timeout_s):
                await probe.start()
                await reader.start()
                return await _scan(probe, reader, self.topic, ids, since_ms)
        finally:
            await probe.stop()
            await reader.stop()

    # --- the cluster side: deleting and adopting records ---------------------------------

    def _forget(self, ids: Iterable[str]) -> None:
        """Queue published events' cluster records to become tombstones (lazy: nothing
        waits on it)."""
        before = len(self._to_delete)
        self._to_delete.update(ids)
        if len(self._to_delete) > before:
            self._delete_wake.set()

    async def _delete_loop(self) -> None:
        """Mark queued records published until ``close``, then what is still queued
        (``close``'s grace bounds it; a record left behind is found by a later recovery
        pass)."""
        assert self._cluster is not None
        while not self._closing.is_set() or self._to_delete:
            self._delete_wake.clear()
            ids, self._to_delete = sorted(self._to_delete), set()
            for event_id in ids:
                try:
                    await self._cluster.mark_published(event_id)
                except Exception as e:  # the recovery pass finds it later
                    log_event(
                        log,
                        "ledger record not marked published",
                        logging.WARNING,
                        event_id=event_id,
                        error=f"{type(e).__name__}: {e}"[:200],
                    )
            if not self._to_delete and not self._closing.is_set():
                await self._wait_for(self._delete_wake, self._closing)

    async def _recover_loop(self) -> None:
        swept_at = 0.0
        while not self._closing.is_set():
            now = asyncio.get_running_loop().time()
            if self._cluster is not None and now - swept_at > SWEEP_EVERY_S:
                swept_at = now
                with contextlib.suppress(Exception):  # the next sweep tries again
                    await self._cluster.sweep()
            if self.bootstrap_servers:
                try:
                    await self.recover_once()
                except Exception as e:  # the records stay; the next pass tries again
                    log_event(
                        log,
                        "ledger recovery failed, will retry",
                        logging.WARNING,
                        error=f"{type(e).__name__}: {e}"[:200],
                    )
            await self._backoff_sleep(random.uniform(0.5, 1.0) * self._recover_every_s)

    async def recover_once(self) -> int:
        """One pass over this topic's cluster records: adopt those whose holder is gone (and
        ours from an earlier life whose outbox is lost), publish what the topic does not have,
        delete the rest. Returns how many records were taken over."""
        if self._cluster is None or self._alive is None or not self.bootstrap_servers:
            return 0
        # Before the records are listed: a row left to a peer whose record is not in a later
        # listing was published by that peer (records become tombstones only once on the
        # topic, and tombstones are swept hours later).
        left_to_peers = await self._outbox.peers()
        listed = await self._cluster.records()
        await self._settle_left(left_to_peers, {r.event_id: r for r in listed})
        records = [r for r in listed if r.published_at is None]
        orphans: list[PendingEvent] = []
        verdict: dict[str, bool] = {}
        for rec in records:
            if rec.holder == self.holder:
                got = await self._outbox.get(rec.event_id)
                if got is None:
                    orphans.append(rec)  # an earlier life of ours wrote it; its disk is gone
                elif got[1]:
                    self._forget([rec.event_id])  # published; its deletion was lost
                continue
            if rec.holder not in verdict:
                verdict[rec.holder] = await self._alive(rec.holder)
            if not verdict[rec.holder]:
                orphans.append(rec)
        # Our own earlier life is fenced once our producer has registered our id; until then
        # (Kafka unreachable) adopting is pointless anyway: the topic cannot be read.
        if not orphans or not self._self_fenced.is_set():
            return 0
        async with self._settling:
            return await self._adopt(orphans)

    async def _adopt(self, orphans: list[PendingEvent]) -> int:
        """Take the orphans' records over, fence their earlier holders, publish what the topic
        lacks (``recover_once``, with the publisher's settling held off)."""
        assert self._cluster is not None
        taken: list[PendingEvent] = []
        for rec in orphans:
            mine = rec if rec.holder == self.holder else await self._cluster.adopt(rec)
            if mine is not None:
                taken.append(mine)
        if not taken:
            return 0
        # Fence every earlier holder before reading the topic: whatever they committed is then
        # visible, and none of them can commit a copy after we looked.
        await self._fence(h for rec in taken for h in rec.holders if h != self.holder)
        found = await self._committed(
            {rec.event_id for rec in taken}, min(rec.recorded_at.timestamp() for rec in taken)
        )
        # The topic, read after every earlier holder was fenced, is the only truth here: an
        # event it lacks is published from the record, whatever this outbox said of it.
        await self._outbox.mark_sent(sorted(found))
        for rec in taken:
            if rec.event_id in found:
                self._forget([rec.event_id])
            else:
                await self._outbox.adopt(rec.event_id, rec.key, rec.value, rec.headers)
        self.adopted += len(taken)
        self.found_published += len(found)
        self._wake.set()
        log_event(
            log,
            "ledger events adopted",
            count=len(taken),
            on_topic=len(found),
            holders=sorted({h for rec in taken for h in rec.holders}),
        )
        return len(taken)

    async def _settle_left(self, ids: list[str], records: Mapping[str, PendingEvent]) -> None:
        """Rows left to a peer: published once the record is gone or a tombstone; ours again
        if we hold it."""
        gone = [i for i in ids if i not in records or records[i].published_at is not None]
        if gone:
            await self._outbox.mark_sent(gone)
            await self._notify()
        for i in ids:
            rec = records.get(i)
            if rec is not None and rec.published_at is None and rec.holder == self.holder:
                await self._outbox.set_cluster(i, Cluster.HELD)
                self._wake.set()

    # --- waiting -------------------------------------------------------------------------

    async def _idle(self) -> None:
        """Wait for a new event (``record``) or ``close``."""
        await self._wait_for(self._wake, self._closing)

    async def _backoff_sleep(self, seconds: float) -> None:
        """Sleep out a backoff; only ``close`` cuts it short, a new event does not."""
        await self._wait_for(self._closing, limit_s=seconds)

    @staticmethod
    async def _wait_for(*events: asyncio.Event, limit_s: float | None = None) -> None:
        waits = [asyncio.ensure_future(e.wait()) for e in events]
        try:
            await asyncio.wait(waits, timeout=limit_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    # --- lifecycle -----------------------------------------------------------------------

    async def close(self, grace_s: float = 5.0) -> None:
        """Stop publishing and close the outbox; unsent events stay in it for the next start."""
        self._closing.set()
        task, self._task = self._task, None
        if task is not None:
            done, _ = await asyncio.wait({task}, timeout=grace_s)
            if not done:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await self._stop_producer()
        await self._outbox.close()

    async def __aenter__(self) -> LedgerWriter:
        self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


def _retrieve(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled():
        fut.exception()


def _quiet_transaction(producer: AIOKafkaProducer) -> None:
    """A fenced aiokafka producer fails its transaction's waiter (twice: the second replaces
    the first) and nobody awaits it: mark the current one read, so a fence is not also logged
    as "exception never retrieved" when it is collected."""
    manager = getattr(producer, "_txn_manager", None)
    waiter = getattr(manager, "wait_for_transaction_end", lambda: None)()
    if isinstance(waiter, asyncio.Future):
        waiter.add_done_callback(_retrieve)


async def _scan(
    probe: AIOKafkaConsumer,
    reader: AIOKafkaConsumer,
    topic: str,
    ids: set[str],
    since_ms: int,
) -> set[str]:
    parts = probe.partitions_for_topic(topic) or set()
    tps = [TopicPartition(topic, p) for p in sorted(parts)]
    if not tps:
        return set()
    high = await probe.end_offsets(tps)
    reader.assign(tps)
    starts = await reader.offsets_for_times({tp: since_ms for tp in tps})
    stable = await reader.end_offsets(tps)
    todo: dict[TopicPartition, int] = {}
    for tp in tps:
        at = starts.get(tp)
        # None: nothing at or after ``since`` below the stable offset; a commit may still sit
        # between it and the high watermark.
        start = at.offset if at is not None else stable[tp]
        if start < high[tp]:
            reader.seek(tp, start)
            todo[tp] = high[tp]
    found: set[str] = set()
    while todo:
        batch = await reader.getmany(*todo, timeout_ms=1000)
        for records in batch.values():
            for rec in records:
                eid = record_event_id(rec.headers, rec.value)
                if eid in ids:
                    found.add(eid)
        for tp in list(todo):
            if await reader.position(tp) >= todo[tp]:
                del todo[tp]
    return found


def record_event_id(headers: Iterable[tuple[str, bytes]], value: bytes | None) -> str | None:
    """The event id of a ledger record: its header, else the row's ``EventId``."""
    for name, raw in headers:
        if name == "event_id":
            return raw.decode("utf-8", "replace")
    try:
        doc = json.loads(value or b"")
    except ValueError:
        return None
    eid = doc.get("EventId") if isinstance(doc, dict) else None
    return eid if isinstance(eid, str) else None
