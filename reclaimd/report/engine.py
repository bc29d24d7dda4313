"""The join, in embedded DuckDB: the ledger's rows, the FOCUS bill, rates, SKUs -> groups.

The pricing logic is all in ``report.sql``, the file shipped for Athena and BigQuery; this
module only builds the six relations it reads (see the file's header) and checks the inputs
so that a bad one is a one-line ``InputError``, not a DuckDB traceback.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from reclaimd import skus
from reclaimd.ledger.labels import DEFAULT_ALLOW, PURCHASE_OPTIONS, normalize_purchase_option
from reclaimd.report import google
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

# The columns a true price needs (docs/ledger.md, "Which bill rows price a GPU-hour"): the
# instance-hour, its cost and quantity, and every column the compute-row rule tests. Read as
# "not stated", a missing one let tax, credits, commitment purchases or seconds into the rate.
FOCUS_REQUIRED: Final = (
    "ChargePeriodStart",
    "ResourceId",
    "SkuId",
    "PricingCategory",
    "EffectiveCost",
    "ConsumedQuantity",
    "ProviderName",
    "ServiceCategory",
    "ChargeCategory",
    "ConsumedUnit",
)
# The text columns of relation ``focus``; an optional one the export lacks (SkuMeter) is NULL.
FOCUS_TEXT: Final = (
    "ProviderName",
    "ServiceCategory",
    "ChargeCategory",
    "ConsumedUnit",
    "SkuId",
    "SkuMeter",
    "PricingCategory",
)
FOCUS_NUMERIC: Final = ("EffectiveCost", "ListCost", "ConsumedQuantity")
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


def _create(con: duckdb.DuckDBPyConnection, name: str, schema: Sequence[tuple[str, str]]) -> None:
    con.execute(f"CREATE TABLE {name} ({', '.join(f'{c} {t}' for c, t in schema)})")


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
        _create(con, name, schema)
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


def _quote(path: Path) -> str:
    return "'" + str(path).replace("'", "''") + "'"


def _literal(t: datetime) -> str:
    return f"TIMESTAMP '{t:%Y-%m-%d %H:%M:%S}'"


def kind_of(sql_type: str) -> str:
    """A column's type as ``focus_view`` needs it: text, double, timestamp, timestamptz, other."""
    t = sql_type.upper()
    if t.startswith("VARCHAR") or t == "TEXT":
        return "text"
    if t == "DOUBLE":
        return "double"
    if t.startswith("TIMESTAMP"):
        return "timestamptz" if "TIME ZONE" in t or t.endswith("TZ") else "timestamp"
    return "other"


def _text(kinds: Mapping[str, str], c: str) -> str:
    if c not in kinds:
        return "CAST(NULL AS VARCHAR)"
    return f'f."{c}"' if kinds[c] == "text" else f'CAST(f."{c}" AS VARCHAR)'


def focus_ids(source: str, kinds: Mapping[str, str]) -> str:
    """The SELECT of ``focus_view``'s instance ids: one row per distinct ResourceId of the
    source, ``raw, name, project_name``.

    The instance id is the last '/' or ':' segment (``name``); an Azure scale-set instance
    (``.../virtualMachineScaleSets/<vmss>/virtualMachines/<n>``, an AKS node) is
    '<vmss>_<n>', its VM name, as the ledger names it. GCE names an instance within its
    project: ``project`` is the resource name's ('.../projects/<p>/...'), else NULL, and
    ``is_instance`` 1 when the resource name is an instance's ('.../instances/<id>'): Google's
    FOCUS export names an instance by its numeric id there, so ``_instance_id`` takes the row's
    ResourceName for it. Worked out once per distinct value, not per row; keyed on the
    ResourceId alone (a DISTINCT of one column: a fifth of the three columns' time), as the
    row's own ProviderName, SubAccountId and ResourceName decide the rest.
    """
    rid = (
        'f."ResourceId"' if kinds.get("ResourceId") == "text" else 'CAST(f."ResourceId" AS VARCHAR)'
    )
    project = "NULLIF(regexp_extract(raw, 'projects/([^/]+)/', 1), '')"
    # No match is '' in DuckDB and NULL in Trino: NULLIF makes both NULL.
    scale_set = (
        "NULLIF(regexp_extract(raw,"
        " '(?i)/virtualMachineScaleSets/([^/]+)/virtualMachines/[^/]+$', 1), '')"
    )
    last = "regexp_extract(raw, '[^/:]+$')"
    instance = "CASE WHEN raw LIKE '%/instances/%' THEN 1 ELSE 0 END"
    return (
        "SELECT raw, name, project, is_instance"
        f" FROM (SELECT raw, COALESCE({scale_set} || '_' || {last}, {last}) AS name,"
        f" {project} AS project, {instance} AS is_instance"
        f' FROM (SELECT DISTINCT {rid} AS raw FROM {source} f WHERE f."ResourceId" IS NOT NULL)'
        " d) n"
    )


