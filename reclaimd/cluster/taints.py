"""Cordon and taint as data: what a doomed node's spec must say, computed from what it says.

Shared by the claim (which cordons in the same write, ``claims``) and by ``actions``. The
taint list is replaced whole by a merge patch, so the caller sends it with the
resourceVersion it was computed from.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

TAINT_KEY = "reclaimd.io/interruption"
TAINT_EFFECT = "NoSchedule"


def cordon_spec(
    unschedulable: bool, taints: Iterable[Mapping[str, Any]], kind: str
) -> dict[str, Any] | None:
    """The ``spec`` patch that cordons the node with our taint for ``kind``, keeping every
    other taint; None when the node already says so."""
    current = [taint_json(t) for t in taints]
    ours = [t for t in current if t.get("key") == TAINT_KEY and t.get("effect") == TAINT_EFFECT]
    if unschedulable and ours and ours[0].get("value") == kind:
        return None
    kept = [t for t in current if t not in ours]
    wanted = {"key": TAINT_KEY, "value": kind, "effect": TAINT_EFFECT}
    return {"unschedulable": True, "taints": [*kept, wanted]}


def taint_json(taint: Mapping[str, Any]) -> dict[str, Any]:
    """A taint in API form (camelCase, no nulls), from API JSON or ``V1Taint.to_dict()``."""
    out: dict[str, Any] = {"key": taint.get("key"), "effect": taint.get("effect")}
    if taint.get("value") is not None:
        out["value"] = taint["value"]
    added = taint.get("timeAdded", taint.get("time_added"))
    if added is not None:
        out["timeAdded"] = (
            added.isoformat().replace("+00:00", "Z") if isinstance(added, datetime) else str(added)
        )
    return out
