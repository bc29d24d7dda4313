"""Spot interruption end to end: a real reclaimd process, SQS (moto), kube-apiserver + kwok,
Kafka, and fake trainers speaking the checkpoint contract over HTTP."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubernetes_asyncio import client as k8s

from chaos import stack as stackenv
from chaos.harness import Harness
from chaos.trainers import Behaviour
from reclaimd.model import Notice, parse_time, rfc3339

SHORT = {"windows": {"ec2_spot_s": 20}}  # a shorter window keeps the PDB tests short


@pytest.fixture
async def h(stack: Any) -> AsyncIterator[Harness]:
    async with Harness(stackenv.load()) as harness:
        yield harness


def expected_gpu_seconds(h: Harness, event: dict[str, Any], gpus: int, names: list[str]) -> float:
    """Each rank loses gpus x (stop - the later of its last durable checkpoint and its pod's
    start): the checkpoint is the trainer's ack time if it acked durably, else the annotation
    the pod was created with (docs: a pod started after its checkpoint lost only since then)."""
    stopped = parse_time(event["ChargePeriodEnd"])
    total = 0.0
    for name in names:
        key = f"{h.namespace}/{name}"
        trainer = h.trainers.trainers.get(key)
        acked = (
            [r for r in trainer.requests if r.notice_id == event["x_NoticeId"]] if trainer else []
        )
        annotated, started = event["_pods"][name]
        last = max(acked[0].received_at if acked else parse_time(annotated), parse_time(started))
        total += gpus * (stopped - last).total_seconds()
    return total


async def checkpoint_and_start(h: Harness, names: list[str]) -> dict[str, tuple[str, str]]:
    """Each pod's last-checkpoint annotation and its start time, as the API has them."""
    out = {}
    for name in names:
        pod = await h.core.read_namespaced_pod(name, h.namespace)
        out[name] = (
            pod.metadata.annotations["reclaimd.io/last-checkpoint"],
            rfc3339(pod.status.start_time),
        )
    return out


