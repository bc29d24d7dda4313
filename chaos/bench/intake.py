"""The storm bench's intake: a plain consumer's messages/s against reclaimd's received/s.

A storm bench measures reclaimd only when its intake is not the bottleneck. Each
``calibrate_*`` sends ``messages`` messages into a fresh queue, topic or subscription on the
stack and times a plain client (no reclaimd code) receiving them all; ``received_rate``
reads reclaimd's own receive rate from the replicas' root spans, so the JSON and the table
put the two side by side.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
import time
import uuid
from collections.abc import Iterable
from typing import Any

from chaos import stack as stackenv

# A plain consumer that has not had every message by then never will: the storm goes on.
GIVE_UP_S = 120.0

# The scenario sources whose intake can be calibrated, and the key each result is stored under.
CALIBRATED = {"ec2-sqs": "sqs", "kafka": "kafka", "gke-pubsub": "pubsub"}


def _say(text: str) -> None:
    print(f"bench-storm: calibrate {text}", file=sys.stderr, flush=True)


def _rate(count: int, seconds: float) -> float | None:
    return round(count / seconds, 1) if seconds > 0 else None


def received_rate(receipts: Iterable[float]) -> dict[str, Any]:
    """reclaimd's receive rate: notices received per second between its first and its last
    receipt (root span starts). Comparable with a plain loop's messages/s only when the
    sends came faster than either, which the storm's 1 s spread and the plain loop say."""
    at = sorted(receipts)
    span = at[-1] - at[0] if len(at) > 1 else 0.0
    return {
        "received": len(at),
        "first_to_last_s": round(span, 3),
        # n receipts bound n-1 intervals: the rate at which they came
        "received_per_s": round((len(at) - 1) / span, 1) if span > 0 else None,
    }


def compare(plain: dict[str, Any] | None, reclaimd: dict[str, Any]) -> dict[str, Any]:
    """The plain consumer's messages/s against reclaimd's received/s, and their ratio
    (reclaimd / plain: below 1 is reclaimd's intake slower than the transport allows)."""
    plain_rate = (plain or {}).get("received_per_s")
    ours = reclaimd.get("received_per_s")
    return {
        "plain_per_s": plain_rate,
        "reclaimd_per_s": ours,
        # three significant figures: a ratio far below 1 must not round to 0
        "reclaimd_to_plain": float(f"{ours / plain_rate:.3g}") if plain_rate and ours else None,
    }


# --- SQS (moto) -------------------------------------------------------------------------------


def calibrate_sqs(stack: stackenv.StackEnv, *, messages: int, receivers: int) -> dict[str, Any]:
    """What the stack's SQS endpoint takes: ``messages`` sent in batches of 10, then received
    (10 at a time) and deleted by ``receivers`` boto3 loops at once, reclaimd's shape
    (2 replicas x 4 receive loops)."""
    from concurrent.futures import ThreadPoolExecutor

    import boto3

    stack.export()
    sqs = boto3.client("sqs", endpoint_url=stack.aws_endpoint, region_name="us-east-2")
    url = sqs.create_queue(QueueName=f"calib-{uuid.uuid4().hex[:6]}")["QueueUrl"]
    try:
        batches = [
            [{"Id": str(j), "MessageBody": f"calibrate {i + j}"} for j in range(10)]
            for i in range(0, messages, 10)
        ]
        started = time.monotonic()
        with ThreadPoolExecutor(receivers) as pool:
            list(pool.map(lambda b: sqs.send_message_batch(QueueUrl=url, Entries=b), batches))
        sent_s = time.monotonic() - started
        total = 10 * len(batches)
        received = 0
        lock = threading.Lock()

        def receive_loop() -> None:
            nonlocal received
            while True:
                with lock:
                    if received >= total:
                        return
                got = sqs.receive_message(
                    QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1, VisibilityTimeout=60
                ).get("Messages", [])
                if got:
                    sqs.delete_message_batch(
                        QueueUrl=url,
                        Entries=[
                            {"Id": str(k), "ReceiptHandle": m["ReceiptHandle"]}
                            for k, m in enumerate(got)
                        ],
                    )
                with lock:
                    received += len(got)

        started = time.monotonic()
        with ThreadPoolExecutor(receivers) as pool:
            for f in [pool.submit(receive_loop) for _ in range(receivers)]:
                f.result()
        received_s = time.monotonic() - started
    finally:
        with contextlib.suppress(Exception):
            sqs.delete_queue(QueueUrl=url)
    rate = _rate(total, received_s)
    _say(f"SQS: {rate} received+deleted/s")
    return {
        "transport": "sqs (moto)",
        "consumer": f"{receivers} boto3 receive+delete loops",
        "messages": total,
        "receivers": receivers,
        "send_s": round(sent_s, 2),
        "received_per_s": rate,
        "all_received_s": round(received_s, 2),
    }


# --- Kafka ------------------------------------------------------------------------------------


