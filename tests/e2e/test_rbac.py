"""The chart's RBAC (deploy/kubernetes/rbac.yaml is its render), as the real apiserver's
authorizer sees it for user ``reclaimd``; then the drill's (drill.enabled), as it sees it for
the drill's ServiceAccount."""

from __future__ import annotations

import asyncio
import os
import subprocess
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio.dynamic import DynamicClient
from stack import REPO_DIR

from chaos import kube
from chaos.harness import RBAC
from chaos.kube import apply_documents, apply_file

ALLOWED = [
    ("", "nodes", "", "patch"),
    ("", "nodes", "", "watch"),
    ("", "pods", "", "list"),
    ("", "pods", "eviction", "create"),
    ("", "pods", "", "delete"),
    ("policy", "poddisruptionbudgets", "", "watch"),  # refused evictions wait for a change
    ("kueue.x-k8s.io", "workloads", "", "patch"),
    ("coordination.k8s.io", "leases", "", "create"),  # in its own namespace only
    ("coordination.k8s.io", "leases", "", "patch"),  # its holder Lease
    ("coordination.k8s.io", "leases", "", "list"),  # its peers' holder Leases
    ("events.k8s.io", "events", "", "create"),  # reclaimd/cluster/events.py
    ("events.k8s.io", "events", "", "patch"),  # a repeated event's series
]
DENIED = [
    ("", "secrets", "", "get"),
    ("", "secrets", "", "list"),
    ("", "configmaps", "", "get"),
    ("", "nodes", "", "delete"),
    ("", "nodes", "", "create"),
    ("", "pods", "", "patch"),
    ("", "pods", "", "create"),
    ("policy", "poddisruptionbudgets", "", "patch"),
    ("", "pods", "exec", "create"),
    ("", "serviceaccounts", "token", "create"),
    ("rbac.authorization.k8s.io", "clusterroles", "", "escalate"),
    ("kueue.x-k8s.io", "workloads", "", "delete"),
    ("coordination.k8s.io", "leases", "", "update"),
    ("events.k8s.io", "events", "", "delete"),
    ("events.k8s.io", "events", "", "list"),
    ("", "events", "", "create"),  # the core group's Events API is not used
]


@pytest.fixture
async def as_reclaimd(stack: Any) -> AsyncIterator[k8s.ApiClient]:
    admin = await kube.rig_client(str(stack.kubeconfig))
    try:
        await kube.apply_file(admin, RBAC)
    finally:
        await admin.close()
    api = await kube.rig_client(str(stack.reclaimd_kubeconfig))
    yield api
    await api.close()


def namespace_for(resource: str, verb: str) -> str:
    if resource in ("nodes", "clusterroles"):
        return ""
    own = resource == "leases" and verb in ("get", "create", "patch", "list", "delete")
    return "reclaimd" if own else "default"


async def can(
    api: k8s.ApiClient, group: str, resource: str, sub: str, verb: str, *, namespace: str = ""
) -> bool:
    review = await k8s.AuthorizationV1Api(api).create_self_subject_access_review(
        {
            "spec": {
                "resourceAttributes": {
                    "group": group,
                    "resource": resource,
                    "subresource": sub,
                    "verb": verb,
                    "namespace": namespace or namespace_for(resource, verb),
                }
            }
        }
    )
    return bool(review.status.allowed)


@pytest.mark.parametrize(("group", "resource", "sub", "verb"), ALLOWED)
async def test_reclaimd_may(
    as_reclaimd: k8s.ApiClient, group: str, resource: str, sub: str, verb: str
) -> None:
    assert await can(as_reclaimd, group, resource, sub, verb)


@pytest.mark.parametrize(("group", "resource", "sub", "verb"), DENIED)
async def test_reclaimd_may_not(
    as_reclaimd: k8s.ApiClient, group: str, resource: str, sub: str, verb: str
) -> None:
    assert not await can(as_reclaimd, group, resource, sub, verb)


async def test_gang_leases_only_in_its_own_namespace(as_reclaimd: k8s.ApiClient) -> None:
    lease = ("coordination.k8s.io", "leases", "", "create")
    assert await can(as_reclaimd, *lease, namespace="reclaimd")
    assert not await can(as_reclaimd, *lease, namespace="default")
    assert not await can(as_reclaimd, *lease, namespace="kube-system")


