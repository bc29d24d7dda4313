"""The allocation meter: hand-computed GPU-, MIG-profile- and HBM-GB-hours per closed hour."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from reclaimd import meter
from reclaimd.ledger.writer import LedgerWriter
from reclaimd.outbox import Outbox
from reclaimd.report import Window, build
from reclaimd.settings.allocation import AllocationSettings

H12 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)

NODES = {
    "n-spot": meter.NodeFacts(
        {
            "node.kubernetes.io/instance-type": "p5.48xlarge",
            "karpenter.sh/capacity-type": "spot",
            "topology.kubernetes.io/zone": "us-east-2a",
        },
        "aws:///us-east-2a/i-0spot",
    ),
    "n-mig": meter.NodeFacts(
        {
            "node.kubernetes.io/instance-type": "p5.48xlarge",
            "reclaimd.io/purchase-option": "on_demand",
        },
        "aws:///us-east-2a/i-0mig",
    ),
}


def pod(
    name: str, node: str, tenant: str, resources: dict[str, str], **labels: str
) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "ml",
            "labels": {"reclaimd.io/tenant": tenant, **labels},
        },
        "spec": {
            "nodeName": node,
            "containers": [{"name": "c", "resources": {"limits": resources}}],
        },
    }


class Fleet:
    def __init__(self, pods: list[dict[str, Any]]) -> None:
        self.pods = pods

    def gpu_pods(self) -> Iterable[Mapping[str, Any]]:
        return self.pods

    def node(self, name: str) -> meter.NodeFacts | None:
        return NODES.get(name)


class Lock:
    def __init__(self, mine: bool) -> None:
        self.mine, self.asked = mine, []  # type: ignore[var-annotated]

    async def acquire(self, hour: datetime) -> bool:
        self.asked.append(hour)
        return self.mine


class Clock:
    def __init__(self, *times: datetime) -> None:
        self.times = list(times)

    def __call__(self) -> datetime:
        return self.times.pop(0)


def rows(path: Path, *, closed_only: bool = True) -> list[dict[str, Any]]:
    """The outbox's rows; by default only closed hours' (not the open hour's running totals)."""
    box = Outbox(path)
    try:
        got = [json.loads(r.value) for r in box.pending(1000)]
    finally:
        box.close()
    return [r for r in got if r["x_HourClosed"] or not closed_only]


FLEET = [
    pod("a-0", "n-spot", "team-a", {"nvidia.com/gpu": "8"}),
    pod("b-0", "n-mig", "team-b", {"nvidia.com/mig-1g.10gb": "2"}),
    pod("b-1", "n-mig", "team-b", {"nvidia.com/gpu": "1", "cpu": "4"}),
    {
        **pod("gone", "n-spot", "team-a", {"nvidia.com/gpu": "8"}),
        "metadata": {"name": "gone", "deletionTimestamp": "x"},
    },
]


async def run_ticks(tmp_path: Path, mine: bool, *times: datetime) -> tuple[meter.Meter, Path]:
    box = tmp_path / f"alloc-{mine}.db"
    writer = LedgerWriter(bootstrap_servers="", topic="alloc", outbox_path=box)
    m = meter.Meter(
        Fleet(FLEET),
        writer,
        Lock(mine),
        cluster="c1",
        settings=AllocationSettings(interval_s=900),
        clock=Clock(*times),
    )
    for _ in times:
        await m.tick()
    await writer.close()
    return m, box


async def test_a_closed_hour_becomes_rows_by_node_labels_and_profile(tmp_path: Path) -> None:
    m, box = await run_ticks(
        tmp_path, True, H12, H12 + timedelta(minutes=30), H12 + timedelta(hours=1, minutes=10)
    )
    got = {(r["x_K8sNodeName"], r["x_MigProfile"]): r for r in rows(box)}
    assert m.rows_recorded == 3 and len(got) == 3
    a = got[("n-spot", None)]
    # 12:00-12:30 and 12:30-13:00 counted, 13:00-13:10 belongs to an hour still open
    assert (a["x_GpuHours"], a["x_HbmGbHours"], a["x_MigProfileHours"]) == (8.0, 640.0, 0.0)
    assert a["ResourceId"] == "i-0spot" and a["x_PurchaseOption"] == "spot"
    assert a["PricingCategory"] == "Dynamic" and a["AvailabilityZone"] == "us-east-2a"
    assert a["Tags"] == {"purchase_option": "spot", "sku": "p5.48xlarge", "tenant": "team-a"}
    assert (a["ChargePeriodStart"], a["ChargePeriodEnd"]) == (
        "2026-03-01T12:00:00Z",
        "2026-03-01T13:00:00Z",
    )
    assert a["schema"] == "reclaimd.allocation/v1" and a["x_NodeGpus"] == 8
    # the closing look's time, ms since the epoch
    assert a["x_Revision"] == int((H12 + timedelta(hours=1, minutes=10)).timestamp() * 1000)
    mig = got[("n-mig", "1g.10gb")]
    # two 1g.10gb slices for an hour: never also counted as a GPU
    assert (mig["x_GpuHours"], mig["x_MigProfileHours"], mig["x_HbmGbHours"]) == (0.0, 2.0, 20.0)
    assert mig["x_MigGpuEquivalentHours"] == round(2 / 7, 6)
    whole = got[("n-mig", None)]
    assert (whole["x_GpuHours"], whole["x_HbmGbHours"]) == (1.0, 80.0)
    assert all("a-0" not in json.dumps(r) and "b-1" not in json.dumps(r) for r in got.values())


async def test_a_replica_without_the_hour_lease_meters_nothing(tmp_path: Path) -> None:
    m, box = await run_ticks(
        tmp_path, False, H12, H12 + timedelta(minutes=30), H12 + timedelta(hours=1)
    )
    assert m.rows_recorded == 0 and rows(box) == []


async def test_a_gap_longer_than_the_limit_is_not_counted(tmp_path: Path) -> None:
    # interval 900 s -> gaps up to 3600 s count; 12:00 -> 13:30 (5400 s) does not
    _, box = await run_ticks(
        tmp_path,
        True,
        H12,
        H12 + timedelta(minutes=90),
        H12 + timedelta(minutes=100),
        H12 + timedelta(hours=2, minutes=1),
    )
    got = {(r["ChargePeriodStart"], r["x_K8sNodeName"], r["x_MigProfile"]): r for r in rows(box)}
    assert {k[0] for k in got} == {"2026-03-01T13:00:00Z"}  # hour 12 saw no counted time
    # 13:30-13:40 and 13:40-14:00 (the look at 14:01 splits at the hour): 30 min
    assert got[("2026-03-01T13:00:00Z", "n-spot", None)]["x_GpuHours"] == 4.0


def test_the_hour_lease_name_is_per_cluster_and_hour() -> None:
    a = meter.lease_name("c1", H12)
    assert a.startswith("alloc-") and a.endswith("-2026030112") and len(a) <= 63
    assert a != meter.lease_name("c2", H12) and a != meter.lease_name(
        "c1", H12 + timedelta(hours=1)
    )


async def test_the_open_hour_is_metered_and_replaced_when_it_closes(tmp_path: Path) -> None:
    box = tmp_path / "alloc.db"
    writer = LedgerWriter(bootstrap_servers="", topic="alloc", outbox_path=box)
    looks = [H12 + timedelta(minutes=m) for m in (0, 10, 15, 20, 65)]
    m = meter.Meter(
        Fleet(FLEET),
        writer,
        Lock(True),
        cluster="c1",
        settings=AllocationSettings(interval_s=900, open_every_s=600),
        clock=Clock(*looks),
    )  # fmt: skip
    for _ in looks:
        await m.tick()
    await writer.close()
    every = rows(box, closed_only=False)
    # 12:10 (3 keys), 12:20 (10 min after: 3 keys; 12:15 was too soon), 13:05: the 3 closed
    # rows of hour 12, then hour 13's first 5 minutes (3 keys)
    assert (m.open_rows_recorded, m.rows_recorded, len(every)) == (9, 3, 12)
    spot = [r for r in every if r["x_K8sNodeName"] == "n-spot"]
    assert [(r["ChargePeriodStart"][11:16], r["x_HourClosed"], r["x_GpuHours"]) for r in spot] == [
        ("12:00", False, round(8 * 10 / 60, 6)),
        ("12:00", False, round(8 * 20 / 60, 6)),
        ("12:00", True, 8.0),
        ("13:00", False, round(8 * 5 / 60, 6)),
    ]
    assert len({r["EventId"] for r in spot[:3]}) == 1  # one key: replaced, not added
    assert [r["x_Revision"] for r in spot[:2]] == [
        int(looks[1].timestamp() * 1000),
        int(looks[3].timestamp() * 1000),
    ]
    rates = tmp_path / "rates.csv"
    rates.write_text("sku,purchase_option,usd_per_gpu_hour\np5.48xlarge,spot,4\n")

    def team_a(events: list[dict[str, Any]], window: Window) -> tuple[float, float]:
        ledger = tmp_path / "l.jsonl"
        ledger.write_text("".join(json.dumps(r) + "\n" for r in events))
        g = {x.key: x.figures for x in build([str(ledger)], by="tenant", focus=None,
                                              rates=rates, window=window)}  # fmt: skip
        a = g["team-a"]
        return float(a["allocated_gpu_hours"] or 0), round(float(a["allocated_cost"] or 0), 2)

    # every row: hour 12 is its closed row alone, 8 GPU-h x $4; hour 13 its running total
    assert team_a(every, Window(until=datetime(2026, 3, 1, 13))) == (8.0, 32.00)
    assert team_a(every, Window(since=datetime(2026, 3, 1, 13))) == (round(8 * 5 / 60, 6), 2.67)
    # the topic as it was at 12:20: the latest running total, 20 min x 8 GPUs x $4
    assert team_a(every[:6], Window()) == (round(8 * 20 / 60, 6), 10.67)


async def test_meter_rows_price_in_the_report(tmp_path: Path) -> None:
    _, box = await run_ticks(
        tmp_path, True, H12, H12 + timedelta(minutes=30), H12 + timedelta(hours=1)
    )
    ledger = tmp_path / "alloc.jsonl"
    ledger.write_text("".join(json.dumps(r) + "\n" for r in rows(box)))
    rates = tmp_path / "rates.csv"
    rates.write_text(
        "sku,purchase_option,usd_per_gpu_hour\np5.48xlarge,spot,4\np5.48xlarge,on_demand,7\n"
    )
    g = {
        x.key: x.figures
        for x in build([str(ledger)], by="tenant", focus=None, rates=rates, window=Window())
    }
    assert g["team-a"]["allocated_cost"] == 8 * 4
    assert g["team-a"]["spot_net_savings"] == 8 * (7 - 4)
    # team-b: one GPU-hour plus two 1g slices (2/7 of a GPU-hour), on-demand
    assert g["team-b"]["allocated_cost"] == pytest.approx(7 * (1 + round(2 / 7, 6)), abs=1e-9)
    assert (g["team-b"]["allocated_gpu_hours"], g["team-b"]["mig_profile_hours"]) == (1.0, 2.0)
    assert g["team-b"]["hbm_gb_hours"] == 80 + 20


def test_cache_fleet_reads_the_cluster_cache() -> None:
    from reclaimd.cluster.cache import ClusterCache

    cache = ClusterCache(None)  # type: ignore[arg-type]  # never started: fed by hand below
    cache._idx.put_node(
        {
            "metadata": {"name": "n-spot", "labels": dict(NODES["n-spot"].labels)},
            "spec": {"providerID": NODES["n-spot"].provider_id},
        }
    )
    cache._idx.put_pod({**FLEET[0], "metadata": {**FLEET[0]["metadata"], "uid": "u1"}})
    fleet = meter.CacheFleet(cache.view)
    held = meter.holdings(fleet, meter.LabelPolicy())
    assert [(h.node, h.gpus, dict(h.labels)["tenant"]) for h in held] == [("n-spot", 8, "team-a")]
    facts = fleet.node("n-spot")
    assert facts is not None and facts.provider_id == "aws:///us-east-2a/i-0spot"


class Vanishing(Fleet):
    """A fleet whose spot node (and its pod) is gone after the first looks."""

    def __init__(self) -> None:
        super().__init__([FLEET[0]])
        self.gone = False

    def gpu_pods(self) -> Iterable[Mapping[str, Any]]:
        return [] if self.gone else self.pods

    def node(self, name: str) -> meter.NodeFacts | None:
        return None if self.gone else NODES.get(name)


async def test_a_node_gone_before_its_hour_closes_keeps_its_instance(tmp_path: Path) -> None:
    box = tmp_path / "alloc.db"
    writer = LedgerWriter(bootstrap_servers="", topic="alloc", outbox_path=box)
    fleet = Vanishing()
    times = Clock(H12, H12 + timedelta(minutes=30), H12 + timedelta(minutes=40))
    m = meter.Meter(
        fleet,
        writer,
        Lock(True),
        cluster="c1",
        settings=AllocationSettings(interval_s=900),
        clock=times,
    )
    await m.tick()
    await m.tick()
    fleet.gone = True  # reclaimed: node and pod deleted before the hour ends
    await m.tick()
    times.times.append(H12 + timedelta(hours=1, minutes=1))
    await m.tick()
    await writer.close()
    (r,) = rows(box)  # the closed row (an open running total was written at 12:30)
    # priced on the instance it ran on, with the facts the node had when it was counted
    assert (r["ResourceId"], r["x_PurchaseOption"], r["SkuId"]) == (
        "i-0spot",
        "spot",
        "p5.48xlarge",
    )
    assert r["x_GpuHours"] == 4.0 and r["x_NodeGpus"] == 8
    assert m._seen == {}  # nothing kept once no open hour needs the node


def test_a_gce_row_names_its_project_so_two_projects_instances_stay_apart() -> None:
    key = meter.Key(H12, "g-a", (("tenant", "team-c"),), "")
    usage = meter.Usage(gpu_s=8 * 3600.0)
    facts = meter.NodeFacts(
        {"node.kubernetes.io/instance-type": "a3-highgpu-8g"}, "gce://proj-a/us-central1-a/gpu-1"
    )
    r = meter.row(key, usage, facts, "c1")
    assert (r["ResourceId"], r["SubAccountId"]) == ("gpu-1", "proj-a")
    aws = meter.row(key, usage, NODES["n-spot"], "c1")
    assert (aws["ResourceId"], aws["SubAccountId"]) == ("i-0spot", None)


async def test_an_hour_is_closed_once_by_the_replica_that_metered_it(tmp_path: Path) -> None:
    """reclaimd_meter_hours_closed_total and ..._last_closed_hour_end_timestamp_seconds: the
    alert on an hour nobody closed reads them."""
    m, _ = await run_ticks(
        tmp_path,
        True,
        H12 + timedelta(minutes=50),
        H12 + timedelta(minutes=59),
        H12 + timedelta(hours=1, minutes=1),
        H12 + timedelta(hours=1, minutes=2),
    )
    assert m.hours_closed == 1
    assert m.last_closed_hour_end == (H12 + timedelta(hours=1)).timestamp()
    # a replica that never held an hour closes none, and owes nothing before its first look
    other, _ = await run_ticks(
        tmp_path, False, H12 + timedelta(minutes=50), H12 + timedelta(hours=1, minutes=1)
    )
    assert other.hours_closed == 0 and other.last_closed_hour_end == H12.timestamp()


class FailingWriter(LedgerWriter):
    """Refuses its first write (a full disk), takes the rest."""

    failed = False

    async def record_encoded(self, *args: Any, **kwargs: Any) -> bool:
        if not self.failed:
            self.failed = True
            raise OSError("outbox full")
        return await super().record_encoded(*args, **kwargs)


async def test_an_hour_whose_rows_were_not_written_is_not_closed(tmp_path: Path) -> None:
    writer = FailingWriter(bootstrap_servers="", topic="alloc", outbox_path=tmp_path / "o.db")
    times = (
        H12 + timedelta(minutes=50),
        H12 + timedelta(hours=1, minutes=1),  # closes 12:00-13:00: its first row is refused
        H12 + timedelta(hours=1, minutes=2),  # a later look must not count that hour closed
    )
    m = meter.Meter(
        Fleet(FLEET),
        writer,
        Lock(True),
        cluster="c1",
        settings=AllocationSettings(interval_s=900),
        clock=Clock(*times),
    )
    await m.tick()
    with pytest.raises(OSError):
        await m.tick()
    await m.tick()
    await writer.close()
    assert m.hours_closed == 0 and m.last_closed_hour_end == H12.timestamp()
