"""The plan a drill runs, from its scenario (``chaos.drill.scenario``; pure).

``plan`` turns a scenario into concrete objects: node names and instance ids, each gang's
ranks placed on nodes, each rank's behaviour (latency drawn, fail / hang / not-durable chosen),
each notice with its target and its send time. Fractions become exact counts picked with the
scenario's seed, so a scenario always yields the same plan: a drill that fails can be re-run
and fail the same way. Nothing here touches a server; ``chaos.drill.run`` runs the plan."""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property

from chaos.drill.scenario import (
    CLOUD_OF,
    MAX_PER_NODE_TARGETS,
    PER_NODE,
    Cloud,
    GangGroup,
    Integration,
    NoticeGroup,
    Placement,
    Scenario,
    ScenarioError,
    Scope,
    Source,
    TargetSelector,
    _no_duplicates,
)
from reclaimd import handlers
from reclaimd.model import Windows

# --- the plan --------------------------------------------------------------------------------


@dataclass(frozen=True)
class PlannedNode:
    key: str  # ``pool-i``, as the scenario names it
    name: str  # the Kubernetes node name (unique per run)
    pool: str
    instance_id: str
    gpus: int
    sku: str
    zone: str
    purchase_option: str
    cell: str
    cloud: Cloud
    project: str


@dataclass(frozen=True)
class PlannedRank:
    rank: int
    node: str  # node key
    latency_s: float
    fail: bool
    hang: bool
    durable: bool


@dataclass(frozen=True)
class PlannedGang:
    name: str
    group: str
    ranks: tuple[PlannedRank, ...]
    gpus_per_rank: int
    opt_in: bool
    scope: Scope
    timeout_s: float
    integration: Integration
    tenant: str
    queue: str
    labels: Mapping[str, str]
    pdb_max_unavailable: int | None
    last_checkpoint_age_s: float
    pod_age_s: float

    @property
    def nodes(self) -> frozenset[str]:
        return frozenset(r.node for r in self.ranks)


@dataclass(frozen=True)
class PlannedNotice:
    """One notice (its duplicates included) to send."""

    index: int  # in send order of the whole drill
    group: int  # index of its notice group
    source: Source
    kind: str
    node: str | None  # node key, for node targets
    gang: str | None  # gang name, for workload targets
    send_at_s: float  # after the drill's start
    issued_at_s: float  # the event's own time, after the drill's start
    copies: int  # 1 + duplicates
    duplicate_delay_s: float
    action: str = "terminate"
    reason: str = ""
    pods_stop_after_s: float = 0.0
    window_s: float | None = None

    @property
    def label(self) -> str:
        return f"{self.source.value}#{self.index}"


@dataclass(frozen=True)
class PlannedGarbage:
    group: int
    source: Source
    send_at_s: float
    variant: int  # which malformed payload (the injector rotates through its set)


@dataclass(frozen=True)
class Plan:
    scenario: Scenario
    run_id: str
    nodes: tuple[PlannedNode, ...]
    gangs: tuple[PlannedGang, ...]
    notices: tuple[PlannedNotice, ...]
    garbage: tuple[PlannedGarbage, ...]
    windows: Windows = field(default_factory=handlers.windows)

    def node(self, key: str) -> PlannedNode:
        return self._nodes[key]

    def gang(self, name: str) -> PlannedGang:
        return self._gangs[name]

    @cached_property
    def _nodes(self) -> dict[str, PlannedNode]:
        return {n.key: n for n in self.nodes}

    @cached_property
    def _gangs(self) -> dict[str, PlannedGang]:
        return {g.name: g for g in self.gangs}

    def gangs_on(self, node_key: str) -> tuple[PlannedGang, ...]:
        return tuple(g for g in self.gangs if node_key in g.nodes)

    def sources(self) -> frozenset[Source]:
        sent = frozenset(n.source for n in self.notices) | frozenset(g.source for g in self.garbage)
        return sent | frozenset(self.scenario.reclaimd.listen)


