"""``reclaimd drill run SCENARIO``: rehearse an interruption on the local stack, then judge it.

One drill, top to bottom:

1. **Plan** the scenario (``chaos.scenario``): nodes, gangs, behaviours and notices, seeded.
2. **Build** the cluster on kwok with bounded concurrency: labelled nodes, one fake trainer per
   opted-in rank (``chaos.trainers.ScriptedTrainer``), the gangs' pods backdated to their start
   time, PDBs, and for Kueue gangs an admitted Workload.
3. **Start reclaimd** as real processes: ``replicas`` central daemons with every source the
   scenario uses (SQS, Pub/Sub, Kafka notices, Kueue), plus one per-node daemon for each node
   an IMDS or metadata-server notice targets, each with its own mock server.
4. **Inject** each notice through its real transport at its planned time (``chaos.inject``),
   with its duplicates and the garbage around it, and keep the notice each payload must become
   (parsed from the very bytes sent): that is the ground truth of ids and deadlines.
5. **Wait** for the ledger events of every affected gang and for every claim to be done,
   reading Kafka as events arrive (one progress line each, on stderr), then a settle period
   to catch duplicates.
6. **Judge** (``chaos.report``): stop reclaimd (its spans flush), gather what is left of the
   pods, what each trainer received, the claims, the queue and the spans, and check it all.

Exit status: 0 when every expectation holds, 1 when one does not, 2 for a bad scenario or a
stack that is not running. Heavy clients are imported when a drill runs, not when the CLI
starts, so ``reclaimd parse`` stays quick.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import logging
import socket
import sys
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO, TypeVar

from reclaimd import postmortem
from reclaimd.model import Notice, utcnow

from . import report
from .scenario import (
    Fault,
    FaultKind,
    Integration,
    Plan,
    PlannedGang,
    PlannedGarbage,
    PlannedNotice,
    Scenario,
    ScenarioError,
    Source,
)
from .scenario import load as load_scenario
from .scenario import plan as plan_scenario

if TYPE_CHECKING:
    from .faults import FaultRecord
    from .fleet import GangSpec, NodeSpec
    from .gce_metadata_server import GceMetadataServer
    from .harness import Harness
    from .inject import ImdsMock
    from .process import DaemonProcess
    from .stack import StackEnv
    from .trainers import SaveRecord, ScriptedTrainer

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
T = TypeVar("T")
KUEUE_CLUSTER_QUEUE = "cq-drill"
SPAWN_LIMIT = 2  # reclaimd processes started at once: each import costs a core-second
CLAIM_POLL_S = 0.5  # how often the drill reads the claims (a takeover is timed from them)
SEND_RETRY_S = 60.0  # a send into a transport that is down is retried this long (a real
# producer retries too; the fault drills take moto and the Pub/Sub emulator down for seconds)
LATE_READ_S = 10.0  # after giving up and stopping reclaimd, the ledger is read this much longer


class Progress:
    """One line per event, with seconds since the drill started, on ``out`` (stderr)."""

    def __init__(self, out: TextIO | None = None, *, quiet: bool = False) -> None:
        self.out = out if out is not None else sys.stderr
        self.quiet = quiet
        self._start: datetime = utcnow()

    def __call__(self, message: str) -> None:
        if self.quiet:
            return
        at = (utcnow() - self._start).total_seconds()
        print(f"+{at:7.2f}s  {message}", file=self.out, flush=True)


@dataclass
class _Built:
    """What the drill created, and the ground truth it recorded while doing so."""

    nodes: dict[str, NodeSpec] = field(default_factory=dict)  # by node key
    specs: dict[str, GangSpec] = field(default_factory=dict)  # by gang name
    trainers: dict[str, ScriptedTrainer] = field(default_factory=dict)  # by pod name
    annotated: dict[str, datetime] = field(default_factory=dict)  # gang -> last checkpoint
    started: dict[str, datetime] = field(default_factory=dict)  # pod -> status.startTime
    stopped: dict[str, datetime] = field(default_factory=dict)  # pod -> stopped by the drill
    imds: dict[str, ImdsMock] = field(default_factory=dict)  # node key -> its mock
    gce: dict[str, GceMetadataServer] = field(default_factory=dict)  # node key -> stand-in
    pubsub_topic: str = ""
    pubsub_subscription: str = ""
    notices_topic: str = ""


class Drill:
    """One run of one scenario against the stack; ``run`` returns the verdict."""

    def __init__(
        self,
        scenario: Scenario,
        stack: StackEnv,
        *,
        progress: Progress | None = None,
        run_id: str = "",
        apiserver_proxy: bool | None = None,
    ) -> None:
        self.plan: Plan = plan_scenario(scenario, run_id=run_id or uuid.uuid4().hex[:8])
        # Each central replica reaches the apiserver through a proxy of its own when a fault
        # cuts one off (None: only then; True or False to measure what the proxy costs).
        self.proxied = (
            any(f.kind is FaultKind.PARTITION for f in scenario.faults)
            if apiserver_proxy is None
            else apiserver_proxy
        )
        self._proxies: list[Any] = []  # netproxy.ProxyProcess by central replica slot
        self._replaced: dict[int, int] = {}  # central replica slot -> replacements started
        self.gave_up: report.GaveUp | None = None
        self.stack = stack
        self.say = progress or Progress()
        self.built = _Built()
        self.sent: list[report.NoticeFacts] = []
        self.garbage_sent = 0
        self.events: list[dict[str, Any]] = []
        self._publisher: Any = None
        self._producer: Any = None
        self._stop_pods: list[asyncio.Task[None]] = []
        self.replicas: list[DaemonProcess] = []  # central reclaimd i, its current process
        self.faults: list[FaultRecord] = []
        self.claim_history: dict[str, list[report.ClaimSeen]] = {}
        self.arrivals: list[report.Arrival] = []
        self._resend: dict[str, Callable[[], Any]] = {}  # notice label -> send it again
        # Set (and replaced) each time the Pub/Sub topic is put back after a restart.
        self._topic_back = asyncio.Event()
        self._under_way: dict[str, Source] = {}  # notices whose send has not returned yet
        self._claims_seen: dict[str, str] = {}  # the last phases read (the apiserver may be down)
        self._ports: dict[str, int] = {}  # central replica name -> its /readyz port

    @property
    def scenario(self) -> Scenario:
        return self.plan.scenario

    @property
    def sources(self) -> frozenset[Source]:
        return self.plan.sources()

    # --- the run ----------------------------------------------------------------------------

    async def run(self) -> report.Verdict:
        from .harness import Harness

        # A failing or cut-off fake trainer is the scenario working, not news for the console.
        logging.getLogger("reclaimd.workload").setLevel(logging.ERROR)
        # The drill's own Kafka clients retry through a stop_kafka outage; one line a retry
        # would bury the progress lines (the reader says once that it reads again).
        logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
        p = self.plan
        ranks = sum(len(g.ranks) for g in p.gangs)
        self.say(
            f"drill {self.scenario.name} run {p.run_id}: {len(p.nodes)} nodes, {len(p.gangs)}"
            f" gangs ({ranks} ranks), {len(p.notices)} notices, {len(p.garbage)} garbage"
        )
        async with Harness(self.stack, name=p.run_id) as h:
            try:
                await self._build(h)
                await self._transports(h)
                await self._start_reclaimd(h)
                reader = asyncio.create_task(self._read_ledger(h))
                poller = asyncio.create_task(self._poll_claims(h))
                try:
                    await self._inject(h)
                    await self._wait(h, reader)
                    # Stopped while the ledger is still read: an event its outbox flushes as
                    # it stops is seen (late, after a give-up; a duplicate, otherwise).
                    await self._stop_reclaimd(h)
                    if self.gave_up is not None:
                        await self._read_late(reader)
                finally:
                    for task in (reader, poller):
                        task.cancel()
                        with contextlib.suppress(asyncio.CancelledError):
                            await task
                return await self._judge(h)
            finally:
                await self._teardown(h)

    # --- build ------------------------------------------------------------------------------

    async def _build(self, h: Harness) -> None:
        from kubernetes_asyncio import client as k8s

        from . import fleet
        from .trainers import ScriptedTrainer, add_trainer

        p, api = self.plan, h.api
        assert api is not None
        run_label = {fleet.DRILL_LABEL: p.run_id}
        specs = [
            fleet.NodeSpec(
                name=n.name,
                instance_id=n.instance_id,
                zone=n.zone,
                gpus=n.gpus,
                sku=n.sku,
                purchase_option=n.purchase_option,
                cell=n.cell,
                cloud=n.cloud.value,
                project=n.project,
            )
            for n in p.nodes
        ]
        self.built.nodes = {n.key: s for n, s in zip(p.nodes, specs, strict=True)}
        h.nodes.extend(specs)  # the harness deletes them at the end
        await fleet.create_nodes_labelled(api, specs, run_label)
        core = k8s.CoreV1Api(api)
        selector = f"{fleet.DRILL_LABEL}={p.run_id}"
        await fleet.wait_listed(
            api,
            what="nodes",
            names=[s.name for s in specs],
            ready=fleet.node_is_ready,
            list_call=lambda: core.list_node(label_selector=selector),
        )
        self.say(f"nodes: {len(specs)} Ready")

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
        self.built.trainers = {t.key.rsplit("/", 1)[-1]: t for t in trainers}
        url_of = {t.key.rsplit("/", 1)[-1]: u for t, u in zip(trainers, urls, strict=True)}

        now = utcnow()
        gang_specs = []
        for g in p.gangs:
            checkpoint = now - timedelta(seconds=g.last_checkpoint_age_s)
            self.built.annotated[g.name] = checkpoint
            labels = {**g.labels, **run_label}
            if g.integration is Integration.KUEUE:
                labels |= fleet.kueue_labels(g.name, g.queue)
            spec = fleet.GangSpec(
                name=g.name,
                ranks=[
                    fleet.RankSpec(
                        node=self.built.nodes[r.node].name,
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
            self.built.specs[g.name] = spec
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
            f"{g.name}-{r.rank}": now - timedelta(seconds=g.pod_age_s)
            for g in p.gangs
            for r in g.ranks
        }
        await fleet.bounded(
            fleet.backdate_start(api, h.namespace, pod, at) for pod, at in starts.items()
        )
        pods = await core.list_namespaced_pod(h.namespace, label_selector=selector)
        self.built.started = {
            pod.metadata.name: pod.status.start_time for pod in pods.items if pod.status
        }
        for g in p.gangs:
            if g.pdb_max_unavailable is not None:
                await fleet.create_pdb(api, h.namespace, g.name, g.pdb_max_unavailable)
            if g.integration is Integration.KUEUE:
                await fleet.create_admitted_workload(
                    api,
                    self.built.specs[g.name],
                    h.namespace,
                    cluster_queue=KUEUE_CLUSTER_QUEUE,
                    local_queue=g.queue,
                )
        kueue = sum(1 for g in p.gangs if g.integration is Integration.KUEUE)
        self.say(
            f"gangs: {len(p.gangs)} running ({len(names)} pods, {len(trainers)} trainers"
            + (f", {kueue} admitted Kueue workloads" if kueue else "")
            + ")"
        )

    async def _transports(self, h: Harness) -> None:
        """The per-run pieces of each transport the scenario uses."""
        from .gce_metadata_server import GceMetadataServer
        from .inject import ImdsMock

        p = self.plan
        await self._kafka_topics(h)
        if Source.GKE_PUBSUB in self.sources:
            await self._pubsub_setup()
        if Source.KAFKA in self.sources:
            await self._kafka_setup()
        aemm = _aemm_binary(self.stack)
        for n in p.notices:
            if n.node is None:
                continue
            node = p.node(n.node)
            if n.source is Source.IMDS and n.node not in self.built.imds:
                if aemm is None:
                    raise ScenarioError("imds: amazon-ec2-metadata-mock not found in the stack")
                self.built.imds[n.node] = ImdsMock(aemm, h.workdir / "imds", _free_port())
            if n.source is Source.GCE_METADATA and n.node not in self.built.gce:
                server = GceMetadataServer(project=node.project, zone=node.zone, instance=node.name)
                await server.start()
                self.built.gce[n.node] = server

    @property
    def pubsub_slots(self) -> int:
        """Central replicas on Pub/Sub each consume a subscription of their own (a slot), so
        that no LogEntry depends on one replica; one replica keeps the plain subscription."""
        replicas = self.scenario.reclaimd.replicas
        return replicas if replicas > 1 else 1

    def _pubsub_subscriptions(self) -> list[str]:
        """The run's subscription ids: ``<base>-<slot>`` with slots, else ``<base>``."""
        base, n = self.built.pubsub_subscription, self.pubsub_slots
        return [base] if n == 1 else [f"{base}-{i}" for i in range(n)]

    async def _pubsub_setup(self) -> None:
        from google.cloud import pubsub_v1

        project = self.stack["PUBSUB_PROJECT_ID"]
        publisher = pubsub_v1.PublisherClient()
        subscriber = pubsub_v1.SubscriberClient()
        topic = publisher.topic_path(project, f"gce-system-events-{self.plan.run_id}")
        self.built.pubsub_topic = topic
        self.built.pubsub_subscription = f"reclaimd-{self.plan.run_id}"
        await asyncio.to_thread(publisher.create_topic, name=topic)
        for sub_id in self._pubsub_subscriptions():
            # As deploy/gcp/main.tf makes them: every slot's subscription on the one topic.
            await asyncio.to_thread(
                subscriber.create_subscription,
                name=subscriber.subscription_path(project, sub_id),
                topic=topic,
                ack_deadline_seconds=10,
            )
        await asyncio.to_thread(subscriber.close)
        self._publisher = publisher
        if self.pubsub_slots > 1:
            self.say(
                f"pubsub: {self.pubsub_slots} slots, one subscription each on the topic"
                f" ({', '.join(self._pubsub_subscriptions())})"
            )

    def _pubsub_cleanup(self) -> None:
        """Delete the run's subscriptions and topic (the emulator keeps them otherwise)."""
        from google.cloud import pubsub_v1

        subscriber = pubsub_v1.SubscriberClient()
        for sub_id in self._pubsub_subscriptions():
            path = subscriber.subscription_path(self.stack["PUBSUB_PROJECT_ID"], sub_id)
            with contextlib.suppress(Exception):
                subscriber.delete_subscription(subscription=path)
        subscriber.close()
        with contextlib.suppress(Exception):
            self._publisher.delete_topic(topic=self.built.pubsub_topic)

    async def _slot_leases_cleanup(self, h: Harness) -> None:
        """Delete the run's Pub/Sub slot Leases (named for its subscriptions: nobody else's)."""
        from kubernetes_asyncio import client as k8s

        from reclaimd.cluster import slots
        from reclaimd.config import Settings

        if h.api is None or self.pubsub_slots == 1:
            return
        coord = k8s.CoordinationV1Api(h.api)
        default = Settings.model_fields["lease_namespace"].default
        namespace = str(self.scenario.reclaimd.settings.get("lease_namespace", default))
        for sub_id in self._pubsub_subscriptions():
            with contextlib.suppress(Exception):
                await coord.delete_namespaced_lease(slots.lease_name(sub_id), namespace)

    async def _kafka_topics(self, h: Harness) -> None:
        """The run's notices topic when the scenario sends CloudEvents (the harness made the
        ledger topic)."""
        if Source.KAFKA in self.sources:
            self.built.notices_topic = f"reclaimd.notices.{self.plan.run_id}"
            await h.create_topics({self.built.notices_topic: 3})

    async def _kafka_setup(self) -> None:
        from aiokafka import AIOKafkaProducer

        self._producer = AIOKafkaProducer(bootstrap_servers=self.stack.kafka, acks="all")
        await self._producer.start()

    # --- reclaimd ---------------------------------------------------------------------------

    def _central_overrides(self, h: Harness, name: str, slot: int) -> dict[str, Any]:
        s = self.sources
        o: dict[str, Any] = dict(self.scenario.reclaimd.as_settings())
        o["tracing"] = {"span_file": str(h.workdir / f"spans-{name}.jsonl")}
        if self._proxies:
            # the replica's apiserver is its proxy (a fresh disk or a successor: the same one)
            o["kube"] = {"kubeconfig": str(self._proxy_kubeconfig(h, slot))}
        if any(f.replica is None for f in self.scenario.faults):
            # /readyz on a port of its own: the drill samples it during a stack fault
            o["metrics_port"] = self._ports.setdefault(name, _free_port())
        if Source.GKE_PUBSUB in s:
            o["pubsub"] = {
                "enabled": True,
                "project": self.stack["PUBSUB_PROJECT_ID"],
                "subscription": self.built.pubsub_subscription,
                "slots": self.pubsub_slots,
            }
        if Source.KAFKA in s:
            o["kafka_notices"] = {
                "enabled": True,
                "bootstrap": self.stack.kafka,
                "topic": self.built.notices_topic,
                "group_id": f"reclaimd-{self.plan.run_id}",
            }
        if Source.KUEUE in s:
            o["kueue"] = {"enabled": True, "namespaces": [h.namespace]}
        return o

    async def _start_proxies(self) -> None:
        """One apiserver proxy per central replica (``chaos.netproxy``), each its own process."""
        from urllib.parse import urlsplit

        from .netproxy import ProxyProcess

        server = urlsplit(_kubeconfig_server(Path(self.stack.reclaimd_kubeconfig)))
        upstream = (server.hostname or "127.0.0.1", server.port or 443)
        for _ in range(self.scenario.reclaimd.replicas):
            proxy = ProxyProcess(upstream)
            self._proxies.append(proxy)  # stopped by the teardown, started or not
            await proxy.start()
        ports = ", ".join(str(p.port) for p in self._proxies)
        self.say(f"apiserver proxies: one per replica on 127.0.0.1 ({ports})")

    def _proxy_kubeconfig(self, h: Harness, slot: int) -> Path:
        """reclaimd's kubeconfig with the server replaced by replica ``slot``'s proxy (the
        apiserver's certificate names 127.0.0.1: any port on it verifies)."""
        import yaml

        path = h.workdir / f"reclaimd-{slot}.kubeconfig"
        if not path.exists():
            doc = yaml.safe_load(Path(self.stack.reclaimd_kubeconfig).read_text())
            for cluster in doc.get("clusters") or []:
                cluster["cluster"]["server"] = f"https://{self._proxies[slot].address}"
            path.write_text(yaml.safe_dump(doc))
            path.chmod(0o600)
        return path

    async def _partition(self, slot: int, cut: bool) -> int:
        proxy = self._proxies[slot]
        if cut:
            return int(await proxy.cut())
        await proxy.heal()
        return 0

    async def _start_reclaimd(self, h: Harness) -> None:
        if self.proxied:
            await self._start_proxies()
        gate = asyncio.Semaphore(SPAWN_LIMIT)
        starts: list[tuple[str, dict[str, Any]]] = []
        for i in range(self.scenario.reclaimd.replicas):
            name = f"reclaimd-{i}"
            starts.append((name, self._central_overrides(h, name, i)))
        base = dict(self.scenario.reclaimd.as_settings())

        def per_node(name: str, source: dict[str, Any]) -> tuple[str, dict[str, Any]]:
            # A DaemonSet-style reclaimd: its own node's metadata source, no SQS, own spans.
            spans = {"span_file": str(h.workdir / f"spans-{name}.jsonl")}
            return name, {**base, "tracing": spans, "sqs": {"enabled": False}, **source}

        for key, mock in self.built.imds.items():
            imds = {"enabled": True, "url": mock.url, "poll_interval_s": 0.5}
            starts.append(per_node(f"imds-{key}", {"imds": imds}))
        for key, server in self.built.gce.items():
            gce = {"enabled": True, "url": server.url, "node_name": self.built.nodes[key].name}
            starts.append(per_node(f"gce-{key}", {"gce_metadata": gce}))

        async def one(name: str, overrides: dict[str, Any]) -> DaemonProcess:
            async with gate:
                return await h.start_daemon(name, **overrides)

        started = await asyncio.gather(*(one(n, o) for n, o in starts))
        self.replicas = list(started[: self.scenario.reclaimd.replicas])
        self.say(f"reclaimd: {len(starts)} process(es) running ({', '.join(n for n, _ in starts)})")

    # --- inject -----------------------------------------------------------------------------

    async def _inject(self, h: Harness) -> None:
        loop = asyncio.get_running_loop()
        t0, wall0 = loop.time(), utcnow()

        async def at(offset: float) -> None:
            await asyncio.sleep(max(0.0, t0 + offset - loop.time()))

        async def notice(n: PlannedNotice) -> None:
            await at(n.send_at_s)
            self._under_way[n.label] = n.source
            try:
                facts = await self._send(h, n, wall0 + timedelta(seconds=n.issued_at_s))
            finally:
                del self._under_way[n.label]
            self.sent.append(facts)
            dup = f" x{n.copies}" if n.copies > 1 else ""
            self.say(f"sent {n.label} {n.kind} -> {facts.target}{dup}")

        async def garbage(g: PlannedGarbage) -> None:
            await at(g.send_at_s)
            await self._send_garbage(h, g)
            self.garbage_sent += 1

        stack_faults = asyncio.Lock()  # one outage of the shared stack at a time

        async def fault(f: Fault) -> None:
            from . import faults

            await at(f.at_s)
            if f.replica is None:
                async with stack_faults:
                    self.faults.append(await faults.apply(f, self.stack, self._fault_hooks(h)))
            else:
                self.faults.append(await faults.apply(f, self.stack, self._fault_hooks(h)))

        await asyncio.gather(
            *(notice(n) for n in self.plan.notices),
            *(garbage(g) for g in self.plan.garbage),
            *(fault(f) for f in self.scenario.faults),
        )
        if self.garbage_sent:
            self.say(f"sent {self.garbage_sent} malformed payload(s) among the notices")

    async def _send(self, h: Harness, n: PlannedNotice, issued: datetime) -> report.NoticeFacts:
        """Send one notice (with its duplicates) through its transport; what it must become."""
        p = self.plan
        sent_at = utcnow()
        senders = {
            Source.EC2_SQS: self._send_sqs,
            Source.IMDS: self._send_imds,
            Source.GKE_PUBSUB: self._send_pubsub,
            Source.GCE_METADATA: self._send_gce_metadata,
            Source.KUEUE: self._send_kueue,
            Source.KAFKA: self._send_kafka,
        }
        parser, payload = await senders[n.source](h, n, issued, sent_at)
        notice = _expected_notice(parser, payload, sent_at, p)
        node = p.node(n.node) if n.node is not None else None
        gangs = (n.gang,) if n.gang is not None else tuple(g.name for g in p.gangs_on(n.node or ""))
        return report.NoticeFacts(
            label=n.label,
            source=n.source.value,
            kind=n.kind,
            target=_describe(n, node.instance_id if node is not None else ""),
            notice_id=notice.id,
            response=notice.response.value,
            deadline=notice.deadline,
            sent_at=sent_at,
            gangs=gangs,
            copies=n.copies,
            claim_key=f"{h.namespace}/{n.gang}"
            if n.gang is not None
            else node.name
            if node
            else "",
        )

    async def _send_sqs(
        self, h: Harness, n: PlannedNotice, issued: datetime, sent_at: datetime
    ) -> tuple[str, bytes]:
        from . import inject

        node = self.plan.node(_some(n.node))
        zone, region, event_id = node.zone, node.zone[:-1], str(uuid.uuid4())
        if n.kind == "rebalance-recommendation":
            event = inject.rebalance_event(
                node.instance_id, zone=zone, region=region, at=issued, event_id=event_id
            )
        else:
            event = inject.spot_itn_event(
                node.instance_id, zone=zone, region=region, at=issued, action=n.action,
                event_id=event_id,
            )  # fmt: skip
        body = json.dumps(event)
        await self._copies(n, lambda: asyncio.to_thread(inject.send_sqs, h.sqs, h.queue_url, body))
        return "ec2", body.encode()

    async def _send_imds(
        self, h: Harness, n: PlannedNotice, issued: datetime, sent_at: datetime
    ) -> tuple[str, bytes]:
        from . import inject

        node = self.plan.node(_some(n.node))
        deadline = issued + timedelta(seconds=self.plan.windows.ec2_spot_s)
        identity = {
            "instance_id": node.instance_id,
            "zone": node.zone,
            "region": node.zone[:-1],
            "instance_type": node.sku,
        }
        await self.built.imds[node.key].start(**identity, action=n.action, deadline=deadline)
        envelope = inject.imds_envelope(**identity, action=n.action, at=deadline)
        return "imds", json.dumps(envelope).encode()

    async def _send_pubsub(
        self, h: Harness, n: PlannedNotice, issued: datetime, sent_at: datetime
    ) -> tuple[str, bytes]:
        from . import inject

        node = self.plan.node(_some(n.node))
        entry = inject.gce_log_entry(
            project=node.project, zone=node.zone, instance=node.name, kind=n.kind, at=issued
        )
        topic = self.built.pubsub_topic

        async def publish() -> str:
            from google.api_core import exceptions

            back = self._topic_back
            try:
                return await inject.publish_pubsub(self._publisher, topic, entry)
            except exceptions.NotFound:
                # A restarted emulator lost the topic (a real one would have taken the
                # message): wait for the rig to put it back, however long that took, then
                # publish again.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(back.wait(), SEND_RETRY_S)
                return await inject.publish_pubsub(self._publisher, topic, entry)

        await self._copies(n, publish)
        return "gke", json.dumps(entry).encode()

    async def _send_gce_metadata(
        self, h: Harness, n: PlannedNotice, issued: datetime, sent_at: datetime
    ) -> tuple[str, bytes]:
        from . import inject

        node = self.plan.node(_some(n.node))
        key, value = inject.GCE_METADATA[n.kind]
        etag = await self.built.gce[node.key].set(key, value)
        envelope = inject.gce_metadata_envelope(
            project=node.project, zone=node.zone, instance=node.name, kind=n.kind, etag=etag,
            at=sent_at,
        )  # fmt: skip
        return "gce-metadata", json.dumps(envelope).encode()

    async def _send_kueue(
        self, h: Harness, n: PlannedNotice, issued: datetime, sent_at: datetime
    ) -> tuple[str, bytes]:
        from . import inject

        gang = _some(n.gang)
        assert h.api is not None
        api = h.api
        # retried like every other send: the apiserver may be restarting (a fault)
        stored = await _retrying(
            lambda: inject.evict_workload(api, h.namespace, gang, reason=n.reason, at=issued)
        )
        pods = [f"{gang}-{r.rank}" for r in self.plan.gang(gang).ranks]
        self._stop_pods.append(asyncio.create_task(self._stop_later(h, pods, n)))
        return "kueue", json.dumps(stored).encode()

    async def _send_kafka(
        self, h: Harness, n: PlannedNotice, issued: datetime, sent_at: datetime
    ) -> tuple[str, bytes]:
        from . import inject

        target: dict[str, Any]
        if n.gang is not None:
            target = {"workload": {"namespace": h.namespace, "name": n.gang}}
            pods = [f"{n.gang}-{r.rank}" for r in self.plan.gang(n.gang).ranks]
            self._stop_pods.append(asyncio.create_task(self._stop_later(h, pods, n)))
        else:
            node = self.plan.node(_some(n.node))
            target = {"node_name": node.name, "provider_id": self.built.nodes[node.key].provider_id}
        deadline = issued + timedelta(seconds=n.window_s) if n.window_s is not None else None
        event = inject.cloudevent_notice(n.kind, target, at=issued, deadline=deadline)
        value = json.dumps(event).encode()
        topic, key = self.built.notices_topic, str(event["id"])
        await self._copies(n, lambda: inject.send_kafka(self._producer, topic, value, key=key))
        return "kafka", value

    async def _copies(self, n: PlannedNotice, send: Callable[[], Any]) -> None:
        """The notice, then its duplicates (a redelivery: same identity, new message)."""
        self._resend[n.label] = send
        for i in range(n.copies):
            if i:
                await asyncio.sleep(n.duplicate_delay_s)
            await _retrying(send)

    async def _stop_later(self, h: Harness, pods: list[str], n: PlannedNotice) -> None:
        """The scheduler that reclaims a workload (Kueue suspends its job at once) stops its
        pods: they run for their grace period, then are gone."""
        from . import inject

        api = h.api
        assert api is not None
        await asyncio.sleep(n.pods_stop_after_s)
        # A pod that is gone answers nothing: its trainer stops with it (a save under way is
        # cut short), rather than outliving it as a drill's in-process trainer could.
        for pod in pods:
            self.built.stopped[pod] = utcnow()
            trainer = self.built.trainers.get(pod)
            if trainer is not None:
                await trainer.server.stop()
        await _retrying(lambda: inject.stop_pods(api, h.namespace, pods))

    async def _send_garbage(self, h: Harness, g: PlannedGarbage) -> None:
        from . import inject

        if g.source is Source.EC2_SQS:
            body = inject.garbage_sqs(g.variant)
            await asyncio.to_thread(inject.send_sqs, h.sqs, h.queue_url, body)
        elif g.source is Source.GKE_PUBSUB:
            await inject.publish_pubsub(
                self._publisher, self.built.pubsub_topic, inject.garbage_pubsub(g.variant)
            )
        elif g.source is Source.KAFKA:
            await inject.send_kafka(
                self._producer, self.built.notices_topic, inject.garbage_kafka(g.variant)
            )

    # --- faults -----------------------------------------------------------------------------

    def _fault_hooks(self, h: Harness) -> Any:
        from . import faults

        async def replace(i: int) -> DaemonProcess:
            # A new pod on a new node: its own holder name, no outbox, a new span file.
            self._replaced[i] = self._replaced.get(i, 0) + 1
            name = f"reclaimd-{i}-fresh{self._replaced[i]}"
            d = await h.start_daemon(name, **self._central_overrides(h, name, i))
            self.replicas[i] = d
            return d

        async def open_claims() -> dict[str, tuple[str, str]]:
            out = {}
            for key, raw in (await self._claim_docs(h)).items():
                if raw.get("phase") not in (None, "", "done"):
                    out[key] = (str(raw.get("holder", "")), str(raw.get("notice_id", "")))
            return out

        return faults.FaultHooks(
            replica=lambda i: self.replicas[i],
            holder_of=lambda d: str(yaml_holder(d)),
            replace=replace,
            open_claims=open_claims,
            after_restart=lambda kind: self._after_restart(h, kind),
            say=self.say,
            readyz=self._readyz if self._ports else None,
            partition=self._partition if self._proxies else None,
        )

    async def _readyz(self) -> dict[str, int]:
        """``/readyz`` of every central replica that runs (not paused): name -> HTTP status,
        0 for no answer within a second."""
        import aiohttp

        live = [
            d for d in self.replicas
            if d.name in self._ports and d.running and not d.paused
        ]  # fmt: skip
        timeout = aiohttp.ClientTimeout(total=1.0)

        async def one(session: aiohttp.ClientSession, name: str) -> int:
            try:
                async with session.get(f"http://127.0.0.1:{self._ports[name]}/readyz") as r:
                    return r.status
            except (aiohttp.ClientError, TimeoutError):
                return 0

        async with aiohttp.ClientSession(timeout=timeout) as session:
            answers = await asyncio.gather(*(one(session, d.name) for d in live))
        return {d.name: status for d, status in zip(live, answers, strict=True)}

    async def _after_restart(self, h: Harness, kind: FaultKind) -> int:
        """Put back what a restarted in-memory emulator lost and a real service would have
        kept: the run's queue (or topic and subscription), every notice sent before that no
        claim records yet (its message would still be in a real queue), and every notice whose
        send was under way when the emulator went down (a publish into a dying emulator can
        hang for its whole 30 s timeout: a real topic would have taken it)."""
        if kind is FaultKind.RESTART_MOTO:
            await _retrying(lambda: asyncio.to_thread(h.create_queue))
            source = Source.EC2_SQS
        else:
            await _retrying(self._pubsub_recreate)
            source = Source.GKE_PUBSUB
        claims = await _retrying(lambda: self._claim_docs(h))
        unclaimed = [
            n for n in self.sent
            if n.source == source.value and claims.get(n.claim_key, {}).get("notice_id")
            != n.notice_id
        ]  # fmt: skip
        under_way = [
            label for label, s in self._under_way.items() if s is source and label in self._resend
        ]
        for label in [n.label for n in unclaimed] + under_way:
            await _retrying(self._resend[label])
        return len(unclaimed) + len(under_way)

    async def _pubsub_recreate(self) -> None:
        from google.api_core import exceptions
        from google.cloud import pubsub_v1

        subscriber = pubsub_v1.SubscriberClient()
        project = self.stack["PUBSUB_PROJECT_ID"]
        try:
            with contextlib.suppress(exceptions.AlreadyExists):
                await asyncio.to_thread(self._publisher.create_topic, name=self.built.pubsub_topic)
            for sub_id in self._pubsub_subscriptions():
                with contextlib.suppress(exceptions.AlreadyExists):
                    await asyncio.to_thread(
                        subscriber.create_subscription,
                        name=subscriber.subscription_path(project, sub_id),
                        topic=self.built.pubsub_topic,
                        ack_deadline_seconds=10,
                    )
            self._topic_back.set()
            self._topic_back = asyncio.Event()
        finally:
            await asyncio.to_thread(subscriber.close)

    async def _poll_claims(self, h: Harness) -> None:
        """Every claim version the drill can see, with who wrote it and when (takeovers)."""
        while True:
            with contextlib.suppress(Exception):  # the apiserver may be down for a moment
                docs = await self._claim_docs(h)
                now = utcnow()
                for key, doc in docs.items():
                    seen = report.ClaimSeen(
                        seen_at=now,
                        holder=str(doc.get("holder", "")),
                        phase=str(doc.get("phase", "")),
                        notice_id=str(doc.get("notice_id", "")),
                        heartbeat_at=report._time(doc.get("heartbeat_at")),
                    )
                    history = self.claim_history.setdefault(key, [])
                    last = history[-1] if history else None
                    if last is None or dataclasses.replace(last, seen_at=now) != seen:
                        history.append(seen)  # a new version: record when it was first seen
            await asyncio.sleep(CLAIM_POLL_S)

    # --- wait -------------------------------------------------------------------------------

    async def _read_ledger(self, h: Harness) -> None:
        """Read the run's ledger topic from the start for as long as the drill runs; a broker
        that goes away (a fault) is read again from where the reader was."""
        seen: set[tuple[int, int]] = set()
        while True:
            consumer = h.ledger_consumer()
            try:
                await consumer.start()
                while True:
                    batch = await consumer.getmany(timeout_ms=300)
                    for records in batch.values():
                        for r in records:
                            if (r.partition, r.offset) in seen:
                                continue
                            seen.add((r.partition, r.offset))
                            self._arrived(json.loads(r.value), r.timestamp, r.timestamp_type)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # a broker outage: read again once it is back
                self.say(f"ledger reader: {type(e).__name__}; reading again")
                await asyncio.sleep(1.0)
            finally:
                with contextlib.suppress(Exception):
                    await consumer.stop()

    def _arrived(self, event: dict[str, Any], timestamp_ms: int, timestamp_type: int) -> None:
        self.events.append(event)
        appended = (
            _EPOCH + timedelta(milliseconds=timestamp_ms) if timestamp_type == 1 else None
        )  # 1: LogAppendTime, the broker's clock; 0 would be the producer's
        self.arrivals.append(
            report.Arrival(
                gang=report.gang_of(event),
                event_id=str(event.get("EventId", "")),
                produced_at=report._time(event.get("ChargePeriodEnd")),
                appended_at=appended,
                received_at=utcnow(),
            )
        )
        self._say_event(event)

    def _say_event(self, e: dict[str, Any]) -> None:
        label = next(
            (n.label for n in self.sent if n.notice_id == e.get("x_NoticeId")), "an unknown notice"
        )
        met = "" if e.get("x_DeadlineMet") else ", DEADLINE MISSED"
        self.say(
            f"ledger: {report.gang_of(e)} charged by {label}: {e.get('x_WastedGpuSeconds')} GPU-s"
            f" ({e.get('x_CheckpointOutcome')}{met})"
        )

    async def _wait(self, h: Harness, reader: asyncio.Task[None]) -> None:
        expect = self.scenario.expect
        charging = {g for n in self.sent if n.response != "checkpoint_only" for g in n.gangs}
        keys = {n.claim_key for n in self.sent if n.claim_key}
        loop = asyncio.get_running_loop()
        end = loop.time() + expect.timeout_s
        self.say(f"waiting for {len(charging)} ledger event(s) and {len(keys)} claim(s) done")
        claims: dict[str, str] = {}
        while loop.time() < end:
            if reader.done():
                reader.result()  # the reader died: say why
            claims = await self._claims(h)
            charged = {report.gang_of(e) for e in self.events}
            if charged >= charging and all(claims.get(k) == "done" for k in keys):
                break
            await asyncio.sleep(1.0)
        else:
            open_ = {k: claims.get(k, "") for k in sorted(keys) if claims.get(k) != "done"}
            charged = {report.gang_of(e) for e in self.events}
            holders: dict[str, str] = {}
            with contextlib.suppress(Exception):  # the apiserver may be the thing that is down
                docs = await self._claim_docs(h)
                holders = {k: str(docs.get(k, {}).get("holder", "")) for k in open_}
            self.gave_up = report.GaveUp(
                at=utcnow(),
                timeout_s=expect.timeout_s,
                events=len(charged & charging),
                events_wanted=len(charging),
                open_claims=open_,
                claim_holders=holders,
                # a claim whose holder is gone and that nobody took over is abandoned: lost
                live_holders=frozenset(yaml_holder(d) for d in h.daemons if d.running)
                if holders
                else None,
            )
            self.say(
                f"gave up after {expect.timeout_s:g}s: {len(charged & charging)}/{len(charging)}"
                f" events, {len(open_)} claim(s) not done"
            )
        await asyncio.sleep(expect.settle_s)  # a duplicate would arrive now

    async def _stop_reclaimd(self, h: Harness) -> None:
        """SIGTERM every reclaimd at once (the tracer flushes its spans, the outbox its events)."""
        await asyncio.gather(*(d.stop() for d in h.daemons))

    async def _read_late(self, reader: asyncio.Task[None]) -> None:
        """After a give-up: read the ledger ``LATE_READ_S`` more (or until every gang is
        charged), so that an event that was only late is not judged lost."""
        charging = {g for n in self.sent if n.response != "checkpoint_only" for g in n.gangs}
        loop = asyncio.get_running_loop()
        end = loop.time() + LATE_READ_S
        while loop.time() < end and not reader.done():
            if {report.gang_of(e) for e in self.events} >= charging:
                break
            await asyncio.sleep(0.5)
        late = [a for a in self.arrivals if self.gave_up and a.received_at > self.gave_up.at]
        self.say(f"after giving up: {len(late)} ledger event(s) more")

    async def _claims(self, h: Harness) -> dict[str, str]:
        """Claim phase on every drill node, and on every Workload of the run's namespace (the
        last phases read, while the apiserver is down)."""
        try:
            docs = await self._claim_docs(h)
        except Exception:
            if not self.faults and not self.scenario.faults:
                raise
            return dict(self._claims_seen)
        self._claims_seen = {k: str(d.get("phase", "")) for k, d in docs.items()}
        return dict(self._claims_seen)

    async def _claim_docs(self, h: Harness) -> dict[str, dict[str, Any]]:
        """The claim on every drill node and Workload, decoded ({} for none)."""
        from kubernetes_asyncio import client as k8s

        from . import fleet
        from .harness import CLAIM

        assert h.api is not None
        out: dict[str, dict[str, Any]] = {}
        nodes = await k8s.CoreV1Api(h.api).list_node(
            label_selector=f"{fleet.DRILL_LABEL}={self.plan.run_id}"
        )
        for n in nodes.items:
            out[n.metadata.name] = _claim_doc((n.metadata.annotations or {}).get(CLAIM))
        if any(g.integration is Integration.KUEUE for g in self.plan.gangs):
            wls = await k8s.CustomObjectsApi(h.api).list_namespaced_custom_object(
                fleet.KUEUE_GROUP, fleet.KUEUE_VERSION, h.namespace, "workloads"
            )
            for w in wls.get("items", []):
                annotations = w["metadata"].get("annotations") or {}
                key = f"{h.namespace}/{w['metadata']['name']}"
                out[key] = _claim_doc(annotations.get(CLAIM))
        return out

    # --- judge ------------------------------------------------------------------------------

    async def _judge(self, h: Harness) -> report.Verdict:
        from kubernetes_asyncio import client as k8s

        from reclaimd import postmortem

        await self._stop_reclaimd(h)  # done already, unless the wait failed
        assert h.api is not None
        claims = await _retrying(lambda: self._claims(h))
        pods = await k8s.CoreV1Api(h.api).list_namespaced_pod(h.namespace)
        alive = {
            p.metadata.name
            for p in pods.items
            if not p.metadata.deletion_timestamp
            and (p.status is None or p.status.phase not in ("Succeeded", "Failed"))
        }
        spans: list[dict[str, Any]] = []
        holder_of = {_span_file(d): yaml_holder(d) for d in h.daemons}
        by_holder: dict[str, list[dict[str, Any]]] = {}
        for path in sorted(h.workdir.glob("spans-*.jsonl")):  # one per reclaimd process
            mine = list(postmortem.read_spans(path))
            spans.extend(mine)
            if path in holder_of:
                by_holder.setdefault(holder_of[path], []).extend(mine)
        sqs_used = any(n.source is Source.EC2_SQS for n in self.plan.notices) or any(
            g.source is Source.EC2_SQS for g in self.plan.garbage
        )
        depth = await asyncio.to_thread(h.queue_depth) if sqs_used else None
        e = self.scenario.expect
        verdict = report.evaluate(
            scenario=self.scenario.name,
            run_id=self.plan.run_id,
            expect=report.Expectations(
                deadlines_met=e.deadlines_met,
                all_signaled=e.all_signaled,
                evicted=e.evicted,
                ledger_exact=e.ledger_exact,
                gpu_seconds_tolerance=e.gpu_seconds_tolerance,
                max_notice_to_drained_s=e.max_notice_to_drained_s,
                traces=e.traces,
                transport_drained=e.transport_drained,
            ),
            notices=self.sent,
            gangs=[self._gang_facts(g, h.namespace, alive) for g in self.plan.gangs],
            observed=report.Observed(
                events=self.events,
                spans=spans,
                claims=claims,
                queue_depth=depth,
                garbage_sent=self.garbage_sent,
                claim_history=self.claim_history,
                arrivals=self.arrivals,
                gave_up=self.gave_up,
                spans_by_holder=by_holder,
            ),
            faults=[
                report.FaultFacts(
                    label=f.label,
                    kind=f.fault.kind.value,
                    started_at=f.started_at,
                    ended_at=f.ended_at,
                    holder=f.holder,
                    successor=f.successor,
                    replica=f.fault.replica,
                    held=dict(f.held),
                    resent=f.resent,
                    error=f.error,
                    readiness=tuple(f.readiness),
                    exited_at=f.exited_at,
                    exit_code=f.exit_code,
                    grace_s=f.grace_s,
                    sigkilled=f.sigkilled,
                    connections_cut=f.connections_cut,
                )
                for f in sorted(self.faults, key=lambda f: f.started_at)
            ],
            replicas=self.scenario.reclaimd.replicas,
        )
        files = tuple(str(p) for p in sorted(h.workdir.glob("spans-*.jsonl")))
        daemons = tuple((d.name, d.stats()) for d in h.daemons)
        return dataclasses.replace(verdict, span_files=files, daemons=daemons)

    def _kills(self) -> list[datetime]:
        """When a replica was SIGKILLed (its memory lost)."""
        return [
            f.started_at
            for f in self.faults
            if f.fault.kind in (FaultKind.KILL, FaultKind.FRESH_DISK)
        ]

    def _pauses(self) -> list[tuple[datetime, datetime]]:
        """When a replica was stopped (SIGSTOP to SIGCONT; to now if never continued)."""
        return [
            (f.started_at, f.ended_at or utcnow()) for f in self.faults if f.fault.kind == "pause"
        ]

    def _gang_facts(self, g: PlannedGang, namespace: str, alive: set[str]) -> report.GangFacts:
        ranks = []
        for r in g.ranks:
            pod = f"{g.name}-{r.rank}"
            trainer = self.built.trainers.get(pod)
            saves = (
                {
                    nid: _save_facts(trainer, nid, s, self._pauses(), self._kills())
                    for nid, s in trainer.saves.items()
                }
                if trainer is not None
                else {}
            )
            ranks.append(
                report.RankFacts(
                    pod=pod,
                    rank=r.rank,
                    gpus=g.gpus_per_rank,
                    annotated_checkpoint=self.built.annotated[g.name],
                    started_at=self.built.started.get(pod),
                    stopped_at=self.built.stopped.get(pod),
                    opted_in=g.opt_in,
                    leader=r.rank == 0,
                    saves=saves,
                )
            )
        return report.GangFacts(
            name=g.name,
            namespace=namespace,
            scope=g.scope.value,
            ranks=tuple(ranks),
            pods_left=tuple(p for r in g.ranks if (p := f"{g.name}-{r.rank}") in alive),
        )

    async def _teardown(self, h: Harness) -> None:
        from . import faults, fleet

        for d in h.daemons:
            if d.paused:
                d.resume()
        if any(f.replica is None for f in self.scenario.faults):
            with contextlib.suppress(faults.FaultError):
                await faults.ensure_stack_up(self.stack)  # leave the shared stack healthy
        for task in self._stop_pods:
            task.cancel()
        for mock in self.built.imds.values():
            await mock.stop()
        for server in self.built.gce.values():
            await server.stop()
        if self._producer is not None:
            await self._producer.stop()
        if self._publisher is not None:
            await asyncio.to_thread(self._pubsub_cleanup)
            await self._slot_leases_cleanup(h)
        for proxy in self._proxies:
            await proxy.stop()
        if h.api is not None:
            with contextlib.suppress(Exception):
                await fleet.delete_namespace(h.api, h.namespace)


