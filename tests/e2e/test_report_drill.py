"""Known answers for ``reclaimd report``: a real drill, metered and billed, priced to the cent.

A small drill runs on the local stack: four spot and two on-demand p5.48xlarge nodes, a gang
spanning both kinds, a gang that checkpoints durably, one that never opted in, one that no
notice touches, and three EC2 Spot warnings through SQS. Beside it, in this process, an
allocation ``Meter`` watches the drill's namespace through a real ``ClusterCache`` and writes
its rows to a Kafka topic of the run. The test then writes a FOCUS export with known hourly
rates for exactly the drill's instances and hours, runs ``reclaimd report --format json`` (the
CLI, a subprocess) on the ledger and the bill, and checks every money figure to the cent
against what it computes itself from the drill's ground truth: the GPUs the drill placed on
each instance, the GPU-seconds each rank lost (``chaos.drill.verdict``'s rule over the facts the
drill recorded, never reclaimd's own numbers), the rates it chose and each instance's
purchase option. The JSON-lines export and the Kafka topics must give the same report.

**When the meter looks.** The meter integrates what it sees at each look over the time since
the previous one, so a look at a moment of change would make its figure depend on timing.
Its looks are therefore put where the drill's ground truth is certain: the first at the
latest (backdated) pod start, from when the drill's fiction has every trainer running; the
second real, just before the first notice goes out, with every pod known to be running.
So the allocation it must record is each rank's GPUs x that interval, split at the hour.
What the pods held after the second look is not metered (the meter under-reports rather
than guesses); a look two hours on closes the hours and writes the rows.
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import json
import sys
from collections import defaultdict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from chaos import stack as stackenv
from chaos.drill import plan as planning
from chaos.drill import run as drill
from chaos.drill import scenario
from chaos.drill.verdict.facts import GangFacts, gang_of
from chaos.drill.verdict.gpuseconds import expected_gpu_seconds
from chaos.drill.verdict.render import render
from chaos.harness import Harness
from reclaimd import meter
from reclaimd.cluster import apiserver, errors
from reclaimd.cluster.apiserver import ApiServer
from reclaimd.cluster.cache import ClusterCache
from reclaimd.cluster.connect import build_api_client
from reclaimd.ledger.writer import LedgerWriter
from reclaimd.model import parse_time, rfc3339, utcnow
from reclaimd.settings.allocation import AllocationSettings
from reclaimd.settings.cache import CacheSettings

REPO = Path(__file__).resolve().parents[2]
ACCOUNT = "123456789012"
SKU = "p5.48xlarge"
GPUS_PER_INSTANCE = 8  # p5.48xlarge (reclaimd/skus.py): an instance-hour is 8 GPU-hours
OD_RATE = 12.29  # USD per GPU-hour on demand (98.32 per instance-hour)
UNALLOCATED = "unallocated"  # the report's group for billed GPUs nobody held (not committed)
SLACK_USD = 0.001  # ledger and meter rounding (0.001 GPU-s, 1e-6 GPU-h) is far below this

SCENARIO: dict[str, Any] = {
    "name": "finops-known-answer",
    "description": "spot + on-demand pools, a gang across both, three spot warnings",
    "seed": 12,
    "cluster": {
        "pools": [
            {"name": "s", "count": 4, "gpus": 8, "sku": SKU, "zone": "us-east-2a",
             "purchase_option": "spot", "cell": "use2-cell-1"},
            {"name": "od", "count": 2, "gpus": 8, "sku": SKU, "zone": "us-east-2b",
             "purchase_option": "on_demand", "cell": "use2-cell-2"},
        ]
    },
    "gangs": [
        # spot and on-demand ranks; saves land on local disk only: all lose since 25 min ago
        {"name": "mixed", "ranks": 4, "gpus_per_rank": 4, "placement": "explicit",
         "nodes": ["s-0", "s-1", "od-0", "od-1"], "tenant": "team-a", "queue": "pretrain",
         "checkpoint": {"durable": 0.0, "ack_latency_s": 0.1, "last_checkpoint_age_s": 1500,
                        "pod_age_s": 3600}},
        # saves durably in time: loses only the seconds since its fresh checkpoint
        {"name": "ok", "ranks": 2, "gpus_per_rank": 4, "placement": "explicit",
         "nodes": ["s-1", "s-2"], "tenant": "team-b", "queue": "research",
         "checkpoint": {"ack_latency_s": 0.2, "last_checkpoint_age_s": 900, "pod_age_s": 3600}},
        # no checkpoint contract; restarted after its last checkpoint: loses since its start
        {"name": "solo", "ranks": 1, "gpus_per_rank": 8, "placement": "explicit",
         "nodes": ["s-3"], "tenant": "team-b", "queue": "eval",
         "checkpoint": {"opt_in": 0, "last_checkpoint_age_s": 2400, "pod_age_s": 1800}},
        # on-demand, never touched: allocation only
        {"name": "idle", "ranks": 1, "gpus_per_rank": 4, "placement": "explicit",
         "nodes": ["od-0"], "tenant": "team-c", "queue": "eval",
         "checkpoint": {"opt_in": 0, "pod_age_s": 3600}},
    ],
    "notices": [
        {"source": "ec2-sqs", "kind": "spot-interruption",
         "target": {"nodes": ["s-0", "s-2", "s-3"]}},
    ],
    # no latency bound: this drill is about what the interruptions cost, not how fast they went
    "expect": {"timeout_s": 150, "settle_s": 1},
}  # fmt: skip

# What the scenario is built to produce, per gang (the drill's trainers decide it).
OUTCOMES = {"mixed": "not_durable", "ok": "checkpointed", "solo": "not_opted_in"}
OUTCOME_COLUMNS = ("checkpointed", "partial", "not_durable", "no_ack", "not_opted_in")


def hour_of(t: datetime) -> datetime:
    return t.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def hours_between(a: datetime, b: datetime) -> list[datetime]:
    out, h = [], hour_of(a)
    while h <= b:
        out.append(h)
        h += timedelta(hours=1)
    return out


def overlap_s(a: datetime, b: datetime, hour: datetime) -> float:
    lo, hi = max(a, hour), min(b, hour + timedelta(hours=1))
    return max(0.0, (hi - lo).total_seconds())


# --- the bill --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rates:
    """USD per GPU-hour of each instance in each hour: spot moves by instance and by hour, so
    a waste part priced on the wrong instance or in the wrong hour shows in the cents."""

    nodes: Sequence[planning.PlannedNode]
    first_hour: datetime

    def __call__(self, node: planning.PlannedNode, hour: datetime) -> float:
        if node.purchase_option == "on_demand":
            return OD_RATE
        i = [n.key for n in self.nodes].index(node.key)
        k = int((hour - self.first_hour).total_seconds() // 3600)
        return round(3.9137 + 0.1031 * i + 0.2719 * k, 4)


FOCUS_COLUMNS = (
    "BillingAccountId", "ProviderName", "ChargePeriodStart", "ChargePeriodEnd",
    "ChargeCategory", "ServiceCategory", "ResourceId", "ResourceType", "SkuId",
    "PricingCategory", "RegionId", "AvailabilityZone", "ConsumedQuantity", "ConsumedUnit",
    "EffectiveCost", "ListCost", "BilledCost", "Tags",
)  # fmt: skip


def focus_export(path: Path, plan: planning.Plan, hours: Sequence[datetime], rates: Rates) -> int:
    """One FOCUS usage row per drill instance and hour (ARN resource ids, as AWS writes
    them), plus a tax line on one of them that must not change any rate. Returns rows."""
    rows = []
    for hour in hours:
        for n in plan.nodes:
            cost = round(rates(n, hour) * GPUS_PER_INSTANCE, 6)
            rows.append(
                {
                    "BillingAccountId": ACCOUNT,
                    "ProviderName": "AWS",
                    "ChargePeriodStart": rfc3339(hour),
                    "ChargePeriodEnd": rfc3339(hour + timedelta(hours=1)),
                    "ChargeCategory": "Usage",
                    "ServiceCategory": "Compute",
                    "ResourceId": f"arn:aws:ec2:{n.zone[:-1]}:{ACCOUNT}:instance/{n.instance_id}",
                    "ResourceType": "Instance",
                    "SkuId": n.sku,
                    "PricingCategory": "Dynamic" if n.purchase_option == "spot" else "Standard",
                    "RegionId": n.zone[:-1],
                    "AvailabilityZone": n.zone,
                    "ConsumedQuantity": "1",
                    "ConsumedUnit": "Hours",
                    "EffectiveCost": repr(cost),
                    "ListCost": repr(round(OD_RATE * GPUS_PER_INSTANCE, 6)),
                    "BilledCost": repr(cost),
                    "Tags": json.dumps({"team": "ml-platform"}),
                }
            )
    rows.append({**rows[0], "ChargeCategory": "Tax", "EffectiveCost": "7.77", "BilledCost": "7.77"})
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FOCUS_COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    return len(rows)


# --- the drill, metered ----------------------------------------------------------------------


class TeeWriter(LedgerWriter):
    """The meter's real outbox-and-Kafka writer, keeping a copy of each row for the export."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.rows: list[dict[str, Any]] = []

    async def record_encoded(
        self, event_id: str, key: bytes, value: bytes, headers: tuple[tuple[str, bytes], ...]
    ) -> bool:
        self.rows.append(json.loads(value))
        return await super().record_encoded(event_id, key, value, headers)


