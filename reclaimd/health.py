"""What ``/readyz`` answers for one reclaimd process.

Ready means a notice arriving now would be handled and charged: the cluster cache has synced
(a notice resolves to nodes and gangs), the ledger's outbox can be written (a restart-waste
event would not be lost) and every central source can hear (``Counters.deaf``: a check named
for the source). ``/healthz`` asks less: that the process answers at all.

Checks are cheap and synchronous, since a probe runs every few seconds; a change of the answer
is logged once, naming the checks that fail, so an operator sees why a pod left the endpoints.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path

from reclaimd import logs

log = logging.getLogger(__name__)

MIN_FREE_BYTES = 1 << 20  # SQLite needs room for its journal before it can commit an event


class Readiness:
    """All of ``checks`` pass; callable, so it fits ``Metrics.serve(ready=...)``."""

    def __init__(self, checks: Mapping[str, Callable[[], bool]]) -> None:
        self.checks = dict(checks)
        self._last: bool | None = None
        self.last_failing: tuple[str, ...] = ()  # the checks the last call found failing

    def failing(self) -> list[str]:
        out = []
        for name, check in self.checks.items():
            try:
                ok = check()
            except Exception:  # a check that breaks says "not ready", it does not crash a probe
                ok = False
            if not ok:
                out.append(name)
        return out

    def __call__(self) -> bool:
        failing = self.failing()
        self.last_failing = tuple(failing)
        ready = not failing
        if ready != self._last:
            if ready:
                logs.event(log, "ready")
            else:
                logs.event(log, "not ready", logging.WARNING, failing=",".join(failing))
            self._last = ready
        return ready


def outbox_writable(path: Path) -> Callable[[], bool]:
    """The outbox file and its directory (SQLite's journal) are writable, with room to spare."""

    def check() -> bool:
        parent = path.parent
        return (
            (not path.exists() or os.access(path, os.W_OK))
            and os.access(parent, os.W_OK)
            and shutil.disk_usage(parent).free >= MIN_FREE_BYTES
        )

    return check
