"""The join, in embedded DuckDB: the ledger's rows, the FOCUS bill, rates, SKUs -> groups.

The pricing logic is all in ``report.sql``, the file shipped for Athena and BigQuery; this
module only builds the six relations it reads (see the file's header; the bill's, ``focus``,
in ``focus``) and checks the inputs so that a bad one is a one-line ``InputError``, not a
DuckDB traceback.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from reclaimd import skus
from reclaimd.ledger.labels import DEFAULT_ALLOW, PURCHASE_OPTIONS, normalize_purchase_option
from reclaimd.report import sqltext
from reclaimd.report.focus import load_focus
from reclaimd.report.ledger_input import (
    AllocationRow,
    InputError,
    Ledger,
    OverheadPart,
    WastePart,
)

if TYPE_CHECKING:
    # Imported when a report runs: `reclaimd run` registers this command, and a replica
    # should not carry DuckDB (~12 MB) for it.
    import duckdb

RATES_COLUMNS: Final = ("sku", "purchase_option", "usd_per_gpu_hour")
NONE: Final = "unattributed"  # the group of rows that lack the label
IDLE: Final = "reserved-idle"  # the group report.sql gives committed capacity nobody held
UNALLOCATED: Final = "unallocated"  # ... and the idle GPUs of on-demand and spot instances
# Where report.sql's result begins: idle.sql's SELECT replaces it (``idle_sql``).
RESULT_MARKER: Final = "-- the result: one row per group"

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
    "reserved_idle_gpu_hours",
    "reserved_idle_cost",
    "unallocated_gpu_hours",
    "unallocated_cost",
    "restart_waste_gpu_hours",
    "restart_waste_cost",
    # a breakdown of allocated_cost (GPUs held while the replacement restores), not added to
    # effective_cost
    "restart_overhead_gpu_hours",
    "restart_overhead_cost",
    "notices",
    "gangs_hit",
    "checkpointed",
    "partial",
    "not_durable",
    "no_ack",
    "not_opted_in",
    "deadline_misses",
    "effective_cost",
    "cost_share",
    "waste_share",
    # does spot pay (spotpays.py; docs/ledger.md): the spot GPU-hours' on-demand price, the
    # restart waste and restart overhead on spot, and what is left of the saving
    "spot_on_demand_cost",
    "spot_waste_gpu_hours",
    "spot_waste_cost",
    "spot_overhead_gpu_hours",
    "spot_overhead_cost",
    "spot_net_savings",
    "unpriced_gpu_hours",
)
COUNTS: Final = frozenset(
    {"notices", "gangs_hit", "checkpointed", "partial", "not_durable", "no_ack"}
    | {"not_opted_in", "deadline_misses"}
)
ALLOC_SCHEMA: Final = (
    ("hour_start", "TIMESTAMP"),
    ("resource_id", "VARCHAR"),
    ("node", "VARCHAR"),
    ("sku", "VARCHAR"),
    ("purchase_option", "VARCHAR"),
    ("grp", "VARCHAR"),
    ("gpu_hours", "DOUBLE"),
    ("mig_gpu_hours", "DOUBLE"),
    ("mig_profile_hours", "DOUBLE"),
    ("hbm_gb_hours", "DOUBLE"),
    ("node_gpus", "INTEGER"),
)
# A restart part, waste or overhead: one gang's share on one instance (report.sql prices both)
_PART_SCHEMA: Final = (
    ("event_id", "VARCHAR"),
    ("notice_id", "VARCHAR"),
    ("gang_id", "VARCHAR"),
    ("hour_start", "TIMESTAMP"),
    ("resource_id", "VARCHAR"),
    ("node", "VARCHAR"),
    ("sku", "VARCHAR"),
    ("purchase_option", "VARCHAR"),
    ("grp", "VARCHAR"),
    ("gpu_seconds", "DOUBLE"),
)
WASTE_SCHEMA: Final = (*_PART_SCHEMA, ("outcome", "VARCHAR"), ("deadline_met", "BOOLEAN"))
OVERHEAD_SCHEMA: Final = (*_PART_SCHEMA, ("source", "VARCHAR"))
# The landed ledger tables report_landed reads (Parquet in these shapes)
LEDGER_TABLES: Final = {"alloc": ALLOC_SCHEMA, "waste": WASTE_SCHEMA, "overhead": OVERHEAD_SCHEMA}


def sql_text() -> str:
    return resources.files("reclaimd.report").joinpath("report.sql").read_text()


def idle_sql() -> str:
    """report.sql's relations with idle.sql's SELECT as the result: the instance-hours behind
    the groups reserved-idle and unallocated (one definition of them, not two)."""
    text = sql_text()
    head = text[: text.index(RESULT_MARKER)]
    return head + resources.files("reclaimd.report").joinpath("idle.sql").read_text()


@dataclass(frozen=True)
class Group:
    by: str
    key: str
    figures: dict[str, float | int | None]


@dataclass(frozen=True)
class Idle:
    """One instance-hour's GPUs the bill charged and the meter saw nobody hold."""

    group: str  # IDLE or UNALLOCATED
    hour: datetime  # naive UTC
    instance: str  # the instance id as report.sql matches it (GCE: project/name)
    purchase_option: str | None
    gpu_hours: float
    cost: float


