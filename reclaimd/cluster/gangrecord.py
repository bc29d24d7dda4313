"""A gang as its owner charges it, and the durable checkpoints its ranks acked, as JSON.

The gang's Lease carries both, so a replica that takes over a notice finds what the dead
owner knew: the gang's pods (some may be gone, evicted by the owner before it died) and every
durable checkpoint a rank acked to it. Without them the successor cannot charge a gang whose
pods are gone, and charges the others from older checkpoints (too much).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from datetime import datetime

from reclaimd import checkpoint
from reclaimd.model import (
    CheckpointScope,
    Gang,
    GangKey,
    Member,
    ParseError,
    RankAck,
    frozen_map,
    parse_time,
    rfc3339,
)

# A Lease's annotations share the object's 256 KiB: a record larger than this is left out
# (the gang is still owned once; a successor charges it from what it can see).
MAX_RECORD_BYTES = 96 * 1024


def _t(t: datetime | None) -> str | None:
    return rfc3339(t) if t is not None else None


def _parse_t(raw: object) -> datetime | None:
    return parse_time(raw) if isinstance(raw, str) and raw else None


def gang_json(gang: Gang) -> str:
    """The gang, compact; empty when it would not fit a Lease."""
    body = {
        "key": [gang.key.kind, gang.key.namespace, gang.key.name],
        "scope": gang.scope.value,
        "labels": dict(gang.labels),
        "members": [
            {
                "ns": m.namespace,
                "name": m.name,
                "uid": m.uid,
                "node": m.node,
                "gpus": m.gpus,
                "rank": m.rank,
                "last": _t(m.last_checkpoint),
                "started": _t(m.started_at),
                "leader": m.is_leader,
            }
            for m in gang.members
        ],
    }
    text = json.dumps(body, separators=(",", ":"), sort_keys=True)
    return text if len(text) <= MAX_RECORD_BYTES else ""


def gang_from_json(text: str) -> Gang:
    try:
        body = json.loads(text)
        kind, namespace, name = body["key"]
        members = tuple(
            Member(
                namespace=str(m["ns"]),
                name=str(m["name"]),
                uid=str(m["uid"]),
                node=str(m["node"]),
                gpus=int(m["gpus"]),
                rank=int(m["rank"]) if m.get("rank") is not None else None,
                last_checkpoint=_parse_t(m.get("last")),
                started_at=_parse_t(m.get("started")),
                is_leader=bool(m.get("leader")),
            )
            for m in body["members"]
        )
        return Gang(
            key=GangKey(str(kind), str(namespace), str(name)),
            members=members,
            scope=CheckpointScope(body.get("scope", "rank")),
            labels=frozen_map({str(k): str(v) for k, v in (body.get("labels") or {}).items()}),
        )
    except (ValueError, KeyError, TypeError) as e:
        raise ParseError(f"unreadable gang record: {e}") from e


def acks_json(acks: Iterable[RankAck]) -> str:
    body = {
        a.member.uid: {
            "at": _t(a.checkpoint_time),
            "step": a.step,
            "uri": a.uri[:256],
            "covered_by": a.covered_by,
        }
        for a in checkpoint.durable(acks)
        if a.member.uid
    }
    return json.dumps(body, separators=(",", ":"), sort_keys=True)


def acks_from_json(text: str, gang: Gang) -> tuple[RankAck, ...]:
    """The recorded acks, on ``gang``'s members (matched by pod uid)."""
    try:
        body = json.loads(text) if text else {}
        if not isinstance(body, Mapping):
            raise TypeError("not an object")
        by_uid = {m.uid: m for m in gang.members}
        out = []
        for uid, a in body.items():
            member = by_uid.get(uid)
            if member is None or not isinstance(a, Mapping):
                continue
            out.append(
                RankAck(
                    member=member,
                    acked=True,
                    durable=True,
                    checkpoint_time=_parse_t(a.get("at")),
                    step=int(a["step"]) if a.get("step") is not None else None,
                    uri=str(a.get("uri") or ""),
                    covered_by=str(a.get("covered_by") or ""),
                )
            )
        return tuple(out)
    except (ValueError, TypeError, ParseError) as e:
        raise ParseError(f"unreadable acks record: {e}") from e
