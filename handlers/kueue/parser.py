"""Kueue reclaim: a Workload evicted so that another can have its quota.

Payload: a ``Workload`` as the API serves it (``kueue.x-k8s.io/v1beta1`` or ``v1beta2``: the
conditions are the same in both; ``apiVersion``/``kind`` may be absent, as on the items of
a LIST), or a watch event ``{"type", "object"}`` wrapping one (``DELETED`` and ``BOOKMARK``
are ``Ignored``).

Signal: one status patch of Kueue's scheduler sets ``Evicted=True`` reason ``Preempted``
and ``Preempted=True`` with the preemption reason (``InClusterQueue``,
``InCohortReclamation``, ``InCohortFairSharing``, ``InCohortReclaimWhileBorrowing``).
Either is a notice: it is the earliest sign, the pods are only now being deleted and still
have their grace period. An eviction for any other reason (``PodsReadyTimeout``,
``Deactivated``, ``AdmissionCheck``, a stopped queue, ...) is ``Ignored``, with its class in
the reason: reclaimd neither caused nor can soften those.

Identity: the workload uid and the ``lastTransitionTime`` of the condition that said
"preempted" (``Evicted`` when its reason is ``Preempted``, else ``Preempted``). Both stay
True, with their time, until the workload is admitted again, so every later update of the
same eviction (``Requeued``, ``QuotaReserved=False``) maps to the same notice, while a new
preemption of the same workload is a new transition and a new notice.

Deadline: the transition time + ``windows.kueue_grace_s``. Response ``NO_CORDON``: the node
is healthy; only this workload's pods go.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime
from types import MappingProxyType

from reclaimd.handlers import ids
from reclaimd.handlers.fields import (
    JSONObject,
    as_object,
    attributes,
    ident,
    issued,
    load,
    opt_ident,
    opt_items,
    opt_sub,
    opt_text,
    plus,
    show,
    sub,
    text,
    time,
)
from reclaimd.model import (
    Cause,
    Ignored,
    Notice,
    NoticeKind,
    ParseError,
    ParseOutcome,
    Response,
    Target,
    Windows,
    WorkloadRef,
    digest,
    rfc3339,
    stable_id,
)

WINDOWS: Mapping[str, float] = {"kueue_grace_s": 30.0}  # its window (``Windows.of``)

SOURCE = "kueue.workload"
_GROUP = "kueue.x-k8s.io/"
_MESSAGE_LIMIT = 1024  # condition messages are free text; keep attributes bounded
_EVICTED = "status.conditions[Evicted]"
_PREEMPTED = "status.conditions[Preempted]"
_PREEMPTOR = re.compile(r"\(UID: ([A-Za-z0-9._-]{1,128}), JobUID: ([A-Za-z0-9._-]{1,128})\)")

# Eviction reasons that are not a preemption, by what caused them.
EVICTION_CLASSES: Mapping[str, str] = MappingProxyType(
    {
        "PodsReadyTimeout": "pods-ready timeout",
        "AdmissionCheck": "admission check",
        "ClusterQueueStopped": "queue stopped",
        "LocalQueueStopped": "queue stopped",
        "Deactivated": "deactivated",
        "NodeFailures": "node failure",
        "EvictedOnManagerCluster": "multikueue",
        "WorkloadSliceReplaced": "slice replaced",
        "FlavorMigration": "flavor migration",
    }
)


def classify_eviction(reason: str) -> str:
    if reason.startswith("DeactivatedDueTo"):  # DeactivatedDueTo<cause>, e.g. ...Exceeded
        return "deactivated"
    return EVICTION_CLASSES.get(reason, "unclassified")


def _conditions(status: JSONObject) -> dict[str, JSONObject]:
    """Conditions by type (the first of a type wins; the API keeps types unique)."""
    found: dict[str, JSONObject] = {}
    for i, item in enumerate(opt_items(status, "conditions", at="status")):
        at = f"status.conditions[{i}]"
        condition = as_object(item, at)
        found.setdefault(text(condition, "type", at=at), condition)
    return found


def _true(condition: JSONObject | None, at: str) -> JSONObject | None:
    """The condition if its status is ``True``."""
    if condition is not None and text(condition, "status", at=at) == "True":
        return condition
    return None


def parse(payload: bytes, *, received_at: datetime, windows: Windows) -> ParseOutcome:
    """A Workload (or a watch event of one) -> a reclaim notice if it was just preempted."""
    workload = as_object(load(payload), "payload")
    if "object" in workload and "type" in workload:  # a watch event
        event_type = text(workload, "type")
        if event_type in ("DELETED", "BOOKMARK"):
            return Ignored(f"watch event {event_type} is no eviction")
        workload = as_object(workload["object"], "object")
    api_version = opt_text(workload, "apiVersion")
    kind = opt_text(workload, "kind")
    if (api_version and not api_version.startswith(_GROUP)) or (kind and kind != "Workload"):
        raise ParseError(f"not a Kueue Workload: {show(api_version)} {show(kind)}")
    meta = sub(workload, "metadata")
    ref = WorkloadRef(
        namespace=ident(meta, "namespace", ids.K8S_NAMESPACE, at="metadata"),
        name=ident(meta, "name", ids.K8S_NAME, at="metadata"),
        uid=ident(meta, "uid", ids.K8S_UID, at="metadata"),
    )
    status = opt_sub(workload, "status")
    conditions = _conditions(status)
    evicted = _true(conditions.get("Evicted"), _EVICTED)
    preempted = _true(conditions.get("Preempted"), _PREEMPTED)
    evicted_reason = text(evicted, "reason", at=_EVICTED) if evicted is not None else ""

    if evicted is not None and evicted_reason == "Preempted":
        decisive, at = evicted, _EVICTED
    elif preempted is not None:
        decisive, at = preempted, _PREEMPTED
    elif evicted_reason:
        cls = classify_eviction(evicted_reason)
        return Ignored(f"evicted for {show(evicted_reason, 80)} ({cls}), not a preemption")
    else:
        return Ignored("workload is not evicted")

    transition = issued(
        time(decisive, "lastTransitionTime", at=at), received_at, f"{at}.lastTransitionTime"
    )
    # Preempted says why (InCohortReclamation, ...); Evicted alone only says "Preempted".
    if preempted is not None:
        reason = text(preempted, "reason", at=_PREEMPTED)
        message = opt_text(preempted, "message", at=_PREEMPTED)
    else:
        reason, message = evicted_reason, opt_text(decisive, "message", at=at)
    preemptor = _PREEMPTOR.search(message)
    notice = Notice(
        id=stable_id(SOURCE, ref.uid, rfc3339(transition)),
        source=SOURCE,
        kind=NoticeKind.RECLAIM,
        target=Target(workload=ref),
        issued_at=transition,
        deadline=plus(transition, windows.of("kueue_grace_s", WINDOWS)),
        received_at=received_at,
        response=Response.NO_CORDON,
        attributes=attributes(
            {
                **Cause(reason).attributes(),
                "eviction_reason": evicted_reason,
                "message": message[:_MESSAGE_LIMIT],
                "preemptor_workload_uid": preemptor.group(1) if preemptor else "",
                "preemptor_job_uid": preemptor.group(2) if preemptor else "",
                "cluster_queue": opt_ident(
                    opt_sub(status, "admission", at="status"),
                    "clusterQueue",
                    ids.K8S_NAME,
                    at="status.admission",
                ),
                "local_queue": opt_ident(
                    opt_sub(workload, "spec"), "queueName", ids.K8S_NAME, at="spec"
                ),
                "api_version": api_version,
            }
        ),
        payload_digest=digest(payload),
    )
    return (notice,)