# --- the drill's ServiceAccount (the chart with drill.enabled) -------------------------------

VERSIONS = REPO_DIR / "deploy" / "local" / "versions.env"
CACHE = Path(os.environ.get("RECLAIMD_CACHE") or Path.home() / ".cache" / "reclaimd")
PROBES = f"rd-drill-{uuid.uuid4().hex[:6]}"  # the probes' namespace, made and deleted here
# Release "reclaimd" in namespace "reclaimd": the drill's ServiceAccount is reclaimd-drill.
DRILL_SA = "system:serviceaccount:reclaimd:reclaimd-drill"
DRILL_GROUPS = ["system:serviceaccounts", "system:serviceaccounts:reclaimd", "system:authenticated"]
Attrs = tuple[str, str, str, str, str, str]  # group, resource, subresource, verb, namespace, name

# A namespace of "" is cluster scope; a name of "" is any.
DRILL_ALLOWED: list[Attrs] = [
    ("", "nodes", "", "list", "", ""),
    ("", "nodes", "", "patch", "", ""),  # label, cordon and taint back
    ("", "pods", "", "list", "", ""),  # what runs on each drill node, in any namespace
    ("", "configmaps", "", "get", "reclaimd", "reclaimd"),  # the release's settings
    ("", "configmaps", "", "get", "reclaimd", "reclaimd-node-agent"),
    ("apps", "deployments", "", "list", "reclaimd", ""),  # the release, by its labels
    ("apps", "daemonsets", "", "get", "reclaimd", "reclaimd-node-agent"),
    ("", "pods", "", "watch", "reclaimd", ""),
    ("", "pods", "", "create", PROBES, ""),
    ("", "pods", "", "delete", PROBES, ""),
    ("", "pods", "", "deletecollection", PROBES, ""),  # the run's probes, by label
    ("", "pods", "status", "patch", PROBES, ""),  # a stand-in rank's start time
    ("policy", "poddisruptionbudgets", "", "create", PROBES, ""),
    ("kueue.x-k8s.io", "workloads", "", "create", PROBES, ""),
    ("kueue.x-k8s.io", "workloads", "status", "update", PROBES, ""),
    ("", "events", "", "list", PROBES, ""),
    ("events.k8s.io", "events", "", "watch", "default", ""),  # node Events
    ("", "events", "", "list", "default", ""),
]
DRILL_DENIED: list[Attrs] = [
    ("", "secrets", "", "get", "reclaimd", ""),
    ("", "secrets", "", "list", "", ""),
    ("", "secrets", "", "get", PROBES, ""),
    ("", "configmaps", "", "get", "reclaimd", "someone-elses"),
    ("", "configmaps", "", "list", "reclaimd", ""),
    ("", "pods", "", "delete", "reclaimd", ""),  # only with drill.faults
    ("", "pods", "", "create", "reclaimd", ""),
    ("", "pods", "", "create", "default", ""),
    ("", "pods", "exec", "create", PROBES, ""),
    ("", "pods", "eviction", "create", PROBES, ""),  # draining is the release's job
    ("", "nodes", "", "delete", "", ""),
    ("", "nodes", "", "create", "", ""),
    ("", "namespaces", "", "delete", "", "kube-system"),
    ("", "namespaces", "", "delete", "", PROBES),  # given --namespace, only its objects go
    ("", "namespaces", "", "get", "", "reclaimd"),
    ("", "namespaces", "", "create", "", ""),  # given --namespace: the chart's, not touched
    ("coordination.k8s.io", "leases", "", "delete", "reclaimd", ""),  # the release's own
    ("", "serviceaccounts", "token", "create", "reclaimd", "reclaimd"),
    ("apps", "deployments", "", "patch", "reclaimd", "reclaimd"),
    ("coordination.k8s.io", "leases", "", "delete", "default", ""),
    ("kueue.x-k8s.io", "workloads", "", "delete", "default", ""),
    ("events.k8s.io", "events", "", "create", "default", ""),
    ("", "events", "", "list", "kube-system", ""),
    ("rbac.authorization.k8s.io", "clusterroles", "", "escalate", "", ""),
]