def node_name(run_id: str, key: str) -> str:
    return f"d{run_id}-{key}"


def instance_id(run_id: str, key: str) -> str:
    return "i-" + hashlib.sha256(f"{run_id}/{key}".encode()).hexdigest()[:17]


def azure_vm_name(run_id: str, pool: str, index: int) -> str:
    """An AKS node's VM, as IMDS and Scheduled Events name it: its pool's scale set
    (``aks-<pool>-<8 hex>-vmss``, unique per run) and its instance id."""
    digest = hashlib.sha256(f"{run_id}/{pool}".encode()).hexdigest()[:8]
    return f"aks-{pool}-{digest}-vmss_{index}"


def plan(scenario: Scenario, *, run_id: str) -> Plan:
    """The concrete drill for ``run_id`` (names only depend on it; choices on the seed)."""
    rng = random.Random(scenario.seed)
    nodes = _plan_nodes(scenario, run_id)
    gangs = _plan_gangs(scenario, nodes, rng)
    try:
        _no_duplicates([g.name for g in gangs], "gang")
    except ValueError as e:
        raise ScenarioError(f"gangs: {e}") from None
    notices, garbage = _plan_notices(scenario, nodes, gangs, rng)
    return Plan(
        scenario=scenario,
        run_id=run_id,
        nodes=tuple(nodes),
        gangs=tuple(gangs),
        notices=notices,
        garbage=garbage,
        windows=scenario.reclaimd.the_windows,
    )


def _plan_nodes(scenario: Scenario, run_id: str) -> list[PlannedNode]:
    nodes = []
    for pool in scenario.cluster.pools:
        for i in range(pool.count):
            key = f"{pool.name}-{i}"
            nodes.append(
                PlannedNode(
                    key=key,
                    name=node_name(run_id, key),
                    pool=pool.name,
                    instance_id=azure_vm_name(run_id, pool.name, i)
                    if pool.cloud is Cloud.AZURE
                    else instance_id(run_id, key),
                    gpus=pool.gpus,
                    sku=pool.sku,
                    zone=pool.zone,
                    purchase_option=pool.purchase_option.value,
                    cell=pool.cell,
                    cloud=pool.cloud,
                    project=pool.project,
                )
            )
    return nodes


def _interleaved(nodes: Sequence[PlannedNode]) -> list[PlannedNode]:
    """Round-robin over pools, so that consecutive nodes sit in different pools (zones)."""
    by_pool: dict[str, list[PlannedNode]] = {}
    for n in nodes:
        by_pool.setdefault(n.pool, []).append(n)
    out: list[PlannedNode] = []
    columns = list(by_pool.values())
    for i in range(max((len(c) for c in columns), default=0)):
        out.extend(c[i] for c in columns if i < len(c))
    return out


def _exact(rng: random.Random, items: Sequence[int], fraction: float) -> set[int]:
    """``round(fraction x len)`` of ``items``, picked with the seed: fractions are exact."""
    k = round(fraction * len(items))
    return set(rng.sample(list(items), k)) if k else set()


