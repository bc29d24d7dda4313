"""report.sql in Trino (Athena's engine) gives DuckDB's figures, over the same Parquet files.

Trino is started on 127.0.0.1 by ``deploy/local/trino.sh`` (trino-server from Maven Central,
cached under ~/.cache/reclaimd; about 30 s to start). The SQL is the one file the report runs;
the ``focus`` view comes from ``focus.focus_view`` for both engines. The hand-built bill's
figures are compared as the report shows them (money to the cent); the generated fleet's
unrounded, to a hundredth of a cent (its sums can fall on half a cent, and the engines add
in another order).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from test_report_bill import bill_rows, ledger_rows, write_csv, write_jsonl
from test_report_google import TWO_HOURS, google_ledger, google_rows, write_bill
from test_report_overhead import overhead_rows
from test_report_spotpays import EVAL, FINETUNE, PRETRAIN, TOTAL, row
from test_report_spotpays import bill_rows as spot_bill_rows
from test_report_spotpays import ledger_rows as spot_ledger_rows

from chaos import bench_report as report_bench
from reclaimd.ledger.labels import LabelPolicy
from reclaimd.report import Group, Window, engine, ledger_input, spotpays, trino
from reclaimd.report.render import _round


@pytest.fixture(scope="module")
def trino_url() -> Iterator[str]:
    was_up = trino.is_up()
    url = trino.start()
    yield url
    if not was_up:
        trino.stop()


def shown(groups: list[Group]) -> dict[str, dict[str, float | int | None]]:
    return {g.key: {k: _round(k, v) for k, v in g.figures.items()} for g in groups}


def landed(
    tmp_path: Path,
    events: list[dict[str, Any]] | None = None,
    bill: list[dict[str, Any]] | None = None,
    by: str = "tenant",
) -> tuple[Path, Path, Path, Path]:
    """test_report_bill's ledger with test_report_overhead's restart overhead, landed (or the
    events and bill given, grouped ``by``)."""
    events = ledger_rows() + overhead_rows() if events is None else events
    ledger = ledger_input.read([str(write_jsonl(tmp_path / "l.jsonl", events))], None,
                               LabelPolicy())  # fmt: skip
    alloc, waste = tmp_path / "alloc" / "a.parquet", tmp_path / "waste" / "w.parquet"
    overhead = tmp_path / "overhead" / "o.parquet"  # a directory each: one external table
    engine.land_ledger(ledger, by, alloc, waste, overhead)
    csv = write_csv(tmp_path / "focus.csv", bill_rows() if bill is None else bill)
    focus = tmp_path / "focus" / "f.parquet"
    focus.parent.mkdir()
    con = engine.connect()
    con.execute(
        "COPY (SELECT * REPLACE (CAST(CAST(ChargePeriodStart AS TIMESTAMPTZ) AS TIMESTAMP)"
        " AS ChargePeriodStart, TRY_CAST(EffectiveCost AS DOUBLE) AS EffectiveCost,"
        " TRY_CAST(ListCost AS DOUBLE) AS ListCost,"
        " TRY_CAST(ConsumedQuantity AS DOUBLE) AS ConsumedQuantity)"
        f" FROM read_csv('{csv}', all_varchar = true)) TO '{focus}' (FORMAT parquet)"
    )
    con.close()
    return alloc, waste, overhead, focus


def test_the_hand_built_bill_gives_the_same_figures_in_trino_and_duckdb(
    trino_url: str, tmp_path: Path
) -> None:
    alloc, waste, overhead, focus = landed(tmp_path)
    duck = shown(engine.report_landed(alloc, waste, focus, overhead=overhead))
    # the landed tables give what the JSON-lines ledger gives (test_report_bill's and
    # test_report_overhead's figures)
    assert duck["reserved-idle"]["reserved_idle_cost"] == 72.00
    assert duck["team-c"]["restart_waste_cost"] == 16.00
    assert (duck["team-a"]["restart_overhead_cost"], duck["team-c"]["restart_overhead_cost"]) == (
        12.50,
        4.00,
    )
    assert duck["team-a"]["effective_cost"] == 100.00  # overhead not added
    groups, idle = trino.run_report(
        trino_url, alloc=alloc, waste=waste, overhead=overhead, focus=focus, detail=True
    )
    assert shown(groups) == duck
    # idle.sql after report.sql's relations, in Trino: i-rsv's 12:00 (4 x $6) and 13:00 (8 x $6)
    assert [(i.group, i.hour, i.instance, i.gpu_hours, round(i.cost, 2)) for i in idle] == [
        ("reserved-idle", datetime(2026, 3, 1, 12), "i-rsv", 4.0, 24.00),
        ("reserved-idle", datetime(2026, 3, 1, 13), "i-rsv", 8.0, 48.00),
    ]


def test_a_generated_fleet_gives_the_same_figures_in_trino_and_duckdb(
    trino_url: str, tmp_path: Path
) -> None:
    # 40 nodes for two days: ~10,000 bill rows of every kind, 300 restart-waste events
    files = report_bench.generate(tmp_path, nodes=40, hours=48, events=300)
    window = Window(since=files.start, until=files.end)
    duck = engine.report_landed(files.alloc, files.waste, files.focus, window=window)
    figures = {g.key: g.figures for g in duck}
    # team-0..7, unattributed, reserved-idle; no unallocated: every on-demand and spot
    # instance-hour of the fleet is fully held
    assert len(figures) == 10
    assert figures["reserved-idle"]["reserved_idle_cost"]
    got, _ = trino.run_report(
        trino_url, alloc=files.alloc, waste=files.waste, focus=files.focus, window=window
    )
    # unrounded, to a hundredth of a cent: the engines sum the same doubles in another order
    assert report_bench.differences({g.key: g.figures for g in got}, figures) == {}


def test_googles_focus_export_gives_the_same_figures_in_trino_and_duckdb(
    trino_url: str, tmp_path: Path
) -> None:
    # test_report_google's bill, as BigQuery exports the table (DECIMAL, UTC timestamps, the
    # nested x_Credits and x_Project), read where it lies
    ledger = ledger_input.read([str(write_jsonl(tmp_path / "l.jsonl", google_ledger()))], None,
                               LabelPolicy())  # fmt: skip
    alloc, waste = tmp_path / "alloc" / "a.parquet", tmp_path / "waste" / "w.parquet"
    engine.land_ledger(ledger, "tenant", alloc, waste)
    focus = tmp_path / "focus" / "f.parquet"
    focus.parent.mkdir()
    write_bill(focus, google_rows())
    duck = shown(engine.report_landed(alloc, waste, focus, window=TWO_HOURS))
    # test_report_google's figures
    assert (duck["team-a"]["allocated_cost"], duck["team-a"]["spot_net_savings"]) == (36.00, 78.00)
    assert (duck["team-b"]["allocated_cost"], duck["unallocated"]["unallocated_cost"]) == (
        60.00,
        20.00,
    )
    groups, _ = trino.run_report(trino_url, alloc=alloc, waste=waste, focus=focus,
                                 window=TWO_HOURS)  # fmt: skip
    assert shown(groups) == duck


def test_does_spot_pay_gives_the_hand_figures_in_trino_and_duckdb(
    trino_url: str, tmp_path: Path
) -> None:
    # test_report_spotpays's bill and ledger by queue: pretrain saved $30, eval lost $3
    alloc, waste, overhead, focus = landed(tmp_path, spot_ledger_rows(), spot_bill_rows(), "queue")
    duck = engine.report_landed(alloc, waste, focus, overhead=overhead, by="queue")
    got, _ = trino.run_report(
        trino_url, alloc=alloc, waste=waste, overhead=overhead, focus=focus, by="queue"
    )
    want = {
        "groups": [
            row("eval", "queue", EVAL, (0.125, round(1.5 / 36, 6)), False),
            row("finetune", "queue", FINETUNE, (0.0, round(4 / 36, 6)), True),
            row("pretrain", "queue", PRETRAIN, (0.25, 1.1875), True),
        ],
        "total": row("TOTAL", "queue", TOTAL, (0.15625, 0.54375), True),
    }
    assert spotpays.as_json(duck, "queue") == want
    assert spotpays.as_json(got, "queue") == want
