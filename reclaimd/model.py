"""The normalized vocabulary every part of reclaimd speaks.

A source-specific payload stops at ``handlers/``: what leaves a parser is a ``Notice``. The
cluster side turns a notice into a ``Plan`` of nodes and ``Gang``s; the pipeline turns each
gang into one ``RestartWaste``. All of these are frozen so that a value handed to a step can
not be changed behind another step's back.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from datetime import datetime
from enum import StrEnum
from types import MappingProxyType
from typing import Any, Self

# The contract's times live with the trainer SDK, which speaks them too: one copy of each.
from reclaimd_trainer.times import ParseError, parse_time, rfc3339, utcnow

# Re-exported: the contract's times, which the trainer SDK owns (one copy for both sides).
__all__ = ["ParseError", "parse_time", "rfc3339", "utcnow"]


class NoticeKind(StrEnum):
    SPOT_INTERRUPTION = "spot_interruption"
    REBALANCE_RECOMMENDATION = "rebalance_recommendation"
    PREEMPTION = "preemption"
    MAINTENANCE = "maintenance"
    RECLAIM = "reclaim"
    SCHEDULED_CHANGE = "scheduled_change"
    STATE_CHANGE = "state_change"


class Response(StrEnum):
    """How much of the runbook a notice gets.

    ``full``: claim, cordon, checkpoint, drain, ledger. ``checkpoint_only``: claim and signal the
    gangs to checkpoint, nothing is taken away (an early warning such as a rebalance
    recommendation). ``no_cordon``: a scheduler reclaim (Kueue) where the node stays healthy.
    """

    FULL = "full"
    CHECKPOINT_ONLY = "checkpoint_only"
    NO_CORDON = "no_cordon"


@dataclass(frozen=True)
class WorkloadRef:
    """A Kueue Workload (or any namespaced job object) a notice is about."""

    namespace: str
    name: str
    uid: str = ""


@dataclass(frozen=True)
class Target:
    """What goes away. At least one field is set; the cluster cache resolves the rest."""

    instance_id: str = ""
    provider_id: str = ""
    node_name: str = ""
    workload: WorkloadRef | None = None

    def describe(self) -> str:
        if self.workload is not None:
            return f"workload/{self.workload.namespace}/{self.workload.name}"
        return self.node_name or self.instance_id or self.provider_id or "?"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            k: v
            for k, v in (
                ("instance_id", self.instance_id),
                ("provider_id", self.provider_id),
                ("node_name", self.node_name),
            )
            if v
        }
        if self.workload is not None:
            out["workload"] = {
                "namespace": self.workload.namespace,
                "name": self.workload.name,
                **({"uid": self.workload.uid} if self.workload.uid else {}),
            }
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Target:
        w = d.get("workload")
        return cls(
            instance_id=str(d.get("instance_id", "")),
            provider_id=str(d.get("provider_id", "")),
            node_name=str(d.get("node_name", "")),
            workload=WorkloadRef(str(w["namespace"]), str(w["name"]), str(w.get("uid", "")))
            if isinstance(w, Mapping)
            else None,
        )


def frozen_map(items: Mapping[str, str] | None = None) -> Mapping[str, str]:
    return MappingProxyType(dict(items or {}))


@dataclass(frozen=True)
class Notice:
    """One "this capacity goes away at ``deadline``" message, whatever its source.

    ``id`` is derived from the source's own identity of the message (so a redelivery maps to
    the same id); ``deadline`` is ``None`` only for early warnings that carry no time.
    """

    id: str
    source: str
    kind: NoticeKind
    target: Target
    issued_at: datetime
    deadline: datetime | None
    received_at: datetime
    response: Response = Response.FULL
    attributes: Mapping[str, str] = field(default_factory=frozen_map)
    payload_digest: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "source": self.source,
            "kind": self.kind.value,
            "response": self.response.value,
            "target": self.target.to_json(),
            "issued_at": rfc3339(self.issued_at),
            "deadline": rfc3339(self.deadline) if self.deadline else None,
            "received_at": rfc3339(self.received_at),
            "attributes": dict(sorted(self.attributes.items())),
            "payload_digest": self.payload_digest,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Notice:
        """The inverse of ``to_json`` (a claim stores the notice this way). Raises ParseError."""
        try:
            deadline = d.get("deadline")
            return cls(
                id=str(d["id"]),
                source=str(d["source"]),
                kind=NoticeKind(d["kind"]),
                target=Target.from_json(d["target"]),
                issued_at=parse_time(str(d["issued_at"])),
                deadline=parse_time(str(deadline)) if deadline else None,
                received_at=parse_time(str(d["received_at"])),
                response=Response(d.get("response", Response.FULL.value)),
                attributes=frozen_map({str(k): str(v) for k, v in d["attributes"].items()}),
                payload_digest=str(d.get("payload_digest", "")),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ParseError(f"not a stored notice: {e}") from e


@dataclass(frozen=True)
class Facts:
    """What a source knows of a notice beyond its target, as typed fields.

    On the wire (``Notice.attributes``: a claim stores it, a Kafka notice carries it) each
    field is the attribute of its name, left out when empty. A handler writes a kind of facts
    with ``attributes()``; a later step reads it with ``of(notice)``, never by a string key.
    The facts every source may know are here; a source's own are its handler module's,
    listed on its registry entry (``reclaimd.handlers``).
    """

    @classmethod
    def of(cls, notice: Notice) -> Self:
        return cls(**{f.name: notice.attributes.get(f.name, "") for f in fields(cls)})

    def attributes(self) -> dict[str, str]:
        return {f.name: value for f in fields(self) if (value := getattr(self, f.name))}


@dataclass(frozen=True)
class Placement(Facts):
    """Where the doomed instance runs, as far as the source was told."""

    region: str = ""
    zone: str = ""
    availability_zone: str = ""  # a producer's word for the zone (a Kafka notice)
    account: str = ""  # the cloud account (AWS)
    project: str = ""  # or project (GCP) that owns the instance
    instance_type: str = ""
    gce_instance_id: str = ""  # GCE's numeric id of an instance the target names by name


@dataclass(frozen=True)
class Cause(Facts):
    """Why the capacity is taken back, in the taker's words (a scheduler's preemption reason)."""

    reason: str = ""


@dataclass(frozen=True)
class TraceContext(Facts):
    """The W3C trace context of the notice's producer, to link its trace to ours."""

    traceparent: str = ""


