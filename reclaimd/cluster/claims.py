"""The durable claim: which notice owns a node (or Kueue Workload), who acts on it, how far.

A claim is the annotation ``reclaimd.io/claim`` on the doomed object, JSON:
``{notice_id, deadline, holder, phase, claimed_at, heartbeat_at, response, notice, ...}``.
It is the first write for a notice (the transport acks only after it), so it lives where the
cluster keeps state: a crash loses nothing, and a second replica reads the same truth.

Every write is a merge patch carrying the ``metadata.resourceVersion`` that was read, so the
API server refuses it (409) if anyone wrote in between; we then re-read and decide again.
Two replicas racing for one notice therefore end with exactly one ``CLAIMED``; the other
re-reads and finds the notice held (``DUPLICATE``).

The decision (``decide``) is a pure function of what is on the object:

- a notice an earlier claim on the object handled (``handled``: finished, or covered by the
  notice that replaced it) -> ``DUPLICATE``: a late copy must not cordon a node put back;
- nothing there, or a finished or abandoned claim -> ``CLAIMED``;
- the same notice: ours -> ``ALREADY_OURS`` (resume); finished -> ``DUPLICATE``; another
  holder whose lease is fresh -> ``DUPLICATE``; whose lease is stale -> ``TAKEN_OVER``
  (resume from its phase, as the new holder);
- another open notice with an earlier or equal deadline -> ``SUPERSEDED`` (it already covers
  ours); with a later deadline (or none: an early warning) -> ``CLAIMED``, the more urgent
  notice replaces it and the old holder finds out at its next ``advance``.

The claim write is the storm's fast path (``claimstore.ClaimStore``): for a full-response
notice on a node it also cordons and taints the node, in the same PATCH, computed from the
cluster cache's copy of the node (``NodeSnapshot``) so that no GET precedes it; a 409 means
the copy was stale, and only then is the node read. After that the claim is written once
more, at ``done``: progress in between is not recorded, since a resumed notice runs its
runbook again from the top.

The lease: a claim is live while its holder is. Each replica renews one Lease of its own
(``holders``); ``liveness`` tells the last renewal seen for a holder, and a claim's own
``heartbeat_at`` (its last write) counts too. A claim whose holder has renewed neither within
``lease_s`` belongs to a holder presumed dead (crashed, or hung: a stopped process renews
nothing) and can be taken over; a claim is *abandoned* when its deadline has passed and its
lease is stale.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from reclaimd.model import Notice, ParseError, frozen_map, parse_time, rfc3339

CLAIM_ANNOTATION = "reclaimd.io/claim"


class Phase(StrEnum):
    CLAIMED = "claimed"
    CORDONED = "cordoned"
    SIGNALED = "signaled"
    DRAINED = "drained"
    RECORDED = "recorded"
    DONE = "done"

    @property
    def rank(self) -> int:
        return _PHASE_ORDER.index(self)

    @property
    def terminal(self) -> bool:
        return self is Phase.DONE


_PHASE_ORDER = tuple(Phase)


@dataclass(frozen=True)
class NodeObj:
    name: str

    def describe(self) -> str:
        return f"node/{self.name}"


@dataclass(frozen=True)
class WorkloadObj:
    namespace: str
    name: str

    def describe(self) -> str:
        return f"workload/{self.namespace}/{self.name}"


ClaimTarget = NodeObj | WorkloadObj


@dataclass(frozen=True)
class Claim:
    target: ClaimTarget
    notice_id: str
    deadline: datetime | None
    holder: str
    phase: Phase
    claimed_at: datetime
    heartbeat_at: datetime
    response: str = ""
    notice: Mapping[str, Any] = field(default_factory=dict)  # Notice.to_json()
    facts: Mapping[str, Any] = field(default_factory=frozen_map)  # from advance(**extra)
    # The replicas that may take this claim over (one deployment's): another deployment on
    # the same cluster (a canary with its own queue and ledger) never resumes it.
    group: str = ""
    # Notices this object's earlier claims finished or covered, by id (their deadlines): a
    # late copy of one (a Pub/Sub redelivery, a slot's seek back) is a duplicate, even after
    # a newer notice's claim replaced the one that handled it.
    handled: Mapping[str, str] = field(default_factory=frozen_map)  # "": no deadline

    def to_json(self) -> dict[str, Any]:
        return {
            **dict(self.facts),
            **({"group": self.group} if self.group else {}),
            "notice_id": self.notice_id,
            "deadline": rfc3339(self.deadline) if self.deadline else None,
            "holder": self.holder,
            "phase": self.phase.value,
            "claimed_at": rfc3339(self.claimed_at),
            "heartbeat_at": rfc3339(self.heartbeat_at),
            "response": self.response,
            "notice": dict(self.notice),
            **({"handled": dict(self.handled)} if self.handled else {}),
        }

    @classmethod
    def from_json(cls, target: ClaimTarget, text: str) -> Claim:
        """Read an annotation; ``ParseError`` (one line) when it is not a claim."""
        try:
            data = json.loads(text)
        except ValueError as e:
            raise ParseError(f"{target.describe()}: claim is not JSON") from e
        if not isinstance(data, dict):
            raise ParseError(f"{target.describe()}: claim is not an object")
        try:
            claimed_at = parse_time(str(data["claimed_at"]))
            deadline = data.get("deadline")
            notice = data.get("notice")
            known = {
                "notice_id",
                "deadline",
                "holder",
                "phase",
                "claimed_at",
                "heartbeat_at",
                "response",
                "notice",
                "group",
                "handled",
            }
            return cls(
                target=target,
                notice_id=str(data["notice_id"]),
                deadline=parse_time(str(deadline)) if deadline else None,
                holder=str(data["holder"]),
                phase=Phase(str(data["phase"])),
                claimed_at=claimed_at,
                heartbeat_at=parse_time(str(data.get("heartbeat_at") or data["claimed_at"])),
                response=str(data.get("response") or ""),
                notice=notice if isinstance(notice, dict) else {},
                facts=frozen_map({k: v for k, v in data.items() if k not in known}),
                group=str(data.get("group") or ""),
                handled=frozen_map(_handled(data.get("handled"))),
            )
        except (KeyError, ValueError) as e:
            raise ParseError(f"{target.describe()}: claim is missing or has a bad {e}") from e

    def stale(
        self, now: datetime, lease_s: float, renewed: datetime | None = None, dead: bool = False
    ) -> bool:
        """Neither the claim nor its holder's Lease (``renewed``) was written for ``lease_s``,
        or the holder is known dead (``dead``: its process refused a probe, or it handed its
        claims over on SIGTERM): then no Lease need run out first."""
        if dead:
            return True
        last = self.heartbeat_at if renewed is None else max(self.heartbeat_at, renewed)
        return now - last > timedelta(seconds=lease_s)

    def open(
        self, now: datetime, lease_s: float, renewed: datetime | None = None, dead: bool = False
    ) -> bool:
        """Still to be acted on: not finished, and not past its deadline with no live holder."""
        if self.phase.terminal:
            return False
        expired = self.deadline is not None and self.deadline <= now
        return not (expired and self.stale(now, lease_s, renewed, dead))


class ClaimStatus(StrEnum):
    CLAIMED = "claimed"  # we wrote it: run the runbook
    ALREADY_OURS = "already_ours"  # same notice, ours: resume from claim.phase
    TAKEN_OVER = "taken_over"  # same notice, its holder's lease ran out: resume, now ours
    DUPLICATE = "duplicate"  # same notice, held by a live peer or already done: nothing to do
    SUPERSEDED = "superseded"  # another open notice dies no later: it covers this one
    TARGET_NOT_FOUND = "target_not_found"


@dataclass(frozen=True)
class ClaimResult:
    status: ClaimStatus
    claim: Claim | None = None  # what is on the object now
    previous: Claim | None = None  # what was there before, when we replaced or took over


class AdvanceStatus(StrEnum):
    ADVANCED = "advanced"
    LOST = "lost"  # the claim is another notice's or another holder's now: stop
    TARGET_NOT_FOUND = "target_not_found"


@dataclass(frozen=True)
class AdvanceResult:
    status: AdvanceStatus
    claim: Claim | None = None


def _no_later(a: datetime | None, b: datetime | None) -> bool:
    """Deadline ``a`` is earlier than or equal to ``b``; no deadline is the latest of all."""
    if a is None:
        return b is None
    return b is None or a <= b


Liveness = Callable[[str], datetime | None]
"""The last renewal seen of a holder's Lease; None when none was seen."""

