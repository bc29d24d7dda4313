"""One run of one side of ``make bench-peers`` (NTH or reclaimd): the storm sent, the nodes and
pods watched, and each node's figures."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import yaml

from chaos.bench.peers.apiserver import FS_PREFIX, Apiserver, flow_schemas, summarize_requests
from chaos.bench.peers.cluster import cluster_size, nth_rbac, reclaimd_rbac
from chaos.bench.peers.common import (
    BENCH_NAMESPACE,
    LABEL,
    NTH_SA,
    PODS_PER_NODE,
    RECLAIMD_SA,
    REGION,
    ZONE,
    BenchError,
    delta,
    flow_counts,
    percentile,
)
from chaos.bench.peers.moto import Moto
from chaos.bench.peers.nth import NthProcess, nth_env

# --- watching the storm -----------------------------------------------------------------------


@dataclass
class Observed:
    """Monotonic times of what the watches saw."""

    cordoned: dict[str, float] = field(default_factory=dict)  # node -> first unschedulable
    gone: dict[str, float] = field(default_factory=dict)  # pod -> DELETED


async def _watch(
    list_call: Callable[..., Any], on_event: Callable[[str, Any, float], None], rv: str, **kw: Any
) -> None:
    """Follow a watch from ``rv`` until cancelled, resuming from the last version seen."""
    from kubernetes_asyncio import watch

    loop = asyncio.get_running_loop()
    while True:
        w = watch.Watch()
        try:
            async for ev in w.stream(list_call, resource_version=rv, timeout_seconds=900, **kw):
                obj = ev["object"]
                if ev["type"] == "ERROR":
                    raise BenchError(f"watch error: {str(obj)[:120]}")
                rv = obj.metadata.resource_version or rv
                on_event(ev["type"], obj, loop.time())
        finally:
            w.stop()


# --- one run of one side ----------------------------------------------------------------------


@dataclass
class Bench:
    args: argparse.Namespace
    stack: Any  # chaos.stack.StackEnv, pointed at the bench's moto
    moto: Moto
    apiserver: Apiserver
    workdir: Path
    nth_binary: Path | None = None
    tokens: dict[str, Path] = field(default_factory=dict)
    reclaimd_kubeconfig: Path | None = None
    background: dict[str, int] = field(default_factory=dict)
    failed: list[dict[str, Any]] = field(default_factory=list)
    runs: list[dict[str, Any]] = field(default_factory=list)

    def say(self, message: str) -> None:
        print(f"bench-peers: {message}", file=sys.stderr, flush=True)

    # --- identities and FlowSchemas -------------------------------------------------------

    async def setup_identities(self) -> None:
        """Both ServiceAccounts with their RBAC, a token each, the FlowSchemas that count them."""
        from kubernetes_asyncio import client as k8s

        from chaos import fleet, kube
        from chaos.harness import RBAC
        from chaos.kube import rig_client

        api = await rig_client(self.stack.kubeconfig)
        try:
            await self._delete_flow_schemas(api)
            # Nodes an interrupted bench left behind (their names could come round again).
            stale = await k8s.CoreV1Api(api).list_node(label_selector=LABEL)
            await fleet.delete_nodes(api, [n.metadata.name for n in stale.items])
            await fleet.ensure_namespace(api, BENCH_NAMESPACE)
            await kube.apply_file(api, RBAC)
            await kube.apply_documents(api, [*nth_rbac(), *reclaimd_rbac(RBAC)])
            core = k8s.CoreV1Api(api)
            docs = []
            for side in self.args.sides:
                sa = NTH_SA if side == "nth" else RECLAIMD_SA
                # A day is plenty for one bench; a pod's projected token would be rotated.
                token = await core.create_namespaced_service_account_token(
                    sa, BENCH_NAMESPACE, cast(Any, {"spec": {"expirationSeconds": 86400}})
                )
                self.tokens[side] = self.workdir / f"{side}-token"
                self.tokens[side].write_text(token.status.token)
                self.tokens[side].chmod(0o600)
                level = await asyncio.to_thread(
                    self.apiserver.priority_level_of, token.status.token
                )
                subject = {
                    "kind": "ServiceAccount",
                    "serviceAccount": {"name": sa, "namespace": BENCH_NAMESPACE},
                }
                docs += flow_schemas(side, subject, level)
                self.say(f"counting {side}'s API requests at the apiserver (APF level {level})")
            (self.workdir / "namespace").write_text(BENCH_NAMESPACE)
            if "reclaimd" in self.tokens:
                self.reclaimd_kubeconfig = self._token_kubeconfig(self.tokens["reclaimd"])
            await kube.apply_documents(api, docs)
            await asyncio.sleep(2)  # the APF config controller picks new schemas up in ~1 s
            self.background = await cluster_size(core)
            self.say(
                f"the apiserver holds {self.background['nodes']} nodes and "
                f"{self.background['pods']} pods besides the bench's (shared stack)"
            )
        finally:
            await api.close()

    def _token_kubeconfig(self, token: Path) -> Path:
        admin = yaml.safe_load(Path(self.stack.kubeconfig).read_text())
        cluster = admin["clusters"][0]
        user = "bench-peers-reclaimd"
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [cluster],
            "users": [{"name": user, "user": {"token": token.read_text()}}],
            "contexts": [{"name": user, "context": {"cluster": cluster["name"], "user": user}}],
            "current-context": user,
        }
        path = self.workdir / "reclaimd.kubeconfig"
        path.write_text(yaml.safe_dump(config))
        path.chmod(0o600)
        return path

    async def _delete_flow_schemas(self, api: Any) -> None:
        from kubernetes_asyncio import client as k8s

        custom = k8s.CustomObjectsApi(api)
        g, v, r = "flowcontrol.apiserver.k8s.io", "v1", "flowschemas"
        listed = await custom.list_cluster_custom_object(g, v, r, label_selector=LABEL)
        for item in listed["items"]:
            with contextlib.suppress(Exception):
                await custom.delete_cluster_custom_object(g, v, r, item["metadata"]["name"])

    async def teardown_identities(self) -> None:
        from chaos.kube import rig_client

        api = await rig_client(self.stack.kubeconfig)
        try:
            await self._delete_flow_schemas(api)
        finally:
            await api.close()

    def _counts(self) -> dict[str, dict[str, float]]:
        return flow_counts(self.apiserver.metrics(), FS_PREFIX)

    # --- a run ----------------------------------------------------------------------------

    async def run_side(self, side: str, repeat: int) -> dict[str, Any]:
        from kubernetes_asyncio import client as k8s

        from chaos import fleet
        from chaos.harness import Harness

        n = self.args.nodes
        run_id = f"bp{repeat}{side[0]}{uuid.uuid4().hex[:5]}"
        label = {LABEL: run_id}
        selector = f"{LABEL}={run_id}"
        tag = f"{side} run {repeat}/{self.args.repeat}"
        async with Harness(self.stack, name=run_id, workdir=self.workdir / run_id) as h:
            assert h.api is not None
            core, ns = k8s.CoreV1Api(h.api), h.namespace
            instances = await asyncio.to_thread(self.moto.launch, n)
            specs = [fleet.NodeSpec(name=dns, instance_id=iid, zone=ZONE) for iid, dns in instances]
            h.nodes.extend(specs)  # the harness deletes them at the end
            try:
                await fleet.create_nodes_labelled(h.api, specs, label)
                await fleet.wait_listed(
                    h.api, what="nodes", names=[s.name for s in specs], ready=fleet.node_is_ready,
                    list_call=lambda: core.list_node(label_selector=selector),
                    timeout_s=300,
                )  # fmt: skip
                gangs = [
                    fleet.GangSpec(
                        name=f"g{i}",
                        ranks=[fleet.RankSpec(s.name)] * PODS_PER_NODE,
                        extra_labels=label,
                    )
                    for i, s in enumerate(specs)
                ]
                pods = await fleet.create_gangs(h.api, gangs, h.namespace)
                await fleet.wait_listed(
                    h.api, what="pods", names=pods, ready=fleet.pod_is_running,
                    list_call=lambda: core.list_namespaced_pod(ns, label_selector=selector),
                    timeout_s=300,
                )  # fmt: skip
                node_of = {p: s.name for s, g in zip(specs, gangs, strict=True) for p in
                           (g.pod_name(r) for r in range(PODS_PER_NODE))}  # fmt: skip
                self.say(f"{tag}: {n} nodes Ready, {len(pods)} pods Running")
                result = await self._storm(_Run(side, tag, h, specs, node_of, selector))
            finally:
                await self._clear_pods(core, h.namespace)
                await fleet.delete_namespace(h.api, h.namespace)
        result.update({"side": side, "repeat": repeat, "run_id": run_id})
        return result

    async def _clear_pods(self, core: Any, namespace: str) -> None:
        """Pods a capped run left behind: deleted at once, so their nodes can go too."""
        with contextlib.suppress(Exception):
            await core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)

    async def _start(self, side: str, h: Any) -> Any:
        from chaos.process import DaemonProcess

        if side == "reclaimd":
            # `reclaimd run` with the drills' settings, its SQS source on the bench's queue.
            kube = {"kubeconfig": str(self.reclaimd_kubeconfig)}
            config = h.daemon_config(holder=h.holder("reclaimd"), kube=kube)
            d = DaemonProcess(config, h.workdir, "reclaimd")
            h.daemons.append(d)  # stopped by the harness, even if it never comes up
            try:
                # Its cache LISTs the whole cluster first: minutes when the shared stack is busy.
                await d.start(timeout_s=180)
            except (RuntimeError, TimeoutError) as e:
                raise BenchError(f"reclaimd did not start: {e}") from e
            return d
        assert self.nth_binary is not None
        api_host, _, api_port = self.apiserver.url.removeprefix("https://").partition(":")
        env = nth_env(
            queue_url=h.queue_url,
            aws_endpoint=self.moto.url,
            api_host=api_host,
            api_port=api_port or "443",
            workers=self.args.nth_workers or self.args.nodes,
        )
        p = NthProcess(
            self.nth_binary, h.workdir, env, self.tokens["nth"], self.apiserver.ca,
            self.workdir / "namespace",
        )  # fmt: skip
        await p.start()
        return p

    async def _storm(self, run: _Run) -> dict[str, Any]:
        from kubernetes_asyncio import client as k8s

        core = k8s.CoreV1Api(run.h.api)
        seen = Observed()
        watches = await self._watches(run, core, seen)
        before = await asyncio.to_thread(self._counts)
        consumer: Any = None
        try:
            consumer = await self._start(run.side, run.h)
            self.say(f"{run.tag}: {run.side} running; sending {len(run.specs)} Spot warnings")
            at_send = await asyncio.to_thread(self._counts)
            sent, t0, t_sent = await self._send_all(run)
            queue_empty_at, ended = await self._until_done(run, seen, t0)
        finally:
            if consumer is not None:
                await consumer.stop()
            for w in watches:
                w.cancel()
            await asyncio.gather(*watches, return_exceptions=True)
        after = await asyncio.to_thread(self._counts)
        result = per_node_figures(run.specs, run.pods_of, sent=sent, seen=seen, t0=t0, ended=ended)
        result.update(
            {
                "send_spread_s": round(t_sent - t0, 3),
                "queue_empty_s": None if queue_empty_at is None else round(queue_empty_at - t0, 3),
                "cap_s": self.args.cap,
                "requests": summarize_requests(delta(after, at_send), run.side),
                "startup_requests": summarize_requests(delta(at_send, before), run.side),
            }
        )
        self.say(f"{run.tag}: {one_line(result)}")
        return result

    async def _watches(self, run: _Run, core: Any, seen: Observed) -> list[asyncio.Task[None]]:
        """Node and pod watches from the current state, recording into ``seen``."""

        def on_node(kind: str, node: Any, at: float) -> None:
            name = node.metadata.name
            if node.spec and node.spec.unschedulable and name not in seen.cordoned:
                seen.cordoned[name] = at

        def on_pod(kind: str, pod: Any, at: float) -> None:
            if kind == "DELETED" and pod.metadata.name in run.node_of:
                seen.gone.setdefault(pod.metadata.name, at)

        ns, sel = run.h.namespace, run.selector
        nodes_rv = (await core.list_node(label_selector=sel)).metadata.resource_version
        pods = await core.list_namespaced_pod(ns, label_selector=sel)
        return [
            asyncio.create_task(_watch(core.list_node, on_node, nodes_rv, label_selector=sel)),
            asyncio.create_task(
                _watch(
                    core.list_namespaced_pod,
                    on_pod,
                    pods.metadata.resource_version,
                    namespace=ns,
                    label_selector=sel,
                )
            ),
        ]

    async def _send_all(self, run: _Run) -> tuple[dict[str, float], float, float]:
        """One warning per node, 16 sends at a time; each node's send time (when SQS took it)."""
        from chaos import inject

        loop = asyncio.get_running_loop()
        sent: dict[str, float] = {}
        gate = asyncio.Semaphore(16)

        async def send(spec: Any) -> None:
            event = inject.spot_itn_event(spec.instance_id, zone=spec.zone, region=REGION)
            async with gate:
                await asyncio.to_thread(inject.send_sqs, run.h.sqs, run.h.queue_url, event)
            sent[spec.name] = loop.time()

        t0 = loop.time()
        await asyncio.gather(*(send(s) for s in run.specs))
        return sent, t0, loop.time()

    async def _until_done(self, run: _Run, seen: Observed, t0: float) -> tuple[float | None, float]:
        """Until every node is cordoned, every pod gone and the queue empty, or the cap."""
        loop = asyncio.get_running_loop()
        queue_empty_at: float | None = None
        last_report = t0
        while loop.time() < t0 + self.args.cap:
            depth = await asyncio.to_thread(run.h.queue_depth)
            now = loop.time()
            if depth == 0 and queue_empty_at is None:
                queue_empty_at = now
            done = len(seen.cordoned) == len(run.specs) and len(seen.gone) == len(run.node_of)
            if done and queue_empty_at is not None:
                break
            if now - last_report >= 15:
                last_report = now
                self.say(
                    f"{run.tag}: t={now - t0:.0f}s {len(seen.cordoned)}/{len(run.specs)} "
                    f"cordoned, {len(seen.gone)}/{len(run.node_of)} pods gone, queue {depth}"
                )
            await asyncio.sleep(0.25)
        return queue_empty_at, loop.time()


