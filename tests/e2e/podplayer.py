"""A kubelet stand-in for the Helm release's controller pods: kwok only pretends pods run, so
this runs each of them as a ``reclaimd run`` process, with what its pod spec gives it.

- **Config**: the ConfigMap the pod mounts (the chart's ``config.yaml``), plus what a pod has
  of its own: its name as holder, its outbox and span file on "its" volume (a directory per
  pod), its metrics and peer-probe ports (every process shares the host's network here),
  ``POD_IP`` of loopback, and the stack's ``reclaimd`` client-certificate user as its
  identity (bound to the release's roles by ``rbac.extraSubjects``: the chart's rights).
- **Lifecycle**: a pod bound to a node and not being deleted is started once; a pod deleted
  (or gone) has its process stopped with SIGTERM, as the kubelet would. The ReplicaSet makes
  the replacement, the scheduler places it, and it is started here as a new holder.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import yaml
from kubernetes_asyncio import client as k8s

from chaos.ports import free_port
from chaos.process import DaemonProcess

POLL_S = 0.5


class PodPlayer:
    def __init__(
        self, api: Any, namespace: str, release: str, workdir: Path, kubeconfig: str
    ) -> None:
        self.api = api
        self.namespace = namespace
        self.selector = (
            f"app.kubernetes.io/instance={release},app.kubernetes.io/component=controller"
        )
        self.workdir = workdir
        self.kubeconfig = kubeconfig
        self.running: dict[str, DaemonProcess] = {}
        self.stopped: list[str] = []  # pods whose process was stopped (deleted)
        self._task: asyncio.Task[None] | None = None

    async def start(self, replicas: int, timeout_s: float = 120) -> None:
        self._task = asyncio.create_task(self._loop())
        await self.wait_running(replicas, timeout_s)

    async def wait_running(self, replicas: int, timeout_s: float = 120) -> None:
        """Until ``replicas`` release pods run (a ReplicaSet's new pod is scheduled once the
        one it replaces is gone, then started here)."""
        assert self._task is not None, "the player is not started"
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout_s
        while len(self.running) < replicas:
            if self._task.done():
                self._task.result()
            if loop.time() > end:
                raise TimeoutError(f"{len(self.running)}/{replicas} release pods running")
            await asyncio.sleep(0.2)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for d in self.running.values():
            await d.stop()
        self.running.clear()

    def span_glob(self) -> str:
        return str(self.workdir / "*" / "spans.jsonl")

    async def _loop(self) -> None:
        core = k8s.CoreV1Api(self.api)
        while True:
            pods = await core.list_namespaced_pod(self.namespace, label_selector=self.selector)
            live = {
                p.metadata.name: p
                for p in pods.items
                if p.metadata.deletion_timestamp is None and p.spec.node_name
            }
            for name in [n for n in self.running if n not in live]:
                await self.running.pop(name).stop()
                self.stopped.append(name)
            for name, pod in live.items():
                if name not in self.running:
                    self.running[name] = await self._run(core, pod)
            await asyncio.sleep(POLL_S)

    async def _run(self, core: k8s.CoreV1Api, pod: Any) -> DaemonProcess:
        name = pod.metadata.name
        cm_name = next(v.config_map.name for v in pod.spec.volumes if v.config_map is not None)
        cm = await core.read_namespaced_config_map(cm_name, self.namespace)
        config: dict[str, Any] = yaml.safe_load(cm.data["config.yaml"]) or {}
        home = self.workdir / name
        config.update(
            holder=name,
            metrics_port=free_port(),
            kube={**config.get("kube", {}), "kubeconfig": self.kubeconfig},
            peer_probe={**config.get("peer_probe", {}), "port": free_port()},
            tracing={"span_file": str(home / "spans.jsonl")},
        )
        config["ledger"] = {**config.get("ledger", {}), "outbox_path": str(home / "outbox.sqlite")}
        d = DaemonProcess(config, home, "reclaimd", env={"POD_IP": "127.0.0.1"})
        await d.start()
        return d
