"""report.sql in Trino (Athena's engine), over the Parquet files DuckDB reads.

A single-node Trino on 127.0.0.1 is started by ``deploy/local/trino.sh`` (trino-server from
Maven Central, cached under ``~/.cache/reclaimd/``); its ``hive`` catalog reads local files
through a file metastore. ``run_report`` makes external tables over the files, the six
relations as views (``focus`` from ``focus.focus_view``, the same definition DuckDB uses),
and runs ``report.sql``'s text unchanged. The client is Trino's HTTP protocol, standard
library only.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from reclaimd import skus
from reclaimd.report import engine, sqltext
from reclaimd.report.engine import Group, Window
from reclaimd.report.focus import check_columns, focus_view, kind_of

SCRIPT: Final = Path(__file__).resolve().parents[2] / "deploy" / "local" / "trino.sh"
USER: Final = "reclaimd"
_TYPES: Final = {
    "TIMESTAMP": "timestamp(3)",
    "VARCHAR": "varchar",
    "DOUBLE": "double",
    "INTEGER": "integer",
    "BIGINT": "bigint",
    "BOOLEAN": "boolean",
}


class TrinoError(RuntimeError):
    pass


def start() -> str:
    """Start (or find) the local Trino; returns its URL."""
    subprocess.run([str(SCRIPT), "up"], check=True, stdout=subprocess.DEVNULL)
    out = subprocess.run([str(SCRIPT), "url"], check=True, capture_output=True, text=True)
    return out.stdout.strip()


def is_up(url: str = "http://127.0.0.1:18480") -> bool:
    try:
        Client(url).query("SELECT 1", timeout_s=5)
    except (OSError, TrinoError):
        return False
    return True


def stop() -> None:
    subprocess.run([str(SCRIPT), "down"], check=False, stdout=subprocess.DEVNULL)


class Client:
    def __init__(self, url: str, *, catalog: str = "hive", schema: str | None = None) -> None:
        if not url.startswith(("http://127.", "http://localhost")):
            raise ValueError(f"{url}: only a Trino on this machine")
        self.url, self.catalog, self.schema = url.rstrip("/"), catalog, schema

    def _headers(self) -> dict[str, str]:
        h = {"X-Trino-User": USER, "X-Trino-Catalog": self.catalog}
        if self.schema:
            h["X-Trino-Schema"] = self.schema
        return h

    def query(self, sql: str, timeout_s: float = 600.0) -> tuple[list[str], list[list[Any]]]:
        """Run one statement; its column names and rows."""
        deadline = time.monotonic() + timeout_s
        req = urllib.request.Request(
            f"{self.url}/v1/statement", data=sql.encode(), headers=self._headers()
        )
        with urllib.request.urlopen(req, timeout=60) as r:
            doc = json.load(r)
        names: list[str] = []
        rows: list[list[Any]] = []
        while True:
            if "error" in doc:
                err = doc["error"]
                raise TrinoError(f"{err.get('errorName')}: {str(err.get('message'))[:300]}")
            if doc.get("columns") and not names:
                names = [c["name"] for c in doc["columns"]]
            rows.extend(doc.get("data") or ())
            nxt = doc.get("nextUri")
            if not nxt:
                return names, rows
            if time.monotonic() > deadline:
                raise TrinoError(f"no answer within {timeout_s:g}s")
            with urllib.request.urlopen(
                urllib.request.Request(nxt, headers=self._headers()), timeout=60
            ) as r:
                doc = json.load(r)


def _sql_type(duck_type: str) -> str:
    base = duck_type.split("(", maxsplit=1)[0].upper()
    if base.startswith("TIMESTAMP"):
        return _TYPES["TIMESTAMP"]
    if base == "DECIMAL":
        # as stored (BigQuery's NUMERIC is DECIMAL(38, 9)): Trino reads no DECIMAL as double
        return duck_type.lower().replace(" ", "")
    if base in ("FLOAT", "REAL"):
        return "double"
    return _TYPES.get(base, "varchar")


def _nested(duck_type: str) -> bool:
    return duck_type.upper().startswith(("STRUCT", "MAP", "UNION")) or duck_type.endswith("]")


def parquet_columns(path: Path) -> list[tuple[str, str]]:
    """The file's columns as Trino types; nested ones (Google's x_Credits, x_Project) are left
    out: the report reads none, and a table maps Parquet columns by name."""
    con = engine.connect()
    try:
        rows = con.execute(f"DESCRIBE SELECT * FROM read_parquet({sqltext.quote(path)})").fetchall()
    finally:
        con.close()
    return [(str(r[0]), _sql_type(str(r[1]))) for r in rows if not _nested(str(r[1]))]


def _table(c: Client, name: str, path: Path) -> dict[str, str]:
    """An external table over the directory holding ``path`` (one file per directory)."""
    cols = parquet_columns(path)
    c.query(f"DROP TABLE IF EXISTS {name}")
    spec = ", ".join(f'"{n}" {t}' for n, t in cols)
    c.query(
        f"CREATE TABLE {name} ({spec}) WITH"
        f" (external_location = 'local://{path.resolve().parent}', format = 'PARQUET')"
    )
    return {n: kind_of(t) for n, t in cols}


def _values(rows: Iterable[Sequence[Any]], types: Sequence[str]) -> str:
    def lit(v: Any, t: str) -> str:
        if v is None:
            return f"CAST(NULL AS {t})"
        if t == "varchar":
            return "'" + str(v).replace("'", "''") + "'"
        return f"CAST({v!r} AS {t})"

    return ", ".join(
        "(" + ", ".join(lit(v, t) for v, t in zip(r, types, strict=True)) + ")" for r in rows
    )


def _empty(schema: Sequence[tuple[str, str]]) -> str:
    """A SELECT of no rows with ``schema``'s columns (a relation with no file behind it)."""
    cols = ", ".join(f"CAST(NULL AS {_sql_type(t)}) AS {n}" for n, t in schema)
    return f"SELECT {cols} WHERE false"


