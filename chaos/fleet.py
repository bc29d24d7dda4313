"""Build a fake GPU cluster on kwok: nodes with GPU capacity and gangs of GPU pods.

Used by ``make demo``, the e2e tests, the bench and the drills. Nodes carry the annotation kwok
manages (``kwok.x-k8s.io/node: fake``), a providerID like a real cloud's, GPU capacity and the
cost labels a real fleet has; pods are bound with ``spec.nodeName`` (no scheduler needed) and
opt in to the checkpoint contract with annotations pointing at a fake trainer on loopback.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from kubernetes_asyncio import client as k8s
from kubernetes_asyncio.client.rest import ApiException

from reclaimd import annotations as ann
from reclaimd.model import rfc3339, utcnow

if TYPE_CHECKING:
    from chaos.drill.plan import PlannedNode

GPU = "nvidia.com/gpu"
T = TypeVar("T")


@dataclass(frozen=True)
class NodeSpec:
    name: str
    instance_id: str
    zone: str = "us-east-2a"
    gpus: int = 8
    sku: str = "p5.48xlarge"
    purchase_option: str = "spot"
    cell: str = ""
    cloud: str = "aws"  # aws, gce or azure (instance_id: the VM, ``<vmss>_<n>``)
    project: str = "reclaimd-local"  # gce; azure: names the resource group

    @classmethod
    def planned(cls, n: PlannedNode) -> NodeSpec:
        """The node a scenario's plan names, as the fleet creates it."""
        return cls(
            name=n.name,
            instance_id=n.instance_id,
            zone=n.zone,
            gpus=n.gpus,
            sku=n.sku,
            purchase_option=n.purchase_option,
            cell=n.cell,
            cloud=n.cloud.value,
            project=n.project,
        )

    @property
    def provider_id(self) -> str:
        if self.cloud == "gce":
            return f"gce://{self.project}/{self.zone}/{self.name}"
        if self.cloud == "azure":
            scale_set, instance = self.instance_id.rsplit("_", 1)
            return (
                f"azure:///subscriptions/{AZURE_SUBSCRIPTION}/resourceGroups/"
                f"{azure_resource_group(self.project).lower()}/providers/Microsoft.Compute/"
                f"virtualMachineScaleSets/{scale_set}/virtualMachines/{instance}"
            )
        return f"aws:///{self.zone}/{self.instance_id}"


# A drill's AKS nodes: one subscription, a node resource group per project (as AKS names its
# MC_<group>_<cluster>_<region>), written lowercased into the providerID as AKS does.
AZURE_SUBSCRIPTION = "8d1a5e3c-0f1b-4c2a-9e7d-2b6f4a1c9e00"


def azure_resource_group(project: str) -> str:
    return f"MC_{project}_aks"


@dataclass(frozen=True)
class RankSpec:
    node: str
    checkpoint_url: str = ""  # empty: not opted in
    last_checkpoint: datetime | None = None


@dataclass(frozen=True)
class GangSpec:
    """One multi-pod job. Pods are labelled as a JobSet so gang resolution has real keys."""

    name: str
    ranks: Sequence[RankSpec]
    gpus_per_rank: int = 8
    tenant: str = "team-a"
    queue: str = "research"
    scope: str = "rank"
    checkpoint_timeout: str = "45s"
    extra_labels: Mapping[str, str] = field(default_factory=dict)
    incarnation: int = 0  # a gang made again after its pods were evicted: pods of new names

    def pod_name(self, rank: int) -> str:
        if self.incarnation:
            return f"{self.name}-i{self.incarnation}-{rank}"
        return f"{self.name}-{rank}"


def node_body(spec: NodeSpec) -> dict[str, Any]:
    labels = {
        "type": "kwok",
        "kubernetes.io/hostname": spec.name,
        "node.kubernetes.io/instance-type": spec.sku,
        "topology.kubernetes.io/zone": spec.zone,
        "reclaimd.io/purchase-option": spec.purchase_option,
    }
    if spec.cloud == "aws":
        labels["karpenter.sh/capacity-type"] = spec.purchase_option.replace("_", "-")
    if spec.cloud == "azure" and spec.purchase_option == "spot":
        labels["kubernetes.azure.com/scalesetpriority"] = "spot"  # AKS Spot pools only
    if spec.cell:
        labels["reclaimd.io/cell"] = spec.cell
    capacity = {"cpu": "192", "memory": "2048Gi", "pods": "110", GPU: str(spec.gpus)}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": spec.name,
            "labels": labels,
            "annotations": {"kwok.x-k8s.io/node": "fake"},
        },
        "spec": {"providerID": spec.provider_id},
        "status": {"capacity": capacity, "allocatable": capacity},
    }


