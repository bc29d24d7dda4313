"""Karpenter or aws-node-termination-handler acting on the same Spot warnings (read at start).

Both drain a node the moment a Spot warning reaches them, spending the two minutes reclaimd
needs for checkpoints, and NTH in queue mode on reclaimd's own queue takes half its messages
(SQS hands each message to one consumer). docs/peers.md says how to run beside them; this
module finds the cases that can be seen from the cluster and says so once, at start.

What is read: the peers' workloads where their charts put them, by name
(``WELL_KNOWN``: Karpenter's Deployment ``karpenter`` in ``kube-system`` or ``karpenter``,
NTH's Deployment (queue mode) or DaemonSet (IMDS mode) ``aws-node-termination-handler`` in
``kube-system``), with ``get`` only: the chart grants get on those two names and nothing else
of apps/v1, so reclaimd never lists or reads anyone else's Deployments. A peer installed under
another name or namespace is not seen (the docs say how to check by hand). The queue they use
is read from their containers' env and args (Karpenter ``INTERRUPTION_QUEUE`` /
``--interruption-queue``; NTH ``ENABLE_SQS_TERMINATION_DRAINING``, ``QUEUE_URL``,
``CHECK_TAG_BEFORE_DRAINING``, ``MANAGED_TAG``; in IMDS mode
``ENABLE_SPOT_INTERRUPTION_DRAINING``); a value set from a ConfigMap or Secret is not read.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from reclaimd import logs
from reclaimd.cluster import apiserver, errors
from reclaimd.cluster.apiserver import ApiServer

log = logging.getLogger(__name__)

KARPENTER = "karpenter"
NTH = "aws-node-termination-handler"
KARPENTER_NODE_LABEL = "karpenter.sh/nodepool"
NTH_MANAGED_TAG = "aws-node-termination-handler/managed"
DOCS = "docs/peers.md"


@dataclass(frozen=True)
class Place:
    resource: str  # deployments | daemonsets
    namespace: str
    name: str

    def __str__(self) -> str:
        kind = "Deployment" if self.resource == "deployments" else "DaemonSet"
        return f"{kind} {self.namespace}/{self.name}"


WELL_KNOWN: tuple[Place, ...] = (
    Place("deployments", "kube-system", KARPENTER),
    Place("deployments", KARPENTER, KARPENTER),
    Place("deployments", "kube-system", NTH),
    Place("daemonsets", "kube-system", NTH),
)

UNREADABLE = None  # an env value set from a ConfigMap or Secret (valueFrom)


def _containers(obj: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    spec = ((obj.get("spec") or {}).get("template") or {}).get("spec") or {}
    return [c for c in spec.get("containers") or () if isinstance(c, Mapping)]


def settings_of(obj: Mapping[str, Any]) -> dict[str, str | None]:
    """The containers' env (``None`` for a value from elsewhere) and ``--flag=value`` args
    (as ``--flag``), the later container's winning."""
    out: dict[str, str | None] = {}
    for c in _containers(obj):
        for e in c.get("env") or ():
            if isinstance(e, Mapping) and e.get("name"):
                # An empty value is dropped by the API server: no "value" at all.
                from_elsewhere = "valueFrom" in e
                out[str(e["name"])] = UNREADABLE if from_elsewhere else str(e.get("value") or "")
        words = [str(w) for w in (*(c.get("command") or ()), *(c.get("args") or ()))]
        for i, word in enumerate(words):
            if word.startswith("--") and "=" in word:
                flag, value = word.split("=", 1)
                out[flag] = value
            elif word.startswith("--") and i + 1 < len(words) and not words[i + 1].startswith("-"):
                out[word] = words[i + 1]
    return out


def _queue_name(url_or_name: str) -> str:
    return url_or_name.rstrip("/").rsplit("/", 1)[-1]


def _ours(ours: str | Iterable[str], queue: str) -> bool:
    """Whether ``queue`` (a URL or a name) is one reclaimd consumes: ``ours`` is one queue or
    every destination of the enabled sources (``sources.destinations``), URLs or names."""
    mine = [ours] if isinstance(ours, str) else list(ours)
    return bool(queue) and _queue_name(queue) in {_queue_name(q) for q in mine if q}


def _true(value: str | None, default: bool) -> bool:
    return default if value is None or value == "" else value.strip().lower() == "true"


