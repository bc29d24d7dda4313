"""Game day, before anything is sent: the deployed release and the drill's nodes.

- **The release** (``discover``): found by its Helm instance label in its namespace; its own
  settings are its ConfigMap's ``config.yaml`` (the SQS queue, the ledger topic, the windows),
  with ``--set`` overrides for what the chart keeps in Secrets (a broker address), which a
  drill never reads.
- **The blast radius** (``bind``): only nodes that carry the drill label, never more than
  ``--max-nodes``, each matched to a node the scenario plans (same cloud and purchase option)
  and refused when it is cordoned, tainted or claimed already, runs a pod the drill did not
  make (a game day drains every pod of its nodes), or runs the release itself.
- **What each node was** (``NodeState``): its cordon, taints, claim and labels before the
  drill, which the clean-up puts back and then checks.

Every refusal is a ``GameDayError``: one line, exit status 2, nothing changed.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from reclaimd import config as rconfig
from reclaimd.ledger.labels import cost_labels
from reclaimd.model import ParseError

from .scenario import Plan, PlannedNode, Source

INSTANCE = "app.kubernetes.io/instance"
NAME = "app.kubernetes.io/name"
CLAIM = "reclaimd.io/claim"
# The sources a game day injects today; the others are refused by name (docs/drills.md).
SUPPORTED = frozenset({Source.EC2_SQS, Source.GKE_PUBSUB, Source.KUEUE, Source.KAFKA})


class GameDayError(Exception):
    """A game day that must not start: one line, exit status 2."""


@dataclass(frozen=True)
class Release:
    name: str
    namespace: str
    settings: rconfig.Settings
    pods: tuple[str, ...]  # its controller pods, by name
    nodes: frozenset[str]  # where its pods run
    dry_run: bool  # the release runs reclaimd's own dry run (--dry-run in its args)

    def enabled(self) -> frozenset[Source]:
        s = self.settings
        on = {
            Source.EC2_SQS: s.sqs.enabled,
            Source.GKE_PUBSUB: s.pubsub.enabled,
            Source.KAFKA: s.kafka_notices.enabled,
            Source.KUEUE: s.kueue.enabled,
        }
        return frozenset(k for k, v in on.items() if v)


@dataclass(frozen=True)
class NodeState:
    """A drill node before the drill: what the clean-up restores."""

    name: str
    unschedulable: bool
    taints: tuple[Mapping[str, Any], ...]
    claim: str | None
    labels: Mapping[str, str]


async def discover(
    api: Any, release: str, namespace: str, overrides: Mapping[str, str] = {}
) -> Release:
    """The release ``release`` in ``namespace``: its settings and where its pods run."""
    from kubernetes_asyncio import client as k8s

    selector = f"{INSTANCE}={release},{NAME}=reclaimd"
    core, apps = k8s.CoreV1Api(api), k8s.AppsV1Api(api)
    deployments = (await apps.list_namespaced_deployment(namespace, label_selector=selector)).items
    if not deployments:
        raise GameDayError(f"no reclaimd release {release!r} in namespace {namespace!r}")
    deployment = deployments[0]
    volumes = deployment.spec.template.spec.volumes or []
    cm_name = next((v.config_map.name for v in volumes if v.config_map is not None), None)
    if cm_name is None:
        raise GameDayError(f"release {release!r}: its Deployment mounts no ConfigMap")
    cm = await core.read_namespaced_config_map(cm_name, namespace)
    text = (cm.data or {}).get("config.yaml", "")
    data = yaml.safe_load(text) or {}
    if not isinstance(data, dict):
        raise GameDayError(f"ConfigMap {cm_name}: config.yaml is not a mapping")
    for key, value in overrides.items():
        _set(data, key, value)
    try:
        settings = rconfig.Settings.model_validate(data)
    except Exception as e:  # pydantic's message, on one line
        raise GameDayError(f"release {release!r}: its config does not load: {_line(e)}") from None
    args = [a for c in deployment.spec.template.spec.containers for a in (c.args or [])]
    pods = await core.list_namespaced_pod(
        namespace, label_selector=f"{selector},app.kubernetes.io/component=controller"
    )
    live = [p for p in pods.items if p.metadata.deletion_timestamp is None]
    return Release(
        name=release,
        namespace=namespace,
        settings=settings,
        pods=tuple(sorted(p.metadata.name for p in live)),
        nodes=frozenset(p.spec.node_name for p in live if p.spec.node_name),
        dry_run="--dry-run" in args,
    )


def check_sources(plan: Plan, release: Release, namespace: str) -> None:
    """Refuse a scenario that needs a source the game day cannot inject or the release off.
    ``namespace``: the probes' ("" until the drill names its own)."""
    s, sources = release.settings, plan.sources()
    for source in sorted(sources, key=str):
        if source not in SUPPORTED:
            named = ", ".join(sorted(str(x) for x in SUPPORTED))
            raise GameDayError(f"game day: {source} notices are not supported yet (only {named})")
        if source not in release.enabled():
            raise GameDayError(f"release {release.name!r} does not consume {source}")
    if Source.EC2_SQS in sources and not s.sqs.queue_url:
        raise GameDayError(f"release {release.name!r} has no sqs.queue_url")
    if Source.GKE_PUBSUB in sources and not (s.pubsub.project and s.pubsub.subscription):
        raise GameDayError(f"release {release.name!r} has no pubsub.project and subscription")
    if Source.KAFKA in sources and not s.kafka_notices.bootstrap:
        raise GameDayError(
            "the release's kafka_notices.bootstrap is not in its ConfigMap (a Secret?): pass"
            " --set kafka_notices.bootstrap=HOST:PORT"
        )
    watched = s.kueue.namespaces
    if Source.KUEUE in sources and watched and namespace not in watched:
        raise GameDayError(
            f"release {release.name!r} watches Kueue Workloads in {', '.join(watched)} only:"
            " pass one of them as --namespace"
        )
    if not release.settings.ledger.bootstrap:
        raise GameDayError(
            "the release's ledger.bootstrap is not in its ConfigMap (a Secret?): pass"
            " --set ledger.bootstrap=HOST:PORT"
        )
    if plan.scenario.faults:
        raise GameDayError("game day: scenario faults are not supported yet")
    if plan.scenario.reclaimd.settings:
        raise GameDayError("game day: the release's settings are its own (no reclaimd: overrides)")