def pod_body(gang: GangSpec, rank: int, namespace: str) -> dict[str, Any]:
    spec = gang.ranks[rank]
    labels = {
        "jobset.sigs.k8s.io/jobset-name": gang.name,
        "jobset.sigs.k8s.io/replicatedjob-name": "workers",
        "jobset.sigs.k8s.io/job-index": str(rank),
        "reclaimd.io/tenant": gang.tenant,
        "kueue.x-k8s.io/queue-name": gang.queue,
        **gang.extra_labels,
    }
    annotations = {ann.RANK: str(rank)}
    if rank == 0:
        annotations[ann.LEADER] = "true"
    if spec.checkpoint_url:
        annotations[ann.CHECKPOINT_URL] = spec.checkpoint_url
        annotations[ann.CHECKPOINT_TIMEOUT] = gang.checkpoint_timeout
        annotations[ann.CHECKPOINT_SCOPE] = gang.scope
    if spec.last_checkpoint is not None:
        annotations[ann.LAST_CHECKPOINT] = rfc3339(spec.last_checkpoint)
    gpus = str(gang.gpus_per_rank)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": gang.pod_name(rank),
            "namespace": namespace,
            "labels": labels,
            "annotations": annotations,
        },
        "spec": {
            "nodeName": spec.node,
            "terminationGracePeriodSeconds": 5,
            "automountServiceAccountToken": False,
            "tolerations": [{"operator": "Exists", "effect": "NoSchedule"}],
            "containers": [
                {
                    "name": "trainer",
                    "image": "registry.invalid/trainer:fake",
                    "resources": {"limits": {GPU: gpus}, "requests": {GPU: gpus}},
                }
            ],
        },
    }


async def ensure_namespace(api: k8s.ApiClient, name: str) -> None:
    """The namespace, and for a new one its ``default`` ServiceAccount: pods are refused
    (403) until it exists, and the controller-manager that makes it may lag behind a
    restarted apiserver (a campaign restarts it run after run)."""
    core = k8s.CoreV1Api(api)
    try:
        await core.create_namespace(_any({"metadata": {"name": name}}))
    except ApiException as e:
        if e.status != 409:
            raise
        return  # there already (its ServiceAccount too, or it is being deleted)
    try:
        await core.create_namespaced_service_account(name, _any({"metadata": {"name": "default"}}))
    except ApiException as e:
        if e.status != 409:
            raise


async def create_nodes(api: k8s.ApiClient, nodes: Iterable[NodeSpec]) -> None:
    core = k8s.CoreV1Api(api)
    for spec in nodes:
        try:
            await core.create_node(_any(node_body(spec)))
        except ApiException as e:
            if e.status != 409:
                raise


async def create_gang(api: k8s.ApiClient, gang: GangSpec, namespace: str) -> list[str]:
    core = k8s.CoreV1Api(api)
    names = []
    for rank in range(len(gang.ranks)):
        await core.create_namespaced_pod(namespace, _any(pod_body(gang, rank, namespace)))
        names.append(gang.pod_name(rank))
    return names


async def wait_running(
    api: k8s.ApiClient, namespace: str, names: Sequence[str], timeout_s: float = 60
) -> None:
    """Until kwok reports every pod Running (and has given it an IP)."""
    core = k8s.CoreV1Api(api)
    end = asyncio.get_running_loop().time() + timeout_s
    pending = set(names)
    while pending:
        for name in sorted(pending):
            pod = await core.read_namespaced_pod(name, namespace)
            if pod.status and pod.status.phase == "Running":
                pending.discard(name)
        if pending:
            if asyncio.get_running_loop().time() > end:
                raise TimeoutError(f"pods not Running after {timeout_s}s: {sorted(pending)[:5]}")
            await asyncio.sleep(0.2)


