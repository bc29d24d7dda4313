"""Injectors: fake notices sent through the real transports, shaped like the real payloads."""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client as k8s
from kubernetes_asyncio.client.rest import ApiException

from reclaimd.model import rfc3339, utcnow


def spot_itn_event(
    instance_id: str,
    *,
    zone: str = "us-east-2a",
    region: str = "us-east-2",
    at: datetime | None = None,
    action: str = "terminate",
    event_id: str | None = None,
) -> dict[str, Any]:
    """An EventBridge "EC2 Spot Instance Interruption Warning" as SQS delivers it."""
    return {
        "version": "0",
        "id": event_id or str(uuid.uuid4()),
        "detail-type": "EC2 Spot Instance Interruption Warning",
        "source": "aws.ec2",
        "account": "123456789012",
        "time": rfc3339((at or utcnow()).replace(microsecond=0)),
        "region": region,
        "resources": [f"arn:aws:ec2:{zone}:instance/{instance_id}"],
        "detail": {"instance-id": instance_id, "instance-action": action},
    }


def send_sqs(sqs: Any, queue_url: str, event: dict[str, Any] | str) -> str:
    body = event if isinstance(event, str) else json.dumps(event)
    reply = sqs.send_message(QueueUrl=queue_url, MessageBody=body)
    return str(reply["MessageId"])


# --- GCE / GKE and the Kafka notices topic ---------------------------------------------------


class PubSubChannel:
    """A topic and a subscription on the Pub/Sub emulator: the sink's side of the wire."""

    def __init__(self, project: str, name: str) -> None:
        from google.cloud import pubsub_v1

        self.project, self.name = project, name
        self.publisher = pubsub_v1.PublisherClient()
        self.subscriber = pubsub_v1.SubscriberClient()
        self.topic = self.publisher.topic_path(project, name)
        self.subscription = self.subscriber.subscription_path(project, name)

    def create(self, *, ack_deadline_s: int = 10) -> PubSubChannel:
        self.publisher.create_topic(name=self.topic)
        self.subscriber.create_subscription(
            name=self.subscription, topic=self.topic, ack_deadline_seconds=ack_deadline_s
        )
        return self

    def publish(self, payload: dict[str, Any] | bytes, **attributes: str) -> str:
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        return str(self.publisher.publish(self.topic, data, **attributes).result(timeout=30))

    def delete(self) -> None:
        import contextlib

        # Best effort: either may be gone already.
        with contextlib.suppress(Exception):
            self.subscriber.delete_subscription(subscription=self.subscription)
        with contextlib.suppress(Exception):
            self.publisher.delete_topic(topic=self.topic)
        self.subscriber.close()


async def produce_kafka(
    bootstrap: str, topic: str, event: dict[str, Any] | bytes, *, key: str | None = None
) -> tuple[int, int]:
    """Produce one record (acks=all); its (partition, offset)."""
    from aiokafka import AIOKafkaProducer

    value = event if isinstance(event, bytes) else json.dumps(event).encode()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        meta = await producer.send_and_wait(topic, value, key=key.encode() if key else None)
    finally:
        await producer.stop()
    return int(meta.partition), int(meta.offset)


# --- EC2 through SQS: more kinds, and garbage ----------------------------------------------


def rebalance_event(
    instance_id: str,
    *,
    zone: str = "us-east-2a",
    region: str = "us-east-2",
    at: datetime | None = None,
    event_id: str | None = None,
) -> dict[str, Any]:
    """An EventBridge "EC2 Instance Rebalance Recommendation" as SQS delivers it."""
    return {
        "version": "0",
        "id": event_id or str(uuid.uuid4()),
        "detail-type": "EC2 Instance Rebalance Recommendation",
        "source": "aws.ec2",
        "account": "123456789012",
        "time": rfc3339((at or utcnow()).replace(microsecond=0)),
        "region": region,
        "resources": [f"arn:aws:ec2:{zone}:instance/{instance_id}"],
        "detail": {"instance-id": instance_id},
    }


