"""``make bench-report``: a month of a 2,000-node GPU fleet, reported in DuckDB and in Trino.

Generates (DuckDB SQL, deterministic) a FOCUS bill in Parquet (~6.8 M rows: AWS p5 instances
on spot, on-demand and reserved, each hour with its compute row, data transfer, EBS and tax;
GCE a3 instances in three projects, one name per project, each hour with GPU, core and RAM
SKUs, egress and disk; other accounts' instances), the allocation meter's rows landed as a
table (1 to 3 tenants per instance-hour, reserved instances a quarter idle, some pods
unlabelled) and 100,000 restart-waste events (one or two parts). Then, each in a child
process of its own so that its peak RSS is its own:

* DuckDB's raw scan of the same files: every column the report reads, aggregated (the
  limit: no report over these files can read them faster);
* the report (``engine.report_landed``): wall time and peak RSS;
* the same report.sql in Trino (``deploy/local/trino.sh``, on 127.0.0.1) over the same
  files: wall time, and whether every figure equals DuckDB's (money to the cent).

Prints a table and writes ``out/bench-report.json``. ``--nodes 200 --hours 72 --events
5000`` for a quick run; ``--no-trino`` for DuckDB alone.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Final

from reclaimd.report import engine, focus, sqltext

START = datetime(2026, 3, 1)


@dataclass(frozen=True)
class Files:
    focus: Path
    alloc: Path
    waste: Path
    start: datetime
    end: datetime


def generate(root: Path, *, nodes: int, hours: int, events: int) -> Files:
    """The fleet's month (or less) as three Parquet files under ``root``, one per directory."""
    dirs = {k: root / k for k in ("focus", "alloc", "waste")}
    for d in dirs.values():
        d.mkdir(parents=True, exist_ok=True)
    files = Files(
        focus=dirs["focus"] / "focus.parquet",
        alloc=dirs["alloc"] / "alloc.parquet",
        waste=dirs["waste"] / "waste.parquet",
        start=START,
        end=START + timedelta(hours=hours),
    )
    con = engine.connect()
    try:
        con.execute("SET threads = 2")
        con.execute(_NODES.format(nodes=nodes))
        con.execute(f"CREATE TABLE hours AS SELECT range AS h FROM range({hours})")
        con.execute(_INSTANCE_HOURS.format(start=START.isoformat(sep=" ")))
        con.execute(f"COPY ({_FOCUS}) TO {sqltext.quote(files.focus)} (FORMAT parquet)")
        con.execute(f"COPY ({_ALLOC}) TO {sqltext.quote(files.alloc)} (FORMAT parquet)")
        waste = _WASTE.format(
            events=events, nodes=nodes, hours=hours, start=START.isoformat(sep=" ")
        )
        con.execute(f"COPY ({waste}) TO {sqltext.quote(files.waste)} (FORMAT parquet)")
    finally:
        con.close()
    return files


# Even nodes are AWS p5.48xlarge (spot 3/5, on-demand 1/5, reserved 1/5), odd nodes GCE
# a3-highgpu-8g in proj-0..2, named gpu-<i // 6> (the same name in each project; spot 3/5).
_NODES = """
CREATE TABLE nodes AS
SELECT
  i,
  'node-' || i AS node,
  i % 2 = 1 AS gce,
  CASE WHEN i % 2 = 1 THEN 'proj-' || (i % 3) END AS project,
  CASE WHEN i % 2 = 1 THEN 'gpu-' || (i // 6) ELSE printf('i-%08x', i) END AS name,
  CASE WHEN i % 2 = 1 THEN 'a3-highgpu-8g' ELSE 'p5.48xlarge' END AS sku,
  CASE
    WHEN i % 10 IN (0, 1, 2, 3, 5) THEN 'spot'
    WHEN i % 10 = 8 THEN 'reserved'
    ELSE 'on_demand'
  END AS purchase_option
FROM range({nodes}) t(i)
"""