def attrs_id(a: Attrs) -> str:
    """A stable test id: the probes' namespace (random) is named "probes"."""
    group, resource, sub, verb, namespace, name = (
        "probes" if p == PROBES else p for p in a
    )  # fmt: skip
    what = "/".join(p for p in (group, resource, sub) if p)
    return f"{verb}-{what}-{namespace or 'cluster'}{'-' + name if name else ''}"


@pytest.fixture(scope="module")
def drill_docs(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """The drill's Namespace, ServiceAccount, roles and bindings as the chart renders them for
    release ``reclaimd`` with the node agent on (the Job left out), in apply order."""
    pins = dict(ln.split("=", 1) for ln in VERSIONS.read_text().splitlines() if "=" in ln)
    helm = CACHE / f"helm-{pins['HELM_VERSION']}" / "helm"
    if not helm.is_file():
        pytest.fail(f"no helm at {helm}: run deploy/helm/tools.sh", pytrace=False)
    values = tmp_path_factory.mktemp("drill") / "values.yaml"
    drill = {"enabled": True, "nodeLabel": "reclaimd.io/gameday=e2e", "namespace": PROBES}
    config = {"cluster_name": "e2e"}  # required by the chart
    doc = {"drill": drill, "nodeAgent": {"enabled": True}, "config": config}
    values.write_text(yaml.safe_dump(doc))
    done = subprocess.run(
        [str(helm), "template", "reclaimd", str(REPO_DIR / "deploy" / "helm" / "reclaimd"),
         "--namespace", "reclaimd", "--kube-version", pins["K8S_VERSION"].lstrip("v"),
         "-f", str(values)],
        capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-800:]
    order = ["Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role",
             "RoleBinding"]  # fmt: skip
    docs = [
        d
        for d in yaml.safe_load_all(done.stdout)
        if d
        and d["metadata"]["labels"].get("app.kubernetes.io/component") == "drill"
        and d["kind"] in order
    ]
    assert {d["kind"] for d in docs} == set(order)
    return sorted(docs, key=lambda d: order.index(d["kind"]))


@pytest.fixture(scope="module")
async def drill_rbac(kube: k8s.ApiClient, drill_docs: list[dict[str, Any]]) -> AsyncIterator[None]:
    """The drill's rights applied (after the reclaimd namespace); deleted afterwards."""
    await apply_file(kube, RBAC)
    await apply_documents(kube, drill_docs)
    # New bindings take a moment to reach the authorizer's cache: one right of each binding.
    first: list[Attrs] = [
        ("", "nodes", "", "list", "", ""),
        ("", "pods", "", "watch", "reclaimd", ""),
        ("", "pods", "", "create", PROBES, ""),
        ("", "events", "", "list", "default", ""),
    ]
    end = asyncio.get_running_loop().time() + 20
    while not all([await drill_can(kube, a) for a in first]):
        assert asyncio.get_running_loop().time() < end, "the drill's bindings never took effect"
        await asyncio.sleep(0.2)
    yield
    dyn = await DynamicClient(kube)
    for doc in reversed(drill_docs):
        resource = await dyn.resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
        meta = doc["metadata"]
        try:
            await dyn.delete(resource, name=meta["name"], namespace=meta.get("namespace"))
        except k8s.ApiException as e:
            if e.status != 404:
                raise


async def drill_can(admin: k8s.ApiClient, attrs: Attrs) -> bool:
    """The authorizer's answer for the drill's ServiceAccount (a SubjectAccessReview)."""
    group, resource, sub, verb, namespace, name = attrs
    review = await k8s.AuthorizationV1Api(admin).create_subject_access_review(
        {
            "spec": {
                "user": DRILL_SA,
                "groups": DRILL_GROUPS,
                "resourceAttributes": {
                    "group": group,
                    "resource": resource,
                    "subresource": sub,
                    "verb": verb,
                    "namespace": namespace,
                    "name": name,
                },
            }
        }
    )
    return bool(review.status.allowed)


@pytest.mark.parametrize("attrs", DRILL_ALLOWED, ids=attrs_id)
async def test_the_drill_may(kube: k8s.ApiClient, drill_rbac: None, attrs: Attrs) -> None:
    assert await drill_can(kube, attrs)


@pytest.mark.parametrize("attrs", DRILL_DENIED, ids=attrs_id)
async def test_the_drill_may_not(kube: k8s.ApiClient, drill_rbac: None, attrs: Attrs) -> None:
    assert not await drill_can(kube, attrs)