class MeteredDrill(drill.Drill):
    """The drill, with a hook between building the fleet and sending the first notice, and
    the ground-truth facts of each gang kept for the test's own arithmetic."""

    def __init__(
        self, *args: Any, before_notices: Callable[[MeteredDrill], Awaitable[None]], **kw: Any
    ) -> None:
        super().__init__(*args, **kw)
        self.before_notices = before_notices
        self.facts: dict[str, GangFacts] = {}

    async def _inject(self, h: Harness) -> None:
        await self.before_notices(self)
        await super()._inject(h)

    def _gang_facts(
        self, g: planning.PlannedGang, namespace: str, alive: set[str]
    ) -> GangFacts:
        facts = super()._gang_facts(g, namespace, alive)
        self.facts[g.name] = facts
        return facts


@dataclass
class Clock:
    now: datetime = field(default_factory=utcnow)

    def __call__(self) -> datetime:
        return self.now


async def wait_seen(fleet: meter.CacheFleet, plan: planning.Plan, timeout_s: float = 20) -> None:
    """Until the cache holds every pod of the plan, placed, and every node."""
    pods = {f"{g.name}-{r.rank}" for g in plan.gangs for r in g.ranks}
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout_s
    while loop.time() < end:
        seen = {
            p["metadata"]["name"] for p in fleet.gpu_pods() if (p.get("spec") or {}).get("nodeName")
        }
        if seen >= pods and all(fleet.node(n.name) is not None for n in plan.nodes):
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"the meter's cache did not see the drill's pods in {timeout_s}s")


