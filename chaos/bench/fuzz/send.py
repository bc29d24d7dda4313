"""``make bench-fuzz``'s senders: per transport, ``--per-transport`` hostile messages
(``chaos.bench.hostile``) with the real notices spread among them, each real one recorded
(``watch.expect``) as the daemon must claim it."""

from __future__ import annotations

import asyncio
import json
import random
import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from chaos.bench import hostile
from chaos.bench.fuzz import watch
from chaos.bench.fuzz.common import FUZZ_LABEL, KUEUE, MERGE_PATCH, REAL, progress
from chaos.standins import azure as azure_metadata_server
from reclaimd.model import rfc3339, utcnow

if TYPE_CHECKING:
    from chaos.bench.fuzz.run import FuzzRun


# -- the phases --


def hostile_bytes(run: FuzzRun, source: str) -> bytes:
    return hostile.message(source, run.rng)


async def sqs(run: FuzzRun) -> None:
    from chaos import inject

    sqs, url, tally = run.h.sqs, run.h.queue_url, run.sent["sqs"]
    reals = iter(run.aws[: REAL["sqs"]])
    at = run._spread("sqs")
    batch: list[Any] = []

    def flush() -> None:
        if not batch:
            return
        reply = sqs.send_message_batch(QueueUrl=url, Entries=batch)
        tally.refused += len(reply.get("Failed", []))
        batch.clear()

    for i in range(run.args.per_transport):
        if i in at:
            node = next(reals)
            event = inject.spot_itn_event(node.instance_id, zone=node.zone, region="us-east-2")
            body = json.dumps(event)
            watch.expect(run, "sqs", "ec2", body.encode(), node.name)
            tally.real += 1
        else:
            body = hostile.sqs_text(hostile_bytes(run, "ec2"))
            tally.hostile += 1
        size = sum(len(e["MessageBody"].encode()) for e in batch) + len(body.encode())
        if len(batch) == 10 or size > 250_000:
            await asyncio.to_thread(flush)
        batch.append({"Id": str(len(batch)), "MessageBody": body})
        if i % 2000 == 0:
            progress(f"sqs: {i}")
    await asyncio.to_thread(flush)


async def pubsub(run: FuzzRun) -> None:
    from chaos import inject

    tally, reals, at = (
        run.sent["pubsub"],
        iter(run.gce[: REAL["pubsub"]]),
        run._spread("pubsub"),
    )
    channel = run.channel

    def publish_all() -> None:
        futures = []
        for i in range(run.args.per_transport):
            if i in at:
                node = next(reals)
                entry = inject.gce_log_entry(
                    project=node.project, zone=node.zone, instance=node.name
                )
                data = json.dumps(entry).encode()
                watch.expect(run, "pubsub", "gke", data, node.name)
                tally.real += 1
            else:
                # The subscriber hands message.data to the parser: the LogEntry's bytes.
                data = hostile_bytes(run, "gke") or b" "
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


async def kafka(run: FuzzRun) -> None:
    from aiokafka import AIOKafkaProducer

    from chaos import inject

    tally, reals, at = (
        run.sent["kafka_notices"],
        iter(run.aws[REAL["sqs"] :]),
        run._spread("kafka_notices"),
    )
    producer = AIOKafkaProducer(
        bootstrap_servers=run.stack.kafka, acks="all", max_request_size=1024**2
    )
    await producer.start()
    try:
        pending = []
        for i in range(run.args.per_transport):
            if i in at:
                node = next(reals)
                event = inject.cloudevent_notice(
                    "spot_interruption",
                    {"node_name": node.name, "provider_id": node.provider_id},
                )
                value = json.dumps(event).encode()
                watch.expect(run, "kafka_notices", "kafka", value, node.name)
                tally.real += 1
            else:
                value = hostile_bytes(run, "kafka")
                tally.hostile += 1
            pending.append(await producer.send(run.notices_topic, value))
            if len(pending) >= 500:
                await asyncio.gather(*pending)
                pending.clear()
            if i % 2000 == 0:
                progress(f"kafka: {i}")
        await asyncio.gather(*pending)
    finally:
        await producer.stop()


