"""What the cluster cache keeps of nodes, GPU pods and Kueue Workloads, and its indexes.

A node is kept as the fields a claim and a target's resolution read (``NodeRecord``), a GPU pod
as its index keys plus the slim pod compressed (``PodRecord``: only pods that hold GPUs and have
not finished, and of each only the fields the gang logic reads). ``Indexes`` holds them all,
indexed by what a notice names (instance id, provider ID, node, Workload, owner), and the pods
that left, by uid. It is updated synchronously on the event loop (no awaits inside), so a
query never sees an index half-updated.
"""

from __future__ import annotations

import json
import sys
import zlib
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from reclaimd.cluster import gangs
from reclaimd.cluster.watch import RawObject
from reclaimd.model import GangKey, utcnow
from reclaimd.sources import instance_of

PodId = tuple[str, str]  # namespace, name
# The pods that left the cache, by uid, with when: a successor draining a dead owner's gang
# finds its pods gone and charges them to when they went, not to when it looked; and a notice
# whose gang left before it was resolved (Kueue deletes a reclaimed Workload's pods itself)
# still finds the gang. Bounded: a storm's worth.
MAX_GONE = 20_000

# Node metadata that names the cloud instance when the providerID does not (or in another
# form: GKE's numeric instance id is what the preemption log entry carries).
INSTANCE_ID_KEYS = (
    "container.googleapis.com/instance_id",
    "alpha.eksctl.io/instance-id",
    "reclaimd.io/instance-id",
)
# Pod annotations worth keeping: the contract's and the integrations'. Others (notably
# kubectl's last-applied-configuration) can be large and are never read.
KEPT_ANNOTATION_PREFIXES = (
    "reclaimd.io/",
    "kueue.x-k8s.io/",
    "scheduling.k8s.io/",
    "volcano.sh/",
    "jobset.sigs.k8s.io/",
    "leaderworkerset.sigs.k8s.io/",
    "training.kubeflow.org/",
    "batch.kubernetes.io/",
)


def instance_ids(node: RawObject) -> frozenset[str]:
    """Every cloud instance id a node answers to.

    The one its providerID names (``sources.instance_of``), plus the node metadata keys in
    ``INSTANCE_ID_KEYS``.
    """
    found: set[str] = set()
    if instance := instance_of(str((node.get("spec") or {}).get("providerID") or "")):
        found.add(instance)
    meta = node.get("metadata") or {}
    for source in (meta.get("labels") or {}, meta.get("annotations") or {}):
        for key in INSTANCE_ID_KEYS:
            if value := source.get(key):
                found.add(str(value))
    return frozenset(found)


def slim_pod(pod: RawObject) -> dict[str, Any]:
    """The fields of a pod the gang logic reads; everything else is dropped."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}

    def gpu_resources(resources: Any) -> dict[str, Any]:
        # Only GPU quantities are ever read; CPU and memory would be a quarter of the pod.
        if not isinstance(resources, Mapping):
            return {}
        return {
            kind: {n: q for n, q in amounts.items() if gangs.is_gpu_resource(str(n))}
            for kind in ("limits", "requests")
            if isinstance(amounts := resources.get(kind), Mapping)
        }

    def containers(key: str) -> list[dict[str, Any]]:
        return [
            {
                "name": c.get("name"),
                "resources": gpu_resources(c.get("resources")),
                **({"restartPolicy": c["restartPolicy"]} if "restartPolicy" in c else {}),
            }
            for c in spec.get(key) or ()
            if isinstance(c, Mapping)
        ]

    return {
        "metadata": {
            "name": meta.get("name"),
            "namespace": meta.get("namespace"),
            "uid": meta.get("uid"),
            "labels": dict(meta.get("labels") or {}),
            "annotations": {
                k: v
                for k, v in (meta.get("annotations") or {}).items()
                if k.startswith(KEPT_ANNOTATION_PREFIXES)
            },
            "ownerReferences": list(meta.get("ownerReferences") or ()),
            **(
                {"deletionTimestamp": meta["deletionTimestamp"]}
                if meta.get("deletionTimestamp")
                else {}
            ),
        },
        "spec": {
            "nodeName": spec.get("nodeName"),
            "containers": containers("containers"),
            "initContainers": containers("initContainers"),
        },
        "status": {
            **{k: status[k] for k in ("phase", "podIP", "startTime") if k in status},
            # when the pod became Ready: a restarted gang is training again (``restarts``)
            **({"readyAt": ready} if (ready := gangs.ready_since(status)) else {}),
        },
    }


# The claim annotation (``claims.CLAIM_ANNOTATION``; claims imports the cache, which imports
# this module, so the name is repeated here rather than imported).
CLAIM_ANNOTATION = "reclaimd.io/claim"
_TAINT_FIELDS = ("key", "value", "effect", "timeAdded")

Taint = dict[str, Any]


@dataclass(frozen=True, slots=True)
class NodeView:
    """What the storm fast path needs to write claim + taint + cordon in one PATCH with a
    resourceVersion precondition, without a GET first."""

    name: str
    resource_version: str
    unschedulable: bool
    taints: tuple[Taint, ...]
    """In API form (camelCase keys, string values, absent fields left out)."""
    claim_text: str | None
    """The raw ``reclaimd.io/claim`` annotation; None when the node carries none."""
    labels: Mapping[str, str]


def node_taints(spec: Mapping[str, Any]) -> tuple[Taint, ...]:
    """A node's taints in API form: only the four fields a taint has, as strings."""
    return tuple(
        {k: str(t[k]) for k in _TAINT_FIELDS if t.get(k) is not None}
        for t in spec.get("taints") or ()
        if isinstance(t, Mapping)
    )


