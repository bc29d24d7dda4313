"""``make bench-cache``: the informer cache's memory at fleet scale, as JSON.

Creates plain API objects straight in the local apiserver (no kwok, nothing runs them):
``--nodes`` nodes labelled ``reclaimd.io/bench=cache`` (no cloud providerID, so no drill
matches them) and ``--pods`` pods bound to them by ``spec.nodeName`` in the bench's own
namespaces, ``--gpu-pods`` of them GPU training ranks in gangs of 8 (JobSet, Kubeflow,
Kueue pod group, indexed Job, LeaderWorkerSet markers, the checkpoint contract's annotations,
a sidecar, status Running), the rest CPU pods. Then a fresh process imports reclaimd as
``reclaimd run`` does, reads its RSS (the baseline), builds the daemon's ``ClusterCache``
against the apiserver, waits for it to sync and reads its RSS again: VmRSS after sync and
VmHWM, the peak, from /proc/self/status. Everything created is deleted at the end, also on a
failure or Ctrl-C (``--cleanup`` sweeps what an interrupted run left).

Figures are reported, never asserted: the machine is shared and noisy.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import json
import platform
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

BENCH_LABEL = "reclaimd.io/bench"
BENCH_VALUE = "cache"
RUN_LABEL = "reclaimd.io/bench-run"
TARGET_MB = 150.0
GANG_RANKS = 8
GPU_PODS_PER_NODE = 4
CPU_PODS_PER_NODE = 16
NAMESPACES_GPU = 5
NAMESPACES_CPU = 15
SYNC_TIMEOUT_S = 600.0
CLEANUP_ATTEMPTS = 10
SETTLE_S = 10.0
FRAMEWORKS = ("jobset", "kubeflow", "kueue", "job", "lws")
# What ``reclaimd.daemon`` imports (if the daemon itself cannot be imported).
DAEMON_PARTS = (
    "aiohttp",
    "opentelemetry.trace",
    "reclaimd.checkpoint",
    "reclaimd.health",
    "reclaimd.ledger.writer",
    "reclaimd.logs",
    "reclaimd.metrics",
    "reclaimd.tracing",
    "reclaimd.waste",
    "reclaimd.cluster.actions",
    "reclaimd.cluster.cache",
    "reclaimd.cluster.claims",
    "reclaimd.cluster.connect",
    "reclaimd.cluster.errors",
    "reclaimd.cluster.gangclaims",
    "reclaimd.cluster.ratelimit",
    "reclaimd.config",
    "reclaimd.intake",
    "reclaimd.pipeline",
    "reclaimd.scheduler",
)


class BadInput(Exception):
    """One line for the user, exit code 2."""


# --- /proc ------------------------------------------------------------------------------------


def memory_mb() -> dict[str, float]:
    """VmRSS and VmHWM (the peak RSS) of this process, in MiB."""
    out: dict[str, float] = {}
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(rest.split()[0]) / 1024
    return out


# --- the objects --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Shape:
    nodes: int
    pods: int
    gpu_pods: int

    @property
    def gpu_nodes(self) -> int:
        return min(self.nodes, -(-self.gpu_pods // GPU_PODS_PER_NODE))

    @property
    def cpu_pods(self) -> int:
        return self.pods - self.gpu_pods


def node_name(run: str, i: int) -> str:
    return f"bench-cache-{run}-n{i:05d}"


def namespaces(run: str) -> tuple[list[str], list[str]]:
    gpu = [f"bench-cache-{run}-gpu{i}" for i in range(NAMESPACES_GPU)]
    cpu = [f"bench-cache-{run}-cpu{i}" for i in range(NAMESPACES_CPU)]
    return gpu, cpu


def bench_labels(run: str) -> dict[str, str]:
    return {BENCH_LABEL: BENCH_VALUE, RUN_LABEL: run}


def node_body(run: str, i: int, gpu: bool) -> dict[str, Any]:
    """A node as a cloud provider and kubelet would register it, without a cloud providerID."""
    name = node_name(run, i)
    zone = f"bench-zone-{i % 3}"
    labels = {
        **bench_labels(run),
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "beta.kubernetes.io/os": "linux",
        "beta.kubernetes.io/arch": "amd64",
        "node.kubernetes.io/instance-type": "p5.48xlarge" if gpu else "m7i.8xlarge",
        "topology.kubernetes.io/region": "bench-region",
        "topology.kubernetes.io/zone": zone,
        "karpenter.sh/capacity-type": "spot" if i % 2 else "on-demand",
        "karpenter.sh/nodepool": "gpu-train" if gpu else "general",
        "team": f"team-{i % 7}",
    }
    if gpu:
        labels |= {
            "nvidia.com/gpu.present": "true",
            "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
            "nvidia.com/gpu.count": "8",
            "nvidia.com/cuda.driver.major": "550",
        }
    capacity = {"cpu": "192", "memory": "2097152Mi", "pods": "110", "ephemeral-storage": "1Ti"}
    if gpu:
        capacity["nvidia.com/gpu"] = "8"
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": labels,
            "annotations": {
                "node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true",
                # The bench's own scheme: no drill or notice resolves it to a cloud instance.
                "reclaimd.io/instance-id": f"bench-{run}-{i:05d}",
            },
        },
        "spec": {"providerID": f"bench-cache:///{zone}/{name}"},
        "status": {
            "capacity": capacity,
            "allocatable": capacity,
            "addresses": [
                {
                    "type": "InternalIP",
                    "address": f"10.{i // 65536 % 256}.{i // 256 % 256}.{i % 256}",
                },
                {"type": "Hostname", "address": name},
            ],
            "nodeInfo": {
                "architecture": "amd64",
                "containerRuntimeVersion": "containerd://1.7.27",
                "kernelVersion": "6.1.0-bench",
                "kubeProxyVersion": "",
                "kubeletVersion": "v1.35.4",
                "operatingSystem": "linux",
                "osImage": "Bench Linux",
                "machineID": uuid.uuid5(uuid.NAMESPACE_DNS, name).hex,
                "systemUUID": str(uuid.uuid5(uuid.NAMESPACE_URL, name)),
                "bootID": str(uuid.uuid5(uuid.NAMESPACE_OID, name)),
            },
            "images": [
                {
                    "names": [f"registry.example/train/image-{k}@sha256:{k:064x}"],
                    "sizeBytes": 1 << 30,
                }
                for k in range(8 if gpu else 3)
            ],
        },
    }


def _gpu_markers(fw: str, gang: str, rank: int, owner_uid: str) -> dict[str, str]:
    if fw == "jobset":
        return {
            "jobset.sigs.k8s.io/jobset-name": gang,
            "jobset.sigs.k8s.io/jobset-uid": owner_uid,
            "jobset.sigs.k8s.io/replicatedjob-name": "workers",
            "jobset.sigs.k8s.io/job-index": "0",
            "jobset.sigs.k8s.io/job-global-index": "0",
            "batch.kubernetes.io/job-completion-index": str(rank),
            "batch.kubernetes.io/job-name": f"{gang}-workers-0",
            "batch.kubernetes.io/controller-uid": owner_uid,
        }
    if fw == "kubeflow":
        return {
            "training.kubeflow.org/job-name": gang,
            "training.kubeflow.org/operator-name": "pytorchjob-controller",
            "training.kubeflow.org/replica-type": "master" if rank == 0 else "worker",
            "training.kubeflow.org/replica-index": str(rank if rank == 0 else rank - 1),
        }
    if fw == "kueue":
        return {"kueue.x-k8s.io/pod-group-name": gang, "kueue.x-k8s.io/managed": "true"}
    if fw == "lws":
        return {
            "leaderworkerset.sigs.k8s.io/name": gang,
            "leaderworkerset.sigs.k8s.io/group-index": "0",
            "leaderworkerset.sigs.k8s.io/worker-index": str(rank),
        }
    return {
        "batch.kubernetes.io/job-name": gang,
        "batch.kubernetes.io/controller-uid": owner_uid,
        "batch.kubernetes.io/job-completion-index": str(rank),
        "job-name": gang,
        "controller-uid": owner_uid,
    }


def _env(n: int) -> list[dict[str, str]]:
    return [{"name": f"TRAIN_SETTING_{k}", "value": f"value-{k}"} for k in range(n)]


def gpu_pod_body(run: str, i: int, node: str, owner: tuple[str, str]) -> dict[str, Any]:
    gang_no, rank = divmod(i, GANG_RANKS)
    fw = FRAMEWORKS[gang_no % len(FRAMEWORKS)]
    gang = f"train-{gang_no:05d}"
    owner_name, owner_uid = owner
    gpus = str(8 // GPU_PODS_PER_NODE)
    annotations = {
        "reclaimd.io/checkpoint-url": "http://{pod_ip}:8080/checkpoint",
        "reclaimd.io/checkpoint-timeout": "90s",
        "reclaimd.io/checkpoint-scope": "leader" if gang_no % 2 else "rank",
        "reclaimd.io/rank": str(rank),
        "kubectl.kubernetes.io/default-container": "trainer",
        "prometheus.io/scrape": "true",
        "prometheus.io/port": "9400",
    }
    if fw == "kueue":
        annotations["kueue.x-k8s.io/pod-group-total-count"] = str(GANG_RANKS)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{gang}-{rank}",
            "labels": {
                **bench_labels(run),
                "app.kubernetes.io/name": "trainer",
                "app.kubernetes.io/part-of": gang,
                "team": f"team-{gang_no % 7}",
                "cost-center": f"cc-{gang_no % 13:03d}",
                **_gpu_markers(fw, gang, rank, owner_uid),
            },
            "annotations": annotations,
            # A real object (a ConfigMap per gang): an absent owner would be collected.
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "ConfigMap", "name": owner_name, "uid": owner_uid}
            ],
        },
        "spec": {
            "nodeName": node,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 120,
            # Nothing heartbeats these nodes: keep the taint manager from evicting the pods.
            "tolerations": [{"operator": "Exists"}],
            "initContainers": [
                {
                    "name": "ckpt-sidecar",
                    "image": "registry.example/reclaimd/ckpt-helper:0.1",
                    "restartPolicy": "Always",
                    "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
                }
            ],
            "containers": [
                {
                    "name": "trainer",
                    "image": "registry.example/train/llm:2025.11",
                    "command": ["torchrun", "--nproc-per-node=2", "train.py"],
                    "env": _env(12),
                    "ports": [{"containerPort": 8080, "name": "ckpt"}],
                    "resources": {
                        "requests": {"cpu": "40", "memory": "400Gi", "nvidia.com/gpu": gpus},
                        "limits": {"memory": "400Gi", "nvidia.com/gpu": gpus},
                    },
                    "volumeMounts": [
                        {"name": "dshm", "mountPath": "/dev/shm"},
                        {"name": "data", "mountPath": "/data"},
                    ],
                }
            ],
            "volumes": [
                {"name": "dshm", "emptyDir": {"medium": "Memory"}},
                {"name": "data", "emptyDir": {}},
            ],
        },
    }


def gpu_pod_status(i: int) -> dict[str, Any]:
    ip = f"10.{100 + i // 65536}.{i // 256 % 256}.{i % 256}"
    started = "2025-11-30T08:00:00Z"
    return {
        "status": {
            "phase": "Running",
            "podIP": ip,
            "podIPs": [{"ip": ip}],
            "hostIP": "10.0.0.1",
            "startTime": started,
            "conditions": [
                {"type": t, "status": "True", "lastTransitionTime": started}
                for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")
            ],
            "containerStatuses": [
                {
                    "name": "trainer",
                    "ready": True,
                    "restartCount": 0,
                    "image": "registry.example/train/llm:2025.11",
                    "imageID": f"registry.example/train/llm@sha256:{i:064x}",
                    "containerID": f"containerd://{i:064x}",
                    "started": True,
                    "state": {"running": {"startedAt": started}},
                }
            ],
        }
    }


def cpu_pod_body(run: str, i: int, node: str) -> dict[str, Any]:
    app = f"svc-{i % 400:03d}"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{app}-{i:06d}",
            "labels": {
                **bench_labels(run),
                "app": app,
                "pod-template-hash": f"{i % 400:010x}",
                "team": f"team-{i % 7}",
            },
            "annotations": {"prometheus.io/scrape": "true", "prometheus.io/port": "9090"},
        },
        "spec": {
            "nodeName": node,
            "tolerations": [{"operator": "Exists"}],
            "containers": [
                {
                    "name": "app",
                    "image": f"registry.example/{app}:1.0",
                    "env": _env(6),
                    "ports": [{"containerPort": 9090, "name": "metrics"}],
                    "resources": {
                        "requests": {"cpu": "500m", "memory": "1Gi"},
                        "limits": {"memory": "1Gi"},
                    },
                }
            ],
        },
    }


# --- creating and deleting, concurrently --------------------------------------------------------


class Progress:
    def __init__(self, what: str, total: int) -> None:
        self.what, self.total, self.done = what, total, 0
        self._start = self._last = time.monotonic()

    def step(self) -> None:
        self.done += 1
        now = time.monotonic()
        if now - self._last >= 2.0 or self.done == self.total:
            self._last = now
            rate = self.done / max(now - self._start, 1e-9)
            print(f"  {self.what}: {self.done}/{self.total} ({rate:.0f}/s)", flush=True)

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self._start


async def _check(response: Any, what: str, ok: Iterable[int] = (200, 201, 202)) -> None:
    try:
        status = int(response.status)
        if status not in ok:
            body = (await response.read())[:300].decode(errors="replace")
            raise RuntimeError(f"{what}: HTTP {status}: {body}")
    finally:
        response.release()


async def run_all(
    what: str, calls: Iterator[Callable[[], Awaitable[None]]], total: int, concurrency: int
) -> float:
    """Run ``calls`` with ``concurrency`` in flight; seconds taken."""
    progress = Progress(what, total)

    async def worker() -> None:
        for call in calls:  # one shared iterator: each call is taken once
            await call()
            progress.step()

    async with asyncio.TaskGroup() as tg:
        for _ in range(max(1, min(concurrency, total))):
            tg.create_task(worker())
    return progress.elapsed_s


@contextlib.asynccontextmanager
async def admin_api(kubeconfig: str, pool: int) -> AsyncIterator[Any]:
    from chaos.kube import rig_client

    api = await rig_client(kubeconfig, pool_size=pool)
    try:
        yield api
    finally:
        await api.close()


async def create(api: Any, run: str, shape: Shape, concurrency: int) -> dict[str, float]:
    from kubernetes_asyncio import client as k8s

    core: Any = k8s.CoreV1Api(api)  # raw responses (_preload_content=False) throughout
    gpu_ns, cpu_ns = namespaces(run)
    timings: dict[str, float] = {}

    def ns_call(ns: str) -> Callable[[], Awaitable[None]]:
        async def call() -> None:
            body = {"metadata": {"name": ns, "labels": bench_labels(run)}}
            await _check(
                await core.create_namespace(body, _preload_content=False), f"create ns {ns}"
            )

        return call

    all_ns = gpu_ns + cpu_ns
    await run_all("namespaces", (ns_call(ns) for ns in all_ns), len(all_ns), concurrency)

    def node_call(i: int) -> Callable[[], Awaitable[None]]:
        async def call() -> None:
            body = node_body(run, i, gpu=i < shape.gpu_nodes)
            await _check(await core.create_node(body, _preload_content=False), f"create node {i}")

        return call

    timings["nodes_s"] = await run_all(
        "nodes", (node_call(i) for i in range(shape.nodes)), shape.nodes, concurrency
    )
    await _wait_service_accounts(core, all_ns)

    gangs = -(-shape.gpu_pods // GANG_RANKS)
    owners: dict[int, tuple[str, str]] = {}

    def owner_call(g: int) -> Callable[[], Awaitable[None]]:
        async def call() -> None:
            ns = gpu_ns[g % len(gpu_ns)]
            name = f"train-{g:05d}-owner"
            response = await core.create_namespaced_config_map(
                ns,
                {"metadata": {"name": name, "labels": bench_labels(run)}},
                _preload_content=False,
            )
            if response.status != 201:
                await _check(response, f"create owner {name}")
            owners[g] = (name, json.loads(await response.read())["metadata"]["uid"])
            response.release()

        return call

    await run_all("gang owners", (owner_call(g) for g in range(gangs)), gangs, concurrency)

    gpu_nodes = max(1, shape.gpu_nodes)
    cpu_first = shape.gpu_nodes if shape.nodes > shape.gpu_nodes else 0
    cpu_nodes = max(1, shape.nodes - cpu_first)

    def gpu_call(i: int) -> Callable[[], Awaitable[None]]:
        async def call() -> None:
            gang_no = i // GANG_RANKS
            ns = gpu_ns[gang_no % len(gpu_ns)]
            node = node_name(run, (i // GPU_PODS_PER_NODE) % gpu_nodes)
            body = gpu_pod_body(run, i, node, owners[gang_no])
            name = body["metadata"]["name"]
            await _check(
                await core.create_namespaced_pod(ns, body, _preload_content=False),
                f"create pod {ns}/{name}",
            )
            await _check(
                await core.patch_namespaced_pod_status(
                    name,
                    ns,
                    gpu_pod_status(i),
                    _content_type="application/merge-patch+json",
                    _preload_content=False,
                ),
                f"status of pod {ns}/{name}",
            )

        return call

    timings["gpu_pods_s"] = await run_all(
        "GPU pods (create + status)",
        (gpu_call(i) for i in range(shape.gpu_pods)),
        shape.gpu_pods,
        concurrency,
    )

    def cpu_call(i: int) -> Callable[[], Awaitable[None]]:
        async def call() -> None:
            ns = cpu_ns[i % len(cpu_ns)]
            node = node_name(run, cpu_first + (i // CPU_PODS_PER_NODE) % cpu_nodes)
            await _check(
                await core.create_namespaced_pod(
                    ns, cpu_pod_body(run, i, node), _preload_content=False
                ),
                f"create CPU pod {i}",
            )

        return call

    timings["cpu_pods_s"] = await run_all(
        "CPU pods", (cpu_call(i) for i in range(shape.cpu_pods)), shape.cpu_pods, concurrency
    )
    return timings


async def _wait_service_accounts(core: Any, names: list[str], timeout_s: float = 120.0) -> None:
    """Pods are refused until the namespace's ``default`` ServiceAccount exists."""
    deadline = time.monotonic() + timeout_s
    for ns in names:
        while True:
            response = await core.read_namespaced_service_account(
                "default", ns, _preload_content=False
            )
            status = response.status
            response.release()
            if status == 200:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"namespace {ns}: no default ServiceAccount after {timeout_s}s")
            await asyncio.sleep(0.5)


