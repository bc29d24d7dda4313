"""The FOCUS bill as report.sql's relation ``focus``: its columns, read and checked.

A bill is a FOCUS export (CSV or Parquet) of any provider. ``focus_view`` is the one SELECT
that makes the relation from it, valid in DuckDB and Trino alike (``trino`` defines its view
with it); ``load_focus`` opens a file in DuckDB, refuses a missing column or a bad value by
name in one line (``InputError``), and defines the view over it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Final

from reclaimd.report import google, sqltext
from reclaimd.report.ledger_input import InputError

if TYPE_CHECKING:
    import duckdb

    from reclaimd.report.engine import Window

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
        where.append(f"ChargePeriodStart >= {sqltext.literal(window.since)}")
    if window.until is not None:
        where.append(f"ChargePeriodStart < {sqltext.literal(window.until)}")
    return f"SELECT * FROM ({inner}) v" + (f" WHERE {' AND '.join(where)}" if where else "")


def _open_focus(con: duckdb.DuckDBPyConnection, path: Path) -> tuple[bool, str]:
    """``focus_raw`` over the file, with ``__line``: (typed, how a row is named)."""
    import duckdb

    name = path.name.lower()
    try:
        if name.endswith((".parquet", ".pq")):
            con.execute(
                "CREATE VIEW focus_raw AS SELECT *, file_row_number + 1 AS __line"
                f" FROM read_parquet({sqltext.quote(path)}, file_row_number = true)"
            )
            return True, "row"
        if name.endswith((".csv", ".csv.gz")):
            con.execute(
                "CREATE TABLE focus_csv AS SELECT *"
                f" FROM read_csv({sqltext.quote(path)}, header = true, all_varchar = true)"
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
        sqltext.create(
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
