"""The bench's cluster for ``make bench-peers``: how many nodes it may add, and each consumer's
ServiceAccount and RBAC (NTH's Helm chart rules, reclaimd's deploy/kubernetes/rbac.yaml)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from chaos.bench.peers.apiserver import FS_PREFIX
from chaos.bench.peers.common import BENCH_NAMESPACE, NTH_RULES, NTH_SA, RECLAIMD_SA

# --- wiring -----------------------------------------------------------------------------------


async def cluster_size(core: Any) -> dict[str, int]:
    """Nodes and pods in the whole cluster (one LIST of one item each): other engineers' load
    on the shared apiserver, recorded next to the figures."""
    out = {}
    for what, call in (("nodes", core.list_node), ("pods", core.list_pod_for_all_namespaces)):
        page = await call(limit=1)
        out[what] = len(page.items) + int(page.metadata.remaining_item_count or 0)
    return out


def nth_rbac() -> list[dict[str, Any]]:
    role = f"{FS_PREFIX}nth"
    return [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": NTH_SA, "namespace": BENCH_NAMESPACE},
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": role},
            "rules": NTH_RULES,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": role},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": role,
            },
            "subjects": [{"kind": "ServiceAccount", "name": NTH_SA, "namespace": BENCH_NAMESPACE}],
        },
    ]


def reclaimd_rbac(rbac: Path) -> list[dict[str, Any]]:
    """reclaimd's ServiceAccount, and a copy of each binding of deploy/kubernetes/rbac.yaml for
    it: exactly the rights reclaimd ships with."""
    docs: list[dict[str, Any]] = [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": RECLAIMD_SA, "namespace": BENCH_NAMESPACE},
        }
    ]
    for doc in yaml.safe_load_all(rbac.read_text()):
        if not doc or doc.get("kind") not in ("ClusterRoleBinding", "RoleBinding"):
            continue
        meta = {"name": f"{FS_PREFIX}{doc['metadata']['name']}"}
        if "namespace" in doc["metadata"]:
            meta["namespace"] = doc["metadata"]["namespace"]
        docs.append(
            {
                "apiVersion": doc["apiVersion"],
                "kind": doc["kind"],
                "metadata": meta,
                "roleRef": doc["roleRef"],
                "subjects": [
                    {"kind": "ServiceAccount", "name": RECLAIMD_SA, "namespace": BENCH_NAMESPACE}
                ],
            }
        )
    return docs