async def cleanup(api: Any, selector: str) -> None:
    """Delete the bench's pods (at once: no kubelet will confirm), namespaces and nodes."""
    from kubernetes_asyncio import client as k8s

    core: Any = k8s.CoreV1Api(api)  # raw responses (_preload_content=False) throughout
    listed = await _retrying(
        lambda: core.list_namespace(label_selector=selector, _preload_content=False)
    )
    names = [n["metadata"]["name"] for n in json.loads(await listed.read()).get("items") or ()]
    listed.release()
    print(f"cleanup: {len(names)} namespaces and the nodes labelled {selector}", flush=True)

    async def empty(ns: str) -> None:
        await _delete_all(
            f"pods in {ns}",
            lambda: core.delete_collection_namespaced_pod(
                ns, grace_period_seconds=0, _preload_content=False
            ),
            lambda: core.list_namespaced_pod(ns, limit=1, _preload_content=False),
        )
        await _check(
            await _retrying(lambda: core.delete_namespace(ns, _preload_content=False)),
            f"delete ns {ns}",
            ok=(200, 202, 404),
        )

    # A few namespaces at a time: each deletecollection is thousands of deletes server-side.
    for first in range(0, len(names), 4):
        await asyncio.gather(*(empty(ns) for ns in names[first : first + 4]))
    await _delete_all(
        f"nodes labelled {selector}",
        lambda: core.delete_collection_node(label_selector=selector, _preload_content=False),
        lambda: core.list_node(label_selector=selector, limit=1, _preload_content=False),
    )
    print("cleanup: done", flush=True)