async def create_topic(bootstrap: str, topic: str) -> None:
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])
    finally:
        await admin.close()


async def delete_leases(api: ApiServer, cluster: str, hours: Sequence[datetime]) -> None:
    for hour in hours:
        with contextlib.suppress(errors.NotFound), errors.kube_errors("delete lease"):
            await api.delete(apiserver.lease("default", meter.lease_name(cluster, hour)))


async def run_report(*args: str) -> dict[str, Any]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "reclaimd.cli", "report", *args, "--format", "json",
        cwd=REPO, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()[-2000:]
    doc: dict[str, Any] = json.loads(out)
    return doc


# --- expected figures, from ground truth -----------------------------------------------------


@dataclass
class Expected:
    figures: dict[str, dict[str, float]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(float))
    )
    notices: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    gangs: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    outcomes: dict[str, dict[str, int]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(int))
    )

    def add(self, group: str, **amounts: float) -> None:
        for k, v in amounts.items():
            self.figures[group][k] += v


@dataclass(frozen=True)
class Truth:
    """What the drill did, as it recorded it: the plan, the meter's looks, the gangs' facts
    and the event that charged each gang (for its stop time and notice)."""

    plan: planning.Plan
    looks: tuple[datetime, datetime]
    facts: Mapping[str, GangFacts]
    events: Mapping[str, Mapping[str, Any]]
    rates: Rates
    hours: Sequence[datetime]  # the bill's hours


