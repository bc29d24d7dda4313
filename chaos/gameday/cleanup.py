"""Game day, last: every drill node put back in service as it was before the drill (its
cordon, its taints, no run label) and the probe namespace deleted; then checked, so that
"cleaned up" is a row of the verdict. Only what reclaimd added goes: a taint the cluster put
on meanwhile (not-ready, say) stays.

The release's finished claim stays on the node: it is reclaimd's record that the drill's
notice was handled, and what makes a late copy of it (a Pub/Sub redelivery, a slot's seek back
after a replica changed) a duplicate instead of a new cordon of the node put back. A finished
claim holds nothing: the next notice for the node claims it (``claims.decide``)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from chaos import fleet
from chaos.drill.verdict.model import Check
from chaos.gameday.target import CLAIM, NodeState, finished, state_of

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
    api: Any,
    states: Sequence[NodeState],
    probes: Probes,
    *,
    settle_s: float,
    say: Callable[[str], None],
) -> Check:
    """Every drill node as it was, the probes gone; checked, as the last row.

    The release is let finish its claims first (a node put back under an open claim would
    be cordoned again by its holder's resume); after putting the nodes back, they are
    watched ``settle_s`` (a Pub/Sub lease, a slot's seek back): a node cordoned or claimed
    anew then is a problem of the release, and the row says so."""
    from kubernetes_asyncio import client as k8s

    core = k8s.CoreV1Api(api)
    await _delete_probes(api, probes)
    await _until(functools.partial(_not_done, api, core, states), CLEANUP_WAIT_S)
    problems = await _put_back(api, core, states)
    await _until(lambda: _nodes_left(core, states), CLEANUP_WAIT_S)
    claims = {st.name: (await _state(api, core, st.name)).claim for st in states}
    await asyncio.sleep(settle_s)
    for st in states:
        if (await _state(api, core, st.name)).claim != claims[st.name]:
            problems.append(f"{st.name} claimed again after it was put back")
    await _until(lambda: _probes_left(core, probes), CLEANUP_WAIT_S)
    problems += await _nodes_left(core, states) + await _probes_left(core, probes)
    n = len(states)
    gone = f"namespace {probes.namespace} deleted" if probes.own else "the run's probes deleted"
    say(f"cleaned up: {n} node(s) as they were, {gone}" if not problems
        else f"NOT cleaned up: {'; '.join(problems[:3])}")  # fmt: skip
    return Check(
        "cleaned up",
        not problems,
        f"{n} node(s) uncordoned and untainted as before, {gone}"
        if not problems
        else "; ".join(problems[:4]),
    )


async def _put_back(api: Any, core: Any, states: Sequence[NodeState]) -> list[str]:
    problems: list[str] = []
    for st in states:
        try:
            meta, spec = _restore_patches(st, await _state(api, core, st.name))
            await core.patch_node(st.name, meta)
            await core.patch_node(st.name, spec)
        except Exception as e:
            problems.append(f"{st.name}: {type(e).__name__}")
    return problems


async def _state(api: Any, core: Any, name: str) -> NodeState:
    return state_of(api.sanitize_for_serialization(await core.read_node(name)))


async def _until(left: Callable[[], Awaitable[list[str]]], timeout_s: float) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout_s
    while loop.time() < end:
        if not await left():
            return
        await asyncio.sleep(1.0)  # the apiserver polled: nothing here to wait on instead


async def _not_done(api: Any, core: Any, states: Sequence[NodeState]) -> list[str]:
    """The nodes whose drill claim the release has not finished with yet."""
    out = []
    for st in states:
        claim = (await _state(api, core, st.name)).claim
        if claim != st.claim and not finished(claim):
            out.append(st.name)
    return out


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
    """Put the node back: a merge patch for its run label (and its claim as before the drill,
    unless the release finished one: that stays, see the module doc); a JSON patch for its
    cordon and its taints, where the taints reclaimd added go and
    every other one stays as it is now (the cluster's own may have come and gone meanwhile)."""
    meta: dict[str, Any] = {
        "metadata": {
            "labels": {fleet.DRILL_LABEL: st.labels.get(fleet.DRILL_LABEL)},
            "annotations": {CLAIM: now.claim if finished(now.claim) else st.claim},
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


async def _nodes_left(core: Any, states: Sequence[NodeState]) -> list[str]:
    out: list[str] = []
    for st in states:
        now = await _state(core.api_client, core, st.name)
        if now.unschedulable != st.unschedulable:
            out.append(f"{st.name} still cordoned")
        if any(_added(t, st) for t in now.taints):
            out.append(f"{st.name} still tainted")
        if now.claim != st.claim and not finished(now.claim):
            out.append(f"{st.name} still claimed")
        if now.labels.get(fleet.DRILL_LABEL) != st.labels.get(fleet.DRILL_LABEL):
            out.append(f"{st.name} still labelled")
    return out


async def _probes_left(core: Any, probes: Probes) -> list[str]:
    if probes.own:
        with contextlib.suppress(Exception):
            await core.read_namespace(probes.namespace)
            return [f"namespace {probes.namespace} not deleted yet"]
        return []
    pods = await core.list_namespaced_pod(probes.namespace, label_selector=probes.selector)
    return [f"{len(pods.items)} probe pod(s) left in {probes.namespace}"] if pods.items else []
