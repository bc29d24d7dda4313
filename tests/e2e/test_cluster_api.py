"""The cluster side against a real kube-apiserver, kwok nodes and kube-controller-manager.

``deploy/kubernetes/rbac.yaml`` is applied as admin, and every reclaimd call runs as user
``reclaimd`` (the stack's client certificate), so a missing RBAC verb fails here. Objects are
created as admin: kwok fake nodes (annotation ``kwok.x-k8s.io/node: fake``, an AWS
providerID, 8 GPUs) and pods bound with ``spec.nodeName``, all named with this run's id.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import secrets
from collections.abc import AsyncIterator, Callable, Mapping
from datetime import datetime, timedelta
from typing import Any

import pytest
import yaml
from kubernetes_asyncio import client as k8s
from stack import REPO_DIR, Stack

from reclaimd.cluster import apiserver, connect, errors, gangclaims
from reclaimd.cluster.actions import ClusterActions, EvictResult
from reclaimd.cluster.apiserver import ApiServer
from reclaimd.cluster.cache import ClusterCache
from reclaimd.cluster.claims import (
    AdvanceStatus,
    ClaimStatus,
    NodeObj,
    Phase,
    WorkloadObj,
)
from reclaimd.cluster.claimstore import ClaimStore
from reclaimd.cluster.gangclaims import GangClaims, lease_name
from reclaimd.cluster.gangs import JOB_NAME
from reclaimd.cluster.holders import HolderLeases
from reclaimd.cluster.holders import lease_name as holder_lease_name
from reclaimd.cluster.indexes import NodeView
from reclaimd.cluster.ratelimit import RateLimiter
from reclaimd.cluster.taints import TAINT_KEY, taint_json
from reclaimd.cluster.watch import Changed, KubeEndpoint, Listed, watch_objects
from reclaimd.model import (
    Gang,
    GangKey,
    Member,
    Notice,
    NoticeKind,
    RankAck,
    Response,
    Target,
    WorkloadRef,
    utcnow,
)
from reclaimd.settings.cache import CacheSettings
from reclaimd.settings.kube import KubeSettings
from reclaimd.settings.policy import EvictionPolicy, PolicySettings

RBAC_DOCS = list(yaml.safe_load_all((REPO_DIR / "deploy" / "kubernetes" / "rbac.yaml").read_text()))
RUN = secrets.token_hex(3)
NS = f"reclaimd-e2e-{RUN}"
SYNC_S = 60.0


# --- helpers -----------------------------------------------------------------------------------


async def eventually(check: Callable[[], bool], what: str, within_s: float = 30.0) -> None:
    """Poll ``check`` until true; a logic wait with a generous bound, not a timing test."""
    try:
        async with asyncio.timeout(within_s):
            while not check():  # noqa: ASYNC110 - the condition lives in another process
                await asyncio.sleep(0.1)
    except TimeoutError:
        pytest.fail(f"not within {within_s:.0f}s: {what}", pytrace=False)


def instance_id(node: str) -> str:
    return "i-0" + hashlib.sha256(node.encode()).hexdigest()[:16]


# Bodies are API JSON: the generated client takes a dict wherever its stubs name a model.


def node_body(name: str, *, labels: Mapping[str, str] | None = None) -> Any:
    gpus = {"nvidia.com/gpu": "8", "cpu": "192", "memory": "2Ti", "pods": "110"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {"kwok.x-k8s.io/node": "fake"},
            "labels": {"type": "kwok", "reclaimd-e2e": RUN, "sku": "h100", **(labels or {})},
        },
        "spec": {"providerID": f"aws:///us-east-2a/{instance_id(name)}"},
        "status": {"capacity": gpus, "allocatable": gpus},
    }


def pod_body(
    name: str,
    node: str,
    *,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    gpus: int = 8,
) -> Any:
    resources = {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": NS,
            "labels": dict(labels or {}),
            "annotations": dict(annotations or {}),
        },
        "spec": {
            "nodeName": node,
            "containers": [{"name": "main", "image": "trainer:fake", "resources": resources}],
        },
    }


async def apply_rbac(api: k8s.ApiClient, docs: list[Any]) -> None:
    """Create each object of rbac.yaml as admin; replace roles and bindings that exist."""
    core, rbac = k8s.CoreV1Api(api), k8s.RbacAuthorizationV1Api(api)
    for doc in docs:
        kind, name = doc["kind"], doc["metadata"]["name"]
        ns = doc["metadata"].get("namespace", "")
        try:
            if kind == "Namespace":
                await core.create_namespace(doc)
            elif kind == "ServiceAccount":
                await core.create_namespaced_service_account(ns, doc)
            elif kind == "ClusterRole":
                await rbac.create_cluster_role(doc)
            elif kind == "ClusterRoleBinding":
                await rbac.create_cluster_role_binding(doc)
            elif kind == "Role":
                await rbac.create_namespaced_role(ns, doc)
            elif kind == "RoleBinding":
                await rbac.create_namespaced_role_binding(ns, doc)
            else:
                pytest.fail(f"rbac.yaml: unexpected kind {kind}", pytrace=False)
        except k8s.ApiException as e:
            if e.status != 409:
                raise
            # Already there from an earlier run: make the rules match the file.
            if kind == "ClusterRole":
                await rbac.replace_cluster_role(name, doc)
            elif kind == "ClusterRoleBinding":
                await rbac.replace_cluster_role_binding(name, doc)
            elif kind == "Role":
                await rbac.replace_namespaced_role(name, ns, doc)
            elif kind == "RoleBinding":
                await rbac.replace_namespaced_role_binding(name, ns, doc)


def notice(
    nid: str,
    *,
    node: str = "",
    deadline_s: float | None = 120.0,
    kind: NoticeKind = NoticeKind.SPOT_INTERRUPTION,
    workload: WorkloadRef | None = None,
) -> Notice:
    now = utcnow()
    return Notice(
        id=f"e2e-{RUN}-{nid}",
        source="e2e",
        kind=kind,
        target=Target(node_name=node, workload=workload),
        issued_at=now,
        deadline=now + timedelta(seconds=deadline_s) if deadline_s is not None else None,
        received_at=now,
        response=Response.FULL,
    )


# --- fixtures ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
async def admin(kube: k8s.ApiClient) -> AsyncIterator[k8s.ApiClient]:
    await apply_rbac(kube, RBAC_DOCS)
    core = k8s.CoreV1Api(kube)
    namespace: Any = {"metadata": {"name": NS}}
    await core.create_namespace(namespace)
    # Pod admission needs the namespace's default ServiceAccount; the controller-manager
    # creates it too, whoever comes second gets a harmless 409.
    account: Any = {"metadata": {"name": "default"}}
    with contextlib.suppress(k8s.ApiException):
        await core.create_namespaced_service_account(NS, account)
    yield kube
    with contextlib.suppress(k8s.ApiException):
        await core.delete_namespace(NS)
    nodes = await core.list_node(label_selector=f"reclaimd-e2e={RUN}")
    for node in nodes.items:
        with contextlib.suppress(k8s.ApiException):
            await core.delete_node(node.metadata.name)


@pytest.fixture(scope="module")
async def as_reclaimd(admin: k8s.ApiClient, stack: Stack) -> AsyncIterator[ApiServer]:
    api = await connect.build_api_client(str(stack.reclaimd_kubeconfig))
    async with api:
        yield api


async def make_nodes(
    admin: k8s.ApiClient, *names: str, labels: Mapping[str, str] | None = None
) -> list[str]:
    core = k8s.CoreV1Api(admin)
    for name in names:
        await core.create_node(node_body(name, labels=labels))
    return list(names)


async def make_pod(admin: k8s.ApiClient, name: str, node: str, **kw: Any) -> k8s.V1Pod:
    return await k8s.CoreV1Api(admin).create_namespaced_pod(NS, pod_body(name, node, **kw))


def job_labels(job: str, index: int, **extra: str) -> dict[str, str]:
    return {
        "batch.kubernetes.io/job-name": job,
        "batch.kubernetes.io/job-completion-index": str(index),
        **extra,
    }


# --- RBAC --------------------------------------------------------------------------------------


async def test_reclaimd_identity_has_exactly_its_rights(as_reclaimd: ApiServer) -> None:
    await as_reclaimd.get(apiserver.node(), limit=1)
    await as_reclaimd.get(apiserver.pod(""), limit=1)
    with pytest.raises(errors.Forbidden), errors.kube_errors("list secrets"):
        await as_reclaimd.get(apiserver.core("secrets"), limit=1)
    with pytest.raises(errors.Forbidden), errors.kube_errors("create pod"):
        await as_reclaimd.post(apiserver.pod(NS), pod_body("not-allowed", "nowhere"))


# --- cache -------------------------------------------------------------------------------------


async def test_cache_indexes_nodes_and_resolves_a_gang_from_one_node(
    admin: k8s.ApiClient, as_reclaimd: ApiServer
) -> None:
    nodes = await make_nodes(admin, *(f"gpu-{RUN}-{i}" for i in range(3)))
    for i, node in enumerate(nodes):
        await make_pod(
            admin,
            f"train-{i}",
            node,
            labels=job_labels("train", i, tenant="t-blue"),
            annotations={"reclaimd.io/checkpoint-url": "http://{pod_ip}:8080/ckpt"},
        )
    await make_pod(admin, "sidecar-cpu", nodes[0], gpus=0)  # holds no GPU: not a member

    def labeler(pod: Mapping[str, str], node: Mapping[str, str]) -> dict[str, str]:
        return {"tenant": pod.get("tenant", ""), "sku": node.get("sku", "")}

    cache = ClusterCache(as_reclaimd, settings=CacheSettings(namespaces=(NS,)), labeler=labeler)
    await cache.start()
    try:
        assert await cache.wait_synced(SYNC_S)
        assert cache.synced
        iid = instance_id(nodes[1])
        assert cache.view.resolve_node(Target(instance_id=iid)) == nodes[1]
        assert cache.view.resolve_node(Target(provider_id=f"aws:///us-east-2a/{iid}")) == nodes[1]
        assert cache.view.resolve_node(Target(node_name=nodes[2])) == nodes[2]
        assert cache.view.resolve_node(Target(instance_id="i-0doesnotexist")) is None
        assert cache.view.node_labels(nodes[0])["sku"] == "h100"

        gangs = cache.view.gangs_on_nodes([nodes[0]])
        assert [g.key for g in gangs] == [GangKey("job", NS, "train")]
        gang = gangs[0]
        assert [(m.name, m.node, m.rank, m.gpus) for m in gang.members] == [
            (f"train-{i}", nodes[i], i, 8) for i in range(3)
        ]
        assert gang.gpus == 24
        assert dict(gang.labels) == {"tenant": "t-blue", "sku": "h100"}
        assert not cache.view.pod_exists(NS, "sidecar-cpu")
        # kwok runs the pods and gives them IPs; the contract URL follows.
        await eventually(
            lambda: all(m.pod_ip for m in cache.view.gangs_on_nodes([nodes[0]])[0].members),
            "kwok assigns pod IPs",
        )
        member = cache.view.gangs_on_nodes([nodes[0]])[0].members[0]
        assert member.checkpoint_url == f"http://{member.pod_ip}:8080/ckpt"

        # The watch: a new rank joins, then leaves.
        await make_pod(admin, "train-3", nodes[2], labels=job_labels("train", 3))
        await eventually(
            lambda: len(cache.view.gangs_on_nodes([nodes[0]])[0].members) == 4, "watch adds train-3"
        )
        assert cache.view.gangs_on_nodes([nodes[2]])[0].key == GangKey("job", NS, "train")
        uid = cache.view.gangs_on_nodes([nodes[0]])[0].members[3].uid
        assert cache.view.pod_exists(NS, "train-3", uid)
        assert not cache.view.pod_exists(NS, "train-3", "some-other-uid")
        await k8s.CoreV1Api(admin).delete_namespaced_pod("train-3", NS, grace_period_seconds=0)
        await eventually(lambda: not cache.view.pod_exists(NS, "train-3"), "watch drops train-3")
        assert len(cache.view.gangs_on_nodes([nodes[2]])[0].members) == 3
    finally:
        await cache.stop()


async def test_cache_maps_kueue_workloads_to_their_gangs(
    admin: k8s.ApiClient, as_reclaimd: ApiServer
) -> None:
    nodes = await make_nodes(admin, f"kq-{RUN}-0", f"kq-{RUN}-1")
    job_uid = f"job-uid-{RUN}"
    workload = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {
            "name": f"job-wl-{RUN}",
            "namespace": NS,
            "labels": {"kueue.x-k8s.io/job-uid": job_uid},
        },
        "spec": {
            "queueName": "lq",
            "podSets": [
                {
                    "name": "main",
                    "count": 2,
                    "template": {"spec": {"containers": [{"name": "c", "image": "x"}]}},
                }
            ],
        },
    }
    await k8s.CustomObjectsApi(admin).create_namespaced_custom_object(
        "kueue.x-k8s.io", "v1beta2", NS, "workloads", workload
    )
    for i, node in enumerate(nodes):
        await make_pod(
            admin,
            f"wl-{i}",
            node,
            labels=job_labels("wl-job", i, **{"batch.kubernetes.io/controller-uid": job_uid}),
        )
        await make_pod(
            admin, f"pg-{i}", node, labels={"kueue.x-k8s.io/pod-group-name": f"pg-{RUN}"}
        )

    cache = ClusterCache(as_reclaimd, settings=CacheSettings(namespaces=(NS,)))
    await cache.start()
    try:
        assert await cache.wait_synced(SYNC_S)
        assert cache.workloads_available
        by_job = cache.view.gangs_of_workload(WorkloadRef(NS, f"job-wl-{RUN}"))
        assert [(g.key, len(g.members)) for g in by_job] == [(GangKey("job", NS, "wl-job"), 2)]
        by_group = cache.view.gangs_of_workload(WorkloadRef(NS, f"pg-{RUN}"))
        assert [(g.key, len(g.members)) for g in by_group] == [
            (GangKey("kueue", NS, f"pg-{RUN}"), 2)
        ]
        assert cache.view.gangs_of_workload(WorkloadRef(NS, "no-such-workload")) == ()
        assert cache.view.gangs_of_workload(WorkloadRef(NS, f"job-wl-{RUN}", uid="stale-uid")) == ()
    finally:
        await cache.stop()


async def test_watch_resumes_from_bookmarked_versions(admin: k8s.ApiClient, api: ApiServer) -> None:
    """KubeEndpoint against the server: list, then events from the listed version."""
    core = k8s.CoreV1Api(admin)
    endpoint = KubeEndpoint(
        api, apiserver.pod(NS), f"pods in {NS}", page_size=2, labelSelector="watched=yes"
    )
    await make_pod(admin, "watched-0", "nowhere", labels={"watched": "yes"}, gpus=0)
    await make_pod(admin, "watched-1", "nowhere", labels={"watched": "yes"}, gpus=0)
    await make_pod(admin, "watched-2", "nowhere", labels={"watched": "yes"}, gpus=0)
    stream = watch_objects(endpoint)
    try:
        listed = await anext(stream)
        assert isinstance(listed, Listed)
        # Paged at 2 per page, still one snapshot of all three.
        assert sorted(o["metadata"]["name"] for o in listed.objects) == [
            "watched-0",
            "watched-1",
            "watched-2",
        ]
        await core.delete_namespaced_pod("watched-1", NS, grace_period_seconds=0)
        seen: list[tuple[str, str]] = []
        async with asyncio.timeout(30):
            async for event in stream:
                assert isinstance(event, Changed)
                seen.append((event.type, event.object["metadata"]["name"]))
                if event.type == "DELETED":
                    break
        assert seen[-1] == ("DELETED", "watched-1")
    finally:
        await stream.aclose()


# --- claims ------------------------------------------------------------------------------------


async def test_claim_is_exclusive_and_resumable(
    admin: k8s.ApiClient, as_reclaimd: ApiServer
) -> None:
    (node,) = await make_nodes(admin, f"claim-{RUN}")
    limiter = RateLimiter()
    a = ClaimStore(as_reclaimd, "replica-a", lease_s=20.0, limiter=limiter)
    b = ClaimStore(as_reclaimd, "replica-b", lease_s=20.0, limiter=limiter)
    target = NodeObj(node)
    spot = notice("spot", node=node, deadline_s=120)

    first, second = await asyncio.gather(a.claim(target, spot), b.claim(target, spot))
    assert sorted([first.status, second.status]) == sorted(
        [ClaimStatus.CLAIMED, ClaimStatus.DUPLICATE]
    )
    winner, loser = (a, b) if first.status is ClaimStatus.CLAIMED else (b, a)

    again = await winner.claim(target, spot)
    assert again.status is ClaimStatus.ALREADY_OURS
    assert again.claim is not None and again.claim.phase is Phase.CLAIMED

    moved = await winner.advance(target, spot.id, Phase.CORDONED, gangs=2)
    assert moved.status is AdvanceStatus.ADVANCED
    back = await winner.advance(target, spot.id, Phase.CLAIMED)  # never moves backwards
    assert back.claim is not None and back.claim.phase is Phase.CORDONED
    assert (await loser.advance(target, spot.id, Phase.DRAINED)).status is AdvanceStatus.LOST

    stored = await loser.get(target)
    assert stored is not None
    assert (stored.notice_id, stored.holder, stored.phase) == (
        spot.id,
        winner.holder,
        Phase.CORDONED,
    )
    assert stored.facts["gangs"] == 2
    assert stored.notice["id"] == spot.id
    open_claims = {c.target: c for c in await loser.list_open()}
    assert open_claims[target].notice_id == spot.id

    # A later (or deadline-less) notice for the same node adds nothing.
    rebalance = notice(
        "rebalance", node=node, deadline_s=None, kind=NoticeKind.REBALANCE_RECOMMENDATION
    )
    assert (await loser.claim(target, rebalance)).status is ClaimStatus.SUPERSEDED

    # The holder dies: once its lease is stale, the other replica resumes it.
    late = ClaimStore(
        as_reclaimd,
        loser.holder,
        lease_s=20.0,
        limiter=limiter,
        clock=lambda: utcnow() + timedelta(minutes=5),
    )
    taken = await late.claim(target, spot)
    assert taken.status is ClaimStatus.TAKEN_OVER
    assert taken.claim is not None and taken.claim.phase is Phase.CORDONED
    assert (await winner.advance(target, spot.id, Phase.SIGNALED)).status is AdvanceStatus.LOST

    done = await late.advance(target, spot.id, Phase.DONE)
    assert done.status is AdvanceStatus.ADVANCED
    assert target not in {c.target for c in await late.list_open()}
    assert (await a.claim(target, spot)).status is ClaimStatus.DUPLICATE


async def test_more_urgent_notice_replaces_an_open_claim(
    admin: k8s.ApiClient, as_reclaimd: ApiServer
) -> None:
    (node,) = await make_nodes(admin, f"urgent-{RUN}")
    a = ClaimStore(as_reclaimd, "replica-a", lease_s=20.0)
    b = ClaimStore(as_reclaimd, "replica-b", lease_s=20.0)
    target = NodeObj(node)
    rebalance = notice(
        "early", node=node, deadline_s=None, kind=NoticeKind.REBALANCE_RECOMMENDATION
    )
    assert (await a.claim(target, rebalance)).status is ClaimStatus.CLAIMED
    spot = notice("urgent", node=node, deadline_s=60)
    replaced = await b.claim(target, spot)
    assert replaced.status is ClaimStatus.CLAIMED
    assert replaced.claim is not None and replaced.claim.facts["supersedes"] == rebalance.id
    assert (await a.advance(target, rebalance.id, Phase.SIGNALED)).status is AdvanceStatus.LOST

    missing = await a.claim(NodeObj(f"no-such-node-{RUN}"), spot)
    assert missing.status is ClaimStatus.TARGET_NOT_FOUND


async def test_claim_on_a_kueue_workload(admin: k8s.ApiClient, as_reclaimd: ApiServer) -> None:
    name = f"reclaimed-{RUN}"
    await k8s.CustomObjectsApi(admin).create_namespaced_custom_object(
        "kueue.x-k8s.io",
        "v1beta2",
        NS,
        "workloads",
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "Workload",
            "metadata": {"name": name, "namespace": NS},
            "spec": {
                "podSets": [
                    {
                        "name": "main",
                        "count": 1,
                        "template": {"spec": {"containers": [{"name": "c", "image": "x"}]}},
                    }
                ]
            },
        },
    )
    store = ClaimStore(as_reclaimd, "replica-a", lease_s=20.0)
    target = WorkloadObj(NS, name)
    reclaim = notice(
        "reclaim", kind=NoticeKind.RECLAIM, deadline_s=30, workload=WorkloadRef(NS, name)
    )
    assert (await store.claim(target, reclaim)).status is ClaimStatus.CLAIMED
    assert (await store.claim(target, reclaim)).status is ClaimStatus.ALREADY_OURS
    assert any(c.target == target for c in await store.list_open(namespaces=(NS,)))


# --- cordon, taint, evict --------------------------------------------------------------------


KCM_CORDON_TAINT = "node.kubernetes.io/unschedulable"


async def test_cordon_and_taint_is_idempotent_and_keeps_other_taints(
    admin: k8s.ApiClient, as_reclaimd: ApiServer
) -> None:
    (node,) = await make_nodes(admin, f"cordon-{RUN}")
    core = k8s.CoreV1Api(admin)
    await core.patch_node(
        node, {"spec": {"taints": [{"key": "gpu-health", "value": "ok", "effect": "NoSchedule"}]}}
    )
    actions = ClusterActions(as_reclaimd, limiter=RateLimiter())
    spot = notice("cordon", node=node)

    await actions.cordon_and_taint(node, spot)
    # kube-controller-manager mirrors a cordon as its own node.kubernetes.io/unschedulable
    # taint, a moment later: let it, so the resourceVersion below changes for our writes only.
    after_first = await core.read_node(node)
    for _ in range(100):
        if any(t.key == KCM_CORDON_TAINT for t in after_first.spec.taints or ()):
            break
        await asyncio.sleep(0.1)
        after_first = await core.read_node(node)
    await actions.cordon_and_taint(node, spot)
    after_second = await core.read_node(node)

    assert after_second.spec.unschedulable is True
    taints = sorted(
        (t.key, t.value, t.effect)
        for t in after_second.spec.taints
        if not t.key.startswith("node.kubernetes.io/")  # the controller manager's
    )
    assert taints == [
        ("gpu-health", "ok", "NoSchedule"),
        (TAINT_KEY, "spot_interruption", "NoSchedule"),
    ]
    # The second call found nothing to do and wrote nothing.
    assert after_second.metadata.resource_version == after_first.metadata.resource_version

    # A later, different notice kind updates our taint in place, not a second copy.
    await actions.cordon_and_taint(node, notice("maint", node=node, kind=NoticeKind.MAINTENANCE))
    again = await core.read_node(node)
    assert [(t.key, t.value) for t in again.spec.taints if t.key == TAINT_KEY] == [
        (TAINT_KEY, "maintenance")
    ]


async def member(
    admin: k8s.ApiClient, name: str, node: str, labels: Mapping[str, str] | None = None
) -> Member:
    pod = await make_pod(admin, name, node, labels=labels)
    return Member(namespace=NS, name=name, uid=pod.metadata.uid, node=node, gpus=8)


async def pod_state(admin: k8s.ApiClient, name: str) -> str:
    try:
        pod = await k8s.CoreV1Api(admin).read_namespaced_pod(name, NS)
    except k8s.ApiException as e:
        if e.status == 404:
            return "gone"
        raise
    return "terminating" if pod.metadata.deletion_timestamp else "present"


async def ready_and_guarded(admin: k8s.ApiClient, pods: list[str], pdb: str) -> None:
    """Wait until kwok runs the pods and the disruption controller has judged the PDB.

    The eviction API lets a Pending pod go regardless of any PDB, so the pods must be Running
    and Ready before a PDB can refuse anything.
    """
    core, policy = k8s.CoreV1Api(admin), k8s.PolicyV1Api(admin)
    state: dict[str, bool] = {}

    async def refresh() -> None:
        for name in pods:
            pod = await core.read_namespaced_pod(name, NS)
            state[name] = pod.status.phase == "Running" and any(
                c.type == "Ready" and c.status == "True" for c in pod.status.conditions or ()
            )
        budget = await policy.read_namespaced_pod_disruption_budget(pdb, NS)
        # Bare pods have no scale for maxUnavailable to count against: the controller then
        # allows 0 disruptions, which is the blocking budget this test wants.
        state["pdb"] = (
            budget.status is not None
            and (budget.status.observed_generation or 0) >= budget.metadata.generation
            and budget.status.disruptions_allowed == 0
        )

    try:
        async with asyncio.timeout(60):
            await refresh()
            while not all(state.values()):
                await asyncio.sleep(0.2)
                await refresh()
    except TimeoutError:
        pytest.fail(f"pods not running and guarded within 60 s: {state}", pytrace=False)


async def test_evict_without_pdb_and_wait_gone(
    admin: k8s.ApiClient, as_reclaimd: ApiServer
) -> None:
    (node,) = await make_nodes(admin, f"evict-{RUN}")
    victim = await member(admin, "victim", node)
    actions = ClusterActions(as_reclaimd, limiter=RateLimiter())
    deadline = utcnow() + timedelta(seconds=60)
    assert await actions.evict(victim, deadline=deadline) is EvictResult.EVICTED
    gone_at = await actions.wait_gone(victim, deadline=deadline)
    assert gone_at is not None and gone_at <= deadline
    assert await pod_state(admin, "victim") == "gone"
    # Evicting again is a no-op: the pod is already gone.
    assert await actions.evict(victim, deadline=deadline) is EvictResult.GONE


async def test_pdb_blocks_eviction_and_each_policy_does_what_it_says(
    admin: k8s.ApiClient, as_reclaimd: ApiServer
) -> None:
    (node,) = await make_nodes(admin, f"pdb-{RUN}")
    guarded = {"app": f"guarded-{RUN}"}
    pdb: Any = {
        "metadata": {"name": "no-disruption"},
        "spec": {"maxUnavailable": 0, "selector": {"matchLabels": guarded}},
    }
    await k8s.PolicyV1Api(admin).create_namespaced_pod_disruption_budget(NS, pdb)
    kept = await member(admin, "kept", node, labels=guarded)
    forced = await member(admin, "forced", node, labels=guarded)
    await ready_and_guarded(admin, ["kept", "forced"], "no-disruption")
    settings = PolicySettings(
        force_before_s=2.0, delete_grace_s=1, retry_base_s=0.2, retry_cap_s=0.5
    )
    actions = ClusterActions(as_reclaimd, limiter=RateLimiter(), settings=settings)

    respect_deadline = utcnow() + timedelta(seconds=3)
    result = await actions.evict(kept, deadline=respect_deadline, policy=EvictionPolicy.RESPECT_PDB)
    assert result is EvictResult.BLOCKED
    assert utcnow() >= respect_deadline  # it kept trying until the deadline, no longer
    assert await pod_state(admin, "kept") == "present"

    force_deadline = utcnow() + timedelta(seconds=5)
    result = await actions.evict(
        forced, deadline=force_deadline, policy=EvictionPolicy.FORCE_NEAR_DEADLINE
    )
    assert result is EvictResult.FORCED
    assert utcnow() < force_deadline  # the delete went out before the deadline
    assert await actions.wait_gone(forced, deadline=utcnow() + timedelta(seconds=60)) is not None
    assert await pod_state(admin, "kept") == "present"


async def test_a_refused_eviction_is_asked_again_when_the_cache_sees_its_pdb_change(
    admin: k8s.ApiClient, as_reclaimd: ApiServer
) -> None:
    """The cache's PDB watch, not a timer, brings the retry: with the timer at 60 s, the
    eviction goes through within the test's bound only because the PDB's change woke it."""
    (node,) = await make_nodes(admin, f"pdbwatch-{RUN}")
    guarded = {"app": f"watched-{RUN}"}
    policy = k8s.PolicyV1Api(admin)
    body: Any = {
        "metadata": {"name": "one-must-stay"},
        "spec": {"maxUnavailable": 0, "selector": {"matchLabels": guarded}},
    }
    await policy.create_namespaced_pod_disruption_budget(NS, body)
    pod = await member(admin, "watched", node, labels=guarded)
    await ready_and_guarded(admin, ["watched"], "one-must-stay")
    cache = ClusterCache(as_reclaimd, settings=CacheSettings(namespaces=(NS,)))
    await cache.start()
    try:
        assert await cache.wait_synced(SYNC_S)
        limiter = RateLimiter()
        actions = ClusterActions(
            as_reclaimd,
            limiter=limiter,
            settings=PolicySettings(watched_retry_s=60.0),
            pod_exists=cache.view.pod_exists,
            budget_changes=cache.view.budget_changes,
        )
        task = asyncio.create_task(actions.evict(pod, deadline=utcnow() + timedelta(seconds=120)))
        await eventually(lambda: limiter.by_kind["evict pod"] >= 1, "the first eviction request")
        await asyncio.sleep(1.0)
        assert not task.done() and limiter.by_kind["evict pod"] == 1  # refused, and waiting
        await policy.patch_namespaced_pod_disruption_budget(
            "one-must-stay", NS, {"spec": {"maxUnavailable": None, "minAvailable": 0}}
        )
        assert await asyncio.wait_for(task, 30) is EvictResult.EVICTED
        # The spec change may wake it before the controller has judged the PDB (one more
        # refusal); the status the controller writes wakes it again.
        assert limiter.by_kind["evict pod"] <= 3
        assert await actions.wait_gone(pod, deadline=utcnow() + timedelta(seconds=60)) is not None
    finally:
        await cache.stop()


async def test_a_saved_gangs_own_pdb_releases_it_and_a_shared_one_holds(
    admin: k8s.ApiClient, as_reclaimd: ApiServer
) -> None:
    """Once its checkpoint ask is over, a gang whose PDB selects only its own pods is deleted
    at the first refusal; a PDB that also covers another job's pod is honoured until
    ``force_before_s``, saved or not."""
    (node,) = await make_nodes(admin, f"saved-{RUN}")
    policy = k8s.PolicyV1Api(admin)
    own = {JOB_NAME: f"own-{RUN}"}
    shared = {"team": f"shared-{RUN}"}
    for name, selector in (("own-gang", own), ("whole-team", shared)):
        body: Any = {
            "metadata": {"name": name},
            "spec": {"maxUnavailable": 0, "selector": {"matchLabels": selector}},
        }
        await policy.create_namespaced_pod_disruption_budget(NS, body)
    mine = await member(admin, "own-rank", node, labels=own)
    theirs = await member(admin, "team-rank", node, labels={**shared, JOB_NAME: f"team-{RUN}"})
    await member(admin, "team-other", node, labels={**shared, JOB_NAME: f"other-{RUN}"})
    await ready_and_guarded(admin, ["own-rank"], "own-gang")
    await ready_and_guarded(admin, ["team-rank", "team-other"], "whole-team")
    cache = ClusterCache(as_reclaimd, settings=CacheSettings(namespaces=(NS,)))
    await cache.start()
    try:
        assert await cache.wait_synced(SYNC_S)
        await eventually(
            lambda: cache.view.pdbs_guard_only_its_gang(NS, "own-rank"), "the cache sees both PDBs"
        )
        assert not cache.view.pdbs_guard_only_its_gang(NS, "team-rank")
        actions = ClusterActions(
            as_reclaimd,
            limiter=RateLimiter(),
            settings=PolicySettings(force_before_s=3.0, delete_grace_s=1, retry_base_s=0.2),
            pod_exists=cache.view.pod_exists,
            budget_changes=cache.view.budget_changes,
            only_its_gang=cache.view.pdbs_guard_only_its_gang,
        )
        deadline = utcnow() + timedelta(seconds=60)
        # Not saved: its own PDB holds it like any other (the checkpoint may still be going).
        unsaved = await actions.evict(
            mine, deadline=utcnow() + timedelta(seconds=1.5), policy=EvictionPolicy.RESPECT_PDB
        )
        assert unsaved is EvictResult.BLOCKED
        assert await actions.evict(mine, deadline=deadline, saved=True) is EvictResult.RELEASED
        assert await actions.wait_gone(mine, deadline=deadline) is not None
        # A PDB over another job's pod too: saved or not, it is honoured until force_before_s.
        held_until = utcnow() + timedelta(seconds=6)
        left_at: list[datetime] = []

        async def watch() -> None:
            for _ in range(200):  # polled every 0.1 s, 20 s at most
                if await pod_state(admin, "team-rank") != "present":
                    left_at.append(utcnow())
                    return
                await asyncio.sleep(0.1)

        watcher = asyncio.create_task(watch())
        assert await actions.evict(theirs, deadline=held_until, saved=True) is EvictResult.FORCED
        await asyncio.wait_for(watcher, 10)
        assert left_at, "team-rank never left"
        # Deleted at force_before_s (3 s before the deadline), not released at once.
        assert left_at[0] >= held_until - timedelta(seconds=3.0)
        assert await pod_state(admin, "team-other") == "present"
    finally:
        await cache.stop()


async def test_storm_writes_are_served_earliest_deadline_first(
    admin: k8s.ApiClient, as_reclaimd: ApiServer, api: ApiServer
) -> None:
    names = await make_nodes(admin, *(f"storm-{RUN}-{i}" for i in range(3)), labels={"storm": RUN})
    # One token, refilled every 4 s: the three cordons queue behind it.
    limiter = RateLimiter(KubeSettings(qps=0.25, burst=1))
    await limiter.acquire()
    actions = ClusterActions(as_reclaimd, limiter=limiter)
    deadlines = {names[0]: 90, names[1]: 30, names[2]: 60}

    order: list[str] = []
    endpoint = KubeEndpoint(api, apiserver.node(), "nodes", labelSelector=f"storm={RUN}")

    async def record() -> None:
        async for event in watch_objects(endpoint):
            if isinstance(event, Changed) and event.object["spec"].get("unschedulable"):
                name = event.object["metadata"]["name"]
                if name not in order:
                    order.append(name)

    recorder = asyncio.create_task(record())
    try:
        cordons = asyncio.gather(
            *(
                actions.cordon_and_taint(n, notice(f"storm-{n}", node=n, deadline_s=deadlines[n]))
                for n in names
            )
        )
        await eventually(lambda: limiter.waiting == 3, "all three cordons queue", within_s=3.5)
        assert order == []  # precondition: nothing was served before all were queued
        await cordons
        await eventually(lambda: len(order) == 3, "the watch sees all three cordons")
    finally:
        recorder.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await recorder
    assert order == sorted(names, key=lambda n: deadlines[n])


# --- the storm's fast path ---------------------------------------------------------------------


async def _copy_of(admin: k8s.ApiClient, name: str) -> NodeView:
    """What the cache holds of a node: its version, cordon, taints and claim."""
    node = await k8s.CoreV1Api(admin).read_node(name)
    return NodeView(
        name=name,
        resource_version=str(node.metadata.resource_version),
        unschedulable=bool(node.spec.unschedulable),
        taints=tuple(taint_json(t.to_dict()) for t in node.spec.taints or ()),
        claim_text=(node.metadata.annotations or {}).get("reclaimd.io/claim"),
        labels=dict(node.metadata.labels or {}),
    )


async def test_the_claim_cordons_and_taints_in_one_write_from_the_cache_copy(
    admin: k8s.ApiClient, as_reclaimd: ApiServer
) -> None:
    # Not a kwok node: kwok's heartbeats would move its resourceVersion under the test (then
    # a 409 and a second write, correctly; this test is about the write when nothing moved).
    node = f"fast-{RUN}"
    body = node_body(node)
    body["metadata"]["annotations"] = {}
    core = k8s.CoreV1Api(admin)
    await core.create_node(body)
    other: Any = {"spec": {"taints": [{"key": "gpu", "value": "h100", "effect": "NoSchedule"}]}}
    await core.patch_node(node, other)
    limiter = RateLimiter()
    store = ClaimStore(as_reclaimd, "replica-a", lease_s=20.0, limiter=limiter)
    spot = notice("fast", node=node)
    seed = await _copy_of(admin, node)

    result = await store.claim(NodeObj(node), spot, cordon=True, seed=seed)
    assert result.status is ClaimStatus.CLAIMED
    assert dict(limiter.by_kind) == {"write claim on node": 1}  # one write, no read first
    after = await core.read_node(node)
    assert after.spec.unschedulable
    # ours added, the other kept (the node controller may add node.kubernetes.io/unschedulable)
    assert {("gpu", "h100"), (TAINT_KEY, "spot_interruption")} <= {
        (t.key, t.value) for t in after.spec.taints
    }
    assert spot.id in after.metadata.annotations["reclaimd.io/claim"]

    # A stale copy (someone wrote the node since): 409, read, write again; nothing lost.
    stale = await _copy_of(admin, node)
    await core.patch_node(node, {"metadata": {"labels": {"touched": "yes"}}})
    early = notice("faster", node=node, deadline_s=30)  # more urgent: replaces the claim
    again = await store.claim(NodeObj(node), early, cordon=True, seed=stale)
    assert again.status is ClaimStatus.CLAIMED
    assert limiter.by_kind["write claim on node"] == 3  # the refused write, then the good one
    final = await core.read_node(node)
    assert early.id in final.metadata.annotations["reclaimd.io/claim"]
    assert final.metadata.labels["touched"] == "yes"


async def test_holder_leases_tell_who_is_alive(
    admin: k8s.ApiClient, as_reclaimd: ApiServer
) -> None:
    limiter = RateLimiter()
    a = HolderLeases(as_reclaimd, "reclaimd", f"holder-a-{RUN}", lease_s=20, limiter=limiter)
    b = HolderLeases(as_reclaimd, "reclaimd", f"holder-b-{RUN}", lease_s=20, limiter=limiter)
    assert b.renewed(a.holder) is None
    before = utcnow()
    await a.renew()  # creates the Lease
    await a.renew()  # renews it
    await b.refresh()
    seen = b.renewed(a.holder)
    assert seen is not None and seen >= before - timedelta(seconds=1)
    assert b.renewed(f"nobody-{RUN}") is None
    assert a.renewed(a.holder) is not None  # its own, without a read
    # Every answer, whatever its status, says the API server is reached (not cut off).
    as_reclaimd.answered_at = None
    with pytest.raises(apiserver.ApiStatus):  # 404
        await as_reclaimd.get(apiserver.lease("reclaimd", f"nobody-{RUN}"))
    assert as_reclaimd.answered_at is not None


async def test_the_lease_of_a_replica_gone_for_an_hour_is_deleted(
    admin: k8s.ApiClient, as_reclaimd: ApiServer
) -> None:
    limiter = RateLimiter()
    gone = HolderLeases(as_reclaimd, "reclaimd", f"holder-gone-{RUN}", lease_s=20, limiter=limiter)
    live = HolderLeases(as_reclaimd, "reclaimd", f"holder-live-{RUN}", lease_s=20, limiter=limiter)
    await gone.renew()
    await live.renew()
    old = (utcnow() - timedelta(hours=2)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    await k8s.CoordinationV1Api(admin).patch_namespaced_lease(
        holder_lease_name(gone.holder), "reclaimd", {"spec": {"renewTime": old}}
    )
    await live.refresh()
    assert live.renewed(gone.holder) is None
    assert live._sweeping is not None  # the deletes run beside the renewals, not in their way
    await live._sweeping
    names = {
        x.metadata.name
        for x in (await k8s.CoordinationV1Api(admin).list_namespaced_lease("reclaimd")).items
    }
    assert holder_lease_name(gone.holder) not in names
    assert holder_lease_name(live.holder) in names


def _gang(name: str, *uids: str) -> Gang:
    return Gang(
        GangKey("jobset", NS, name),
        tuple(Member(NS, f"{name}-{u}", f"{RUN}-{u}", f"n-{u}", 8) for u in uids),
    )


async def test_a_gang_lease_charges_one_notice_per_incarnation(
    admin: k8s.ApiClient, as_reclaimd: ApiServer
) -> None:
    leases = GangClaims(as_reclaimd, "reclaimd", "replica-a", limiter=RateLimiter())
    first, second, third = (notice(n) for n in ("g-first", "g-second", "g-third"))
    name = f"lease-{RUN}"
    assert await leases.acquire(_gang(name, "u1", "u2"), first)
    # the owner already drains it: a later notice sees fewer pods, still the same gang
    assert not await leases.acquire(_gang(name, "u2"), second)
    assert await leases.acquire(_gang(name, "u1", "u2"), first)  # resumed: still its own
    # restarted with all-new pods: a new incarnation, charged again
    assert await leases.acquire(_gang(name, "u7", "u8"), third)
    assert not await leases.acquire(_gang(name, "u8"), second)


async def test_a_gang_lease_keeps_what_a_successor_needs(
    admin: k8s.ApiClient, as_reclaimd: ApiServer
) -> None:
    owner = GangClaims(as_reclaimd, "reclaimd", "replica-a", limiter=RateLimiter())
    successor = GangClaims(as_reclaimd, "reclaimd", "replica-b", limiter=RateLimiter())
    n = notice(f"rec-{RUN}")
    gang = _gang(f"rec-{RUN}", "r1", "r2")
    assert await owner.acquire(gang, n)
    acked_at = utcnow().replace(microsecond=0)
    r1, r2 = gang.members
    await owner.acked(gang, n, (RankAck(r1, True, True, acked_at), RankAck(r2, False)))
    found = await successor.owned_by(n)
    assert set(found) == {gang.key}
    assert found[gang.key].gang.members == gang.members
    assert [(a.member.uid, a.checkpoint_time) for a in found[gang.key].acks] == [(r1.uid, acked_at)]
    assert await successor.owned_by(notice(f"other-{RUN}")) == {}


async def test_a_successor_learns_the_acks_its_cut_off_peer_could_not_record(
    admin: k8s.ApiClient, as_reclaimd: ApiServer, api: ApiServer
) -> None:
    """The owner got its ranks' acks but not the write of them (cut off from the API server);
    Kueue deleted the ranks meanwhile. The successor asks the owner, still alive, for them."""
    owner = GangClaims(as_reclaimd, "reclaimd", "replica-a", limiter=RateLimiter())
    n = notice(f"cut-{RUN}")
    gang = _gang(f"cut-{RUN}", "c1", "c2")
    assert await owner.acquire(gang, n)
    acked_at = utcnow().replace(microsecond=0)
    c1, c2 = gang.members
    # The owner's write fails (the API server is gone for it): only its memory has the acks.
    cut_off = GangClaims(api, "reclaimd-nowhere", "replica-a", limiter=RateLimiter())
    await cut_off.acked(gang, n, (RankAck(c1, True, True, acked_at), RankAck(c2, False)))
    assert cut_off.held(gangclaims.notice_label(n.id))  # kept, though never written

    asked: list[str] = []

    async def ask(holder: str, label: str) -> dict[str, str]:
        asked.append(holder)
        return cut_off.held(label) if holder == "replica-a" else {}

    successor = GangClaims(
        as_reclaimd, "reclaimd", "replica-b", limiter=RateLimiter(), peer_acks=ask
    )
    found = await successor.owned_by(n)
    assert asked == ["replica-a"]
    assert [(a.member.uid, a.checkpoint_time) for a in found[gang.key].acks] == [(c1.uid, acked_at)]
    # without the owner's answer, the Lease alone knows of no ack
    alone = GangClaims(as_reclaimd, "reclaimd", "replica-b", limiter=RateLimiter())
    assert (await alone.owned_by(n))[gang.key].acks == ()


async def test_old_gang_leases_are_swept_and_recent_ones_kept(
    admin: k8s.ApiClient, as_reclaimd: ApiServer
) -> None:
    leases = GangClaims(as_reclaimd, "reclaimd", "replica-a", limiter=RateLimiter())
    old_gang, new_gang = _gang(f"old-{RUN}", "o1"), _gang(f"new-{RUN}", "n1")
    assert await leases.acquire(old_gang, notice(f"old-{RUN}"))
    assert await leases.acquire(new_gang, notice(f"new-{RUN}"))
    coord = k8s.CoordinationV1Api(admin)
    # As if acquired a day ago.
    day_ago = (utcnow() - timedelta(days=1)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    await coord.patch_namespaced_lease(
        lease_name(old_gang), "reclaimd", {"spec": {"acquireTime": day_ago}}
    )
    assert await leases.sweep(keep_s=3600) >= 1
    names = {x.metadata.name for x in (await coord.list_namespaced_lease("reclaimd")).items}
    assert lease_name(old_gang) not in names and lease_name(new_gang) in names
