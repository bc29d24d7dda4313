"""``make demo``'s money: an allocation meter and an hourly FOCUS bill over the storm drill's
fleet, so that ``reclaimd report`` prices the storm's restart waste as a cloud would.

No cloud bill exists on a laptop, and the drill runs minutes, not hours: this module writes
what the meter (``reclaimd.meter.row``, the rows ``reclaimd run`` writes) and AWS's FOCUS
export would have held for the storm's fleet over the hours that end with the storm's hour.
The fleet is the drill's plan (its nodes, their instance ids, its gangs on them: the names
the restart-waste events carry) plus a capacity reservation the storm does not touch (team-d's
inference queue on 8 reserved p5.48xlarge, 4 of each one's 8 GPUs held: reserved idle).

* every gang has held its GPUs since its pods started (the scenario's ``pod_age_s`` before
  the storm); a gang the storm charged stops when its restart-waste event says, the others
  hold to the end of the storm's hour;
* every instance is billed from its first pod's start (the autoscaler launched it for its
  job; a reserved one the whole span): a reclaimed spot instance (us-east-2a) until its last
  pod stopped, the others to the end of the storm's hour, so the GPUs a charged gang left
  behind on them are the report's ``unallocated``;
* prices per GPU-hour (p5.48xlarge, 8 GPUs; list and on-demand $12.29): on-demand $12.29
  (Standard), reserved $7.80 (Committed), spot $4.20 in us-east-2b and $7.40 in us-east-2a,
  where capacity ran short before the zone was reclaimed (spot prices differ by zone; the
  reclaim follows a shortage). So spot pays where the work saved its progress, and not for
  a queue whose jobs lose what they hold.
"""

from __future__ import annotations

import csv
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final

from reclaimd import meter, skus
from reclaimd.ledger.labels import LabelPolicy, cost_labels
from reclaimd.model import rfc3339
from reclaimd.report.ledger_input import WastePart

from .fleet import NodeSpec, node_body
from .scenario import Plan

HOURS: Final = 3  # the storm's hour and the two before it
ACCOUNT: Final = "111122223333"
LIST_RATE: Final = 12.29  # $/GPU-hour, p5.48xlarge on demand (list)
RESERVED_RATE: Final = 7.80
SPOT_RATE: Final = {"us-east-2a": 7.40, "us-east-2b": 4.20}
SPOT_RATE_ELSEWHERE: Final = 4.20
RESERVED_NODES: Final = 8
RESERVED_HELD_GPUS: Final = 4  # of each reserved node's 8, every hour: half the reservation idle
RESERVED_LABELS: Final = {"reclaimd.io/tenant": "team-d", "reclaimd.io/queue": "inference"}
FOCUS_COLUMNS: Final = (
    "BillingAccountId", "SubAccountId", "ProviderName", "ServiceName", "ServiceCategory",
    "ChargePeriodStart", "ChargePeriodEnd", "ChargeCategory", "ChargeClass", "ResourceId",
    "SkuId", "SkuMeter", "PricingCategory", "ConsumedQuantity", "ConsumedUnit",
    "EffectiveCost", "BilledCost", "ListCost", "BillingCurrency",
)  # fmt: skip


@dataclass(frozen=True)
class Holding:
    """GPUs one label set held on one node from ``since`` to ``until``."""

    node: NodeSpec
    pod_labels: dict[str, str]
    gpus: int
    since: datetime
    until: datetime


def reserved_nodes(run_id: str) -> list[NodeSpec]:
    return [
        NodeSpec(
            name=f"d{run_id}-rsv-{i}",
            instance_id=f"i-0rsv{run_id}{i:04d}",
            zone="us-east-2c",
            purchase_option="reserved",
            cell="use2-cell-3",
        )
        for i in range(RESERVED_NODES)
    ]


def _stop(w: WastePart) -> datetime:
    return w.stopped_at.replace(tzinfo=UTC)  # the report's parts are naive UTC


def storm_hours(waste: Sequence[WastePart]) -> tuple[datetime, datetime]:
    """The metered span: ``HOURS`` whole hours ending with the storm's."""
    first = min(_stop(w) for w in waste)
    end = first.replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
    return end - timedelta(hours=HOURS), end


def holdings(plan: Plan, waste: Sequence[WastePart]) -> list[Holding]:
    start, end = storm_hours(waste)
    storm = min(_stop(w) for w in waste)
    stopped = {w.gang_id.rsplit("/", 1)[-1]: _stop(w) for w in waste}
    nodes = {n.key: NodeSpec.planned(n) for n in plan.nodes}
    out = []
    for g in plan.gangs:
        labels = {"reclaimd.io/tenant": g.tenant, "reclaimd.io/queue": g.queue}
        since = max(start, storm - timedelta(seconds=g.pod_age_s))
        until = stopped.get(g.name, end)
        for r in g.ranks:
            out.append(Holding(nodes[r.node], labels, g.gpus_per_rank, since, until))
    for n in reserved_nodes(plan.run_id):
        out.append(Holding(n, RESERVED_LABELS, RESERVED_HELD_GPUS, start, end))
    return out