def expect_allocation(by: str, truth: Truth, out: Expected) -> None:
    """Each rank held its GPUs on its node between the meter's looks, priced hour by hour."""
    t1, t2 = truth.looks
    for g in truth.plan.gangs:
        for r in g.ranks:
            node = truth.plan.node(r.node)
            group = g.tenant if by == "tenant" else node.purchase_option
            for hour in hours_between(t1, t2):
                gpu_h = g.gpus_per_rank * overlap_s(t1, t2, hour) / 3600
                rate = truth.rates(node, hour)
                spot = node.purchase_option == "spot"
                out.add(
                    group,
                    allocated_gpu_hours=gpu_h,
                    allocated_cost=gpu_h * rate,
                    gpu_hours_spot=gpu_h if spot else 0.0,
                    gpu_hours_on_demand=0.0 if spot else gpu_h,
                    cost_spot=gpu_h * rate if spot else 0.0,
                    cost_on_demand=0.0 if spot else gpu_h * rate,
                    spot_gross_savings=gpu_h * (OD_RATE - rate) if spot else 0.0,
                )


def rank_parts(
    facts: GangFacts, g: planning.PlannedGang, stopped: datetime
) -> dict[str, float]:
    """GPU-seconds the gang lost on each node (node key), by ``chaos.drill.verdict``'s rule."""
    assert facts.scope == "rank"  # per-rank losses are independent only in rank scope
    node_of = {f"{g.name}-{r.rank}": r.node for r in g.ranks}
    out: dict[str, float] = {}
    for key in sorted({r.node for r in g.ranks}):
        mine = tuple(r for r in facts.ranks if node_of[r.pod] == key)
        low, high = expected_gpu_seconds(replace(facts, ranks=mine), stopped)
        assert abs(high - low) < 1e-9, f"{g.name}: an ack raced the budget, no exact answer"
        out[key] = low
    return out


def expect_waste(by: str, truth: Truth, out: Expected) -> None:
    """Each rank's loss, priced on its own instance in the hour it stopped."""
    for name, ev in truth.events.items():
        g = truth.plan.gang(name)
        stopped = parse_time(ev["ChargePeriodEnd"])
        for key, gpu_s in rank_parts(truth.facts[name], g, stopped).items():
            node = truth.plan.node(key)
            group = g.tenant if by == "tenant" else node.purchase_option
            cost = gpu_s / 3600 * truth.rates(node, hour_of(stopped))
            spot = node.purchase_option == "spot"
            out.add(
                group,
                restart_waste_gpu_hours=gpu_s / 3600,
                restart_waste_cost=cost,
                restart_waste_cost_spot=cost if spot else 0.0,
            )
            out.notices[group].add(ev["x_NoticeId"])
            out.gangs[group].add(name)
        if by == "tenant":  # a gang's outcome counts once, in its tenant
            out.outcomes[g.tenant][ev["x_CheckpointOutcome"]] += 1


