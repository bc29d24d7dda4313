"""The ledger's label contract: where each cost label comes from, and what may reach an event.

``cost_labels`` maps pod and node labels to the five cost keys (tenant, queue, sku, cell,
purchase_option); ``placement`` says where a node is, for pricing; ``LabelPolicy`` decides which
labels reach an event's ``Tags``. Keys outside the allowlist, and keys that carry user data
whatever the allowlist says (``prompt``, ``user_email``, ``session_raw``), are dropped and
counted; a value longer than 63 characters or outside ``[A-Za-z0-9._-]`` is dropped and
counted. Nothing here raises into the pipeline or logs a refused value: the ledger is joined
with billing data and kept for months, so what gets in must be bounded in cardinality and free
of user content.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Final

from reclaimd.sources import instance_of

DEFAULT_ALLOW: Final = ("tenant", "queue", "sku", "cell", "purchase_option")
# Refused whatever the allowlist says: a misconfigured allowlist must not open these.
ALWAYS_REFUSED: Final = frozenset({"prompt", "user_email", "session_raw"})
# Facts the cluster side passes beside the cost labels; they feed x_ columns, not Tags.
FACT_KEYS: Final = frozenset({"mig_profile"})
MAX_VALUE_LEN: Final = 63  # a Kubernetes label value's limit
_VALUE = re.compile(r"[A-Za-z0-9._-]+")

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