# --- helpers ---------------------------------------------------------------------------------


def _expected_notice(parser: str, payload: bytes, received: datetime, plan: Plan) -> Notice:
    """What reclaimd must make of the payload: the same parser, the same windows."""
    import handlers

    outcome = handlers.parse(parser, payload, received_at=received, windows=plan.windows)
    if not isinstance(outcome, tuple) or len(outcome) != 1:
        raise RuntimeError(f"the drill built a {parser} payload that is not one notice: {outcome}")
    return outcome[0]


def _some(value: str | None) -> str:
    assert value is not None, "the plan gives this source a target of this kind"
    return value


def _describe(n: PlannedNotice, instance_id: str) -> str:
    if n.gang is not None:
        return f"workload {n.gang}"
    return f"{n.node} {instance_id}" if n.source in (Source.EC2_SQS, Source.IMDS) else str(n.node)


def _claim_doc(raw: str | None) -> dict[str, Any]:
    if not raw:
        return {}
    try:
        doc = json.loads(raw)
    except ValueError:
        return {"phase": "unreadable"}
    return doc if isinstance(doc, dict) else {"phase": "unreadable"}


_EPOCH = datetime.fromisoformat("1970-01-01T00:00:00+00:00")


async def _retrying(call: Callable[[], Awaitable[T]], limit_s: float = SEND_RETRY_S) -> T:
    """``call()``, again every half second while it fails, for ``limit_s`` at most: a part of
    the stack a fault took down comes back within seconds."""
    loop = asyncio.get_running_loop()
    end = loop.time() + limit_s
    while True:
        try:
            return await call()
        except Exception:
            if loop.time() > end:
                raise
            await asyncio.sleep(0.5)


