"""Game day: the Kubernetes Events the release recorded, judged. An operator watches them
(``kubectl get events -A --field-selector reason=Interrupted``), so a game day checks that
every notice left its Events, written under the release's own controller name: a node's
notice ``Interrupted`` on its node (node Events live in ``default``), a Kueue reclaim (no node
of its own) ``CheckpointRequested`` on a pod of its gang."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from chaos.drill.verdict.facts import NoticeFacts
from chaos.drill.verdict.model import Check
from reclaimd.cluster.events import CONTROLLER, NODE_EVENT_NAMESPACE, Reason


async def events_check(
    api: Any, sent: Sequence[NoticeFacts], namespace: str, since: datetime
) -> Check:
    from kubernetes_asyncio import client as k8s

    events = k8s.EventsV1Api(api)
    nodes = await _regarding(events, NODE_EVENT_NAMESPACE, Reason.INTERRUPTED, since)
    pods = await _regarding(events, namespace, Reason.CHECKPOINT_REQUESTED, since)
    missing = [n.label for n in sent if not _recorded(n, nodes, pods)]
    return Check(
        "Kubernetes Events recorded",
        not missing,
        f"every notice's Events found ({len(sent)})"
        if not missing
        else f"no Event for {', '.join(missing[:4])}",
    )


async def _regarding(events: Any, namespace: str, reason: str, since: datetime) -> set[str]:
    """What the release's Events of ``reason`` since ``since`` are about: node names, or
    ``namespace/pod``."""
    listed = await events.list_namespaced_event(namespace, field_selector=f"reason={reason}")
    out: set[str] = set()
    for e in listed.items:
        at = e.event_time or e.metadata.creation_timestamp
        if e.reporting_controller == CONTROLLER and at is not None and at >= since:
            r = e.regarding
            out.add(r.name if r.kind == "Node" else f"{r.namespace}/{r.name}")
    return out


def _recorded(n: NoticeFacts, nodes: set[str], pods: set[str]) -> bool:
    if "/" not in n.claim_key:  # a node's notice: its node's Event
        return n.claim_key in nodes
    return any(p.startswith(n.claim_key + "-") for p in pods)  # a pod of the gang
