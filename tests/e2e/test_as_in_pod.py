"""reclaimd as the chart's pod runs it, handling a real Spot notice end to end.

The image (podman, runc, read-only root), the chart's rendered ConfigMap and container
arguments, the chart's ServiceAccount and RBAC, a token from the TokenRequest API and in-cluster
configuration: token, CA and namespace at /var/run/secrets/kubernetes.io/serviceaccount,
``KUBERNETES_SERVICE_HOST``/``PORT``. Only the scheduling is not a pod's (kwok runs no
containers): the container runs on this machine with the host's network, as a pod on the
node's network would reach the API server, SQS and the ranks.
"""

from __future__ import annotations

import asyncio
import base64
import os
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from kubernetes_asyncio import client as k8s
from stack import REPO_DIR

from chaos import kube as chaos_kube
from chaos import stack as stackenv
from chaos.harness import Harness, readyz
from chaos.ports import free_port

CHART = REPO_DIR / "deploy" / "helm" / "reclaimd"
VERSIONS = REPO_DIR / "deploy" / "local" / "versions.env"
CACHE = Path(os.environ.get("RECLAIMD_CACHE") or Path.home() / ".cache" / "reclaimd")
BUILD = REPO_DIR / "deploy" / "image" / "build.sh"
PODMAN = ["podman", "--cgroup-manager", "cgroupfs", "--runtime", "runc"]
ULIMITS = ["--ulimit", "nofile=4096:4096", "--ulimit", "nproc=4096:4096"]
# The outbox volume, owned by the image's user (U) as the chart's emptyDir is through fsGroup.
OUTBOX_TMPFS = "type=tmpfs,destination=/var/lib/reclaimd,tmpfs-size=64m,tmpfs-mode=0700,U=true"
SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
RELEASE = "pod"


def _pin(name: str) -> str:
    for line in VERSIONS.read_text().splitlines():
        if line.startswith(name + "="):
            return line.split("=", 1)[1]
    raise AssertionError(f"{name} missing from {VERSIONS}")


HELM = CACHE / f"helm-{_pin('HELM_VERSION')}" / "helm"


def image_tag() -> str:
    done = subprocess.run([str(BUILD)], capture_output=True, text=True, check=False, timeout=1500)
    if done.returncode != 0:
        pytest.fail(f"deploy/image/build.sh failed: {done.stderr.strip()[-600:]}", pytrace=False)
    archive = Path(done.stdout.strip().splitlines()[-1])
    subprocess.run([*PODMAN, "load", "-q", "-i", str(archive)], check=True, capture_output=True)
    return (archive.parent / "tag").read_text().strip()


def render(namespace: str, values: dict[str, Any], tmp: Path) -> list[dict[str, Any]]:
    path = tmp / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    out = subprocess.run(
        [str(HELM), "template", RELEASE, str(CHART), "--namespace", namespace,
         "--kube-version", _pin("K8S_VERSION").lstrip("v"), "-f", str(path)],
        capture_output=True, text=True, check=True, timeout=120,
    ).stdout  # fmt: skip
    return [d for d in yaml.safe_load_all(out) if d]


def cluster_ca(kubeconfig: Path) -> bytes:
    cfg = yaml.safe_load(kubeconfig.read_text())
    cluster = cfg["clusters"][0]["cluster"]
    if "certificate-authority-data" in cluster:
        return base64.b64decode(cluster["certificate-authority-data"])
    path = Path(cluster["certificate-authority"])
    return (path if path.is_absolute() else kubeconfig.parent / path).read_bytes()


def podman(*args: str, check: bool = False, timeout: float = 120) -> str:
    done = subprocess.run(
        [*PODMAN, *args], capture_output=True, text=True, check=False, timeout=timeout
    )
    if check and done.returncode != 0:
        raise AssertionError(f"podman {args[0]} failed: {done.stderr.strip()[-600:]}")
    return done.stdout + (done.stderr if not check else "")