@dataclass(frozen=True, slots=True)
class NodeRecord:
    name: str
    provider_id: str
    instance_ids: tuple[str, ...]
    label_pairs: tuple[str, ...]
    """key, value, key, value...: a third of a dict's size; ``labels`` rebuilds the dict."""
    resource_version: str
    unschedulable: bool
    taints: tuple[Taint, ...]
    claim_text: str | None

    @property
    def labels(self) -> dict[str, str]:
        pairs = self.label_pairs
        return dict(zip(pairs[::2], pairs[1::2], strict=True))


def _interned_pairs(values: Mapping[str, Any]) -> tuple[str, ...]:
    # Label keys and most values repeat across thousands of nodes: share one copy of each.
    return tuple(sys.intern(str(x)) for k, v in values.items() for x in (k, v))


def node_record(obj: RawObject) -> NodeRecord | None:
    """What the cache keeps of a node (None for a node without a name)."""
    meta = obj.get("metadata") or {}
    name = str(meta.get("name") or "")
    if not name:
        return None
    spec = obj.get("spec") or {}
    claim = (meta.get("annotations") or {}).get(CLAIM_ANNOTATION)
    return NodeRecord(
        name=sys.intern(name),
        provider_id=str(spec.get("providerID") or ""),
        instance_ids=tuple(sorted(instance_ids(obj))),
        label_pairs=_interned_pairs(meta.get("labels") or {}),
        resource_version=str(meta.get("resourceVersion") or ""),
        unschedulable=bool(spec.get("unschedulable")),
        taints=node_taints(spec),
        claim_text=None if claim is None else str(claim),
    )


@dataclass(frozen=True, slots=True)
class PodRecord:
    """A cached GPU pod: its index keys, and the slim pod as compressed compact JSON.

    That is several times smaller than the same pod as dicts, and is decoded only when a
    notice needs the pod's gang (a few pods per notice, tens of microseconds each).
    """

    pid: PodId
    uid: str
    node: str
    gang: GangKey
    workload_names: tuple[str, ...]
    owner_uids: tuple[str, ...]
    blob: bytes

    def decode(self) -> dict[str, Any]:
        pod: dict[str, Any] = json.loads(zlib.decompress(self.blob))
        return pod


def pod_record(obj: RawObject) -> PodRecord | None:
    """What the cache keeps of a pod: None unless it holds GPUs and has not finished."""
    name = gangs.name_of(obj)
    if not name or not gangs.is_gang_member(obj):
        return None
    pod = slim_pod(obj)
    return PodRecord(
        pid=(sys.intern(gangs.namespace_of(obj)), name),
        uid=gangs.uid_of(pod),
        node=sys.intern(gangs.node_of(pod)),
        gang=gangs.gang_key(pod),
        workload_names=tuple(gangs.workload_names(pod)),
        owner_uids=tuple(gangs.owner_uids(pod)),
        blob=zlib.compress(json.dumps(pod, separators=(",", ":")).encode(), 1),
    )


@dataclass(frozen=True)
class WorkloadRecord:
    uid: str
    job_uids: frozenset[str]


