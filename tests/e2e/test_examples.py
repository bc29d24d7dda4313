"""The trainer manifests of deploy/examples/ parse, and reclaimd makes one gang of their pods.

The stack runs no JobSet controller and no Kubeflow training operator, so the test creates the
pods each would create from the example (the example's pod template, with the labels and
annotations the controller adds: JobSet's ``jobset.sigs.k8s.io/*`` and the child Job's
``batch.kubernetes.io/*``; the operator's ``training.kubeflow.org/*``) on kwok nodes, then
resolves them with reclaimd's own cache (``ClusterCache.gangs_on_nodes``, as user
``reclaimd`` with the chart's RBAC) from one node, as a notice would. The NetworkPolicies are
created on the API server too, and must select exactly those pods.
"""

from __future__ import annotations

import contextlib
import copy
import secrets
import uuid
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_asyncio import client as k8s
from stack import REPO_DIR, Stack
from test_cluster_api import RBAC_DOCS, apply_rbac, eventually, node_body

from reclaimd.cluster import connect
from reclaimd.cluster.apiserver import ApiServer
from reclaimd.cluster.cache import ClusterCache
from reclaimd.model import CheckpointScope, GangKey
from reclaimd.settings.cache import CacheSettings

EXAMPLES = REPO_DIR / "deploy" / "examples"
RUN = secrets.token_hex(3)
NS = f"reclaimd-examples-{RUN}"
SYNC_S = 60.0


def load(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((EXAMPLES / name).read_text()) if d]


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind]
    assert len(found) == 1, f"one {kind} expected, found {len(found)}"
    return found[0]


def pod_from(
    template: Mapping[str, Any], name: str, node: str, labels: Mapping[str, str]
) -> dict[str, Any]:
    """The pod a controller makes from ``template``: its labels and annotations plus the
    controller's labels (JobSet copies its labels into annotations too)."""
    meta = template.get("metadata") or {}
    spec = copy.deepcopy(template["spec"])
    spec["nodeName"] = node
    spec.pop("nodeSelector", None)  # bound by name to a kwok node
    for c in spec["containers"]:
        c["image"] = "trainer:fake"  # kwok runs nothing
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": NS,
            "labels": {**(meta.get("labels") or {}), **labels},
            "annotations": {**(meta.get("annotations") or {}), **labels},
        },
        "spec": spec,
    }


def matches(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    assert set(selector) == {"matchLabels"}, selector
    return all(labels.get(k) == v for k, v in selector["matchLabels"].items())


# --- parse -------------------------------------------------------------------------------------


def test_every_example_parses_and_opts_in() -> None:
    files = sorted(p.name for p in EXAMPLES.glob("*.yaml"))
    assert files == ["jobset-trainer.yaml", "pytorchjob-trainer.yaml"]
    jobset = one(load("jobset-trainer.yaml"), "JobSet")
    assert jobset["apiVersion"] == "jobset.x-k8s.io/v1alpha2"
    pytorch = one(load("pytorchjob-trainer.yaml"), "PyTorchJob")
    assert pytorch["apiVersion"] == "kubeflow.org/v1"
    templates = [jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]] + [
        r["template"] for r in pytorch["spec"]["pytorchReplicaSpecs"].values()
    ]
    for t in templates:
        ann = t["metadata"]["annotations"]
        assert ann["reclaimd.io/checkpoint-url"] == "http://{pod_ip}:8080/checkpoint"
        assert ann["reclaimd.io/checkpoint-auth"] == "token"
        (c,) = t["spec"]["containers"]
        env = {e["name"]: e for e in c["env"]}
        ref = env["RECLAIMD_CHECKPOINT_AUTH"]["valueFrom"]["fieldRef"]["fieldPath"]
        assert ref == "metadata.annotations['reclaimd.io/checkpoint-auth']"
        assert {"name": "checkpoint", "containerPort": 8080, "protocol": "TCP"} in c["ports"]
        assert {"reclaimd.io/tenant", "reclaimd.io/queue"} <= set(t["metadata"]["labels"])
    for name in ("jobset-trainer.yaml", "pytorchjob-trainer.yaml"):
        policy = one(load(name), "NetworkPolicy")
        (admits, rest) = policy["spec"]["ingress"]
        assert admits["ports"] == [{"port": 8080, "protocol": "TCP"}]
        tcp = [p for p in rest["ports"] if p["protocol"] == "TCP"]
        assert tcp and all(not (p["port"] <= 8080 <= p["endPort"]) for p in tcp)


# --- on the stack ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
async def admin(kube: k8s.ApiClient) -> AsyncIterator[k8s.ApiClient]:
    await apply_rbac(kube, RBAC_DOCS)
    core = k8s.CoreV1Api(kube)
    namespace: Any = {"metadata": {"name": NS}}
    await core.create_namespace(namespace)
    account: Any = {"metadata": {"name": "default"}}
    with contextlib.suppress(k8s.ApiException):
        await core.create_namespaced_service_account(NS, account)
    yield kube
    with contextlib.suppress(k8s.ApiException):
        await core.delete_namespace(NS)
    for node in (await core.list_node(label_selector=f"reclaimd-e2e={RUN}")).items:
        with contextlib.suppress(k8s.ApiException):
            await core.delete_node(node.metadata.name)


@pytest.fixture(scope="module")
async def as_reclaimd(admin: k8s.ApiClient, stack: Stack) -> AsyncIterator[ApiServer]:
    async with await connect.build_api_client(str(stack.reclaimd_kubeconfig)) as api:
        yield api


