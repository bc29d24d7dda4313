"""``reclaimd report``'s pricing: hand-computed answers over small ledgers and bills."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import duckdb
import pytest

from reclaimd import cli
from reclaimd.report import Window, build, engine, focus, render

H12 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)


def z(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def alloc(
    tenant: str, instance: str | None, node: str, gpu_h: float, po: str, **kw: Any
) -> dict[str, Any]:
    hour = kw.pop("hour", H12)
    return {
        "schema": "reclaimd.allocation/v1",
        "EventId": f"al-{tenant}-{node}-{hour:%H}-{po}",
        "ChargePeriodStart": z(hour),
        "ChargePeriodEnd": z(hour + timedelta(hours=1)),
        "ResourceId": instance,
        "x_K8sNodeName": node,
        "SkuId": kw.pop("sku", "p5.48xlarge"),
        "x_PurchaseOption": po,
        "Tags": {"tenant": tenant, "queue": "research", "purchase_option": po},
        "x_GpuHours": gpu_h,
        "x_MigGpuEquivalentHours": kw.pop("mig_gpu_h", 0.0),
        "x_MigProfileHours": kw.pop("mig_h", 0.0),
        "x_HbmGbHours": gpu_h * 80,
        "x_NodeGpus": 8,
    }


def waste(
    event: str,
    tenant: str,
    parts: list[dict[str, Any]],
    *,
    outcome: str = "partial",
    met: bool = True,
    stopped: datetime = H12 + timedelta(minutes=30),
    notice: str = "n-1",
) -> dict[str, Any]:
    return {
        "schema": "reclaimd.restart-waste/v2",
        "EventId": event,
        "ChargePeriodStart": z(stopped - timedelta(hours=1)),
        "ChargePeriodEnd": z(stopped),
        "Tags": {
            "tenant": tenant,
            "queue": "research",
            "sku": "p5.48xlarge",
            "purchase_option": "spot",
        },
        "x_WastedGpuSeconds": sum(p["x_WastedGpuSeconds"] for p in parts),
        "x_GangId": f"jobset:{tenant}/{event}",
        "x_NoticeId": notice,
        "x_CheckpointOutcome": outcome,
        "x_DeadlineMet": met,
        "x_WasteByInstance": parts,
    }


def part(instance: str | None, node: str, po: str, gpu_s: float) -> dict[str, Any]:
    return {
        "ResourceId": instance,
        "x_K8sNodeName": node,
        "SkuId": "p5.48xlarge",
        "x_PurchaseOption": po,
        "x_WastedGpuSeconds": gpu_s,
    }


# A small export: the columns a price needs (focus.FOCUS_REQUIRED), an end and ListCost.
FOCUS_HEADER = (
    "ProviderName,ChargePeriodStart,ChargePeriodEnd,ResourceId,SkuId,PricingCategory,"
    "ServiceCategory,ChargeCategory,EffectiveCost,ListCost,ConsumedQuantity,ConsumedUnit\n"
)


def focus_row(
    instance: str, cost: float, category: str, *, list_cost: float = 98.32, hour: datetime = H12
) -> str:
    end = z(hour + timedelta(hours=1))
    return (
        f"AWS,{z(hour)},{end},{instance},p5.48xlarge,{category},Compute,Usage,{cost},"
        f"{list_cost},1,Hrs\n"
    )


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    ledger = [
        alloc("team-a", "i-spot", "n-spot", 8, "spot"),
        alloc("team-a", "i-od", "n-od", 4, "on_demand"),
        alloc("team-b", "i-od", "n-od", 4, "on_demand"),
        # a gang across both nodes: 2 GPU-h lost on spot, 1 on on-demand
        waste(
            "rw-1",
            "team-a",
            [part("i-spot", "n-spot", "spot", 7200), part("i-od", "n-od", "on_demand", 3600)],
        ),
    ]
    lp = tmp_path / "ledger.jsonl"
    lp.write_text("".join(json.dumps(e) + "\n" for e in ledger))
    fp = tmp_path / "focus.csv"
    # spot instance: $40/h for 8 GPUs = $5/GPU-h; on-demand: $80/h = $10/GPU-h
    fp.write_text(
        FOCUS_HEADER + focus_row("i-spot", 40, "Dynamic") + focus_row("i-od", 80, "Standard")
    )
    rp = tmp_path / "rates.csv"
    rp.write_text(
        "sku,purchase_option,usd_per_gpu_hour\np5.48xlarge,spot,3.5\np5.48xlarge,on_demand,12\n"
    )
    return {"ledger": lp, "focus": fp, "rates": rp}


def groups_of(files: dict[str, Path], **kw: Any) -> dict[str, dict[str, Any]]:
    out = build(
        [str(files["ledger"])],
        by=kw.pop("by", "tenant"),
        focus=kw.pop("focus", files["focus"]),
        rates=kw.pop("rates", None),
        window=kw.pop("window", Window()),
    )
    return {g.key: g.figures for g in out}


def test_bill_prices_allocation_and_each_part_of_the_waste_on_its_instance(
    files: dict[str, Path],
) -> None:
    g = groups_of(files)
    a, b = g["team-a"], g["team-b"]
    assert a["allocated_gpu_hours"] == 12
    assert (a["cost_spot"], a["cost_on_demand"], a["allocated_cost"]) == (40, 40, 80)
    assert a["restart_waste_gpu_hours"] == 3
    assert a["restart_waste_cost"] == 2 * 5 + 1 * 10
    assert a["effective_cost"] == 100
    assert a["waste_share"] == 0.25
    # on-demand price of the SKU from the bill's Standard rows: $10; spot saved 8 x (10-5),
    # less the waste of the spot ranks ($10)
    assert a["spot_net_savings"] == 8 * (10 - 5) - 10
    assert (a["notices"], a["gangs_hit"], a["partial"], a["deadline_misses"]) == (1, 1, 1, 0)
    assert (b["allocated_cost"], b["restart_waste_cost"], b["effective_cost"]) == (40, 0, 40)
    assert b["waste_share"] == 0 and b["spot_net_savings"] == 0


def test_the_rates_file_sets_the_on_demand_price_for_savings(files: dict[str, Path]) -> None:
    a = groups_of(files, rates=files["rates"])["team-a"]
    assert a["allocated_cost"] == 80  # the bill still prices what it has rows for
    assert a["spot_net_savings"] == pytest.approx(8 * (12 - 5) - 10)


def test_rates_alone_price_everything(files: dict[str, Path]) -> None:
    a = groups_of(files, focus=None, rates=files["rates"])["team-a"]
    assert a["allocated_cost"] == 8 * 3.5 + 4 * 12
    assert a["restart_waste_cost"] == 2 * 3.5 + 1 * 12
    assert a["spot_net_savings"] == 8 * (12 - 3.5) - 2 * 3.5


def test_list_cost_is_the_on_demand_price_when_nothing_else_says(
    tmp_path: Path, files: dict[str, Path]
) -> None:
    only_spot = tmp_path / "spot-only.csv"
    only_spot.write_text(FOCUS_HEADER + focus_row("i-spot", 40, "Dynamic", list_cost=80))
    a = groups_of(files, focus=only_spot)["team-a"]
    assert a["cost_spot"] == 40 and a["cost_on_demand"] == 0
    assert a["unpriced_gpu_hours"] == 4 + 1  # on-demand allocation and waste: no row, no rate
    assert a["spot_net_savings"] == 8 * (80 / 8 - 5) - 10


def test_a_part_without_an_instance_takes_it_from_the_meter(
    tmp_path: Path, files: dict[str, Path]
) -> None:
    lp = tmp_path / "l.jsonl"
    events = [
        alloc("team-a", "i-spot", "n-spot", 8, "spot"),
        waste("rw-9", "team-a", [part(None, "n-spot", "spot", 3600)]),
    ]
    lp.write_text("".join(json.dumps(e) + "\n" for e in events))
    a = groups_of({**files, "ledger": lp})["team-a"]
    assert a["restart_waste_cost"] == 5 and a["unpriced_gpu_hours"] == 0


def test_by_purchase_option_puts_each_part_in_its_own_group(files: dict[str, Path]) -> None:
    g = groups_of(files, by="purchase_option")
    assert set(g) == {"spot", "on_demand"}
    assert (g["spot"]["restart_waste_cost"], g["on_demand"]["restart_waste_cost"]) == (10, 10)
    assert g["on_demand"]["allocated_cost"] == 80


def test_window_and_empty_window(files: dict[str, Path]) -> None:
    late = Window(since=datetime(2026, 3, 2))
    with pytest.raises(
        engine.InputError, match="no allocation, restart-waste or restart-overhead rows"
    ):
        groups_of(files, window=late)
    # the waste stopped at 12:30, inside [12:15, 13:00); the 12:00 allocation hour is not
    g = groups_of(
        files, window=Window(since=datetime(2026, 3, 1, 12, 15), until=datetime(2026, 3, 1, 13))
    )
    assert g["team-a"]["allocated_gpu_hours"] == 0 and g["team-a"]["restart_waste_gpu_hours"] == 3


def test_replayed_events_are_counted_once(tmp_path: Path, files: dict[str, Path]) -> None:
    doubled = tmp_path / "twice.jsonl"
    doubled.write_text(files["ledger"].read_text() * 2)
    assert groups_of({**files, "ledger": doubled}) == groups_of(files)


def test_nothing_outside_the_allowlist_reaches_a_report(
    tmp_path: Path, files: dict[str, Path]
) -> None:
    ev = alloc("team-a", "i-spot", "n-spot", 8, "spot")
    ev["Tags"] = {"tenant": "me@example.com", "user_email": "me@example.com", "prompt": "SECRET"}
    lp = tmp_path / "leak.jsonl"
    lp.write_text(json.dumps(ev) + "\n")
    groups = build([str(lp)], by="tenant", focus=files["focus"], rates=None, window=Window())
    text = "".join(
        (
            render.as_json(groups, Window(), "tenant"),
            render.as_csv(groups, "tenant"),
            render.as_table(groups, "tenant"),
            render.as_html(groups, Window(), "tenant"),
        )
    )
    assert "example.com" not in text and "SECRET" not in text and "n-spot" not in text
    assert [g.key for g in groups] == ["unattributed"]


def test_focus_1_2_with_other_providers_and_columns_parses(
    tmp_path: Path, files: dict[str, Path]
) -> None:
    # FOCUS 1.2 column set (a subset of real ones, plus provider x_ columns), three providers,
    # an ARN and a GCE resource name as ResourceId, rows that are not ours, and a Parquet file.
    con = duckdb.connect()
    sql = """
        CREATE TABLE f AS SELECT * FROM (VALUES
          ('AWS', 'Amazon Web Services', 'arn:aws:ec2:us-east-2:123:instance/i-spot', 'p5.48xlarge',
           'Dynamic', 'Compute', 'Usage', NULL, TIMESTAMPTZ 'T12', TIMESTAMPTZ 'T13',
           40.0, 98.32, 40.0, 1.0, 'Hours', 'USD', '{"team":"a"}', 'x', NULL),
          ('AWS', 'Amazon Web Services', 'arn:aws:ec2:us-east-2:123:instance/i-od', 'p5.48xlarge',
           'Standard', 'Compute', 'Usage', NULL, TIMESTAMPTZ 'T12', TIMESTAMPTZ 'T13',
           80.0, 98.32, 80.0, 1.0, 'Hours', 'USD', '{}', 'y', NULL),
          ('AWS', 'Amazon Web Services', 'arn:aws:ec2:us-east-2:123:instance/i-od', 'p5.48xlarge',
           'Standard', 'Compute', 'Tax', NULL, TIMESTAMPTZ 'T12', TIMESTAMPTZ 'T13',
           7.0, 7.0, 7.0, 1.0, 'Hours', 'USD', '{}', 'y', NULL),
          ('Google Cloud', 'Google Cloud',
           '//compute.googleapis.com/projects/p/zones/z/instances/g1',
           'a3-highgpu-8g', 'Committed', 'Compute', 'Usage', NULL, TIMESTAMPTZ 'T12',
           TIMESTAMPTZ 'T13', 60.0, 88.0, 60.0, 1.0, 'Hours', 'USD', '{}', NULL, 'H100 GPU'),
          ('Microsoft', 'Microsoft', '/subscriptions/s/vm/v1', 'ND96', 'Standard', 'Compute',
           'Usage', NULL, TIMESTAMPTZ 'T12', TIMESTAMPTZ 'T13', 1.0, 1.0, 1.0, 1.0,
           'Hours', 'USD', '{}', NULL, NULL)
        ) AS t(ProviderName, ServiceProviderName, ResourceId, SkuId, PricingCategory,
               ServiceCategory, ChargeCategory, ChargeClass, ChargePeriodStart, ChargePeriodEnd,
               EffectiveCost, ListCost, BilledCost, ConsumedQuantity, ConsumedUnit,
               BillingCurrency, Tags, x_ServiceCode, SkuMeter)
        """
    t12, t13 = "'2026-03-01 12:00:00+00'", "'2026-03-01 13:00:00+00'"
    con.execute(sql.replace("'T12'", t12).replace("'T13'", t13))
    pq = tmp_path / "focus-1.2.parquet"
    con.execute(f"COPY f TO '{pq}' (FORMAT parquet)")
    assert groups_of(files, focus=pq) == groups_of(files)  # the Tax row is not usage


def test_focus_ids_name_each_clouds_instance_as_the_ledger_does() -> None:
    """An AKS node's scale-set instance in an Azure export is its VM, '<vmss>_<n>' (what the
    azure:// providerID and Scheduled Events name); the other shapes are as before."""
    con = duckdb.connect()
    con.execute(
        """CREATE TABLE f AS SELECT * FROM (VALUES
          ('Microsoft', '8d1a', '/subscriptions/8d1a/resourcegroups/mc_rg_aks_eastus/providers'
           || '/microsoft.compute/virtualmachinescalesets/aks-spotgpu-12345678-vmss'
           || '/virtualmachines/3'),
          ('Microsoft', '8d1a', '/subscriptions/8d1a/resourceGroups/rg/providers'
           || '/Microsoft.Compute/virtualMachines/gpu-vm-7'),
          ('AWS', '123', 'arn:aws:ec2:us-east-2:123:instance/i-spot'),
          ('Google Cloud', 'p', '//compute.googleapis.com/projects/p/zones/z/instances/g1')
        ) AS t(ProviderName, SubAccountId, ResourceId)"""
    )
    kinds = {"ResourceId": "text", "ProviderName": "text", "SubAccountId": "text"}
    ids = focus.focus_ids("f", kinds)
    rows = con.execute(
        f"SELECT {focus._instance_id(kinds)} FROM f JOIN ({ids}) m ON m.raw = f.ResourceId"
    ).fetchall()
    assert sorted(r[0] for r in rows) == [
        "aks-spotgpu-12345678-vmss_3",
        "gpu-vm-7",
        "i-spot",
        "p/g1",
    ]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (
            "ChargePeriodStart,ResourceId\n2026-03-01T12:00:00Z,i-1\n",
            "missing FOCUS column(s) SkuId",
        ),
        (
            FOCUS_HEADER + focus_row("i-spot", 40, "Dynamic").replace(",40,", ",forty,"),
            "bad.csv:2: EffectiveCost 'forty' is not a number",
        ),
        (
            FOCUS_HEADER
            + focus_row("i-spot", 40, "Dynamic").replace("2026-03-01T12:00:00Z", "noon", 1),
            "bad.csv:2: ChargePeriodStart 'noon' is not a time",
        ),
    ],
)
def test_bad_focus_is_one_line_and_exit_2(
    tmp_path: Path,
    files: dict[str, Path],
    capsys: pytest.CaptureFixture[str],
    content: str,
    message: str,
) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text(content)
    rc = cli.main(["report", "--ledger", str(files["ledger"]), "--focus", str(bad)])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and message in err, err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--since", "2030-01-01"], "no allocation, restart-waste or restart-overhead rows"),
        (["--rates", "RATES_BAD"], "usd_per_gpu_hour is not a number"),
        (["--ledger", "LEDGER_BAD"], "not JSON"),
        (["--focus", "/nonexistent.csv"], "no such file"),
        (["--focus", "FOCUS_TXT"], "must be .csv"),
    ],
)
def test_bad_inputs_are_one_line_and_exit_2(
    tmp_path: Path,
    files: dict[str, Path],
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    message: str,
) -> None:
    (tmp_path / "r.csv").write_text(
        "sku,purchase_option,usd_per_gpu_hour\np5.48xlarge,spot,cheap\n"
    )
    (tmp_path / "l.jsonl").write_text('{"schema": "reclaimd.restart-waste/v2"\n')
    (tmp_path / "f.txt").write_text("x")
    subst = {
        "RATES_BAD": str(tmp_path / "r.csv"),
        "LEDGER_BAD": str(tmp_path / "l.jsonl"),
        "FOCUS_TXT": str(tmp_path / "f.txt"),
    }
    args = [subst.get(a, a) for a in args]
    base = ["report", "--ledger", str(files["ledger"]), "--focus", str(files["focus"])]
    if "--ledger" in args:
        base = ["report", "--focus", str(files["focus"])]
    if "--focus" in args:
        base = ["report", "--ledger", str(files["ledger"])]
    rc = cli.main([*base, *args])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and message in err, err


