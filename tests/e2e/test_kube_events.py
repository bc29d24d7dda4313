"""EventRecorder on the real API server, with the chart's RBAC (user ``reclaimd``): the Events an
operator's ``kubectl get events -A --field-selector reason=Interrupted`` shows, and a repeat
that becomes a series instead of a second object."""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubernetes_asyncio import client as k8s
from stack import Stack

from chaos import fleet, kube
from chaos.harness import RBAC
from reclaimd.cluster.apiserver import ApiServer
from reclaimd.cluster.connect import build_api_client
from reclaimd.cluster.events import EventRecorder, Reason, Regarding, notice_note
from reclaimd.cluster.ratelimit import RateLimiter
from reclaimd.settings.events import EventSettings

RUN = uuid.uuid4().hex[:6]
NODE = fleet.NodeSpec(f"rd-events-{RUN}", f"i-ev{RUN}")
NS = f"rd-events-{RUN}"


@pytest.fixture
async def as_reclaimd(stack: Stack, kube: k8s.ApiClient) -> AsyncIterator[ApiServer]:
    await kube_apply_rbac(kube)
    await fleet.create_nodes(kube, [NODE])
    await fleet.ensure_namespace(kube, NS)
    api = await build_api_client(str(stack.reclaimd_kubeconfig))
    yield api
    await api.close()
    await fleet.delete_nodes(kube, [NODE.name])
    await fleet.delete_namespace(kube, NS)


async def kube_apply_rbac(api: k8s.ApiClient) -> None:
    await kube.apply_file(api, RBAC)


def kubectl_events(stack: Stack, selector: str) -> list[dict[str, Any]]:
    out = subprocess.run(
        [
            "kubectl",
            f"--kubeconfig={stack.kubeconfig}",
            "get",
            "events",
            "-A",
            "--field-selector",
            selector,
            "-o",
            "json",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    items: list[dict[str, Any]] = json.loads(out)["items"]
    return items


async def test_interrupted_on_node_and_pod_visible_to_kubectl(
    stack: Stack, kube: k8s.ApiClient, as_reclaimd: ApiServer
) -> None:
    node = await k8s.CoreV1Api(kube).read_node(NODE.name)
    rec = EventRecorder(as_reclaimd, RateLimiter(), instance=f"reclaimd-e2e-{RUN}")
    rec.start()
    deadline = datetime.now(UTC) + timedelta(minutes=2)
    note = notice_note("ec2", "spot-interruption", f"msg-{RUN}", deadline)
    assert rec.record(Regarding.node(NODE.name, node.metadata.uid), Reason.INTERRUPTED, note)
    assert rec.record(Regarding.pod(NS, "trainer-0"), Reason.CHECKPOINT_REQUESTED, "rank 0")
    await rec.drain()
    await rec.close()
    assert rec.emitted == 2, rec.dropped

    # The operator's view: core/v1 Events through kubectl, by reason and object.
    (seen,) = kubectl_events(stack, f"reason=Interrupted,involvedObject.name={NODE.name}")
    assert seen["involvedObject"]["kind"] == "Node"
    assert seen["involvedObject"]["uid"] == node.metadata.uid
    assert seen["type"] == "Warning"
    assert seen["reportingComponent"] == "reclaimd.io/reclaimd"
    assert seen["message"] == note
    (on_pod,) = kubectl_events(stack, f"reason=CheckpointRequested,involvedObject.namespace={NS}")
    assert on_pod["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": "trainer-0",
        "namespace": NS,
    }
    # And through events.k8s.io/v1, the API reclaimd writes.
    listed = await k8s.EventsV1Api(kube).list_event_for_all_namespaces(
        field_selector="reason=Interrupted"
    )
    ours = [e for e in listed.items if e.regarding.name == NODE.name]
    assert len(ours) == 1
    assert ours[0].action == "Claim"
    assert ours[0].reporting_instance == f"reclaimd-e2e-{RUN}"


async def test_a_repeat_is_a_series_on_the_same_event(
    stack: Stack, kube: k8s.ApiClient, as_reclaimd: ApiServer
) -> None:
    rec = EventRecorder(
        as_reclaimd,
        RateLimiter(),
        instance="reclaimd-e2e",
        settings=EventSettings.model_construct(series_flush_s=0.0),  # at once: no config may
    )
    rec.start()
    regarding = Regarding.node(NODE.name)
    for _ in range(3):
        rec.record(regarding, Reason.CORDONED, f"cordoned for msg-{RUN}")
        await rec.drain()
    await rec.close()
    assert rec.dropped == {}
    listed = await k8s.EventsV1Api(kube).list_namespaced_event(
        "default", field_selector="reason=Cordoned"
    )
    ours = [e for e in listed.items if e.regarding.name == NODE.name]
    assert len(ours) == 1
    assert ours[0].series.count == 3