def garbage_sqs(variant: int) -> str:
    """A body that is no valid EventBridge notice; ``variant`` rotates through the kinds of
    broken a queue sees (not JSON, wrong shape, a field missing or of the wrong type)."""
    itn = spot_itn_event("i-0garbage00000000", event_id=f"garbage-{variant}")
    broken: list[Any] = [
        '{"version": "0", "detail-type": "EC2 Spot Instance Interruption Warning", ',
        [itn],
        {**itn, "detail": {"instance-action": "terminate"}},
        {**itn, "time": "five past noon"},
        {**itn, "detail": "i-0garbage00000000"},
        "\u00ff\u00fe ~~ not even an envelope \u2603",  # SQS refuses control characters
    ]
    chosen = broken[variant % len(broken)]
    return chosen if isinstance(chosen, str) else json.dumps(chosen)


# --- EC2 instance metadata: a mock per instance ---------------------------------------------


class ImdsMock:
    """amazon-ec2-metadata-mock (AEMM) serving one instance's spot interruption notice.

    AEMM cannot be steered per instance at run time: one process serves one instance (its
    identity from a config file) and one spot ``instance-action`` fixed at start (``-t``; left
    out, AEMM answers "request time + 2 min", a new notice on every poll). So a drill starts one
    mock per interrupted instance, at the moment of the interruption, and stops it after; the
    rebalance recommendation AEMM would also serve is pushed out of reach.
    """

    def __init__(self, binary: Path, workdir: Path, port: int) -> None:
        self.binary, self.workdir, self.port = binary, workdir, port
        self.proc: asyncio.subprocess.Process | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(
        self,
        *,
        instance_id: str,
        zone: str,
        region: str,
        instance_type: str,
        action: str,
        deadline: datetime,
    ) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        cfg = self.workdir / f"aemm-{instance_id}.json"
        values = {
            "instance-id": instance_id,
            "placement-availability-zone": zone,
            "placement-region": region,
            "instance-type": instance_type,
        }
        cfg.write_text(json.dumps({"metadata": {"values": values}}))
        log = (self.workdir / f"aemm-{instance_id}.log").open("ab")
        self.proc = await asyncio.create_subprocess_exec(
            str(self.binary), "spot",
            "--config-file", str(cfg),
            "--action", action,
            "--time", rfc3339(deadline.replace(microsecond=0)),
            "--rebalance-delay-sec", "999999",
            "--hostname", "127.0.0.1",
            "--port", str(self.port),
            "--imdsv2",
            stdout=log, stderr=log, cwd=str(self.workdir),
            env={"HOME": str(self.workdir), "PATH": os.environ.get("PATH", "")},
        )  # fmt: skip
        log.close()

    async def stop(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.terminate()
            try:
                await asyncio.wait_for(self.proc.wait(), 5)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()


def imds_envelope(
    *, instance_id: str, zone: str, region: str, instance_type: str, action: str, at: datetime
) -> dict[str, Any]:
    """What reclaimd's IMDS poller hands the parser for the mock's answer (to know the id)."""
    body = {"action": action, "time": rfc3339(at.replace(microsecond=0))}
    return {
        "instance_id": instance_id,
        "path": "spot/instance-action",
        "body": json.dumps(body),
        "zone": zone,
        "region": region,
        "instance_type": instance_type,
    }


# --- GCE: Cloud Logging sink -> Pub/Sub, and the metadata server ----------------------------

GCE_METHODS = {
    "preemption": "compute.instances.preempted",
    "maintenance-terminate": "compute.instances.terminateOnHostMaintenance",
    "maintenance-migrate": "compute.instances.migrateOnHostMaintenance",
}
GCE_METADATA = {
    "preemption": ("instance/preempted", "TRUE"),
    "maintenance-terminate": ("instance/maintenance-event", "TERMINATE_ON_HOST_MAINTENANCE"),
    "maintenance-migrate": ("instance/maintenance-event", "MIGRATE_ON_HOST_MAINTENANCE"),
}


def gce_log_entry(
    *,
    project: str,
    zone: str,
    instance: str,
    kind: str = "preemption",
    at: datetime | None = None,
    operation_id: str | None = None,
) -> dict[str, Any]:
    """The Cloud Audit system-event LogEntry a Logging sink publishes for a GCE VM."""
    when = at or utcnow()
    method = GCE_METHODS[kind]
    millis = int(when.timestamp() * 1000)
    return {
        "protoPayload": {
            "@type": "type.googleapis.com/google.cloud.audit.AuditLog",
            "status": {"message": "Instance was preempted."} if kind == "preemption" else {},
            "authenticationInfo": {"principalEmail": "system@google.com"},
            "serviceName": "compute.googleapis.com",
            "methodName": method,
            "resourceName": f"projects/{project}/zones/{zone}/instances/{instance}",
            "request": {"@type": f"type.googleapis.com/{method}"},
        },
        "insertId": uuid.uuid4().hex[:12],
        "resource": {
            "type": "gce_instance",
            "labels": {
                "instance_id": str(int(uuid.uuid4().int % 10**19)),
                "project_id": project,
                "zone": zone,
            },
        },
        "timestamp": rfc3339(when),
        "severity": "INFO",
        "logName": f"projects/{project}/logs/cloudaudit.googleapis.com%2Fsystem_event",
        "operation": {
            "id": operation_id or f"systemevent-{millis}-{uuid.uuid4().hex[:13]}",
            "producer": method,
            "first": True,
            "last": True,
        },
        "receiveTimestamp": rfc3339(when + timedelta(milliseconds=450)),
    }


def garbage_pubsub(variant: int) -> bytes:
    """Message data a sink would never publish, or a LogEntry that is no usable notice."""
    entry = gce_log_entry(project="reclaimd-local", zone="us-central1-a", instance="ghost")
    no_name = json.loads(json.dumps(entry))
    del no_name["protoPayload"]["resourceName"]
    bad_name = json.loads(json.dumps(entry))
    bad_name["protoPayload"]["resourceName"] = "projects/p/instances"
    broken: list[Any] = [b"{not json", no_name, bad_name, {**entry, "timestamp": "noon"}, [1, 2]]
    chosen = broken[variant % len(broken)]
    return chosen if isinstance(chosen, bytes) else json.dumps(chosen).encode()


async def publish_pubsub(publisher: Any, topic_path: str, entry: dict[str, Any] | bytes) -> str:
    """Publish as a Logging sink does: the LogEntry JSON as data, its time as an attribute."""
    data = entry if isinstance(entry, bytes) else json.dumps(entry).encode()
    attrs = {}
    if isinstance(entry, dict) and "timestamp" in entry:
        attrs["logging.googleapis.com/timestamp"] = str(entry["timestamp"])
    future = publisher.publish(topic_path, data, **attrs)
    return str(await asyncio.to_thread(future.result, 30))


def gce_metadata_envelope(
    *, project: str, zone: str, instance: str, kind: str, etag: str, at: datetime
) -> dict[str, Any]:
    """What reclaimd's metadata watcher hands the parser after ``set`` (to know the id)."""
    path, value = GCE_METADATA[kind]
    return {
        "instance": instance,
        "project": project,
        "zone": zone,
        "path": path,
        "value": value,
        "etag": etag,
        "observed_at": rfc3339(at),
    }


# --- Kafka notices topic: CloudEvents --------------------------------------------------------

CLOUDEVENT_SOURCE = "//reclaimd/drills"


def cloudevent_notice(
    kind: str,
    target: dict[str, Any],
    *,
    at: datetime | None = None,
    deadline: datetime | None = None,
    event_id: str | None = None,
    source: str = CLOUDEVENT_SOURCE,
) -> dict[str, Any]:
    """A structured-mode CloudEvent for the notices topic (``handlers.kafka_notice``)."""
    data: dict[str, Any] = {"target": target, "attributes": {"drill": "true"}}
    if deadline is not None:
        data["deadline"] = rfc3339(deadline)
    return {
        "specversion": "1.0",
        "id": event_id or str(uuid.uuid4()),
        "source": source,
        "type": f"io.reclaimd.notice.{kind}.v1",
        "time": rfc3339(at or utcnow()),
        "datacontenttype": "application/json",
        "data": data,
    }


def garbage_kafka(variant: int) -> bytes:
    event = cloudevent_notice("spot_interruption", {"node_name": "ghost"}, event_id="garbage")
    broken: list[Any] = [
        b"\xff\xfe not json",
        {**event, "specversion": "0.3"},
        {k: v for k, v in event.items() if k != "id"},
        {**event, "data": {"target": {}}},
        {**event, "data_base64": "AAAA"},
    ]
    chosen = broken[variant % len(broken)]
    return chosen if isinstance(chosen, bytes) else json.dumps(chosen).encode()


async def send_kafka(producer: Any, topic: str, value: bytes, key: str = "") -> None:
    await producer.send_and_wait(topic, value, key=key.encode() if key else None)


# --- Kueue: a Workload preempted, exactly as Kueue's scheduler writes it ---------------------


async def evict_workload(
    api: k8s.ApiClient,
    namespace: str,
    name: str,
    *,
    reason: str = "InCohortReclamation",
    at: datetime | None = None,
    preemptor_uid: str = "",
) -> dict[str, Any]:
    """Set ``Evicted=True`` (reason ``Preempted``) and ``Preempted=True`` (``reason``) on the
    Workload's status in one update, with optimistic concurrency, as Kueue's scheduler does
    when it preempts a workload; returns the object as stored (what a watch delivers)."""
    custom = k8s.CustomObjectsApi(api)
    group, version = "kueue.x-k8s.io", "v1beta2"
    when = rfc3339((at or utcnow()).replace(microsecond=0))  # metav1.Time has seconds
    preemptor = preemptor_uid or str(uuid.uuid4())
    message = (
        f"Preempted to accommodate a workload (UID: {preemptor}, JobUID: {uuid.uuid4()})"
        f" due to {_KUEUE_WHY.get(reason, 'preemption')}"
    )
    # Kueue itself (when the stack runs it) writes the same status: re-read on a conflict.
    for attempt in range(20):
        wl = await custom.get_namespaced_custom_object(group, version, namespace, "workloads", name)
        status = wl.setdefault("status", {})
        kept = [
            c for c in status.get("conditions", []) if c["type"] not in ("Evicted", "Preempted")
        ]
        status["conditions"] = [
            *kept,
            {
                "type": "Evicted",
                "status": "True",
                "reason": "Preempted",
                "message": message,
                "observedGeneration": wl["metadata"].get("generation", 1),
                "lastTransitionTime": when,
            },
            {
                "type": "Preempted",
                "status": "True",
                "reason": reason,
                "message": message,
                "lastTransitionTime": when,
            },
        ]
        try:
            stored: dict[str, Any] = await custom.replace_namespaced_custom_object_status(
                group, version, namespace, "workloads", name, wl
            )
        except ApiException as e:
            if e.status != 409 or attempt == 19:
                raise
            continue
        return stored
    raise AssertionError("unreachable")


_KUEUE_WHY = {
    "InCohortReclamation": "reclamation within the cohort",
    "InClusterQueue": "prioritization in the ClusterQueue",
    "InCohortFairSharing": "fair sharing within the cohort",
    "InCohortReclaimWhileBorrowing": "reclamation within the cohort while borrowing",
}


async def stop_pods(api: k8s.ApiClient, namespace: str, names: list[str]) -> None:
    """What follows a Kueue eviction: the job is suspended and its pods deleted."""
    core = k8s.CoreV1Api(api)
    for name in names:
        try:
            await core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
        except ApiException as e:
            if e.status != 404:
                raise