async def kueue(run: FuzzRun) -> None:
    """Workloads written to the apiserver, each a create, status patches and a delete (one
    watch event each), until ``--per-transport`` writes were accepted; the apiserver's
    schema and Kueue's webhook refuse some (counted apart)."""
    from kubernetes_asyncio import client as k8s
    from kubernetes_asyncio.client.rest import ApiException

    assert run.h.api is not None
    co = k8s.CustomObjectsApi(run.h.api)
    ns, tally = run.h.namespace, run.sent["kueue"]
    patches = 4
    target = run.args.per_transport
    # The real ones go among the first Workloads' slots, spread like the other transports'.
    real_at = {i // (patches + 2) for i in run._spread("kueue")}
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
                "labels": {FUZZ_LABEL: run.run},
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
        rng = None if real else random.Random(f"{run.args.seed}/kueue/{i}")
        name = f"fz-wl-{i}"
        async with gate:
            try:
                await co.create_namespaced_custom_object(*KUEUE, ns, "workloads", body(name, rng))
            except ApiException:
                tally.refused += 1
                return
            if rng is None:
                tally.hostile += 1  # the create of a plain Workload is no notice either
                await real_workload(run, co, name)
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


async def real_workload(run: FuzzRun, co: Any, name: str) -> None:
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
        run.h.namespace,
        "workloads",
        name,
        {"status": status},
        **MERGE_PATCH,
    )
    watch.expect(run, "kueue", "kueue", json.dumps(obj).encode(), name, kind="workload")


async def imds(run: FuzzRun, node: Any) -> None:
    state = run.state
    assert state is not None
    n = run.args.per_transport
    half = n // 2
    state.imds_budget = half
    await watch.until(run, lambda: state.imds_budget <= 0, "imds first half")
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
    watch.expect(run, "imds", "imds", json.dumps(envelope).encode(), node.name)
    state.imds_real.extend([body] * 3)  # served on three polls: one notice, two duplicates
    await watch.until(run, lambda: not state.imds_real, "imds real notice")
    state.imds_budget = n - half
    await watch.until(run, lambda: state.imds_budget <= 0, "imds second half")
    run.sent["imds"] = state.served["imds"]


async def gce(run: FuzzRun, node: Any) -> None:
    from chaos import inject

    state = run.state
    assert state is not None
    n = run.args.per_transport
    half = n // 2
    state.gce_budget = half
    state.gce_active.set()
    await watch.until(run, lambda: state.gce_budget <= 0, "gce first half")
    state.gce_active.clear()
    etag = f"real-{run.run}"
    envelope = inject.gce_metadata_envelope(
        project=node.project,
        zone=node.zone,
        instance=node.name,
        kind="preemption",
        etag=etag,
        at=utcnow(),
    )
    watch.expect(run, "gce_metadata", "gce-metadata", json.dumps(envelope).encode(), node.name)
    state.gce_real.append(("instance/preempted", "TRUE", etag))
    await watch.until(run, lambda: not state.gce_real, "gce real notice")
    state.gce_budget = n - half
    state.gce_active.set()
    await watch.until(run, lambda: state.gce_budget <= 0, "gce second half")
    state.gce_active.clear()
    run.sent["gce_metadata"] = state.served["gce_metadata"]


async def azure(run: FuzzRun, node: Any) -> None:
    """Hostile documents, then a real Preempt of the node's VM, read until its notice is
    claimed (at least three reads: one notice, then the same document again, as IMDS keeps
    serving it) or its NotBefore passes, then hostile documents again."""
    from chaos.standins.azure import MIN_NOTICE_S
    from reclaimd.handlers.azure_scheduled import transport

    state = run.state
    assert state is not None
    events = state.azure
    n = run.args.per_transport
    half = n // 2
    events.budget = half
    await watch.until(run, lambda: events.budget <= 0, "azure first half")
    notice_s = MIN_NOTICE_S["Preempt"]  # a Spot eviction's notice: 30 s
    identity = transport.Identity.from_compute(state.azure_compute)
    document = azure_metadata_server.preempt_document(
        identity.vm_name, events.next_incarnation(), notice_s
    )
    envelope = transport.envelope(identity, document, node.name)  # as the daemon reads it
    payload = json.dumps(envelope).encode()
    watch.expect(run, "azure_scheduled", "azure-scheduled", payload, node.name)
    real = run.reals[-1]
    until = time.monotonic() + notice_s
    events.real = document
    try:
        await watch.until(
            run,
            lambda: (
                (events.real_reads >= 3 and real.claimed_after_s is not None)
                or time.monotonic() > until
            ),
            "azure real notice",
        )
    finally:
        events.real = ""
    events.budget = n - half
    await watch.until(run, lambda: events.budget <= 0, "azure second half")
    run.sent["azure_scheduled"] = state.served["azure_scheduled"]
