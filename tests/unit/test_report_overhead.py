"""``reclaimd report`` prices restart overhead (``reclaimd.restart-overhead/v1``) by hand.

The bill and the ledger are test_report_bill's (12:00: i-spot $5 / GPU-h spot, i-od $10
on-demand, proj-a's gpu-1 $4 spot; team-a effective $100, team-c $108), plus the restart
overhead of two replacement gangs, restarted at 12:45:

  ro-1 team-a (pods-ready)      i-spot 5,400 GPU-s = 1.5 GPU-h x $5  = $7.50
                                i-od   1,800 GPU-s = 0.5 GPU-h x $10 = $5.00   -> 2 GPU-h, $12.50
  ro-2 team-c (sdk-first-step)  gpu-1 on node g-a (proj-a's), 3,600 GPU-s = 1 GPU-h x $4 = $4.00

Overhead is a breakdown of the allocated cost (the replacement's pods hold their GPUs while
they restore, and the meter charged them): it is never added to effective_cost.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from test_report_bill import (
    BOTH_HOURS,
    H12,
    bill_rows,
    cents,
    ledger_rows,
    report,
    run,
    write_csv,
    write_jsonl,
    z,
)

from reclaimd import cli
from reclaimd.ledger.labels import LabelPolicy
from reclaimd.report import Window, build, engine, ledger_input, render

RESTARTED = H12 + timedelta(minutes=45)
OVERHEAD_COLUMNS = ("restart_overhead_gpu_hours", "restart_overhead_cost")


def overhead_part(
    rid: str | None, node: str, po: str, gpu_s: float, sku: str = "p5.48xlarge"
) -> dict[str, Any]:
    return {
        "ResourceId": rid,
        "SkuId": sku,
        "PricingCategory": "Dynamic" if po == "spot" else "Standard",
        "x_PurchaseOption": po,
        "x_K8sNodeName": node,
        "x_PlacementSource": "node",
        "x_Ranks": 4,
        "x_GpuCount": 4,
        "x_RestartOverheadGpuSeconds": gpu_s,
    }


def overhead(
    event: str,
    tenant: str,
    parts: list[dict[str, Any]],
    *,
    source: str = "pods-ready",
    restarted: datetime = RESTARTED,
) -> dict[str, Any]:
    received = restarted - timedelta(minutes=4, seconds=30)
    gpu_s = sum(p["x_RestartOverheadGpuSeconds"] for p in parts)
    return {
        "schema": "reclaimd.restart-overhead/v1",
        "EventId": event,
        "ChargePeriodStart": z(received),
        "ChargePeriodEnd": z(restarted),
        "ChargeCategory": "Usage",
        "PricingCategory": "Dynamic",
        "ConsumedQuantity": round(gpu_s / 3600, 6),
        "ConsumedUnit": "GPU-Hours",
        "ResourceId": parts[0]["ResourceId"] if parts else None,
        "ResourceType": "GPU training gang restart",
        "SkuId": "p5.48xlarge",
        "Tags": {"tenant": tenant, "queue": "research", "purchase_option": "spot"},
        "x_RestartOverheadSeconds": 270.0,
        "x_RestartOverheadGpuSeconds": gpu_s,
        "x_RestartOverheadSource": source,
        "x_RestartedAt": z(restarted),
        "x_WasteEventId": f"rw-of-{event}",
        "x_GangId": f"jobset:{tenant}/{event}",
        "x_GangSize": 8,
        "x_GpuCount": 8,
        "x_NoticeId": f"notice-of-{event}",
        "x_NoticeReceivedAt": z(received),
        "x_K8sClusterName": "test",
        "x_K8sNamespaceName": tenant,
        "x_RestartOverheadByInstance": parts,
    }


def overhead_rows() -> list[dict[str, Any]]:
    """ro-1 (team-a, two instances) and ro-2 (team-c, a GCE part naming only the instance)."""
    return [
        overhead(
            "ro-1",
            "team-a",
            [
                overhead_part("i-spot", "n-spot", "spot", 5400),
                overhead_part("i-od", "n-od", "on_demand", 1800),
            ],
        ),
        overhead(
            "ro-2",
            "team-c",
            [overhead_part("gpu-1", "g-a", "spot", 3600, "a3-highgpu-8g")],
            source="sdk-first-step",
        ),
    ]


@pytest.fixture
def bill(tmp_path: Path) -> dict[str, Path]:
    return {
        "ledger": write_jsonl(tmp_path / "ledger.jsonl", ledger_rows() + overhead_rows()),
        "focus": write_csv(tmp_path / "focus.csv", bill_rows()),
    }


def test_overhead_is_priced_on_each_instance_at_the_restart_hour(bill: dict[str, Path]) -> None:
    g = report(bill)
    a, c = g["team-a"], g["team-c"]
    # ro-1: 1.5 GPU-h x $5 + 0.5 GPU-h x $10 = $12.50 on 2 GPU-h
    assert (a["restart_overhead_gpu_hours"], round(a["restart_overhead_cost"], 2)) == (2, 12.50)
    # ro-2: the part names 'gpu-1'; node g-a's meter row says proj-a/gpu-1: 1 x $4 (not $10)
    assert (c["restart_overhead_gpu_hours"], round(c["restart_overhead_cost"], 2)) == (1, 4.00)
    for key in ("team-b", "unattributed", "reserved-idle"):
        assert g[key]["restart_overhead_cost"] == 0, key


def test_overhead_is_not_added_to_effective_cost(bill: dict[str, Path], tmp_path: Path) -> None:
    with_overhead = report(bill)
    without = report({**bill, "ledger": write_jsonl(tmp_path / "no-overhead.jsonl", ledger_rows())})
    # team-a $100 and team-c $108, as test_report_bill has them: the overhead is part of the
    # $80 and $92 allocated already
    assert cents(with_overhead["team-a"], "allocated_cost", "effective_cost") == (80.00, 100.00)
    assert cents(with_overhead["team-c"], "allocated_cost", "effective_cost") == (92.00, 108.00)
    # but the spot saving: overhead on spot costs it its on-demand price (docs/ledger.md, "Does
    # spot pay?"). team-a: ro-1's 1.5 GPU-h on i-spot x on-demand p5 $10 = $15, $30 - $15;
    # team-c: ro-2's 1 GPU-h on proj-a's spot gpu-1 x on-demand a3 $10 = $10, $32 - $10. The
    # on-demand replacement part (i-od) is no spot overhead.
    spot = ("spot_overhead_gpu_hours", "spot_overhead_cost", "spot_net_savings")
    assert cents(with_overhead["team-a"], *spot) == (1.5, 15.00, 15.00)
    assert cents(with_overhead["team-c"], *spot) == (1.0, 10.00, 22.00)
    assert cents(without["team-a"], *spot) == (0, 0, 30.00)
    assert cents(without["team-c"], *spot) == (0, 0, 32.00)
    for grp in without:
        for column in (*OVERHEAD_COLUMNS, *spot):
            if column != "spot_net_savings":
                assert without[grp][column] == 0
            with_overhead[grp][column] = without[grp][column] = 0
    # nothing else moves: not the shares, the waste, the notices, the unpriced
    assert with_overhead == without


def test_overhead_falls_back_to_the_instances_average_then_the_rates_file(
    bill: dict[str, Path], tmp_path: Path
) -> None:
    # ro-3, team-b, restarted at 13:20: i-od has no bill row at 13:00, so its average rate
    # over the window ($10) prices 1 GPU-h; i-new has no bill row at all and no meter row:
    # the rates file's p5.48xlarge spot $3.50 prices its 2 GPU-h. 1 x 10 + 2 x 3.50 = $17.
    ro3 = overhead(
        "ro-3",
        "team-b",
        [
            overhead_part("i-od", "n-od", "on_demand", 3600),
            overhead_part("i-new", "n-new", "spot", 7200),
        ],
        restarted=H12 + timedelta(hours=1, minutes=20),
    )
    ledger = write_jsonl(tmp_path / "ro3.jsonl", [*ledger_rows(), ro3])
    rates = tmp_path / "rates.csv"
    rates.write_text("sku,purchase_option,usd_per_gpu_hour\np5.48xlarge,spot,3.50\n")
    b = by_key(build([str(ledger)], by="tenant", focus=bill["focus"], rates=rates,
                     window=BOTH_HOURS))["team-b"]  # fmt: skip
    assert (b["restart_overhead_gpu_hours"], round(b["restart_overhead_cost"], 2)) == (3, 17.00)
    assert cents(b, "allocated_cost", "effective_cost") == (64.00, 64.00)
    # without the rates file i-new's 2 GPU-h have no price: left out of the overhead's cost,
    # and not in unpriced_gpu_hours (overhead hours are the allocation's; not counted twice)
    b = report({**bill, "ledger": ledger})["team-b"]
    assert (b["restart_overhead_gpu_hours"], round(b["restart_overhead_cost"], 2)) == (3, 10.00)
    assert b["unpriced_gpu_hours"] == 0


def by_key(groups: list[engine.Group]) -> dict[str, dict[str, Any]]:
    return {g.key: g.figures for g in groups}


def test_a_part_without_an_instance_takes_it_from_the_meter(
    bill: dict[str, Path], tmp_path: Path
) -> None:
    ro = overhead("ro-9", "team-a", [overhead_part(None, "n-spot", "spot", 3600)])
    ledger = write_jsonl(tmp_path / "ro9.jsonl", [*ledger_rows(), ro])
    a = report({**bill, "ledger": ledger})["team-a"]
    assert (a["restart_overhead_gpu_hours"], round(a["restart_overhead_cost"], 2)) == (1, 5.00)


def test_by_purchase_option_each_part_is_in_its_own_options_group(
    bill: dict[str, Path],
) -> None:
    # ro-1's gang is tagged spot, but its i-od part is on-demand: spot i-spot $7.50 + gpu-1
    # $4 = $11.50 on 2.5 GPU-h; on-demand i-od $5 on 0.5 GPU-h
    g = report(bill, by="purchase_option")
    spot, od = g["spot"], g["on_demand"]
    assert (spot["restart_overhead_gpu_hours"], round(spot["restart_overhead_cost"], 2)) == (
        2.5,
        11.50,
    )
    assert (od["restart_overhead_gpu_hours"], round(od["restart_overhead_cost"], 2)) == (0.5, 5.00)


def test_a_replayed_overhead_event_is_counted_once(bill: dict[str, Path], tmp_path: Path) -> None:
    # the same EventId twice (a replay), once with other figures: the first copy counts
    replay = overhead_rows()[0]
    bigger = [overhead_part("i-od", "n-od", "on_demand", 36000)]
    changed = {**replay, "x_RestartOverheadByInstance": bigger}
    events = ledger_rows() + overhead_rows() + [replay, changed]
    twice = report({**bill, "ledger": write_jsonl(tmp_path / "twice.jsonl", events)})
    assert twice == report(bill)
    assert round(twice["team-a"]["restart_overhead_cost"], 2) == 12.50


def test_overhead_outside_the_window_is_left_out(bill: dict[str, Path]) -> None:
    # restarted at 12:45: outside [12:00, 12:30), the 12:00 allocation hour is not
    window = Window(since=datetime(2026, 3, 1, 12), until=datetime(2026, 3, 1, 12, 30))
    g = report(bill, window=window)
    assert g["team-a"]["restart_overhead_gpu_hours"] == 0
    assert g["team-a"]["allocated_gpu_hours"] == 12


def test_the_ledgers_span_covers_an_overhead_event(bill: dict[str, Path], tmp_path: Path) -> None:
    # without a window, the report covers the ledger's hours: a restart at 13:20 adds 13:00
    late = overhead("ro-late", "team-a", [overhead_part("i-spot", "n-spot", "spot", 3600)],
                    restarted=H12 + timedelta(hours=1, minutes=20))  # fmt: skip
    lp = write_jsonl(tmp_path / "late.jsonl", [*ledger_rows(), late])
    rep = cli_json(["--ledger", str(lp), "--focus", str(bill["focus"])])
    assert rep["window"]["until"] == "2026-03-01T14:00:00Z"
    a = next(g for g in rep["groups"] if g["tenant"] == "team-a")
    # i-spot has no 13:00 row: its average over the window, $5
    assert (a["restart_overhead_gpu_hours"], a["restart_overhead_cost"]) == (1.0, 5.00)


def cli_json(args: list[str]) -> dict[str, Any]:
    out = Path(args[1]).with_suffix(".out.json")
    assert cli.main(["report", *args, "--format", "json", "-o", str(out)]) == 0
    doc: dict[str, Any] = json.loads(out.read_text())
    return doc


# --- the columns in every format -------------------------------------------------------------


def test_the_columns_sit_after_restart_waste_in_every_format(bill: dict[str, Path]) -> None:
    cols = list(engine.COLUMNS)
    at = cols.index("restart_waste_cost")
    assert cols[at + 1 : at + 3] == list(OVERHEAD_COLUMNS)
    groups = build([str(bill["ledger"])], by="tenant", focus=bill["focus"], rates=None,
                   window=BOTH_HOURS)  # fmt: skip
    doc = json.loads(render.as_json(groups, BOTH_HOURS, "tenant"))
    a = next(g for g in doc["groups"] if g["tenant"] == "team-a")
    assert list(a)[list(a).index("restart_waste_cost") + 1 :][:2] == list(OVERHEAD_COLUMNS)
    assert (a["restart_overhead_cost"], doc["total"]["restart_overhead_cost"]) == (12.50, 16.50)
    head = render.as_csv(groups, "tenant").splitlines()[0].split(",")
    assert head[head.index("restart_waste_cost") + 1 :][:2] == list(OVERHEAD_COLUMNS)
    table = render.as_table(groups, "tenant").splitlines()
    assert "waste $  overhead GPU-h  overhead $" in table[0]
    team_a = next(line.split() for line in table if line.startswith("team-a"))
    # waste GPU-h 3, waste $20, overhead GPU-h 2, overhead $12.50, waste % 25, effective $100
    assert team_a[8:14] == ["3.00", "20.00", "2.00", "12.50", "25.00%", "100.00"]
    page = render.as_html(groups, BOTH_HOURS, "tenant")
    assert "<th>overhead $</th>" in page and "<td>12.50</td>" in page
    assert "$100.00</text>" in page  # team-a's bar: the effective cost, no overhead on it


def test_landed_tables_give_the_same_overhead(bill: dict[str, Path], tmp_path: Path) -> None:
    # What the Trino test runs, in DuckDB alone: the ledger landed as Parquet, overhead too
    ledger = ledger_input.read([str(bill["ledger"])], None, LabelPolicy())
    alloc, waste = tmp_path / "alloc" / "a.parquet", tmp_path / "waste" / "w.parquet"
    over = tmp_path / "overhead" / "o.parquet"
    engine.land_ledger(ledger, "tenant", alloc, waste, over)
    got = by_key(
        engine.report_landed(alloc, waste, bill["focus"], overhead=over, window=BOTH_HOURS)
    )
    want = report(bill)
    for key in want:
        for column in (*OVERHEAD_COLUMNS, "effective_cost"):
            assert round(got[key][column], 6) == want[key][column], (key, column)
    # a ledger landed without the overhead table: an empty relation, the rest as it was
    bare = by_key(engine.report_landed(alloc, waste, bill["focus"], window=BOTH_HOURS))
    assert bare["team-a"]["restart_overhead_cost"] == 0
    assert bare["team-a"]["effective_cost"] == got["team-a"]["effective_cost"]


# --- bad input: one line naming the file and line, exit 2 -------------------------------


def _drop(key: str) -> Any:
    def edit(ev: dict[str, Any]) -> None:
        del ev[key]

    return edit


def _set(key: str, value: Any) -> Any:
    def edit(ev: dict[str, Any]) -> None:
        ev[key] = value

    return edit


def _part_seconds(value: float) -> Any:
    def edit(ev: dict[str, Any]) -> None:
        ev["x_RestartOverheadByInstance"][1]["x_RestartOverheadGpuSeconds"] = value

    return edit


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (_part_seconds(-60), "part 1: x_RestartOverheadGpuSeconds is -60, a quantity cannot"),
        (_part_seconds(float("nan")), "part 1: x_RestartOverheadGpuSeconds is nan, not a finite"),
        (_set("x_RestartOverheadGpuSeconds", float("inf")), "x_RestartOverheadGpuSeconds is inf"),
        (
            _set("x_RestartOverheadSource", "guess"),
            "x_RestartOverheadSource 'guess' is not one of sdk-first-step, pods-ready",
        ),
        (_drop("x_RestartOverheadSource"), "x_RestartOverheadSource is missing"),
        (_drop("x_RestartOverheadByInstance"), "x_RestartOverheadByInstance is missing or not a"),
        (
            _set("x_RestartOverheadByInstance", []),
            "x_RestartOverheadByInstance is empty, but x_RestartOverheadGpuSeconds is 7200",
        ),
        (_set("x_RestartOverheadByInstance", ["i-spot"]), "x_RestartOverheadByInstance[0] is not"),
        (_drop("x_RestartedAt"), "x_RestartedAt is missing or not a string"),
        (_set("x_RestartedAt", "soon"), "x_RestartedAt: "),
        (_drop("EventId"), "EventId is missing"),
    ],
)
def test_bad_overhead_events_are_refused_with_their_line(
    bill: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    edit: Any,
    message: str,
) -> None:
    events = ledger_rows() + overhead_rows()
    edit(events[9])  # ro-1, line 10 of the file
    lp = write_jsonl(tmp_path / "bad.jsonl", events)
    rc, err = run(["--ledger", str(lp), "--focus", str(bill["focus"])], capsys)
    assert rc == 2 and f"{lp}:10: {message}" in err, err