def _plan_gangs(
    scenario: Scenario, nodes: Sequence[PlannedNode], rng: random.Random
) -> list[PlannedGang]:
    free = {n.key: n.gpus for n in nodes}
    by_key = {n.key: n for n in nodes}
    out: list[PlannedGang] = []
    for gi, group in enumerate(scenario.gangs):
        where = f"gangs[{gi}]"
        candidates = _interleaved([n for n in nodes if not group.pools or n.pool in group.pools])
        names = (
            [group.name] if group.count == 1 else [f"{group.name}-{i}" for i in range(group.count)]
        )
        b = group.checkpoint
        opted = _exact(rng, range(group.count), b.opt_in)
        placements = [
            _place(group, candidates=candidates, free=free, by_key=by_key, where=where, gang=name)
            for name in names
        ]
        # Fail, hang and not-durable are fractions of the group's opted-in ranks.
        slots = [(g, r) for g in sorted(opted) for r in range(group.ranks)]
        ids = list(range(len(slots)))
        hang = _exact(rng, ids, b.hang)
        rest = [i for i in ids if i not in hang]
        fail = set(rng.sample(rest, min(len(rest), round(b.fail * len(ids)))))
        saving = [i for i in rest if i not in fail]
        not_durable = _exact(rng, saving, 1.0 - b.durable)
        flags = {slots[i]: (i in fail, i in hang, i not in not_durable) for i in ids}
        for g, name in enumerate(names):
            ranks = tuple(
                PlannedRank(
                    rank=r,
                    node=placements[g][r],
                    latency_s=round(b.ack_latency_s.sample(rng), 3),
                    fail=flags.get((g, r), (False, False, True))[0],
                    hang=flags.get((g, r), (False, False, True))[1],
                    durable=flags.get((g, r), (False, False, True))[2],
                )
                for r in range(group.ranks)
            )
            out.append(
                PlannedGang(
                    name=name,
                    group=group.name,
                    ranks=ranks,
                    gpus_per_rank=group.gpus_per_rank,
                    opt_in=g in opted,
                    scope=b.scope,
                    timeout_s=b.timeout_s,
                    integration=group.integration,
                    tenant=group.tenant,
                    queue=group.queue,
                    labels=dict(group.labels),
                    pdb_max_unavailable=group.pdb_max_unavailable,
                    last_checkpoint_age_s=round(b.last_checkpoint_age_s.sample(rng), 3),
                    pod_age_s=b.pod_age_s,
                )
            )
    return out


def _place(
    group: GangGroup,
    *,
    candidates: Sequence[PlannedNode],
    free: dict[str, int],
    by_key: Mapping[str, PlannedNode],
    where: str,
    gang: str,
) -> list[str]:
    need = group.gpus_per_rank
    chosen: list[str] = []
    if group.placement is Placement.EXPLICIT:
        for r, key in enumerate(group.nodes):
            if key not in by_key:
                raise ScenarioError(f"{where}.nodes[{r}]: no node {key!r}")
            if free[key] < need:
                raise ScenarioError(f"{where}.nodes[{r}]: {key} has {free[key]} GPUs free")
            free[key] -= need
            chosen.append(key)
        return chosen
    for r in range(group.ranks):
        if group.placement is Placement.PACKED:
            fits = [n.key for n in candidates if free[n.key] >= need]
            # Keep filling the node the previous rank went to; else the first that has room.
            key = chosen[-1] if chosen and free[chosen[-1]] >= need else (fits[0] if fits else "")
        else:
            fits = [n.key for n in candidates if free[n.key] >= need and n.key not in chosen]
            # Most free GPUs first; ties keep the interleaved order, so gangs cross zones.
            key = max(fits, key=lambda k: free[k], default="")
        if not key:
            raise ScenarioError(
                f"{where}: gang {gang} rank {r} does not fit: no node with {need} free GPUs"
                + (" not already used by the gang" if group.placement is Placement.SPREAD else "")
            )
        free[key] -= need
        chosen.append(key)
    return chosen


