"""The chart's priority classes on an apiserver that limits them as GKE does (issue 35, item 4).

GKE's apiserver runs the ResourceQuota admission plugin with system-node-critical and
system-cluster-critical as limitedResources (the Kubernetes docs: "Limit Priority Class
consumption by default"): a pod of those classes is refused outside kube-system unless a
ResourceQuota of its namespace covers that priority class, "insufficient quota to match these
scopes". The stack's apiserver does not, and is shared: this test starts a second
kube-apiserver of the stack's version on the stack's etcd under a prefix of its own (so
nothing of the stack's cluster is seen or touched), with that admission configuration, and
creates reclaimd's pods as the chart renders them: refused in a namespace without the chart's
ResourceQuota, admitted in one with it. No kube-controller-manager runs there, so the quota's
status (which admission requires) is written by the test as the controller would.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from stack import REPO_DIR, Stack

CACHE = Path(os.environ.get("RECLAIMD_CACHE") or Path.home() / ".cache" / "reclaimd")
VERSIONS = dict(
    line.split("=", 1)
    for line in (REPO_DIR / "deploy" / "local" / "versions.env").read_text().splitlines()
    if "=" in line and not line.startswith("#")
)
APISERVER = CACHE / f"k8s-{VERSIONS['K8S_VERSION']}" / "kube-apiserver"
HELM = CACHE / f"helm-{VERSIONS['HELM_VERSION']}" / "helm"
CHART = REPO_DIR / "deploy" / "helm" / "reclaimd"
ETCD = "http://127.0.0.1:12379"  # deploy/local/stack.sh
CRITICAL = ["system-node-critical", "system-cluster-critical"]

# As GKE (and the Kubernetes docs' example) configures it.
ADMISSION = {
    "apiVersion": "apiserver.config.k8s.io/v1",
    "kind": "AdmissionConfiguration",
    "plugins": [{
        "name": "ResourceQuota",
        "configuration": {
            "apiVersion": "apiserver.config.k8s.io/v1",
            "kind": "ResourceQuotaConfiguration",
            "limitedResources": [{
                "resource": "pods",
                "matchScopes": [
                    {"scopeName": "PriorityClass", "operator": "In", "values": CRITICAL}
                ],
            }],
        },
    }],
}  # fmt: skip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Kubectl:
    def __init__(self, kubeconfig: Path) -> None:
        self.kubeconfig = kubeconfig

    def __call__(self, *args: str, stdin: str | None = None, check: bool = True) -> str:
        done = subprocess.run(
            ["kubectl", "--kubeconfig", str(self.kubeconfig), *args],
            input=stdin, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        if check and done.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)}: {done.stderr}")
        return done.stdout + done.stderr

    def apply(self, *docs: dict[str, Any]) -> str:
        return self("apply", "-f", "-", stdin=yaml.safe_dump_all(docs), check=False)


@pytest.fixture(scope="module")
def gke(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kubectl]:
    if not APISERVER.is_file():
        pytest.fail(f"no kube-apiserver at {APISERVER}: make stack-up", pytrace=False)
    tmp = tmp_path_factory.mktemp("gke-apiserver")
    pki = stack.stack_dir / "pki"
    (tmp / "admission.yaml").write_text(yaml.safe_dump(ADMISSION))
    port = free_port()
    cmd = [
        str(APISERVER), f"--etcd-servers={ETCD}", f"--etcd-prefix=/reclaimd-gke-{uuid.uuid4().hex}",
        "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", f"--secure-port={port}",
        f"--cert-dir={tmp / 'certs'}",
        f"--tls-cert-file={pki / 'apiserver.crt'}",
        f"--tls-private-key-file={pki / 'apiserver.key'}",
        f"--client-ca-file={pki / 'ca.crt'}", "--authorization-mode=RBAC",
        f"--admission-control-config-file={tmp / 'admission.yaml'}",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-account-key-file={pki / 'sa.pub'}",
        f"--service-account-signing-key-file={pki / 'sa.key'}",
        "--service-cluster-ip-range=10.97.0.0/16", "--endpoint-reconciler-type=none",
        "--profiling=false",
    ]  # fmt: skip
    log = (tmp / "apiserver.log").open("w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    kubeconfig = yaml.safe_load(stack.kubeconfig.read_text())
    kubeconfig["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{port}"
    (tmp / "kubeconfig").write_text(yaml.safe_dump(kubeconfig))
    kubectl = Kubectl(tmp / "kubeconfig")
    try:
        deadline = time.monotonic() + 90
        while "ok" not in kubectl("get", "--raw", "/readyz", check=False):
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = (tmp / "apiserver.log").read_text()[-2000:]
                pytest.fail(f"second apiserver not ready: {tail}")
            time.sleep(1)
        # The bootstrap priority classes exist (the apiserver makes them).
        deadline = time.monotonic() + 30
        while "system-node-critical" not in kubectl("get", "priorityclass", check=False):
            assert time.monotonic() < deadline, "no system priority classes"
            time.sleep(0.5)
        yield kubectl
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def render(namespace: str) -> list[dict[str, Any]]:
    out = subprocess.run(
        [str(HELM), "template", "reclaimd", str(CHART), "--namespace", namespace,
         "--kube-version", VERSIONS["K8S_VERSION"].lstrip("v"), "--set", "nodeAgent.enabled=true",
         "--set", "config.cluster_name=e2e"],
        capture_output=True, text=True, timeout=120, check=True,
    ).stdout  # fmt: skip
    return [d for d in yaml.safe_load_all(out) if d]


def pods(docs: list[dict[str, Any]], namespace: str) -> list[dict[str, Any]]:
    """The controller's and the node agent's pods, as their Deployment and DaemonSet make them."""
    out = []
    for d in docs:
        if d["kind"] in ("Deployment", "DaemonSet"):
            template = d["spec"]["template"]
            out.append({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": d["metadata"]["name"].lower() + "-0", "namespace": namespace,
                             "labels": template["metadata"]["labels"]},
                "spec": template["spec"],
            })  # fmt: skip
    assert sorted(p["spec"]["priorityClassName"] for p in out) == sorted(CRITICAL)
    return out


def setup_namespace(kubectl: Kubectl, docs: list[dict[str, Any]], namespace: str) -> None:
    kubectl("create", "namespace", namespace)
    for d in docs:
        if d["kind"] == "ServiceAccount":
            kubectl.apply(d)


def test_without_the_quota_gke_refuses_reclaimds_pods(gke: Kubectl) -> None:
    ns = "reclaimd-no-quota"
    docs = [d for d in render(ns) if d["kind"] != "ResourceQuota"]
    setup_namespace(gke, docs, ns)
    for pod in pods(docs, ns):
        out = gke.apply(pod)
        assert "insufficient quota to match these scopes" in out, out


def test_the_charts_quota_lets_them_in(gke: Kubectl) -> None:
    ns = "reclaimd"
    docs = render(ns)
    (quota,) = [d for d in docs if d["kind"] == "ResourceQuota"]
    setup_namespace(gke, docs, ns)
    assert "created" in gke.apply(quota)
    # What kube-controller-manager's quota controller would write (admission needs a status).
    name = quota["metadata"]["name"]
    status = {"status": {"hard": quota["spec"]["hard"], "used": {"pods": "0"}}}
    gke("patch", "resourcequota", name, "-n", ns, "--subresource=status", "--type=merge",
        "-p", json.dumps(status))  # fmt: skip
    for pod in pods(docs, ns):
        out = gke.apply(pod)
        assert "created" in out, out
    used = json.loads(gke("get", "resourcequota", name, "-n", ns, "-o", "json"))["status"]["used"]
    assert used["pods"] == "2"  # both counted against the chart's quota