async def _retrying(call: Callable[[], Awaitable[Any]], attempts: int = 5) -> Any:
    import aiohttp

    for attempt in range(attempts):
        try:
            return await call()
        except (TimeoutError, aiohttp.ClientError):
            if attempt == attempts - 1:
                raise
            await asyncio.sleep(2.0)
    raise AssertionError("unreachable")


async def _delete_all(
    what: str, delete: Callable[[], Awaitable[Any]], probe: Callable[[], Awaitable[Any]]
) -> None:
    """deletecollection until nothing is left: one call over thousands of objects can outlast
    the server's request timeout (504) while it keeps deleting."""
    import aiohttp

    for _ in range(CLEANUP_ATTEMPTS):
        # The server may also drop the connection of a long deletecollection (it goes on).
        with contextlib.suppress(RuntimeError, TimeoutError, aiohttp.ClientError):
            await _check(await delete(), f"delete {what}", ok=(200, 404))
        response = await _retrying(probe)
        try:
            if response.status == 404:
                return
            remaining = json.loads(await response.read()).get("items") or []
        finally:
            response.release()
        if not remaining:
            return
        print(f"cleanup: {what}: some remain, deleting again", flush=True)
    raise RuntimeError(f"cleanup: {what} remain after {CLEANUP_ATTEMPTS} attempts")