def _hours(since: datetime, until: datetime) -> Iterable[tuple[datetime, float]]:
    """Each hour the span touches and the seconds of it inside the span."""
    hour = since.replace(minute=0, second=0, microsecond=0)
    while hour < until:
        inside = (min(until, hour + timedelta(hours=1)) - max(since, hour)).total_seconds()
        if inside > 0:
            yield hour, inside
        hour += timedelta(hours=1)


def allocation_rows(held: Sequence[Holding], cluster: str) -> list[dict[str, Any]]:
    """The meter's closed rows, one per hour, node and label set (``meter.row``)."""
    policy = LabelPolicy()
    usage: dict[meter.Key, meter.Usage] = defaultdict(meter.Usage)
    facts: dict[str, meter.NodeFacts] = {}
    for h in held:
        node_labels = node_body(h.node)["metadata"]["labels"]
        facts[h.node.name] = meter.NodeFacts(labels=node_labels, provider_id=h.node.provider_id)
        tags = tuple(sorted(policy.tags(cost_labels(h.pod_labels, node_labels)).items()))
        spec = skus.lookup(h.node.sku)
        for hour, seconds in _hours(h.since, h.until):
            u = usage[meter.Key(hour, h.node.name, tags, "")]
            u.gpu_s += h.gpus * seconds
            u.hbm_gb_s += h.gpus * seconds * (spec.hbm_gb if spec else 0.0)
    return [meter.row(k, u, facts[k.node], cluster) for k, u in sorted(usage.items(), key=_order)]


def _order(item: tuple[meter.Key, meter.Usage]) -> tuple[datetime, str, str]:
    k = item[0]
    return k.hour, k.node, str(k.labels)


def rate(node: NodeSpec) -> tuple[float, str]:
    """$/GPU-hour and FOCUS PricingCategory of the node's instance."""
    if node.purchase_option == "spot":
        return SPOT_RATE.get(node.zone, SPOT_RATE_ELSEWHERE), "Dynamic"
    if node.purchase_option == "reserved":
        return RESERVED_RATE, "Committed"
    return LIST_RATE, "Standard"


def bill_rows(
    plan: Plan, waste: Sequence[WastePart], held: Sequence[Holding]
) -> list[dict[str, Any]]:
    """The hourly EC2 compute rows of the fleet's instances that held GPUs. An instance is
    billed from its first pod's start (the autoscaler launched it for its job; a reserved
    one the whole span: a reservation is paid whether used or not); a reclaimed one (a
    notice's target) until its last pod stopped, every other one to the end of the span."""
    start, end = storm_hours(waste)
    targets = {n.node for n in plan.notices if n.node is not None}
    reclaimed_nodes = {plan.node(k).name for k in targets}
    gone: dict[str, datetime] = {}
    for w in waste:
        if w.node in reclaimed_nodes:
            gone[w.node] = max(gone.get(w.node, _stop(w)), _stop(w))
    launched: dict[str, datetime] = {}
    nodes: dict[str, NodeSpec] = {}
    for h in held:
        nodes[h.node.name] = h.node
        launched[h.node.name] = min(launched.get(h.node.name, h.since), h.since)
    rows = []
    for name, node in sorted(nodes.items()):
        per_gpu, category = rate(node)
        since = start if node.purchase_option == "reserved" else launched[name]
        for hour, seconds in _hours(since, gone.get(name, end)):
            quantity = seconds / 3600.0
            rows.append(_focus_row(node, hour, quantity, per_gpu, category))
    return rows


def _focus_row(
    node: NodeSpec, hour: datetime, quantity: float, per_gpu: float, category: str
) -> dict[str, Any]:
    """One instance-hour's compute row: ``quantity`` instance-hours of the node's GPUs."""
    gpu_h = quantity * node.gpus
    cost = round(gpu_h * per_gpu, 6)
    return {
        "BillingAccountId": ACCOUNT,
        "SubAccountId": ACCOUNT,
        "ProviderName": "AWS",
        "ServiceName": "Amazon Elastic Compute Cloud",
        "ServiceCategory": "Compute",
        "ChargePeriodStart": rfc3339(hour),
        "ChargePeriodEnd": rfc3339(hour + timedelta(hours=1)),
        "ChargeCategory": "Usage",
        "ChargeClass": "",
        "ResourceId": f"arn:aws:ec2:us-east-2:{ACCOUNT}:instance/{node.instance_id}",
        "SkuId": node.sku,
        "SkuMeter": "",
        "PricingCategory": category,
        "ConsumedQuantity": round(quantity, 6),
        "ConsumedUnit": "Hrs",
        "EffectiveCost": cost,
        "BilledCost": cost,
        "ListCost": round(gpu_h * LIST_RATE, 6),
        "BillingCurrency": "USD",
    }


def write(plan: Plan, waste: Sequence[WastePart], out: Path, *, cluster: str) -> tuple[Path, Path]:
    """The meter's rows (JSON lines) and the bill (FOCUS CSV) under ``out``."""
    import json

    out.mkdir(parents=True, exist_ok=True)
    alloc, focus = out / "demo-allocation.jsonl", out / "demo-focus.csv"
    held = holdings(plan, waste)
    alloc.write_text("".join(json.dumps(r) + "\n" for r in allocation_rows(held, cluster)))
    with focus.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FOCUS_COLUMNS)
        w.writeheader()
        w.writerows(bill_rows(plan, waste, held))
    return alloc, focus