async def calibrate_kafka(
    stack: stackenv.StackEnv, *, messages: int, partitions: int = 3
) -> dict[str, Any]:
    """``messages`` records produced (acks=all, as the drill's injector does) on a fresh topic
    of the notices topic's partitions, then read by one plain aiokafka consumer over the
    listener the replicas use: records/s from its first fetch to the last record. The
    partitions are assigned, not joined: a replica's group join happens before a storm."""
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    from reclaimd.kafkaconn import KafkaSettings, options

    # under the notices topics' prefix: User:reclaimd may read those alone (its ACLs)
    topic = f"reclaimd.notices.calib-{uuid.uuid4().hex[:6]}"
    admin = AIOKafkaAdminClient(bootstrap_servers=stack.kafka)
    await admin.start()
    try:
        await admin.create_topics(
            [NewTopic(topic, num_partitions=partitions, replication_factor=1)]
        )
        producer = AIOKafkaProducer(bootstrap_servers=stack.kafka, acks="all")
        await producer.start()
        try:
            started = time.monotonic()
            sends = [
                await producer.send(topic, f"calibrate {i}".encode(), key=str(i).encode())
                for i in range(messages)
            ]
            await asyncio.gather(*sends)
            sent_s = time.monotonic() - started
        finally:
            await producer.stop()
        listener = stack.kafka_as_reclaimd()
        settings = KafkaSettings.model_validate(listener.settings) if listener.settings else None
        consumer = AIOKafkaConsumer(
            **options(settings, listener.bootstrap), auto_offset_reset="earliest"
        )
        await consumer.start()
        try:
            consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
            received = 0
            started = time.monotonic()
            while received < messages:
                if time.monotonic() - started > GIVE_UP_S:
                    raise TimeoutError(f"{received}/{messages} records in {GIVE_UP_S:g} s")
                batch = await consumer.getmany(timeout_ms=1000, max_records=500)
                received += sum(len(records) for records in batch.values())
            received_s = time.monotonic() - started
        finally:
            await consumer.stop()
    finally:
        with contextlib.suppress(Exception):
            await admin.delete_topics([topic])
        await admin.close()
    rate = _rate(messages, received_s)
    _say(f"Kafka: {rate} records/s to one consumer over {listener.name}")
    return {
        "transport": "kafka",
        "consumer": f"one aiokafka consumer over {listener.name}, partitions assigned",
        "messages": messages,
        "partitions": partitions,
        "send_s": round(sent_s, 2),
        "received_per_s": rate,
        "all_received_s": round(received_s, 2),
    }


# --- Pub/Sub (emulator) -----------------------------------------------------------------------


def calibrate_pubsub(stack: stackenv.StackEnv, *, messages: int) -> dict[str, Any]:
    """``messages`` published on a fresh topic of the emulator, then streamed to one plain
    subscriber (streaming pull, acked on receipt): messages/s from subscribe to the last."""
    from google.cloud import pubsub_v1

    stack.export()
    project = stack["PUBSUB_PROJECT_ID"]
    publisher = pubsub_v1.PublisherClient()
    subscriber = pubsub_v1.SubscriberClient()
    name = f"calib-{uuid.uuid4().hex[:6]}"
    topic = publisher.topic_path(project, name)
    subscription = subscriber.subscription_path(project, name)
    publisher.create_topic(name=topic)
    subscriber.create_subscription(name=subscription, topic=topic, ack_deadline_seconds=10)
    try:
        started = time.monotonic()
        futures = [publisher.publish(topic, f"calibrate {i}".encode()) for i in range(messages)]
        for f in futures:
            f.result(timeout=60)
        sent_s = time.monotonic() - started
        seen: set[str] = set()
        lock = threading.Lock()
        all_in = threading.Event()

        def on_message(message: Any) -> None:
            message.ack()
            with lock:
                seen.add(message.message_id)
                if len(seen) >= messages:
                    all_in.set()

        started = time.monotonic()
        # the same flow control as reclaimd's default (max_messages 100 leased at a time)
        flow = pubsub_v1.types.FlowControl(max_messages=100)
        streaming = subscriber.subscribe(subscription, callback=on_message, flow_control=flow)
        got_all = all_in.wait(timeout=GIVE_UP_S)
        received_s = time.monotonic() - started
        streaming.cancel()
        with contextlib.suppress(Exception):
            streaming.result(timeout=10)
    finally:
        with contextlib.suppress(Exception):
            subscriber.delete_subscription(subscription=subscription)
        with contextlib.suppress(Exception):
            publisher.delete_topic(topic=topic)
        subscriber.close()
    rate = _rate(len(seen), received_s)
    _say(f"Pub/Sub: {rate} messages/s to one streaming-pull subscriber")
    return {
        "transport": "pubsub (emulator)",
        "consumer": "one streaming-pull subscriber, FlowControl(max_messages=100)",
        "messages": messages,
        "received": len(seen),
        "complete": got_all,
        "send_s": round(sent_s, 2),
        "received_per_s": rate,
        "all_received_s": round(received_s, 2),
    }


async def calibrate(
    stack: stackenv.StackEnv, sources: Iterable[str], messages: int
) -> dict[str, Any]:
    """Each calibrated transport among the scenario's ``sources``, keyed as ``CALIBRATED``. A
    calibration that fails is recorded as its error: the storm after it still counts."""
    out: dict[str, Any] = {}
    for source in sorted(set(sources)):
        key = CALIBRATED.get(source)
        try:
            if key == "sqs":
                out[key] = await asyncio.to_thread(
                    calibrate_sqs, stack, messages=messages, receivers=8
                )
            elif key == "kafka":
                out[key] = await calibrate_kafka(stack, messages=messages)
            elif key == "pubsub":
                out[key] = await asyncio.to_thread(calibrate_pubsub, stack, messages=messages)
        except Exception as e:
            _say(f"{key}: failed: {type(e).__name__}: {e}")
            out[str(key)] = {"transport": key, "error": f"{type(e).__name__}: {e}"}
    return out