# --- the measured process -------------------------------------------------------------------------


def measure_main(kubeconfig: str) -> int:
    """The fresh process: reclaimd's imports, then the daemon's cache; JSON on stdout."""
    import reclaimd.cli  # noqa: F401  (what the ``reclaimd`` entry point imports)

    import_error = ""
    try:
        from reclaimd import daemon, logs  # noqa: F401  (what ``reclaimd run`` imports next)
    except ImportError as e:
        # The daemon mid-rewrite: import what it is made of, so the baseline stays comparable.
        import_error = str(e)
        for name in DAEMON_PARTS:
            with contextlib.suppress(ImportError):
                importlib.import_module(name)
    baseline = memory_mb()

    async def go() -> dict[str, Any]:
        from reclaimd.cluster import cache, connect, errors
        from reclaimd.ledger.labels import cost_labels

        api = await connect.build_api_client(kubeconfig)
        # As ``reclaimd.wiring.wire`` builds it.
        view = cache.ClusterCache(api, labeler=cost_labels)
        start = time.monotonic()
        await view.start()
        try:
            synced = await view.wait_synced(SYNC_TIMEOUT_S)
            sync_s = time.monotonic() - start
            after = memory_mb()
            counts = view.sizes()
            # Watches running, events (the node controller marking the nodes) applied.
            await asyncio.sleep(SETTLE_S)
            settled = memory_mb()
        finally:
            await view.stop()
            await api.close()
        return {
            "synced": synced,
            "sync_s": round(sync_s, 2),
            "after": after,
            "settled": settled,
            **counts,
        }

    result = asyncio.run(go())
    after, settled = result.pop("after"), result.pop("settled")
    print(
        json.dumps(
            {
                "baseline_rss_mb": round(baseline["VmRSS"], 1),
                "rss_after_sync_mb": round(after["VmRSS"], 1),
                f"rss_{SETTLE_S:.0f}s_later_mb": round(settled["VmRSS"], 1),
                "peak_rss_mb": round(settled["VmHWM"], 1),
                **result,
                "python": platform.python_version(),
                **({"daemon_import_error": import_error} if import_error else {}),
            }
        )
    )
    return 0