def check_ledger_split(truth: Truth) -> None:
    """Each gang's event is split by instance, each part on the instance it ran on and
    carrying the GPU-seconds its ranks lost there."""
    for name, ev in truth.events.items():
        assert ev["x_CheckpointOutcome"] == OUTCOMES[name], (name, ev["x_CheckpointOutcome"])
        g = truth.plan.gang(name)
        parts = rank_parts(truth.facts[name], g, parse_time(ev["ChargePeriodEnd"]))
        by_node = {p["x_K8sNodeName"]: p for p in ev["x_WasteByInstance"]}
        assert set(by_node) == {truth.plan.node(k).name for k in parts}
        for key, gpu_s in parts.items():
            node = truth.plan.node(key)
            part = by_node[node.name]
            assert part["x_PlacementSource"] == "node", part
            assert (part["ResourceId"], part["x_PurchaseOption"]) == (
                node.instance_id,
                node.purchase_option,
            )
            assert abs(part["x_WastedGpuSeconds"] - gpu_s) <= 0.05, (name, key, part, gpu_s)


def same_cent(shown: float, exact: float) -> bool:
    """The report shows money to the cent: ``shown`` must be the cent of ``exact``, or of a
    value within rounding (``SLACK_USD``) of it when ``exact`` sits on a half-cent."""
    return any(abs(shown - round(exact + d, 2)) < 1e-9 for d in (-SLACK_USD, 0.0, SLACK_USD))


def check_money(doc: Mapping[str, Any], by: str, want: Expected) -> list[str]:
    """Every money figure and hour of every group; returns the mismatches (and prints all)."""
    groups = {g[by]: g for g in doc["groups"]}
    problems: list[str] = []
    if set(groups) != set(want.figures):
        problems.append(f"groups {sorted(groups)} != {sorted(want.figures)}")
    print(f"\n  by {by}: group, figure, report, expected")
    for key, f in sorted(want.figures.items()):
        got = groups.get(key)
        if got is None:
            continue
        exact: dict[str, float] = defaultdict(float, f)  # a group without waste has none
        exact["effective_cost"] = exact["allocated_cost"] + exact["restart_waste_cost"]
        exact["spot_net_savings"] = exact["spot_gross_savings"] - exact["restart_waste_cost_spot"]
        for name in ("allocated_cost", "cost_spot", "cost_on_demand", "restart_waste_cost",
                     "effective_cost", "spot_net_savings"):  # fmt: skip
            print(f"  {key:<10} {name:<20} {got[name]:>12.2f} {exact[name]:>14.6f}")
            if not same_cent(got[name], exact[name]):
                problems.append(f"{key} {name}: report {got[name]} vs {exact[name]:.6f}")
        for name in ("allocated_gpu_hours", "gpu_hours_spot", "gpu_hours_on_demand",
                     "restart_waste_gpu_hours"):  # fmt: skip
            print(f"  {key:<10} {name:<20} {got[name]:>12.6f} {exact[name]:>14.6f}")
            if abs(got[name] - exact[name]) > 2e-5:
                problems.append(f"{key} {name}: report {got[name]} vs {exact[name]:.6f}")
        share = exact["restart_waste_gpu_hours"] / exact["allocated_gpu_hours"]
        if abs(got["waste_share"] - share) > 2e-6:
            problems.append(f"{key} waste_share: report {got['waste_share']} vs {share:.6f}")
        if (got["notices"], got["gangs_hit"]) != (len(want.notices[key]), len(want.gangs[key])):
            problems.append(f"{key} notices/gangs_hit: {got['notices']}/{got['gangs_hit']}")
        if got["deadline_misses"] != 0 or got["unpriced_gpu_hours"] != 0:
            problems.append(f"{key}: deadline misses or unpriced hours")
    return problems


# --- the test --------------------------------------------------------------------------------


@dataclass
class Run:
    drill: MeteredDrill
    looks: tuple[datetime, datetime]
    alloc_rows: list[dict[str, Any]]
    alloc_topic: str