@dataclass(frozen=True)
class Window:
    since: datetime | None = None  # naive UTC, inclusive
    until: datetime | None = None  # naive UTC, exclusive
    metered_to: datetime | None = None  # the open hour's latest running total (naive UTC)

    def holds(self, t: datetime) -> bool:
        return (self.since is None or t >= self.since) and (self.until is None or t < self.until)

    def describe(self) -> str:
        def fmt(t: datetime | None) -> str:
            return t.isoformat(timespec="seconds") + "Z" if t is not None else "..."

        text = f"{fmt(self.since)} to {fmt(self.until)}"
        if self.metered_to is not None:
            text += f" (the last hour still open: metered to {fmt(self.metered_to)})"
        return text


ALL: Final = Window()  # no bounds


def connect() -> duckdb.DuckDBPyConnection:
    import duckdb

    con = duckdb.connect(":memory:")
    con.execute("SET TimeZone = 'UTC'")
    con.execute("SET enable_progress_bar = false")
    return con


def connect_report() -> duckdb.DuckDBPyConnection:
    """A connection for a report: it reads the bill's Parquet file three times (the checks, the
    ids, report.sql) and the ledger's each several times, so their metadata is parsed once."""
    con = connect()
    con.execute("SET parquet_metadata_cache = true")
    return con


def _hour(t: datetime) -> datetime:
    return t.replace(minute=0, second=0, microsecond=0)


def load_ledger(con: duckdb.DuckDBPyConnection, ledger: Ledger, by: str, window: Window) -> None:
    rows = {
        "alloc": [_alloc_tuple(a, by) for a in ledger.allocation if window.holds(a.hour_start)],
        "waste": [_waste_tuple(w, by) for w in ledger.waste if window.holds(w.stopped_at)],
        "overhead": [
            _overhead_tuple(o, by) for o in ledger.overhead if window.holds(o.restarted_at)
        ],
    }
    if not any(rows.values()):
        raise InputError(
            f"no allocation, restart-waste or restart-overhead rows from {window.describe()}"
        )
    for name, schema in LEDGER_TABLES.items():
        sqltext.create(con, name, schema)
        if rows[name]:
            marks = ", ".join("?" * len(schema))
            con.executemany(f"INSERT INTO {name} VALUES ({marks})", rows[name])


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


def _part_group(purchase_option: str | None, labels: Mapping[str, str], by: str) -> str:
    # A part's own purchase option groups it when the report is by purchase option: a gang's
    # spot ranks and on-demand ranks land in their own groups.
    grp = (purchase_option or labels.get(by)) if by == "purchase_option" else labels.get(by)
    return grp or NONE


def _waste_tuple(w: WastePart, by: str) -> tuple[Any, ...]:
    return (
        w.event_id,
        w.notice_id,
        w.gang_id,
        _hour(w.stopped_at),
        w.resource_id,
        w.node,
        w.sku,
        w.purchase_option,
        _part_group(w.purchase_option, w.labels, by),
        w.gpu_seconds,
        w.outcome,
        w.deadline_met,
    )


def _overhead_tuple(o: OverheadPart, by: str) -> tuple[Any, ...]:
    return (
        o.event_id,
        o.notice_id,
        o.gang_id,
        _hour(o.restarted_at),
        o.resource_id,
        o.node,
        o.sku,
        o.purchase_option,
        _part_group(o.purchase_option, o.labels, by),
        o.gpu_seconds,
        o.source,
    )


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
    _insert(con, "rates", list(rates))
    con.execute("CREATE TABLE skus (sku VARCHAR, gpus INTEGER)")
    _insert(con, "skus", [(k, v.gpus) for k, v in skus.SKUS.items()])


def _insert(con: duckdb.DuckDBPyConnection, table: str, rows: Sequence[Sequence[Any]]) -> None:
    """The rows in an INSERT per 500 (executemany runs a statement per row: 5 ms for the 23
    SKUs, a report's every run)."""
    for n in range(0, len(rows), 500):
        batch = rows[n : n + 500]
        marks = ", ".join("(" + ", ".join("?" * len(r)) + ")" for r in batch)
        con.execute(f"INSERT INTO {table} VALUES {marks}", [v for r in batch for v in r])


def groups_of(names: Sequence[str], rows: Iterable[Sequence[Any]], by: str) -> list[Group]:
    """report.sql's result rows as groups (any engine's)."""
    if list(names) != ["grp", *COLUMNS]:
        raise AssertionError(f"report.sql returns {list(names)}")  # a bug, not an input error
    groups = []
    for row in rows:
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