@pytest.fixture
async def h(stack: Any) -> AsyncIterator[Harness]:
    async with Harness(stackenv.load()) as harness:
        yield harness


@dataclass
class Pod:
    """What the kubelet would hand the container: files, environment, arguments."""

    namespace: str
    port: int
    sa_dir: Path
    etc_dir: Path
    args: list[str]


@pytest.fixture
async def pod(h: Harness, stack: Any, tmp_path: Path) -> AsyncIterator[Pod]:
    """The chart rendered for this run; its ServiceAccount, RBAC and ConfigMap applied (not the
    Deployment: kwok would only pretend to run it); a token from TokenRequest."""
    if not HELM.is_file():
        pytest.fail(f"no helm at {HELM}: run deploy/helm/tools.sh", pytrace=False)
    namespace = f"rd-pod-{h.run_id}"
    port = free_port()
    values = {
        "metricsPort": port,
        "config": {
            "cluster_name": "local",
            "sqs": {
                "enabled": True,
                "queue_url": h.queue_url,
                "endpoint_url": h.stack.aws_endpoint,
                "region": h.stack.values.get("AWS_DEFAULT_REGION", "us-east-1"),
                "wait_time_s": 1,
                "visibility_timeout_s": 10,
            },
            "ledger": {"bootstrap": h.stack["KAFKA_SASL_SSL_BOOTSTRAP"], "topic": h.topic},
        },
        # As production: SASL_SSL with the CA and the password from Secrets the chart mounts
        # (their files are laid out below as the kubelet would).
        "kafka": {
            "securityProtocol": "SASL_SSL",
            "tls": {"caSecret": {"name": "kafka-ca", "key": "ca.crt"}},
            "sasl": {
                "mechanism": "SCRAM-SHA-512",
                "username": "reclaimd",
                "passwordSecret": {"name": "reclaimd-kafka", "key": "password"},
            },
        },
    }
    docs = await asyncio.to_thread(render, namespace, values, tmp_path)
    assert h.api is not None
    core = k8s.CoreV1Api(h.api)
    await core.create_namespace({"metadata": {"name": namespace}})  # type: ignore[arg-type]
    wanted = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
              "ConfigMap"}  # fmt: skip
    await chaos_kube.apply_documents(h.api, [d for d in docs if d["kind"] in wanted])
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    spec = deployment["spec"]["template"]["spec"]
    config_map = next(d for d in docs if d["kind"] == "ConfigMap")
    token = await core.create_namespaced_service_account_token(
        spec["serviceAccountName"],
        namespace,
        {"spec": {"expirationSeconds": 3600}},  # type: ignore[arg-type]
    )
    sa = tmp_path / "serviceaccount"
    etc = tmp_path / "etc"
    sa.mkdir()
    etc.mkdir()
    (sa / "token").write_text(token.status.token)
    (sa / "ca.crt").write_bytes(cluster_ca(stack.kubeconfig))
    (sa / "namespace").write_text(namespace)
    (etc / "config.yaml").write_text(config_map["data"]["config.yaml"])
    # The Kafka Secrets' volumes under /etc/reclaimd/kafka (templates/_kafka.tpl).
    pki = Path(h.stack["KAFKA_PKI_DIR"])
    for sub, name, source in (
        ("ca", "ca.crt", "ca.crt"),
        ("sasl", "password", "reclaimd.password"),
    ):
        (etc / "kafka" / sub).mkdir(parents=True)
        (etc / "kafka" / sub / name).write_bytes((pki / source).read_bytes())
    for d in (sa, etc):
        for path in (d, *d.rglob("*")):
            # Readable by uid 65532, as the kubelet's projected and fsGroup volumes are.
            os.chmod(path, 0o755 if path.is_dir() else 0o644)
    yield Pod(namespace, port, sa, etc, list(spec["containers"][0]["args"]))
    await core.delete_namespace(namespace)
    rbac = k8s.RbacAuthorizationV1Api(h.api)
    for d in docs:
        if d["kind"] == "ClusterRole":
            await rbac.delete_cluster_role(d["metadata"]["name"])
        elif d["kind"] == "ClusterRoleBinding":
            await rbac.delete_cluster_role_binding(d["metadata"]["name"])


