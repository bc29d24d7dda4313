"""Game day, last: every drill node put back as it was before the drill (its cordon, its
taints, its claim, no run label) and the probe namespace deleted; then checked, so that
"cleaned up" is a row of the verdict. Only what reclaimd added goes: a taint the cluster put
on meanwhile (not-ready, say) stays."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from . import fleet, report
from .gameday_target import CLAIM, NodeState, state_of

CLEANUP_WAIT_S = 60.0
RECLAIMD_TAINTS = "reclaimd.io/"  # the taints reclaimd puts on a doomed node


@dataclass(frozen=True)
class Probes:
    """Where the drill made its objects: a namespace of its own (deleted whole), or one it
    was given (``--namespace``, the chart's drill Job's: only the run's objects go)."""

    namespace: str
    run_id: str
    own: bool
    pdbs: tuple[str, ...] = ()  # the gangs' PDBs (named for the gang, not labelled)
    workloads: tuple[str, ...] = ()  # the Kueue gangs' Workloads (named for the gang)

    @property
    def selector(self) -> str:
        return f"{fleet.DRILL_LABEL}={self.run_id}"


async def cleanup(
    api: Any, states: Sequence[NodeState], probes: Probes, *, say: Callable[[str], None]
) -> report.Check:
    """Every drill node as it was, the probes gone; checked, as the last row."""
    from kubernetes_asyncio import client as k8s

    core = k8s.CoreV1Api(api)
    problems: list[str] = []
    for st in states:
        try:
            now = state_of(api.sanitize_for_serialization(await core.read_node(st.name)))
            meta, spec = _restore_patches(st, now)
            await core.patch_node(st.name, meta)
            await core.patch_node(st.name, spec)
        except Exception as e:
            problems.append(f"{st.name}: {type(e).__name__}")
    await _delete_probes(api, probes)
    loop = asyncio.get_running_loop()
    end = loop.time() + CLEANUP_WAIT_S
    while loop.time() < end:
        left = await _left_over(core, states, probes)
        if not left:
            break
        await asyncio.sleep(1.0)
    problems += await _left_over(core, states, probes)
    n = len(states)
    gone = f"namespace {probes.namespace} deleted" if probes.own else "the run's probes deleted"
    say(f"cleaned up: {n} node(s) as they were, {gone}" if not problems
        else f"NOT cleaned up: {'; '.join(problems[:3])}")  # fmt: skip
    return report.Check(
        "cleaned up",
        not problems,
        f"{n} node(s) uncordoned and untainted as before, {gone}"
        if not problems
        else "; ".join(problems[:4]),
    )


async def _delete_probes(api: Any, probes: Probes) -> None:
    from kubernetes_asyncio import client as k8s

    if probes.own:
        with contextlib.suppress(Exception):
            await fleet.delete_namespace(api, probes.namespace)
        return
    core, policy = k8s.CoreV1Api(api), k8s.PolicyV1Api(api)
    with contextlib.suppress(Exception):
        await core.delete_collection_namespaced_pod(
            probes.namespace, label_selector=probes.selector, grace_period_seconds=0
        )
    for name in probes.pdbs:
        with contextlib.suppress(Exception):
            await policy.delete_namespaced_pod_disruption_budget(name, probes.namespace)
    custom = k8s.CustomObjectsApi(api)
    for name in probes.workloads:
        with contextlib.suppress(Exception):
            await custom.delete_namespaced_custom_object(
                fleet.KUEUE_GROUP, fleet.KUEUE_VERSION, probes.namespace, "workloads", name
            )


async def label(api: Any, states: Sequence[NodeState], labels: Mapping[str, str]) -> None:
    from kubernetes_asyncio import client as k8s

    core = k8s.CoreV1Api(api)
    for st in states:
        await core.patch_node(st.name, {"metadata": {"labels": dict(labels)}})


def _restore_patches(st: NodeState, now: NodeState) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Put the node back: a merge patch for its claim (none, before a drill) and the run
    label; a JSON patch for its cordon and its taints, where the taints reclaimd added go and
    every other one stays as it is now (the cluster's own may have come and gone meanwhile)."""
    meta: dict[str, Any] = {
        "metadata": {
            "labels": {fleet.DRILL_LABEL: st.labels.get(fleet.DRILL_LABEL)},
            "annotations": {CLAIM: st.claim},
        }
    }
    taints = [dict(t) for t in now.taints if not _added(t, st)]
    spec: list[dict[str, Any]] = [
        {"op": "add", "path": "/spec/unschedulable", "value": st.unschedulable},
        {"op": "add", "path": "/spec/taints", "value": taints},
    ]
    return meta, spec


def _added(taint: Mapping[str, Any], before: NodeState) -> bool:
    """A reclaimd taint the node did not have before the drill."""
    key = str(taint.get("key", ""))
    return key.startswith(RECLAIMD_TAINTS) and key not in {t.get("key") for t in before.taints}


async def _left_over(core: Any, states: Sequence[NodeState], probes: Probes) -> list[str]:
    out: list[str] = []
    for st in states:
        now = state_of(core.api_client.sanitize_for_serialization(await core.read_node(st.name)))
        if now.unschedulable != st.unschedulable:
            out.append(f"{st.name} still cordoned")
        if any(_added(t, st) for t in now.taints):
            out.append(f"{st.name} still tainted")
        if now.claim != st.claim:
            out.append(f"{st.name} still claimed")
        if now.labels.get(fleet.DRILL_LABEL) != st.labels.get(fleet.DRILL_LABEL):
            out.append(f"{st.name} still labelled")
    if probes.own:
        with contextlib.suppress(Exception):
            await core.read_namespace(probes.namespace)
            out.append(f"namespace {probes.namespace} not deleted yet")
    else:
        pods = await core.list_namespaced_pod(probes.namespace, label_selector=probes.selector)
        if pods.items:
            out.append(f"{len(pods.items)} probe pod(s) left in {probes.namespace}")
    return out
