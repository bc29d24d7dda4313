"""``reclaimd drill run SCENARIO --cluster``: a game day against the reclaimd already deployed.

The same drill as on the local stack (plan, build, inject, watch, judge), with three things
changed: the nodes are the cluster's own (only those carrying the drill label, at most
``--max-nodes``; ``chaos.gameday.target``), the notices go through the transports the release
consumes (its SQS queue), and nothing of reclaimd is started: the verdict comes from what
the release wrote (the nodes' claims, the probes' requests, its ledger topic from the drill's
start, read for the drill's namespace only; its spans when ``--spans`` names them). Then the
clean-up puts every drill node back as it was (cordon, taints, claim, labels), deletes the
probe namespace, and is checked: "cleaned up" is a row of the verdict.

``--dry-run`` finds the release, binds the plan to the nodes and prints it: nothing is sent,
created or changed.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import glob
import shutil
import tempfile
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from chaos import fleet
from chaos.drill import judge as drill_judge
from chaos.drill.injector import Injector
from chaos.drill.local import World
from chaos.drill.plan import Plan
from chaos.drill.plan import plan as plan_scenario
from chaos.drill.scenario import Integration, Scenario, Source
from chaos.drill.verdict.model import Check, Verdict
from chaos.drill.watch import Watcher
from chaos.drill.world import build_cluster
from chaos.gameday.cleanup import Probes, cleanup, label
from chaos.gameday.events import events_check
from chaos.gameday.read import FromOffsets, end_offsets, traces_of
from chaos.gameday.target import (
    GameDayError,
    NodeState,
    Release,
    bind,
    check_sources,
    discover,
)
from chaos.harness import Harness
from chaos.kube import rig_client
from chaos.stack import StackEnv
from reclaimd.handlers.kafka_notices import ENTRY as KAFKA_NOTICES
from reclaimd.handlers.pubsub import ENTRY as PUBSUB
from reclaimd.handlers.sqs import ENTRY as SQS
from reclaimd.kafkaconn import options
from reclaimd.model import utcnow

SPANS_WAIT_S = 15.0


@dataclasses.dataclass(frozen=True)
class Options:
    release: str
    release_namespace: str
    node_label: str  # KEY=VALUE
    max_nodes: int
    namespace: str = ""  # the probes' namespace; default gd-<run>
    kubeconfig: str | None = None
    spans: str = ""  # a file or glob of the release's span files (OTLP JSON lines)
    overrides: Mapping[str, str] = dataclasses.field(default_factory=dict)
    dry_run: bool = False


class ReleaseHarness(Harness):
    """A ``Harness`` whose queue and ledger topic are the release's: the local drill's parts
    (build, inject, watch, judge) run unchanged against it. It creates only the probe
    namespace, starts no reclaimd, and reads the ledger from where it stood at the start."""

    def __init__(
        self, release: Release, api: Any, *, namespace: str, run_id: str, own_namespace: bool
    ) -> None:
        s = release.settings
        values = {
            "KUBECONFIG": "",
            "KAFKA_BOOTSTRAP": s.ledger.bootstrap,
            "AWS_ENDPOINT_URL": SQS.section(s).endpoint_url or "",
            "AWS_DEFAULT_REGION": SQS.section(s).region,
        }
        # The run's scratch (the spans gathered for the judge), gone with the run.
        workdir = Path(tempfile.mkdtemp(prefix=f"reclaimd-gameday-{run_id}-"))
        super().__init__(StackEnv(workdir, values), name=run_id, workdir=workdir)
        import boto3

        sqs = SQS.section(s)
        self.sqs = boto3.client("sqs", endpoint_url=sqs.endpoint_url, region_name=sqs.region)
        self.queue_url = sqs.queue_url
        self.topic = s.ledger.topic
        self.kafka = s.kafka  # the release's own connection (TLS, SASL): the rig reads as it
        self.namespace = namespace
        self.own_namespace = own_namespace
        self.api = api
        self.start_offsets: dict[TopicPartition, int] = {}

    async def __aenter__(self) -> ReleaseHarness:
        assert self.api is not None
        if self.own_namespace:  # a given one is the chart's (its Role is there): not touched
            await fleet.ensure_namespace(self.api, self.namespace)
        self.start_offsets = await end_offsets(self.stack.kafka, self.topic, self.kafka)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.trainers.close()  # the nodes are the cluster's: never deleted
        shutil.rmtree(self.workdir, ignore_errors=True)

    def ledger_consumer(self) -> AIOKafkaConsumer:
        return FromOffsets(
            self.start_offsets,
            self.namespace,
            **options(self.kafka, self.stack.kafka),
            enable_auto_commit=False,
            group_id=None,
            isolation_level="read_committed",
        )


class GameDay:
    """One game day: ``run`` returns the verdict, the clean-up included."""

    def __init__(
        self, scenario: Scenario, options: Options, *, say: Callable[[str], None], run_id: str = ""
    ) -> None:
        self.scenario = scenario
        self.o = options
        self.say = say
        self.run_id = run_id or uuid.uuid4().hex[:8]
        self.states: list[NodeState] = []

    async def run(self) -> Verdict | str:
        """The verdict; with ``--dry-run``, the bound plan as text."""
        api = await rig_client(self.o.kubeconfig)
        try:
            release = await discover(
                api, self.o.release, self.o.release_namespace, self.o.overrides
            )
            plan = plan_scenario(self.scenario, run_id=self.run_id)
            check_sources(plan, release, self.o.namespace)
            plan = await self._bind(api, plan, release)
            described = describe(plan, release, self.states)
            if self.o.dry_run:
                return described
            self.say(described)
            return await self._drill(api, plan, release)
        finally:
            await api.close()

    async def _bind(self, api: Any, plan: Plan, release: Release) -> Plan:
        from kubernetes_asyncio import client as k8s

        core = k8s.CoreV1Api(api)
        key, _, value = self.o.node_label.partition("=")
        if not key or not value:
            raise GameDayError("--node-label must be KEY=VALUE")
        nodes = await core.list_node(label_selector=f"{key}={value}")
        raw = [api.sanitize_for_serialization(n) for n in nodes.items]
        if not raw:
            raise GameDayError(f"no node carries {key}={value}: nothing to drill on")
        pods_on: dict[str, list[str]] = {}
        for n in raw:
            name = n["metadata"]["name"]
            pods = await core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={name}")
            pods_on[name] = [
                f"{p.metadata.namespace}/{p.metadata.name}"
                for p in pods.items
                if not any(o.kind == "DaemonSet" for o in p.metadata.owner_references or [])
            ]
        bound, self.states = bind(
            plan, raw, pods_on, label=self.o.node_label, max_nodes=self.o.max_nodes,
            release=release,
        )  # fmt: skip
        return bound

    async def _drill(self, api: Any, plan: Plan, release: Release) -> Verdict:
        namespace = self.o.namespace or f"gd-{self.run_id}"
        guarded = [g.name for g in plan.gangs if g.pdb_max_unavailable is not None]
        pdbs = tuple(fleet.pdb_name(name) for name in guarded)
        kueue = tuple(g.name for g in plan.gangs if g.integration is Integration.KUEUE)
        probes = Probes(
            namespace, self.run_id, own=not self.o.namespace, pdbs=pdbs, workloads=kueue
        )
        h = ReleaseHarness(
            release, api, namespace=namespace, run_id=self.run_id, own_namespace=probes.own
        )
        world = World(plan, h.stack, proxied=False, say=self.say)
        if Source.GKE_PUBSUB in plan.sources():
            world.publisher, world.built.pubsub_topic = await _pubsub_topic(release)
        if Source.KAFKA in plan.sources():  # CloudEvents on the release's notices topic
            world.producer = await _producer(release)
            world.built.notices_topic = KAFKA_NOTICES.section(release.settings).topic
        injector = Injector(plan, world, say=self.say)
        watcher = Watcher(plan, sent=injector.sent, faults=[], say=self.say)
        cleaned: Check | None = None
        started = utcnow() - timedelta(seconds=1)  # the apiserver's clock, to the second
        async with h:
            try:
                await label(api, self.states, {fleet.DRILL_LABEL: self.run_id})
                await build_cluster(h, plan, world.built, self.say, make_nodes=False)
                reader = asyncio.create_task(watcher.read_ledger(h))
                poller = asyncio.create_task(watcher.poll_claims(h))
                try:
                    await injector.run(h, _no_faults)
                    await watcher.wait(h, reader)
                finally:
                    for task in (reader, poller):
                        task.cancel()
                        with contextlib.suppress(asyncio.CancelledError):
                            await task
                await self._gather_spans(h, injector)
                events = await events_check(api, injector.sent, namespace, started)
                claims = await watcher.claims(h)
                verdict = await drill_judge.judge(
                    h, plan, claims=claims, sent=injector.sent,
                    garbage_sent=injector.garbage_sent, events=watcher.events,
                    claim_history=watcher.claim_history, arrivals=watcher.arrivals,
                    gave_up=watcher.gave_up, faults=[],
                    gang_facts=lambda g, ns, alive: drill_judge.gang_facts(
                        g, ns, alive, world.built, []
                    ),
                )  # fmt: skip
            finally:
                for task in injector.stop_pods:
                    task.cancel()
                if world.producer is not None:
                    await world.producer.stop()
                # Pub/Sub: a copy may still be leased to a replica (or come back with a
                # slot's seek): watch the put-back nodes a lease extension more.
                pubsub = PUBSUB.section(release.settings).lease_extension_s + 2.0
                settle = pubsub if Source.GKE_PUBSUB in plan.sources() else 2.0
                cleaned = await cleanup(api, self.states, probes, settle_s=settle, say=self.say)
        checks = (*verdict.checks, events, cleaned)
        return dataclasses.replace(verdict, checks=checks, daemons=(), span_files=())

    async def _gather_spans(self, h: Harness, injector: Injector) -> None:
        """The release's spans of this drill's notices (their whole traces), into the run's
        directory where the judge reads spans. The release keeps running, so its spans are
        read until they stop coming (a notice's root span ends after its ledger event)."""
        ids = [n.notice_id for n in injector.sent]
        if not self.o.spans:
            return
        lines: list[str] = []
        for _ in range(int(SPANS_WAIT_S / 0.5)):
            again = traces_of(ids, sorted(glob.glob(self.o.spans)))
            if len(again) == len(lines) and again:
                break
            lines = again
            await asyncio.sleep(0.5)
        (h.workdir / "spans-release.jsonl").write_text("".join(lines))


def describe(plan: Plan, release: Release, states: Sequence[NodeState]) -> str:
    lines = [
        f"game day {plan.scenario.name} run {plan.run_id} against release {release.name}"
        f" ({release.namespace}: {len(release.pods)} pod(s)"
        + (", reclaimd's own dry run" if release.dry_run else "")
        + ")",
        f"  nodes: {', '.join(s.name for s in states)}",
        f"  gangs: {len(plan.gangs)} ({sum(len(g.ranks) for g in plan.gangs)} ranks)",
        f"  notices: {len(plan.notices)} through "
        + ", ".join(sorted(str(s) for s in plan.sources())),
        f"  windows: ec2 {plan.windows.ec2_spot_s:g} s, gce {plan.windows.gce_preemption_s:g} s",
    ]
    return "\n".join(lines)


# --- helpers ---------------------------------------------------------------------------------


async def _pubsub_topic(release: Release) -> tuple[Any, str]:
    """A publisher, and the topic of the release's subscription (slot 0's, with slots): the
    Logging sink's topic, where a preemption's LogEntry arrives."""
    from google.cloud import pubsub_v1

    p = PUBSUB.section(release.settings)
    sub_id = p.subscription if p.slots == 1 else f"{p.subscription}-0"
    subscriber = pubsub_v1.SubscriberClient()
    try:
        path = subscriber.subscription_path(p.project, sub_id)
        sub = await asyncio.to_thread(subscriber.get_subscription, subscription=path)
    except Exception as e:
        raise GameDayError(f"the release's subscription {sub_id}: {type(e).__name__}") from None
    finally:
        subscriber.close()
    return pubsub_v1.PublisherClient(), str(sub.topic)


async def _producer(release: Release) -> Any:
    from aiokafka import AIOKafkaProducer

    s = release.settings
    producer = AIOKafkaProducer(**options(s.kafka, KAFKA_NOTICES.section(s).bootstrap), acks="all")
    await producer.start()
    return producer


async def _no_faults(_: Any) -> None:  # refused before the drill starts (check_sources)
    return None