def _instance_id(kinds: Mapping[str, str]) -> str:
    """A bill row's instance id (``focus_ids``'s header): the name; a Google row's
    'project/name' (``google.instance_id``)."""
    return google.instance_id(
        _text(kinds, "ProviderName"), _text(kinds, "SubAccountId"), _text(kinds, "ResourceName")
    )


def focus_view(
    source: str, kinds: Mapping[str, str], window: Window, *, ids: str | None = None
) -> str:
    """The SELECT that makes relation ``focus`` of report.sql from a FOCUS table or file.

    One definition for every engine: it is valid DuckDB and Trino SQL. ``kinds``: each column
    of the source and its ``kind_of``; a column already of its FOCUS type is used as it is
    (Parquet), text (CSV) is cast here. A ResourceId is reduced once per distinct value:
    ``focus_ids``, inline, or ``ids``, a table made from it (DuckDB: then the join knows the
    table is small and builds its hash table on it, not on the bill's rows).
    """

    def text(c: str) -> str:
        return _text(kinds, c)

    def number(c: str) -> str:
        if c not in kinds:
            return "CAST(NULL AS DOUBLE)"
        return f'f."{c}"' if kinds[c] == "double" else f'TRY_CAST(f."{c}" AS DOUBLE)'

    start = {
        "timestamp": 'f."ChargePeriodStart"',
        "timestamptz": 'CAST(f."ChargePeriodStart" AS TIMESTAMP)',
    }.get(
        kinds.get("ChargePeriodStart", ""),
        'CAST(TRY_CAST(f."ChargePeriodStart" AS TIMESTAMP WITH TIME ZONE) AS TIMESTAMP)',
    )

    def stated(c: str) -> str | None:
        return text(c) if c in kinds else None

    derived = {
        "SkuMeter": google.sku_name([text(c) for c in google.SKU_NAMES if c in kinds]),
        "ServiceCategory": google.service_category(
            text("ProviderName"), stated("ServiceCategory"), stated("ServiceName")
        ),
    }
    fields = [
        f"{start} AS ChargePeriodStart",
        f"{_instance_id(kinds)} AS ResourceId",
        *(f"{derived.get(c) or text(c)} AS {c}" for c in FOCUS_TEXT),
        *(f"{number(c)} AS {c}" for c in FOCUS_NUMERIC),
    ]
    rid = (
        'f."ResourceId"' if kinds.get("ResourceId") == "text" else 'CAST(f."ResourceId" AS VARCHAR)'
    )
    m = ids if ids is not None else f"({focus_ids(source, kinds)})"
    inner = f"SELECT {', '.join(fields)} FROM {source} f JOIN {m} m ON m.raw = {rid}"
    where = []
    if window.since is not None:
        where.append(f"ChargePeriodStart >= {_literal(window.since)}")
    if window.until is not None:
        where.append(f"ChargePeriodStart < {_literal(window.until)}")
    return f"SELECT * FROM ({inner}) v" + (f" WHERE {' AND '.join(where)}" if where else "")


