"""SQL text the report's engines share: a path or a time as a literal, a table from a schema."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import duckdb


def quote(path: Path) -> str:
    return "'" + str(path).replace("'", "''") + "'"


def literal(t: datetime) -> str:
    return f"TIMESTAMP '{t:%Y-%m-%d %H:%M:%S}'"


def create(con: duckdb.DuckDBPyConnection, name: str, schema: Sequence[tuple[str, str]]) -> None:
    con.execute(f"CREATE TABLE {name} ({', '.join(f'{c} {t}' for c, t in schema)})")