_INSTANCE_HOURS = """
CREATE TABLE ih AS
SELECT
  n.*,
  h.h,
  TIMESTAMP '{start}' + to_hours(h.h) AS hour_start,
  CASE WHEN n.gce THEN n.project || '/' || n.name ELSE n.name END AS resource_id,
  (CASE n.purchase_option WHEN 'spot' THEN 4.00 WHEN 'reserved' THEN 7.50 ELSE 12.29 END)
    * (CASE WHEN n.gce THEN 0.9 ELSE 1.0 END)
    * (1 + (hash(n.i, h.h) % 100) / 1000.0) AS rate,
  CASE n.purchase_option WHEN 'spot' THEN 'Dynamic' WHEN 'reserved' THEN 'Committed'
    ELSE 'Standard' END AS pricing_category,
  hash(h.h, n.i) % 1000 AS r
FROM nodes n CROSS JOIN hours h
"""

_FOCUS = """
WITH rows AS (
  -- AWS: the instance-hour, data transfer and EBS on its id, tax
  SELECT ih.*, k.k FROM ih, range(4) k(k) WHERE NOT ih.gce
  UNION ALL
  -- GCE: GPU, core and RAM SKUs, egress, persistent disk
  SELECT ih.*, 10 + k.k FROM ih, range(5) k(k) WHERE ih.gce
  UNION ALL
  -- another account's instances (not the cluster's): compute rows only
  SELECT ih.* REPLACE (printf('i-x%07x', ih.i) AS name), 20 FROM ih WHERE ih.i % 10 = 4
)
SELECT
  CASE WHEN gce THEN 'Google Cloud' ELSE 'AWS' END AS ProviderName,
  CASE WHEN gce THEN project WHEN k = 20 THEN '999988887777' ELSE '111122223333' END
    AS SubAccountId,
  CASE WHEN gce THEN 'Compute Engine' WHEN k = 1 THEN 'AWS Data Transfer'
    ELSE 'Amazon Elastic Compute Cloud' END AS ServiceName,
  CASE WHEN k IN (1, 13) THEN 'Networking' WHEN k IN (2, 14) THEN 'Storage' ELSE 'Compute' END
    AS ServiceCategory,
  hour_start AS ChargePeriodStart,
  hour_start + INTERVAL 1 HOUR AS ChargePeriodEnd,
  CASE WHEN k = 3 THEN 'Tax' ELSE 'Usage' END AS ChargeCategory,
  CASE WHEN gce
    THEN '//compute.googleapis.com/projects/' || project || '/zones/us-central1-a/instances/'
      || name
    ELSE 'arn:aws:ec2:us-east-2:111122223333:instance/' || name END AS ResourceId,
  CASE WHEN gce THEN 'SKU-' || k ELSE sku END AS SkuId,
  CASE k WHEN 10 THEN 'Nvidia H100 80GB GPU' WHEN 11 THEN 'A3 Instance Core'
    WHEN 12 THEN 'A3 Instance Ram' WHEN 13 THEN 'Network Internet Egress'
    WHEN 14 THEN 'Balanced PD Capacity' END AS SkuMeter,
  CASE WHEN k IN (1, 13) THEN 'Standard' ELSE pricing_category END AS PricingCategory,
  CASE k WHEN 0 THEN 1.0 WHEN 20 THEN 1.0 WHEN 1 THEN CAST(r AS DOUBLE) WHEN 2 THEN 0.5
    WHEN 10 THEN 28800.0 WHEN 11 THEN 748800.0 WHEN 12 THEN 1872.0
    WHEN 13 THEN CAST(r % 100 AS DOUBLE) WHEN 14 THEN 2.0 END AS ConsumedQuantity,
  CASE WHEN k IN (0, 20) THEN 'Hrs' WHEN k = 1 THEN 'GB' WHEN k = 2 THEN 'GB-Mo'
    WHEN k IN (10, 11) THEN 'seconds' WHEN k = 12 THEN 'gibibyte hour'
    WHEN k = 13 THEN 'gibibyte' WHEN k = 14 THEN 'gibibyte month' END AS ConsumedUnit,
  CAST(CASE k WHEN 0 THEN rate * 8 WHEN 20 THEN rate * 8 WHEN 1 THEN r * 0.09 WHEN 2 THEN 0.11
    WHEN 3 THEN rate * 8 * 0.05 WHEN 10 THEN rate * 8 * 0.75 WHEN 11 THEN rate * 8 * 0.2
    WHEN 12 THEN rate * 8 * 0.05 WHEN 13 THEN (r % 100) * 0.12 WHEN 14 THEN 0.2 END AS DOUBLE)
    AS EffectiveCost,
  CAST(CASE WHEN k IN (0, 20) THEN 98.32 WHEN k BETWEEN 10 AND 12 THEN 88.48 * (CASE k WHEN 10
    THEN 0.75 WHEN 11 THEN 0.2 ELSE 0.05 END) ELSE NULL END AS DOUBLE) AS ListCost,
  'USD' AS BillingCurrency
FROM rows
"""

