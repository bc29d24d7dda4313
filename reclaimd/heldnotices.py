"""Notices received but not yet claimed, kept on the replica's own disk.

A notice whose claim cannot be written (the API server down or unreachable) stays with its
transport, which redelivers it. If the replica dies then, the copy it held comes back only
when the transport's lease on it runs out: 10 s on Pub/Sub, 10-40 s on its emulator, the
visibility timeout on SQS, a session timeout on Kafka. Against a 30 s window that can be the
whole window. So the intake writes each notice here as it starts to admit it, and forgets it
once admitted for good (claimed, a duplicate, expired, ...): a local write and a delete, on a
path where the claim is an API round trip. ``HeldSource`` admits what is here every second,
like any transport: the process restarted on this disk admits the notices its predecessor
held at once, and a live process retries them beside the transports' redeliveries (the
intake's single flight and its memory make those one admission).

A fresh disk knows nothing, and loses nothing: the transports still hold every copy.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sqlite3
from collections.abc import Awaitable, Callable
from pathlib import Path

from reclaimd import logs
from reclaimd.model import Notice, utcnow

log = logging.getLogger(__name__)

EVERY_S = 1.0  # held notices are admitted again this often


class HeldNotices:
    """A table of notices by id; every call is one small local write or read."""

    def __init__(self, path: Path | str) -> None:
        self.path = path
        if isinstance(path, Path):
            path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        # A process crash loses nothing in WAL mode; an OS crash loses the disk anyway.
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS held (id TEXT PRIMARY KEY, notice TEXT, at TEXT)"
        )
        self._ids = {str(r[0]) for r in self._db.execute("SELECT id FROM held")}

    def __len__(self) -> int:
        return len(self._ids)

    def __contains__(self, notice_id: object) -> bool:
        return notice_id in self._ids

    def hold(self, notice: Notice) -> None:
        if notice.id in self._ids:
            return
        self._db.execute(
            "INSERT OR IGNORE INTO held VALUES (?, ?, ?)",
            (notice.id, json.dumps(notice.to_json()), utcnow().isoformat()),
        )
        self._ids.add(notice.id)

    def release(self, notice_id: str) -> None:
        if notice_id in self._ids:
            self._db.execute("DELETE FROM held WHERE id = ?", (notice_id,))
            self._ids.discard(notice_id)

    def notices(self, skip: Callable[[str], bool] = lambda _: False) -> list[Notice]:
        """Every held notice but those ``skip`` names, oldest first; a row that no longer
        parses is dropped."""
        out: list[Notice] = []
        if all(skip(i) for i in self._ids):
            return out  # the common case: each one is being admitted right now
        for notice_id, text in self._db.execute("SELECT id, notice FROM held ORDER BY at"):
            if skip(str(notice_id)):
                continue
            try:
                out.append(Notice.from_json(json.loads(text)))
            except (ValueError, KeyError, TypeError) as e:
                logs.event(log, "held notice dropped", logging.WARNING, error=str(e)[:200])
                self.release(str(notice_id))
        return out

    def close(self) -> None:
        with contextlib.suppress(sqlite3.Error):
            self._db.close()


class HeldSource:
    """Admits the held notices nobody is admitting, every ``every_s`` until cancelled: a
    transport of this disk."""

    def __init__(
        self,
        held: HeldNotices,
        admit: Callable[[Notice], Awaitable[object]],
        busy: Callable[[str], bool],
        every_s: float = EVERY_S,
    ) -> None:
        self.held, self._admit, self._busy, self.every_s = held, admit, busy, every_s
        self.replayed = 0  # admissions tried from here

    async def run(self) -> None:
        told: set[str] = set()  # logged once per set of notices, not once a second
        while True:
            pending = self.held.notices(skip=self._busy)
            ids = {n.id for n in pending}
            if ids and ids != told:
                logs.event(log, "held notices admitted again", notices=len(pending))
            told = ids
            if pending:
                self.replayed += len(pending)
                # The intake decides and updates ``held``; an error is the intake's to log.
                await asyncio.gather(*(self._admit(n) for n in pending), return_exceptions=True)
            await asyncio.sleep(self.every_s)