class Indexes:
    """Every index, updated together; no awaits inside, so readers see whole updates.

    ``replace_*`` take raw objects or the records an endpoint's projection already made."""

    def __init__(self) -> None:
        self.nodes: dict[str, NodeRecord] = {}
        self.by_provider: dict[str, str] = {}
        self.by_instance: dict[str, str] = {}
        self.pods: dict[PodId, PodRecord] = {}
        self.by_node: defaultdict[str, set[PodId]] = defaultdict(set)
        self.by_gang: defaultdict[GangKey, set[PodId]] = defaultdict(set)
        self.by_workload_name: defaultdict[tuple[str, str], set[PodId]] = defaultdict(set)
        self.by_owner_uid: defaultdict[tuple[str, str], set[PodId]] = defaultdict(set)
        self.workloads: dict[tuple[str, str], WorkloadRecord] = {}
        # pod uid -> when it left, and what it was (oldest first)
        self.gone: dict[str, tuple[datetime, PodRecord]] = {}
        self.changes = 0  # pods added or dropped: the snapshot is written when it moved

    # nodes

    def replace_nodes(self, objects: Iterable[RawObject | NodeRecord]) -> None:
        self.nodes.clear()
        self.by_provider.clear()
        self.by_instance.clear()
        for obj in objects:
            node = obj if isinstance(obj, NodeRecord) else node_record(obj)
            if node is not None:
                self._add_node(node)

    def put_node(self, obj: RawObject) -> None:
        node = node_record(obj)
        if node is not None:
            self.drop_node(node.name)
            self._add_node(node)

    def _add_node(self, node: NodeRecord) -> None:
        self.nodes[node.name] = node
        if node.provider_id:
            self.by_provider[node.provider_id] = node.name
        for iid in node.instance_ids:
            self.by_instance[iid] = node.name

    def drop_node(self, name: str) -> None:
        old = self.nodes.pop(name, None)
        if old is None:
            return
        if self.by_provider.get(old.provider_id) == name:
            del self.by_provider[old.provider_id]
        for iid in old.instance_ids:
            if self.by_instance.get(iid) == name:
                del self.by_instance[iid]

    # pods

    def replace_pods(self, namespace: str, objects: Iterable[RawObject | PodRecord]) -> None:
        for pid in [p for p in self.pods if not namespace or p[0] == namespace]:
            self.drop_pod(pid)
        for obj in objects:
            pod = obj if isinstance(obj, PodRecord) else pod_record(obj)
            if pod is not None:
                self.drop_pod(pod.pid)
                self._add_pod(pod)

    def put_pod(self, obj: RawObject) -> None:
        # Dropped first: a pod that finished or lost its GPUs leaves the cache.
        self.drop_pod((gangs.namespace_of(obj), gangs.name_of(obj)))
        pod = pod_record(obj)
        if pod is not None:
            self._add_pod(pod)

    def _add_pod(self, pod: PodRecord) -> None:
        pid = pod.pid
        self.changes += 1
        self.gone.pop(pod.uid, None)  # back (a relist drops and re-adds every pod)
        self.pods[pid] = pod
        self.by_gang[pod.gang].add(pid)
        if pod.node:
            self.by_node[pod.node].add(pid)
        for name in pod.workload_names:
            self.by_workload_name[(pid[0], name)].add(pid)
        for uid in pod.owner_uids:
            self.by_owner_uid[(pid[0], uid)].add(pid)

    def drop_pod(self, pid: PodId) -> None:
        pod = self.pods.pop(pid, None)
        if pod is None:
            return
        self.changes += 1
        self.mark_gone(pod, utcnow())  # deleted, finished, no GPUs: stopped, as far as we know
        _discard(self.by_gang, pod.gang, pid)
        _discard(self.by_node, pod.node, pid)
        for name in pod.workload_names:
            _discard(self.by_workload_name, (pid[0], name), pid)
        for uid in pod.owner_uids:
            _discard(self.by_owner_uid, (pid[0], uid), pid)

    def mark_gone(self, pod: PodRecord, at: datetime) -> None:
        if not pod.uid:
            return
        self.gone.pop(pod.uid, None)  # to the end: the dict stays in the order they left
        self.gone[pod.uid] = (at, pod)
        if len(self.gone) > MAX_GONE:
            del self.gone[next(iter(self.gone))]

    # workloads

    def replace_workloads(self, namespace: str, objects: Iterable[RawObject]) -> None:
        for wid in [w for w in self.workloads if not namespace or w[0] == namespace]:
            del self.workloads[wid]
        for obj in objects:
            self.put_workload(obj)

    def put_workload(self, obj: RawObject) -> None:
        meta = obj.get("metadata") or {}
        wid = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        job_uids = {str((meta.get("labels") or {}).get(gangs.KUEUE_JOB_UID) or "")}
        job_uids |= {
            str(ref.get("uid") or "")
            for ref in meta.get("ownerReferences") or ()
            if isinstance(ref, Mapping) and ref.get("controller")
        }
        self.workloads[wid] = WorkloadRecord(
            str(meta.get("uid") or ""), frozenset(u for u in job_uids if u)
        )

    def drop_workload(self, obj: RawObject) -> None:
        meta = obj.get("metadata") or {}
        self.workloads.pop((str(meta.get("namespace") or ""), str(meta.get("name") or "")), None)


def _discard(index: defaultdict[Any, set[PodId]], key: Any, pid: PodId) -> None:
    members = index.get(key)
    if members is not None:
        members.discard(pid)
        if not members:
            del index[key]