async def wait_nodes_ready(api: k8s.ApiClient, names: Sequence[str], timeout_s: float = 60) -> None:
    core = k8s.CoreV1Api(api)
    end = asyncio.get_running_loop().time() + timeout_s
    pending = set(names)
    while pending:
        for name in sorted(pending):
            node = await core.read_node(name)
            conditions = (node.status.conditions or []) if node.status else []
            if any(c.type == "Ready" and c.status == "True" for c in conditions):
                pending.discard(name)
        if pending:
            if asyncio.get_running_loop().time() > end:
                raise TimeoutError(f"nodes not Ready after {timeout_s}s: {sorted(pending)[:5]}")
            await asyncio.sleep(0.2)


async def delete_nodes(api: k8s.ApiClient, names: Iterable[str]) -> None:
    core = k8s.CoreV1Api(api)
    for name in names:
        try:
            await core.delete_node(name)
        except ApiException as e:
            if e.status != 404:
                raise


def _any(body: dict[str, Any]) -> Any:
    # The client accepts plain dicts; its stubs only name the model classes.
    return body


def ago(seconds: float) -> datetime:
    return utcnow() - timedelta(seconds=seconds)


# --- drills: hundreds of objects, created with bounded concurrency --------------------------

DRILL_LABEL = "reclaimd.io/drill"


async def bounded(coros: Iterable[Awaitable[T]], limit: int = 8) -> list[T]:
    """Await ``coros`` at most ``limit`` at a time (the apiserver and kwok share 2 cores)."""
    gate = asyncio.Semaphore(limit)

    async def one(c: Awaitable[T]) -> T:
        async with gate:
            return await c

    return await asyncio.gather(*(one(c) for c in coros))


async def create_nodes_labelled(
    api: k8s.ApiClient, nodes: Sequence[NodeSpec], labels: Mapping[str, str], limit: int = 8
) -> None:
    """``create_nodes`` with extra labels (a drill's run label), ``limit`` at a time."""
    core = k8s.CoreV1Api(api)

    async def one(spec: NodeSpec) -> None:
        body = node_body(spec)
        body["metadata"]["labels"].update(labels)
        try:
            await core.create_node(_any(body))
        except ApiException as e:
            if e.status != 409:
                raise

    await bounded((one(s) for s in nodes), limit)


async def create_gangs(
    api: k8s.ApiClient, gangs: Sequence[GangSpec], namespace: str, limit: int = 8
) -> list[str]:
    """Every pod of every gang, ``limit`` creates at a time; the pod names."""
    core = k8s.CoreV1Api(api)
    work = [(g, r) for g in gangs for r in range(len(g.ranks))]

    async def one(gang: GangSpec, rank: int) -> str:
        await core.create_namespaced_pod(namespace, _any(pod_body(gang, rank, namespace)))
        return gang.pod_name(rank)

    return await bounded((one(g, r) for g, r in work), limit)


async def wait_listed(
    api: k8s.ApiClient,
    *,
    what: str,
    names: Collection[str],
    ready: Callable[[Any], bool],
    list_call: Callable[[], Awaitable[Any]],
    timeout_s: float = 120,
) -> dict[str, Any]:
    """Until every object in ``names`` is ``ready`` in one LIST (one request per round rather
    than one per object); returns them by name."""
    end = asyncio.get_running_loop().time() + timeout_s
    while True:
        listed = {o.metadata.name: o for o in (await list_call()).items}
        pending = [n for n in names if n not in listed or not ready(listed[n])]
        if not pending:
            return {n: listed[n] for n in names}
        if asyncio.get_running_loop().time() > end:
            raise TimeoutError(f"{len(pending)} {what} not ready after {timeout_s}s: {pending[:3]}")
        await asyncio.sleep(0.5)


def node_is_ready(node: Any) -> bool:
    conditions = (node.status.conditions or []) if node.status else []
    return any(c.type == "Ready" and c.status == "True" for c in conditions)


def pod_is_running(pod: Any) -> bool:
    return bool(pod.status and pod.status.phase == "Running" and pod.status.pod_ip)