@dataclass
class _Run:
    """One side's run: its harness, nodes, and which node each pod is on."""

    side: str
    tag: str
    h: Any  # chaos.harness.Harness
    specs: Sequence[Any]  # fleet.NodeSpec
    node_of: dict[str, str]
    selector: str

    @property
    def pods_of(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for pod, node in self.node_of.items():
            out.setdefault(node, []).append(pod)
        return out


def per_node_figures(
    specs: Sequence[Any],
    pods_of: dict[str, list[str]],
    *,
    sent: dict[str, float],
    seen: Observed,
    t0: float,
    ended: float,
) -> dict[str, Any]:
    """Per node: send -> cordoned, send -> its last pod gone; the run's totals."""
    cordon = [seen.cordoned[s.name] - sent[s.name] for s in specs if s.name in seen.cordoned]
    drained_nodes = [s.name for s in specs if all(p in seen.gone for p in pods_of[s.name])]
    drained = [max(seen.gone[p] for p in pods_of[n]) - sent[n] for n in drained_nodes]
    all_cordoned, all_drained = len(cordon) == len(specs), len(drained_nodes) == len(specs)
    complete = all_cordoned and all_drained
    last = max([*seen.cordoned.values(), *seen.gone.values()], default=t0)

    def r(x: float | None) -> float | None:
        return None if x is None else round(x, 3)

    return {
        "nodes": len(specs),
        "pods": sum(len(v) for v in pods_of.values()),
        "complete": complete,
        "elapsed_s": r(ended - t0),
        "cordoned": len(cordon),
        "drained_nodes": len(drained_nodes),
        "pods_gone": len(seen.gone),
        "cordoned_s": {"p50": r(percentile(cordon, 0.5)), "max": r(max(cordon, default=None))},
        "drained_s": {"p50": r(percentile(drained, 0.5)), "max": r(max(drained, default=None))},
        # from the first send; all-cordoned / all-drained only when every node got there
        "all_cordoned_s": r(max(seen.cordoned.values()) - t0) if all_cordoned else None,
        "all_drained_s": r(max(seen.gone.values()) - t0) if all_drained else None,
        "makespan_s": r(last - t0) if complete else None,
        "per_node": {
            "cordoned_s": sorted(round(x, 3) for x in cordon),
            "drained_s": sorted(round(x, 3) for x in drained),
        },
    }  # fmt: skip


def one_line(r: dict[str, Any]) -> str:
    def f(x: float | None) -> str:
        return "-" if x is None else f"{x:.1f}"

    return (
        f"{r['cordoned']}/{r['nodes']} cordoned (p50 {f(r['cordoned_s']['p50'])} s, "
        f"max {f(r['cordoned_s']['max'])} s), {r['drained_nodes']}/{r['nodes']} drained "
        f"(p50 {f(r['drained_s']['p50'])} s, max {f(r['drained_s']['max'])} s), "
        f"makespan {f(r['makespan_s'])} s, queue empty {f(r['queue_empty_s'])} s, "
        f"{r['requests']['total']} requests ({r['requests']['writes']} writes)"
    )