async def metered_drill(env: stackenv.StackEnv, tmp_path: Path) -> Run:
    """The drill, with a meter on its namespace looking where the ground truth is certain;
    returns once the meter's rows for every hour of the drill are on their topic."""
    run_id = f"fk{utcnow():%H%M%S}"
    cluster = f"drill-{run_id}"
    alloc_topic = f"reclaimd.allocation.{run_id}"
    await create_topic(env.kafka, alloc_topic)
    api = await build_api_client(env.kubeconfig)
    cache = ClusterCache(
        api, settings=CacheSettings(namespaces=(f"rc-{run_id}",), watch_workloads=False)
    )
    writer = TeeWriter(
        bootstrap_servers=env.kafka, topic=alloc_topic, outbox_path=tmp_path / "alloc.sqlite"
    )
    clock = Clock()
    fleet = meter.CacheFleet(cache.view)
    m = meter.Meter(
        fleet,
        writer,
        meter.LeaseHourLock(api, "default", f"known-answer-{run_id}", cluster),
        cluster=cluster,
        # Gaps up to an hour count: the two looks are ~30 min of drill apart.
        settings=AllocationSettings(interval_s=900),
        clock=clock,
    )
    looks: list[datetime] = []

    async def two_looks(d: MeteredDrill) -> None:
        await wait_seen(fleet, d.plan)
        for at in (max(d.built.started.values()), utcnow()):
            # first: the latest pod start (every trainer runs from then on); second: now,
            # real, with the first notice sent right after it
            clock.now = at
            await m.tick()
            looks.append(at)

    d = MeteredDrill(
        scenario.parse(SCENARIO),
        env,
        progress=drill.Progress(quiet=True),
        run_id=run_id,
        before_notices=two_looks,
    )
    await cache.start()
    writer.start()
    try:
        assert await cache.wait_synced(20), "the meter's cache did not sync"
        verdict = await d.run()
        assert verdict.ok, render(verdict, all_rows=True)
        last_stop = max(parse_time(e["ChargePeriodEnd"]) for e in d.events)
        clock.now = hour_of(last_stop) + timedelta(hours=2)  # closes every hour of the drill
        await m.tick()
        assert await writer.flush(timeout_s=20), "allocation rows not published"
    finally:
        await writer.close()
        await cache.stop()
        await delete_leases(api, cluster, sorted({hour_of(t) for t in [*looks, clock.now]}))
        await api.close()
    assert writer.rows and all(r["ResourceId"] for r in writer.rows)
    return Run(d, (looks[0], looks[1]), writer.rows, alloc_topic)


def expect_unallocated(truth: Truth) -> tuple[float, float]:
    """(GPU-hours, cost) the bill charged for the drill's instances and no rank held as the
    meter saw it (before its first look, after its last, the GPUs no rank asked for), at
    each hour's rate. Only instances the meter saw (a rank on them) are in the report."""
    t1, t2 = truth.looks
    held: dict[tuple[str, datetime], float] = defaultdict(float)
    for g in truth.plan.gangs:
        for r in g.ranks:
            for hour in truth.hours:
                held[r.node, hour] += g.gpus_per_rank * overlap_s(t1, t2, hour) / 3600
    gpu_h = cost = 0.0
    for key in sorted({k for k, _ in held}):
        node = truth.plan.node(key)
        for hour in truth.hours:
            idle = GPUS_PER_INSTANCE - held[key, hour]
            if idle > 1e-9:
                gpu_h += idle
                cost += idle * truth.rates(node, hour)
    return gpu_h, cost


def check_unallocated(groups: Sequence[Mapping[str, Any]], truth: Truth) -> list[str]:
    """The idle GPUs of the drill's spot and on-demand instances: one group of their own,
    to the cent, carrying nothing else (no tenant's cost, no waste)."""
    gpu_h, cost = expect_unallocated(truth)
    if len(groups) != 1:
        return [f"{UNALLOCATED}: {len(groups)} groups, expected 1 ({gpu_h:.6f} GPU-h)"]
    got = groups[0]
    print(f"  {UNALLOCATED}: {got['unallocated_gpu_hours']:.6f} GPU-h, "
          f"{got['unallocated_cost']:.2f} USD; expected {gpu_h:.6f}, {cost:.6f}")  # fmt: skip
    problems = []
    if abs(got["unallocated_gpu_hours"] - gpu_h) > 2e-5:
        problems.append(
            f"{UNALLOCATED} GPU-hours: report {got['unallocated_gpu_hours']} vs {gpu_h}"
        )
    for name in ("unallocated_cost", "effective_cost"):
        if not same_cent(got[name], cost):
            problems.append(f"{UNALLOCATED} {name}: report {got[name]} vs {cost:.6f}")
    if got["allocated_cost"] != 0 or got["restart_waste_cost"] != 0:
        problems.append(f"{UNALLOCATED} carries allocated or waste cost: {got}")
    return problems


