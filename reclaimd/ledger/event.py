"""The restart-waste event: one FOCUS-aligned row per gang, its Kafka key and headers.

``to_event`` writes the row (FinOps FOCUS column names, reclaimd's own facts in ``x_``
columns). Only enums, ids, times, numbers and allowed labels go in: no pod names, no workload
free text. The event id comes from notice + gang, so a consumer dedupes replays on
``EventId``. Since v2 the row also splits the loss by the instance each rank ran on
(``x_WasteByInstance``), so a gang spanning spot and on-demand nodes is priced part by part
(docs/ledger.md). ``encode`` gives what the outbox stores; ``record_event_id`` reads it back
from a record on the topic.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any, Final

from reclaimd import waste as waste_math
from reclaimd.ledger.labels import (
    PLACEMENT_KEYS,
    LabelPolicy,
    bounded,
    normalize_purchase_option,
    pricing_category,
)
from reclaimd.model import Cause, Placement, RestartWaste, rfc3339

SCHEMA: Final = "reclaimd.restart-waste/v2"
_TRACEPARENT = re.compile(r"[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")
MAX_KEY_BYTES: Final = 200


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
