"""``reclaimd report`` on a hand-built FOCUS 1.2 bill with the rows every real bill has.

The bill (hour 12:00, plus 13:00 for one instance) and the ledger are small enough to price
by hand; every expected figure below is computed in the comments, not taken from a run.

AWS, p5.48xlarge (8 GPUs):
  i-spot  spot       compute 1 Hrs $40.00 Dynamic          -> $5.00 / GPU-h
          + 250 GB data transfer $22.50 (Standard, carries the instance id): not compute
  i-od    on-demand  compute 1 Hrs $80.00 Standard         -> $10.00 / GPU-h
          + EBS GB-Mo $3.20, tax $7.00, a credit -$10.00 on the same id: not compute
  i-rsv   reserved   RI usage 1 Hrs $48.00 Committed       -> $6.00 / GPU-h, at 12:00 and 13:00
          + the RI purchase $10,000 (ChargeCategory Purchase) on its id: not compute
  a support line with no resource, and another account's instance: not ours
GCE, a3-highgpu-8g (8 GPUs), one instance named gpu-1 in each of two projects:
  proj-a/gpu-1 spot  GPU 28,800 s = 8 GPU-h $24.00 + cores $6.40 + RAM $1.60 = $32.00
                     -> $4.00 / GPU-h (Dynamic); + 100 GiB egress $12.00: not compute
  proj-b/gpu-1 od    GPU 8 hour $64.00 + cores $14.00 + RAM $2.00 = $80.00 -> $10.00 / GPU-h
                     (short ResourceId "gpu-1": the project from SubAccountId)

Ledger, 12:00: team-a 8 GPU-h on i-spot and 4 on i-od; team-b 4 on i-od and 4 on i-rsv
(half of it idle); team-c 8 on proj-a/gpu-1 and 6 on proj-b/gpu-1; 2 GPU-h on
proj-b/gpu-1 with no tenant label. Nothing at 13:00 (i-rsv all idle).
Restart waste at 12:30: team-a 2 GPU-h on i-spot + 1 on i-od; team-c 4 GPU-h on gpu-1
(node g-a: proj-a's gpu-1).
"""

from __future__ import annotations

import csv
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import duckdb
import pytest

from reclaimd import cli
from reclaimd.report import Window, build

H12 = datetime(2026, 3, 1, 12, tzinfo=UTC)
H13 = H12 + timedelta(hours=1)
ACCOUNT = "111122223333"

FOCUS_COLUMNS = (
    "BillingAccountId", "SubAccountId", "ProviderName", "ServiceName", "ServiceCategory",
    "ChargePeriodStart", "ChargePeriodEnd", "ChargeCategory", "ChargeClass", "ResourceId",
    "SkuId", "SkuMeter", "PricingCategory", "ConsumedQuantity", "ConsumedUnit",
    "EffectiveCost", "BilledCost", "ListCost", "BillingCurrency",
)  # fmt: skip


