"""What every part of ``make bench-peers`` shares: the storm's constants, NTH's rules, the
bench's one error and its small pure helpers (unit-tested)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[3]
NTH_BUILD = REPO / "deploy" / "local" / "nth" / "build.sh"
NTH_VERSION = "v1.25.6"
REGION, ZONE = "us-east-2", "us-east-2a"
LABEL = "reclaimd.io/bench-peers"
# Both consumers run as ServiceAccounts of the bench's own namespace: identities nobody else
# on the shared stack uses, so the requests counted for them are theirs alone.
BENCH_NAMESPACE = "bench-peers"
NTH_SA = "aws-node-termination-handler"
RECLAIMD_SA = "reclaimd"
SIDES = ("nth", "reclaimd")
PODS_PER_NODE = 2

# NTH's Helm chart ClusterRole (config/helm/aws-node-termination-handler/templates/
# clusterrole.yaml at v1.25.6), events omitted since EMIT_KUBERNETES_EVENTS is off.
NTH_RULES: list[dict[str, Any]] = [
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "patch", "update"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "get"]},
    {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]},
    {"apiGroups": ["extensions"], "resources": ["daemonsets"], "verbs": ["get"]},
    {"apiGroups": ["apps"], "resources": ["daemonsets"], "verbs": ["get"]},
]


class BenchError(Exception):
    """Something the bench cannot work around: one line, exit 2."""


# --- small pure helpers (unit-tested) ---------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile; None for no values."""
    ordered = sorted(values)
    if not ordered:
        return None
    k = max(0, min(len(ordered) - 1, round(q * (len(ordered) - 1))))
    return ordered[k]


def flow_counts(metrics_text: str, prefix: str) -> dict[str, dict[str, float]]:
    """From the apiserver's /metrics: dispatched and rejected requests per FlowSchema whose
    name starts with ``prefix``, as {"dispatched": {fs: n}, "rejected": {fs: n}}."""
    out: dict[str, dict[str, float]] = {"dispatched": {}, "rejected": {}}
    pattern = re.compile(
        r"^apiserver_flowcontrol_(dispatched|rejected)_requests_total\{([^}]*)\}\s+(\S+)"
    )
    for line in metrics_text.splitlines():
        m = pattern.match(line)
        if not m:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
        fs = labels.get("flow_schema", "")
        if fs.startswith(prefix):
            bucket = out[m.group(1)]
            bucket[fs] = bucket.get(fs, 0.0) + float(m.group(3))
    return out


def delta(
    after: dict[str, dict[str, float]], before: dict[str, dict[str, float]]
) -> dict[str, Any]:
    return {
        kind: {k: int(v - before.get(kind, {}).get(k, 0.0)) for k, v in after[kind].items()}
        for kind in after
    }


def ratio(slow: float | None, fast: float | None) -> float | None:
    if slow is None or fast is None or fast <= 0:
        return None
    return round(slow / fast, 1)