@dataclass(frozen=True)
class Ignored:
    """A well-formed payload that is not a notice (a test notification, an unknown kind)."""

    reason: str


ParseOutcome = tuple[Notice, ...] | Ignored


class Windows:
    """Notice windows in seconds, by name: the parsers turn them into deadlines.

    Each source's handler names the windows it reads with their defaults, the clouds'
    documented windows (its ``WINDOWS``); ``handlers.windows()`` has them all, and so has
    ``Settings.windows`` (``windows.<name>`` in the config). Every one is configurable because
    a fleet may run a shorter kubelet grace (GKE gives non-system pods 15 s of the 30).
    ``default_s``: a generic notice that names no deadline. A window not given here is its
    handler's default (``of``); ``windows.<name>`` reads one that is given.
    """

    __slots__ = ("_named", "default_s")
    default_s: float

    def __init__(self, default_s: float = 120.0, **named: float) -> None:
        object.__setattr__(self, "default_s", float(default_s))
        object.__setattr__(self, "_named", {k: float(v) for k, v in sorted(named.items())})

    def of(self, name: str, defaults: Mapping[str, float]) -> float:
        """The window ``name``: as given, else from ``defaults`` (the handler's own)."""
        named: dict[str, float] = object.__getattribute__(self, "_named")
        return named.get(name, defaults[name])

    def __getattr__(self, name: str) -> float:
        named: dict[str, float] = object.__getattribute__(self, "_named")
        try:
            return named[name]
        except KeyError:
            raise AttributeError(f"no window {name!r}") from None

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("Windows is frozen")

    def as_dict(self) -> dict[str, float]:
        return {"default_s": self.default_s, **object.__getattribute__(self, "_named")}

    def replace(self, **changes: float) -> Windows:
        return Windows(**{**self.as_dict(), **changes})

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Windows) and self.as_dict() == other.as_dict()

    def __hash__(self) -> int:
        return hash(tuple(self.as_dict().items()))

    def __repr__(self) -> str:
        return "Windows(" + ", ".join(f"{k}={v!r}" for k, v in self.as_dict().items()) + ")"


# --- cluster side -------------------------------------------------------------------------