# 1 to 3 tenants per instance-hour share its 8 GPUs; reserved instances hold 6 of 8; a pod
# in 17 is unlabelled.
_ALLOC = """
SELECT
  hour_start,
  resource_id,
  node,
  sku,
  purchase_option,
  CASE WHEN (i + h + j) % 17 = 0 THEN 'unattributed' ELSE 'team-' || ((i + j) % 8) END AS grp,
  CAST(CASE
    WHEN tenants = 1 THEN 8
    WHEN tenants = 2 THEN 4
    WHEN j < 2 THEN 3 ELSE 2
  END * (CASE WHEN purchase_option = 'reserved' THEN 0.75 ELSE 1 END) AS DOUBLE) AS gpu_hours,
  CAST(0 AS DOUBLE) AS mig_gpu_hours,
  CAST(0 AS DOUBLE) AS mig_profile_hours,
  CAST(CASE WHEN tenants = 1 THEN 8 WHEN tenants = 2 THEN 4 WHEN j < 2 THEN 3 ELSE 2 END
    * (CASE WHEN purchase_option = 'reserved' THEN 0.75 ELSE 1 END) * 80 AS DOUBLE)
    AS hbm_gb_hours,
  8 AS node_gpus
FROM (SELECT ih.*, 1 + r % 3 AS tenants FROM ih) x, range(3) t(j)
WHERE j < tenants
"""

# Each event: a gang on node e's node, one or two parts (the second on a node two further
# on, of the same cloud); parts name the instance as the ledger does (GCE: without project).
_WASTE = """
SELECT
  'rw-' || e AS event_id,
  'n-' || (e // 3) AS notice_id,
  'g-' || e AS gang_id,
  TIMESTAMP '{start}' + to_hours(CAST(hash(e, 7) % {hours} AS BIGINT)) AS hour_start,
  n.name AS resource_id,
  n.node,
  n.sku,
  n.purchase_option,
  'team-' || (e % 8) AS grp,
  CAST((1 + e % 8) * 600 AS DOUBLE) AS gpu_seconds,
  CASE e % 5 WHEN 0 THEN 'checkpointed' WHEN 1 THEN 'partial' WHEN 2 THEN 'no_ack'
    WHEN 3 THEN 'not_durable' ELSE 'not_opted_in' END AS outcome,
  e % 23 <> 0 AS deadline_met
FROM range({events}) ev(e), range(2) p(p), nodes n
WHERE (p = 0 OR e % 2 = 0) AND n.i = (hash(e) % {nodes} + 2 * p) % {nodes}
"""


# --- measurements, each in a child process ------------------------------------------------


def _raw_scan(files: Files) -> dict[str, Any]:
    """Every column report.sql reads from the three files, aggregated in one pass each."""
    con = engine.connect()
    q = sqltext.quote
    focus_cols = ["ChargePeriodStart", "ResourceId", "SubAccountId", *focus.FOCUS_TEXT]
    aggs = ", ".join(f'max("{c}")' for c in focus_cols)
    nums = ", ".join(f'sum("{c}")' for c in focus.FOCUS_NUMERIC)
    out = {
        "focus": con.execute(
            f"SELECT count(*), {aggs}, {nums} FROM read_parquet({q(files.focus)})"
        ).fetchone(),
        "alloc": con.execute(
            f"SELECT count(*), max(hour_start), max(resource_id), max(node), max(sku),"
            f" max(purchase_option), max(grp), sum(gpu_hours), sum(mig_gpu_hours),"
            f" sum(mig_profile_hours), sum(hbm_gb_hours), max(node_gpus)"
            f" FROM read_parquet({q(files.alloc)})"
        ).fetchone(),
        "waste": con.execute(
            "SELECT count(*), max(event_id), max(notice_id), max(gang_id), max(hour_start),"
            " max(resource_id), max(node), max(sku), max(purchase_option), max(grp),"
            " sum(gpu_seconds), max(outcome), bool_and(deadline_met)"
            f" FROM read_parquet({q(files.waste)})"
        ).fetchone(),
    }
    return {k: int(v[0]) for k, v in out.items() if v is not None}