@pytest.fixture
async def container(pod: Pod, h: Harness, stack: Any) -> AsyncIterator[str]:
    tag = await asyncio.to_thread(image_tag)
    api = urlsplit(h.stack.values["KUBE_APISERVER"])
    env = {
        "KUBERNETES_SERVICE_HOST": api.hostname or "127.0.0.1",
        "KUBERNETES_SERVICE_PORT": str(api.port or 443),
        # In a pod these come from IRSA; moto takes any.
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
    }
    env_args = [a for k, v in env.items() for a in ("-e", f"{k}={v}")]
    cid = (
        await asyncio.to_thread(
            podman,
            "run", "-d", "--read-only", "--network", "host", *ULIMITS,
            "--hostname", f"reclaimd-{h.run_id}",
            "--mount", OUTBOX_TMPFS,
            "-v", f"{pod.sa_dir}:{SA_DIR}:ro", "-v", f"{pod.etc_dir}:/etc/reclaimd:ro",
            *env_args, tag, *pod.args,
            check=True,
        )
    ).strip()  # fmt: skip
    try:
        yield cid
    finally:
        print((await asyncio.to_thread(podman, "logs", cid))[-3000:])
        await asyncio.to_thread(podman, "rm", "-f", "-t", "5", cid)


async def wait_ready(cid: str, port: int, timeout_s: float = 120) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout_s
    while (await asyncio.to_thread(readyz, port))[0] != 200:
        running = await asyncio.to_thread(podman, "inspect", "-f", "{{.State.Running}}", cid)
        if running.strip() != "true" or loop.time() > end:
            raise AssertionError(f"not ready (running={running.strip()})")
        await asyncio.sleep(1)


async def test_spot_notice_handled_by_the_pod_as_the_chart_runs_it(
    h: Harness, pod: Pod, container: str
) -> None:
    nodes = [h.node_spec(i) for i in range(2)]
    await h.add_nodes(nodes)
    gang = await h.add_gang("train", [n.name for n in nodes])
    await wait_ready(container, pod.port)
    notice = h.send_spot(nodes[0])
    claim = await h.wait_phase(nodes[0].name, "done", timeout_s=90)
    assert claim["notice_id"] == notice.id
    # The pod's identity did it: the claim names the container's hostname (the pod name).
    assert claim["holder"] == f"reclaimd-{h.run_id}"
    node = await h.core.read_node(nodes[0].name)
    assert node.spec.unschedulable is True
    (event,) = await h.ledger_events(count=1, timeout_s=90, settle_s=2.0)
    assert event["x_NoticeId"] == notice.id
    assert event["x_GangId"].endswith(f"/{gang.name}")

    # What the operator sees, written under the chart's RBAC (events.k8s.io create/patch).
    async def interrupted() -> list[Any]:
        listed = await k8s.EventsV1Api(h.api).list_event_for_all_namespaces(
            field_selector="reason=Interrupted"
        )
        return [e for e in listed.items if e.regarding.name == nodes[0].name]

    seen: list[Any] = []
    for _ in range(60):  # events are written last in the budget: allow them a moment
        if seen := await interrupted():
            break
        await asyncio.sleep(1)
    assert len(seen) == 1, "no Interrupted event on the node"
    assert notice.id in seen[0].note
    assert seen[0].reporting_instance == f"reclaimd-{h.run_id}"
    pod_events = await k8s.CoreV1Api(h.api).list_namespaced_event(
        h.namespace, field_selector=f"involvedObject.name={gang.pod_name(0)}"
    )
    assert {"CheckpointRequested"} <= {e.reason for e in pod_events.items}