def test_json_keys_and_formats(files: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    base = ["report", "--ledger", str(files["ledger"]), "--focus", str(files["focus"])]
    assert cli.main([*base, "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    a = next(g for g in doc["groups"] if g["tenant"] == "team-a")
    for key in (
        "allocated_gpu_hours",
        "allocated_cost",
        "restart_waste_gpu_hours",
        "restart_waste_cost",
        "effective_cost",
        "waste_share",
        "spot_net_savings",
    ):
        assert key in a
    assert (a["effective_cost"], doc["total"]["effective_cost"]) == (100.0, 140.0)
    assert cli.main([*base, "--format", "csv", "--by", "queue"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("queue,allocated_gpu_hours,") and lines[1].startswith(
        "research,16.0,"
    )
    assert cli.main([*base]) == 0
    table = capsys.readouterr().out
    assert "team-a" in table and "TOTAL" in table and "100.00" in table and "140.00" in table


def test_the_sql_file_is_the_one_the_report_runs() -> None:
    text = engine.sql_text()
    assert text.lstrip().startswith("-- reclaimd report")
    # --detail: report.sql's relations, then idle.sql's SELECT in place of the groups'
    idle = engine.idle_sql()
    assert idle.startswith(text[: text.index(engine.RESULT_MARKER)]) and "FROM idle" in idle
    for engine_specific in ("::", "date_trunc", "regexp", "TRY_CAST", "QUALIFY"):
        assert engine_specific not in text + idle  # portable to Athena and BigQuery


# --- the picture ---------------------------------------------------------------------------


def test_html_is_self_contained_and_has_a_bar_per_tenant(files: dict[str, Path]) -> None:
    page = render.as_html(groups_list(files), Window(), "tenant")
    for needle in ("src=", "href=", "<script", "@import", "url("):
        assert needle not in page
    # team-a: spot $40, on-demand $40, waste $20 on top; team-b: on-demand $40
    assert page.count(f'fill="{render.WASTE_RED}"><title>restart waste: $20.00') == 1
    assert "<title>spot: $40.00</title>" in page and "$100.00</text>" in page
    assert page.index(">team-a<") < page.index(">team-b<")


def groups_list(files: dict[str, Path]) -> list[Any]:
    return build(
        [str(files["ledger"])], by="tenant", focus=files["focus"], rates=None, window=Window()
    )


def test_chromium_draws_the_waste_on_top_of_the_cost(
    files: dict[str, Path], tmp_path: Path
) -> None:
    from test_postmortem import png_pixels, screenshot

    page = tmp_path / "report.html"
    page.write_text(render.as_html(groups_list(files), Window(), "tenant"))
    pixels = list(png_pixels(screenshot(page, tmp_path / "report.png")))
    assert len(pixels) == 1400 * 900

    def count(hex_colour: str) -> int:
        want = bytes.fromhex(hex_colour.removeprefix("#"))
        return sum(1 for p in pixels if all(abs(a - b) <= 6 for a, b in zip(p, want, strict=True)))

    red = count(render.WASTE_RED)
    spot = count(render.COLOURS["cost_spot"])
    od = count(render.COLOURS["cost_on_demand"])
    # bar widths scale with dollars: waste $20 against spot $40 and on-demand $40 + $40
    assert red > 1000 and spot > 1000
    assert 0.4 < red / spot < 0.6
    assert 1.8 < od / spot < 2.2
