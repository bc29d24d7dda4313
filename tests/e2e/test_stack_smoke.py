"""One smoke test per server of the local stack, each through the client reclaimd itself uses.

They prove the stack is real and wired the way later tests assume: kwok runs GPU pods and lets
an Eviction remove them, Kafka takes idempotent acks=all writes, moto routes EventBridge to SQS,
the Pub/Sub emulator delivers, the IMDS mock requires IMDSv2 and serves a spot action. Names
carry a per-run suffix so reruns against a warm stack do not see each other's objects.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Awaitable, Callable

import aiohttp
import boto3
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from google.cloud import pubsub_v1
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException
from stack import Stack

from reclaimd.model import load_json, parse_time, utcnow

# Upper bounds on waiting for the servers to converge, so a broken stack fails instead of hanging.
# They are deadlines, not measurements: nothing asserts how fast anything was.
CONVERGE_S = 90.0
KWOK_ANNOTATION = "kwok.x-k8s.io/node"


def run_id() -> str:
    return uuid.uuid4().hex[:8]


async def eventually(check: Callable[[], Awaitable[bool]], what: str) -> None:
    deadline = asyncio.get_running_loop().time() + CONVERGE_S
    while not await check():
        if asyncio.get_running_loop().time() > deadline:
            pytest.fail(f"{what}: not reached within {CONVERGE_S:.0f}s", pytrace=False)
        await asyncio.sleep(0.5)


def gpu_node(name: str) -> client.V1Node:
    resources = {"cpu": "96", "memory": "1Ti", "pods": "110", "nvidia.com/gpu": "8"}
    return client.V1Node(
        metadata=client.V1ObjectMeta(
            name=name,
            annotations={KWOK_ANNOTATION: "fake"},
            labels={"type": "kwok", "kubernetes.io/hostname": name},
        ),
        # The taint keeps real workloads off fake nodes once a scheduler runs; tests tolerate it.
        spec=client.V1NodeSpec(
            taints=[client.V1Taint(key=KWOK_ANNOTATION, value="fake", effect="NoSchedule")]
        ),
        status=client.V1NodeStatus(capacity=resources, allocatable=resources),
    )


def gpu_pod(name: str, node: str) -> client.V1Pod:
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, labels={"app": "smoke"}),
        spec=client.V1PodSpec(
            node_name=node,
            tolerations=[
                client.V1Toleration(key=KWOK_ANNOTATION, operator="Exists", effect="NoSchedule")
            ],
            containers=[
                client.V1Container(
                    name="trainer",
                    image="registry.invalid/trainer:smoke",
                    resources=client.V1ResourceRequirements(
                        requests={"nvidia.com/gpu": "1"}, limits={"nvidia.com/gpu": "1"}
                    ),
                )
            ],
        ),
    )


async def test_kwok_runs_gpu_pod_and_eviction_removes_it(kube: client.ApiClient) -> None:
    core = client.CoreV1Api(kube)
    rid = run_id()
    node, namespace, pod = f"smoke-gpu-{rid}", f"smoke-{rid}", "trainer-0"
    await core.create_node(gpu_node(node))
    await core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    try:

        async def node_ready() -> bool:
            status = (await core.read_node(node)).status
            return any(c.type == "Ready" and c.status == "True" for c in status.conditions or [])

        await eventually(node_ready, f"kwok marks node {node} Ready")
        allocatable = (await core.read_node(node)).status.allocatable
        assert allocatable["nvidia.com/gpu"] == "8"

        await core.create_namespaced_pod(namespace, gpu_pod(pod, node))

        async def pod_running() -> bool:
            status = (await core.read_namespaced_pod(pod, namespace)).status
            return bool(status.phase == "Running")

        await eventually(pod_running, f"kwok runs pod {namespace}/{pod}")
        running = await core.read_namespaced_pod(pod, namespace)
        assert running.spec.node_name == node
        assert running.spec.containers[0].resources.requests["nvidia.com/gpu"] == "1"

        eviction = client.V1Eviction(metadata=client.V1ObjectMeta(name=pod, namespace=namespace))
        await core.create_namespaced_pod_eviction(pod, namespace, eviction)

        async def pod_gone() -> bool:
            try:
                await core.read_namespaced_pod(pod, namespace)
            except ApiException as e:
                if e.status == 404:
                    return True
                raise
            return False

        await eventually(pod_gone, f"evicted pod {namespace}/{pod} is deleted")
    finally:
        await core.delete_namespace(namespace)
        await core.delete_node(node)


async def test_kafka_idempotent_produce_then_consume(stack: Stack) -> None:
    topic = f"smoke-{run_id()}"
    admin = AIOKafkaAdminClient(bootstrap_servers=stack.kafka_bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])
        producer = AIOKafkaProducer(
            bootstrap_servers=stack.kafka_bootstrap, enable_idempotence=True, acks="all"
        )
        await producer.start()
        try:
            sent = await producer.send_and_wait(topic, key=b"gang-1", value=b'{"smoke": true}')
        finally:
            await producer.stop()

        consumer = AIOKafkaConsumer(
            topic,
            bootstrap_servers=stack.kafka_bootstrap,
            group_id=None,
            auto_offset_reset="earliest",
        )
        await consumer.start()
        try:
            record = await asyncio.wait_for(consumer.getone(), CONVERGE_S)
        finally:
            await consumer.stop()
        assert (record.key, record.value) == (b"gang-1", b'{"smoke": true}')
        assert (record.partition, record.offset) == (sent.partition, sent.offset)
    finally:
        await admin.delete_topics([topic])
        await admin.close()


def test_moto_sqs_round_trip_and_s3_put_get(stack: Stack) -> None:
    rid = run_id()
    sqs = boto3.client("sqs")
    queue_url = sqs.create_queue(QueueName=f"smoke-{rid}")["QueueUrl"]
    try:
        sqs.send_message(QueueUrl=queue_url, MessageBody=f"notice {rid}")
        received = sqs.receive_message(QueueUrl=queue_url, WaitTimeSeconds=5)["Messages"]
        assert [m["Body"] for m in received] == [f"notice {rid}"]
        sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=received[0]["ReceiptHandle"])
        # Deleted, not merely invisible: an undeleted message would count as NotVisible.
        counts = sqs.get_queue_attributes(
            QueueUrl=queue_url,
            AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
        )["Attributes"]
        assert counts == {
            "ApproximateNumberOfMessages": "0",
            "ApproximateNumberOfMessagesNotVisible": "0",
        }
    finally:
        sqs.delete_queue(QueueUrl=queue_url)

    s3 = boto3.client("s3")
    bucket, key, body = f"smoke-{rid}", f"checkpoints/smoke/{rid}/rank-0.pt", uuid.uuid4().bytes
    s3.create_bucket(Bucket=bucket)
    try:
        s3.put_object(Bucket=bucket, Key=key, Body=body)
        assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == body
    finally:
        s3.delete_object(Bucket=bucket, Key=key)
        s3.delete_bucket(Bucket=bucket)


def test_moto_eventbridge_routes_event_to_sqs(stack: Stack) -> None:
    rid = run_id()
    source, detail_type = f"reclaimd.smoke.{rid}", "EC2 Spot Instance Interruption Warning"
    detail = {"instance-id": f"i-{rid}", "instance-action": "terminate"}
    sqs, events = boto3.client("sqs"), boto3.client("events")
    queue_url = sqs.create_queue(QueueName=f"smoke-events-{rid}")["QueueUrl"]
    queue_arn = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])[
        "Attributes"
    ]["QueueArn"]
    rule = f"smoke-{rid}"
    events.put_rule(
        Name=rule, EventPattern=json.dumps({"source": [source], "detail-type": [detail_type]})
    )
    events.put_targets(Rule=rule, Targets=[{"Id": "queue", "Arn": queue_arn}])
    try:
        result = events.put_events(
            Entries=[{"Source": source, "DetailType": detail_type, "Detail": json.dumps(detail)}]
        )
        assert result["FailedEntryCount"] == 0
        messages = sqs.receive_message(QueueUrl=queue_url, WaitTimeSeconds=5).get("Messages", [])
        assert len(messages) == 1
        envelope = load_json(messages[0]["Body"])
        assert (envelope["source"], envelope["detail-type"]) == (source, detail_type)
        assert envelope["detail"] == detail
        assert envelope["id"] == result["Entries"][0]["EventId"]
    finally:
        events.remove_targets(Rule=rule, Ids=["queue"])
        events.delete_rule(Name=rule)
        sqs.delete_queue(QueueUrl=queue_url)


def test_pubsub_emulator_publish_then_pull(stack: Stack) -> None:
    rid = run_id()
    publisher = pubsub_v1.PublisherClient()
    subscriber = pubsub_v1.SubscriberClient()
    topic = publisher.topic_path(stack.pubsub_project, f"smoke-{rid}")
    subscription = subscriber.subscription_path(stack.pubsub_project, f"smoke-{rid}")
    publisher.create_topic(name=topic)
    try:
        subscriber.create_subscription(name=subscription, topic=topic)
        try:
            payload = json.dumps({"smoke": rid}).encode()
            publisher.publish(topic, payload, origin="smoke").result(timeout=CONVERGE_S)
            response = subscriber.pull(
                subscription=subscription, max_messages=10, timeout=CONVERGE_S
            )
            pulled = [m.message for m in response.received_messages]
            assert [(m.data, m.attributes["origin"]) for m in pulled] == [(payload, "smoke")]
            subscriber.acknowledge(
                subscription=subscription,
                ack_ids=[m.ack_id for m in response.received_messages],
            )
        finally:
            subscriber.delete_subscription(subscription=subscription)
    finally:
        publisher.delete_topic(topic=topic)
        subscriber.close()


async def test_imds_mock_serves_spot_action_with_imdsv2(stack: Stack) -> None:
    action_url = f"{stack.imds_url}/latest/meta-data/spot/instance-action"
    async with aiohttp.ClientSession() as http:
        # IMDSv2 only, as on hardened nodes: a request without a session token is refused.
        async with http.get(action_url) as anonymous:
            assert anonymous.status == 401
        async with http.put(
            f"{stack.imds_url}/latest/api/token",
            headers={"X-aws-ec2-metadata-token-ttl-seconds": "60"},
        ) as issued:
            assert issued.status == 200
            token = await issued.text()
        async with http.get(action_url, headers={"X-aws-ec2-metadata-token": token}) as reply:
            assert reply.status == 200
            action = load_json(await reply.read())
    assert action["action"] in {"terminate", "stop", "hibernate"}
    # A notice announces a future stop (the mock: two minutes after the request).
    assert parse_time(action["time"]) > utcnow()