def child(argv: list[str]) -> int:
    """``python -m chaos.bench_report --child WHAT ROOT``: one measurement, as JSON."""
    what, root = argv[0], Path(argv[1])
    t0 = time.perf_counter()
    result: dict[str, Any] = {}
    if what == "generate":
        n, h, e = (int(x) for x in argv[2:5])
        made = generate(root, nodes=n, hours=h, events=e)
        (root / "meta.json").write_text(
            json.dumps({"start": made.start.isoformat(), "end": made.end.isoformat(),
                        "params": [n, h, e]})
        )  # fmt: skip
        print(json.dumps({"wall_s": round(time.perf_counter() - t0, 3)}))
        return 0
    files = _files(root)
    if what == "scan":
        result = {"rows": _raw_scan(files)}
    elif what == "duckdb":
        window = engine.Window(files.start, files.end)
        groups = engine.report_landed(files.alloc, files.waste, files.focus, window=window)
        result = {"groups": _raw(groups)}
    elif what == "trino":
        from reclaimd.report import trino

        window = engine.Window(files.start, files.end)
        was_up = trino.is_up()
        try:
            groups, _ = trino.run_report(
                trino.start(), alloc=files.alloc, waste=files.waste, focus=files.focus,
                window=window,
            )  # fmt: skip
        finally:
            if not was_up:
                trino.stop()  # leave the machine as the bench found it
        result = {"groups": _raw(groups)}
    else:
        raise SystemExit(f"unknown measurement {what}")
    result["wall_s"] = round(time.perf_counter() - t0, 3)
    result["peak_rss_mb"] = peak_rss_mb()
    print(json.dumps(result))
    return 0


def peak_rss_mb() -> float:
    """This process's peak RSS since its exec (VmHWM: ``ru_maxrss`` would carry the parent's
    high-water mark over fork and exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return round(int(line.split()[1]) / 1024, 1)
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def _files(root: Path) -> Files:
    meta = json.loads((root / "meta.json").read_text())
    return Files(
        focus=root / "focus" / "focus.parquet",
        alloc=root / "alloc" / "alloc.parquet",
        waste=root / "waste" / "waste.parquet",
        start=datetime.fromisoformat(meta["start"]),
        end=datetime.fromisoformat(meta["end"]),
    )


def _raw(groups: list[engine.Group]) -> dict[str, dict[str, Any]]:
    return {g.key: dict(g.figures) for g in groups}


TOLERANCE: Final = 1e-4  # USD or hours: a hundredth of a cent; sums in another order


def differences(a: dict[str, dict[str, Any]], b: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Figures that differ between two engines' groups by more than ``TOLERANCE``."""
    out: dict[str, Any] = {}
    for g in sorted(a.keys() | b.keys()):
        fa, fb = a.get(g, {}), b.get(g, {})
        for k in sorted(fa.keys() | fb.keys()):
            x, y = fa.get(k), fb.get(k)
            same = x == y or (
                x is not None
                and y is not None
                and math.isclose(x, y, rel_tol=1e-12, abs_tol=TOLERANCE)
            )
            if not same:
                out[f"{g}.{k}"] = (x, y)
    return out


