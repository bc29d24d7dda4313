"""The cluster cache's GPU pods on the replica's own disk, for the next process on it.

A process starts knowing only what its first LIST returns. A pod deleted while no replica ran
(Kueue deletes a reclaimed Workload's pods itself, within seconds) is then unknown to
everyone, and a notice for its gang finds no gang: nothing is charged. The cache therefore
writes the pods it holds, and those it saw leave, to a file next to the ledger's outbox every
few seconds; a process restarted on that disk reads it back and counts every pod in it that the
LIST no longer returns as gone when it started (``ClusterCache.start``). A fresh disk knows
nothing, as before.

One line per pod: ``{"gone": <ISO time or null>, "pod": <base64 of the cache's compressed
slim pod>}``, after a header line ``{"format": 1, "written": <ISO time>}``. Written to a
temporary file and renamed, so a crash mid-write leaves the previous snapshot. A file that is
missing, of another format or damaged is ignored (logged): the snapshot only ever adds to what
the LIST says.

``write`` and ``read`` are the file; ``PodSnapshot`` is what the cache does with it: restore the
last process's pods into its indexes at start, and write them out when they changed.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
import os
import zlib
from collections.abc import Iterable
from datetime import datetime, timedelta
from pathlib import Path

from reclaimd import logs
from reclaimd.cluster.indexes import Indexes, pod_record
from reclaimd.model import utcnow

log = logging.getLogger(__name__)

FORMAT = 1
# The snapshot keeps the pods that left this recently: a notice older than that is past any
# window plus policy.expired_after_s, and needs none of them.
SNAPSHOT_GONE_FOR = timedelta(minutes=15)
Row = tuple[datetime | None, bytes]  # (when the pod left, or None: still there; its blob)


def write(path: Path, rows: Iterable[Row]) -> int:
    """Replace the snapshot at ``path`` with ``rows``; the number written. Blocking I/O."""
    tmp = path.with_name(path.name + ".tmp")
    path.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    with tmp.open("w", encoding="ascii") as out:
        out.write(json.dumps({"format": FORMAT, "written": utcnow().isoformat()}) + "\n")
        for gone, blob in rows:
            line = {"gone": gone.isoformat() if gone else None, "pod": base64.b64encode(blob)}
            out.write(json.dumps(line, default=bytes.decode) + "\n")
            count += 1
    os.replace(tmp, path)
    return count


def read(path: Path) -> list[Row]:
    """The rows of the snapshot at ``path`` as written (``ClusterCache`` writes the departed
    pods oldest first, then the pods it holds); [] if there is none."""
    try:
        lines = path.read_text(encoding="ascii").splitlines()
    except FileNotFoundError:
        return []
    except (OSError, UnicodeDecodeError) as e:
        logs.event(log, "pod snapshot unreadable", logging.WARNING, path=str(path), error=str(e))
        return []
    try:
        head = json.loads(lines[0]) if lines else {}
        if head.get("format") != FORMAT:
            raise ValueError(f"format {head.get('format')!r}, not {FORMAT}")
        rows = [_row(json.loads(line)) for line in lines[1:]]
    except (ValueError, KeyError, TypeError, binascii.Error) as e:
        logs.event(log, "pod snapshot ignored", logging.WARNING, path=str(path), error=str(e))
        return []
    return rows


def _row(line: dict[str, object]) -> Row:
    gone = line["gone"]
    at = datetime.fromisoformat(gone) if isinstance(gone, str) else None
    return at, base64.b64decode(str(line["pod"]), validate=True)


class PodSnapshot:
    """The cache's pods at ``path``: read back into its indexes once, written when changed."""

    def __init__(self, path: Path | None, indexes: Indexes) -> None:
        self.path = path  # None: nowhere (a dry run)
        self._idx = indexes
        self._written = 0  # ``indexes.changes`` as of the last snapshot written

    def restore(self) -> None:
        """The last process's pods, from this disk, as gone now: the first LIST brings back
        those still there, and the rest left while no process here watched."""
        path = self.path
        if path is None:
            return
        now, restored = utcnow(), 0
        for gone, blob in read(path):
            try:
                pod = pod_record(json.loads(zlib.decompress(blob)))
            except (zlib.error, ValueError):
                pod = None
            if pod is not None and pod.uid:
                self._idx.mark_gone(pod, gone or now)
                restored += 1
        self._written = self._idx.changes
        if restored:
            logs.event(log, "pod snapshot restored", path=str(path), pods=restored)

    async def save(self) -> None:
        """Write the snapshot if the pods changed since the last write; never raises.

        Only once the cache is synced (the caller's check): before, it holds a part."""
        path = self.path
        if path is None or self._idx.changes == self._written:
            return
        changes = self._idx.changes
        rows = self.rows(utcnow() - SNAPSHOT_GONE_FOR)
        try:
            await asyncio.to_thread(write, path, rows)
            self._written = changes
        except OSError as e:
            logs.event(log, "pod snapshot not written", logging.WARNING, error=str(e)[:200])

    def rows(self, since: datetime) -> list[Row]:
        """The pods held, and those that left after ``since``: what a successor may need."""
        idx = self._idx
        rows: list[Row] = [(at, p.blob) for at, p in idx.gone.values() if at >= since]
        rows += [(None, p.blob) for p in idx.pods.values()]
        return rows
