"""Thin transports: fetch raw payloads, hand them to a parser, ack only after intake says so.

A transport knows its wire (SQS, IMDS, Pub/Sub, the metadata server, a Kubernetes watch, a
Kafka topic) and nothing of the runbook. It calls ``admit(notice)`` for each parsed notice and
acks, deletes or commits its message only when every admission allows it.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from reclaimd import logs
from reclaimd.intake import Admission
from reclaimd.model import Notice

log = logging.getLogger(__name__)

Admit = Callable[[Notice], Awaitable[Admission]]


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
    by_admission: dict[str, int] = field(default_factory=dict)

    def admitted(self, admission: Admission) -> None:
        self.by_admission[admission.value] = self.by_admission.get(admission.value, 0) + 1