def bind(
    plan: Plan,
    nodes: Sequence[Mapping[str, Any]],
    pods_on: Mapping[str, Sequence[str]],
    *,
    label: str,
    max_nodes: int,
    release: Release,
) -> tuple[Plan, list[NodeState]]:
    """The plan on the real drill nodes (``nodes``: those that carry ``label``, as JSON),
    and each one's state before the drill. ``pods_on``: the pods (ns/name) on each node that
    no DaemonSet owns."""
    need = len(plan.nodes)
    if need > max_nodes:
        raise GameDayError(f"the scenario needs {need} nodes; --max-nodes is {max_nodes}")
    free: dict[tuple[str, str], list[Mapping[str, Any]]] = defaultdict(list)
    for n in sorted(nodes, key=lambda n: str(n["metadata"]["name"])):
        name = str(n["metadata"]["name"])
        why = _unfit(n, pods_on.get(name, ()), release)
        if why:
            raise GameDayError(f"node {name} carries {label} but {why}: not a drill target")
        free[(_cloud(n), _purchase(n))].append(n)
    bound: list[PlannedNode] = []
    states: list[NodeState] = []
    for p in plan.nodes:
        pool = free[(p.cloud.value, p.purchase_option)]
        if not pool:
            kind = (p.cloud.value, p.purchase_option)
            want = sum(1 for q in plan.nodes if (q.cloud.value, q.purchase_option) == kind)
            have = sum(1 for n in nodes if (_cloud(n), _purchase(n)) == kind)
            raise GameDayError(
                f"the scenario needs {want} {p.cloud.value} {p.purchase_option} node(s);"
                f" {have} carry {label}"
            )
        real = pool.pop(0)
        bound.append(_as_planned(p, real))
        states.append(state_of(real))
    windows = release.settings.windows
    return dataclasses.replace(plan, nodes=tuple(bound), windows=windows), states