async def create(admin: k8s.ApiClient, pods: list[Any], policy: Any) -> list[str]:
    core = k8s.CoreV1Api(admin)
    nodes = []
    for pod in pods:
        node = pod["spec"]["nodeName"]
        await core.create_node(node_body(node, labels={"reclaimd-e2e": RUN}))
        nodes.append(node)
        await core.create_namespaced_pod(NS, pod)
    await k8s.NetworkingV1Api(admin).create_namespaced_network_policy(NS, policy)
    return nodes


async def resolve(as_reclaimd: ApiServer, node: str, size: int) -> Any:
    cache = ClusterCache(as_reclaimd, settings=CacheSettings(namespaces=(NS,)))
    await cache.start()
    try:
        assert await cache.wait_synced(SYNC_S)
        # The gang seen on the node (all() of none would be true at once), every rank with an IP.
        await eventually(
            lambda: (
                bool(gangs := cache.view.gangs_on_nodes([node]))
                and all(m.pod_ip for g in gangs for m in g.members)
            ),
            "the gang seen and kwok's pod IPs",
        )
        gangs = cache.view.gangs_on_nodes([node])
        assert len(gangs) == 1 and len(gangs[0].members) == size, gangs
        return gangs[0]
    finally:
        await cache.stop()


async def test_the_jobsets_pods_are_one_gang(admin: k8s.ApiClient, as_reclaimd: ApiServer) -> None:
    docs = load("jobset-trainer.yaml")
    jobset, policy = one(docs, "JobSet"), one(docs, "NetworkPolicy")
    name = jobset["metadata"]["name"]
    (rjob,) = jobset["spec"]["replicatedJobs"]
    uid = str(uuid.uuid4())
    pods = []
    for i in range(rjob["replicas"]):
        job = f"{name}-{rjob['name']}-{i}"
        labels = {
            "jobset.sigs.k8s.io/jobset-name": name,
            "jobset.sigs.k8s.io/replicatedjob-name": rjob["name"],
            "jobset.sigs.k8s.io/replicatedjob-replicas": str(rjob["replicas"]),
            "jobset.sigs.k8s.io/job-index": str(i),
            "jobset.sigs.k8s.io/job-global-index": str(i),
            "jobset.sigs.k8s.io/jobset-uid": uid,
            "batch.kubernetes.io/job-name": job,
            "batch.kubernetes.io/job-completion-index": "0",
        }
        template = rjob["template"]["spec"]["template"]
        pods.append(pod_from(template, f"{job}-0-{RUN}", f"js-{RUN}-{i}", labels))
    # The child Job JobSet makes from the template passes the API server's own validation
    # (its podFailurePolicy on DisruptionTarget, which the set's failurePolicy rule names).
    child: Any = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": f"{name}-{rjob['name']}-0", "namespace": NS},
        "spec": rjob["template"]["spec"],
    }
    await k8s.BatchV1Api(admin).create_namespaced_job(NS, child, dry_run="All")
    (rule,) = jobset["spec"]["failurePolicy"]["rules"]
    assert rule["onJobFailureReasons"] == ["PodFailurePolicy"]
    # Rank 2's node gets the notice: the gang is every rank, wherever it runs.
    nodes = await create(admin, list(reversed(pods)), policy)
    assert all(matches(policy["spec"]["podSelector"], p["metadata"]["labels"]) for p in pods)
    gang = await resolve(as_reclaimd, f"js-{RUN}-2", rjob["replicas"])
    assert gang.key == GangKey("jobset", NS, name)
    assert [(m.rank, m.node) for m in gang.members] == [(i, f"js-{RUN}-{i}") for i in range(4)]
    assert gang.scope is CheckpointScope.RANK
    assert [m.is_leader for m in gang.members] == [True, False, False, False]
    for m in gang.members:
        assert m.checkpoint_url == f"http://{m.pod_ip}:8080/checkpoint"
        assert m.checkpoint_timeout_s == 60.0
    assert len(nodes) == 4


async def test_the_pytorchjobs_pods_are_one_gang(
    admin: k8s.ApiClient, as_reclaimd: ApiServer
) -> None:
    docs = load("pytorchjob-trainer.yaml")
    job, policy = one(docs, "PyTorchJob"), one(docs, "NetworkPolicy")
    name = job["metadata"]["name"]
    pods = []
    for rtype, spec in job["spec"]["pytorchReplicaSpecs"].items():
        for i in range(spec["replicas"]):
            kind = rtype.lower()
            labels = {
                "training.kubeflow.org/job-name": name,
                "training.kubeflow.org/operator-name": "pytorchjob-controller",
                "training.kubeflow.org/replica-type": kind,
                "training.kubeflow.org/replica-index": str(i),
                **({"training.kubeflow.org/job-role": "master"} if kind == "master" else {}),
            }
            pods.append(
                pod_from(spec["template"], f"{name}-{kind}-{i}", f"pt-{RUN}-{kind}-{i}", labels)
            )
    await create(admin, pods, policy)
    assert all(matches(policy["spec"]["podSelector"], p["metadata"]["labels"]) for p in pods)
    gang = await resolve(as_reclaimd, f"pt-{RUN}-worker-1", 4)
    assert gang.key == GangKey("kubeflow", NS, name)
    assert [(m.rank, m.name, m.is_leader) for m in gang.members] == [
        (0, f"{name}-master-0", True),
        (1, f"{name}-worker-0", False),
        (2, f"{name}-worker-1", False),
        (3, f"{name}-worker-2", False),
    ]
    assert all(m.checkpoint_url == f"http://{m.pod_ip}:8080/checkpoint" for m in gang.members)


def test_examples_dir_is_where_the_docs_say() -> None:
    text = (REPO_DIR / "docs" / "checkpoint-contract.md").read_text()
    assert "deploy/examples/jobset-trainer.yaml" in text
    assert "ARCHITECTURE" not in text
    assert Path(EXAMPLES / "jobset-trainer.yaml").is_file()