async def backdate_start(api: k8s.ApiClient, namespace: str, name: str, started: datetime) -> None:
    """Set a pod's ``status.startTime`` as if it had started at ``started``: a drill's pods
    are minutes old, the trainers they stand for have run for hours (kwok leaves the field
    alone once the pod is Running)."""
    await k8s.CoreV1Api(api).patch_namespaced_pod_status(
        name, namespace, _any({"status": {"startTime": rfc3339(started.replace(microsecond=0))}})
    )


def pdb_name(gang: str) -> str:
    return f"{gang}-pdb"


async def create_pdb(api: k8s.ApiClient, namespace: str, gang: str, max_unavailable: int) -> None:
    await k8s.PolicyV1Api(api).create_namespaced_pod_disruption_budget(
        namespace,
        _any(
            {
                "metadata": {"name": pdb_name(gang)},
                "spec": {
                    "maxUnavailable": max_unavailable,
                    "selector": {"matchLabels": {"jobset.sigs.k8s.io/jobset-name": gang}},
                },
            }
        ),
    )


async def delete_namespace(api: k8s.ApiClient, name: str) -> None:
    try:
        await k8s.CoreV1Api(api).delete_namespace(name)
    except ApiException as e:
        if e.status != 404:
            raise


# --- Kueue: a pod group and its Workload, admitted ------------------------------------------

KUEUE_GROUP = "kueue.x-k8s.io"
KUEUE_VERSION = "v1beta2"
KUEUE_POD_GROUP = "kueue.x-k8s.io/pod-group-name"


def kueue_labels(gang: str, queue: str) -> dict[str, str]:
    """What Kueue's pod integration puts on each pod of a group."""
    return {KUEUE_POD_GROUP: gang, "kueue.x-k8s.io/queue-name": queue}


def workload_body(gang: GangSpec, namespace: str, *, local_queue: str) -> dict[str, Any]:
    gpus = str(gang.gpus_per_rank)
    return {
        "apiVersion": f"{KUEUE_GROUP}/{KUEUE_VERSION}",
        "kind": "Workload",
        "metadata": {"name": gang.name, "namespace": namespace},
        "spec": {
            "active": True,
            "queueName": local_queue,
            "podSets": [
                {
                    "name": "main",
                    "count": len(gang.ranks),
                    "template": {
                        "spec": {
                            "containers": [
                                {
                                    "name": "trainer",
                                    "image": "registry.invalid/trainer:fake",
                                    "resources": {"requests": {GPU: gpus}, "limits": {GPU: gpus}},
                                }
                            ]
                        }
                    },
                }
            ],
        },
    }


def _condition(kind: str, reason: str, message: str, at: datetime) -> dict[str, Any]:
    return {
        "type": kind,
        "status": "True",
        "reason": reason,
        "message": message,
        "observedGeneration": 1,
        "lastTransitionTime": rfc3339(at.replace(microsecond=0)),
    }


async def create_admitted_workload(
    api: k8s.ApiClient, gang: GangSpec, namespace: str, *, cluster_queue: str, local_queue: str
) -> dict[str, Any]:
    """The Workload of a pod group, with the status Kueue's scheduler writes on admission
    (QuotaReserved, Admitted, the podset assignment). Returns the object as stored."""
    custom = k8s.CustomObjectsApi(api)
    created = await custom.create_namespaced_custom_object(
        KUEUE_GROUP,
        KUEUE_VERSION,
        namespace,
        "workloads",
        _any(workload_body(gang, namespace, local_queue=local_queue)),
    )
    now = utcnow() - timedelta(seconds=1)
    gpus = str(gang.gpus_per_rank * len(gang.ranks))
    created["status"] = {
        "admission": {
            "clusterQueue": cluster_queue,
            "podSetAssignments": [
                {
                    "name": "main",
                    "count": len(gang.ranks),
                    "flavors": {GPU: "gpu"},
                    "resourceUsage": {GPU: gpus},
                }
            ],
        },
        "conditions": [
            _condition(
                "QuotaReserved",
                "QuotaReserved",
                f"Quota reserved in ClusterQueue {cluster_queue}",
                now,
            ),
            _condition("Admitted", "Admitted", "The workload is admitted", now),
        ],
    }
    stored: dict[str, Any] = await custom.replace_namespaced_custom_object_status(
        KUEUE_GROUP, KUEUE_VERSION, namespace, "workloads", gang.name, _any(created)
    )
    return stored
