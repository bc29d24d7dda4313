"""Injecting a drill's notices (``chaos.drill.run``, step 4): each through its real transport at
its planned time (``chaos.inject``), with its duplicates and the garbage around it, and the
notice each payload must become (parsed from the very bytes sent): the ground truth of ids
and deadlines, kept in ``Injector.sent``."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from chaos.drill.common import SEND_RETRY_S, retrying
from chaos.drill.faults import STACK_TIMEOUT_S
from chaos.drill.plan import Plan, PlannedGarbage, PlannedNotice
from chaos.drill.scenario import Fault, Source
from chaos.drill.verdict.facts import NoticeFacts
from reclaimd.model import Notice, utcnow

# A publish that found the topic gone waits for the rig to put it back: a restart of the
# emulator (stack.sh's limit), then the recreate (retried like every send).
TOPIC_BACK_S = STACK_TIMEOUT_S + SEND_RETRY_S

if TYPE_CHECKING:
    from chaos.drill.local import World
    from chaos.harness import Harness
    from chaos.standins.azure import AzureMetadataServer


class Injector:
    """Sends the plan's notices and garbage through the world's transports; owns what was sent
    (``sent``, ``garbage_sent``) and how to send each notice again (``resend``)."""

    def __init__(self, plan: Plan, world: World, *, say: Callable[[str], None]) -> None:
        self.plan = plan
        self.world = world
        self.say = say
        self.sent: list[NoticeFacts] = []
        self.garbage_sent = 0
        self.resend: dict[str, Callable[[], Any]] = {}  # notice label -> send it again
        self.under_way: dict[str, Source] = {}  # notices whose send has not returned yet
        self.stop_pods: list[asyncio.Task[None]] = []  # pods stopped later (Kueue, Kafka)

    async def run(self, h: Harness, apply_fault: Callable[[Fault], Awaitable[None]]) -> None:
        """Every notice, garbage payload and fault at its planned time, on one clock (a fault's
        ``at_s`` counts from the same start as the notices)."""
        loop = asyncio.get_running_loop()
        t0, wall0 = loop.time(), utcnow()

        async def at(offset: float) -> None:
            await asyncio.sleep(max(0.0, t0 + offset - loop.time()))

        async def notice(n: PlannedNotice) -> None:
            await at(n.send_at_s)
            self.under_way[n.label] = n.source
            try:
                facts = await self._send(h, n, wall0 + timedelta(seconds=n.issued_at_s))
            finally:
                del self.under_way[n.label]
            self.sent.append(facts)
            dup = f" x{n.copies}" if n.copies > 1 else ""
            self.say(f"sent {n.label} {n.kind} -> {facts.target}{dup}")

        async def garbage(g: PlannedGarbage) -> None:
            await at(g.send_at_s)
            await self._send_garbage(h, g)
            self.garbage_sent += 1

        async def fault(f: Fault) -> None:
            await at(f.at_s)
            await apply_fault(f)

        await asyncio.gather(
            *(notice(n) for n in self.plan.notices),
            *(garbage(g) for g in self.plan.garbage),
            *(fault(f) for f in self.plan.scenario.faults),
        )
        if self.garbage_sent:
            self.say(f"sent {self.garbage_sent} malformed payload(s) among the notices")

    async def _send(self, h: Harness, n: PlannedNotice, issued: datetime) -> NoticeFacts:
        """Send one notice (with its duplicates) through its transport; what it must become."""
        p = self.plan
        sent_at = utcnow()
        senders = {
            Source.EC2_SQS: self._send_sqs,
            Source.IMDS: self._send_imds,
            Source.GKE_PUBSUB: self._send_pubsub,
            Source.GCE_METADATA: self._send_gce_metadata,
            Source.AZURE_SCHEDULED: self._send_azure_scheduled,
            Source.KUEUE: self._send_kueue,
            Source.KAFKA: self._send_kafka,
        }
        parser, payload = await senders[n.source](h, n, issued, sent_at)
        notice = _expected_notice(parser, payload, sent_at, p)
        node = p.node(n.node) if n.node is not None else None
        gangs = (n.gang,) if n.gang is not None else tuple(g.name for g in p.gangs_on(n.node or ""))
        return NoticeFacts(
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
        from chaos import inject

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
        from chaos import inject

        node = self.plan.node(_some(n.node))
        deadline = issued + timedelta(seconds=self.plan.windows.ec2_spot_s)
        identity = {
            "instance_id": node.instance_id,
            "zone": node.zone,
            "region": node.zone[:-1],
            "instance_type": node.sku,
        }
        await self.world.built.imds[node.key].start(**identity, action=n.action, deadline=deadline)
        envelope = inject.imds_envelope(**identity, action=n.action, at=deadline)
        return "imds", json.dumps(envelope).encode()

    async def _send_pubsub(
        self, h: Harness, n: PlannedNotice, issued: datetime, sent_at: datetime
    ) -> tuple[str, bytes]:
        from chaos import inject

        node = self.plan.node(_some(n.node))
        entry = inject.gce_log_entry(
            project=node.project, zone=node.zone, instance=node.name, kind=n.kind, at=issued
        )
        topic = self.world.built.pubsub_topic

        async def publish() -> str:
            from google.api_core import exceptions

            # A restarted emulator lost the topic (a real one would have taken the message):
            # publish again each time the rig puts it back (``topic_back``, read afresh each
            # round: the rig replaces it), for as long as the restart itself may take.
            loop = asyncio.get_running_loop()
            end = loop.time() + TOPIC_BACK_S
            while True:
                back = self.world.topic_back
                try:
                    return await inject.publish_pubsub(self.world.publisher, topic, entry)
                except exceptions.NotFound:
                    if loop.time() > end:
                        raise
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(back.wait(), 1.0)

        await self._copies(n, publish)
        return "gke", json.dumps(entry).encode()

    async def _send_gce_metadata(
        self, h: Harness, n: PlannedNotice, issued: datetime, sent_at: datetime
    ) -> tuple[str, bytes]:
        from chaos import inject

        node = self.plan.node(_some(n.node))
        key, value = inject.GCE_METADATA[n.kind]
        etag = await self.world.built.gce[node.key].set(key, value)
        envelope = inject.gce_metadata_envelope(
            project=node.project, zone=node.zone, instance=node.name, kind=n.kind, etag=etag,
            at=sent_at,
        )  # fmt: skip
        return "gce-metadata", json.dumps(envelope).encode()

    async def _send_azure_scheduled(
        self, h: Harness, n: PlannedNotice, issued: datetime, sent_at: datetime
    ) -> tuple[str, bytes]:
        """A Spot eviction: a Preempt whose NotBefore is the window after ``issued``, on the
        node's stand-in; the envelope is what its per-node reclaimd reads there."""
        node = self.plan.node(_some(n.node))
        server = self.world.built.azure[node.key]
        window = self.plan.windows.of("azure_preempt_s", {"azure_preempt_s": 30.0})
        not_before = issued + timedelta(seconds=window)
        event_id = server.preempt(not_before_s=(not_before - utcnow()).total_seconds())
        return "azure-scheduled", json.dumps(azure_envelope(server, event_id, node.name)).encode()

    async def _send_kueue(
        self, h: Harness, n: PlannedNotice, issued: datetime, sent_at: datetime
    ) -> tuple[str, bytes]:
        from chaos import inject

        gang = _some(n.gang)
        assert h.api is not None
        api = h.api
        # retried like every other send: the apiserver may be restarting (a fault)
        stored = await retrying(
            lambda: inject.evict_workload(api, h.namespace, gang, reason=n.reason, at=issued)
        )
        pods = [f"{gang}-{r.rank}" for r in self.plan.gang(gang).ranks]
        self.stop_pods.append(asyncio.create_task(self._stop_later(h, pods, n)))
        return "kueue", json.dumps(stored).encode()

    async def _send_kafka(
        self, h: Harness, n: PlannedNotice, issued: datetime, sent_at: datetime
    ) -> tuple[str, bytes]:
        from chaos import inject

        target: dict[str, Any]
        if n.gang is not None:
            target = {"workload": {"namespace": h.namespace, "name": n.gang}}
            pods = [f"{n.gang}-{r.rank}" for r in self.plan.gang(n.gang).ranks]
            self.stop_pods.append(asyncio.create_task(self._stop_later(h, pods, n)))
        else:
            node = self.plan.node(_some(n.node))
            target = {
                "node_name": node.name,
                "provider_id": self.world.built.nodes[node.key].provider_id,
            }
        deadline = issued + timedelta(seconds=n.window_s) if n.window_s is not None else None
        event = inject.cloudevent_notice(n.kind, target, at=issued, deadline=deadline)
        value = json.dumps(event).encode()
        topic, key = self.world.built.notices_topic, str(event["id"])
        await self._copies(n, lambda: inject.send_kafka(self.world.producer, topic, value, key=key))
        return "kafka", value

    async def _copies(self, n: PlannedNotice, send: Callable[[], Any]) -> None:
        """The notice, then its duplicates (a redelivery: same identity, new message)."""
        self.resend[n.label] = send
        for i in range(n.copies):
            if i:
                await asyncio.sleep(n.duplicate_delay_s)
            await retrying(send)

    async def _stop_later(self, h: Harness, pods: list[str], n: PlannedNotice) -> None:
        """The scheduler that reclaims a workload (Kueue suspends its job at once) stops its
        pods: they run for their grace period, then are gone."""
        from chaos import inject

        api = h.api
        assert api is not None
        await asyncio.sleep(n.pods_stop_after_s)
        # A pod that is gone answers nothing: its trainer stops with it (a save under way is
        # cut short), rather than outliving it as a drill's in-process trainer could.
        for pod in pods:
            self.world.built.stopped[pod] = utcnow()
            trainer = self.world.built.trainers.get(pod)
            if trainer is not None:
                await trainer.server.stop()
        await retrying(lambda: inject.stop_pods(api, h.namespace, pods))

    async def _send_garbage(self, h: Harness, g: PlannedGarbage) -> None:
        from chaos import inject

        if g.source is Source.EC2_SQS:
            body = inject.garbage_sqs(g.variant)
            await asyncio.to_thread(inject.send_sqs, h.sqs, h.queue_url, body)
        elif g.source is Source.GKE_PUBSUB:
            await inject.publish_pubsub(
                self.world.publisher,
                self.world.built.pubsub_topic,
                inject.garbage_pubsub(g.variant),
            )
        elif g.source is Source.KAFKA:
            await inject.send_kafka(
                self.world.producer, self.world.built.notices_topic, inject.garbage_kafka(g.variant)
            )