def _open_focus(con: duckdb.DuckDBPyConnection, path: Path) -> tuple[bool, str]:
    """``focus_raw`` over the file, with ``__line``: (typed, how a row is named)."""
    import duckdb

    name = path.name.lower()
    try:
        if name.endswith((".parquet", ".pq")):
            con.execute(
                "CREATE VIEW focus_raw AS SELECT *, file_row_number + 1 AS __line"
                f" FROM read_parquet({_quote(path)}, file_row_number = true)"
            )
            return True, "row"
        if name.endswith((".csv", ".csv.gz")):
            con.execute(
                "CREATE TABLE focus_csv AS SELECT *"
                f" FROM read_csv({_quote(path)}, header = true, all_varchar = true)"
            )
            con.execute("CREATE VIEW focus_raw AS SELECT *, rowid + 2 AS __line FROM focus_csv")
            return False, "line"
    except duckdb.Error as e:
        raise InputError(f"{path}: not readable as FOCUS ({str(e).splitlines()[0][:100]})") from e
    raise InputError(f"{path}: a FOCUS export must be .csv, .csv.gz or .parquet")


def _typed_and_clean(con: duckdb.DuckDBPyConnection, kinds: Mapping[str, str]) -> bool:
    """Whether a file whose columns are all of their FOCUS types (Parquet) has no bad value,
    from each number's least and greatest (a NaN is the greatest): a pass far cheaper than
    finding the first bad row, which ``_check_focus`` then need not look for."""
    numbers = [c for c in FOCUS_NUMERIC if c in kinds]
    if kinds.get("ChargePeriodStart") == "text" or any(kinds[c] != "double" for c in numbers):
        return False
    bounds = ", ".join(f'MIN("{c}"), MAX("{c}")' for c in numbers)
    row = con.execute(f"SELECT {bounds} FROM focus_raw").fetchone() or ()
    if any(v is not None and not math.isfinite(v) for v in row):
        return False
    least = row[2 * numbers.index("ConsumedQuantity")]
    return least is None or least >= 0


def _check_focus(
    con: duckdb.DuckDBPyConnection, path: Path, kinds: Mapping[str, str], unit: str
) -> None:
    """One scan: the first row (file line) of each kind of bad value, refused by name. A
    column already of its type (Parquet) is only checked for what its type allows."""
    if _typed_and_clean(con, kinds):
        return
    checks: list[tuple[str, str, str]] = []  # (column, condition, what is wrong)
    if kinds.get("ChargePeriodStart") == "text":
        v = '"ChargePeriodStart"'
        checks.append(
            (
                "ChargePeriodStart",
                f"{v} IS NOT NULL AND {v} <> '' AND TRY_CAST({v} AS TIMESTAMPTZ) IS NULL",
                "is not a time",
            )
        )
    for c in FOCUS_NUMERIC:
        if c not in kinds:
            continue
        if kinds[c] == "double":
            d = f'"{c}"'
        else:
            v = f'CAST("{c}" AS VARCHAR)'
            d = f'TRY_CAST("{c}" AS DOUBLE)'
            checks.append((c, f"{v} IS NOT NULL AND {v} <> '' AND {d} IS NULL", "is not a number"))
        checks.append((c, f"{d} IS NOT NULL AND NOT isfinite({d})", "is not a finite number"))
    correction = "false"
    if "ChargeClass" in kinds:
        correction = "CAST(\"ChargeClass\" AS VARCHAR) = 'Correction'"
    qty = (
        '"ConsumedQuantity"'
        if kinds.get("ConsumedQuantity") == "double"
        else ('TRY_CAST("ConsumedQuantity" AS DOUBLE)')
    )
    checks.append(
        ("ConsumedQuantity", f"{qty} < 0 AND NOT COALESCE({correction}, false)", "is negative")
    )
    firsts = ", ".join(f"MIN(CASE WHEN {cond} THEN __line END)" for _, cond, _ in checks)
    row = con.execute(f"SELECT {firsts} FROM focus_raw").fetchone() or ()
    found = [(n, c) for n, c in zip(row, checks, strict=True) if n is not None]
    if not found:
        return
    line, (column, _, what) = min(found, key=lambda f: int(f[0]))
    (value,) = con.execute(
        f'SELECT CAST("{column}" AS VARCHAR) FROM focus_raw WHERE __line = ?', [line]
    ).fetchone() or ("?",)
    where = f"{path}:{line}" if unit == "line" else f"{path}: row {line}"
    raise InputError(f"{where}: {column} {str(value)[:40]!r} {what}")


