"""A drill's world on the local machine (``chaos.drill.run``, step 3, and what steps 4 to 6 act
on): ``World``, which has the cluster built (``chaos.drill.world``), sets up the per-run pieces
of each transport (SQS queue, Pub/Sub topic and slot subscriptions, Kafka notices topic,
metadata mocks), runs the apiserver proxies, and starts, replaces and stops the reclaimd
processes themselves."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from chaos.drill.plan import Plan
from chaos.drill.scenario import Scenario, ScenarioError, Source
from chaos.drill.world import Built, build_cluster
from chaos.ports import free_port

if TYPE_CHECKING:
    from chaos.harness import Harness
    from chaos.process import DaemonProcess
    from chaos.stack import StackEnv

SPAWN_LIMIT = 2  # reclaimd processes started at once: each import costs a core-second


class World:
    """The cluster, the transports and the reclaimd processes of one run: what the injector
    sends through, the faults strike, and the teardown takes down."""

    def __init__(
        self, plan: Plan, stack: StackEnv, *, proxied: bool, say: Callable[[str], None]
    ) -> None:
        self.plan = plan
        self.stack = stack
        self.say = say
        # Each central replica reaches the apiserver through a proxy of its own (``proxied``).
        self.proxied = proxied
        self.built = Built()
        self.publisher: Any = None  # the run's Pub/Sub publisher, once set up
        self.producer: Any = None  # the run's Kafka notices producer, once set up
        self.proxies: list[Any] = []  # netproxy.ProxyProcess by central replica slot
        self.replicas: list[DaemonProcess] = []  # central reclaimd i, its current process
        self.ports: dict[str, int] = {}  # central replica name -> its /readyz port
        self._replaced: dict[int, int] = {}  # central replica slot -> replacements started
        # Set (and replaced) each time the Pub/Sub topic is put back after a restart.
        self.topic_back = asyncio.Event()

    @property
    def scenario(self) -> Scenario:
        return self.plan.scenario

    @property
    def sources(self) -> frozenset[Source]:
        return self.plan.sources()

    # --- the cluster ------------------------------------------------------------------------

    async def build(self, h: Harness) -> None:
        """The cluster the scenario plans (``build_cluster``), recorded in ``built``."""
        await build_cluster(h, self.plan, self.built, self.say)

    # --- transports -------------------------------------------------------------------------

    async def transports(self, h: Harness) -> None:
        """The per-run pieces of each transport the scenario uses."""
        from chaos.inject import ImdsMock
        from chaos.standins.azure import AzureMetadataServer, compute_of
        from chaos.standins.gce import GceMetadataServer

        p = self.plan
        await self._kafka_topics(h)
        if Source.GKE_PUBSUB in self.sources:
            await self._pubsub_setup()
        if Source.KAFKA in self.sources:
            await self._kafka_setup()
        aemm = aemm_binary(self.stack)
        for n in p.notices:
            if n.node is None:
                continue
            node = p.node(n.node)
            if n.source is Source.IMDS and n.node not in self.built.imds:
                if aemm is None:
                    raise ScenarioError("imds: amazon-ec2-metadata-mock not found in the stack")
                self.built.imds[n.node] = ImdsMock(aemm, h.workdir / "imds", free_port())
            if n.source is Source.GCE_METADATA and n.node not in self.built.gce:
                server = GceMetadataServer(project=node.project, zone=node.zone, instance=node.name)
                await server.start()
                self.built.gce[n.node] = server
            if n.source is Source.AZURE_SCHEDULED and n.node not in self.built.azure:
                azure = AzureMetadataServer(compute_of(node))
                await azure.start()
                self.built.azure[n.node] = azure

    @property
    def pubsub_slots(self) -> int:
        """Central replicas on Pub/Sub each consume a subscription of their own (a slot), so
        that no LogEntry depends on one replica; one replica keeps the plain subscription."""
        replicas = self.scenario.reclaimd.replicas
        return replicas if replicas > 1 else 1

    def pubsub_subscriptions(self) -> list[str]:
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
        for sub_id in self.pubsub_subscriptions():
            # As deploy/gcp/main.tf makes them: every slot's subscription on the one topic.
            await asyncio.to_thread(
                subscriber.create_subscription,
                name=subscriber.subscription_path(project, sub_id),
                topic=topic,
                ack_deadline_seconds=10,
            )
        await asyncio.to_thread(subscriber.close)
        self.publisher = publisher
        if self.pubsub_slots > 1:
            self.say(
                f"pubsub: {self.pubsub_slots} slots, one subscription each on the topic"
                f" ({', '.join(self.pubsub_subscriptions())})"
            )

    async def _kafka_topics(self, h: Harness) -> None:
        """The run's notices topic when the scenario sends CloudEvents (the harness made the
        ledger topic)."""
        if Source.KAFKA in self.sources:
            self.built.notices_topic = f"reclaimd.notices.{self.plan.run_id}"
            await h.create_topics({self.built.notices_topic: 3})

    async def _kafka_setup(self) -> None:
        from aiokafka import AIOKafkaProducer

        self.producer = AIOKafkaProducer(bootstrap_servers=self.stack.kafka, acks="all")
        await self.producer.start()

    # --- reclaimd ---------------------------------------------------------------------------

    def _central_overrides(self, h: Harness, name: str, slot: int) -> dict[str, Any]:
        s = self.sources
        o: dict[str, Any] = dict(self.scenario.reclaimd.as_settings())
        o["tracing"] = {"span_file": str(h.workdir / f"spans-{name}.jsonl")}
        if self.proxies:
            # the replica's apiserver is its proxy (a fresh disk or a successor: the same one)
            o["kube"] = {"kubeconfig": str(self._proxy_kubeconfig(h, slot))}
        if any(f.replica is None for f in self.scenario.faults):
            # /readyz on a port of its own: the drill samples it during a stack fault
            o["metrics_port"] = self.ports.setdefault(name, free_port())
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
                "bootstrap": h.replica_kafka.bootstrap,
                "topic": self.built.notices_topic,
                "group_id": f"reclaimd-{self.plan.run_id}",
            }
        if Source.KUEUE in s:
            o["kueue"] = {"enabled": True, "namespaces": [h.namespace]}
        return o

    async def _start_proxies(self) -> None:
        """One apiserver proxy per central replica (``chaos.netproxy``), each its own process."""
        from urllib.parse import urlsplit

        from chaos.netproxy import ProxyProcess

        server = urlsplit(kubeconfig_server(Path(self.stack.reclaimd_kubeconfig)))
        upstream = (server.hostname or "127.0.0.1", server.port or 443)
        for _ in range(self.scenario.reclaimd.replicas):
            proxy = ProxyProcess(upstream)
            self.proxies.append(proxy)  # stopped by the teardown, started or not
            await proxy.start()
        ports = ", ".join(str(p.port) for p in self.proxies)
        self.say(f"apiserver proxies: one per replica on 127.0.0.1 ({ports})")

    def _proxy_kubeconfig(self, h: Harness, slot: int) -> Path:
        """reclaimd's kubeconfig with the server replaced by replica ``slot``'s proxy (the
        apiserver's certificate names 127.0.0.1: any port on it verifies)."""
        import yaml

        path = h.workdir / f"reclaimd-{slot}.kubeconfig"
        if not path.exists():
            doc = yaml.safe_load(Path(self.stack.reclaimd_kubeconfig).read_text())
            for cluster in doc.get("clusters") or []:
                cluster["cluster"]["server"] = f"https://{self.proxies[slot].address}"
            path.write_text(yaml.safe_dump(doc))
            path.chmod(0o600)
        return path

    async def partition(self, slot: int, cut: bool) -> int:
        proxy = self.proxies[slot]
        if cut:
            return int(await proxy.cut())
        await proxy.heal()
        return 0

    async def start_reclaimd(self, h: Harness) -> None:
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
        for key, azure in self.built.azure.items():
            events = {
                "enabled": True,
                "url": azure.url,
                "node_name": self.built.nodes[key].name,
                "poll_interval_s": 0.5,
            }
            starts.append(per_node(f"azure-{key}", {"azure_scheduled": events}))

        async def one(name: str, overrides: dict[str, Any]) -> DaemonProcess:
            async with gate:
                return await h.start_daemon(name, **overrides)

        started = await asyncio.gather(*(one(n, o) for n, o in starts))
        self.replicas = list(started[: self.scenario.reclaimd.replicas])
        self.say(f"reclaimd: {len(starts)} process(es) running ({', '.join(n for n, _ in starts)})")
        kafka = h.replica_kafka
        self.say(
            f"kafka: replicas write the ledger over {kafka.name.upper()} ({kafka.bootstrap}) as"
            " User:reclaimd, with its ACLs only"
            if kafka.settings
            else f"kafka: replicas write the ledger over PLAINTEXT ({kafka.bootstrap})"
        )

    async def replace_replica(self, h: Harness, i: int) -> DaemonProcess:
        """Central replica ``i`` started again as a new pod on a new node: its own holder name,
        no outbox, a new span file (a fresh-disk fault)."""
        self._replaced[i] = self._replaced.get(i, 0) + 1
        name = f"reclaimd-{i}-fresh{self._replaced[i]}"
        d = await h.start_daemon(name, **self._central_overrides(h, name, i))
        self.replicas[i] = d
        return d

    async def stop_reclaimd(self, h: Harness) -> None:
        """SIGTERM every reclaimd at once (the tracer flushes its spans, the outbox its events)."""
        await asyncio.gather(*(d.stop() for d in h.daemons))

    async def pubsub_recreate(self) -> None:
        """Put back the run's topic and subscriptions a restarted emulator lost, then wake the
        publishes that found the topic gone (``topic_back``)."""
        from google.api_core import exceptions
        from google.cloud import pubsub_v1

        subscriber = pubsub_v1.SubscriberClient()
        project = self.stack["PUBSUB_PROJECT_ID"]
        try:
            with contextlib.suppress(exceptions.AlreadyExists):
                await asyncio.to_thread(self.publisher.create_topic, name=self.built.pubsub_topic)
            for sub_id in self.pubsub_subscriptions():
                with contextlib.suppress(exceptions.AlreadyExists):
                    await asyncio.to_thread(
                        subscriber.create_subscription,
                        name=subscriber.subscription_path(project, sub_id),
                        topic=self.built.pubsub_topic,
                        ack_deadline_seconds=10,
                    )
            self.topic_back.set()
            self.topic_back = asyncio.Event()
        finally:
            await asyncio.to_thread(subscriber.close)


# --- helpers ---------------------------------------------------------------------------------


def aemm_binary(stack: StackEnv) -> Path | None:
    """The mock stack.sh runs (same version), from the stack's cache."""
    version = stack.values.get("AEMM_VERSION", "")
    for base in (Path.home() / ".cache" / "reclaimd", stack.dir.parent / ".cache"):
        candidate = base / f"aemm-{version}" / "ec2-metadata-mock"
        if candidate.exists():
            return candidate
    return None



def kubeconfig_server(path: Path) -> str:
    """The server URL of a kubeconfig's first cluster."""
    import yaml

    doc = yaml.safe_load(path.read_text())
    return str(doc["clusters"][0]["cluster"]["server"])