def z(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def aws(rid: str, cost: float, *, hour: datetime = H12, **kw: Any) -> dict[str, Any]:
    row = {
        "BillingAccountId": ACCOUNT,
        "SubAccountId": ACCOUNT,
        "ProviderName": "AWS",
        "ServiceName": "Amazon Elastic Compute Cloud",
        "ServiceCategory": "Compute",
        "ChargePeriodStart": z(hour),
        "ChargePeriodEnd": z(hour + timedelta(hours=1)),
        "ChargeCategory": "Usage",
        "ChargeClass": "",
        "ResourceId": f"arn:aws:ec2:us-east-2:{ACCOUNT}:instance/{rid}" if rid else "",
        "SkuId": "p5.48xlarge",
        "SkuMeter": "",
        "PricingCategory": "Standard",
        "ConsumedQuantity": 1,
        "ConsumedUnit": "Hrs",
        "EffectiveCost": cost,
        "BilledCost": cost,
        "ListCost": 98.32,
        "BillingCurrency": "USD",
    }
    row.update(kw)
    return row


def gce(
    rid: str, project: str, meter: str, quantity: tuple[float, str], cost: float, **kw: Any
) -> dict[str, Any]:
    qty, unit = quantity
    row = aws(
        "",
        cost,
        SubAccountId=project,
        ProviderName="Google Cloud",
        ServiceName="Compute Engine",
        ResourceId=rid,
        SkuId=f"SKU-{meter[:3].upper()}",
        SkuMeter=meter,
        ConsumedQuantity=qty,
        ConsumedUnit=unit,
        ListCost=cost * 2,
    )
    row.update(kw)
    return row


SPOT = {"PricingCategory": "Dynamic"}
GA = "//compute.googleapis.com/projects/proj-a/zones/us-central1-a/instances/gpu-1"


def bill_rows() -> list[dict[str, Any]]:
    return [
        aws("i-spot", 40.00, PricingCategory="Dynamic"),
        aws(
            "i-spot", 22.50, ServiceName="AWS Data Transfer", ServiceCategory="Networking",
            ConsumedQuantity=250, ConsumedUnit="GB", SkuId="DT-OUT",
        ),
        aws("i-od", 80.00),
        aws("i-od", 3.20, ServiceCategory="Storage", ConsumedUnit="GB-Mo", SkuId="EBS"),
        aws("i-od", 7.00, ChargeCategory="Tax", ConsumedQuantity="", ConsumedUnit=""),
        aws("i-od", -10.00, ChargeCategory="Credit", ConsumedQuantity="", ConsumedUnit=""),
        aws("i-rsv", 48.00, PricingCategory="Committed"),
        aws("i-rsv", 48.00, PricingCategory="Committed", hour=H13),
        aws(
            "i-rsv", 10000.00, ChargeCategory="Purchase", PricingCategory="Committed",
            ConsumedQuantity=1, ConsumedUnit="Hrs",
        ),
        aws(
            "", 100.00, ServiceName="AWS Support (Business)",
            ServiceCategory="Management and Governance", ConsumedUnit="",
        ),
        aws("i-other", 80.00, SubAccountId="999988887777"),
        gce(GA, "proj-a", "Nvidia H100 80GB GPU", (28800, "seconds"), 24.00, **SPOT),
        gce(GA, "proj-a", "A3 Instance Core", (748800, "seconds"), 6.40, **SPOT),
        gce(GA, "proj-a", "A3 Instance Ram", (1872, "gibibyte hour"), 1.60, **SPOT),
        gce(
            GA, "proj-a", "Network Internet Egress", (100, "gibibyte"), 12.00,
            ServiceCategory="Networking",
        ),
        gce("gpu-1", "proj-b", "Nvidia H100 80GB GPU", (8, "hour"), 64.00),
        gce("gpu-1", "proj-b", "A3 Instance Core", (208, "hour"), 14.00),
        gce("gpu-1", "proj-b", "A3 Instance Ram", (1872, "gibibyte hour"), 2.00),
    ]  # fmt: skip


def alloc(
    tenant: str | None, node: str, rid: str, gpu_h: float, po: str, **kw: Any
) -> dict[str, Any]:
    tags = {"queue": "research", "purchase_option": po}
    if tenant:
        tags["tenant"] = tenant
    ev = {
        "schema": "reclaimd.allocation/v1",
        "EventId": f"al-{tenant}-{node}",
        "ChargePeriodStart": z(H12),
        "ChargePeriodEnd": z(H13),
        "ResourceId": rid,
        "x_K8sNodeName": node,
        "SkuId": kw.pop("sku", "p5.48xlarge"),
        "x_PurchaseOption": po,
        "Tags": tags,
        "x_GpuHours": gpu_h,
        "x_MigGpuEquivalentHours": 0.0,
        "x_MigProfileHours": 0.0,
        "x_HbmGbHours": gpu_h * 80,
        "x_NodeGpus": 8,
    }
    ev.update(kw)
    return ev


def part(rid: str, node: str, po: str, gpu_s: float, sku: str = "p5.48xlarge") -> dict[str, Any]:
    return {
        "ResourceId": rid,
        "x_K8sNodeName": node,
        "SkuId": sku,
        "x_PurchaseOption": po,
        "x_WastedGpuSeconds": gpu_s,
    }


def waste(event: str, tenant: str, parts: list[dict[str, Any]], notice: str) -> dict[str, Any]:
    stopped = H12 + timedelta(minutes=30)
    return {
        "schema": "reclaimd.restart-waste/v2",
        "EventId": event,
        "ChargePeriodStart": z(stopped - timedelta(hours=1)),
        "ChargePeriodEnd": z(stopped),
        "Tags": {"tenant": tenant, "queue": "research"},
        "x_WastedGpuSeconds": sum(p["x_WastedGpuSeconds"] for p in parts),
        "x_GangId": f"jobset:{tenant}/{event}",
        "x_NoticeId": notice,
        "x_CheckpointOutcome": "partial",
        "x_DeadlineMet": True,
        "x_WasteByInstance": parts,
    }


A3 = {"sku": "a3-highgpu-8g"}


def ledger_rows() -> list[dict[str, Any]]:
    return [
        alloc("team-a", "n-spot", "i-spot", 8, "spot"),
        alloc("team-a", "n-od", "i-od", 4, "on_demand"),
        alloc("team-b", "n-od", "i-od", 4, "on_demand"),
        alloc("team-b", "n-rsv", "i-rsv", 4, "reserved"),
        alloc("team-c", "g-a", "gpu-1", 8, "spot", SubAccountId="proj-a", **A3),
        alloc("team-c", "g-b", "gpu-1", 6, "on_demand", SubAccountId="proj-b", **A3),
        alloc(None, "g-b", "gpu-1", 2, "on_demand", SubAccountId="proj-b", **A3),
        waste(
            "rw-1",
            "team-a",
            [part("i-spot", "n-spot", "spot", 7200), part("i-od", "n-od", "on_demand", 3600)],
            "n-1",
        ),
        waste("rw-2", "team-c", [part("gpu-1", "g-a", "spot", 14400, "a3-highgpu-8g")], "n-2"),
    ]


def write_csv(path: Path, rows: list[dict[str, Any]]) -> Path:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FOCUS_COLUMNS)
        w.writeheader()
        w.writerows(rows)
    return path


