"""What every source's transport reads: ``deliver``, its counters, what it is built from.

A transport (``handlers/<name>/transport.py``) fetches raw payloads, hands them to its parser
and acks only after intake says so. It knows its wire (SQS, IMDS, Pub/Sub, the metadata
server, a Kubernetes watch, a Kafka topic) and nothing of the runbook. Each hands every payload
to ``deliver`` (parse, count, admit) and settles its message as the answer says: it acks,
deletes or commits only when every admission allows it (``Delivered.settled``). Its
``build(entry, supplies)`` gets ``Supplies`` and returns a ``Source``.

This module imports no source (each transport passes its own parser) and no client library.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Protocol

from reclaimd import logs
from reclaimd.backoff import Backoff
from reclaimd.handlers.base import Parser
from reclaimd.intake import Admission
from reclaimd.model import Ignored, Notice, ParseError, Windows, utcnow

if TYPE_CHECKING:
    from reclaimd.cluster.apiserver import ApiServer
    from reclaimd.config import Settings

log = logging.getLogger(__name__)

# Deaf: this many receives in a row failed, and none succeeded for this long (or since the
# source started): a few rounds of its retries, not one blip. /readyz then names the source.
DEAF_AFTER_FAILURES = 3
DEAF_AFTER_S = 15.0

Admit = Callable[[Notice], Awaitable[Admission]]


async def poll_forever(
    poll_once: Callable[[], Awaitable[object]],
    *,
    interval_s: float,
    max_backoff_s: float,
    counters: Counters,
    what: str,
    errors: tuple[type[Exception], ...] = (Exception,),
) -> None:
    """A node agent's loop: ``poll_once`` every ``interval_s`` (jittered, so a pool's agents
    do not poll in step); after a failure in ``errors``, counted and logged, again on the
    backoff (never longer than ``max_backoff_s``: a window may be 30 s)."""
    backoff = Backoff(interval_s, max(interval_s, max_backoff_s), floor_s=interval_s / 2)
    while True:
        try:
            await poll_once()
        except errors as e:
            counters.transport_errors += 1
            counters.failed(f"{type(e).__name__}: {e}")
            logs.event(log, f"{what} poll failed", logging.WARNING,
                       error=f"{type(e).__name__}: {e}"[:200])  # fmt: skip
            await backoff.sleep()
            continue
        counters.heard()
        backoff.reset()
        await asyncio.sleep(interval_s * random.uniform(0.8, 1.2))


async def admit_or_retry(admit: Admit, notice: Notice) -> Admission:
    """An admission that raised is one to retry: a source must not die of one bad notice."""
    try:
        return await admit(notice)
    except Exception as e:
        logs.event(
            log, "admission failed", logging.WARNING, notice_id=notice.id, error=str(e)[:200]
        )
        return Admission.RETRY


@dataclass
class Counters:
    """What a transport saw; the metrics module exports these."""

    received: int = 0
    notices: int = 0
    ignored: int = 0
    parse_errors: int = 0
    acked: int = 0
    left_for_redelivery: int = 0
    transport_errors: int = 0
    released: int = 0  # unsettled messages handed back at once because the source stopped
    by_admission: dict[str, int] = field(default_factory=dict)
    # Hearing: the wall-clock time of the last receive that worked (a long poll that returned,
    # a fetch, a stream that stayed open; 0: none yet), the receives failed since, the last
    # failure, and when the source last heard (monotonic; at first, when it was made).
    last_receive: float = 0.0
    failures: int = 0
    problem: str = ""
    _ok_at: float = field(default_factory=time.monotonic, repr=False)

    def admitted(self, admission: Admission) -> None:
        self.by_admission[admission.value] = self.by_admission.get(admission.value, 0) + 1

    def heard(self) -> None:
        """A receive worked: whatever it returned, the source can hear."""
        self.last_receive, self._ok_at = time.time(), time.monotonic()
        self.failures, self.problem = 0, ""

    def failed(self, problem: str) -> None:
        """A receive failed (the queue, subscription or topic refused or unreachable)."""
        self.failures += 1
        self.problem = problem[:200]

    def failing_s(self, now: float | None = None) -> float:
        """How long the source has failed to receive (0 while its last receive worked)."""
        if not self.failures:
            return 0.0
        return max(0.0, (time.monotonic() if now is None else now) - self._ok_at)

    def deaf(self, now: float | None = None) -> bool:
        """Failed for longer than a few rounds: what /readyz and ``transport_deaf`` say."""
        return self.failures >= DEAF_AFTER_FAILURES and self.failing_s(now) >= DEAF_AFTER_S


class Read(StrEnum):
    """What a payload turned out to be."""

    UNREADABLE = "unreadable"  # a parse error: redelivery cannot fix it
    IGNORED = "ignored"  # readable, but no notice (another event type, a non-terminal state)
    NOTICES = "notices"


@dataclass(frozen=True)
class Delivered:
    """One payload's fate: what it was, and each admitted notice with its admission."""

    read: Read
    admitted: tuple[tuple[Notice, Admission], ...] = ()
    skipped: tuple[Notice, ...] = ()  # notices ``admit_only`` left out
    reason: str = ""  # the parse error or why it was ignored

    @property
    def settled(self) -> bool:
        """The message may be acked, deleted or committed: every admission allows it."""
        return all(a.ack for _, a in self.admitted)

    @property
    def unsettled(self) -> list[Notice]:
        """The notices whose admission says retry (their claim was not stored)."""
        return [n for n, a in self.admitted if not a.ack]