# --- helpers ---------------------------------------------------------------------------------


def _expected_notice(parser: str, payload: bytes, received: datetime, plan: Plan) -> Notice:
    """What reclaimd must make of the payload: the same parser, the same windows."""
    from reclaimd import handlers

    outcome = handlers.parse(parser, payload, received_at=received, windows=plan.windows)
    if not isinstance(outcome, tuple) or len(outcome) != 1:
        raise RuntimeError(f"the drill built a {parser} payload that is not one notice: {outcome}")
    return outcome[0]


def azure_envelope(server: AzureMetadataServer, event_id: str, node_name: str) -> dict[str, Any]:
    """What the node's reclaimd reads of ``event_id`` on its stand-in (the transport's
    envelope: the VM's compute metadata and a document of that one event)."""
    event = server.event(event_id)
    assert event is not None, event_id
    compute = server.compute
    return {
        "vm_name": compute.name,
        "resource_id": compute.resource_id,
        "node_name": node_name,
        "vm_size": compute.vm_size,
        "priority": compute.priority,
        "location": compute.location,
        "zone": compute.zone,
        "document": {"DocumentIncarnation": server.incarnation, "Events": [event]},
    }


def _some(value: str | None) -> str:
    assert value is not None, "the plan gives this source a target of this kind"
    return value


def _describe(n: PlannedNotice, instance_id: str) -> str:
    if n.gang is not None:
        return f"workload {n.gang}"
    return f"{n.node} {instance_id}" if n.source in (Source.EC2_SQS, Source.IMDS) else str(n.node)
