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
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import os
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path

from reclaimd import logs
from reclaimd.model import utcnow

log = logging.getLogger(__name__)

FORMAT = 1
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