def _span_file(d: DaemonProcess) -> Path:
    """Where a drill daemon writes its spans (from its config file)."""
    import yaml

    doc = yaml.safe_load(d.config_path.read_text())
    tracing = doc.get("tracing") if isinstance(doc, dict) else None
    return Path(str((tracing or {}).get("span_file", "")))


def _kubeconfig_server(path: Path) -> str:
    """The server URL of a kubeconfig's first cluster."""
    import yaml

    doc = yaml.safe_load(path.read_text())
    return str(doc["clusters"][0]["cluster"]["server"])


def yaml_holder(d: DaemonProcess) -> str:
    """The holder name a drill daemon runs as (from its config file)."""
    import yaml

    doc = yaml.safe_load(d.config_path.read_text())
    return str(doc.get("holder", "")) if isinstance(doc, dict) else ""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _aemm_binary(stack: StackEnv) -> Path | None:
    """The mock stack.sh runs (same version), from the stack's cache."""
    version = stack.values.get("AEMM_VERSION", "")
    for base in (Path.home() / ".cache" / "reclaimd", stack.dir.parent / ".cache"):
        candidate = base / f"aemm-{version}" / "ec2-metadata-mock"
        if candidate.exists():
            return candidate
    return None


async def run_drill(
    scenario: Scenario,
    *,
    stack: StackEnv | None = None,
    progress: Progress | None = None,
    run_id: str = "",
    apiserver_proxy: bool | None = None,
) -> report.Verdict:
    """Run ``scenario`` on the local stack and return its verdict (the e2e tests' entry).
    ``apiserver_proxy``: each replica through a proxy of its own (None: when a fault needs it)."""
    from . import stack as stackenv

    env = stack or stackenv.load()
    drill = Drill(scenario, env, progress=progress, run_id=run_id, apiserver_proxy=apiserver_proxy)
    return await drill.run()


