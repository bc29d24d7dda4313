"""The chart on the real API server: strict server-side dry-run of each values combination, then
``helm install`` into a namespace that enforces the restricted Pod Security level, with
kube-scheduler placing the pods on kwok nodes, ``helm upgrade`` and ``helm uninstall``.

What this proves: the API server (1.35) accepts every object the chart renders, field by field
(``--validate=strict``: no unknown or misspelt field); Pod Security admission admits the pods;
the scheduler honours the chart's placement (the controller off reclaimable nodes, one per node,
the agent only on reclaimable ones); the RBAC objects bind. What it does not: kwok runs no
container, so no probe is ever called and the image is not pulled (tests/e2e/test_image.py
runs the image); NetworkPolicies are accepted but not enforced (no CNI here).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_asyncio import client as k8s
from stack import REPO_DIR, Stack

from chaos import fleet

CHART = REPO_DIR / "deploy" / "helm" / "reclaimd"
VERSIONS = REPO_DIR / "deploy" / "local" / "versions.env"
CACHE = Path(os.environ.get("RECLAIMD_CACHE") or Path.home() / ".cache" / "reclaimd")
# A letter first: all-digit (or 1e5-like) hex would reach helm as a YAML number, not a label.
RUN = "a" + uuid.uuid4().hex[:5]
NS = f"rd-chart-{RUN}"
TRAIN_NS = f"rd-train-{RUN}"
RELEASE = "e2e"
RUN_LABEL = "reclaimd.io/e2e-chart"
PSS_LABELS = {
    "pod-security.kubernetes.io/enforce": "restricted",
    "pod-security.kubernetes.io/enforce-version": "latest",
}


def _pin(name: str) -> str:
    for line in VERSIONS.read_text().splitlines():
        if line.startswith(name + "="):
            return line.split("=", 1)[1]
    raise AssertionError(f"{name} missing from {VERSIONS}")


HELM = CACHE / f"helm-{_pin('HELM_VERSION')}" / "helm"
PROM_CRDS = CACHE / f"prometheus-operator-crds-{_pin('PROM_OPERATOR_VERSION')}-rules"
KUBE_VERSION = _pin("K8S_VERSION").lstrip("v")

NODES = [
    fleet.NodeSpec(f"rd-od-a-{RUN}", f"i-oda{RUN}", zone="us-east-2a", purchase_option="on-demand"),
    fleet.NodeSpec(f"rd-od-b-{RUN}", f"i-odb{RUN}", zone="us-east-2b", purchase_option="on-demand"),
    fleet.NodeSpec(f"rd-spot-a-{RUN}", f"i-spa{RUN}", zone="us-east-2a", purchase_option="spot"),
    fleet.NodeSpec(f"rd-spot-b-{RUN}", f"i-spb{RUN}", zone="us-east-2b", purchase_option="spot"),
]
ON_DEMAND = {n.name for n in NODES if n.purchase_option == "on-demand"}
SPOT = {n.name for n in NODES if n.purchase_option == "spot"}

# Each values combination worth rendering; all must pass a strict server-side dry-run.
COMBINATIONS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "imds-agent": {"nodeAgent": {"enabled": True, "source": "imds"}},
    "gce-agent-no-controller": {
        "controller": {"enabled": False},
        "nodeAgent": {"enabled": True, "source": "gce-metadata"},
        "serviceAccount": {"gcpServiceAccount": "rd@p-1.iam.gserviceaccount.com"},
    },
    "aws-irsa-monitoring": {
        "serviceAccount": {"awsRoleArn": "arn:aws:iam::123456789012:role/reclaimd"},
        "metrics": {
            "serviceMonitor": {"enabled": True},
            "podMonitor": {"enabled": True},
            "prometheusRule": {"enabled": True, "alertLabels": {"team": "gpu"}},
        },
        "grafana": {"dashboard": {"enabled": True}},
        "secretEnv": {"RECLAIMD_LEDGER__BOOTSTRAP": {"secretName": "kafka", "key": "bootstrap"}},
    },
    "single-replica-claim": {
        "controller": {"replicas": 1, "outbox": {"existingClaim": "outbox"}, "antiAffinity": "none"}
    },
    "training-policy": {
        "networkPolicy": {"trainingNamespaces": [TRAIN_NS], "kafka": {"cidrs": ["10.0.0.0/8"]}}
    },
    "no-network-policy": {"networkPolicy": {"enabled": False}, "rbac": {"create": False}},
    # The drill (its Job, a test hook, and its probes' Namespace and Role): TRAIN_NS exists, so
    # the Role in it passes a dry-run (an install makes the namespace first).
    "drill": {
        "drill": {"enabled": True, "nodeLabel": f"{RUN_LABEL}=drill", "namespace": TRAIN_NS},
        "nodeAgent": {"enabled": True},
    },
}


def run(*cmd: str, stdin: str | None = None, check: bool = True, timeout: float = 240) -> str:
    done = subprocess.run(
        list(cmd), input=stdin, capture_output=True, text=True, check=False, timeout=timeout
    )
    if check and done.returncode != 0:
        err = [ln for ln in done.stderr.splitlines() if "found symbolic link" not in ln]
        raise AssertionError(f"{cmd[0]} {cmd[1]} failed: {' '.join(err)[-800:]}")
    return done.stdout


def kubectl(stack: Stack, *args: str, stdin: str | None = None, check: bool = True) -> str:
    return run("kubectl", f"--kubeconfig={stack.kubeconfig}", *args, stdin=stdin, check=check)


def helm(stack: Stack, *args: str, values: dict[str, Any] | None = None, tmp: Path) -> str:
    extra: list[str] = []
    if values is not None:
        # config.cluster_name is required by the chart.
        values = {**values, "config": {"cluster_name": "e2e", **values.get("config", {})}}
        path = tmp / f"values-{uuid.uuid4().hex[:6]}.yaml"
        path.write_text(yaml.safe_dump(values))
        extra = ["-f", str(path)]
    return run(str(HELM), f"--kubeconfig={stack.kubeconfig}", *args, *extra)


def install_values() -> dict[str, Any]:
    only_ours = {RUN_LABEL: RUN}
    return {
        "image": {"repository": "localhost/reclaimd", "tag": "e2e", "pullPolicy": "Never"},
        "controller": {"nodeSelector": only_ours},
        "nodeAgent": {"enabled": True, "nodeSelector": only_ours},
        "metrics": {
            "serviceMonitor": {"enabled": True},
            "podMonitor": {"enabled": True},
            "prometheusRule": {"enabled": True},
        },
        "grafana": {"dashboard": {"enabled": True}},
        "networkPolicy": {"trainingNamespaces": [TRAIN_NS]},
    }


@pytest.fixture(scope="module")
def tools() -> None:
    if not HELM.is_file() or not PROM_CRDS.is_dir():
        pytest.fail("helm or the prometheus-operator CRDs missing: run deploy/helm/tools.sh")


def drop_cluster_wide(stack: Stack) -> None:
    kubectl(stack, "delete", "clusterroles,clusterrolebindings", "-l",
            f"app.kubernetes.io/instance={RELEASE}", "--ignore-not-found")  # fmt: skip


@pytest.fixture(scope="module")
def cluster(stack: Stack, tools: None) -> Iterator[Stack]:
    """The namespaces (restricted Pod Security), the monitor CRDs, and four kwok nodes."""
    for crd in sorted(PROM_CRDS.glob("*.yaml")):
        kubectl(stack, "apply", "--server-side", "--force-conflicts", "-f", str(crd))
    kubectl(
        stack,
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "crd/servicemonitors.monitoring.coreos.com",
        "crd/podmonitors.monitoring.coreos.com",
        "crd/prometheusrules.monitoring.coreos.com",
    )
    for name in (NS, TRAIN_NS):
        ns = {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": name, "labels": PSS_LABELS},
        }
        kubectl(stack, "apply", "-f", "-", stdin=json.dumps(ns))
        # Pod admission needs the default ServiceAccount, which the controller-manager makes
        # when it gets to it (one fresh-clone run saw "serviceaccount default not found").
        account = {"apiVersion": "v1", "kind": "ServiceAccount",
                   "metadata": {"name": "default", "namespace": name}}  # fmt: skip
        kubectl(stack, "apply", "-f", "-", stdin=json.dumps(account), check=False)
    drop_cluster_wide(stack)  # left by an earlier run that died before its uninstall
    yield stack
    run(str(HELM), f"--kubeconfig={stack.kubeconfig}", "uninstall", RELEASE, "--namespace", NS,
        "--ignore-not-found", check=False)  # fmt: skip
    drop_cluster_wide(stack)
    kubectl(stack, "delete", "namespace", NS, TRAIN_NS, "--wait=false", "--ignore-not-found")
    kubectl(stack, "delete", "node", *sorted(ON_DEMAND | SPOT), "--ignore-not-found")


@pytest.fixture(scope="module")
async def nodes(cluster: Stack, kube: k8s.ApiClient) -> AsyncIterator[None]:
    await fleet.create_nodes_labelled(kube, NODES, {RUN_LABEL: RUN})
    await fleet.wait_nodes_ready(kube, [n.name for n in NODES])

    # Ready is kwok's word; the scheduler waits for the node lifecycle controller to lift the
    # not-ready taint, which lags when the shared stack holds thousands of nodes.
    async def untainted() -> bool:
        core = k8s.CoreV1Api(kube)
        for spec in NODES:
            node = await core.read_node(spec.name)
            if any(t.key == "node.kubernetes.io/not-ready" for t in node.spec.taints or []):
                return False
        return True

    await _wait("the node lifecycle controller lifting not-ready", untainted, timeout_s=240)
    yield


@pytest.mark.parametrize("combination", sorted(COMBINATIONS))
def test_server_side_dry_run_accepts_every_object(
    cluster: Stack, tmp_path: Path, combination: str
) -> None:
    manifests = helm(
        cluster,
        "template",
        RELEASE,
        str(CHART),
        "--namespace",
        NS,
        "--kube-version",
        KUBE_VERSION,
        values=COMBINATIONS[combination],
        tmp=tmp_path,
    )
    docs = [d for d in yaml.safe_load_all(manifests) if d]
    assert docs
    out = kubectl(
        cluster,
        "apply",
        "--dry-run=server",
        "--validate=strict",
        "--server-side",
        "-o",
        "name",
        "-f",
        "-",
        stdin=manifests,
    )
    assert len(out.split()) == len(docs)


def test_the_namespace_really_enforces_restricted(cluster: Stack) -> None:
    """Else the install below would prove nothing about Pod Security."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "root", "namespace": NS},
        "spec": {"containers": [{"name": "c", "image": "x", "securityContext": {"runAsUser": 0}}]},
    }
    done = subprocess.run(
        ["kubectl", f"--kubeconfig={cluster.kubeconfig}", "create", "--dry-run=server", "-f", "-"],
        input=json.dumps(pod),
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode != 0
    assert 'violates PodSecurity "restricted:latest"' in done.stderr


async def _pods(kube: k8s.ApiClient, component: str) -> list[Any]:
    selector = f"app.kubernetes.io/instance={RELEASE},app.kubernetes.io/component={component}"
    listed = await k8s.CoreV1Api(kube).list_namespaced_pod(NS, label_selector=selector)
    return [p for p in listed.items if p.metadata.deletion_timestamp is None]


async def _wait(what: str, check: Any, timeout_s: float = 90) -> Any:
    end = time.monotonic() + timeout_s
    while True:
        result = await check()
        if result:
            return result
        if time.monotonic() > end:
            raise AssertionError(f"{what}: not after {timeout_s}s")
        await asyncio.sleep(0.5)


async def test_install_upgrade_uninstall(
    cluster: Stack, nodes: None, kube: k8s.ApiClient, tmp_path: Path
) -> None:
    helm(
        cluster,
        "install",
        RELEASE,
        str(CHART),
        "--namespace",
        NS,
        "--wait",
        "--timeout",
        "180s",
        values=install_values(),
        tmp=tmp_path,
    )

    # The controller: two pods, on the two on-demand nodes (one each, so across both zones).
    controllers = await _pods(kube, "controller")
    placed = sorted(p.spec.node_name for p in controllers)
    assert placed == sorted(ON_DEMAND)
    # The agent: on the reclaimable (spot) nodes only, one each.
    agents = await _pods(kube, "node-agent")
    assert sorted(p.spec.node_name for p in agents) == sorted(SPOT)
    for pod in controllers + agents:
        assert pod.spec.security_context.run_as_non_root is True  # admitted as restricted

    # One more replica than there are non-reclaimable nodes: it waits rather than take a spot
    # node, though two are free.
    values = install_values()
    values["controller"]["replicas"] = 3
    helm(cluster, "upgrade", RELEASE, str(CHART), "--namespace", NS, values=values, tmp=tmp_path)

    async def unschedulable() -> Any:
        for pod in await _pods(kube, "controller"):
            for c in (pod.status.conditions or []) if pod.status else []:
                if c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable":
                    return pod
        return None

    pending = await _wait("a third controller pod the scheduler refuses", unschedulable)
    assert pending.spec.node_name is None
    assert {p.spec.node_name for p in await _pods(kube, "controller")} - {None} <= ON_DEMAND

    helm(
        cluster,
        "uninstall",
        RELEASE,
        "--namespace",
        NS,
        "--wait",
        "--timeout",
        "120s",
        tmp=tmp_path,
    )
    kinds = (
        "all,configmaps,serviceaccounts,roles,rolebindings,networkpolicies,"
        "poddisruptionbudgets,servicemonitors,podmonitors,prometheusrules"
    )
    selector = f"app.kubernetes.io/instance={RELEASE}"

    async def nothing_left() -> bool:
        names = kubectl(cluster, "get", kinds, "-A", "-l", selector, "-o", "name")
        cluster_wide = kubectl(
            cluster, "get", "clusterroles,clusterrolebindings", "-l", selector, "-o", "name"
        )
        return not names.split() and not cluster_wide.split()

    await _wait("nothing of the release left", nothing_left, timeout_s=120)
