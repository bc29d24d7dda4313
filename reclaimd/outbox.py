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

Two columns serve the exactly-once publisher (``ledger.writer.LedgerWriter``): ``cluster`` says
whether the row also has a record in the cluster (``ledgerlog``: a peer may adopt and publish
it), and ``tried_at`` says a transaction carrying it was started, so its outcome is in doubt
until the topic is read: a crash between the broker's commit and ``mark_sent`` must not send
it twice.
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
from typing import Any, TypeVar

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
# Added after the first release: a file written before has neither column.
_COLUMNS = {
    "cluster": "ALTER TABLE outbox ADD COLUMN cluster TEXT NOT NULL DEFAULT 'none'",
    "tried_at": "ALTER TABLE outbox ADD COLUMN tried_at REAL",
}


class Cluster:
    """Where the row stands in the cluster (``ledgerlog``), the ``cluster`` column."""

    NONE = "none"  # no cluster record: only this outbox knows it
    PENDING = "pending"  # being recorded right now: not publishable yet
    HELD = "held"  # recorded, held by this writer
    UNKNOWN = "unknown"  # the record's write had no answer (or the process died during it)
    # A peer holds the record (it recorded the same event first, or adopted ours): the row
    # waits, unsent and outside ``depth``, until the record is gone (the peer published it)
    # or this writer adopts it. Never "sent" on the peer's word: a dead peer publishes nothing.
    PEER = "peer"
    ALL = frozenset({NONE, PENDING, HELD, UNKNOWN, PEER})
    WAITING = frozenset({PENDING, PEER})  # not publishable by this writer now


T = TypeVar("T")


@dataclass(frozen=True)
class Row:
    seq: int
    id: str
    key: bytes | None
    value: bytes
    headers: Headers
    cluster: str = Cluster.NONE
    tried: bool = False  # a transaction carrying it was begun: on the topic or not, unknown
    created_at: float = 0.0


def _encode_headers(headers: Iterable[tuple[str, bytes]]) -> str:
    return json.dumps([[k, base64.b64encode(v).decode()] for k, v in headers])


def _decode_headers(text: str) -> Headers:
    return tuple((str(k), base64.b64decode(v)) for k, v in json.loads(text))


_ROW = "seq, id, key, value, headers, cluster, tried_at, created_at"


def _row(r: Any) -> Row:
    seq, id_, key, value, headers, cluster, tried_at, created_at = r
    return Row(
        seq, id_, key, value, _decode_headers(headers), cluster, tried_at is not None, created_at
    )