def write_jsonl(path: Path, events: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    return path


@pytest.fixture
def bill(tmp_path: Path) -> dict[str, Path]:
    return {
        "ledger": write_jsonl(tmp_path / "ledger.jsonl", ledger_rows()),
        "focus": write_csv(tmp_path / "focus.csv", bill_rows()),
    }


# The bill's two hours. Without a window the report covers the ledger's own hours (12:00
# only here): test_without_a_window_the_report_covers_and_states_the_ledgers_hours.
BOTH_HOURS = Window(since=datetime(2026, 3, 1, 12), until=datetime(2026, 3, 1, 14))


def report(files: dict[str, Path], **kw: Any) -> dict[str, dict[str, Any]]:
    groups = build(
        [str(files["ledger"])],
        by=kw.pop("by", "tenant"),
        focus=kw.pop("focus", files["focus"]),
        rates=None,
        window=kw.pop("window", BOTH_HOURS),
    )
    return {g.key: {k: (round(v, 6) if isinstance(v, float) else v) for k, v in g.figures.items()}
            for g in groups}  # fmt: skip


def cents(g: dict[str, Any], *keys: str) -> tuple[float, ...]:
    return tuple(round(g[k], 2) for k in keys)


def test_every_figure_of_the_hand_built_bill_to_the_cent(bill: dict[str, Path]) -> None:
    g = report(bill)
    assert set(g) == {"team-a", "team-b", "team-c", "unattributed", "reserved-idle"}
    a, b, c, u, idle = g["team-a"], g["team-b"], g["team-c"], g["unattributed"], g["reserved-idle"]
    keys = ("allocated_cost", "cost_spot", "cost_on_demand", "cost_reserved")
    # team-a: 8 spot GPU-h x $5 = $40 (not the $62.50 / 8 the data-transfer row would make:
    # $7.81), 4 on-demand x $10 = $40
    assert cents(a, *keys) == (80.00, 40.00, 40.00, 0.00)
    # waste: 2 GPU-h x $5 + 1 x $10 = $20; effective $100
    assert cents(a, "restart_waste_cost", "effective_cost") == (20.00, 100.00)
    assert (a["allocated_gpu_hours"], a["restart_waste_gpu_hours"], a["waste_share"]) == (
        12,
        3,
        0.25,
    )
    # on-demand p5 from i-od's Standard row: $10; spot saved 8 x (10 - 5) = $40, less $10 waste
    assert round(a["spot_net_savings"], 2) == 30.00
    # team-b: 4 on-demand x $10 + 4 reserved x ($48 / 8 = $6) = $64; the RI purchase and the
    # tax and the credit price nothing
    assert cents(b, *keys) == (64.00, 0.00, 40.00, 24.00)
    assert (b["gpu_hours_reserved"], b["effective_cost"], b["spot_net_savings"]) == (4, 64, 0)
    # team-c: proj-a/gpu-1 spot ($24 + $6.40 + $1.60) / 8 GPU-h = $4 x 8 = $32; proj-b/gpu-1
    # on-demand ($64 + $14 + $2) / 8 = $10 x 6 = $60; the egress row is not compute
    assert cents(c, *keys) == (92.00, 32.00, 60.00, 0.00)
    # the 4 GPU-h lost on node g-a are priced on proj-a's gpu-1: 4 x $4 = $16 (not $10, not $7)
    assert cents(c, "restart_waste_cost", "effective_cost") == (16.00, 108.00)
    # on-demand a3 from proj-b's Standard hour: $10; spot saved 8 x (10 - 4) = $48, less $16
    assert round(c["spot_net_savings"], 2) == 32.00
    assert c["waste_share"] == round(4 / 14, 6)
    # the unlabelled 2 GPU-h on proj-b/gpu-1: 2 x $10
    assert cents(u, "allocated_cost", "cost_on_demand", "effective_cost") == (20.00, 20.00, 20.00)
    # reserved idle: i-rsv 12:00 8 - 4 held = 4 GPU-h x $6 = $24; 13:00 nothing held, 8 x $6 = $48
    assert (idle["reserved_idle_gpu_hours"], round(idle["reserved_idle_cost"], 2)) == (12, 72.00)
    assert (
        idle["allocated_cost"],
        idle["allocated_gpu_hours"],
        round(idle["effective_cost"], 2),
    ) == (0, 0, 72.00)
    for grp in (a, b, c, u):
        assert grp["reserved_idle_cost"] == 0 and grp["unpriced_gpu_hours"] == 0
    # shares of the total effective cost 100 + 64 + 108 + 20 + 72 = $364
    assert idle["cost_share"] == round(72 / 364, 6) and a["cost_share"] == round(100 / 364, 6)
    # every compute dollar accounted for: 40 + 80 + 48 + 48 + 32 + 80 = 328 = allocated + idle
    allocated = sum(x["allocated_cost"] for x in g.values())
    assert round(allocated + idle["reserved_idle_cost"], 2) == 328.00


def half_od(bill: dict[str, Path], tmp_path: Path) -> dict[str, Path]:
    """The hand-built ledger without team-b's 4 GPU-h on i-od: i-od is half allocated."""
    events = [e for e in ledger_rows() if e["EventId"] != "al-team-b-n-od"]
    return {**bill, "ledger": write_jsonl(tmp_path / "half-od.jsonl", events)}


def test_an_on_demand_instance_half_allocated_shows_its_idle_half(
    bill: dict[str, Path], tmp_path: Path
) -> None:
    # i-od ($80, 8 GPU-h at $10) holds team-a's 4 GPU-h only: the other 4 x $10 = $40 is the
    # group 'unallocated' (it vanished before: the groups added up to $288 of $328).
    g = report(half_od(bill, tmp_path))
    assert set(g) == {"team-a", "team-b", "team-c", "unattributed", "reserved-idle", "unallocated"}
    un = g["unallocated"]
    assert (un["unallocated_gpu_hours"], round(un["unallocated_cost"], 2)) == (4, 40.00)
    assert (un["allocated_cost"], un["reserved_idle_cost"], round(un["effective_cost"], 2)) == (
        0,
        0,
        40.00,
    )
    # team-b keeps only i-rsv's 4 reserved GPU-h x $6 = $24; the others as in the full report
    assert cents(g["team-b"], "allocated_cost", "effective_cost") == (24.00, 24.00)
    assert cents(g["team-a"], "allocated_cost", "effective_cost") == (80.00, 100.00)
    for key in ("team-a", "team-b", "team-c", "unattributed", "reserved-idle"):
        assert g[key]["unallocated_cost"] == 0, key
    # the groups add up to the bill's GPU compute of the instances the meter saw:
    # 40 + 80 + 48 + 48 + 32 + 80 = $328 = allocated 80 + 24 + 92 + 20 + idle 72 + 40
    paid = sum(x["allocated_cost"] + x["reserved_idle_cost"] + x["unallocated_cost"]
               for x in g.values())  # fmt: skip
    assert round(paid, 2) == 328.00
    # with the waste (a 20, c 16): effective 100 + 24 + 108 + 20 + 72 + 40 = $364
    assert round(sum(x["effective_cost"] for x in g.values()), 2) == 364.00
    assert un["cost_share"] == round(40 / 364, 6)


def test_the_idle_detail_lists_each_instance_hour(
    bill: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    files = half_od(bill, tmp_path)
    rc = cli.main(["report", "--ledger", str(files["ledger"]), "--focus", str(files["focus"]),
                   "--since", "2026-03-01T12:00:00Z", "--until", "2026-03-01T14:00:00Z",
                   "--format", "json", "--detail"])  # fmt: skip
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0
    # per hour and instance: i-od 12:00 4 x $10; i-rsv 12:00 4 x $6 and 13:00 8 x $6
    assert doc["idle"] == [
        {"group": "unallocated", "hour": "2026-03-01T12:00:00Z", "instance": "i-od",
         "purchase_option": "on_demand", "gpu_hours": 4.0, "cost": 40.00},
        {"group": "reserved-idle", "hour": "2026-03-01T12:00:00Z", "instance": "i-rsv",
         "purchase_option": "reserved", "gpu_hours": 4.0, "cost": 24.00},
        {"group": "reserved-idle", "hour": "2026-03-01T13:00:00Z", "instance": "i-rsv",
         "purchase_option": "reserved", "gpu_hours": 8.0, "cost": 48.00},
    ]  # fmt: skip
    # the same lines under the table; the groups' totals are what the lines add up to
    rc = cli.main(["report", "--ledger", str(files["ledger"]), "--focus", str(files["focus"]),
                   "--since", "2026-03-01T12:00:00Z", "--until", "2026-03-01T14:00:00Z",
                   "--detail"])  # fmt: skip
    table = capsys.readouterr().out
    assert rc == 0
    assert [line.split() for line in table.splitlines() if " i-" in line] == [
        ["unallocated", "2026-03-01T12:00:00Z", "i-od", "on_demand", "4.00", "40.00"],
        ["reserved-idle", "2026-03-01T12:00:00Z", "i-rsv", "reserved", "4.00", "24.00"],
        ["reserved-idle", "2026-03-01T13:00:00Z", "i-rsv", "reserved", "8.00", "48.00"],
    ]
    # without --detail no instance id is shown
    rc = cli.main(["report", "--ledger", str(files["ledger"]), "--focus", str(files["focus"]),
                   "--format", "json"])  # fmt: skip
    assert rc == 0 and "i-od" not in capsys.readouterr().out


def test_the_same_bill_in_parquet_gives_the_same_report(
    bill: dict[str, Path], tmp_path: Path
) -> None:
    pq = tmp_path / "focus.parquet"
    con = duckdb.connect()
    con.execute(
        f"COPY (SELECT * REPLACE (CAST(ChargePeriodStart AS TIMESTAMPTZ) AS ChargePeriodStart,"
        " TRY_CAST(EffectiveCost AS DOUBLE) AS EffectiveCost,"
        " TRY_CAST(ConsumedQuantity AS DOUBLE) AS ConsumedQuantity)"
        f" FROM read_csv('{bill['focus']}', all_varchar = true)) TO '{pq}' (FORMAT parquet)"
    )
    assert report(bill, focus=pq) == report(bill)


def test_a_spot_hour_with_a_standard_data_transfer_row_stays_spot(
    bill: dict[str, Path], tmp_path: Path
) -> None:
    # Only the spot instance's two rows and no on-demand hour: the on-demand price comes from
    # the spot hour's ListCost ($98.32 / 8 = $12.29), as no Standard compute hour exists. Had
    # the $22.50 Standard transfer row made the hour Standard, it would be its own on-demand
    # price ($5) and the savings 0 - $10.
    rows = [r for r in bill_rows() if "i-spot" in r["ResourceId"]]
    focus = write_csv(tmp_path / "spot-only.csv", rows)
    a = report(bill, focus=focus)["team-a"]
    # 8 x (12.29 - 5) = 58.32, less the waste on spot 2 x $5 = $10
    assert round(a["spot_net_savings"], 2) == 48.32


def test_an_hour_partly_covered_by_a_commitment_is_committed(tmp_path: Path) -> None:
    # i-sp's 12:00 hour, half covered by a savings plan: 0.5 Hrs Committed $20 + 0.5 Hrs
    # Standard $40 = 1 instance-hour, 8 GPU-h, $60 -> $7.50 / GPU-h. The meter sees an
    # on-demand node (a savings plan is a billing construct) and team-b holding 4 of its 8.
    # Committed if any of the hour's GPU rows is: the 4 idle GPU-h are reserved idle
    # (4 x $7.50 = $30), and the blended $7.50 is no on-demand price. (Picked alphabetically,
    # "Standard" won: no idle row, and spot "saved" only 8 x (7.50 - 5) = $20.)
    rows = [
        aws("i-spot", 40.00, PricingCategory="Dynamic"),
        aws("i-sp", 20.00, PricingCategory="Committed", ConsumedQuantity=0.5),
        aws("i-sp", 40.00, ConsumedQuantity=0.5),
    ]
    files = {
        "ledger": write_jsonl(
            tmp_path / "sp.jsonl",
            [
                alloc("team-a", "n-spot", "i-spot", 8, "spot"),
                alloc("team-b", "n-sp", "i-sp", 4, "on_demand"),
            ],
        ),
        "focus": write_csv(tmp_path / "sp.csv", rows),
    }
    g = report(files)
    assert set(g) == {"team-a", "team-b", "reserved-idle"}
    assert cents(g["team-b"], "allocated_cost", "cost_on_demand") == (30.00, 30.00)
    idle = g["reserved-idle"]
    assert (idle["reserved_idle_gpu_hours"], round(idle["reserved_idle_cost"], 2)) == (4, 30.00)
    # no Standard hour of p5 left: the on-demand price is the spot hour's ListCost,
    # $98.32 / 8 = $12.29; spot saved 8 x (12.29 - 5) = $58.32
    assert round(g["team-a"]["spot_net_savings"], 2) == 58.32


def test_two_projects_short_instance_names_stay_apart(tmp_path: Path) -> None:
    # Both projects bill their instance as the short ResourceId "gpu-1" (the project only in
    # SubAccountId): proj-a's spot hour $24 + $6.40 + $1.60 = $32 over 8 GPU-h -> $4;
    # proj-b's on-demand hour $64 + $14 + $2 = $80 over 8 GPU-h -> $10. team-c holds 8 on
    # proj-a's, team-d 6 on proj-b's (2 idle). Matched on the name alone, each bill row
    # counted for both instances: $112 over 16 GPU-h, $7 each, and both hours Dynamic.
    rows = [
        gce("gpu-1", "proj-a", "Nvidia H100 80GB GPU", (8, "hour"), 24.00, **SPOT),
        gce("gpu-1", "proj-a", "A3 Instance Core", (208, "hour"), 6.40, **SPOT),
        gce("gpu-1", "proj-a", "A3 Instance Ram", (1872, "gibibyte hour"), 1.60, **SPOT),
        gce("gpu-1", "proj-b", "Nvidia H100 80GB GPU", (8, "hour"), 64.00),
        gce("gpu-1", "proj-b", "A3 Instance Core", (208, "hour"), 14.00),
        gce("gpu-1", "proj-b", "A3 Instance Ram", (1872, "gibibyte hour"), 2.00),
    ]
    events = [
        alloc("team-c", "g-a", "gpu-1", 8, "spot", SubAccountId="proj-a", **A3),
        alloc("team-d", "g-b", "gpu-1", 6, "on_demand", SubAccountId="proj-b", **A3),
    ]
    files = {
        "ledger": write_jsonl(tmp_path / "projects.jsonl", events),
        "focus": write_csv(tmp_path / "projects.csv", rows),
    }
    g = report(files)
    assert set(g) == {"team-c", "team-d", "unallocated"}
    keys = ("allocated_cost", "cost_spot", "cost_on_demand")
    assert cents(g["team-c"], *keys) == (32.00, 32.00, 0.00)  # 8 x $4
    assert cents(g["team-d"], *keys) == (60.00, 0.00, 60.00)  # 6 x $10
    # proj-b's 2 idle GPU-h x $10; proj-a's instance is all held
    un = g["unallocated"]
    assert (un["unallocated_gpu_hours"], round(un["unallocated_cost"], 2)) == (2, 20.00)
    # on-demand a3 from proj-b's Standard hour, $10: spot saved 8 x (10 - 4) = $48
    assert round(g["team-c"]["spot_net_savings"], 2) == 48.00
    # the groups add up to the two hours' compute: 32 + 80 = $112
    assert round(sum(x["effective_cost"] for x in g.values()), 2) == 112.00


def test_by_purchase_option_keeps_reserved_idle_apart(bill: dict[str, Path]) -> None:
    g = report(bill, by="purchase_option")
    assert round(g["reserved"]["cost_reserved"], 2) == 24.00
    assert round(g["reserved-idle"]["reserved_idle_cost"], 2) == 72.00


def test_a_window_takes_the_idle_hour_out(bill: dict[str, Path]) -> None:
    g = report(bill, window=Window(since=datetime(2026, 3, 1, 12), until=datetime(2026, 3, 1, 13)))
    assert round(g["reserved-idle"]["reserved_idle_cost"], 2) == 24.00  # 12:00 only: 4 x $6


def test_without_a_window_the_report_covers_and_states_the_ledgers_hours(
    bill: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    rc = cli.main(["report", "--ledger", str(bill["ledger"]), "--focus", str(bill["focus"]),
                   "--format", "json"])  # fmt: skip
    doc = json.loads(capsys.readouterr().out)
    # allocation hour 12:00 and waste at 12:30: [12:00, 13:00); i-rsv's 13:00 hour is outside
    assert rc == 0 and doc["window"] == {
        "since": "2026-03-01T12:00:00Z",
        "until": "2026-03-01T13:00:00Z",
        "metered_to": None,
    }
    idle = next(g for g in doc["groups"] if g["tenant"] == "reserved-idle")
    assert idle["reserved_idle_cost"] == 24.00  # 4 GPU-h x $6
    assert doc["total"]["effective_cost"] == 100 + 64 + 108 + 20 + 24


# --- bad input: one line naming the file and line, exit 2 --------------------------------


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    rc = cli.main(["report", *args])
    err = capsys.readouterr().err
    assert err.count("\n") <= 1, err
    return rc, err


def test_negative_or_non_finite_ledger_quantities_are_refused(
    bill: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    events = ledger_rows()
    events[7]["x_WasteByInstance"][0]["x_WastedGpuSeconds"] = -7200  # line 8 of the file
    lp = write_jsonl(tmp_path / "neg.jsonl", events)
    rc, err = run(["--ledger", str(lp), "--focus", str(bill["focus"])], capsys)
    assert rc == 2 and f"{lp}:8: part 0: x_WastedGpuSeconds is -7200" in err, err
    events = ledger_rows()
    events[2]["x_GpuHours"] = float("nan")  # json.dumps writes NaN, json.loads reads it
    lp = write_jsonl(tmp_path / "nan.jsonl", events)
    rc, err = run(["--ledger", str(lp), "--focus", str(bill["focus"])], capsys)
    assert rc == 2 and f"{lp}:3: x_GpuHours is nan, not a finite number" in err, err


def test_an_unknown_schema_version_is_refused(
    bill: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    events = ledger_rows()
    events[0]["schema"] = "reclaimd.allocation/v9"
    lp = write_jsonl(tmp_path / "v9.jsonl", events)
    rc, err = run(["--ledger", str(lp), "--focus", str(bill["focus"])], capsys)
    assert rc == 2 and f"{lp}:1: unknown schema 'reclaimd.allocation/v9'" in err, err


def test_an_unknown_schema_is_refused_even_when_its_event_id_repeats_an_earlier_one(
    bill: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A v9 row that reuses rw-1's EventId (line 10) was skipped as a replay before its schema
    # was looked at: the report went on without saying it cannot read it.
    events = ledger_rows()
    events.append({**events[7], "schema": "reclaimd.restart-waste/v9"})
    lp = write_jsonl(tmp_path / "v9-replay.jsonl", events)
    rc, err = run(["--ledger", str(lp), "--focus", str(bill["focus"])], capsys)
    assert rc == 2 and f"{lp}:10: unknown schema 'reclaimd.restart-waste/v9'" in err, err


@pytest.mark.parametrize(
    "case",
    [
        (3, "EffectiveCost", "n/a", "EffectiveCost 'n/a' is not a number"),
        (2, "ConsumedQuantity", "-250", "ConsumedQuantity '-250' is negative"),
        (5, "EffectiveCost", "inf", "EffectiveCost 'inf' is not a finite number"),
        (4, "ChargePeriodStart", "yesterday", "ChargePeriodStart 'yesterday' is not a time"),
    ],
)
def test_bad_bill_values_are_refused_with_their_line(
    bill: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    case: tuple[int, str, str, str],
) -> None:
    row, column, value, message = case
    rows = bill_rows()
    rows[row - 1][column] = value  # data row N is line N + 1 (the header is line 1)
    focus = write_csv(tmp_path / "bad.csv", rows)
    rc, err = run(["--ledger", str(bill["ledger"]), "--focus", str(focus)], capsys)
    assert rc == 2 and f"{focus}:{row + 1}: {message}" in err, err


def typed_parquet(path: Path, rows: list[dict[str, Any]]) -> Path:
    """The bill as Parquet with every number a DOUBLE and the start a TIMESTAMPTZ."""
    csv_path = write_csv(path.with_suffix(".csv"), rows)
    duckdb.connect().execute(
        "COPY (SELECT * REPLACE (CAST(ChargePeriodStart AS TIMESTAMPTZ) AS ChargePeriodStart,"
        " TRY_CAST(EffectiveCost AS DOUBLE) AS EffectiveCost,"
        " TRY_CAST(ListCost AS DOUBLE) AS ListCost,"
        " TRY_CAST(ConsumedQuantity AS DOUBLE) AS ConsumedQuantity)"
        f" FROM read_csv('{csv_path}', all_varchar = true)) TO '{path}' (FORMAT parquet)"
    )
    return path


@pytest.mark.parametrize(
    "case",
    [
        (3, "EffectiveCost", "nan", "EffectiveCost 'nan' is not a finite number"),
        (5, "ListCost", "-inf", "ListCost '-inf' is not a finite number"),
        (2, "ConsumedQuantity", "-250", "ConsumedQuantity '-250.0' is negative"),
    ],
)
def test_bad_values_in_a_typed_parquet_bill_are_refused_with_their_row(
    bill: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    case: tuple[int, str, str, str],
) -> None:
    # Every number a DOUBLE: the file's bounds show a bad value is there, then its row.
    row, column, value, message = case
    rows = bill_rows()
    rows[row - 1][column] = value
    pq = typed_parquet(tmp_path / "bad.parquet", rows)
    rc, err = run(["--ledger", str(bill["ledger"]), "--focus", str(pq)], capsys)
    assert rc == 2 and f"{pq}: row {row}: {message}" in err, err


def test_a_typed_parquet_bill_and_a_negative_correction_in_it_are_not_refused(
    bill: dict[str, Path], tmp_path: Path
) -> None:
    typed = typed_parquet(tmp_path / "typed.parquet", bill_rows())
    assert report(bill, focus=typed) == report(bill)
    rows = bill_rows()
    rows[1]["ConsumedQuantity"], rows[1]["ChargeClass"] = "-250", "Correction"
    pq = typed_parquet(tmp_path / "correction.parquet", rows)
    assert report(bill, focus=pq) == report(bill, focus=write_csv(tmp_path / "c.csv", rows))


def without(rows: list[dict[str, Any]], path: Path, *dropped: str) -> Path:
    """The bill as CSV without the ``dropped`` columns."""
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=[c for c in FOCUS_COLUMNS if c not in dropped])
        w.writeheader()
        w.writerows({k: v for k, v in r.items() if k not in dropped} for r in rows)
    return path


@pytest.mark.parametrize(
    "column", ["ChargeCategory", "ServiceCategory", "ConsumedUnit", "ProviderName", "SkuMeter"]
)
def test_a_bill_missing_a_column_the_compute_rule_needs_is_refused(
    bill: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], column: str
) -> None:
    # Each was read as "not stated" and its test skipped, exit 0. Without ChargeCategory the
    # RI purchase, the tax and the credit were priced as GPU-hours (team-b's effective cost
    # $2,550.50, not $64); without ConsumedUnit GCE's GPU-seconds were hours (team-c $60.01,
    # not $108); without ProviderName GCE's core and RAM rows were instance-hours (figures
    # NULL); without ServiceCategory a network or storage row on an instance's id with an
    # hourly unit is compute (none in this bill, which is no reason to take the rest on
    # trust); without SkuMeter (this bill has Google rows and no ChargeDescription, where
    # Google's own FOCUS export names the SKU) no GCE row names its GPU.
    focus = without(bill_rows(), tmp_path / f"no-{column}.csv", column)
    rc, err = run(["--ledger", str(bill["ledger"]), "--focus", str(focus)], capsys)
    named = "ChargeDescription" if column == "SkuMeter" else column
    assert rc == 2 and f"{focus}: missing FOCUS column(s) {named}" in err, err


REQUIRED = (
    "ChargePeriodStart", "ResourceId", "SkuId", "PricingCategory", "EffectiveCost",
    "ConsumedQuantity", "ProviderName", "ServiceCategory", "ChargeCategory", "ConsumedUnit",
)  # fmt: skip


def test_a_minimal_export_with_the_needed_columns_prices_to_the_cent(
    bill: dict[str, Path], tmp_path: Path
) -> None:
    # The AWS rows with only the columns the rule needs (no SkuMeter: no Google row; no
    # ListCost, SubAccountId, ChargeClass): team-a and team-b and the reserved idle as in the
    # full bill (test_every_figure_of_the_hand_built_bill_to_the_cent); team-c's instances
    # have no row here, so its GPU-hours are unpriced, not guessed.
    rows = [r for r in bill_rows() if r["ProviderName"] == "AWS"]
    dropped = [c for c in FOCUS_COLUMNS if c not in REQUIRED]
    g = report(bill, focus=without(rows, tmp_path / "minimal.csv", *dropped))
    keys = ("allocated_cost", "cost_spot", "cost_on_demand", "cost_reserved")
    assert cents(g["team-a"], *keys) == (80.00, 40.00, 40.00, 0.00)
    assert cents(g["team-a"], "restart_waste_cost", "spot_net_savings") == (20.00, 30.00)
    assert cents(g["team-b"], *keys) == (64.00, 0.00, 40.00, 24.00)
    assert round(g["reserved-idle"]["reserved_idle_cost"], 2) == 72.00
    assert (g["team-c"]["allocated_cost"], g["team-c"]["unpriced_gpu_hours"]) == (0, 14 + 4)


def test_a_row_that_does_not_state_its_charge_category_prices_nothing(
    bill: dict[str, Path], tmp_path: Path
) -> None:
    # The RI purchase ($10,000 on i-rsv at 12:00) with a blank ChargeCategory: not shown to
    # be usage, so not a compute row. (Taken as usage it made i-rsv's 12:00 hour 2
    # instance-hours for $10,048: $628 / GPU-h.) Same for a blank ServiceCategory.
    for column in ("ChargeCategory", "ServiceCategory"):
        rows = bill_rows()
        rows[8][column] = ""
        g = report(bill, focus=write_csv(tmp_path / f"blank-{column}.csv", rows))
        assert cents(g["team-b"], "allocated_cost", "cost_reserved") == (64.00, 24.00), column
        assert round(g["reserved-idle"]["reserved_idle_cost"], 2) == 72.00, column


def test_a_missing_column_and_a_reversed_window_are_refused(
    bill: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = [{k: v for k, v in r.items() if k != "EffectiveCost"} for r in bill_rows()]
    focus = tmp_path / "no-cost.csv"
    with focus.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=[c for c in FOCUS_COLUMNS if c != "EffectiveCost"])
        w.writeheader()
        w.writerows(rows)
    rc, err = run(["--ledger", str(bill["ledger"]), "--focus", str(focus)], capsys)
    assert rc == 2 and f"{focus}: missing FOCUS column(s) EffectiveCost" in err, err
    rc, err = run(
        ["--ledger", str(bill["ledger"]), "--focus", str(bill["focus"]),
         "--since", "2026-03-02", "--until", "2026-03-01"],
        capsys,
    )  # fmt: skip
    assert rc == 2 and "--since must be before --until" in err, err