def karpenter(
    place: Place, obj: Mapping[str, Any], our_queue: str | Iterable[str], its_nodes: bool
) -> str:
    """One line when Karpenter handles interruptions ('' when it does not)."""
    found = settings_of(obj)
    queue = found.get("--interruption-queue", found.get("INTERRUPTION_QUEUE", ""))
    if queue == "":
        return ""
    nodes = (
        f"the nodes it launched (label {KARPENTER_NODE_LABEL}; this cluster has some)"
        if its_nodes
        else f"the nodes it launches (label {KARPENTER_NODE_LABEL}; none here yet)"
    )
    if queue is UNREADABLE:
        where = "a queue set from a ConfigMap or Secret (not read)"
    elif _ours(our_queue, queue):
        where = f"reclaimd's own queue {queue}: each message reaches only one of the two"
    else:
        where = f"its queue {queue}, fed by the same EventBridge events"
    return (
        f"Karpenter ({place}) handles Spot interruptions from {where}; it drains {nodes} at "
        f"once, spending the window reclaimd needs for checkpoints: set its "
        f'settings.interruptionQueue to "" ({DOCS})'
    )


def nth_queue(place: Place, obj: Mapping[str, Any], our_queue: str | Iterable[str]) -> str:
    """One line when NTH runs in queue mode ('' when it does not)."""
    found = settings_of(obj)
    if not _true(found.get("ENABLE_SQS_TERMINATION_DRAINING", ""), False):
        return ""
    queue = found.get("QUEUE_URL", "")
    if queue is UNREADABLE:
        where = "a queue set from a ConfigMap or Secret (not read)"
    elif _ours(our_queue, queue):
        where = f"reclaimd's own queue {queue}: each message reaches only one of the two"
    else:
        where = f"its queue {queue or '(unset)'}, fed by the same EventBridge events"
    if _true(found.get("CHECK_TAG_BEFORE_DRAINING", ""), True):
        tag = found.get("MANAGED_TAG") or NTH_MANAGED_TAG
        nodes = f"the instances tagged {tag} (keep that tag off the nodes reclaimd serves)"
    else:
        nodes = "every instance (CHECK_TAG_BEFORE_DRAINING=false)"
    return (
        f"aws-node-termination-handler ({place}) in queue mode drains on Spot warnings from "
        f"{where}; it drains {nodes} at once ({DOCS})"
    )


def nth_metadata_mode(place: Place, obj: Mapping[str, Any]) -> str:
    """One line when NTH's IMDS DaemonSet drains on Spot warnings ('' when it does not)."""
    found = settings_of(obj)
    if not _true(found.get("ENABLE_SPOT_INTERRUPTION_DRAINING", ""), True):
        return ""
    running = int((obj.get("status") or {}).get("desiredNumberScheduled") or 0)
    return (
        f"aws-node-termination-handler ({place}) in IMDS mode drains the {running} node(s) it "
        f"runs on at a Spot warning: keep it off the nodes reclaimd serves "
        f"(daemonsetNodeSelector or daemonsetAffinity) or set "
        f"enableSpotInterruptionDraining: false ({DOCS})"
    )


async def _get(api: ApiServer, place: Place) -> Mapping[str, Any] | None:
    path = apiserver.group("apps/v1", place.resource, place.name, place.namespace)
    try:
        with errors.kube_errors(f"get {place}"):
            return await api.get(path)
    except errors.NotFound:
        return None


async def _has_karpenter_nodes(api: ApiServer) -> bool:
    with errors.kube_errors("list nodes"):
        answer = await api.get(apiserver.node(), labelSelector=KARPENTER_NODE_LABEL, limit=1)
    return bool(answer.get("items"))


async def find(
    api: ApiServer, our_queue: str | Iterable[str], places: Sequence[Place] = WELL_KNOWN
) -> tuple[list[str], list[str]]:
    """(findings, places that could not be read and why)."""
    findings: list[str] = []
    unread: list[str] = []
    for place in places:
        try:
            obj = await _get(api, place)
        except errors.KubeError as e:
            unread.append(f"{place}: {e}")
            continue
        if obj is None:
            continue
        if place.name == KARPENTER:
            try:
                its_nodes = await _has_karpenter_nodes(api)
            except errors.KubeError:
                its_nodes = True
            line = karpenter(place, obj, our_queue, its_nodes)
        elif place.resource == "deployments":
            line = nth_queue(place, obj, our_queue)
        else:
            line = nth_metadata_mode(place, obj)
        if line:
            findings.append(line)
    return findings, unread


async def warn(
    api: ApiServer, our_queue: str | Iterable[str], places: Sequence[Place] = WELL_KNOWN
) -> list[str]:
    """Log each finding as one WARNING (and what could not be read as one INFO line); never
    raises: a replica starts whatever it finds."""
    try:
        findings, unread = await find(api, our_queue, places)
    except Exception as e:  # a check at start must not stop the replica
        logs.event(log, "could not check for Karpenter or NTH", error=repr(e))
        return []
    for line in findings:
        logs.event(log, line, logging.WARNING, check="peers")
    if unread:
        logs.event(
            log,
            "could not check for Karpenter or NTH where their charts put them",
            unread="; ".join(unread),
        )
    return findings
