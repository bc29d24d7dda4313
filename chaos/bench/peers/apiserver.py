"""``make bench-peers`` counting each consumer's requests at the apiserver: a FlowSchema per
resource and verb for each ServiceAccount, and the dispatched-requests counter before and after."""

from __future__ import annotations

import json
import ssl
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from chaos.bench.peers.common import LABEL, BenchError

# --- counting requests at the apiserver -------------------------------------------------------

# (bucket, apiGroup, resource, verbs): one FlowSchema each per identity, most specific first.
BUCKETS: list[tuple[str, str, str, list[str]]] = [
    ("node-get", "", "nodes", ["get"]),
    ("node-list", "", "nodes", ["list"]),
    ("node-watch", "", "nodes", ["watch"]),
    ("node-patch", "", "nodes", ["patch"]),
    ("node-update", "", "nodes", ["update"]),
    ("pod-get", "", "pods", ["get"]),
    ("pod-list", "", "pods", ["list"]),
    ("pod-watch", "", "pods", ["watch"]),
    ("pod-delete", "", "pods", ["delete"]),
    ("pod-evict", "", "pods/eviction", ["create"]),
    ("lease-read", "coordination.k8s.io", "leases", ["get", "list", "watch"]),
    ("lease-write", "coordination.k8s.io", "leases", ["*"]),
    ("other-read", "*", "*", ["get", "list", "watch"]),
    ("other-write", "*", "*", ["*"]),
    ("non-resource", "", "", ["*"]),  # discovery, /version, /healthz: reads
]
READ_BUCKETS = {b for b, _, r, verbs in BUCKETS if not r or set(verbs) <= {"get", "list", "watch"}}
FS_PREFIX = "bench-peers-"


def flow_schemas(side: str, subject: dict[str, Any], priority_level: str) -> list[dict[str, Any]]:
    docs = []
    for i, (bucket, group, resource, verbs) in enumerate(BUCKETS):
        rule: dict[str, Any] = {"subjects": [subject]}
        if resource:
            rule["resourceRules"] = [
                {
                    "verbs": verbs,
                    "apiGroups": [group],
                    "resources": [resource],
                    "clusterScope": True,
                    "namespaces": ["*"],
                }
            ]
        else:
            rule["nonResourceRules"] = [{"verbs": verbs, "nonResourceURLs": ["*"]}]
        docs.append(
            {
                "apiVersion": "flowcontrol.apiserver.k8s.io/v1",
                "kind": "FlowSchema",
                "metadata": {"name": f"{FS_PREFIX}{side}-{bucket}", "labels": {LABEL: "apf"}},
                "spec": {
                    "priorityLevelConfiguration": {"name": priority_level},
                    # After the system schemas (<= 900), before service-accounts (9000) and
                    # global-default (9900), which these identities would otherwise match.
                    "matchingPrecedence": 1000 + (0 if side == "nth" else 100) + i,
                    "distinguisherMethod": {"type": "ByUser"},
                    "rules": [rule],
                },
            }
        )
    return docs


def summarize_requests(counts: dict[str, Any], side: str) -> dict[str, Any]:
    """Per bucket, plus reads / writes / total and the APF rejections (429s)."""
    prefix = f"{FS_PREFIX}{side}-"
    by = {
        k.removeprefix(prefix): v for k, v in counts["dispatched"].items() if k.startswith(prefix)
    }
    by = {k: v for k, v in sorted(by.items()) if v}
    rejected = sum(v for k, v in counts["rejected"].items() if k.startswith(prefix))
    reads = sum(v for k, v in by.items() if k in READ_BUCKETS)
    total = sum(by.values())
    return {"total": total, "reads": reads, "writes": total - reads, "rejected": rejected, "by": by}


@dataclass
class Apiserver:
    """The stack's apiserver as admin (client certificate), for /metrics and probes."""

    url: str
    ca: Path
    cert: Path
    key: Path

    def _get(self, path: str, headers: dict[str, str] | None = None, *, admin: bool = True) -> Any:
        ctx = ssl.create_default_context(cafile=str(self.ca))
        if admin:
            ctx.load_cert_chain(str(self.cert), str(self.key))
        req = urllib.request.Request(self.url + path, headers=headers or {})
        return urllib.request.urlopen(req, context=ctx, timeout=30)

    def metrics(self) -> str:
        with self._get("/metrics") as r:
            return cast(bytes, r.read()).decode()

    def priority_level_of(self, token: str, timeout_s: float = 30) -> str:
        """The APF priority level a request with this token lands on (a response header),
        once the token may list nodes (a new binding takes a moment to reach the authorizer)."""
        ctx = ssl.create_default_context(cafile=str(self.ca))
        headers = {"Authorization": f"Bearer {token}"}
        req = urllib.request.Request(self.url + "/api/v1/nodes?limit=1", headers=headers)
        end = time.monotonic() + timeout_s
        while True:
            try:
                with urllib.request.urlopen(req, context=ctx, timeout=30) as r:
                    uid = r.headers.get("X-Kubernetes-PF-PriorityLevel-UID", "")
                break
            except urllib.error.HTTPError as e:
                if e.code != 403 or time.monotonic() > end:
                    raise BenchError(f"a bench identity cannot list nodes: HTTP {e.code}") from e
                time.sleep(0.3)
        path = "/apis/flowcontrol.apiserver.k8s.io/v1/prioritylevelconfigurations"
        with self._get(path) as r:
            items = json.loads(r.read())["items"]
        for item in items:
            if item["metadata"]["uid"] == uid:
                return str(item["metadata"]["name"])
        raise BenchError(f"no priority level with uid {uid!r} (is APF on?)")
