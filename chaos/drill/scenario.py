"""Drill scenarios: the YAML format and its validation (pure).

A scenario says what the fleet looks like (node pools), what runs on it (gang groups with
their checkpoint behaviour), which notices arrive through which transport and when, how
reclaimd is configured, and what must hold at the end. ``load`` reads and validates a file;
every mistake is one ``ScenarioError`` line naming the field (``gangs[1].ranks: ...``).
``chaos.drill.plan`` turns a scenario into the plan a drill runs.

The format is documented in ``docs/drills.md``."""

from __future__ import annotations

import math
import random
import re
from collections.abc import Mapping, Sequence
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)

from reclaimd import config as reclaimd_config
from reclaimd import handlers
from reclaimd.model import Windows


class ScenarioError(ValueError):
    """A scenario that cannot be run; the message is one line."""


class _Strict(BaseModel):
    # A misspelt key in a drill silently changes what is rehearsed: refuse unknown keys.
    model_config = ConfigDict(extra="forbid", frozen=True)


_NAME = re.compile(r"[a-z]([-a-z0-9]{0,18}[a-z0-9])?")


def _name(value: Any) -> Any:
    if isinstance(value, str) and not _NAME.fullmatch(value):
        raise ValueError("must be 1-20 characters of a-z, 0-9 and '-', starting with a letter")
    return value


Name = Annotated[str, BeforeValidator(_name)]
Fraction = Annotated[float, Field(ge=0.0, le=1.0)]


# --- distributions ---------------------------------------------------------------------------


class Dist(_Strict):
    """Seconds drawn per rank (or per gang): a number, ``{uniform: [lo, hi]}`` or
    ``{lognormal: {median, sigma}}``, optionally capped with ``max``."""

    fixed: float | None = Field(None, ge=0)
    uniform: tuple[float, float] | None = None
    median: float | None = Field(None, gt=0)
    sigma: float | None = Field(None, ge=0)
    max: float | None = Field(None, ge=0)

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        if isinstance(data, bool):
            raise ValueError("a number of seconds or a distribution, not a boolean")
        if isinstance(data, int | float):
            return {"fixed": data}
        if isinstance(data, dict) and isinstance(data.get("lognormal"), dict):
            rest = {k: v for k, v in data.items() if k != "lognormal"}
            return {**rest, **data["lognormal"]}
        return data

    @model_validator(mode="after")
    def _one_kind(self) -> Dist:
        kinds = [
            self.fixed is not None,
            self.uniform is not None,
            self.median is not None or self.sigma is not None,
        ]
        if sum(kinds) != 1:
            raise ValueError("give one of: a number, uniform: [lo, hi], lognormal: {median, sigma}")
        if self.uniform is not None and not 0 <= self.uniform[0] <= self.uniform[1]:
            raise ValueError("uniform: [lo, hi] needs 0 <= lo <= hi")
        if (self.median is None) != (self.sigma is None):
            raise ValueError("lognormal needs both median and sigma")
        return self

    def sample(self, rng: random.Random) -> float:
        if self.fixed is not None:
            value = self.fixed
        elif self.uniform is not None:
            value = rng.uniform(*self.uniform)
        else:
            assert self.median is not None and self.sigma is not None
            value = rng.lognormvariate(math.log(self.median), self.sigma)
        return min(value, self.max) if self.max is not None else value

    @property
    def upper(self) -> float:
        """The largest value it can draw (lognormal without a cap: unbounded)."""
        if self.fixed is not None:
            return self.fixed if self.max is None else min(self.fixed, self.max)
        if self.uniform is not None:
            return self.uniform[1] if self.max is None else min(self.uniform[1], self.max)
        return self.max if self.max is not None else math.inf


# --- cluster and gangs -----------------------------------------------------------------------


class PurchaseOption(StrEnum):
    SPOT = "spot"
    ON_DEMAND = "on_demand"
    RESERVED = "reserved"
    CAPACITY_BLOCK = "capacity_block"


