"""The join, in embedded DuckDB: the ledger's rows, the FOCUS bill, rates, SKUs -> groups.

The pricing logic is all in ``report.sql``, the file shipped for Athena and BigQuery; this
module only builds the five relations it reads (see the file's header) and checks the inputs
so that a bad one is a one-line ``InputError``, not a DuckDB traceback.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from importlib import resources
from pathlib import Path
from typing import Any, Final

import duckdb

from reclaimd import skus
from reclaimd.ledger import DEFAULT_ALLOW, PURCHASE_OPTIONS, normalize_purchase_option
from reclaimd.report.ledger_input import AllocationRow, InputError, Ledger, WastePart

FOCUS_REQUIRED: Final = (
    "ChargePeriodStart",
    "ResourceId",
    "SkuId",
    "PricingCategory",
    "EffectiveCost",
    "ConsumedQuantity",
)
FOCUS_OPTIONAL: Final = ("ListCost", "ChargeCategory")
FOCUS_NUMERIC: Final = ("EffectiveCost", "ConsumedQuantity", "ListCost")
RATES_COLUMNS: Final = ("sku", "purchase_option", "usd_per_gpu_hour")
NONE: Final = "-"  # the group of rows that lack the label

# The columns of report.sql's result, in order (the JSON keys of a group).
COLUMNS: Final = (
    "allocated_gpu_hours",
    "gpu_hours_spot",
    "gpu_hours_on_demand",
    "gpu_hours_reserved",
    "gpu_hours_capacity_block",
    "mig_profile_hours",
    "hbm_gb_hours",
    "allocated_cost",
    "cost_spot",
    "cost_on_demand",
    "cost_reserved",
    "cost_capacity_block",
    "restart_waste_gpu_hours",
    "restart_waste_cost",
    "notices",
    "gangs_hit",
    "checkpointed",
    "partial",
    "not_durable",
    "no_ack",
    "not_opted_in",
    "deadline_misses",
    "effective_cost",
    "waste_share",
    "spot_net_savings",
    "unpriced_gpu_hours",
)
COUNTS: Final = frozenset(
    {"notices", "gangs_hit", "checkpointed", "partial", "not_durable", "no_ack"}
    | {"not_opted_in", "deadline_misses"}
)


def sql_text() -> str:
    return resources.files("reclaimd.report").joinpath("report.sql").read_text()


@dataclass(frozen=True)
class Group:
    by: str
    key: str
    figures: dict[str, float | int | None]


@dataclass(frozen=True)
class Window:
    since: datetime | None = None  # naive UTC, inclusive
    until: datetime | None = None  # naive UTC, exclusive

    def holds(self, t: datetime) -> bool:
        return (self.since is None or t >= self.since) and (self.until is None or t < self.until)

    def describe(self) -> str:
        def fmt(t: datetime | None) -> str:
            return t.isoformat(timespec="seconds") + "Z" if t is not None else "..."

        return f"{fmt(self.since)} to {fmt(self.until)}"


def connect() -> duckdb.DuckDBPyConnection:
    con = duckdb.connect(":memory:")
    con.execute("SET TimeZone = 'UTC'")
    return con


def _hour(t: datetime) -> datetime:
    return t.replace(minute=0, second=0, microsecond=0)


def load_ledger(con: duckdb.DuckDBPyConnection, ledger: Ledger, by: str, window: Window) -> None:
    con.execute(
        "CREATE TABLE alloc (hour_start TIMESTAMP, resource_id VARCHAR, node VARCHAR,"
        " sku VARCHAR, purchase_option VARCHAR, grp VARCHAR, gpu_hours DOUBLE,"
        " mig_gpu_hours DOUBLE, mig_profile_hours DOUBLE, hbm_gb_hours DOUBLE, node_gpus INTEGER)"
    )
    con.execute(
        "CREATE TABLE waste (event_id VARCHAR, notice_id VARCHAR, gang_id VARCHAR,"
        " hour_start TIMESTAMP, resource_id VARCHAR, node VARCHAR, sku VARCHAR,"
        " purchase_option VARCHAR, grp VARCHAR, gpu_seconds DOUBLE, outcome VARCHAR,"
        " deadline_met BOOLEAN)"
    )
    alloc = [_alloc_tuple(a, by) for a in ledger.allocation if window.holds(a.hour_start)]
    waste = [_waste_tuple(w, by) for w in ledger.waste if window.holds(w.stopped_at)]
    if not alloc and not waste:
        raise InputError(f"no allocation or restart-waste rows from {window.describe()}")
    if alloc:
        con.executemany("INSERT INTO alloc VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", alloc)
    if waste:
        con.executemany("INSERT INTO waste VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", waste)


def _alloc_tuple(a: AllocationRow, by: str) -> tuple[Any, ...]:
    return (
        a.hour_start,
        a.resource_id,
        a.node,
        a.sku,
        a.purchase_option,
        a.labels.get(by, NONE),
        a.gpu_hours,
        a.mig_gpu_hours,
        a.mig_profile_hours,
        a.hbm_gb_hours,
        a.node_gpus,
    )


def _waste_tuple(w: WastePart, by: str) -> tuple[Any, ...]:
    # A part's own purchase option groups it when the report is by purchase option: a gang's
    # spot ranks and on-demand ranks land in their own groups.
    grp = (w.purchase_option or w.labels.get(by)) if by == "purchase_option" else w.labels.get(by)
    return (
        w.event_id,
        w.notice_id,
        w.gang_id,
        _hour(w.stopped_at),
        w.resource_id,
        w.node,
        w.sku,
        w.purchase_option,
        grp or NONE,
        w.gpu_seconds,
        w.outcome,
        w.deadline_met,
    )


def _columns(con: duckdb.DuckDBPyConnection, source: str) -> list[str]:
    rows = con.execute(f"DESCRIBE SELECT * FROM {source}").fetchall()
    return [str(r[0]) for r in rows]


def _reader(path: Path) -> str:
    name = path.name.lower()
    quoted = "'" + str(path).replace("'", "''") + "'"
    if name.endswith((".parquet", ".pq")):
        return f"read_parquet({quoted})"
    if name.endswith((".csv", ".csv.gz")):
        return f"read_csv({quoted}, header = true, all_varchar = true)"
    raise InputError(f"{path}: a FOCUS export must be .csv, .csv.gz or .parquet")


def load_focus(con: duckdb.DuckDBPyConnection, path: Path | None, window: Window) -> int:
    """The bill as relation ``focus``; returns its rows in the window. Checks columns and types."""
    if path is None:
        con.execute(
            "CREATE TABLE focus (ChargePeriodStart TIMESTAMP, ResourceId VARCHAR, SkuId VARCHAR,"
            " PricingCategory VARCHAR, ChargeCategory VARCHAR, EffectiveCost DOUBLE,"
            " ListCost DOUBLE, ConsumedQuantity DOUBLE)"
        )
        return 0
    if not path.is_file():
        raise InputError(f"{path}: no such file")
    source = _reader(path)
    try:
        con.execute(f"CREATE TABLE focus_raw AS SELECT * FROM {source}")
    except duckdb.Error as e:
        raise InputError(f"{path}: not readable as FOCUS ({str(e).splitlines()[0][:100]})") from e
    cols = set(_columns(con, "focus_raw"))
    missing = [c for c in FOCUS_REQUIRED if c not in cols]
    if missing:
        raise InputError(f"{path}: missing FOCUS column(s) {', '.join(missing)}")
    for c in ("ChargePeriodStart", *FOCUS_NUMERIC):
        if c not in cols:
            continue
        kind = "TIMESTAMPTZ" if c == "ChargePeriodStart" else "DOUBLE"
        (bad,) = con.execute(
            f'SELECT count(*) FROM focus_raw WHERE "{c}" IS NOT NULL'
            f' AND CAST("{c}" AS VARCHAR) <> \'\' AND TRY_CAST("{c}" AS {kind}) IS NULL'
        ).fetchone() or (0,)
        if bad:
            what = "times" if kind == "TIMESTAMPTZ" else "numbers"
            raise InputError(f"{path}: column {c}: {bad} value(s) are not {what}")
    opt = {c: (f'"{c}"' if c in cols else "NULL") for c in FOCUS_OPTIONAL}
    # ResourceId: the instance id is the last path segment of an ARN or a GCE resource name.
    con.execute(
        "CREATE TABLE focus AS SELECT"
        " CAST(TRY_CAST(ChargePeriodStart AS TIMESTAMPTZ) AS TIMESTAMP) AS ChargePeriodStart,"
        " regexp_extract(CAST(ResourceId AS VARCHAR), '[^/:]+$') AS ResourceId,"
        " CAST(SkuId AS VARCHAR) AS SkuId,"
        " CAST(PricingCategory AS VARCHAR) AS PricingCategory,"
        f" CAST({opt['ChargeCategory']} AS VARCHAR) AS ChargeCategory,"
        " TRY_CAST(EffectiveCost AS DOUBLE) AS EffectiveCost,"
        f" TRY_CAST({opt['ListCost']} AS DOUBLE) AS ListCost,"
        " TRY_CAST(ConsumedQuantity AS DOUBLE) AS ConsumedQuantity"
        " FROM focus_raw WHERE ResourceId IS NOT NULL"
    )
    con.execute("DROP TABLE focus_raw")
    if window.since is not None:
        con.execute("DELETE FROM focus WHERE ChargePeriodStart < ?", [window.since])
    if window.until is not None:
        con.execute("DELETE FROM focus WHERE ChargePeriodStart >= ?", [window.until])
    (n,) = con.execute("SELECT count(*) FROM focus").fetchone() or (0,)
    return int(n)


def read_rates(path: Path) -> list[tuple[str, str, float]]:
    """``sku,purchase_option,usd_per_gpu_hour`` rows (CSV with that header)."""
    try:
        with path.open(newline="") as f:
            rows = list(csv.DictReader(f))
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise InputError(f"{path}: {getattr(e, 'strerror', None) or e}") from e
    if not rows:
        raise InputError(f"{path}: no rates")
    missing = [c for c in RATES_COLUMNS if c not in rows[0]]
    if missing:
        raise InputError(f"{path}: missing column(s) {', '.join(missing)}")
    out = []
    for n, r in enumerate(rows, 2):
        option = normalize_purchase_option(r["purchase_option"])
        if option is None:
            choices = ", ".join(PURCHASE_OPTIONS)
            raise InputError(f"{path}:{n}: purchase_option must be one of {choices}")
        try:
            rate = float(r["usd_per_gpu_hour"])
        except (TypeError, ValueError) as e:
            raise InputError(f"{path}:{n}: usd_per_gpu_hour is not a number") from e
        if not rate >= 0:
            raise InputError(f"{path}:{n}: usd_per_gpu_hour must be >= 0")
        out.append((str(r["sku"]).strip(), option, rate))
    return out


def load_rates(con: duckdb.DuckDBPyConnection, rates: Sequence[tuple[str, str, float]]) -> None:
    con.execute(
        "CREATE TABLE rates (sku VARCHAR, purchase_option VARCHAR, usd_per_gpu_hour DOUBLE)"
    )
    if rates:
        con.executemany("INSERT INTO rates VALUES (?, ?, ?)", list(rates))
    con.execute("CREATE TABLE skus (sku VARCHAR, gpus INTEGER)")
    con.executemany("INSERT INTO skus VALUES (?, ?)", [(k, v.gpus) for k, v in skus.SKUS.items()])


def run_sql(con: duckdb.DuckDBPyConnection, by: str) -> list[Group]:
    result = con.execute(sql_text())
    names = [d[0] for d in result.description or ()]
    if names != ["grp", *COLUMNS]:
        raise AssertionError(f"report.sql returns {names}")  # a bug, not an input error
    groups = []
    for row in result.fetchall():
        figures: dict[str, float | int | None] = {}
        for name, value in zip(COLUMNS, row[1:], strict=True):
            if value is None:
                figures[name] = None
            elif name in COUNTS:
                figures[name] = int(value)
            else:
                figures[name] = float(value)
        groups.append(Group(by=by, key=str(row[0]), figures=figures))
    return groups


def report(
    ledger: Ledger,
    *,
    by: str = "tenant",
    focus: Path | None = None,
    rates: Iterable[tuple[str, str, float]] = (),
    window: Window = Window(),
) -> list[Group]:
    if by not in DEFAULT_ALLOW:
        raise InputError(f"--by must be one of {', '.join(DEFAULT_ALLOW)}")
    con = connect()
    try:
        load_ledger(con, ledger, by, window)
        load_focus(con, focus, window)
        load_rates(con, list(rates))
        return run_sql(con, by)
    finally:
        con.close()
