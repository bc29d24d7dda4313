"""``make bench-fuzz``: hostile input on every transport of one real ``reclaimd run``.

One daemon runs every source at once against the local stack: SQS (moto), Pub/Sub (the
emulator), the Kafka notices topic, Kueue Workloads on the apiserver, and EC2 IMDS, the GCE
metadata server and Azure Scheduled Events, all three served by a small aiohttp server this
bench starts (the daemon's ``imds.url``, ``gce_metadata.url`` and ``azure_scheduled.url`` point
at it). Per transport the bench sends ``--per-transport`` hostile messages from
``chaos.hostile`` (seeded: truncated JSON, huge bodies, deep nesting, wrong types, control and
bidi characters, grammar-breaking identifiers, path traversal, SSRF-looking URLs, duplicate
keys, ...), with a few real notices mixed in, each aimed at a kwok node of its own
(``--nodes``, created for the run, deleted after).

Reported per transport: messages sent, what the daemon counted (received, notices, ignored,
parse errors, acked), what is left on the transport (SQS messages, Pub/Sub messages, Kafka
records not committed by the daemon's group), and whether every real notice was claimed on
its node (or Workload). For the process: crashes (an exit before the bench stops it), RSS
sampled every second and whether it stayed flat (mean of the last quarter within 10% of the
second quarter's), and its exit code on SIGTERM.

JSON in ``out/bench-fuzz.json``, a table on stdout, progress on stderr. Exit 0 when every
check held, 1 when one did not, 2 on bad arguments or no stack.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import random
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from reclaimd import handlers
from chaos import azure_metadata_server, hostile
from chaos.ports import free_port as _free_port
from reclaimd.model import rfc3339, utcnow

OUT = Path("out") / "bench-fuzz.json"
TRANSPORTS = ("sqs", "pubsub", "kafka_notices", "kueue", "imds", "gce_metadata", "azure_scheduled")
REAL = {
    "sqs": 4,
    "pubsub": 4,
    "kafka_notices": 4,
    "kueue": 2,
    "imds": 1,
    "gce_metadata": 1,
    "azure_scheduled": 1,
}
ACKED_TRANSPORTS = ("sqs", "pubsub", "kafka_notices")  # the ones with an ack to check
FLAT_TOLERANCE = 0.10
KUEUE = ("kueue.x-k8s.io", "v1beta2")
FUZZ_LABEL = "reclaimd.io/fuzz"
# kubernetes_asyncio's own keyword (its stubs do not declare it): a merge patch of the status.
MERGE_PATCH: dict[str, Any] = {"_content_type": "application/merge-patch+json"}
GCE_PROJECT = "reclaimd-local"
GCE_ZONE = "us-central1-a"
AWS_ZONE = "us-east-2a"
AZURE_PROJECT = "reclaimd-fuzz"  # names the AKS node resource group (fleet.azure_resource_group)
AZURE_LOCATION, AZURE_ZONE = "eastus", "1"  # the node's zone label: eastus-1, as AKS writes it
AZURE_SKU = "Standard_ND96isr_H100_v5"
MIN_NODES = sum(v for k, v in REAL.items() if k != "kueue")  # one node per real node notice


def progress(text: str) -> None:
    print(f"[bench-fuzz {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def _instance_id(run: str, key: str) -> str:
    return "i-" + hashlib.sha256(f"{run}/{key}".encode()).hexdigest()[:17]


@dataclass
class Tally:
    hostile: int = 0
    real: int = 0
    refused: int = 0  # writes the transport itself refused (the apiserver's schema, SQS limits)


@dataclass
class RealNotice:
    transport: str
    notice_id: str
    kind: str  # node | workload
    name: str
    namespace: str = ""
    sent_at: float = 0.0
    claimed_after_s: float | None = None


# --- the metadata servers ----------------------------------------------------------------


@dataclass
class ScheduledEvents:
    """What the Azure route answers ``GET /metadata/scheduledevents``, one document per GET.

    The poller hands a document over only when its version (``DocumentIncarnation``, else its
    digest: ``reclaimd.handlers.azure_scheduled.transport.version_of``) differs from the last one it
    read, so every answer's version differs from the one before: each hostile answer is a
    message the daemon must count. In turn: the real document while ``real`` is set (counted
    once, as one message, however often it is read), a hostile one while ``budget`` lasts,
    else a document with no events (an idle IMDS's, counted as neither)."""

    rng: random.Random = field(default_factory=random.Random)
    tally: Tally = field(default_factory=Tally)
    budget: int = 0  # hostile answers left to give
    real: str = ""  # the real document, served on every GET while set
    real_reads: int = 0  # GETs answered with it
    incarnation: int = 1  # the last DocumentIncarnation given out
    last: str = ""  # the version of the last answer
    idle: str = ""
    approvals: int = 0  # StartRequests POSTed (the daemon approving the drained event)

    def next_incarnation(self) -> int:
        self.incarnation += 1
        return self.incarnation

    def answer(self) -> str:
        from reclaimd.handlers.azure_scheduled.transport import version_of

        if self.real:
            body, version = self.real, version_of(self.real)
            self.real_reads += 1
            if version != self.last:
                self.tally.real += 1
            self.idle = ""
        elif self.budget > 0:
            body, version = self._hostile(version_of)
            self.budget -= 1
            self.tally.hostile += 1
            self.idle = ""
        else:
            if not self.idle:  # after another document: a new incarnation, read once
                self.idle = json.dumps(
                    {"DocumentIncarnation": self.next_incarnation(), "Events": []}
                )
            body, version = self.idle, version_of(self.idle)
        self.last = version
        return body

    def _hostile(self, version_of: Callable[[str], str]) -> tuple[str, str]:
        for _ in range(100):
            body = hostile.scheduled_events_body(self.rng, self.next_incarnation())
            version = version_of(body)
            if version != self.last:
                return body, version
        raise RuntimeError("no hostile document of a new version in 100 draws")


@dataclass
class MetadataState:
    """What the IMDS, GCE metadata and Azure routes answer; each phase switches its own on."""

    imds_identity: dict[str, str]
    gce_identity: dict[str, str]
    rng: random.Random
    imds_budget: int = 0  # hostile answers left to give
    gce_budget: int = 0
    imds_real: list[str] = field(default_factory=list)  # real bodies to serve next, in order
    gce_real: list[tuple[str, str, str]] = field(default_factory=list)  # (path, value, etag)
    served: dict[str, Tally] = field(
        default_factory=lambda: {"imds": Tally(), "gce_metadata": Tally()}
    )
    gce_active: asyncio.Event = field(default_factory=asyncio.Event)
    etag: int = 0
    azure_compute: dict[str, Any] = field(default_factory=dict)  # /metadata/instance/compute
    azure: ScheduledEvents = field(default_factory=ScheduledEvents)

    def __post_init__(self) -> None:
        self.served["azure_scheduled"] = self.azure.tally


def metadata_app(state: MetadataState) -> Any:
    from aiohttp import web

    async def token(_request: web.Request) -> web.Response:
        return web.Response(text="fuzz-token-" + "a" * 40)

    async def imds(request: web.Request) -> web.Response:
        path = request.match_info["path"]
        if path in state.imds_identity:
            return web.Response(text=state.imds_identity[path])
        if path == "spot/instance-action" and state.imds_real:
            state.served["imds"].real += 1
            return web.Response(text=state.imds_real.pop(0))
        if state.imds_budget <= 0:
            return web.Response(status=404, text="Not Found")
        state.imds_budget -= 1
        state.served["imds"].hostile += 1
        return web.Response(text=hostile.imds_body(path, state.rng))

    async def gce(request: web.Request) -> web.Response:
        path = request.match_info["path"]
        headers = {"Metadata-Flavor": "Google"}
        if path in state.gce_identity:
            return web.Response(text=state.gce_identity[path], headers=headers)
        if path not in ("instance/preempted", "instance/maintenance-event"):
            return web.Response(status=404, headers=headers)
        hanging = request.query.get("wait_for_change") == "true"
        for pending in list(state.gce_real):
            if pending[0] == path:
                state.gce_real.remove(pending)
                state.served["gce_metadata"].real += 1
                return web.Response(text=pending[1], headers={**headers, "ETag": pending[2]})
        if state.gce_budget <= 0:
            if hanging:  # nothing changes: hold the hanging GET a while, as the server does
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(state.gce_active.wait(), timeout=1.0)
            idle = "FALSE" if path == "instance/preempted" else "NONE"
            return web.Response(text=idle, headers={**headers, "ETag": "idle"})
        state.gce_budget -= 1
        state.served["gce_metadata"].hostile += 1
        state.etag += 1
        etag = state.rng.choice([f"e{state.etag:08x}", f"e{state.etag}\u00e9", f"{state.etag}" * 9])
        etag = etag.encode("latin-1", errors="replace").decode("latin-1")
        return web.Response(
            text=hostile.metadata_value(state.rng), headers={**headers, "ETag": etag}
        )

    async def azure_events(_request: web.Request) -> web.Response:
        return web.Response(text=state.azure.answer(), content_type="application/json")

    async def azure_approve(request: web.Request) -> web.Response:
        await request.read()
        state.azure.approvals += 1
        return web.Response(status=200)

    async def compute(_request: web.Request) -> web.Response:
        return web.json_response(state.azure_compute)

    app = web.Application(client_max_size=1024**2)
    app.router.add_put("/latest/api/token", token)
    app.router.add_get("/latest/meta-data/{path:.*}", imds)
    app.router.add_get("/computeMetadata/v1/{path:.*}", gce)
    app.router.add_get("/metadata/scheduledevents", azure_events)
    app.router.add_post("/metadata/scheduledevents", azure_approve)
    app.router.add_get("/metadata/instance/compute", compute)
    return app


def preempt_document(vm_name: str, incarnation: int, not_before_s: float) -> str:
    """A Scheduled Events document holding one Spot eviction of ``vm_name``, as IMDS sends it."""
    from chaos.azure_metadata_server import rfc1123

    event = {
        "EventId": str(uuid.uuid4()).upper(),
        "EventStatus": "Scheduled",
        "EventType": "Preempt",
        "ResourceType": "VirtualMachine",
        "Resources": [vm_name],
        "NotBefore": rfc1123(utcnow() + timedelta(seconds=not_before_s)),
        "Description": "",
        "EventSource": "Platform",
        "DurationInSeconds": -1,
    }
    return json.dumps({"DocumentIncarnation": incarnation, "Events": [event]})


# --- the run ------------------------------------------------------------------------------


class FuzzRun:
    def __init__(self, args: argparse.Namespace) -> None:
        from chaos import stack as stackenv
        from chaos.harness import Harness

        self.args = args
        self.stack = stackenv.load()
        self.h = Harness(self.stack)
        self.run = self.h.run_id
        self.rng = random.Random(args.seed)
        self.sent = {t: Tally() for t in TRANSPORTS}
        self.reals: list[RealNotice] = []
        self.rss: list[tuple[float, float]] = []
        self.crashed: int | None = None
        self.started = 0.0
        self.notices_topic = f"reclaimd.notices.fuzz.{self.run}"
        self.group = f"reclaimd-fuzz-{self.run}"
        self.state: MetadataState | None = None
        self.channel: Any = None

    # -- fleet --

    def _fleet(self) -> tuple[list[Any], list[Any], list[Any]]:
        from chaos import fleet
        from chaos.scenario import azure_vm_name

        n_gce = max(REAL["pubsub"] + REAL["gce_metadata"], self.args.nodes // 3)
        n_azure = REAL["azure_scheduled"]
        n_aws = max(
            REAL["sqs"] + REAL["kafka_notices"] + REAL["imds"], self.args.nodes - n_gce - n_azure
        )
        aws = [
            fleet.NodeSpec(f"fz-{self.run}-a{i}", _instance_id(self.run, f"a{i}"), zone=AWS_ZONE)
            for i in range(n_aws)
        ]
        gce = [
            fleet.NodeSpec(
                f"fz-{self.run}-g{i}",
                "",
                zone=GCE_ZONE,
                cloud="gce",
                project=GCE_PROJECT,
                sku="a3-highgpu-8g",
            )
            for i in range(n_gce)
        ]
        azure = [
            fleet.NodeSpec(
                f"fz-{self.run}-z{i}",
                azure_vm_name(self.run, "fuzz", i),
                zone=f"{AZURE_LOCATION}-{AZURE_ZONE}",
                sku=AZURE_SKU,
                cloud="azure",
                project=AZURE_PROJECT,
            )
            for i in range(n_azure)
        ]
        return aws, gce, azure

    async def _own_moto(self) -> str:
        """A moto of this bench's own for SQS: the shared one is slow with everything it ever
        held, and the fault drills restart it (losing every queue)."""
        port = _free_port()
        server = Path(sys.executable).with_name("moto_server")
        self.moto = await asyncio.create_subprocess_exec(
            str(server),
            "-H",
            "127.0.0.1",
            "-p",
            str(port),
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        url = f"http://127.0.0.1:{port}"
        import boto3

        region = self.stack.values.get("AWS_DEFAULT_REGION", "us-east-1")
        self.h.sqs = boto3.client("sqs", endpoint_url=url, region_name=region)
        for _ in range(100):
            try:
                self.h.queue_url = await asyncio.to_thread(self.h.create_queue)
                return url
            except Exception:
                await asyncio.sleep(0.2)
        raise RuntimeError(f"moto on {url} did not start")

    async def run_all(self) -> dict[str, Any]:
        from aiohttp import web

        from chaos import inject

        async with self.h as h:
            with contextlib.suppress(Exception):  # the harness's queue on the shared moto
                await asyncio.to_thread(h.sqs.delete_queue, QueueUrl=h.queue_url)
            self.moto_url = await self._own_moto()
            aws, gce, azure = self._fleet()
            progress(f"run {self.run}: {len(aws) + len(gce) + len(azure)} kwok nodes")
            await h.add_nodes([*aws, *gce, *azure])
            self.aws, self.gce, self.azure = aws, gce, azure
            await h.create_topics({self.notices_topic: 1})
            self.channel = inject.PubSubChannel(self.stack["PUBSUB_PROJECT_ID"], f"fuzz-{self.run}")
            await asyncio.to_thread(self.channel.create, ack_deadline_s=10)
            imds_node, gce_node, azure_node = aws[-1], gce[-1], azure[-1]
            self.state = MetadataState(
                imds_identity={
                    "instance-id": imds_node.instance_id,
                    "placement/availability-zone": imds_node.zone,
                    "placement/region": imds_node.zone[:-1],
                    "instance-type": imds_node.sku,
                },
                gce_identity={
                    "instance/name": gce_node.name,
                    "instance/zone": f"projects/123456789012/zones/{gce_node.zone}",
                    "project/project-id": gce_node.project,
                },
                rng=random.Random(f"{self.args.seed}/metadata"),
                azure_compute=azure_metadata_server.compute_of(azure_node).to_json(),
                azure=ScheduledEvents(random.Random(f"{self.args.seed}/azure")),
            )
            runner = web.AppRunner(metadata_app(self.state), access_log=None)
            await runner.setup()
            port = _free_port()
            await web.TCPSite(runner, "127.0.0.1", port).start()
            try:
                return await self._with_daemon(
                    f"http://127.0.0.1:{port}", imds_node, gce_node, azure_node
                )
            finally:
                await runner.cleanup()
                await asyncio.to_thread(self.channel.delete)
                await self._cleanup()
                if self.moto.returncode is None:
                    self.moto.terminate()
                    await self.moto.wait()

    async def _with_daemon(
        self, metadata_url: str, imds_node: Any, gce_node: Any, azure_node: Any
    ) -> dict[str, Any]:
        h = self.h
        self.metrics_port = _free_port()
        daemon = await h.start_daemon(
            "reclaimd-fuzz",
            sqs={
                "receivers": 2,
                "concurrency": 64,
                "endpoint_url": self.moto_url,
                "queue_url": self.h.queue_url,
            },
            pubsub={
                "enabled": True,
                "project": self.stack["PUBSUB_PROJECT_ID"],
                "subscription": f"fuzz-{self.run}",
            },
            kafka_notices={
                "enabled": True,
                "bootstrap": h.replica_kafka.bootstrap,
                "topic": self.notices_topic,
                "group_id": self.group,
            },
            kueue={"enabled": True, "namespaces": [h.namespace]},
            imds={"enabled": True, "url": metadata_url, "poll_interval_s": 0.01},
            gce_metadata={
                "enabled": True,
                "url": metadata_url,
                "node_name": gce_node.name,
                "timeout_s": 5,
            },
            azure_scheduled={
                "enabled": True,
                "url": metadata_url,
                "node_name": azure_node.name,
                "poll_interval_s": 0.01,
            },
            checkpoint={"allowed_hosts": ["127.0.0.1"]},
            metrics_port=self.metrics_port,
        )
        assert daemon.proc is not None
        self.daemon = daemon
        self.started = time.monotonic()
        sampler = asyncio.create_task(self._sample(daemon.proc.pid))
        watcher = asyncio.create_task(self._watch_reals())
        phases: list[tuple[str, Callable[[], Awaitable[None]]]] = [
            ("sqs", self._sqs),
            ("pubsub", self._pubsub),
            ("kafka_notices", self._kafka),
            ("kueue", self._kueue),
            ("imds", lambda: self._imds(imds_node)),
            ("gce_metadata", lambda: self._gce(gce_node)),
            ("azure_scheduled", lambda: self._azure(azure_node)),
        ]
        timings: dict[str, float] = {}
        self.windows: dict[str, tuple[float, float]] = {}  # phase -> (start, end) since start
        self.errors: dict[str, str] = {}
        try:
            for name, phase in phases:
                t0 = time.monotonic()
                progress(f"{name}: sending {self.args.per_transport} hostile + {REAL[name]} real")
                try:
                    await phase()
                except Exception as e:  # the shared stack's parts restart under the drills
                    self._check_alive()
                    self.errors[name] = f"{type(e).__name__}: {e}"[:300]
                    progress(f"{name}: phase failed: {self.errors[name]}")
                timings[name] = round(time.monotonic() - t0, 1)
                self.windows[name] = (t0 - self.started, time.monotonic() - self.started)
                progress(f"{name}: sent in {timings[name]} s (rss {self._rss_now()} MiB)")
            drained = await self._drain()
            counted = await self._scrape()
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
        exit_code = await self._stop(daemon)
        sampler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sampler
        left = await self._leftovers()
        return self._result(counted, drained, left, timings, exit_code)

    # -- the phases --

    def _hostile_bytes(self, source: str) -> bytes:
        return hostile.message(source, self.rng)

    def _spread(self, transport: str) -> set[int]:
        """Where the real notices go among the hostile ones (evenly, not first or last)."""
        n, k = self.args.per_transport, REAL[transport]
        return {(i + 1) * n // (k + 1) for i in range(k)}

    async def _sqs(self) -> None:
        from chaos import inject

        sqs, url, tally = self.h.sqs, self.h.queue_url, self.sent["sqs"]
        reals = iter(self.aws[: REAL["sqs"]])
        at = self._spread("sqs")
        batch: list[Any] = []

        def flush() -> None:
            if not batch:
                return
            reply = sqs.send_message_batch(QueueUrl=url, Entries=batch)
            tally.refused += len(reply.get("Failed", []))
            batch.clear()

        for i in range(self.args.per_transport):
            if i in at:
                node = next(reals)
                event = inject.spot_itn_event(node.instance_id, zone=node.zone, region="us-east-2")
                body = json.dumps(event)
                self._expect("sqs", "ec2", body.encode(), node.name)
                tally.real += 1
            else:
                body = hostile.sqs_text(self._hostile_bytes("ec2"))
                tally.hostile += 1
            size = sum(len(e["MessageBody"].encode()) for e in batch) + len(body.encode())
            if len(batch) == 10 or size > 250_000:
                await asyncio.to_thread(flush)
            batch.append({"Id": str(len(batch)), "MessageBody": body})
            if i % 2000 == 0:
                progress(f"sqs: {i}")
        await asyncio.to_thread(flush)

    async def _pubsub(self) -> None:
        from chaos import inject

        tally, reals, at = (
            self.sent["pubsub"],
            iter(self.gce[: REAL["pubsub"]]),
            self._spread("pubsub"),
        )
        channel = self.channel

        def publish_all() -> None:
            futures = []
            for i in range(self.args.per_transport):
                if i in at:
                    node = next(reals)
                    entry = inject.gce_log_entry(
                        project=node.project, zone=node.zone, instance=node.name
                    )
                    data = json.dumps(entry).encode()
                    self._expect("pubsub", "gke", data, node.name)
                    tally.real += 1
                else:
                    # The subscriber hands message.data to the parser: the LogEntry's bytes.
                    data = self._hostile_bytes("gke") or b" "
                    tally.hostile += 1
                futures.append(channel.publisher.publish(channel.topic, data))
                if len(futures) >= 500:
                    for f in futures:
                        f.result(timeout=60)
                    futures.clear()
                    if i % 2000 < 500:
                        progress(f"pubsub: {i}")
            for f in futures:
                f.result(timeout=60)

        await asyncio.to_thread(publish_all)

    async def _kafka(self) -> None:
        from aiokafka import AIOKafkaProducer

        from chaos import inject

        tally, reals, at = (
            self.sent["kafka_notices"],
            iter(self.aws[REAL["sqs"] :]),
            self._spread("kafka_notices"),
        )
        producer = AIOKafkaProducer(
            bootstrap_servers=self.stack.kafka, acks="all", max_request_size=1024**2
        )
        await producer.start()
        try:
            pending = []
            for i in range(self.args.per_transport):
                if i in at:
                    node = next(reals)
                    event = inject.cloudevent_notice(
                        "spot_interruption",
                        {"node_name": node.name, "provider_id": node.provider_id},
                    )
                    value = json.dumps(event).encode()
                    self._expect("kafka_notices", "kafka", value, node.name)
                    tally.real += 1
                else:
                    value = self._hostile_bytes("kafka")
                    tally.hostile += 1
                pending.append(await producer.send(self.notices_topic, value))
                if len(pending) >= 500:
                    await asyncio.gather(*pending)
                    pending.clear()
                if i % 2000 == 0:
                    progress(f"kafka: {i}")
            await asyncio.gather(*pending)
        finally:
            await producer.stop()

    async def _kueue(self) -> None:
        """Workloads written to the apiserver, each a create, status patches and a delete (one
        watch event each), until ``--per-transport`` writes were accepted; the apiserver's
        schema and Kueue's webhook refuse some (counted apart)."""
        from kubernetes_asyncio import client as k8s
        from kubernetes_asyncio.client.rest import ApiException

        assert self.h.api is not None
        co = k8s.CustomObjectsApi(self.h.api)
        ns, tally = self.h.namespace, self.sent["kueue"]
        patches = 4
        target = self.args.per_transport
        # The real ones go among the first Workloads' slots, spread like the other transports'.
        real_at = {i // (patches + 2) for i in self._spread("kueue")}
        gate = asyncio.Semaphore(8)

        def body(name: str, rng: random.Random | None) -> dict[str, Any]:
            value = (
                rng.choice([v for v in hostile.HOSTILE_VALUES if isinstance(v, str)]) or "x"
                if rng is not None
                else "real"
            )
            queue = rng.choice(["fuzz-lq"] * 6 + ["Bad_Queue", "../q", "q" * 300]) if rng else "lq"
            return {
                "apiVersion": "/".join(KUEUE),
                "kind": "Workload",
                "metadata": {
                    "name": name,
                    "namespace": ns,
                    "labels": {FUZZ_LABEL: self.run},
                    "annotations": {"fuzz": value, "reclaimd.io/checkpoint-url": value},
                },
                "spec": {
                    "queueName": queue,
                    "podSets": [
                        {
                            "name": "main",
                            "count": rng.choice([1, 1, 1, 0, 64]) if rng else 1,
                            "template": {
                                "spec": {
                                    "containers": [{"name": "c", "image": "fuzz"}],
                                    "restartPolicy": "Never",
                                }
                            },
                        }
                    ],
                },
            }

        async def one(i: int) -> None:
            real = i in real_at
            rng = None if real else random.Random(f"{self.args.seed}/kueue/{i}")
            name = f"fz-wl-{i}"
            async with gate:
                try:
                    await co.create_namespaced_custom_object(
                        *KUEUE, ns, "workloads", body(name, rng)
                    )
                except ApiException:
                    tally.refused += 1
                    return
                if rng is None:
                    tally.hostile += 1  # the create of a plain Workload is no notice either
                    await self._real_workload(co, name)
                    tally.real += 1
                    return
                tally.hostile += 1
                for _ in range(patches):
                    try:
                        await co.patch_namespaced_custom_object_status(
                            *KUEUE,
                            ns,
                            "workloads",
                            name,
                            {"status": hostile.workload_status(rng)},
                            **MERGE_PATCH,
                        )
                        tally.hostile += 1
                    except ApiException:
                        tally.refused += 1
                # Deleted once written (a DELETED event, one more message): the objects in
                # the cluster stay few, so memory that grows would grow with the messages.
                try:
                    await co.delete_namespaced_custom_object(*KUEUE, ns, "workloads", name)
                    tally.hostile += 1
                except ApiException:
                    tally.refused += 1

        i = 0
        while tally.hostile + tally.real < target:
            left = target - tally.hostile - tally.real
            n = max(1, min(100, left // (patches + 2) + 1))
            await asyncio.gather(*(one(k) for k in range(i, i + n)))
            i += n
            if i % 400 < n:
                progress(f"kueue: {tally.hostile + tally.real} writes ({tally.refused} refused)")

    async def _real_workload(self, co: Any, name: str) -> None:
        now = rfc3339(utcnow().replace(microsecond=0))
        status = {
            "conditions": [
                {
                    "type": "Evicted",
                    "status": "True",
                    "reason": "Preempted",
                    "message": "Preempted to accommodate a workload (UID: u1, JobUID: j1)",
                    "lastTransitionTime": now,
                },
                {
                    "type": "Preempted",
                    "status": "True",
                    "reason": "InCohortReclamation",
                    "message": "Preempted to accommodate a workload (UID: u1, JobUID: j1)",
                    "lastTransitionTime": now,
                },
            ]
        }
        obj = await co.patch_namespaced_custom_object_status(
            *KUEUE,
            self.h.namespace,
            "workloads",
            name,
            {"status": status},
            **MERGE_PATCH,
        )
        self._expect("kueue", "kueue", json.dumps(obj).encode(), name, kind="workload")

    async def _imds(self, node: Any) -> None:
        state = self.state
        assert state is not None
        n = self.args.per_transport
        half = n // 2
        state.imds_budget = half
        await self._until(lambda: state.imds_budget <= 0, "imds first half")
        when = utcnow().replace(microsecond=0) + timedelta(seconds=120)
        body = json.dumps({"action": "terminate", "time": rfc3339(when)})
        envelope = {
            "instance_id": node.instance_id,
            "path": "spot/instance-action",
            "body": body,
            "zone": node.zone,
            "region": node.zone[:-1],
            "instance_type": node.sku,
        }
        self._expect("imds", "imds", json.dumps(envelope).encode(), node.name)
        state.imds_real.extend([body] * 3)  # served on three polls: one notice, two duplicates
        await self._until(lambda: not state.imds_real, "imds real notice")
        state.imds_budget = n - half
        await self._until(lambda: state.imds_budget <= 0, "imds second half")
        self.sent["imds"] = state.served["imds"]

    async def _gce(self, node: Any) -> None:
        from chaos import inject

        state = self.state
        assert state is not None
        n = self.args.per_transport
        half = n // 2
        state.gce_budget = half
        state.gce_active.set()
        await self._until(lambda: state.gce_budget <= 0, "gce first half")
        state.gce_active.clear()
        etag = f"real-{self.run}"
        envelope = inject.gce_metadata_envelope(
            project=node.project,
            zone=node.zone,
            instance=node.name,
            kind="preemption",
            etag=etag,
            at=utcnow(),
        )
        self._expect("gce_metadata", "gce-metadata", json.dumps(envelope).encode(), node.name)
        state.gce_real.append(("instance/preempted", "TRUE", etag))
        await self._until(lambda: not state.gce_real, "gce real notice")
        state.gce_budget = n - half
        state.gce_active.set()
        await self._until(lambda: state.gce_budget <= 0, "gce second half")
        state.gce_active.clear()
        self.sent["gce_metadata"] = state.served["gce_metadata"]

    async def _azure(self, node: Any) -> None:
        """Hostile documents, then a real Preempt of the node's VM, read until its notice is
        claimed (at least three reads: one notice, then the same document again, as IMDS keeps
        serving it) or its NotBefore passes, then hostile documents again."""
        from chaos.azure_metadata_server import MIN_NOTICE_S
        from reclaimd.handlers.azure_scheduled import transport

        state = self.state
        assert state is not None
        events = state.azure
        n = self.args.per_transport
        half = n // 2
        events.budget = half
        await self._until(lambda: events.budget <= 0, "azure first half")
        notice_s = MIN_NOTICE_S["Preempt"]  # a Spot eviction's notice: 30 s
        identity = transport.Identity.from_compute(state.azure_compute)
        document = preempt_document(identity.vm_name, events.next_incarnation(), notice_s)
        envelope = transport.envelope(identity, document, node.name)  # as the daemon reads it
        self._expect("azure_scheduled", "azure-scheduled", json.dumps(envelope).encode(), node.name)
        real = self.reals[-1]
        until = time.monotonic() + notice_s
        events.real = document
        try:
            await self._until(
                lambda: (
                    (events.real_reads >= 3 and real.claimed_after_s is not None)
                    or time.monotonic() > until
                ),
                "azure real notice",
            )
        finally:
            events.real = ""
        events.budget = n - half
        await self._until(lambda: events.budget <= 0, "azure second half")
        self.sent["azure_scheduled"] = state.served["azure_scheduled"]

    async def _until(self, done: Callable[[], bool], what: str, timeout_s: float = 900) -> None:
        end = time.monotonic() + timeout_s
        last = 0.0
        while not done():
            self._check_alive()
            if time.monotonic() > end:
                raise TimeoutError(f"{what}: not done after {timeout_s:.0f} s")
            if time.monotonic() - last > 15:
                last = time.monotonic()
                served = {k: v.hostile for k, v in self.state.served.items()} if self.state else {}
                progress(f"{what}: waiting (served {served})")
            await asyncio.sleep(0.2)

    # -- checks --

    def _expect(
        self, transport: str, source: str, payload: bytes, name: str, kind: str = "node"
    ) -> None:
        outcome = handlers.parse(source, payload, received_at=utcnow())
        assert isinstance(outcome, tuple) and len(outcome) == 1, outcome
        self.reals.append(
            RealNotice(
                transport,
                outcome[0].id,
                kind,
                name,
                self.h.namespace if kind == "workload" else "",
                sent_at=time.monotonic(),
            )
        )

    async def _watch_reals(self) -> None:
        from kubernetes_asyncio import client as k8s

        from reclaimd.cluster.claims import CLAIM_ANNOTATION

        assert self.h.api is not None
        core, co = k8s.CoreV1Api(self.h.api), k8s.CustomObjectsApi(self.h.api)
        while True:
            for real in self.reals:
                if real.claimed_after_s is not None:
                    continue
                with contextlib.suppress(Exception):
                    if real.kind == "node":
                        meta = (await core.read_node(real.name)).metadata
                        annotations = meta.annotations or {}
                    else:
                        obj = await co.get_namespaced_custom_object(
                            *KUEUE, real.namespace, "workloads", real.name
                        )
                        annotations = obj["metadata"].get("annotations") or {}
                    if real.notice_id in annotations.get(CLAIM_ANNOTATION, ""):
                        real.claimed_after_s = round(time.monotonic() - real.sent_at, 1)
            await asyncio.sleep(1.0)

    async def _sample(self, pid: int) -> None:
        while True:
            rss = _rss_mib(pid)
            if rss is not None:
                self.rss.append((round(time.monotonic() - self.started, 1), rss))
            await asyncio.sleep(1.0)

    def _rss_now(self) -> float | None:
        return self.rss[-1][1] if self.rss else None

    def _check_alive(self) -> None:
        proc = self.daemon.proc
        if proc is not None and proc.returncode is not None and self.crashed is None:
            self.crashed = proc.returncode
            raise RuntimeError(f"reclaimd exited {proc.returncode}: {self.daemon.tail()}")

    async def _drain(self, timeout_s: float = 240) -> dict[str, Any]:
        """Wait until the queues are empty, the group has committed everything and every real
        notice is claimed (or the timeout)."""
        end = time.monotonic() + timeout_s
        state: dict[str, Any] = {}
        while time.monotonic() < end:
            self._check_alive()
            state = {
                "sqs_depth": await asyncio.to_thread(self.h.queue_depth),
                "kafka_lag": await self._kafka_lag(),
                "unclaimed": sum(r.claimed_after_s is None for r in self.reals),
            }
            if not any(state.values()):
                break
            progress(f"draining: {state}")
            await asyncio.sleep(3)
        return state

    async def _kafka_lag(self) -> int:
        """Records on the notices topic the daemon's group has not committed; -1 while Kafka
        cannot be asked (the shared stack's Kafka may be restarting)."""
        from aiokafka.errors import KafkaError

        for _ in range(10):
            try:
                return await self._kafka_lag_once()
            except (KafkaError, OSError) as e:
                progress(f"kafka lag: {type(e).__name__}; asking again")
                await asyncio.sleep(3)
        return -1

    async def _kafka_lag_once(self) -> int:
        from aiokafka import AIOKafkaConsumer, TopicPartition
        from aiokafka.admin import AIOKafkaAdminClient

        admin = AIOKafkaAdminClient(bootstrap_servers=self.stack.kafka)
        consumer = AIOKafkaConsumer(bootstrap_servers=self.stack.kafka)
        await admin.start()
        await consumer.start()
        try:
            committed = await admin.list_consumer_group_offsets(self.group)
            tp = TopicPartition(self.notices_topic, 0)
            end = (await consumer.end_offsets([tp]))[tp]
            got = committed.get(tp)
            return int(end - (got.offset if got is not None and got.offset >= 0 else 0))
        finally:
            await consumer.stop()
            await admin.close()

    async def _scrape(self) -> dict[str, dict[str, float]]:
        from chaos.harness import scrape

        counted: dict[str, dict[str, float]] = {t: {} for t in TRANSPORTS}
        prefix = "reclaimd_transport_"
        for sample in await scrape(self.metrics_port):
            transport = sample.labels.get("transport")
            if not sample.name.startswith(prefix) or transport not in counted:
                continue
            key = sample.name[len(prefix) :].removesuffix("_total")
            if "admission" in sample.labels:
                key = f"admission_{sample.labels['admission']}"
            counted[transport][key] = counted[transport].get(key, 0) + sample.value
        return counted

    async def _stop(self, daemon: Any) -> int | None:
        self._check_alive()
        await daemon.stop()
        self.h.daemons.remove(daemon)
        return daemon.proc.returncode if daemon.proc is not None else None

    async def _leftovers(self) -> dict[str, int]:
        """What the transports still hold once the daemon is gone and every lease expired."""
        await asyncio.sleep(12)  # SQS visibility (10 s) and the Pub/Sub ack deadline (10 s)
        sqs = await asyncio.to_thread(self.h.queue_depth)

        def pull() -> int:
            from google.api_core import exceptions

            try:
                reply = self.channel.subscriber.pull(
                    subscription=self.channel.subscription, max_messages=100, timeout=10
                )
            except exceptions.DeadlineExceeded:
                return 0
            except exceptions.GoogleAPICallError as e:  # the shared emulator was restarted
                progress(f"pubsub leftovers: {type(e).__name__}; unknown")
                return -1
            return len(reply.received_messages)

        return {
            "sqs": sqs,
            "pubsub": await asyncio.to_thread(pull),
            "kafka_notices": await self._kafka_lag(),
        }

    async def _cleanup(self) -> None:
        from kubernetes_asyncio import client as k8s

        if self.h.api is None:
            return
        with contextlib.suppress(Exception):
            await k8s.CustomObjectsApi(self.h.api).delete_collection_namespaced_custom_object(
                *KUEUE, self.h.namespace, "workloads", label_selector=f"{FUZZ_LABEL}={self.run}"
            )
        with contextlib.suppress(Exception):
            await k8s.CoreV1Api(self.h.api).delete_namespace(self.h.namespace)
        with contextlib.suppress(Exception):
            await asyncio.to_thread(self.h.sqs.delete_queue, QueueUrl=self.h.queue_url)

    # -- the report --

    def _result(
        self,
        counted: dict[str, dict[str, float]],
        drained: dict[str, Any],
        left: dict[str, int],
        timings: dict[str, float],
        exit_code: int | None,
    ) -> dict[str, Any]:
        per: dict[str, Any] = {}
        for t in TRANSPORTS:
            c = counted.get(t, {})
            reals = [r for r in self.reals if r.transport == t]
            sent = self.sent[t]
            row: dict[str, Any] = {
                "hostile_sent": sent.hostile,
                "real_sent": sent.real,
                "refused_by_transport": sent.refused,
                "received": int(c.get("received", 0)),
                "notices": int(c.get("notices", 0)),
                "ignored": int(c.get("ignored", 0)),
                "parse_errors": int(c.get("parse_errors", 0)),
                "acked": int(c.get("acked", 0)),
                "redeliveries": int(c.get("redeliveries", 0)),
                "transport_errors": int(c.get("errors", 0)),
                "admissions": {
                    k.removeprefix("admission_"): int(v)
                    for k, v in c.items()
                    if k.startswith("admission_")
                },
                "left_on_transport": left.get(t),
                "real_notices": len(reals),
                "real_claimed": sum(r.claimed_after_s is not None for r in reals),
                "real_claimed_after_s": [r.claimed_after_s for r in reals],
                "send_s": timings.get(t),
            }
            messages = sent.hostile + sent.real
            # Every message the daemon read was counted as exactly one of these outcomes.
            consistent = row["received"] == (
                row["parse_errors"] + row["ignored"] + _notice_messages(row)
            )
            # A watch is not a queue: writes close together may reach it as one event (and it
            # also sees Kueue's and reclaimd's own writes), so only its sum is checked.
            row["all_counted"] = consistent and (t == "kueue" or row["received"] >= messages)
            if t == "azure_scheduled" and self.state is not None:  # for the record, not judged
                row["start_requests"] = self.state.azure.approvals
            if t == "kafka_notices":  # a consumer group commits offsets, not messages
                row["all_acked"] = left.get(t) == 0
            elif t in ACKED_TRANSPORTS:
                row["all_acked"] = row["acked"] >= messages and left.get(t) == 0
            per[t] = row
        rss = [v for _, v in self.rss]
        flat = _flat(rss)
        # Each transport's own phase, judged alone: a new kind of payload (200 KB bodies, 32 KB
        # Workloads) raises the high-water mark once; a leak grows within a phase too.
        flat["per_phase"] = {
            name: _flat([v for t, v in self.rss if start <= t <= end])
            for name, (start, end) in self.windows.items()
        }
        checks = {
            "every_phase_ran": not self.errors,
            "no_crash": self.crashed is None,
            "clean_stop_on_sigterm": exit_code == 0,
            "every_message_counted": all(per[t]["all_counted"] for t in TRANSPORTS),
            "every_queued_message_acked": all(per[t]["all_acked"] for t in ACKED_TRANSPORTS),
            "memory_flat": flat["flat"],
            "every_real_notice_claimed": all(r.claimed_after_s is not None for r in self.reals),
            "at_least_per_transport": all(
                self.sent[t].hostile + self.sent[t].real + self.sent[t].refused
                >= self.args.per_transport
                for t in TRANSPORTS
            ),
        }
        return {
            "run_id": self.run,
            "seed": self.args.seed,
            "per_transport_target": self.args.per_transport,
            "nodes": len(self.aws) + len(self.gce) + len(self.azure),
            "transports": per,
            "process": {
                "crashed_exit": self.crashed,
                "exit_code_on_sigterm": exit_code,
                "rss_mib": flat,
                "rss_samples": self.rss,
            },
            "drain": drained,
            "phase_errors": self.errors,
            "checks": checks,
            "ok": all(checks.values()),
        }


def _notice_messages(row: dict[str, Any]) -> int:
    """Messages that held notices: received minus the unreadable and the ignored, as the
    daemon counts them (one message can hold several notices)."""
    return max(0, int(row["received"]) - int(row["parse_errors"]) - int(row["ignored"]))


def _rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None


def _flat(rss: list[float]) -> dict[str, Any]:
    """Flat: the last quarter's mean within ``FLAT_TOLERANCE`` of the second quarter's."""
    if len(rss) < 8:
        return {"flat": False, "samples": len(rss), "why": "too few samples"}
    q = len(rss) // 4
    second, last = statistics.fmean(rss[q : 2 * q]), statistics.fmean(rss[3 * q :])
    return {
        "flat": last <= second * (1 + FLAT_TOLERANCE),
        "samples": len(rss),
        "first_mib": rss[0],
        "second_quarter_mean_mib": round(second, 1),
        "last_quarter_mean_mib": round(last, 1),
        "peak_mib": max(rss),
        "growth": round(last / second - 1, 3),
    }


def table(result: dict[str, Any]) -> str:
    cols = (
        ("transport", 16),
        ("hostile", 8),
        ("real", 5),
        ("refused", 8),
        ("received", 9),
        ("parse_err", 9),
        ("ignored", 8),
        ("notices", 8),
        ("acked", 7),
        ("left", 5),
        ("claimed", 8),
    )
    lines = [
        "".join(
            name.rjust(width) if i else name.ljust(width) for i, (name, width) in enumerate(cols)
        )
    ]
    for t, row in result["transports"].items():
        values = (
            t,
            row["hostile_sent"],
            row["real_sent"],
            row["refused_by_transport"],
            row["received"],
            row["parse_errors"],
            row["ignored"],
            row["notices"],
            row["acked"] if t in ACKED_TRANSPORTS else "-",
            "-" if row["left_on_transport"] is None else row["left_on_transport"],
            f"{row['real_claimed']}/{row['real_notices']}",
        )
        lines.append(
            "".join(
                str(v).rjust(w) if i else str(v).ljust(w)
                for i, (v, (_, w)) in enumerate(zip(values, cols, strict=True))
            )
        )
    p = result["process"]
    rss = p["rss_mib"]
    lines.append(
        f"process: crashed={p['crashed_exit']} exit on SIGTERM={p['exit_code_on_sigterm']}; "
        f"RSS first {rss.get('first_mib')} MiB, "
        f"2nd-quarter mean {rss.get('second_quarter_mean_mib')}, "
        f"last-quarter mean {rss.get('last_quarter_mean_mib')}, peak {rss.get('peak_mib')} "
        f"({rss.get('samples')} samples, flat={rss['flat']})"
    )
    phases = rss.get("per_phase", {})
    lines.append(
        "RSS per phase (2nd-quarter -> last-quarter mean, MiB): "
        + ", ".join(
            f"{n} {v.get('second_quarter_mean_mib')}->{v.get('last_quarter_mean_mib')}"
            f"{'' if v['flat'] else ' NOT FLAT' if 'why' not in v else ' (too short)'}"
            for n, v in phases.items()
        )
    )
    lines.append("checks: " + ", ".join(f"{k}={v}" for k, v in result["checks"].items()))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="chaos.bench_fuzz", description=__doc__.splitlines()[0])
    p.add_argument(
        "--per-transport", type=int, default=10_000, help="hostile messages per transport"
    )
    p.add_argument("--nodes", type=int, default=20, help="kwok nodes for the real notices")
    p.add_argument("--seed", type=int, default=11)
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    if args.per_transport < 10 or args.nodes < MIN_NODES:
        print(
            f"bench_fuzz: --per-transport must be >= 10 and --nodes >= {MIN_NODES}",
            file=sys.stderr,
        )
        return 2
    from chaos.stack import StackNotRunning

    try:
        run = FuzzRun(args)
    except (StackNotRunning, OSError, ValueError) as e:
        print(f"bench_fuzz: {e}", file=sys.stderr)
        return 2
    result = asyncio.run(run.run_all())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(table(result))
    print(f"(JSON: {args.out})")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