class Cloud(StrEnum):
    AWS = "aws"
    GCE = "gce"
    AZURE = "azure"  # AKS: a pool is a scale set, a node its instance ``<vmss>_<n>``


class NodePool(_Strict):
    name: Name
    count: int = Field(ge=1, le=2000)
    gpus: int = Field(8, ge=1, le=16)
    sku: str = Field("p5.48xlarge", min_length=1, max_length=63)
    zone: str = Field("us-east-2a", pattern=r"^[a-z0-9-]{1,40}$")
    purchase_option: PurchaseOption = PurchaseOption.SPOT
    cell: str = Field("", pattern=r"^[A-Za-z0-9._-]{0,63}$")
    cloud: Cloud = Cloud.AWS
    project: str = Field("reclaimd-local", pattern=r"^[a-z][-a-z0-9]{4,28}[a-z0-9]$")


class Cluster(_Strict):
    pools: tuple[NodePool, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique(self) -> Cluster:
        _no_duplicates([p.name for p in self.pools], "pool")
        if sum(p.count for p in self.pools) > 2000:
            raise ValueError("at most 2000 nodes in all")
        return self


class Placement(StrEnum):
    SPREAD = "spread"  # one rank per node, consecutive gangs on different nodes and zones
    PACKED = "packed"  # fill a node's GPUs before taking the next node
    EXPLICIT = "explicit"  # ``nodes`` names the node of each rank


class Integration(StrEnum):
    JOBSET = "jobset"  # pods labelled as a JobSet's
    KUEUE = "kueue"  # a Kueue pod group with its Workload (admitted): the kueue source's target


class Scope(StrEnum):
    RANK = "rank"
    LEADER = "leader"


class CheckpointBehaviour(_Strict):
    opt_in: Fraction = 1.0  # of the group's gangs, implementing the checkpoint contract
    scope: Scope = Scope.RANK
    timeout_s: float = Field(45.0, gt=0, le=3600)
    ack_latency_s: Dist = Dist(uniform=(0.05, 0.3))
    fail: Fraction = 0.0  # of the opted-in ranks: answer 500
    hang: Fraction = 0.0  # of the opted-in ranks: never answer
    durable: Fraction = 1.0  # of the ranks that save: land off the machine
    last_checkpoint_age_s: Dist = Dist(fixed=600.0)  # per gang: its ranks save together
    pod_age_s: float = Field(3600.0, ge=0)  # the pods started this long before the drill

    @model_validator(mode="after")
    def _fractions(self) -> CheckpointBehaviour:
        if self.fail + self.hang > 1.0:
            raise ValueError("fail + hang is more than every rank")
        return self


class GangGroup(_Strict):
    name: Name
    count: int = Field(1, ge=1, le=500)
    ranks: int = Field(ge=1, le=256)
    gpus_per_rank: int = Field(8, ge=1, le=16)
    pools: tuple[Name, ...] = ()  # empty: any pool
    placement: Placement = Placement.SPREAD
    nodes: tuple[str, ...] = ()  # explicit placement: the node of each rank (``pool-i``)
    integration: Integration = Integration.JOBSET
    tenant: str = Field("team-a", pattern=r"^[A-Za-z0-9._-]{1,63}$")
    queue: str = Field("research", pattern=r"^[A-Za-z0-9._-]{1,63}$")
    labels: dict[str, str] = Field(default_factory=dict)
    pdb_max_unavailable: int | None = Field(None, ge=0)  # a PodDisruptionBudget on the gang
    checkpoint: CheckpointBehaviour = CheckpointBehaviour()

    @model_validator(mode="after")
    def _explicit(self) -> GangGroup:
        if self.placement is Placement.EXPLICIT:
            if self.count != 1:
                raise ValueError("explicit placement names the nodes of one gang: count must be 1")
            if len(self.nodes) != self.ranks:
                raise ValueError(f"explicit placement needs one node per rank ({self.ranks})")
        elif self.nodes:
            raise ValueError("nodes is only for placement: explicit")
        return self


# --- notices ---------------------------------------------------------------------------------


class Source(StrEnum):
    EC2_SQS = "ec2-sqs"
    IMDS = "imds"
    GKE_PUBSUB = "gke-pubsub"
    GCE_METADATA = "gce-metadata"
    AZURE_SCHEDULED = "azure-scheduled"
    KUEUE = "kueue"
    KAFKA = "kafka"


# The sources every central replica consumes (the rest run on a node, one agent each).
LISTENABLE = frozenset({Source.EC2_SQS, Source.GKE_PUBSUB, Source.KUEUE, Source.KAFKA})

# Kinds each source can send; the first is the default.
KINDS: Mapping[Source, tuple[str, ...]] = {
    Source.EC2_SQS: ("spot-interruption", "rebalance-recommendation"),
    Source.IMDS: ("spot-interruption",),
    Source.GKE_PUBSUB: ("preemption", "maintenance-terminate", "maintenance-migrate"),
    Source.GCE_METADATA: ("preemption", "maintenance-terminate", "maintenance-migrate"),
    Source.AZURE_SCHEDULED: ("preemption",),
    Source.KUEUE: ("reclaim",),
    Source.KAFKA: (
        "spot_interruption",
        "preemption",
        "maintenance",
        "reclaim",
        "scheduled_change",
        "state_change",
        "rebalance_recommendation",
    ),
}
CLOUD_OF: Mapping[Source, Cloud] = {
    Source.EC2_SQS: Cloud.AWS,
    Source.IMDS: Cloud.AWS,
    Source.GKE_PUBSUB: Cloud.GCE,
    Source.GCE_METADATA: Cloud.GCE,
    Source.AZURE_SCHEDULED: Cloud.AZURE,
}
# Transports that cannot carry a malformed payload: the mock, the stand-in and the apiserver
# all serve well-formed values only.
NO_GARBAGE = frozenset({Source.IMDS, Source.GCE_METADATA, Source.AZURE_SCHEDULED, Source.KUEUE})
# Per-node sources run one reclaimd per targeted node (a DaemonSet pod on a real fleet).
PER_NODE = frozenset({Source.IMDS, Source.GCE_METADATA, Source.AZURE_SCHEDULED})
MAX_PER_NODE_TARGETS = 8
KUEUE_REASONS = (
    "InCohortReclamation",
    "InClusterQueue",
    "InCohortFairSharing",
    "InCohortReclaimWhileBorrowing",
)


class TargetSelector(_Strict):
    """Which nodes (or, for kueue, which gangs) one notice group hits."""

    nodes: tuple[str, ...] = ()  # ``pool-i`` names
    gangs: tuple[str, ...] = ()  # gang names (``group`` or ``group-i``)
    pool: Name | None = None
    zone: str | None = None
    fraction: float | None = Field(None, gt=0.0, le=1.0)
    count: int | None = Field(None, ge=1)

    @model_validator(mode="after")
    def _one_way(self) -> TargetSelector:
        if self.nodes and self.gangs:
            raise ValueError("name nodes or gangs, not both")
        named = bool(self.nodes or self.gangs)
        if named and (self.fraction is not None or self.count is not None):
            raise ValueError("named targets take no fraction or count")
        if not named and (self.fraction is None) == (self.count is None):
            raise ValueError("name nodes or gangs, or give one of fraction and count")
        return self


class NoticeGroup(_Strict):
    source: Source
    kind: str | None = None  # default: the source's first kind
    target: TargetSelector
    at_s: float = Field(0.0, ge=0, le=3600)  # the first send, after reclaimd is up
    spread_s: float = Field(0.0, ge=0, le=3600)  # the group's sends spread evenly over this
    issued_offset_s: float = Field(0.0, ge=-3600, le=0)  # event time minus send time
    duplicates: int = Field(0, ge=0, le=10)  # redeliveries of each notice (same identity)
    duplicate_delay_s: float = Field(0.5, ge=0, le=60)
    malformed: int = Field(0, ge=0, le=100)  # garbage payloads on the same transport
    out_of_order: bool = False  # send the group latest-issued first
    action: Literal["terminate", "stop", "hibernate"] = "terminate"  # EC2 instance-action
    reason: str = "InCohortReclamation"  # kueue preemption reason
    # Workload targets: the scheduler that reclaims stops the pods after their grace.
    pods_stop_after_s: float = Field(3.0, ge=0, le=600)
    window_s: float | None = Field(None, gt=0)  # kafka: the event's deadline - time

    @model_validator(mode="after")
    def _fits_source(self) -> NoticeGroup:
        kinds = KINDS[self.source]
        if self.kind is not None and self.kind not in kinds:
            raise ValueError(f"kind {self.kind!r} is not one of {', '.join(kinds)}")
        if self.malformed and self.source in NO_GARBAGE:
            raise ValueError(f"{self.source.value} cannot carry malformed payloads")
        if self.source is Source.KUEUE and self.reason not in KUEUE_REASONS:
            raise ValueError(f"reason must be one of {', '.join(KUEUE_REASONS)}")
        if self.window_s is not None and self.source is not Source.KAFKA:
            raise ValueError("window_s is for kafka notices; other sources take reclaimd.windows")
        if self.source in PER_NODE and (self.duplicates or self.out_of_order):
            raise ValueError(f"{self.source.value} is polled: its repeats are built in")
        if self.source is Source.KUEUE and self.duplicates:
            raise ValueError("kueue: an eviction is one status change; a watch repeats it")
        wants_gangs = self.source is Source.KUEUE
        if wants_gangs and self.target.nodes:
            raise ValueError("kueue notices target gangs, not nodes")
        if self.target.gangs and self.source not in (Source.KUEUE, Source.KAFKA):
            raise ValueError(f"{self.source.value} notices target nodes, not gangs")
        return self

    @property
    def the_kind(self) -> str:
        return self.kind or KINDS[self.source][0]


# --- reclaimd and expectations ---------------------------------------------------------------

# Sections the drill itself sets (its queue, topics, identity, span files).
DRILL_OWNED = frozenset(
    {
        "kube",
        "sqs",
        "imds",
        "pubsub",
        "gce_metadata",
        "azure_scheduled",
        "kueue",
        "kafka_notices",
        "ledger",
        "tracing",
        "holder",
        "metrics_port",
        "cluster_name",
    }
)


class ReclaimdOverrides(_Strict):
    replicas: int = Field(1, ge=1, le=4)
    windows: dict[str, float] = Field(default_factory=dict)
    policy: dict[str, Any] = Field(default_factory=dict)
    settings: dict[str, Any] = Field(default_factory=dict)  # any other Settings key
    # Central sources the replicas consume besides the scenario's own, with nothing sent on
    # them: what consuming them costs (the storm bench's every-source run).
    listen: tuple[Source, ...] = ()

    @model_validator(mode="after")
    def _valid_settings(self) -> ReclaimdOverrides:
        per_node = sorted(set(self.listen) - LISTENABLE)
        if per_node:
            raise ValueError(f"listen: {per_node[0]} is not a central source a replica consumes")
        owned = sorted(set(self.settings) & (DRILL_OWNED | {"windows", "policy"}))
        if owned:
            raise ValueError(f"settings.{owned[0]} is set by the drill (or by its own key)")
        try:
            reclaimd_config.Settings.model_validate(self.as_settings())
        except ValidationError as e:
            raise ValueError(_first_error(e)) from None
        return self

    def as_settings(self) -> dict[str, Any]:
        out = dict(self.settings)
        if self.windows:
            out["windows"] = dict(self.windows)
        if self.policy:
            out["policy"] = dict(self.policy)
        return out

    @property
    def the_windows(self) -> Windows:
        return handlers.windows(**self.windows)


class RestartGangs(_Strict):
    """The job controller's part: a charged gang whose pods are all gone is made again
    ``after_s`` later, on nodes no notice targets (Kueue gangs excepted: Kueue re-admits
    them itself). reclaimd then charges each one's restart overhead (``reclaimd/restarts.py``),
    and the drill reports it per gang."""

    enabled: bool = False
    after_s: float = Field(0.0, ge=0, le=600)  # the controller's and scheduler's delay


class Expect(_Strict):
    deadlines_met: bool = True  # every notice drained (or signaled) before its deadline
    all_signaled: bool = True  # every opted-in rank of every charged gang was asked
    evicted: bool = True  # every pod of every charged gang is gone
    ledger_exact: bool = True  # one event per affected gang, none else, none twice
    gpu_seconds_tolerance: float = Field(0.05, ge=0)  # per gang, absolute GPU-seconds
    max_notice_to_drained_s: float | None = Field(None, gt=0)
    # The gangs of the notices a paused (or partitioned) replica held when it went silent:
    # their last rank asked with at least this share of the notice's window left (issue 37)
    min_ask_budget: float | None = Field(None, gt=0, le=1)
    traces: bool = True  # one trace per notice, and each event's traceparent in it
    transport_drained: bool = True  # the SQS queue is empty at the end (garbage included)
    timeout_s: float = Field(240.0, gt=0, le=3600)  # wait for reclaimd after the last send
    settle_s: float = Field(3.0, ge=0, le=120)  # keep reading the ledger for duplicates


# --- faults ----------------------------------------------------------------------------------


class FaultKind(StrEnum):
    KILL = "kill"  # SIGKILL a replica; with restart_after_s it comes back on the same disk
    PAUSE = "pause"  # SIGSTOP a replica for for_s, then SIGCONT (a hung process)
    FRESH_DISK = "fresh_disk"  # SIGKILL, then a new replica with an empty state dir
    TERM = "term"  # SIGTERM (a graceful stop); with restart_after_s a successor (rolling upgrade)
    PARTITION = "partition"  # the replica cut off from the apiserver for for_s (only from it)
    STOP_KAFKA = "stop_kafka"  # the broker down for for_s
    RESTART_APISERVER = "restart_apiserver"  # kube-apiserver only: etcd keeps its data
    RESTART_MOTO = "restart_moto"  # loses every queue: the drill recreates the run's
    RESTART_PUBSUB = "restart_pubsub"  # loses every topic: the drill recreates the run's


REPLICA_FAULTS = frozenset(
    {FaultKind.KILL, FaultKind.PAUSE, FaultKind.FRESH_DISK, FaultKind.TERM, FaultKind.PARTITION}
)
STACK_FAULTS = frozenset(set(FaultKind) - REPLICA_FAULTS)
# Faults on the shared stack disturb everyone's tests: a short outage only.
MAX_STACK_OUTAGE_S = 30.0
# A SIGTERMed replica gets this long to exit before it is SIGKILLed, as the kubelet would:
# the shipped manifest's terminationGracePeriodSeconds (deploy/kubernetes/reclaimd.yaml).
TERM_GRACE_S = 60.0


_GONE = {FaultKind.KILL: "killed", FaultKind.TERM: "stopped"}


class Fault(_Strict):
    """One fault, ``at_s`` after reclaimd is up (the clock of ``notices[].at_s``)."""

    kind: FaultKind
    at_s: float = Field(ge=0, le=3600)
    replica: int | None = Field(None, ge=0, le=3)  # replica faults: reclaimd-<i>
    for_s: float | None = Field(None, gt=0, le=600)  # pause, partition, stop_kafka
    # kill: none means killed for good; fresh_disk: the new replica starts after this (1 s);
    # term: a successor (a new holder on a fresh disk) starts this long after the SIGTERM
    restart_after_s: float | None = Field(None, ge=0, le=600)
    grace_s: float | None = Field(None, gt=0, le=600)  # term: time to exit (TERM_GRACE_S)
    # Strike, at or after at_s, whichever replica is first seen holding an open claim (no
    # replica given): "after the claim" without knowing which replica wins the claim's race.
    on_claim: bool = False

    @model_validator(mode="after")
    def _fits_kind(self) -> Fault:
        k = self.kind
        if self.on_claim and k not in REPLICA_FAULTS:
            raise ValueError(f"{k.value} is a stack fault: on_claim strikes a replica")
        if self.on_claim and self.replica is not None:
            raise ValueError("on_claim strikes the claim's holder: give no replica")
        if k in REPLICA_FAULTS and self.replica is None and not self.on_claim:
            raise ValueError(f"{k.value} needs replica (the index of a central reclaimd)")
        if k not in REPLICA_FAULTS and self.replica is not None:
            raise ValueError(f"{k.value} is a stack fault: it takes no replica")
        needs_for = k in (FaultKind.PAUSE, FaultKind.PARTITION, FaultKind.STOP_KAFKA)
        if needs_for and self.for_s is None:
            raise ValueError(f"{k.value} needs for_s (how long)")
        if not needs_for and self.for_s is not None:
            raise ValueError(f"{k.value} takes no for_s")
        restarts = (FaultKind.KILL, FaultKind.FRESH_DISK, FaultKind.TERM)
        if self.restart_after_s is not None and k not in restarts:
            raise ValueError(f"{k.value} takes no restart_after_s")
        if self.grace_s is not None and k is not FaultKind.TERM:
            raise ValueError(f"{k.value} takes no grace_s (only term has a grace period)")
        if k is FaultKind.STOP_KAFKA and (self.for_s or 0.0) > MAX_STACK_OUTAGE_S:
            raise ValueError(f"for_s: at most {MAX_STACK_OUTAGE_S:g}s on the shared stack")
        return self

    @property
    def label(self) -> str:
        who = f" reclaimd-{self.replica}" if self.replica is not None else ""
        who = " (claim holder)" if self.on_claim and not who else who
        return f"{self.kind.value}{who}@{self.at_s:g}s"

    @property
    def restart_s(self) -> float | None:
        """When the replica (or its successor) comes back, after the fault (None: never)."""
        if self.kind is FaultKind.FRESH_DISK:
            return 1.0 if self.restart_after_s is None else self.restart_after_s
        return self.restart_after_s

    @property
    def the_grace_s(self) -> float:
        return TERM_GRACE_S if self.grace_s is None else self.grace_s

    @property
    def for_good(self) -> bool:
        """The replica is gone for good: killed or stopped with nothing coming back."""
        return self.kind in (FaultKind.KILL, FaultKind.TERM) and self.restart_after_s is None

    @property
    def span_s(self) -> float:
        """How long the replica is out (inf: for good): no other fault on it meanwhile."""
        if self.for_good:
            return math.inf
        return (self.for_s or 0.0) + (self.restart_s or 0.0)


class Scenario(_Strict):
    name: str = Field(pattern=r"^[a-z][-a-z0-9]{0,62}$")
    description: str = ""
    seed: int = 1
    cluster: Cluster
    gangs: tuple[GangGroup, ...] = ()
    notices: tuple[NoticeGroup, ...] = Field(min_length=1)
    reclaimd: ReclaimdOverrides = ReclaimdOverrides()
    faults: tuple[Fault, ...] = ()  # in any order; each at its at_s
    restart: RestartGangs = RestartGangs()
    expect: Expect = Expect()

    @model_validator(mode="after")
    def _references(self) -> Scenario:
        _no_duplicates([g.name for g in self.gangs], "gang group")
        pools = {p.name for p in self.cluster.pools}
        for i, g in enumerate(self.gangs):
            for p in g.pools:
                if p not in pools:
                    raise ValueError(f"gangs[{i}].pools: no pool {p!r}")
        for i, n in enumerate(self.notices):
            if n.target.pool is not None and n.target.pool not in pools:
                raise ValueError(f"notices[{i}].target.pool: no pool {n.target.pool!r}")
        self._check_faults()
        return self

    def _check_faults(self) -> None:
        replicas = self.reclaimd.replicas
        sources = {n.source for n in self.notices}
        busy: list[tuple[float, float, int]] = []  # a replica's fault spans (start, end, i)
        gone: set[int] = set()  # replicas killed or stopped for good
        for i, f in enumerate(self.faults):
            where = f"faults[{i}]"
            if f.replica is not None and f.replica >= replicas:
                raise ValueError(
                    f"{where}.replica: {f.replica}, but reclaimd.replicas is {replicas}"
                )
            if f.for_good and replicas < 2:
                raise ValueError(
                    f"{where}: the only replica {_GONE[f.kind]} for good leaves nobody to"
                    " finish; give restart_after_s or reclaimd.replicas >= 2"
                )
            if f.on_claim and (replicas < 2 or len(self.faults) > 1):
                # which replica it strikes is known only then: no overlap check can hold
                raise ValueError(
                    f"{where}: on_claim needs reclaimd.replicas >= 2 and no other fault"
                )
            if f.kind is FaultKind.RESTART_PUBSUB and Source.GKE_PUBSUB not in sources:
                raise ValueError(f"{where}: restart_pubsub needs gke-pubsub notices")
            if f.kind is FaultKind.RESTART_MOTO and Source.EC2_SQS not in sources:
                raise ValueError(f"{where}: restart_moto needs ec2-sqs notices")
            if f.replica is not None:
                end = f.at_s + f.span_s
                for start0, end0, j in busy:
                    if j == f.replica and f.at_s <= end0 and start0 <= end:
                        after = " (gone for good before it)" if math.isinf(end0) else ""
                        raise ValueError(f"{where}: overlaps another fault on reclaimd-{j}{after}")
                busy.append((f.at_s, end, f.replica))
                if f.for_good:
                    gone.add(f.replica)
        if replicas > 1 and len(gone) == replicas:
            raise ValueError(
                f"faults: every replica ({replicas}) is killed or stopped for good, nobody is"
                " left to finish; give one of them restart_after_s"
            )


# --- loading ---------------------------------------------------------------------------------


def _first_error(e: ValidationError) -> str:
    first = e.errors()[0]
    where = ".".join(str(p) for p in first["loc"])
    msg = str(first["msg"]).removeprefix("Value error, ")
    more = f" (and {e.error_count() - 1} more)" if e.error_count() > 1 else ""
    return f"{where + ': ' if where else ''}{msg}{more}"


def _no_duplicates(names: Sequence[str], what: str) -> None:
    seen: set[str] = set()
    for n in names:
        if n in seen:
            raise ValueError(f"two {what}s named {n!r}")
        seen.add(n)


def parse(data: Any, *, origin: str = "scenario") -> Scenario:
    """Validate decoded YAML; ``ScenarioError`` with one line on any mistake."""
    if not isinstance(data, dict):
        raise ScenarioError(f"{origin}: the top level must be a mapping")
    try:
        scenario = Scenario.model_validate(data)
    except ValidationError as e:
        raise ScenarioError(f"{origin}: {_first_error(e)}") from None
    # Placement and targets must work out, too (the plan builds on this module: imported here).
    from chaos.drill.plan import plan

    plan(scenario, run_id="check")
    return scenario


def load(path: str | Path) -> Scenario:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise ScenarioError(f"{p}: {e.strerror or e}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise ScenarioError(f"{p}: not valid YAML{at}") from None
    return parse(data, origin=str(p))
