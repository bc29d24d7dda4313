"""``reclaimd report`` on a bill in the shape of Google Cloud's own FOCUS export.

Google's export (BigQuery ``gcp_billing_export_focus_<account>``; docs/ledger.md, "Google
Cloud's FOCUS export", says where each column was confirmed) has no SkuMeter, no
ServiceCategory and no x_SkuDescription: the SKU's description is ChargeDescription, the
service ServiceName. A GPU's and a core's ConsumedQuantity are seconds, RAM's and a disk's
byte-seconds (ConsumedUnit, usage.unit); PricingUnit says hour and gibibyte hour. An
instance's ResourceId is its global name with the project's number and the instance's numeric
id; its name is ResourceName, its project id SubAccountId. A Spot VM's rows are SKUs of their
own ("Spot Preemptible ..."); their PricingCategory here is Standard, as Google's FOCUS view
maps every row without a commitment, which must not make spot rates the on-demand price. The
file is written as BigQuery exports a table: NUMERIC as DECIMAL(38,9), TIMESTAMP in UTC, and
the nested x_Credits and x_Project.

proj-a, a3-highgpu-8g (8 H100), hour 12:00 and 13:00:
  gpu-1 spot      12:00 GPU 28,800 s $19.20 + cores 748,800 s $4.16 + RAM $0.64 = $24.00
                  over 8 GPU-h -> $3.00 / GPU-h; its boot disk, also named gpu-1, $0.24
                  (byte-seconds, Compute Engine): not the instance's; egress $1.20 (Networking)
                  13:00 reclaimed at 13:30: GPU 14,400 s $9.60 + $2.08 + $0.32 = $12.00
                  over 4 GPU-h -> $3.00 / GPU-h
  gpu-2 on-demand 12:00 GPU 28,800 s $70.40 + cores $7.60 + RAM $2.00 = $80.00 -> $10.00 / GPU-h

Ledger: team-a holds gpu-1 (8 GPU-h at 12:00, 4 at 13:00) and loses 2 GPU-h of work on it at
13:30; team-b holds 6 of gpu-2's 8 GPU-h at 12:00.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import duckdb
import pytest
from test_report_bill import A3, alloc, part, report, run, waste, write_jsonl

from reclaimd.report import Window

H12 = datetime(2026, 3, 1, 12, tzinfo=UTC)
H13 = H12 + timedelta(hours=1)
PROJECT_NUMBER = "123456789012"
GPU_1 = f"//compute.googleapis.com/projects/{PROJECT_NUMBER}/zones/us-central1-a/instances/4417731562178273945"  # noqa: E501
GPU_2 = f"//compute.googleapis.com/projects/{PROJECT_NUMBER}/zones/us-central1-a/instances/902873124461234567"  # noqa: E501
DISK_1 = f"//compute.googleapis.com/projects/{PROJECT_NUMBER}/zones/us-central1-a/disks/5731447681477044785"  # noqa: E501
GIB_S = 2**30  # a gibibyte-second in byte-seconds

# Google's column names and BigQuery types (NUMERIC is DECIMAL(38, 9) in an exported file)
COLUMNS = {
    "AvailabilityZone": "VARCHAR",
    "BilledCost": "DECIMAL(38, 9)",
    "BillingAccountId": "VARCHAR",
    "BillingCurrency": "VARCHAR",
    "BillingPeriodStart": "TIMESTAMPTZ",
    "BillingPeriodEnd": "TIMESTAMPTZ",
    "ChargeCategory": "VARCHAR",
    "ChargeClass": "VARCHAR",
    "ChargeDescription": "VARCHAR",
    "ChargePeriodStart": "TIMESTAMPTZ",
    "ChargePeriodEnd": "TIMESTAMPTZ",
    "ConsumedQuantity": "DECIMAL(38, 9)",
    "ConsumedUnit": "VARCHAR",
    "ContractedCost": "DECIMAL(38, 9)",
    "ListCost": "DECIMAL(38, 9)",
    "PricingCategory": "VARCHAR",
    "PricingQuantity": "DECIMAL(38, 9)",
    "PricingUnit": "VARCHAR",
    "ProviderName": "VARCHAR",
    "PublisherName": "VARCHAR",
    "RegionId": "VARCHAR",
    "ResourceId": "VARCHAR",
    "ResourceName": "VARCHAR",
    "ServiceName": "VARCHAR",
    "SkuId": "VARCHAR",
    "SkuPriceId": "VARCHAR",
    "SubAccountId": "VARCHAR",
    "SubAccountName": "VARCHAR",
    "x_CostType": "VARCHAR",
    "x_ServiceId": "VARCHAR",
    "EffectiveCost": "DECIMAL(38, 9)",
}
NESTED = {
    "x_Credits": "STRUCT(Name VARCHAR, Amount DECIMAL(38, 9), FullName VARCHAR, Id VARCHAR,"
    " Type VARCHAR)[]",
    "x_Project": "STRUCT(Id VARCHAR, Number VARCHAR, Name VARCHAR)",
}


# ((ConsumedQuantity, ConsumedUnit), (PricingQuantity, PricingUnit))
Amounts = tuple[tuple[float, str], tuple[float, str]]


def row(
    rid: str, name: str, sku: str, amounts: Amounts, cost: float, *,
    hour: datetime = H12, service: str = "Compute Engine", **kw: Any,
) -> dict[str, Any]:  # fmt: skip
    (qty, unit), (pqty, punit) = amounts
    r = {
        "AvailabilityZone": "us-central1-a",
        "BilledCost": cost,
        "BillingAccountId": "010101-F0FFF0-61C528",
        "BillingCurrency": "USD",
        "BillingPeriodStart": datetime(2026, 3, 1, 8, tzinfo=UTC),  # midnight Pacific
        "BillingPeriodEnd": datetime(2026, 4, 1, 7, tzinfo=UTC),
        "ChargeCategory": "Usage",
        "ChargeClass": None,
        "ChargeDescription": sku,
        "ChargePeriodStart": hour,
        "ChargePeriodEnd": hour + timedelta(hours=1),
        "ConsumedQuantity": qty,
        "ConsumedUnit": unit,
        "ContractedCost": cost,
        "ListCost": cost,
        "PricingCategory": "Standard",
        "PricingQuantity": pqty,
        "PricingUnit": punit,
        "ProviderName": "Google Cloud",
        "PublisherName": "Google Cloud",
        "RegionId": "us-central1",
        "ResourceId": rid,
        "ResourceName": name,
        "ServiceName": service,
        "SkuId": "SKU-" + "".join(w[0] for w in sku.split()).upper(),
        "SkuPriceId": None,
        "SubAccountId": "proj-a",
        "SubAccountName": "Project A",
        "x_CostType": "regular",
        "x_ServiceId": "6F81-5844-456A" if service == "Compute Engine" else "E505-1604-58F8",
        "EffectiveCost": cost,
        "x_Credits": [],
        "x_Project": {"Id": "proj-a", "Number": PROJECT_NUMBER, "Name": "Project A"},
    }
    r.update(kw)
    return r


def gpu_s(gpus: int, seconds: int) -> Amounts:
    return (gpus * seconds, "seconds"), (gpus * seconds / 3600, "hour")


def ram(gib: int, seconds: int) -> Amounts:
    return (gib * seconds * GIB_S, "byte-seconds"), (gib * seconds / 3600, "gibibyte hour")


SPOT = "Spot Preemptible "


def google_rows() -> list[dict[str, Any]]:
    return [
        row(GPU_1, "gpu-1", SPOT + "Nvidia H100 80GB GPU running in Americas",
            gpu_s(8, 3600), 19.20),
        row(GPU_1, "gpu-1", SPOT + "A3 Instance Core running in Americas",
            gpu_s(208, 3600), 4.16),
        row(GPU_1, "gpu-1", SPOT + "A3 Instance Ram running in Americas",
            ram(1872, 3600), 0.64),
        row(DISK_1, "gpu-1", "SSD backed PD Capacity", ram(1024, 3600), 0.24),
        row(GPU_1, "gpu-1", "Network Internet Data Transfer Out from Americas to Americas",
            ((100 * GIB_S, "bytes"), (100, "gibibyte")), 1.20, service="Networking"),
        row(GPU_1, "gpu-1", SPOT + "Nvidia H100 80GB GPU running in Americas",
            gpu_s(8, 1800), 9.60, hour=H13),
        row(GPU_1, "gpu-1", SPOT + "A3 Instance Core running in Americas",
            gpu_s(208, 1800), 2.08, hour=H13),
        row(GPU_1, "gpu-1", SPOT + "A3 Instance Ram running in Americas",
            ram(1872, 1800), 0.32, hour=H13),
        row(GPU_2, "gpu-2", "Nvidia H100 80GB GPU running in Americas",
            gpu_s(8, 3600), 70.40),
        row(GPU_2, "gpu-2", "A3 Instance Core running in Americas", gpu_s(208, 3600), 7.60),
        row(GPU_2, "gpu-2", "A3 Instance Ram running in Americas", ram(1872, 3600), 2.00),
    ]  # fmt: skip


def write_bill(path: Path, rows: list[dict[str, Any]], *, nested: bool = True) -> Path:
    """The rows as BigQuery's EXPORT DATA writes them: Parquet with the export's types (or,
    ``.csv``, text; a CSV has no nested columns)."""
    types = {**COLUMNS, **(NESTED if nested else {})}
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    spec = ", ".join(f'"{c}" {t}' for c, t in types.items())
    con.execute(f"CREATE TABLE b ({spec})")
    con.executemany(
        f"INSERT INTO b VALUES ({', '.join('?' * len(types))})",
        [[r[c] for c in types] for r in rows],
    )
    fmt = "parquet" if path.suffix == ".parquet" else "csv, header true"
    con.execute(f"COPY b TO '{path}' (FORMAT {fmt})")
    con.close()
    return path


def google_ledger() -> list[dict[str, Any]]:
    gpu_1 = {"SubAccountId": "proj-a", **A3}
    late = {"ChargePeriodStart": "2026-03-01T13:00:00Z", "ChargePeriodEnd": "2026-03-01T14:00:00Z"}
    stopped = waste("rw-g", "team-a", [part("gpu-1", "g-1", "spot", 7200, "a3-highgpu-8g")], "n-g")
    stopped["ChargePeriodStart"], stopped["ChargePeriodEnd"] = (
        "2026-03-01T12:30:00Z",
        "2026-03-01T13:30:00Z",
    )
    return [
        alloc("team-a", "g-1", "gpu-1", 8, "spot", **gpu_1),
        {**alloc("team-a", "g-1", "gpu-1", 4, "spot", **gpu_1), "EventId": "al-a-13", **late},
        alloc("team-b", "g-2", "gpu-2", 6, "on_demand", SubAccountId="proj-a", **A3),
        stopped,
    ]


TWO_HOURS = Window(since=datetime(2026, 3, 1, 12), until=datetime(2026, 3, 1, 14))


@pytest.fixture
def google(tmp_path: Path) -> dict[str, Path]:
    return {
        "ledger": write_jsonl(tmp_path / "ledger.jsonl", google_ledger()),
        "focus": write_bill(tmp_path / "focus.parquet", google_rows()),
    }


def cents(g: dict[str, Any], *keys: str) -> tuple[float, ...]:
    return tuple(round(g[k], 2) for k in keys)


def test_a_bill_in_googles_focus_export_shape_prices_to_the_cent(
    google: dict[str, Path],
) -> None:
    g = report(google, window=TWO_HOURS)
    assert set(g) == {"team-a", "team-b", "unallocated"}
    a, b, un = g["team-a"], g["team-b"], g["unallocated"]
    # team-a: 8 GPU-h at 12:00 and 4 at 13:00 on gpu-1, both hours ($24 / 8 GPU-h and $12 /
    # 4 GPU-h, the 13:00 GPU row's 14,400 s) $3: 12 x $3 = $36. Matched on ResourceName and
    # SubAccountId ("proj-a/gpu-1"): the ResourceId's last segment is a number. Had the boot
    # disk named gpu-1 been counted, 12:00 would be $24.24 / 8 and team-a $36.24.
    assert cents(a, "allocated_cost", "cost_spot", "cost_on_demand") == (36.00, 36.00, 0.00)
    assert (a["allocated_gpu_hours"], a["gpu_hours_spot"], a["unpriced_gpu_hours"]) == (12, 12, 0)
    # 2 GPU-h of work lost at 13:30 on gpu-1, at 13:00's $3: $6; effective $42
    assert cents(a, "restart_waste_cost", "effective_cost") == (6.00, 42.00)
    # the on-demand price of a3 is gpu-2's hour, $10 (the Spot Preemptible SKUs are spot
    # though their PricingCategory says Standard: taken as on-demand, the reference would
    # be the mean of $3, $3 and $10 and the savings $22): 12 x (10 - 3) = $84, less $6
    assert round(a["spot_net_savings"], 2) == 78.00
    # team-b: 6 GPU-h x ($70.40 + $7.60 + $2.00) / 8 = 6 x $10
    assert cents(b, "allocated_cost", "cost_on_demand", "effective_cost") == (60.00, 60.00, 60.00)
    # gpu-2's 2 unheld GPU-h at $10; gpu-1's hours were fully held
    assert (un["unallocated_gpu_hours"], round(un["unallocated_cost"], 2)) == (2, 20.00)
    # every compute dollar of the two instances: 24 + 12 + 80 = $116 = 36 + 60 + 20
    paid = sum(x["allocated_cost"] + x["unallocated_cost"] for x in g.values())
    assert round(paid, 2) == 116.00


def test_the_same_export_as_csv_gives_the_same_report(
    google: dict[str, Path], tmp_path: Path
) -> None:
    focus = write_bill(tmp_path / "focus.csv", google_rows(), nested=False)
    assert report(google, focus=focus, window=TWO_HOURS) == report(google, window=TWO_HOURS)


def test_an_export_without_chargedescription_is_refused(
    google: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = google_rows()
    focus = tmp_path / "no-description.csv"
    write_bill(focus, rows, nested=False)
    con = duckdb.connect()
    con.execute(
        f"COPY (SELECT * EXCLUDE (ChargeDescription) FROM read_csv('{focus}'))"
        f" TO '{focus}' (FORMAT csv, header true)"
    )
    con.close()
    rc, err = run(["--ledger", str(google["ledger"]), "--focus", str(focus)], capsys)
    assert rc == 2 and f"{focus}: missing FOCUS column(s) ChargeDescription" in err, err


def detailed_export(path: Path) -> Path:
    """One row of Google's detailed usage cost export (gcp_billing_export_resource_v1_*), as
    BigQuery's EXPORT DATA writes it: nested sku, usage (seconds), resource."""
    con = duckdb.connect()
    con.execute(
        f"""COPY (SELECT
          '010101-F0FFF0-61C528' AS billing_account_id,
          {{'id': '6F81-5844-456A', 'description': 'Compute Engine'}} AS service,
          {{'id': 'A1B2-C3D4-E5F6', 'description': 'Nvidia H100 80GB GPU running in Americas'}}
            AS sku,
          TIMESTAMPTZ '2026-03-01 12:00:00+00' AS usage_start_time,
          TIMESTAMPTZ '2026-03-01 13:00:00+00' AS usage_end_time,
          {{'id': 'proj-a', 'number': '{PROJECT_NUMBER}', 'name': 'Project A'}} AS project,
          {{'name': 'gpu-2', 'global_name': '{GPU_2}'}} AS resource,
          CAST(70.40 AS DECIMAL(38, 9)) AS cost,
          'USD' AS currency,
          {{'amount': 28800.0, 'unit': 'seconds', 'amount_in_pricing_units': 8.0,
            'pricing_unit': 'hour'}} AS usage,
          'regular' AS cost_type
        ) TO '{path}' (FORMAT parquet)"""
    )
    con.close()
    return path


def test_googles_detailed_export_is_refused_naming_the_focus_export(
    google: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Not FOCUS: read as one it was "missing FOCUS column(s) ChargePeriodStart, ..."
    focus = detailed_export(tmp_path / "gcp_billing_export_resource_v1.parquet")
    rc, err = run(["--ledger", str(google["ledger"]), "--focus", str(focus)], capsys)
    assert rc == 2, err
    assert err.strip() == (
        f"reclaimd report: {focus}: this is Google Cloud's detailed usage cost export"
        " (gcp_billing_export_resource_v1_*), not FOCUS: give the FOCUS export"
        ' (gcp_billing_export_focus_*, Cloud Billing\'s "FOCUS usage cost data") instead'
    )
