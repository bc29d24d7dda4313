"""reclaimd warns at start when Karpenter or aws-node-termination-handler drains on the same
Spot warnings (reclaimd/cluster/peers.py, docs/peers.md), on the stack's API server.

Fake peers are created as admin where their charts put them (Deployments with 0 replicas: only
their specs are read), and the check runs as user ``reclaimd`` with the chart's RBAC
(deploy/kubernetes/rbac.yaml): get on those names only, so a Deployment of another name is
refused (403), and nothing is listed.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubernetes_asyncio import client as k8s
from stack import Stack
from test_cluster_api import RBAC_DOCS, apply_rbac, node_body
from test_dry_run import log_lines, wait_for

from chaos import stack as stackenv
from chaos.harness import Harness
from reclaimd.cluster import apiserver, connect, errors, peers
from reclaimd.cluster.apiserver import ApiServer

RUN = secrets.token_hex(3)
OUR_QUEUE = "https://sqs.us-east-2.amazonaws.com/111122223333/reclaimd-interruptions"


def workload(kind: str, name: str, env: dict[str, str], args: list[str] | None = None) -> Any:
    container: dict[str, Any] = {
        "name": "controller",
        "image": "peer:fake",
        "env": [{"name": k, "value": v} for k, v in env.items()],
    }
    if args:
        container["args"] = args
    spec: dict[str, Any] = {
        "selector": {"matchLabels": {"app": name}},
        "template": {
            "metadata": {"labels": {"app": name}},
            # On no node: only the spec is read.
            "spec": {"nodeSelector": {"reclaimd-e2e-nowhere": RUN}, "containers": [container]},
        },
    }
    if kind == "Deployment":
        spec["replicas"] = 0
    return {
        "apiVersion": "apps/v1",
        "kind": kind,
        "metadata": {"name": name, "namespace": "kube-system"},
        "spec": spec,
    }


@pytest.fixture
async def admin(kube: k8s.ApiClient) -> AsyncIterator[k8s.ApiClient]:
    await apply_rbac(kube, RBAC_DOCS)
    yield kube
    apps, core = k8s.AppsV1Api(kube), k8s.CoreV1Api(kube)
    for name in (peers.KARPENTER, peers.NTH, f"karpenter-{RUN}"):
        with contextlib.suppress(k8s.ApiException):
            await apps.delete_namespaced_deployment(name, "kube-system")
    with contextlib.suppress(k8s.ApiException):
        await apps.delete_namespaced_daemon_set(peers.NTH, "kube-system")
    with contextlib.suppress(k8s.ApiException):
        await core.delete_node(f"karp-{RUN}")


@pytest.fixture
async def as_reclaimd(admin: k8s.ApiClient, stack: Stack) -> AsyncIterator[ApiServer]:
    async with await connect.build_api_client(str(stack.reclaimd_kubeconfig)) as api:
        yield api


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "reclaimd.cluster.peers" and r.levelno == logging.WARNING
    ]


async def test_no_peer_no_warning(
    admin: k8s.ApiClient, as_reclaimd: ApiServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="reclaimd.cluster.peers")
    assert await peers.warn(as_reclaimd, OUR_QUEUE) == []
    assert warnings(caplog) == []
    # Allowed to look (404s, not 403s): nothing logged as unread either.
    assert not [r for r in caplog.records if "could not check" in r.getMessage()]


async def test_karpenter_on_our_queue_is_named_with_its_nodes(
    admin: k8s.ApiClient, as_reclaimd: ApiServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="reclaimd.cluster.peers")
    apps = k8s.AppsV1Api(admin)
    # Karpenter's chart: settings.interruptionQueue -> env INTERRUPTION_QUEUE (a queue name).
    await apps.create_namespaced_deployment(
        "kube-system",
        workload("Deployment", "karpenter", {"INTERRUPTION_QUEUE": "reclaimd-interruptions"}),
    )
    await k8s.CoreV1Api(admin).create_node(
        node_body(f"karp-{RUN}", labels={"karpenter.sh/nodepool": "gpu-spot"})
    )
    found = await peers.warn(as_reclaimd, OUR_QUEUE)
    assert warnings(caplog) == found
    (line,) = found
    assert line.startswith("Karpenter (Deployment kube-system/karpenter) handles Spot")
    assert "reclaimd's own queue reclaimd-interruptions" in line
    assert "label karpenter.sh/nodepool; this cluster has some" in line
    assert 'settings.interruptionQueue to ""' in line and "docs/peers.md" in line

    # Its own queue (as Karpenter's getting-started makes one per cluster): still a race.
    await apps.patch_namespaced_deployment(
        "karpenter",
        "kube-system",
        workload("Deployment", "karpenter", {}, ["--interruption-queue=my-cluster"]),
    )
    (line,) = await peers.warn(as_reclaimd, OUR_QUEUE)
    assert "its queue my-cluster, fed by the same EventBridge events" in line

    # Interruption handling off: nothing to say.
    await apps.replace_namespaced_deployment(
        "karpenter", "kube-system", workload("Deployment", "karpenter", {"INTERRUPTION_QUEUE": ""})
    )
    assert await peers.warn(as_reclaimd, OUR_QUEUE) == []


async def test_nth_queue_and_imds_modes(
    admin: k8s.ApiClient, as_reclaimd: ApiServer, caplog: pytest.LogCaptureFixture
) -> None:
    apps = k8s.AppsV1Api(admin)
    await apps.create_namespaced_deployment(
        "kube-system",
        workload(
            "Deployment",
            peers.NTH,
            {"ENABLE_SQS_TERMINATION_DRAINING": "true", "QUEUE_URL": OUR_QUEUE},
        ),
    )
    await apps.create_namespaced_daemon_set(
        "kube-system",
        workload("DaemonSet", peers.NTH, {"ENABLE_SPOT_INTERRUPTION_DRAINING": "true"}),
    )
    queue_mode, imds_mode = await peers.warn(as_reclaimd, OUR_QUEUE)
    assert queue_mode.startswith(
        "aws-node-termination-handler (Deployment kube-system/aws-node-termination-handler) in "
        f"queue mode drains on Spot warnings from reclaimd's own queue {OUR_QUEUE}"
    )
    assert "instances tagged aws-node-termination-handler/managed" in queue_mode
    assert imds_mode.startswith(
        "aws-node-termination-handler (DaemonSet kube-system/aws-node-termination-handler) in "
        "IMDS mode drains the 0 node(s)"
    )
    # Queue mode off, IMDS draining off: silent.
    await apps.replace_namespaced_deployment(
        peers.NTH, "kube-system", workload("Deployment", peers.NTH, {})
    )
    await apps.replace_namespaced_daemon_set(
        peers.NTH,
        "kube-system",
        workload("DaemonSet", peers.NTH, {"ENABLE_SPOT_INTERRUPTION_DRAINING": "false"}),
    )
    assert await peers.warn(as_reclaimd, OUR_QUEUE) == []


async def test_reclaimd_reads_no_other_deployment(
    admin: k8s.ApiClient, as_reclaimd: ApiServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="reclaimd.cluster.peers")
    name = f"karpenter-{RUN}"
    await k8s.AppsV1Api(admin).create_namespaced_deployment(
        "kube-system", workload("Deployment", name, {"INTERRUPTION_QUEUE": "q"})
    )
    with pytest.raises(errors.Forbidden), errors.kube_errors("get"):
        await as_reclaimd.get(apiserver.group("apps/v1", "deployments", name, "kube-system"))
    with pytest.raises(errors.Forbidden), errors.kube_errors("list"):
        await as_reclaimd.get(apiserver.group("apps/v1", "deployments", "", "kube-system"))
    # Asked about a place the chart grants nothing on: one INFO line, no warning, no raise.
    place = peers.Place("deployments", "kube-system", name)
    assert await peers.warn(as_reclaimd, OUR_QUEUE, (place,)) == []
    (unread,) = [r for r in caplog.records if "could not check" in r.getMessage()]
    assert unread.levelno == logging.INFO


async def test_a_starting_replica_warns_of_karpenter_on_its_queue(
    admin: k8s.ApiClient, stack: Stack
) -> None:
    """The whole replica (``reclaimd run``, its chart RBAC identity): one WARNING line at start
    naming Karpenter and the replica's own SQS queue, and the replica runs on."""
    async with Harness(stackenv.load()) as h:
        queue = h.queue_url.rsplit("/", 1)[-1]
        await k8s.AppsV1Api(admin).create_namespaced_deployment(
            "kube-system", workload("Deployment", "karpenter", {"INTERRUPTION_QUEUE": queue})
        )
        d = await h.start_daemon("peers")

        def warned() -> list[dict[str, Any]]:
            return [
                line
                for line in log_lines(d.log_path)
                if str(line.get("msg", "")).startswith("Karpenter (Deployment kube-system/")
            ]

        await wait_for("the Karpenter warning", warned, timeout_s=90)
        (line,) = warned()
        assert line["level"] == "warning"
        assert f"reclaimd's own queue {queue}" in line["msg"]
        assert any(x.get("msg") == "reclaimd running" for x in log_lines(d.log_path))