Death = Callable[[str], bool]
"""Whether a holder is known dead now, before its Lease runs out (``holders.HolderLeases``)."""


def never_renewed(_holder: str) -> datetime | None:
    return None


def never_dead(_holder: str) -> bool:
    return False


HANDLED_KEPT = 16  # a node or Workload sees a few notices an hour, not more
HANDLED_FOR = timedelta(minutes=15)  # past a notice's deadline by this, the intake expires it


def handled_after(replaced: Claim | None, now: datetime) -> dict[str, str]:
    """What a new claim keeps of the one it replaces: every notice that claim had handled
    (finished, or covered by the new notice's earlier deadline), its own included, less the
    ones so long past their deadline that the intake expires a copy anyway."""
    if replaced is None:
        return {}
    deadline = rfc3339(replaced.deadline) if replaced.deadline else ""
    kept = {**replaced.handled, replaced.notice_id: deadline}
    fresh = {nid: d for nid, d in kept.items() if not d or parse_time(d) + HANDLED_FOR > now}
    return dict(list(fresh.items())[-HANDLED_KEPT:])


def _handled(value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError("handled")
    return {str(k): str(v or "") for k, v in value.items()}


def decide(
    existing: Claim | None,
    notice: Notice,
    holder: str,
    now: datetime,
    lease_s: float,
    *,
    renewed: datetime | None = None,
    dead: bool = False,
) -> ClaimStatus:
    """What a claim attempt means, given what is on the object (see the module doc);
    ``renewed`` is the last renewal of the existing claim's holder, ``dead`` whether it is
    known dead."""
    if existing is None:
        return ClaimStatus.CLAIMED
    if notice.id in existing.handled:
        return ClaimStatus.DUPLICATE
    if existing.notice_id == notice.id:
        if existing.phase.terminal:
            return ClaimStatus.DUPLICATE
        if existing.holder == holder:
            return ClaimStatus.ALREADY_OURS
        if existing.stale(now, lease_s, renewed, dead):
            return ClaimStatus.TAKEN_OVER
        return ClaimStatus.DUPLICATE
    if not existing.open(now, lease_s, renewed, dead):
        return ClaimStatus.CLAIMED
    if _no_later(existing.deadline, notice.deadline):
        return ClaimStatus.SUPERSEDED
    return ClaimStatus.CLAIMED


CLAIM_LEAD_S = 120.0


def claim_order(notice: Notice) -> datetime | None:
    """Where a claim (the cordon) and the gang Leases the checkpoint requests wait for sit in
    the write budget: as if due when the notice was issued, so that in a storm they are served
    before the evictions of the notices already running, and a notice is cordoned and its
    ranks asked as it arrives. A change announced weeks ahead sorts ``CLAIM_LEAD_S`` before
    its own far deadline instead."""
    if notice.deadline is None:
        return None
    lead = notice.deadline - timedelta(seconds=CLAIM_LEAD_S)
    return min(notice.deadline, max(notice.issued_at, lead))
