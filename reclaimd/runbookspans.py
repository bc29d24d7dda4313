"""The spans of a notice's trace that the runbook's steps open around their work.

The claim and the cordon were made by the intake before the runbook ran: they are written
as spans of this trace afterwards, with the times the claim recorded. Each eviction and the
ledger write carry the attributes the post-mortem and the drills read. Spans are flushed
before the claim is done (and before the ledger event exists), never raising: a collector
down must not keep a claim open.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any

from opentelemetry import trace

from reclaimd import logs, tracing
from reclaimd.intake import Admitted
from reclaimd.model import Gang, Member, Notice

log = logging.getLogger(__name__)


@contextlib.contextmanager
def notice_span(
    tracer: trace.Tracer,
    admitted: Admitted,
    mark: Callable[[str, datetime], None],
    *,
    cluster: str,
    earlier: Sequence[str],
) -> Iterator[trace.Span]:
    """The notice's root span (``tracing.notice_span``), linked to ``earlier`` traces of it,
    with the claim's spans under it; a resumed or taken-over notice says so."""
    with tracing.notice_span(
        tracer, admitted.notice, cluster=cluster, receipt=admitted.receipt, earlier=earlier
    ) as root:
        if admitted.claim_times is None:
            root.set_attribute("reclaimd.resumed", True)
            if admitted.claim.took_over_from:
                root.set_attribute("reclaimd.took_over_from", admitted.claim.took_over_from)
        claim_spans(tracer, admitted, mark)
        yield root


def claim_spans(
    tracer: trace.Tracer, admitted: Admitted, mark: Callable[[str, datetime], None]
) -> None:
    """The claim (and, on a node, the cordon: the same write) as spans of this trace, each
    step marked (``Report.mark``) when it ended."""
    if admitted.claim_times is None:
        return  # resumed: the claim was made by an earlier process or a dead peer
    start, end = (tracing.ns(t) for t in admitted.claim_times)
    tracer.start_span("reclaimd.claim", start_time=start).end(end_time=end)
    mark("claimed", admitted.claim_times[1])
    if admitted.claim.cordoned:
        node = admitted.claim.node
        attributes: dict[str, Any] = {"reclaimd.claim_write": True}
        if node:
            attributes["k8s.node.name"] = node
        span = tracer.start_span("reclaimd.cordon", start_time=start, attributes=attributes)
        span.end(end_time=end)
        mark("cordoned", admitted.claim_times[1])


def evict_span(
    tracer: trace.Tracer, member: Member, gang: Gang
) -> AbstractContextManager[trace.Span]:
    """One rank's eviction, until its pod is seen gone."""
    return tracer.start_as_current_span(
        "reclaimd.evict",
        attributes={
            "k8s.namespace.name": member.namespace,
            "k8s.pod.name": member.name,
            "k8s.pod.uid": member.uid,
            "k8s.node.name": member.node,
            "reclaimd.gang": str(gang.key),
        },
    )


def ledger_span(
    tracer: trace.Tracer, topic: str, notice: Notice, gang: Gang
) -> AbstractContextManager[trace.Span]:
    """The gang's restart-waste event made (the outbox sends it later)."""
    return tracer.start_as_current_span(
        "reclaimd.ledger",
        kind=trace.SpanKind.PRODUCER,  # it creates the event; the outbox sends it later
        attributes={
            **tracing.producer_attributes("kafka", topic, 1),
            "reclaimd.gang": str(gang.key),
            "reclaimd.notice.id": notice.id,
        },
    )


async def flush(flush_spans: Callable[[], Awaitable[object]] | None) -> None:
    """``flush_spans`` (the exporter's, off the loop), logging a failure and going on."""
    if flush_spans is not None:
        try:
            await flush_spans()
        except Exception as e:  # a collector down must not keep the claim open
            logs.event(log, "spans not flushed", logging.WARNING, error=str(e)[:200])