def by_gang(events: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {e["x_GangId"].rsplit("/", 1)[-1]: e for e in events}


async def test_spot_notice_full_runbook(h: Harness) -> None:
    nodes = [h.node_spec(i) for i in range(4)]
    await h.add_nodes(nodes)
    gang = await h.add_gang("train", [n.name for n in nodes[:3]])
    solo = await h.add_gang("solo", [nodes[0].name], gpus_per_rank=2, opt_in=False)
    gang_pods = [gang.pod_name(r) for r in range(3)]
    pods = await checkpoint_and_start(h, [*gang_pods, solo.pod_name(0)])
    await h.start_daemon()

    notice = h.send_spot(nodes[0])
    events = await h.ledger_events(count=2, timeout_s=90, settle_s=2.0)
    assert notice.deadline is not None

    # claimed, tainted, cordoned
    claim = await h.wait_phase(nodes[0].name, "done")
    assert claim["notice_id"] == notice.id
    node = await h.core.read_node(nodes[0].name)
    assert node.spec.unschedulable is True
    assert any(t.key == "reclaimd.io/interruption" for t in node.spec.taints or [])
    # the healthy nodes stay schedulable
    other = await h.core.read_node(nodes[1].name)
    assert not other.spec.unschedulable

    # every rank of the gang was asked, the ones on healthy nodes too; the solo pod had no URL
    assert h.trainers.asked(notice.id) == {f"{h.namespace}/{p}" for p in gang_pods}
    for t in h.trainers:
        assert all(r.traceparent.startswith("00-") for r in t.requests)

    # every pod of both gangs is gone, before the deadline
    assert await h.pods_left([*gang_pods, solo.pod_name(0)]) == []

    # exactly one event per gang, with GPU-seconds from the known checkpoint times
    assert len(events) == 2, events
    got = by_gang(events)
    assert set(got) == {"train", "solo"}
    for e in events:
        e["_pods"] = pods
        assert e["x_DeadlineMet"] is True
        assert parse_time(e["ChargePeriodEnd"]) <= notice.deadline
        assert e["x_NoticeId"] == notice.id
    assert got["train"]["x_WastedGpuSeconds"] == pytest.approx(
        expected_gpu_seconds(h, got["train"], 8, gang_pods), abs=0.01
    )
    assert got["train"]["x_CheckpointOutcome"] == "checkpointed"
    assert got["solo"]["x_WastedGpuSeconds"] == pytest.approx(
        expected_gpu_seconds(h, got["solo"], 2, [solo.pod_name(0)]), abs=0.01
    )
    assert got["solo"]["x_WastedGpuSeconds"] > 0
    assert got["solo"]["x_CheckpointOutcome"] == "not_opted_in"
    assert h.queue_depth() == 0


async def test_duplicate_delivery_makes_no_second_event(h: Harness) -> None:
    nodes = [h.node_spec(i) for i in range(2)]
    await h.add_nodes(nodes)
    gang = await h.add_gang("dup", [n.name for n in nodes])
    await h.start_daemon()
    first = h.send_spot(nodes[0], event_id="evt-dup-1")
    second = h.send_spot(nodes[0], event_id="evt-dup-1")  # EventBridge redelivery: same id
    third = h.send_spot(nodes[1])  # another node of the same gang: no second charge either
    assert first.id == second.id != third.id
    events = await h.ledger_events(count=1, timeout_s=90, settle_s=5.0)
    assert len(events) == 1 and by_gang(events).keys() == {"dup"}
    assert await h.pods_left([gang.pod_name(0), gang.pod_name(1)]) == []
    for _ in range(50):
        if h.queue_depth() == 0:
            break
        await asyncio.sleep(0.2)
    assert h.queue_depth() == 0


async def test_message_is_deleted_only_after_the_claim(h: Harness) -> None:
    """A reclaimd that cannot write the claim (its identity may not patch nodes) must leave the
    message in the queue; a reclaimd that can, then handles it."""
    nodes = [h.node_spec(0)]
    await h.add_nodes(nodes)
    await h.add_gang("held", [nodes[0].name])
    readonly = await h.readonly_kubeconfig()
    await h.start_daemon("readonly", kube={"kubeconfig": str(readonly)})
    notice = h.send_spot(nodes[0])
    await asyncio.sleep(6)  # several receive/claim attempts
    assert await h.claim_of(nodes[0].name) is None
    assert h.queue_depth() == 1  # not deleted
    assert await h.ledger_events(count=1, timeout_s=1) == []
    await h.daemons[0].stop()

    await h.start_daemon("writer")
    events = await h.ledger_events(count=1, timeout_s=90)
    assert [e["x_NoticeId"] for e in events] == [notice.id]
    claim = await h.wait_phase(nodes[0].name, "done")
    assert claim["holder"] == h.holder("writer")


async def _pdb(h: Harness, gang_name: str) -> None:
    policy = k8s.PolicyV1Api(h.api)
    await policy.create_namespaced_pod_disruption_budget(
        h.namespace,
        {
            "metadata": {"name": f"{gang_name}-pdb"},
            "spec": {
                "maxUnavailable": 0,
                "selector": {"matchLabels": {"jobset.sigs.k8s.io/jobset-name": gang_name}},
            },
        },
    )


@pytest.mark.parametrize("policy", ["respect-pdb", "force-near-deadline"])
async def test_pdb_blocked_eviction_follows_policy(h: Harness, policy: str) -> None:
    nodes = [h.node_spec(0)]
    await h.add_nodes(nodes)
    gang = await h.add_gang("guarded", [nodes[0].name])
    await _pdb(h, "guarded")
    await h.start_daemon(
        policy={"eviction": policy, "force_before_s": 12, "delete_grace_s": 1}, **SHORT
    )
    notice = h.send_spot(nodes[0])
    events = await h.ledger_events(count=1, timeout_s=60)
    assert len(events) == 1
    assert notice.deadline is not None
    left = await h.pods_left([gang.pod_name(0)])
    if policy == "respect-pdb":
        assert left == [gang.pod_name(0)]  # the PDB was honoured to the end
        assert events[0]["x_DeadlineMet"] is False
    else:
        assert left == []  # deleted once the deadline was near
        assert events[0]["x_DeadlineMet"] is True
        assert parse_time(events[0]["ChargePeriodEnd"]) <= notice.deadline


@pytest.mark.parametrize("unknown", ["drop", "retry"])
async def test_unknown_instance_follows_policy(h: Harness, unknown: str) -> None:
    await h.start_daemon(policy={"unknown_target": unknown})
    ghost = h.node_spec(99)  # never created
    h.send_spot(ghost)
    await asyncio.sleep(5)
    if unknown == "drop":
        assert h.queue_depth() == 0
    else:
        assert h.queue_depth() == 1
    assert await h.ledger_events(count=1, timeout_s=1) == []


async def test_restart_after_claim_finishes_before_deadline(h: Harness) -> None:
    nodes = [h.node_spec(i) for i in range(2)]
    await h.add_nodes(nodes)
    slow = Behaviour(ack_latency_s=(4.0, 4.0))
    gang = await h.add_gang("resume", [n.name for n in nodes], behaviour=slow)
    d = await h.start_daemon("crashy")
    notice: Notice = h.send_spot(nodes[0])
    # The claim's one write also cordoned the node; then the trainers start saving (4 s).
    await h.wait_phase(nodes[0].name, "claimed", timeout_s=30)
    node = await k8s.CoreV1Api(h.api).read_node(nodes[0].name)
    assert node.spec.unschedulable
    d.kill()  # mid-checkpoint: the trainers are still saving
    await asyncio.sleep(0.5)
    assert await h.pods_left([gang.pod_name(0), gang.pod_name(1)]) != []
    await h.start_daemon("crashy")  # same holder: resumes its own claim
    events = await h.ledger_events(count=1, timeout_s=90, settle_s=2.0)
    assert len(events) == 1 and events[0]["x_NoticeId"] == notice.id
    assert events[0]["x_DeadlineMet"] is True
    assert await h.pods_left([gang.pod_name(0), gang.pod_name(1)]) == []
    assert (await h.wait_phase(nodes[0].name, "done"))["notice_id"] == notice.id