def check_report(doc: Mapping[str, Any], by: str, truth: Truth) -> list[str]:
    want = Expected()
    expect_allocation(by, truth, want)
    expect_waste(by, truth, want)
    idle = [g for g in doc["groups"] if g[by] == UNALLOCATED]
    doc = {**doc, "groups": [g for g in doc["groups"] if g[by] != UNALLOCATED]}
    problems = check_money(doc, by, want) + check_unallocated(idle, truth)
    if by == "tenant":
        for got in doc["groups"]:
            for outcome in OUTCOME_COLUMNS:
                n = want.outcomes[got["tenant"]][outcome]
                if got[outcome] != n:
                    problems.append(f"{got['tenant']} {outcome}: {got[outcome]} vs {n}")
    return problems


async def test_the_report_of_a_drill_matches_its_ground_truth_to_the_cent(
    stack: Any, tmp_path: Path
) -> None:
    env = stackenv.load()
    run = await metered_drill(env, tmp_path)
    d = run.drill
    events = {gang_of(e): e for e in d.events}
    assert set(events) == set(OUTCOMES)
    last_stop = max(parse_time(e["ChargePeriodEnd"]) for e in events.values())
    # The bill: every drill instance, every hour from the first look to the last stop.
    hours = hours_between(run.looks[0], last_stop)
    truth = Truth(d.plan, run.looks, d.facts, events, Rates(d.plan.nodes, hours[0]), hours)
    check_ledger_split(truth)
    focus = tmp_path / "focus.csv"
    focus_export(focus, d.plan, hours, truth.rates)
    ledger = tmp_path / "ledger.jsonl"
    ledger.write_text("".join(json.dumps(e) + "\n" for e in [*d.events, *run.alloc_rows]))

    window = ["--focus", str(focus), "--since", rfc3339(hours[0]),
              "--until", rfc3339(hours[-1] + timedelta(hours=1))]  # fmt: skip
    topics = [
        "--ledger", f"kafka://{env.kafka}/reclaimd.restart-waste.{d.plan.run_id}",
        "--ledger", f"kafka://{env.kafka}/{run.alloc_topic}",
    ]  # fmt: skip
    from_file, from_kafka, by_option = await asyncio.gather(
        run_report("--ledger", str(ledger), *window),
        run_report(*topics, *window),
        run_report("--ledger", str(ledger), *window, "--by", "purchase_option"),
    )
    assert from_file == from_kafka  # the export and the topics are the same ledger

    t1, t2 = run.looks
    print(f"\n  drill {d.plan.run_id}: meter looks {rfc3339(t1)} .. {rfc3339(t2)},"
          f" {len(hours)} hour(s), last stop {rfc3339(last_stop)}")  # fmt: skip
    problems = check_report(from_file, "tenant", truth)
    problems += check_report(by_option, "purchase_option", truth)
    assert not problems, "\n".join(problems)


async def test_a_missing_topic_is_one_line_and_exit_2(stack: Any, tmp_path: Path) -> None:
    env = stackenv.load()
    rates = tmp_path / "rates.csv"
    rates.write_text(f"sku,purchase_option,usd_per_gpu_hour\n{SKU},spot,4\n")
    topic = f"reclaimd.restart-waste.none-{utcnow():%H%M%S%f}"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "reclaimd.cli", "report", "--ledger", f"kafka://{env.kafka}/{topic}",
        "--rates", str(rates),
        cwd=REPO, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, err = await proc.communicate()
    assert proc.returncode == 2
    assert err.decode().strip().splitlines() == [f"reclaimd report: kafka {topic}: no such topic"]
