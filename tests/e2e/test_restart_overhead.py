"""Restart overhead end to end: a gang charged by a Spot notice comes back on other nodes, and
a real reclaimd writes one ``reclaimd.restart-overhead/v1`` event, measured to its new pods
Ready (kube-apiserver + kwok, SQS on moto, Kafka)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubernetes_asyncio import client as k8s

from chaos import fleet
from chaos import stack as stackenv
from chaos.harness import Harness
from chaos.ports import free_port
from reclaimd import restarts
from reclaimd.cluster.gangclaims import RESTART_ANNOTATION, lease_name
from reclaimd.model import Gang, GangKey, parse_time
from reclaimd_trainer.signal import Signal


@pytest.fixture
async def h(stack: Any) -> AsyncIterator[Harness]:
    async with Harness(stackenv.load()) as harness:
        yield harness


LOOKS = "reclaimd_restart_looks_total"
RECORDED = "reclaimd_restart_overhead_events_total"


async def nothing_after_two_looks(h: Harness, port: int) -> None:
    """Once the restart watcher has finished two more looks than now, the second of which began
    after this call (the first may have been under way), it has recorded nothing."""
    looks = await h.metric(port, LOOKS)
    await h.until_metric(port, LOOKS, looks + 2)
    assert await h.metric(port, RECORDED) == 0


async def ready_times(h: Harness, names: list[str]) -> dict[str, Any]:
    out = {}
    for name in names:
        pod = await h.core.read_namespaced_pod(name, h.namespace)
        ready = [c for c in pod.status.conditions or () if c.type == "Ready"]
        assert ready and ready[0].status == "True", (name, pod.status.conditions)
        out[name] = (pod.spec.node_name, ready[0].last_transition_time)
    return out


async def test_a_gang_that_comes_back_is_charged_its_restart_once(h: Harness) -> None:
    nodes = [h.node_spec(i) for i in range(4)]
    await h.add_nodes(nodes)
    gang = await h.add_gang("train", [nodes[0].name, nodes[1].name])
    port = free_port()
    await h.start_daemon(restarts={"interval_s": 0.5}, metrics_port=port)

    h.send_spot(nodes[0])
    (waste,) = await h.ledger_events(count=1, timeout_s=90, settle_s=1.0)
    assert await h.pods_left([gang.pod_name(0), gang.pod_name(1)]) == []
    # nothing comes back, nothing is charged for a restart
    await nothing_after_two_looks(h, port)

    # the job's controller makes the gang again, on the healthy nodes: new pods, new uids
    back = await h.add_gang("train", [nodes[2].name, nodes[3].name], opt_in=False)
    names = [back.pod_name(0), back.pod_name(1)]
    ready = await ready_times(h, names)
    events = await h.ledger_events(count=1, timeout_s=60, settle_s=3.0, schema=restarts.SCHEMA)
    assert len(events) == 1, events  # ticks after the first find the Lease marked
    (ev,) = events
    assert ev["x_RestartOverheadSource"] == restarts.PODS_READY
    assert ev["x_WasteEventId"] == waste["EventId"] and ev["x_GangId"] == waste["x_GangId"]
    received = parse_time(waste["x_NoticeReceivedAt"])
    last_ready = max(t for _, t in ready.values())
    assert ev["x_RestartOverheadSeconds"] == pytest.approx(
        (last_ready - received).total_seconds(), abs=0.002
    )
    # both rounded to the ms: 16 GPUs x half a ms apart at most
    assert ev["x_RestartOverheadGpuSeconds"] == pytest.approx(
        16 * ev["x_RestartOverheadSeconds"], abs=0.01
    )
    # split where the replacement runs, on those nodes' instances
    parts = {p["x_K8sNodeName"]: p for p in ev["x_RestartOverheadByInstance"]}
    assert set(parts) == {nodes[2].name, nodes[3].name}
    for spec in nodes[2:]:
        assert parts[spec.name]["ResourceId"] == spec.instance_id
        assert parts[spec.name]["x_GpuCount"] == 8
    assert ev["Tags"]["tenant"] == "team-a"

    # the gang's Lease carries the mark: no replica measures this restart again
    kind, rest = waste["x_GangId"].split(":", 1)
    key = GangKey(kind, *rest.split("/", 1))
    coord = k8s.CoordinationV1Api(h.api)
    lease = await coord.read_namespaced_lease(lease_name(Gang(key, ())), "reclaimd")
    assert lease.metadata.annotations[RESTART_ANNOTATION] == ev["EventId"]


async def test_ranks_of_the_trainer_sdk_end_the_restart_at_their_first_step(h: Harness) -> None:
    nodes = [h.node_spec(i) for i in range(4)]
    await h.add_nodes(nodes)
    gang = await h.add_gang("sdk", [nodes[0].name, nodes[1].name])
    port = free_port()
    await h.start_daemon(restarts={"interval_s": 0.5}, metrics_port=port)
    h.send_spot(nodes[0])
    (waste,) = await h.ledger_events(count=1, timeout_s=90, settle_s=1.0)
    assert await h.pods_left([gang.pod_name(0), gang.pod_name(1)]) == []

    # the replacement's ranks serve the SDK's Signal (restoring: no step yet)
    with Signal(host="127.0.0.1", port=0) as a, Signal(host="127.0.0.1", port=0) as b:
        back = fleet.GangSpec(
            name="sdk",
            ranks=[fleet.RankSpec(nodes[2].name, a.url), fleet.RankSpec(nodes[3].name, b.url)],
        )
        names = await fleet.create_gang(h.api, back, h.namespace)
        await fleet.wait_running(h.api, h.namespace, names)
        await ready_times(h, names)
        # Ready, but the ranks are still restoring: not over yet
        await nothing_after_two_looks(h, port)
        assert a.requested is False  # rank 0's first step boundary
        await asyncio.sleep(0.3)
        assert b.requested is False  # rank 1's, the last
        events = await h.ledger_events(count=1, timeout_s=30, settle_s=2.0, schema=restarts.SCHEMA)
    assert len(events) == 1, events
    (ev,) = events
    assert ev["x_RestartOverheadSource"] == restarts.SDK_FIRST_STEP
    assert b.first_step_at is not None
    assert parse_time(ev["x_RestartedAt"]) == b.first_step_at  # the last rank's first step
    received = parse_time(waste["x_NoticeReceivedAt"])
    assert ev["x_RestartOverheadSeconds"] == pytest.approx(
        (b.first_step_at - received).total_seconds(), abs=0.002
    )
