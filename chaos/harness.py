"""One reclaimd against the local stack, with a kwok fleet, fake trainers, an SQS queue and a
ledger topic of its own: what ``make demo``, the e2e tests, the bench and the drills share.

Every run gets unique names (namespace, queue, topic, holder), so runs never see each other's
objects and a warm stack can be reused.
"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import aiohttp
import boto3
import yaml
from aiokafka import AIOKafkaConsumer
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio.client.rest import ApiException
from prometheus_client.parser import text_string_to_metric_families

import handlers
from reclaimd.ledger.event import SCHEMA as LEDGER_SCHEMA
from reclaimd.model import Notice, utcnow

from . import fleet, inject, kube
from .process import DaemonProcess
from .stack import StackEnv
from .trainers import Behaviour, TrainerFleet

REPO = Path(__file__).resolve().parents[1]
RBAC = REPO / "deploy" / "kubernetes" / "rbac.yaml"
CLAIM = "reclaimd.io/claim"


async def scrape(port: int) -> list[Any]:
    """Every sample of the ``/metrics`` a daemon serves on ``port`` (prometheus_client's
    ``Sample``: name, labels, value)."""
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{port}/metrics") as r,
    ):
        r.raise_for_status()
        text = await r.text()
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


class Harness:
    def __init__(self, stack: StackEnv, *, name: str = "", workdir: Path | None = None) -> None:
        self.stack = stack
        self.run_id = name or uuid.uuid4().hex[:8]
        self.namespace = f"rc-{self.run_id}"
        self.topic = f"reclaimd.restart-waste.{self.run_id}"
        self.replica_kafka = stack.kafka_as_reclaimd()
        self.workdir = workdir or stack.dir / "runs" / self.run_id
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.trainers = TrainerFleet(seed=7)
        self.nodes: list[fleet.NodeSpec] = []
        self.daemons: list[DaemonProcess] = []
        stack.export()
        region = stack.values.get("AWS_DEFAULT_REGION", "us-east-1")
        self.sqs = boto3.client("sqs", endpoint_url=stack.aws_endpoint, region_name=region)
        self.queue_url = ""
        self.api: k8s.ApiClient | None = None

    async def __aenter__(self) -> Harness:
        self.api = await kube.rig_client(self.stack.kubeconfig)
        await kube.apply_file(self.api, RBAC)
        await fleet.ensure_namespace(self.api, self.namespace)
        self.create_queue()
        # Created up front: a reader that subscribes before the first event finds it. The
        # broker stamps each record as it appends it: how late an event reached Kafka.
        await self.create_topics({self.topic: 1}, {"message.timestamp.type": "LogAppendTime"})
        return self

    async def create_topics(
        self, topics: dict[str, int], configs: Mapping[str, str] | None = None
    ) -> None:
        """Create topics (name -> partitions) explicitly: no reliance on auto-create."""
        from aiokafka.admin import AIOKafkaAdminClient, NewTopic

        admin = AIOKafkaAdminClient(bootstrap_servers=self.stack.kafka)
        await admin.start()
        try:
            await admin.create_topics(
                [
                    NewTopic(
                        t, num_partitions=n, replication_factor=1, topic_configs=dict(configs or {})
                    )
                    for t, n in topics.items()
                ]
            )
        finally:
            await admin.close()

    async def __aexit__(self, *exc: object) -> None:
        for d in self.daemons:
            await d.stop()
        await self.trainers.close()
        if self.api is not None:
            await fleet.delete_nodes(self.api, [n.name for n in self.nodes])
            await self.api.close()

    @property
    def core(self) -> k8s.CoreV1Api:
        assert self.api is not None
        return k8s.CoreV1Api(self.api)

    # --- the fleet ------------------------------------------------------------------------

    async def add_nodes(self, specs: Sequence[fleet.NodeSpec]) -> None:
        assert self.api is not None
        await fleet.create_nodes(self.api, specs)
        self.nodes.extend(specs)
        await fleet.wait_nodes_ready(self.api, [s.name for s in specs])

    def node_spec(self, i: int, **kw: Any) -> fleet.NodeSpec:
        return fleet.NodeSpec(
            name=f"gpu-{self.run_id}-{i}", instance_id=f"i-{self.run_id}{i:09x}", **kw
        )

    async def add_gang(
        self,
        name: str,
        nodes: Sequence[str],
        *,
        gpus_per_rank: int = 8,
        opt_in: bool = True,
        behaviour: Behaviour | None = None,
        last_checkpoint_age_s: float = 600.0,
        **kw: Any,
    ) -> fleet.GangSpec:
        assert self.api is not None
        ranks = []
        for rank, node in enumerate(nodes):
            url = ""
            if opt_in:
                url = await self.trainers.add(f"{self.namespace}/{name}-{rank}", behaviour)
            ranks.append(
                fleet.RankSpec(node, url, last_checkpoint=fleet.ago(last_checkpoint_age_s))
            )
        gang = fleet.GangSpec(name=name, ranks=ranks, gpus_per_rank=gpus_per_rank, **kw)
        names = await fleet.create_gang(self.api, gang, self.namespace)
        await fleet.wait_running(self.api, self.namespace, names)
        return gang

    # --- reclaimd -------------------------------------------------------------------------

    def daemon_config(self, holder: str = "", **overrides: Any) -> dict[str, Any]:
        config: dict[str, Any] = {
            "cluster_name": "local",
            "holder": holder or f"reclaimd-{self.run_id}",
            # Claims of this run only: a daemon of another test must never take them over.
            "peer_group": f"run-{self.run_id}",
            # The drill's trainers answer on loopback; kwok pods have made-up IPs.
            "checkpoint": {"allowed_hosts": ["127.0.0.1"]},
            "kube": {"kubeconfig": self.stack.reclaimd_kubeconfig},
            "sqs": {
                "enabled": True,
                "queue_url": self.queue_url,
                "endpoint_url": self.stack.aws_endpoint,
                "region": self.stack.values.get("AWS_DEFAULT_REGION", "us-east-1"),
                "wait_time_s": 1,
                "visibility_timeout_s": 10,
            },
            # As production: over TLS and SASL, with reclaimd's ACLs (chaos.stack).
            "kafka": self.replica_kafka.settings,
            "ledger": {
                "bootstrap": self.replica_kafka.bootstrap,
                "topic": self.topic,
                "outbox_path": str(self.workdir / f"{holder or 'reclaimd'}-outbox.sqlite"),
            },
            "tracing": {"span_file": str(self.span_file)},
            "metrics_port": 0,
        }
        for key, value in overrides.items():
            if isinstance(value, dict) and isinstance(config.get(key), dict):
                config[key] = {**config[key], **value}
            else:
                config[key] = value
        return config

    @property
    def span_file(self) -> Path:
        return self.workdir / "spans.jsonl"

    def holder(self, name: str = "reclaimd") -> str:
        """Holder names carry the run id: a daemon must never resume another run's claims."""
        return f"{name}-{self.run_id}"

    async def start_daemon(
        self, name: str = "reclaimd", *, env: Mapping[str, str] | None = None, **overrides: Any
    ) -> DaemonProcess:
        """``reclaimd run`` with the run's config plus ``overrides``; ``env`` adds variables to
        its environment (OTEL_* for one daemon, ...)."""
        config = self.daemon_config(holder=self.holder(name), **overrides)
        d = DaemonProcess(config, self.workdir, name, env=env)
        await d.start()
        self.daemons.append(d)
        return d

    async def readonly_kubeconfig(self) -> Path:
        """A kubeconfig for a service account that may read but not write: a reclaimd that
        cannot claim. Uses a TokenRequest, as a pod's projected token would."""
        assert self.api is not None
        sa = "reclaimd-readonly"
        read = ["get", "list", "watch"]
        await kube.apply_documents(
            self.api,
            [
                {
                    "apiVersion": "v1",
                    "kind": "ServiceAccount",
                    "metadata": {"name": sa, "namespace": self.namespace},
                },
                {
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": "ClusterRole",
                    "metadata": {"name": sa},
                    "rules": [
                        {"apiGroups": [""], "resources": ["nodes", "pods"], "verbs": read},
                        {
                            "apiGroups": ["policy"],
                            "resources": ["poddisruptionbudgets"],
                            "verbs": read,
                        },
                        {
                            "apiGroups": ["kueue.x-k8s.io"],
                            "resources": ["workloads"],
                            "verbs": read,
                        },
                    ],
                },
                {
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": "ClusterRoleBinding",
                    "metadata": {"name": f"{sa}-{self.run_id}"},
                    "roleRef": {
                        "apiGroup": "rbac.authorization.k8s.io",
                        "kind": "ClusterRole",
                        "name": sa,
                    },
                    "subjects": [
                        {"kind": "ServiceAccount", "name": sa, "namespace": self.namespace}
                    ],
                },
            ],
        )
        path = await self.token_kubeconfig(sa)
        await self._until_it_can_read(path)
        return path

    async def token_kubeconfig(self, sa: str) -> Path:
        """A kubeconfig that is service account ``sa`` of the run's namespace: a TokenRequest
        token, as a pod's projected one, on the stack's API server."""
        token = await self.core.create_namespaced_service_account_token(
            sa, self.namespace, cast(Any, {"spec": {"expirationSeconds": 3600}})
        )
        admin = yaml.safe_load(await asyncio.to_thread(Path(self.stack.kubeconfig).read_text))
        cluster = admin["clusters"][0]
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [cluster],
            "users": [{"name": sa, "user": {"token": token.status.token}}],
            "contexts": [{"name": sa, "context": {"cluster": cluster["name"], "user": sa}}],
            "current-context": sa,
        }
        path = self.workdir / f"{sa}.kubeconfig"
        path.write_text(yaml.safe_dump(config))
        path.chmod(0o600)
        return path

    @staticmethod
    async def _until_it_can_read(kubeconfig: Path, timeout_s: float = 20) -> None:
        """A new binding takes a moment to reach the authorizer's cache."""
        api = await kube.rig_client(str(kubeconfig))
        try:
            end = asyncio.get_running_loop().time() + timeout_s
            while True:
                try:
                    await k8s.CoreV1Api(api).list_node(limit=1)
                    return
                except ApiException:
                    if asyncio.get_running_loop().time() > end:
                        raise
                    await asyncio.sleep(0.2)
        finally:
            await api.close()

    # --- notices --------------------------------------------------------------------------

    def send_spot(self, node: fleet.NodeSpec, *, event_id: str | None = None) -> Notice:
        """Send a Spot Interruption Warning for ``node``; returns the notice it must become."""
        event = inject.spot_itn_event(node.instance_id, zone=node.zone, event_id=event_id)
        inject.send_sqs(self.sqs, self.queue_url, event)
        outcome = handlers.parse("ec2", json.dumps(event).encode(), received_at=utcnow())
        assert isinstance(outcome, tuple) and len(outcome) == 1
        return outcome[0]

    def create_queue(self) -> str:
        """The run's queue (again, after moto lost it: the same name is the same URL)."""
        self.queue_url = self.sqs.create_queue(QueueName=f"reclaimd-{self.run_id}")["QueueUrl"]
        return self.queue_url

    def queue_depth(self) -> int:
        attrs = self.sqs.get_queue_attributes(
            QueueUrl=self.queue_url,
            AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
        )["Attributes"]
        return int(attrs["ApproximateNumberOfMessages"]) + int(
            attrs["ApproximateNumberOfMessagesNotVisible"]
        )

    # --- what happened --------------------------------------------------------------------

    def ledger_consumer(self) -> AIOKafkaConsumer:
        """A consumer of the run's ledger topic from its first record, in no group. It reads
        committed records only, as a ledger consumer must (docs/ledger.md): a transaction the
        writer aborted (fenced, or retried after a crash) is not an event."""
        return AIOKafkaConsumer(
            self.topic,
            bootstrap_servers=self.stack.kafka,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            group_id=None,
            isolation_level="read_committed",
        )

    async def ledger_events(
        self,
        *,
        count: int,
        timeout_s: float = 60,
        settle_s: float = 0.0,
        schema: str = LEDGER_SCHEMA,
    ) -> list[dict[str, Any]]:
        """Read the run's ledger topic from the start until ``count`` events of ``schema``
        (then ``settle_s`` more, to catch duplicates that should not be there). The topic
        also carries restart overhead (``restarts.SCHEMA``): asked for by its schema."""
        consumer = self.ledger_consumer()
        await consumer.start()
        events: list[dict[str, Any]] = []
        try:
            loop = asyncio.get_running_loop()
            end = loop.time() + timeout_s
            settle_end: float | None = None
            while True:
                now = loop.time()
                if settle_end is None and len(events) >= count:
                    settle_end = now + settle_s
                if (settle_end is not None and now >= settle_end) or now >= end:
                    break
                batch = await consumer.getmany(timeout_ms=200)
                for records in batch.values():
                    for r in records:
                        event = json.loads(r.value)
                        if event.get("schema") != schema:
                            continue
                        event["_headers"] = {k: v.decode() for k, v in r.headers}
                        event["_key"] = r.key.decode() if r.key else ""
                        events.append(event)
        finally:
            await consumer.stop()
        return events

    async def claim_of(self, node: str) -> dict[str, Any] | None:
        n = await self.core.read_node(node)
        raw = (n.metadata.annotations or {}).get(CLAIM)
        return json.loads(raw) if raw else None

    async def wait_phase(self, node: str, phase: str, timeout_s: float = 60) -> dict[str, Any]:
        end = asyncio.get_running_loop().time() + timeout_s
        while True:
            claim = await self.claim_of(node)
            if claim and claim.get("phase") == phase:
                return claim
            if asyncio.get_running_loop().time() > end:
                raise TimeoutError(f"{node}: claim phase {claim and claim.get('phase')}")
            await asyncio.sleep(0.1)

    async def pods_left(self, names: Sequence[str]) -> list[str]:
        left = []
        for name in names:
            try:
                await self.core.read_namespaced_pod(name, self.namespace)
                left.append(name)
            except ApiException as e:
                if e.status != 404:
                    raise
        return left

    async def metric(self, port: int, name: str, **labels: str) -> float:
        """One sample of the ``/metrics`` a daemon serves on ``port`` (its ``metrics_port``);
        0 when absent, as a counter never incremented."""
        for sample in await scrape(port):
            if sample.name == name and sample.labels == labels:
                return float(sample.value)
        return 0.0

    async def until_metric(
        self, port: int, name: str, at_least: float, *, timeout_s: float = 30, **labels: str
    ) -> float:
        """Poll ``metric`` until it reaches ``at_least`` (a counter's next steps, waited for
        rather than slept for); its value then."""
        end = asyncio.get_running_loop().time() + timeout_s
        while (got := await self.metric(port, name, **labels)) < at_least:
            if asyncio.get_running_loop().time() > end:
                raise TimeoutError(f"{name} is {got}, not {at_least}, after {timeout_s}s")
            await asyncio.sleep(0.1)
        return got

    # --- GCE / GKE and the Kafka notices topic ----------------------------------------------

    def gce_node_spec(self, i: int, *, zone: str = "us-central1-a", **kw: Any) -> fleet.NodeSpec:
        """A GKE-style node: named like its VM, providerID ``gce://project/zone/name``."""
        project = self.stack.values.get("PUBSUB_PROJECT_ID", "reclaimd-local")
        return self.node_spec(i, cloud="gce", zone=zone, project=project, **kw)

    def pubsub_channel(self, name: str = "") -> inject.PubSubChannel:
        """A topic + subscription of this run on the Pub/Sub emulator; the caller deletes it."""
        project = self.stack.values["PUBSUB_PROJECT_ID"]
        return inject.PubSubChannel(project, name or f"reclaimd-{self.run_id}").create()

    async def send_gce_preemption(
        self,
        channel: inject.PubSubChannel,
        node: fleet.NodeSpec,
        *,
        operation_id: str | None = None,
    ) -> Notice:
        """Publish a ``compute.instances.preempted`` LogEntry for ``node``; the notice it must
        become. The same ``operation_id`` is the same notice (a redelivery or replay)."""
        entry = inject.gce_log_entry(
            project=node.project, zone=node.zone, instance=node.name, operation_id=operation_id
        )
        # as a Logging sink publishes it: the entry's time as an attribute too
        stamp = {"logging.googleapis.com/timestamp": str(entry["timestamp"])}
        await asyncio.to_thread(channel.publish, entry, **stamp)
        outcome = handlers.parse("gke", json.dumps(entry).encode(), received_at=utcnow())
        assert isinstance(outcome, tuple) and len(outcome) == 1
        return outcome[0]

    async def notices_topic(self, partitions: int = 1) -> str:
        """A notices topic of this run."""
        topic = f"reclaimd.notices.{self.run_id}"
        await self.create_topics({topic: partitions})
        return topic

    async def send_kafka_notice(self, topic: str, event: dict[str, Any]) -> Notice:
        """Produce a CloudEvent to the notices topic; the notice it must become."""
        await inject.produce_kafka(self.stack.kafka, topic, event)
        outcome = handlers.parse("kafka", json.dumps(event).encode(), received_at=utcnow())
        assert isinstance(outcome, tuple) and len(outcome) == 1
        return outcome[0]

    async def committed_offset(self, topic: str, group_id: str, partition: int = 0) -> int | None:
        """The consumer group's committed offset for one partition (None: never committed)."""
        from aiokafka import TopicPartition

        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.stack.kafka, group_id=group_id, enable_auto_commit=False
        )
        await consumer.start()
        try:
            committed = await consumer.committed(TopicPartition(topic, partition))
        finally:
            await consumer.stop()
        return None if committed is None else int(committed)

    async def timeline(self, notice_id: str, timeout_s: float = 20) -> Any:
        """The notice's ``postmortem.Timeline``, once the daemon's batch exporter wrote it."""
        from reclaimd import postmortem

        for _ in range(int(timeout_s / 0.25)):
            try:
                return postmortem.load(self.span_file, notice_id)
            except (FileNotFoundError, postmortem.NotFound):
                await asyncio.sleep(0.25)
        return postmortem.load(self.span_file, notice_id)

    async def timings(self, notice: Notice) -> dict[str, float]:
        """Seconds from the notice (its ``issued_at``) and from its receipt to the last rank
        asked to checkpoint and to the last pod evicted, from the run's span file."""
        t = await self.timeline(notice.id)
        asked = [r.end_s for r in t.rows if r.step == "checkpoint.rank"]
        asked_start = [r.start_s for r in t.rows if r.step == "checkpoint.rank"]
        evicted = [r.end_s for r in t.rows if r.step == "evict"]
        # The timeline counts from receipt; the notice's own time is window_s earlier than
        # the deadline, so the receipt lag is (deadline - issued) - window_s.
        lag = 0.0
        if notice.deadline is not None and t.window_s is not None:
            lag = (notice.deadline - notice.issued_at).total_seconds() - t.window_s
        out = {"receipt_lag_s": lag}
        if asked_start:
            out["all_ranks_signaled_s"] = max(asked_start)
            out["all_ranks_answered_s"] = max(asked)
        if evicted:
            out["drained_s"] = max(evicted)
        for key in ("all_ranks_signaled_s", "all_ranks_answered_s", "drained_s"):
            if key in out:
                out[key.removesuffix("_s") + "_from_notice_s"] = out[key] + lag
        return out


def readyz(port: int) -> tuple[int, str]:
    """A replica's ``/readyz`` on ``port``: (status, body); (0, "") when nothing answers."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:
            return r.status, r.read().decode().strip()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode().strip()
    except OSError:
        return 0, ""