def slowest(verdict: report.Verdict) -> postmortem.Timeline | None:
    """The post-mortem of the notice that took longest to drain (``make demo``)."""
    if verdict.slowest is None:
        return None
    for path in verdict.span_files:
        try:
            return postmortem.load(Path(path), verdict.slowest.facts.notice_id)
        except postmortem.NotFound:
            continue
    return None


def slowest_timeline(verdict: report.Verdict) -> str | None:
    timeline = slowest(verdict)
    return postmortem.render_text(timeline) if timeline is not None else None


# --- command line ----------------------------------------------------------------------------


def add_parser(sub: Any) -> None:
    """``drill run`` and ``drill check`` under ``reclaimd``'s subcommands."""
    p = sub.add_parser("drill", help="chaos drills: rehearse interruptions on the local stack")
    drills = p.add_subparsers(dest="drill_command", metavar="ACTION")
    drills.required = True
    r = drills.add_parser("run", help="run a scenario against the local stack and judge it")
    r.add_argument("scenario", help="scenario YAML (see docs/drills.md)")
    r.add_argument("--json", metavar="REPORT", help="write the JSON report here")
    r.add_argument("--all-rows", action="store_true", help="print every notice and gang")
    r.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    r.add_argument(
        "--timeline", action="store_true", help="print the slowest notice's post-mortem timeline"
    )
    r.add_argument("--svg", metavar="FILE", help="write the slowest notice's post-mortem picture")
    r.add_argument(
        "--apiserver-proxy",
        choices=("auto", "on", "off"),
        default="auto",
        help="each replica reaches the apiserver through a proxy of its own: auto (only when"
        " a partition fault needs it), on, off (to measure what it costs)",
    )
    r.set_defaults(func=cmd_drill)
    c = drills.add_parser("check", help="validate a scenario and print its plan (no stack)")
    c.add_argument("scenario")
    c.set_defaults(func=cmd_drill)