def measure(kubeconfig: str, tree: Path | None = None) -> dict[str, Any]:
    """Run the measured process: this checkout's reclaimd, or the one in ``tree``."""
    # ``-m`` puts the working directory first on sys.path: run in ``tree`` to import its code.
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "chaos.bench_cache",
            "--measure",
            str(Path(kubeconfig).resolve()),
        ],
        capture_output=True,
        text=True,
        check=False,
        cwd=tree,
    )
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()[-1:] or ["(no output)"]
        raise RuntimeError(f"measuring process failed: {tail[0]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


# --- driver -----------------------------------------------------------------------------------


async def bench(args: argparse.Namespace, stack: Any) -> dict[str, Any]:
    shape = Shape(args.nodes, args.pods, args.gpu_pods)
    run = uuid.uuid4().hex[:6]
    selector = f"{RUN_LABEL}={run}"
    async with admin_api(stack.kubeconfig, args.concurrency) as api:
        try:
            print(
                f"creating {shape.nodes} nodes, {shape.gpu_pods} GPU pods, "
                f"{shape.cpu_pods} CPU pods (run {run}, {args.concurrency} in flight)",
                flush=True,
            )
            timings = await create(api, run, shape, args.concurrency)
            print("measuring a fresh reclaimd process's cache", flush=True)
            figures = await asyncio.to_thread(measure, stack.reclaimd_kubeconfig)
            print(json.dumps(figures), flush=True)  # kept even if the cleanup fails
            compared: dict[str, Any] = {}
            for tree in args.also_measure:
                print(f"measuring the cache of {tree}", flush=True)
                compared[str(tree)] = await asyncio.to_thread(
                    measure, stack.reclaimd_kubeconfig, tree
                )
                print(json.dumps(compared[str(tree)]), flush=True)
        except BaseException:
            # Ctrl-C cancels the bench once; this await still runs to the end.
            await cleanup(api, selector)
            raise
        report = {
            "shape": asdict(shape),
            "create_s": {k: round(v, 1) for k, v in timings.items()},
            "cache": figures,
            **({"compared": compared} if compared else {}),
            "target_mb": TARGET_MB,
            "met": figures["peak_rss_mb"] <= TARGET_MB,
        }
        try:
            await cleanup(api, selector)
        except Exception as e:  # the figures stand; the leftover is reported, exit 1
            report["cleanup_error"] = f"{e}; run `python -m chaos.bench_cache --cleanup`"
    return report


def table(report: dict[str, Any]) -> str:
    c = report["cache"]
    rows = [
        (
            "nodes / pods / GPU pods created",
            "{nodes} / {pods} / {gpu_pods}".format(**report["shape"]),
        ),
        ("cached nodes / GPU pods", f"{c['nodes']} / {c['pods']}"),
        ("sync", f"{c['sync_s']:.1f} s"),
        ("RSS baseline (imports)", f"{c['baseline_rss_mb']:.1f} MiB"),
        ("RSS after sync", f"{c['rss_after_sync_mb']:.1f} MiB"),
        ("RSS peak (VmHWM)", f"{c['peak_rss_mb']:.1f} MiB"),
        ("target", f"<= {report['target_mb']:.0f} MiB: {'met' if report['met'] else 'NOT met'}"),
    ]
    for tree, other in (report.get("compared") or {}).items():
        rows.append(
            (
                f"  {tree}",
                f"baseline {other['baseline_rss_mb']:.1f}, after sync "
                f"{other['rss_after_sync_mb']:.1f}, peak {other['peak_rss_mb']:.1f} MiB, "
                f"sync {other['sync_s']:.1f} s",
            )
        )
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m chaos.bench_cache", description=__doc__)
    p.add_argument("--nodes", type=int, default=5000)
    p.add_argument("--pods", type=int, default=50000)
    p.add_argument("--gpu-pods", type=int, default=10000)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--out", type=Path, default=Path("out/bench-cache.json"))
    p.add_argument("--cleanup", action="store_true", help="only delete every bench object")
    p.add_argument(
        "--also-measure",
        metavar="DIR",
        type=Path,
        action="append",
        default=[],
        help="also measure the reclaimd of another checkout (e.g. a git worktree of an older "
        "commit that has this bench) against the same objects",
    )
    p.add_argument("--measure", metavar="KUBECONFIG", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.nodes < 1 or args.gpu_pods < 0 or args.pods < args.gpu_pods or args.concurrency < 1:
        raise BadInput("need --nodes >= 1, 0 <= --gpu-pods <= --pods, --concurrency >= 1")
    return args


async def _main(args: argparse.Namespace) -> dict[str, Any] | None:
    from chaos import stack as stackenv

    stack = stackenv.load()
    task = asyncio.current_task()
    if task is not None:  # SIGTERM unwinds like Ctrl-C, through the cleanup
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    if args.cleanup:
        async with admin_api(stack.kubeconfig, 8) as api:
            await cleanup(api, f"{BENCH_LABEL}={BENCH_VALUE}")
        return None
    return await bench(args, stack)


def _first_leaf(e: BaseException) -> str:
    while isinstance(e, BaseExceptionGroup) and e.exceptions:
        e = e.exceptions[0]
    return str(e) or type(e).__name__


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse(sys.argv[1:] if argv is None else argv)
    except BadInput as e:
        print(f"bench-cache: {e}", file=sys.stderr)
        return 2
    if args.measure:
        return measure_main(args.measure)
    from chaos.stack import StackNotRunning

    try:
        report = asyncio.run(_main(args))
    except StackNotRunning as e:
        print(f"bench-cache: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("bench-cache: interrupted (bench objects deleted)", file=sys.stderr)
        return 130
    except Exception as e:
        print(f"bench-cache: failed: {_first_leaf(e)}", file=sys.stderr)
        return 1
    if report is None:
        return 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(table(report))
    print(f"wrote {args.out}")
    if "cleanup_error" in report:
        print(f"bench-cache: {report['cleanup_error']}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