def check_columns(path: Path, kinds: Mapping[str, str]) -> None:
    """Refuse a FOCUS file without a column a true price needs (``FOCUS_REQUIRED``), and
    Google's detailed export by name. ServiceName stands in for ServiceCategory here (Google's
    FOCUS export has none); ``load_focus`` refuses it where a row is not Google's."""
    google.refuse_detailed_export(path, kinds)
    service = "ServiceCategory" in kinds or "ServiceName" in kinds
    missing = [
        c for c in FOCUS_REQUIRED if c not in kinds and (c != "ServiceCategory" or not service)
    ]
    if missing:
        raise InputError(f"{path}: missing FOCUS column(s) {', '.join(missing)}")


def _has_rows(con: duckdb.DuckDBPyConnection, *, google: bool) -> bool:
    """Whether the bill has a Google row (``google``), or a row that is not Google's."""
    test = "LIKE" if google else "NOT LIKE"
    row = con.execute(
        "SELECT 1 FROM focus_raw"
        f" WHERE COALESCE(LOWER(CAST(\"ProviderName\" AS VARCHAR)), '') {test} 'google%' LIMIT 1"
    ).fetchone()
    return row is not None


def load_focus(con: duckdb.DuckDBPyConnection, path: Path | None, window: Window) -> None:
    """The bill as relation ``focus`` (a view: a Parquet file is scanned, not copied)."""
    if path is None:
        _create(
            con,
            "focus",
            [("ChargePeriodStart", "TIMESTAMP"), ("ResourceId", "VARCHAR")]
            + [(c, "VARCHAR") for c in FOCUS_TEXT]
            + [(c, "DOUBLE") for c in FOCUS_NUMERIC],
        )
        return
    if not path.is_file():
        raise InputError(f"{path}: no such file")
    _, unit = _open_focus(con, path)
    described = con.execute("SELECT column_name, column_type FROM (DESCRIBE focus_raw)")
    kinds = {str(n): kind_of(str(t)) for n, t in described.fetchall() if n != "__line"}
    check_columns(path, kinds)
    if "ServiceCategory" not in kinds and _has_rows(con, google=False):
        # only a Google row's is read from its ServiceName
        raise InputError(f"{path}: missing FOCUS column(s) ServiceCategory")
    if not any(c in kinds for c in google.SKU_NAMES) and _has_rows(con, google=True):
        raise InputError(
            f"{path}: missing FOCUS column(s) ChargeDescription (a Google Cloud row names its"
            " SKU there, as Google's FOCUS export does, or in SkuMeter or x_SkuDescription)"
        )
    _check_focus(con, path, kinds, unit)
    # The ids as a table, not focus_view's subquery: DuckDB estimates a DISTINCT's rows as
    # its input's (every bill row), and a plan could build the join's hash table on the
    # bill's millions of rows instead of its few thousand ids.
    con.execute(f"CREATE TABLE focus_ids AS {focus_ids('focus_raw', kinds)}")
    con.execute(f"CREATE VIEW focus AS {focus_view('focus_raw', kinds, window, ids='focus_ids')}")


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
        holds.append(f"hour_start >= {_literal(window.since)}")
    if window.until is not None:
        holds.append(f"hour_start < {_literal(window.until)}")
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
                _create(con, name, LEDGER_TABLES[name])
                continue
            rows = f"read_parquet({_quote(path)})"
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
            con.execute(f"COPY {name} TO {_quote(path)} (FORMAT parquet)")
    finally:
        con.close()