def cmd_drill(args: argparse.Namespace) -> int:
    """0: every expectation met; 1: one is not; 2: bad scenario or no stack."""
    from . import stack as stackenv

    try:
        scenario = load_scenario(args.scenario)
        if args.drill_command == "check":
            print(describe_plan(plan_scenario(scenario, run_id="check")))
            return EXIT_OK
        proxy = {"auto": None, "on": True, "off": False}[getattr(args, "apiserver_proxy", "auto")]
        if proxy is False and any(f.kind is FaultKind.PARTITION for f in scenario.faults):
            raise ScenarioError("--apiserver-proxy off: a partition fault needs the proxy")
        verdict = asyncio.run(
            run_drill(
                scenario,
                progress=Progress(quiet=bool(getattr(args, "quiet", False))),
                apiserver_proxy=proxy,
            )
        )
    except (ScenarioError, stackenv.StackNotRunning) as e:
        print(f"reclaimd drill: {e}", file=sys.stderr)
        return EXIT_USAGE
    print(report.render(verdict, all_rows=bool(args.all_rows)))
    if args.timeline:
        timeline = slowest_timeline(verdict)
        print(f"\n== slowest notice\n{timeline or '(no trace found)'}")
    if args.svg:
        picture = slowest(verdict)
        if picture is not None:
            Path(args.svg).write_text(postmortem.render_svg(picture))
            print(f"post-mortem picture of the slowest notice: {args.svg}")
    if args.json:
        Path(args.json).write_text(json.dumps(report.to_json(verdict), indent=2) + "\n")
    return EXIT_OK if verdict.ok else EXIT_FAILED