def _measure(what: str, root: Path, *extra: str) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "chaos.bench_report", "--child", what, str(root), *extra],
        check=True,
        capture_output=True,
        text=True,
    )
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] == "--child":
        return child(args[1:])
    p = argparse.ArgumentParser(prog="bench-report")
    p.add_argument("--nodes", type=int, default=2000)
    p.add_argument("--hours", type=int, default=30 * 24)
    p.add_argument("--events", type=int, default=100_000)
    p.add_argument("--root", type=Path, default=Path("out/bench-report"))
    p.add_argument("--out", type=Path, default=Path("out/bench-report.json"))
    p.add_argument("--no-trino", action="store_true")
    p.add_argument("--repeat", type=int, default=3, help="runs of the scan and of the report")
    a = p.parse_args(args)
    a.root.mkdir(parents=True, exist_ok=True)
    params = [a.nodes, a.hours, a.events]
    meta = a.root / "meta.json"
    gen_s = 0.0
    if not (meta.exists() and json.loads(meta.read_text()).get("params") == params):
        gen_s = _measure("generate", a.root, *(str(x) for x in params))["wall_s"]
    files = _files(a.root)
    load = [round(x, 2) for x in os.getloadavg()]
    # alternately, each in a fresh process; the best wall time of each (the machine is shared)
    scans, ducks = [], []
    for _ in range(a.repeat):
        scans.append(_measure("scan", a.root))
        ducks.append(_measure("duckdb", a.root))
    scan = min(scans, key=lambda m: m["wall_s"])
    duck = min(ducks, key=lambda m: m["wall_s"])
    duck["peak_rss_mb"] = max(m["peak_rss_mb"] for m in ducks)
    scan["peak_rss_mb"] = max(m["peak_rss_mb"] for m in scans)
    doc: dict[str, Any] = {
        "nodes": a.nodes,
        "hours": a.hours,
        "rows": scan["rows"],
        "parquet_mb": {
            k: round(getattr(files, k).stat().st_size / 2**20, 1)
            for k in ("focus", "alloc", "waste")
        },
        "generate_s": round(gen_s, 1),
        "raw_scan": {k: scan[k] for k in ("wall_s", "peak_rss_mb")},
        "duckdb_report": {k: duck[k] for k in ("wall_s", "peak_rss_mb")},
        "report_over_scan": round(duck["wall_s"] / scan["wall_s"], 2),
        "runs": {
            "raw_scan_wall_s": [m["wall_s"] for m in scans],
            "duckdb_report_wall_s": [m["wall_s"] for m in ducks],
            "load_average_before": load,
            "cpus": os.cpu_count(),
        },
        "groups": duck["groups"],
    }
    if not a.no_trino:
        tr = _measure("trino", a.root)
        diff = differences(duck["groups"], tr["groups"])
        doc["trino_report"] = {
            "wall_s": tr["wall_s"],
            "equal": not diff,
            "differences": dict(list(diff.items())[:10]),
        }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(_table(doc))
    ok = doc["report_over_scan"] <= 3 and doc["duckdb_report"]["peak_rss_mb"] < 2048
    ok = ok and doc.get("trino_report", {}).get("equal", True)
    return 0 if ok else 1


def _line(name: str, m: dict[str, Any]) -> str:
    return f"{name:28}{m['wall_s']:>10.2f}{m['peak_rss_mb']:>14.0f}"


def _table(doc: dict[str, Any]) -> str:
    rows = doc["rows"]
    lines = [
        f"fleet: {doc['nodes']} nodes x {doc['hours']} h; FOCUS {rows['focus']:,} rows"
        f" ({doc['parquet_mb']['focus']} MB), allocation {rows['alloc']:,}, waste parts"
        f" {rows['waste']:,}",
        f"{'':28}{'wall s':>10}{'peak RSS MB':>14}",
        _line("DuckDB raw scan (limit)", doc["raw_scan"]),
        _line("DuckDB report", doc["duckdb_report"]),
        f"report / raw scan: {doc['report_over_scan']:.2f}x (target <= 3x), RSS target < 2048 MB",
        f"(best of {len(doc['runs']['raw_scan_wall_s'])}; load average before"
        f" {doc['runs']['load_average_before']} on {doc['runs']['cpus']} CPUs)",
    ]
    if "trino_report" in doc:
        t = doc["trino_report"]
        lines.append(f"{'Trino report (same SQL)':28}{t['wall_s']:>10.2f}{'-':>14}")
        same = "yes" if t["equal"] else "NO " + str(t["differences"])
        lines.append(f"Trino's figures equal DuckDB's: {same}")
    total = {
        k: round(sum(float(g[k] or 0) for g in doc["groups"].values()), 2)
        for k in ("allocated_cost", "reserved_idle_cost", "restart_waste_cost", "effective_cost")
    }
    lines.append(f"totals: {total}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
