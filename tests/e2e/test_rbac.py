"""The chart's RBAC (deploy/kubernetes/rbac.yaml is its render), as the real apiserver's
authorizer sees it for user ``reclaimd``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubernetes_asyncio import client as k8s

from chaos import kube
from chaos.harness import RBAC
from reclaimd.cluster.client import build_api_client

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
    admin = await build_api_client(str(stack.kubeconfig))
    try:
        await kube.apply_file(admin, RBAC)
    finally:
        await admin.close()
    api = await build_api_client(str(stack.reclaimd_kubeconfig))
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