def describe_plan(plan: Plan) -> str:
    s = plan.scenario
    per_source: dict[str, int] = {}
    for n in plan.notices:
        per_source[n.source.value] = per_source.get(n.source.value, 0) + 1
    affected = {g.name for n in plan.notices for g in plan.gangs_on(n.node or "")} | {
        n.gang for n in plan.notices if n.gang
    }
    lines = [
        f"{s.name}: {len(plan.nodes)} nodes in {len(s.cluster.pools)} pool(s),"
        f" {len(plan.gangs)} gangs ({sum(len(g.ranks) for g in plan.gangs)} ranks)",
        f"notices: {', '.join(f'{k} x{v}' for k, v in sorted(per_source.items()))};"
        f" {len(plan.garbage)} malformed; {len(affected)} gang(s) touched",
        f"reclaimd: {s.reclaimd.replicas} replica(s)"
        + (
            f", settings {json.dumps(s.reclaimd.as_settings())}" if s.reclaimd.as_settings() else ""
        ),
    ]
    return "\n".join(lines)


def _save_facts(
    trainer: ScriptedTrainer,
    notice_id: str,
    s: SaveRecord,
    pauses: Sequence[tuple[datetime, datetime]] = (),
    kills: Sequence[datetime] = (),
) -> report.Save:
    """One save as the judge sees it: answered when the trainer first answered it done, by
    the deadline of the latest request for it before that answer (a replica that took a
    notice over asks the rank again, with a deadline of its own). An answer given while a
    replica was paused, past a deadline that also fell in the pause, is one reclaimd cannot
    place before or after the deadline (the kernel took it; the process saw it on waking):
    too close to call (``unplaceable``). So is an answer to a request a replica sent just
    before it was SIGKILLed, between the request and just after the answer: killed first, it
    never got the answer; killed after, it may not have written it yet (each durable ack is
    written as it comes, but a write takes its time, ``report.RECORD_MARGIN_S``), and what the
    process had not written dies with it."""
    answered = trainer.server.answered.get(notice_id)
    before = [
        r
        for r in trainer.requests
        if r.notice_id == notice_id and (answered is None or r.received_at <= answered)
    ]
    asked = [r.deadline for r in before]
    asked_at = max((r.received_at for r in before), default=s.received_at)
    return report.Save(
        received_at=s.received_at,
        deadline=max([s.deadline, *asked]),
        finished_at=s.finished_at,
        saved=s.saved,
        durable=s.durable,
        checkpoint_time=s.checkpoint_time,
        answered_at=answered,
        answers_known=True,
        unplaceable=answered is not None
        and (
            any(a <= answered <= b and a <= s.deadline <= b for a, b in pauses)
            or any(
                asked_at <= k <= answered + timedelta(seconds=report.RECORD_MARGIN_S) for k in kills
            )
        ),
    )


def main(argv: list[str] | None = None) -> int:
    """``python -m chaos.drill run SCENARIO`` (what ``reclaimd drill`` calls)."""
    parser = argparse.ArgumentParser(prog="reclaimd")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