class Outbox:
    """The table and its operations. Opening an existing file resumes its rows."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        # isolation_level=None: we issue BEGIN/COMMIT ourselves, so a put is one transaction.
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(_SCHEMA)
        have = {str(r[1]) for r in self._db.execute("PRAGMA table_info(outbox)")}
        for name, ddl in _COLUMNS.items():
            if name not in have:
                self._db.execute(ddl)
        # A put whose cluster write never finished (the process died): its outcome is unknown.
        self._db.execute(
            "UPDATE outbox SET cluster = ? WHERE cluster = ?", (Cluster.UNKNOWN, Cluster.PENDING)
        )
        (n,) = self._db.execute(
            "SELECT count(*) FROM outbox WHERE sent_at IS NULL AND cluster != ?", (Cluster.PEER,)
        ).fetchone()
        self._unsent = int(n)  # ours to publish: a peer's rows are its to publish
        self._oldest = self._oldest_unsent()  # created_at of the oldest of them

    def put(
        self,
        id: str,
        key: bytes | None,
        value: bytes,
        headers: Iterable[tuple[str, bytes]],
        cluster: str = Cluster.NONE,
    ) -> bool:
        """Store one event; ``True`` if it is new, ``False`` if the id was already there."""
        if cluster not in Cluster.ALL:
            raise ValueError(f"outbox: unknown cluster state {cluster!r}")
        now = time.time()
        with self._lock:
            cur = self._db.execute(
                "INSERT OR IGNORE INTO outbox (id, key, value, headers, created_at, cluster) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (id, key, value, _encode_headers(headers), now, cluster),
            )
            new = cur.rowcount == 1
            self._unsent += new and cluster != Cluster.PEER
            if new and cluster != Cluster.PEER and self._oldest is None:
                self._oldest = now
        return new

    def pending(self, limit: int = 100) -> list[Row]:
        """Unsent rows ready to publish (not being recorded in the cluster), oldest first."""
        with self._lock:
            rows = self._db.execute(
                f"SELECT {_ROW} FROM outbox "
                "WHERE sent_at IS NULL AND cluster NOT IN (?, ?) ORDER BY seq LIMIT ?",
                (Cluster.PENDING, Cluster.PEER, limit),
            ).fetchall()
        return [_row(r) for r in rows]

    def peers(self) -> list[str]:
        """The unsent rows a peer holds the record of (``Cluster.PEER``), oldest first."""
        with self._lock:
            rows = self._db.execute(
                "SELECT id FROM outbox WHERE sent_at IS NULL AND cluster = ? ORDER BY seq",
                (Cluster.PEER,),
            ).fetchall()
        return [str(r[0]) for r in rows]

    def get(self, id: str) -> tuple[Row, bool] | None:
        """The row of ``id`` and whether it was sent; ``None`` if this outbox never had it."""
        with self._lock:
            r = self._db.execute(
                f"SELECT {_ROW}, sent_at FROM outbox WHERE id = ?", (id,)
            ).fetchone()
        return None if r is None else (_row(r[:-1]), r[-1] is not None)

    def set_cluster(self, id: str, cluster: str) -> None:
        if cluster not in Cluster.ALL:
            raise ValueError(f"outbox: unknown cluster state {cluster!r}")
        with self._lock:
            r = self._db.execute(
                "SELECT cluster FROM outbox WHERE id = ? AND sent_at IS NULL", (id,)
            ).fetchone()
            self._db.execute("UPDATE outbox SET cluster = ? WHERE id = ?", (cluster, id))
            if r is not None:  # an unsent row moving into or out of a peer's hands
                self._unsent += (r[0] == Cluster.PEER) - (cluster == Cluster.PEER)
                if (r[0] == Cluster.PEER) != (cluster == Cluster.PEER):
                    self._oldest = self._oldest_unsent()

    def adopt(
        self, id: str, key: bytes | None, value: bytes, headers: Iterable[tuple[str, bytes]]
    ) -> None:
        """The event of a cluster record this writer adopted, not on the topic: publish it
        (``HELD``), as the record has it, whatever this outbox held under the id before (a
        copy left to the peer, or marked sent). The record's copy is the one that was decided
        first; a second charge computed here for the same id must not replace it."""
        hs = _encode_headers(headers)
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                r = self._db.execute(
                    "SELECT cluster, sent_at FROM outbox WHERE id = ?", (id,)
                ).fetchone()
                if r is None:
                    self._db.execute(
                        "INSERT INTO outbox (id, key, value, headers, created_at, cluster) "
                        "VALUES (?, ?, ?, ?, ?, ?)",
                        (id, key, value, hs, time.time(), Cluster.HELD),
                    )
                else:
                    self._db.execute(
                        "UPDATE outbox SET key = ?, value = ?, headers = ?, cluster = ?, "
                        "sent_at = NULL WHERE id = ?",
                        (key, value, hs, Cluster.HELD, id),
                    )
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
            counted = r is not None and r[1] is None and r[0] != Cluster.PEER
            self._unsent += not counted
            self._oldest = self._oldest_unsent()

    def mark_tried(self, ids: Sequence[str]) -> None:
        """A transaction carrying these rows begins: until it is known to have committed or
        not, they are in doubt (``Row.tried``). Committed before the transaction starts."""
        now = time.time()
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                for i in ids:
                    self._db.execute(
                        "UPDATE outbox SET tried_at = ? WHERE id = ? AND tried_at IS NULL",
                        (now, i),
                    )
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

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
                        "UPDATE outbox SET sent_at = ? WHERE id = ? AND sent_at IS NULL "
                        "AND cluster != ?",
                        (now, i, Cluster.PEER),
                    ).rowcount
                    for i in ids
                )
                # A peer's row, settled (the peer published it): not in ``depth``.
                for i in ids:
                    self._db.execute(
                        "UPDATE outbox SET sent_at = ? WHERE id = ? AND sent_at IS NULL",
                        (now, i),
                    )
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
            self._unsent -= changed
            self._oldest = self._oldest_unsent()
        return changed

    def depth(self) -> int:
        """How many events wait to be published."""
        return self._unsent

    def oldest_age_s(self) -> float:
        """How long the oldest event waiting to be published has waited (0: none waits)."""
        oldest = self._oldest
        return 0.0 if oldest is None else max(0.0, time.time() - oldest)

    def _oldest_unsent(self) -> float | None:
        (t,) = self._db.execute(
            "SELECT min(created_at) FROM outbox WHERE sent_at IS NULL AND cluster != ?",
            (Cluster.PEER,),
        ).fetchone()
        return None if t is None else float(t)

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
        self,
        id: str,
        key: bytes | None,
        value: bytes,
        headers: Iterable[tuple[str, bytes]],
        cluster: str = Cluster.NONE,
    ) -> bool:
        hs = tuple(headers)
        return await self._run(lambda: self._outbox.put(id, key, value, hs, cluster))

    async def get(self, id: str) -> tuple[Row, bool] | None:
        return await self._run(lambda: self._outbox.get(id))

    async def set_cluster(self, id: str, cluster: str) -> None:
        await self._run(lambda: self._outbox.set_cluster(id, cluster))

    async def adopt(
        self, id: str, key: bytes | None, value: bytes, headers: Iterable[tuple[str, bytes]]
    ) -> None:
        hs = tuple(headers)
        await self._run(lambda: self._outbox.adopt(id, key, value, hs))

    async def peers(self) -> list[str]:
        return await self._run(self._outbox.peers)

    async def mark_tried(self, ids: Sequence[str]) -> None:
        ids = tuple(ids)
        await self._run(lambda: self._outbox.mark_tried(ids))

    async def pending(self, limit: int = 100) -> list[Row]:
        return await self._run(lambda: self._outbox.pending(limit))

    async def mark_sent(self, ids: Sequence[str]) -> int:
        ids = tuple(ids)
        return await self._run(lambda: self._outbox.mark_sent(ids))

    def depth(self) -> int:
        return self._outbox.depth()

    def oldest_age_s(self) -> float:
        return self._outbox.oldest_age_s()

    async def contains(self, id: str) -> bool:
        return await self._run(lambda: self._outbox.contains(id))

    async def prune(self, older_than_s: float) -> int:
        return await self._run(lambda: self._outbox.prune(older_than_s))

    async def close(self) -> None:
        await self._run(self._outbox.close)
        self._pool.shutdown(wait=True)
