"""A durable outbox for ledger events: SQLite on local disk, keyed by event id.

The ledger promises that a Kafka outage delays events and never loses them, and that a replay
never doubles them. So an event is first committed here (WAL journal, ``synchronous=FULL``:
the commit returns only after the log is fsync'd) and only then published; a row is marked
sent once the broker acked it. The primary key on the event id makes a second ``put`` of the
same event a no-op, and sent rows are kept (until ``prune``) so that this holds after the
send too.

``Outbox`` is synchronous and thread-safe (one connection behind a lock). ``AsyncOutbox``
runs it on a single worker thread, so asyncio code never blocks on an fsync and SQLite only
ever sees one thread at a time. ``depth()`` is a counter kept beside the table (counted once
at open, then moved by ``put`` and ``mark_sent``), so metrics can read it from any thread
without waiting behind a commit.
"""

from __future__ import annotations

import asyncio
import base64
import json
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

Headers = tuple[tuple[str, bytes], ...]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS outbox (
    seq        INTEGER PRIMARY KEY AUTOINCREMENT,  -- publish order
    id         TEXT    NOT NULL UNIQUE,
    key        BLOB,
    value      BLOB    NOT NULL,
    headers    TEXT    NOT NULL,                   -- JSON [[name, base64 value], ...]
    created_at REAL    NOT NULL,
    sent_at    REAL
);
CREATE INDEX IF NOT EXISTS outbox_unsent ON outbox (seq) WHERE sent_at IS NULL;
"""

T = TypeVar("T")


@dataclass(frozen=True)
class Row:
    seq: int
    id: str
    key: bytes | None
    value: bytes
    headers: Headers


def _encode_headers(headers: Iterable[tuple[str, bytes]]) -> str:
    return json.dumps([[k, base64.b64encode(v).decode()] for k, v in headers])


def _decode_headers(text: str) -> Headers:
    return tuple((str(k), base64.b64decode(v)) for k, v in json.loads(text))


class Outbox:
    """The table and its four operations. Opening an existing file resumes its rows."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        # isolation_level=None: we issue BEGIN/COMMIT ourselves, so a put is one transaction.
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(_SCHEMA)
        (n,) = self._db.execute("SELECT count(*) FROM outbox WHERE sent_at IS NULL").fetchone()
        self._unsent = int(n)

    def put(
        self, id: str, key: bytes | None, value: bytes, headers: Iterable[tuple[str, bytes]]
    ) -> bool:
        """Store one event; ``True`` if it is new, ``False`` if the id was already there."""
        with self._lock:
            cur = self._db.execute(
                "INSERT OR IGNORE INTO outbox (id, key, value, headers, created_at) "
                "VALUES (?, ?, ?, ?, ?)",
                (id, key, value, _encode_headers(headers), time.time()),
            )
            new = cur.rowcount == 1
            self._unsent += new
        return new

    def pending(self, limit: int = 100) -> list[Row]:
        """Unsent rows, oldest first."""
        with self._lock:
            rows = self._db.execute(
                "SELECT seq, id, key, value, headers FROM outbox "
                "WHERE sent_at IS NULL ORDER BY seq LIMIT ?",
                (limit,),
            ).fetchall()
        return [Row(seq, id_, key, value, _decode_headers(h)) for seq, id_, key, value, h in rows]

    def mark_sent(self, ids: Sequence[str]) -> int:
        """Mark rows as acked by the broker; returns how many changed (re-marking is a no-op)."""
        if not ids:
            return 0
        now = time.time()
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                changed = sum(
                    self._db.execute(
                        "UPDATE outbox SET sent_at = ? WHERE id = ? AND sent_at IS NULL", (now, i)
                    ).rowcount
                    for i in ids
                )
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
            self._unsent -= changed
        return changed

    def depth(self) -> int:
        """How many events wait to be published."""
        return self._unsent

    def contains(self, id: str) -> bool:
        with self._lock:
            row = self._db.execute("SELECT 1 FROM outbox WHERE id = ?", (id,)).fetchone()
        return row is not None

    def prune(self, older_than_s: float) -> int:
        """Forget sent rows older than this: after that a replay of the id would be new again,
        so keep it well above any redelivery horizon (consumers dedupe on the id anyway)."""
        cutoff = time.time() - older_than_s
        with self._lock:
            cur = self._db.execute(
                "DELETE FROM outbox WHERE sent_at IS NOT NULL AND sent_at < ?", (cutoff,)
            )
            return cur.rowcount

    def close(self) -> None:
        with self._lock:
            self._db.close()


class AsyncOutbox:
    """``Outbox`` for asyncio: every call runs on one dedicated thread."""

    def __init__(self, outbox: Outbox) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="reclaimd-outbox")
        self._outbox = outbox
        self.path = outbox.path

    @classmethod
    def open(cls, path: str | Path) -> AsyncOutbox:
        """Open (or create) the file; blocks briefly, meant for start-up."""
        return cls(Outbox(path))

    async def _run(self, fn: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn)

    async def put(
        self, id: str, key: bytes | None, value: bytes, headers: Iterable[tuple[str, bytes]]
    ) -> bool:
        hs = tuple(headers)
        return await self._run(lambda: self._outbox.put(id, key, value, hs))

    async def pending(self, limit: int = 100) -> list[Row]:
        return await self._run(lambda: self._outbox.pending(limit))

    async def mark_sent(self, ids: Sequence[str]) -> int:
        ids = tuple(ids)
        return await self._run(lambda: self._outbox.mark_sent(ids))

    def depth(self) -> int:
        return self._outbox.depth()

    async def contains(self, id: str) -> bool:
        return await self._run(lambda: self._outbox.contains(id))

    async def prune(self, older_than_s: float) -> int:
        return await self._run(lambda: self._outbox.prune(older_than_s))

    async def close(self) -> None:
        await self._run(self._outbox.close)
        self._pool.shutdown(wait=True)