def state_of(node: Mapping[str, Any]) -> NodeState:
    meta, spec = node["metadata"], node.get("spec") or {}
    return NodeState(
        name=str(meta["name"]),
        unschedulable=bool(spec.get("unschedulable")),
        taints=tuple(spec.get("taints") or ()),
        claim=(meta.get("annotations") or {}).get(CLAIM),
        labels=dict(meta.get("labels") or {}),
    )


# --- helpers ---------------------------------------------------------------------------------


def finished(claim: str | None) -> bool:
    """A claim the release is done with (an earlier drill's, a real notice's): a record that
    holds the node for nothing."""
    from reclaimd.cluster.claims import Claim, NodeObj, Phase

    if not claim:
        return False
    try:
        return Claim.from_json(NodeObj(""), claim).phase is Phase.DONE
    except ParseError:
        return False


def _unfit(node: Mapping[str, Any], pods: Sequence[str], release: Release) -> str:
    st = state_of(node)
    if st.unschedulable:
        return "is cordoned"
    if any(str(t.get("key", "")).startswith("reclaimd.io/") for t in st.taints):
        return "has a reclaimd taint"
    if st.claim and not finished(st.claim):
        return "is claimed"
    if st.name in release.nodes:
        return "runs the release itself"
    if pods:
        return f"runs {len(pods)} pod(s) a game day would drain ({', '.join(pods[:2])})"
    return ""


def _cloud(node: Mapping[str, Any]) -> str:
    provider = str((node.get("spec") or {}).get("providerID") or "")
    return provider.split("://", 1)[0] if "://" in provider else ""


def _purchase(node: Mapping[str, Any]) -> str:
    """The purchase option the ledger would record for the node (``ledger.cost_labels``)."""
    labels = node["metadata"].get("labels") or {}
    return cost_labels({}, labels).get("purchase_option", "on_demand")


def _as_planned(p: PlannedNode, node: Mapping[str, Any]) -> PlannedNode:
    meta = node["metadata"]
    labels = meta.get("labels") or {}
    provider = str((node.get("spec") or {}).get("providerID") or "")
    parts = provider.split("://", 1)[1].strip("/").split("/") if "://" in provider else []
    gpus = int(((node.get("status") or {}).get("allocatable") or {}).get("nvidia.com/gpu", 0))
    return dataclasses.replace(
        p,
        name=str(meta["name"]),
        instance_id=parts[-1] if parts else str(meta["name"]),
        zone=str(labels.get("topology.kubernetes.io/zone", p.zone)),
        gpus=gpus or p.gpus,
        sku=str(labels.get("node.kubernetes.io/instance-type", p.sku)),
        project=parts[0] if p.cloud.value == "gce" and len(parts) == 3 else p.project,
    )


def _set(data: dict[str, Any], dotted: str, raw: str) -> None:
    """``--set ledger.bootstrap=HOST:PORT``: the setting's own override, as the chart's
    ``secretEnv`` would set ``RECLAIMD_LEDGER__BOOTSTRAP`` (``reclaimd.config.overlay``)."""
    if dotted.split(".", 1)[0] not in rconfig.Settings.model_fields:
        raise GameDayError(f"--set {dotted}: no such setting")
    env = {rconfig.ENV_PREFIX + dotted.upper().replace(".", "__"): raw}
    try:
        rconfig.overlay(data, env)
    except rconfig.ConfigError as e:
        raise GameDayError(f"--set {dotted}: {e}") from None


def _line(e: Exception) -> str:
    return " ".join(str(e).split())[:300]