class CheckpointScope(StrEnum):
    RANK = "rank"  # every rank must ack
    LEADER = "leader"  # one ack (from the leader) covers the gang


@dataclass(frozen=True)
class Member:
    """One pod (rank) of a gang, with what the checkpoint contract needs to reach it."""

    namespace: str
    name: str
    uid: str
    node: str
    gpus: int
    rank: int | None = None
    pod_ip: str = ""
    checkpoint_url: str = ""  # already expanded, empty when the pod did not opt in
    checkpoint_timeout_s: float = 0.0
    last_checkpoint: datetime | None = None
    started_at: datetime | None = None
    is_leader: bool = False
    ready_at: datetime | None = None  # when the pod became Ready (None: not Ready)


@dataclass(frozen=True)
class GangKey:
    """Identity of a gang: the integration that groups its pods, and the group's name."""

    kind: str  # kueue, jobset, job, kubeflow, lws, volcano, podgroup, owner, pod
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.kind}:{self.namespace}/{self.name}"


@dataclass(frozen=True)
class Gang:
    key: GangKey
    members: tuple[Member, ...]
    scope: CheckpointScope = CheckpointScope.RANK
    labels: Mapping[str, str] = field(default_factory=frozen_map)  # raw cost labels

    @property
    def gpus(self) -> int:
        return sum(m.gpus for m in self.members)

    @property
    def nodes(self) -> frozenset[str]:
        return frozenset(m.node for m in self.members)


@dataclass(frozen=True)
class Plan:
    """What one notice touches: the doomed nodes and every gang with a rank on them."""

    notice: Notice
    nodes: tuple[str, ...]
    gangs: tuple[Gang, ...]


class CheckpointOutcome(StrEnum):
    CHECKPOINTED = "checkpointed"  # every required ack, durable
    PARTIAL = "partial"  # some ranks acked
    NOT_DURABLE = "not_durable"  # acked, but the checkpoint is not off the machine
    NO_ACK = "no_ack"  # opted in, nobody acked inside the budget
    NOT_OPTED_IN = "not_opted_in"


@dataclass(frozen=True)
class RankAck:
    member: Member
    acked: bool
    durable: bool = False
    checkpoint_time: datetime | None = None
    step: int | None = None
    uri: str = ""
    error: str = ""
    latency_s: float = 0.0
    covered_by: str = ""  # leader scope: the leader pod (ns/name) whose ack speaks for this one


@dataclass(frozen=True)
class Recorded:
    """One gang as its Lease recorded it: its pods when owned, the durable checkpoints its
    ranks acked, and the owner's trace (``traceparent``)."""

    gang: Gang
    acks: tuple[RankAck, ...] = ()
    traceparent: str = ""


@dataclass(frozen=True)
class RestartWaste:
    """The ledger's view of one gang after a notice (ARCHITECTURE §5)."""

    event_id: str
    notice: Notice
    gang: Gang
    gpu_seconds_lost: float
    stopped_at: datetime
    last_good_checkpoint: datetime | None
    outcome: CheckpointOutcome
    deadline_met: bool
    traceparent: str = ""
    cluster: str = ""
    # node name -> where that node's ranks ran (instance_id, sku, purchase_option, zone, cell),
    # so each rank's waste is priced on its own instance; empty when the builder knew none.
    placements: Mapping[str, Mapping[str, str]] = field(
        default_factory=lambda: MappingProxyType({})
    )


# --- helpers ------------------------------------------------------------------------------


def stable_id(source: str, *parts: str) -> str:
    """A notice or event id that depends only on what identifies the message."""
    # surrogatepass: a lone surrogate from a hostile payload must not crash the id.
    joined = "\x1f".join((source, *parts)).encode("utf-8", "surrogatepass")
    h = hashlib.sha256(joined).hexdigest()[:24]
    return f"{source}-{h}"


def digest(payload: bytes) -> str:
    return "sha256:" + hashlib.sha256(payload).hexdigest()


def load_json(payload: bytes | str) -> Any:
    """JSON or a ``ParseError`` with one line of reason."""
    try:
        return json.loads(payload)
    except RecursionError as e:
        raise ParseError("not JSON: nested too deeply") from e
    except (ValueError, UnicodeDecodeError) as e:
        raise ParseError(f"not JSON: {e}") from e