def run_report(
    url: str,
    *,
    alloc: Path,
    waste: Path,
    focus: Path,
    overhead: Path | None = None,
    rates: Iterable[tuple[str, str, float]] = (),
    window: Window = engine.ALL,
    by: str = "tenant",
    schema: str = "reclaimd_report",
    detail: bool = False,
) -> tuple[list[Group], list[engine.Idle]]:
    """report.sql over the files, in Trino: the groups DuckDB's ``report_landed`` gives, and
    with ``detail`` the idle instance-hours (``engine.idle_sql``) over the same views."""
    ledger = {"alloc": alloc, "waste": waste, "overhead": overhead}
    c = _relations(url, ledger=ledger, focus=focus, rates=rates, window=window, schema=schema)
    groups = engine.groups_of(*c.query(engine.sql_text()), by)
    return groups, (engine.idle_of(c.query(engine.idle_sql())[1]) if detail else [])


def _relations(
    url: str,
    *,
    ledger: Mapping[str, Path | None],
    focus: Path,
    rates: Iterable[tuple[str, str, float]],
    window: Window,
    schema: str,
) -> Client:
    """The six relations report.sql reads, as views over the files (a ledger table without
    a file: an empty view); a client on them."""
    c = Client(url)
    c.query(f"CREATE SCHEMA IF NOT EXISTS hive.{schema}")
    c = Client(url, schema=schema)
    for view, path in ledger.items():
        if path is None:
            c.query(f"CREATE OR REPLACE VIEW {view} AS {_empty(engine.LEDGER_TABLES[view])}")
            continue
        _table(c, f"{view}_raw", path)
        where = engine.hours_within(window)
        c.query(f"CREATE OR REPLACE VIEW {view} AS SELECT * FROM {view}_raw{where}")
    kinds = _table(c, "focus_raw", focus)
    check_columns(focus, kinds)
    view = focus_view("focus_raw", kinds, window)
    c.query(f"CREATE OR REPLACE VIEW focus AS {view}")
    rate_rows = list(rates)
    rates_sql = (
        f"SELECT * FROM (VALUES {_values(rate_rows, ('varchar', 'varchar', 'double'))})"
        " AS t(sku, purchase_option, usd_per_gpu_hour)"
        if rate_rows
        else "SELECT CAST(NULL AS varchar) AS sku, CAST(NULL AS varchar) AS purchase_option,"
        " CAST(NULL AS double) AS usd_per_gpu_hour WHERE false"
    )
    c.query(f"CREATE OR REPLACE VIEW rates AS {rates_sql}")
    sku_rows = [(k, v.gpus) for k, v in skus.SKUS.items()]
    c.query(
        f"CREATE OR REPLACE VIEW skus AS SELECT * FROM"
        f" (VALUES {_values(sku_rows, ('varchar', 'integer'))}) AS t(sku, gpus)"
    )
    return c