def _disable_build_side_flip(con: duckdb.DuckDBPyConnection) -> None:
    # report.sql writes each join with the smaller relation on its right, the side a hash
    # join builds its table on (the bill's instance-hours, not the allocation's rows; the
    # instances, not the bill's instance-hours). DuckDB estimates an aggregate's or a CTE's
    # rows as its input's, so its build-side flip turns these round and builds on millions
    # of rows (a month's fleet, make bench-report: the allocation's join 4x as long, twice
    # the memory); keep them as written.
    con.execute("SET disabled_optimizers = 'build_side_probe_side'")


def run_sql(con: duckdb.DuckDBPyConnection, by: str) -> list[Group]:
    _disable_build_side_flip(con)
    result = con.execute(sql_text())
    names = [d[0] for d in result.description or ()]
    return groups_of(names, result.fetchall(), by)


def idle_of(rows: Iterable[Sequence[Any]]) -> list[Idle]:
    """idle.sql's result rows (any engine's)."""
    return [
        Idle(
            group=str(r[0]),
            # DuckDB gives a datetime, Trino's HTTP protocol '2026-03-01 12:00:00.000'
            hour=r[1] if isinstance(r[1], datetime) else datetime.fromisoformat(str(r[1])),
            instance=str(r[2]),
            purchase_option=None if r[3] is None else str(r[3]),
            gpu_hours=float(r[4]),
            cost=float(r[5]),
        )
        for r in rows
    ]


def run_idle(con: duckdb.DuckDBPyConnection) -> list[Idle]:
    _disable_build_side_flip(con)
    return idle_of(con.execute(idle_sql()).fetchall())


def report_with_idle(
    ledger: Ledger,
    *,
    by: str = "tenant",
    focus: Path | None = None,
    rates: Iterable[tuple[str, str, float]] = (),
    window: Window = Window(),
    detail: bool = False,
) -> tuple[list[Group], list[Idle]]:
    """The groups, and with ``detail`` the idle instance-hours behind reserved-idle and
    unallocated (a second query over the same relations: only when asked for)."""
    if by not in DEFAULT_ALLOW:
        raise InputError(f"--by must be one of {', '.join(DEFAULT_ALLOW)}")
    con = connect_report()
    try:
        load_ledger(con, ledger, by, window)
        load_focus(con, focus, window)
        load_rates(con, list(rates))
        groups = run_sql(con, by)
        return groups, (run_idle(con) if detail else [])
    finally:
        con.close()


def hours_within(window: Window) -> str:
    """A landed ledger table's WHERE for the window (on hour_start), or nothing: one text
    for DuckDB and Trino."""
    holds = []
    if window.since is not None:
        holds.append(f"hour_start >= {sqltext.literal(window.since)}")
    if window.until is not None:
        holds.append(f"hour_start < {sqltext.literal(window.until)}")
    return f" WHERE {' AND '.join(holds)}" if holds else ""


def report_landed(
    alloc: Path,
    waste: Path,
    focus: Path,
    *,
    overhead: Path | None = None,
    rates: Iterable[tuple[str, str, float]] = (),
    window: Window = Window(),
    by: str = "tenant",
    threads: int | None = None,
) -> list[Group]:
    """The report over the ledger as landed tables (Parquet in report.sql's ``alloc``,
    ``waste`` and ``overhead`` shapes, as Kafka Connect or Firehose would land them) and a
    FOCUS file: what a fleet-sized month runs on (``make bench-report``). Without
    ``overhead`` the relation is empty (a ledger landed before the event existed)."""
    con = connect_report()
    try:
        if threads:
            con.execute(f"SET threads = {int(threads)}")
        landed = {"alloc": alloc, "waste": waste, "overhead": overhead}
        for name, path in landed.items():
            if path is None:
                sqltext.create(con, name, LEDGER_TABLES[name])
                continue
            rows = f"read_parquet({sqltext.quote(path)})"
            con.execute(f"CREATE VIEW {name} AS SELECT * FROM {rows}{hours_within(window)}")
        load_focus(con, focus, window)
        load_rates(con, list(rates))
        return run_sql(con, by)
    finally:
        con.close()


def land_ledger(
    ledger: Ledger, by: str, alloc: Path, waste: Path, overhead: Path | None = None
) -> None:
    """Write the ledger as the landed ``alloc``, ``waste`` and (given a path) ``overhead``
    tables (Parquet), as Kafka Connect or Firehose would land the topics for Athena: what
    ``report_landed`` reads."""
    con = connect()
    try:
        load_ledger(con, ledger, by, Window())
        landed = {"alloc": alloc, "waste": waste, "overhead": overhead}
        for name, path in landed.items():
            if path is None:
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            con.execute(f"COPY {name} TO {sqltext.quote(path)} (FORMAT parquet)")
    finally:
        con.close()
