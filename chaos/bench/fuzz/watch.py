"""``make bench-fuzz`` watching its daemon: the real notices claimed, RSS sampled, the transports
drained, the metrics scraped, the stop on SIGTERM and what is left on each transport."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from chaos.bench.fuzz.common import KUEUE, TRANSPORTS, RealNotice, progress
from reclaimd import handlers
from reclaimd.model import utcnow

if TYPE_CHECKING:
    from chaos.bench.fuzz.run import FuzzRun


async def until(run: FuzzRun, done: Callable[[], bool], what: str, timeout_s: float = 900) -> None:
    end = time.monotonic() + timeout_s
    last = 0.0
    while not done():
        check_alive(run)
        if time.monotonic() > end:
            raise TimeoutError(f"{what}: not done after {timeout_s:.0f} s")
        if time.monotonic() - last > 15:
            last = time.monotonic()
            served = {k: v.hostile for k, v in run.state.served.items()} if run.state else {}
            progress(f"{what}: waiting (served {served})")
        await asyncio.sleep(0.2)


# -- checks --


def expect(
    run: FuzzRun, transport: str, source: str, payload: bytes, name: str, *, kind: str = "node"
) -> None:
    outcome = handlers.parse(source, payload, received_at=utcnow())
    assert isinstance(outcome, tuple) and len(outcome) == 1, outcome
    run.reals.append(
        RealNotice(
            transport,
            outcome[0].id,
            kind,
            name,
            run.h.namespace if kind == "workload" else "",
            sent_at=time.monotonic(),
        )
    )


async def watch_reals(run: FuzzRun) -> None:
    from kubernetes_asyncio import client as k8s

    from reclaimd.cluster.claims import CLAIM_ANNOTATION

    assert run.h.api is not None
    core, co = k8s.CoreV1Api(run.h.api), k8s.CustomObjectsApi(run.h.api)
    while True:
        for real in run.reals:
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


async def sample(run: FuzzRun, pid: int) -> None:
    while True:
        rss = rss_mib(pid)
        if rss is not None:
            run.rss.append((round(time.monotonic() - run.started, 1), rss))
        await asyncio.sleep(1.0)


def rss_now(run: FuzzRun) -> float | None:
    return run.rss[-1][1] if run.rss else None


def check_alive(run: FuzzRun) -> None:
    proc = run.daemon.proc
    if proc is not None and proc.returncode is not None and run.crashed is None:
        run.crashed = proc.returncode
        raise RuntimeError(f"reclaimd exited {proc.returncode}: {run.daemon.tail()}")


async def drain(run: FuzzRun, timeout_s: float = 240) -> dict[str, Any]:
    """Wait until the queues are empty, the group has committed everything and every real
    notice is claimed (or the timeout)."""
    end = time.monotonic() + timeout_s
    state: dict[str, Any] = {}
    while time.monotonic() < end:
        check_alive(run)
        state = {
            "sqs_depth": await asyncio.to_thread(run.h.queue_depth),
            "kafka_lag": await kafka_lag(run),
            "unclaimed": sum(r.claimed_after_s is None for r in run.reals),
        }
        if not any(state.values()):
            break
        progress(f"draining: {state}")
        await asyncio.sleep(3)
    return state


async def kafka_lag(run: FuzzRun) -> int:
    """Records on the notices topic the daemon's group has not committed; -1 while Kafka
    cannot be asked (the shared stack's Kafka may be restarting)."""
    from aiokafka.errors import KafkaError

    for _ in range(10):
        try:
            return await kafka_lag_once(run)
        except (KafkaError, OSError) as e:
            progress(f"kafka lag: {type(e).__name__}; asking again")
            await asyncio.sleep(3)
    return -1


async def kafka_lag_once(run: FuzzRun) -> int:
    from aiokafka import AIOKafkaConsumer, TopicPartition
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=run.stack.kafka)
    consumer = AIOKafkaConsumer(bootstrap_servers=run.stack.kafka)
    await admin.start()
    await consumer.start()
    try:
        committed = await admin.list_consumer_group_offsets(run.group)
        tp = TopicPartition(run.notices_topic, 0)
        end = (await consumer.end_offsets([tp]))[tp]
        got = committed.get(tp)
        return int(end - (got.offset if got is not None and got.offset >= 0 else 0))
    finally:
        await consumer.stop()
        await admin.close()


async def scrape(run: FuzzRun) -> dict[str, dict[str, float]]:
    from chaos.harness import scrape

    counted: dict[str, dict[str, float]] = {t: {} for t in TRANSPORTS}
    prefix = "reclaimd_transport_"
    for sample in await scrape(run.metrics_port):
        transport = sample.labels.get("transport")
        if not sample.name.startswith(prefix) or transport not in counted:
            continue
        key = sample.name[len(prefix) :].removesuffix("_total")
        if "admission" in sample.labels:
            key = f"admission_{sample.labels['admission']}"
        counted[transport][key] = counted[transport].get(key, 0) + sample.value
    return counted


async def stop(run: FuzzRun, daemon: Any) -> int | None:
    check_alive(run)
    await daemon.stop()
    run.h.daemons.remove(daemon)
    return daemon.proc.returncode if daemon.proc is not None else None


async def leftovers(run: FuzzRun) -> dict[str, int]:
    """What the transports still hold once the daemon is gone and every lease expired."""
    await asyncio.sleep(12)  # SQS visibility (10 s) and the Pub/Sub ack deadline (10 s)
    sqs = await asyncio.to_thread(run.h.queue_depth)

    def pull() -> int:
        from google.api_core import exceptions

        try:
            reply = run.channel.subscriber.pull(
                subscription=run.channel.subscription, max_messages=100, timeout=10
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
        "kafka_notices": await kafka_lag(run),
    }


def rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None