async def admit_all(admit: Admit, notices: Iterable[Notice], counters: Counters) -> list[Admission]:
    """Admit each notice in order (a raise is a retry) and count every admission."""
    admissions = []
    for notice in notices:
        admission = await admit_or_retry(admit, notice)
        counters.admitted(admission)
        admissions.append(admission)
    return admissions


async def deliver(
    parser: Parser,
    payload: bytes,
    *,
    admit: Admit,
    windows: Windows,
    counters: Counters,
    what: str,
    admit_only: Callable[[Notice], bool] | None = None,
    **context: Any,
) -> Delivered:
    """Parse ``payload`` with the source's ``parser``, count what it is, admit its notices.

    The one delivery step of every transport. ``what`` names the payload in logs
    ("sqs message", "kafka record"); ``context`` adds fields to those lines. ``admit_only``
    selects the notices to admit (a watch that remembers what it admitted); the others are
    counted as notices but neither admitted nor in ``admissions``.
    """
    counters.received += 1
    try:
        outcome = parser(payload, received_at=utcnow(), windows=windows)
    except ParseError as e:
        counters.parse_errors += 1
        logs.event(log, f"{what} unreadable", logging.WARNING, error=str(e), **context)
        return Delivered(Read.UNREADABLE, reason=str(e))
    if isinstance(outcome, Ignored):
        counters.ignored += 1
        logs.event(log, f"{what} ignored", logging.DEBUG, reason=outcome.reason, **context)
        return Delivered(Read.IGNORED, reason=outcome.reason)
    counters.notices += len(outcome)
    chosen = [n for n in outcome if admit_only is None or admit_only(n)]
    skipped = tuple(n for n in outcome if admit_only is not None and not admit_only(n))
    admissions = await admit_all(admit, chosen, counters)
    return Delivered(Read.NOTICES, tuple(zip(chosen, admissions, strict=True)), skipped)


class Source(Protocol):
    """A running transport: ``run()`` until cancelled, and what it saw."""

    @property
    def counters(self) -> Counters: ...

    async def run(self) -> None: ...


@dataclass(frozen=True)
class Supplies:
    """What a transport's ``build`` gets: the settings, the intake's ``admit``, the windows and
    the clients it may use."""

    settings: Settings
    admit: Admit
    windows: Windows
    api: ApiServer | None = None  # the API server (Kueue watches Workloads through it)
    limiter: Any = None  # the write budget (Pub/Sub slot Leases are written through it)
    dead: Callable[[str], bool] | None = None  # a holder the peer probe found dead