def _plan_notices(
    scenario: Scenario,
    nodes: Sequence[PlannedNode],
    gangs: Sequence[PlannedGang],
    rng: random.Random,
) -> tuple[tuple[PlannedNotice, ...], tuple[PlannedGarbage, ...]]:
    drafts: list[PlannedNotice] = []
    garbage: list[PlannedGarbage] = []
    per_node_targets: set[str] = set()
    for ni, group in enumerate(scenario.notices):
        where = f"notices[{ni}].target"
        source = group.source
        targets = _targets(group, nodes, gangs, rng, where)
        if source in PER_NODE:
            per_node_targets.update(targets)
        n = len(targets)
        times = [group.at_s + (group.spread_s * i / (n - 1) if n > 1 else 0.0) for i in range(n)]
        sends = list(reversed(times)) if group.out_of_order else times
        wants_gangs = source is Source.KUEUE or bool(group.target.gangs)
        for i, target in enumerate(targets):
            drafts.append(
                PlannedNotice(
                    index=0,
                    group=ni,
                    source=source,
                    kind=group.the_kind,
                    node=None if wants_gangs else target,
                    gang=target if wants_gangs else None,
                    send_at_s=round(sends[i], 3),
                    issued_at_s=round(times[i] + group.issued_offset_s, 3),
                    copies=1 + group.duplicates,
                    duplicate_delay_s=group.duplicate_delay_s,
                    action=group.action,
                    reason=group.reason if source is Source.KUEUE else "",
                    pods_stop_after_s=group.pods_stop_after_s if wants_gangs else 0.0,
                    window_s=group.window_s,
                )
            )
        for k in range(group.malformed):
            at = group.at_s + (group.spread_s * k / max(1, group.malformed - 1))
            garbage.append(PlannedGarbage(ni, source, round(at, 3), k))
    if len(per_node_targets) > MAX_PER_NODE_TARGETS:
        raise ScenarioError(
            "notices: per-node sources (imds, gce-metadata, azure-scheduled) run one reclaimd"
            " per node;"
            f" at most {MAX_PER_NODE_TARGETS} such nodes, not {len(per_node_targets)}"
        )
    ordered = sorted(drafts, key=lambda d: (d.send_at_s, d.group, d.issued_at_s))
    notices = tuple(replace(d, index=i) for i, d in enumerate(ordered))
    return notices, tuple(sorted(garbage, key=lambda g: (g.send_at_s, g.group, g.variant)))


def _targets(
    group: NoticeGroup,
    nodes: Sequence[PlannedNode],
    gangs: Sequence[PlannedGang],
    rng: random.Random,
    where: str,
) -> list[str]:
    sel = group.target
    wants_gangs = group.source is Source.KUEUE or bool(sel.gangs)
    if wants_gangs:
        # A notice names a gang by its Kueue Workload: only Kueue gangs have one.
        pool = [g.name for g in gangs if g.integration is Integration.KUEUE]
        known = {g.name for g in gangs}
        for name in sel.gangs:
            if name not in known:
                raise ScenarioError(f"{where}.gangs: no gang {name!r}")
            if name not in pool:
                raise ScenarioError(f"{where}.gangs: {name} is not a kueue gang")
        chosen = list(sel.gangs) or _pick(pool, sel, rng, where, "kueue gangs")
        return chosen
    cloud = CLOUD_OF.get(group.source)
    by_key = {n.key: n for n in nodes}
    for key in sel.nodes:
        if key not in by_key:
            raise ScenarioError(f"{where}.nodes: no node {key!r}")
    candidates = [
        n.key
        for n in nodes
        if (sel.pool is None or n.pool == sel.pool) and (sel.zone is None or n.zone == sel.zone)
    ]
    chosen = list(sel.nodes) or _pick(candidates, sel, rng, where, "nodes")
    for key in chosen:
        if cloud is not None and by_key[key].cloud is not cloud:
            raise ScenarioError(
                f"{where}: {key} is a {by_key[key].cloud.value} node;"
                f" {group.source.value} notices need {cloud.value} nodes"
            )
    return chosen


def _pick(
    pool: Sequence[str], sel: TargetSelector, rng: random.Random, where: str, what: str
) -> list[str]:
    if not pool:
        raise ScenarioError(f"{where}: no {what} match")
    k = sel.count if sel.count is not None else math.ceil((sel.fraction or 0.0) * len(pool))
    if k > len(pool):
        raise ScenarioError(f"{where}: count {k} is more than the {len(pool)} {what} that match")
    picked = set(rng.sample(list(pool), k))
    return [p for p in pool if p in picked]  # in fleet order, so plans read naturally
