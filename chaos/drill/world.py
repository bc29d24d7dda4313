"""Building a drill's world (``chaos.drill.run``, step 2): the cluster on kwok (nodes, trainers,
gangs, PDBs, Kueue Workloads) made by ``build_cluster``, and ``Built``, what was made and the
ground truth recorded while making it. ``chaos.drill.local`` runs the rest of the world."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from chaos.drill.plan import Plan
from chaos.drill.scenario import Integration
from reclaimd.model import utcnow

if TYPE_CHECKING:
    from chaos.fleet import GangSpec, NodeSpec
    from chaos.harness import Harness
    from chaos.inject import ImdsMock
    from chaos.standins.azure import AzureMetadataServer
    from chaos.standins.gce import GceMetadataServer
    from chaos.trainers import ScriptedTrainer

KUEUE_CLUSTER_QUEUE = "cq-drill"


@dataclass
class Built:
    """What the drill created, and the ground truth it recorded while doing so."""

    nodes: dict[str, NodeSpec] = field(default_factory=dict)  # by node key
    specs: dict[str, GangSpec] = field(default_factory=dict)  # by gang name
    trainers: dict[str, ScriptedTrainer] = field(default_factory=dict)  # by pod name
    annotated: dict[str, datetime] = field(default_factory=dict)  # gang -> last checkpoint
    started: dict[str, datetime] = field(default_factory=dict)  # pod -> status.startTime
    stopped: dict[str, datetime] = field(default_factory=dict)  # pod -> stopped by the drill
    imds: dict[str, ImdsMock] = field(default_factory=dict)  # node key -> its mock
    gce: dict[str, GceMetadataServer] = field(default_factory=dict)  # node key -> stand-in
    azure: dict[str, AzureMetadataServer] = field(default_factory=dict)  # node key -> stand-in
    pubsub_topic: str = ""
    pubsub_subscription: str = ""
    notices_topic: str = ""


# --- the cluster -----------------------------------------------------------------------------


async def build_cluster(
    h: Harness, plan: Plan, built: Built, say: Callable[[str], None], *, make_nodes: bool = True
) -> None:
    """Nodes, one trainer per opted-in rank, the gangs' pods backdated, PDBs and Kueue
    Workloads; what was made (and when) goes into ``built``. ``make_nodes=False``: the
    plan's nodes are the cluster's own (a game day), already labelled for the run."""
    from kubernetes_asyncio import client as k8s

    from chaos import fleet
    from chaos.trainers import ScriptedTrainer, add_trainer

    p, api = plan, h.api
    assert api is not None
    run_label = {fleet.DRILL_LABEL: p.run_id}
    specs = [fleet.NodeSpec.planned(n) for n in p.nodes]
    built.nodes = {n.key: s for n, s in zip(p.nodes, specs, strict=True)}
    core = k8s.CoreV1Api(api)
    selector = f"{fleet.DRILL_LABEL}={p.run_id}"
    if make_nodes:
        h.nodes.extend(specs)  # the harness deletes them at the end
        await fleet.create_nodes_labelled(api, specs, run_label)
    await fleet.wait_listed(
        api,
        what="nodes",
        names=[s.name for s in specs],
        ready=fleet.node_is_ready,
        list_call=lambda: core.list_node(label_selector=selector),
    )
    say(f"nodes: {len(specs)} Ready" + ("" if make_nodes else " (the cluster's own)"))

    # One trainer per opted-in rank, each on its own loopback port.
    todo = [(g, r) for g in p.gangs if g.opt_in for r in g.ranks]
    trainers = [
        ScriptedTrainer(
            f"{h.namespace}/{g.name}-{r.rank}",
            latency_s=r.latency_s,
            fail=r.fail,
            hang=r.hang,
            durable=r.durable,
        )
        for g, r in todo
    ]
    urls = await fleet.bounded((add_trainer(h.trainers, t) for t in trainers), 16)
    built.trainers = {t.key.rsplit("/", 1)[-1]: t for t in trainers}
    url_of = {t.key.rsplit("/", 1)[-1]: u for t, u in zip(trainers, urls, strict=True)}

    now = utcnow()
    gang_specs = []
    for g in p.gangs:
        checkpoint = now - timedelta(seconds=g.last_checkpoint_age_s)
        built.annotated[g.name] = checkpoint
        labels = {**g.labels, **run_label}
        if g.integration is Integration.KUEUE:
            labels |= fleet.kueue_labels(g.name, g.queue)
        spec = fleet.GangSpec(
            name=g.name,
            ranks=[
                fleet.RankSpec(
                    node=built.nodes[r.node].name,
                    checkpoint_url=url_of.get(f"{g.name}-{r.rank}", ""),
                    last_checkpoint=checkpoint,
                )
                for r in g.ranks
            ],
            gpus_per_rank=g.gpus_per_rank,
            tenant=g.tenant,
            queue=g.queue,
            scope=g.scope.value,
            checkpoint_timeout=f"{g.timeout_s:g}s",
            extra_labels=labels,
        )
        gang_specs.append(spec)
        built.specs[g.name] = spec
    names = await fleet.create_gangs(api, gang_specs, h.namespace)
    await fleet.wait_listed(
        api,
        what="pods",
        names=names,
        ready=fleet.pod_is_running,
        list_call=lambda: core.list_namespaced_pod(h.namespace, label_selector=selector),
    )
    # The trainers have been running for a while: set each pod's start accordingly.
    starts = {
        f"{g.name}-{r.rank}": now - timedelta(seconds=g.pod_age_s) for g in p.gangs for r in g.ranks
    }
    await fleet.bounded(
        fleet.backdate_start(api, h.namespace, pod, at) for pod, at in starts.items()
    )
    pods = await core.list_namespaced_pod(h.namespace, label_selector=selector)
    built.started = {pod.metadata.name: pod.status.start_time for pod in pods.items if pod.status}
    for g in p.gangs:
        if g.pdb_max_unavailable is not None:
            await fleet.create_pdb(api, h.namespace, g.name, g.pdb_max_unavailable)
        if g.integration is Integration.KUEUE:
            await fleet.create_admitted_workload(
                api,
                built.specs[g.name],
                h.namespace,
                cluster_queue=KUEUE_CLUSTER_QUEUE,
                local_queue=g.queue,
            )
    kueue = sum(1 for g in p.gangs if g.integration is Integration.KUEUE)
    say(
        f"gangs: {len(p.gangs)} running ({len(names)} pods, {len(trainers)} trainers"
        + (f", {kueue} admitted Kueue workloads" if kueue else "")
        + ")"
    )
