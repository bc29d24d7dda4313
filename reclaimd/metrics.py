"""Prometheus metrics of one reclaimd process, served with ``/healthz`` and ``/readyz``.

Two kinds of series, on a registry of the process's own (never the global one, so several
daemons can share a test process):

* **Observed**: counters and histograms fed as things happen. ``observe_admission`` sees every
  notice a transport hands to intake (it fits ``Intake(on_admission=...)``); ``observe_report``
  sees every notice the runbook finished (it fits ``Runbook(on_report=...)``): the latency of
  each step from receipt, deadline misses and margins, checkpoint acks and outcomes, evictions,
  and restart-waste GPU-seconds by cost label.
* **Bound**: numbers other parts already keep (the ledger's outbox and publisher, guarded
  PutObject, the Kubernetes write limiter, each transport's ``Counters``, the scheduler's
  depth) are read when Prometheus scrapes, through ``bind``. Those parts stay free of
  prometheus-client, and a scrape always sees their current value.

Every label value is bounded: enums as they are (kind, admission, step, outcome), a notice
source folded to its handler's name (a Kafka producer's own source becomes ``kafka``), cost
labels through the ledger's ``LabelPolicy`` (allowlist, length, charset), and each free-form
label capped at a number of distinct values per process, after which new values count as
``other`` (and ``reclaimd_metric_label_overflow_total`` says so). Names and labels are listed
in ``docs/metrics.md``.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from aiohttp import web
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
)
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from reclaimd import __version__, logs
from reclaimd.checkpoint import NOT_OPTED_IN
from reclaimd.ledger.labels import DEFAULT_ALLOW, LabelPolicy
from reclaimd.model import Notice, RankAck
from reclaimd.pipeline import Report
from reclaimd.sources import origin_of

if TYPE_CHECKING:
    from reclaimd.sourcing import Slot

log = logging.getLogger(__name__)

PREFIX = "reclaimd"
COST_LABELS = ("tenant", "queue", "sku", "cell", "purchase_option")
# The report's marks, in runbook order; each is measured from the notice's receipt.
STEPS = ("claimed", "cordoned", "resolved", "signaled", "drained", "recorded")  # cordon: the claim
# From milliseconds (a claim) to past the longest window (EC2's 120 s): where the answers are.
LATENCY_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0,
    90.0, 120.0, 180.0, 300.0,
)  # fmt: skip
MAX_VALUES_PER_LABEL = 100
OTHER = "other"
_SOURCE = re.compile(r"[a-z0-9]+(?:[._-][a-z0-9]+){0,5}")
_WORD = re.compile(r"[A-Za-z0-9_.-]{1,40}")


# --- bounded label values -----------------------------------------------------------------


class BoundedLabels:
    """Caps the distinct values each label takes in this process; the rest become ``other``."""

    def __init__(self, overflow: Counter, limit: int = MAX_VALUES_PER_LABEL) -> None:
        self._seen: dict[str, set[str]] = {}
        self._limit = limit
        self._overflow = overflow

    def __call__(self, label: str, value: str) -> str:
        seen = self._seen.setdefault(label, set())
        if value in seen or value == "":
            return value
        if len(seen) >= self._limit:
            self._overflow.labels(label).inc()
            return OTHER
        seen.add(value)
        return value


def source_label(source: str) -> str:
    """A notice source as a label value: the handler's name, never a producer's free text."""
    if label := origin_of(source).label:
        return label  # what follows the source's prefix is the producer's to choose
    return source if len(source) <= 40 and _SOURCE.fullmatch(source) else OTHER


def word(value: str) -> str:
    """An outcome word from code (an eviction result, ...) as a label value."""
    return value if _WORD.fullmatch(value) else OTHER


def rank_result(ack: RankAck) -> str:
    if ack.acked:
        return "durable" if ack.durable else "not_durable"
    return "not_opted_in" if ack.error == NOT_OPTED_IN else "no_ack"


# --- what ``bind`` reads --------------------------------------------------------------------


class LedgerStats(Protocol):
    """What ``ledger.LedgerWriter`` counts."""

    @property
    def published(self) -> int: ...
    @property
    def publish_errors(self) -> int: ...
    def depth(self) -> int: ...
    def oldest_age_s(self) -> float: ...


class RunbookStats(Protocol):
    """What ``pipeline.Runbook`` counts: notices taken over from a replica that stopped
    renewing its claims, and notices this replica stopped acting on because a peer holds them
    now (a fence said so)."""

    @property
    def taken_over(self) -> int: ...
    @property
    def fenced(self) -> int: ...


class MeterStats(Protocol):
    """What ``meter.Meter`` counts: hours it metered, closed (their rows in the outbox)."""

    @property
    def hours_closed(self) -> int: ...
    @property
    def last_closed_hour_end(self) -> float: ...


class RestartStats(Protocol):
    """What ``restarts.RestartWatcher`` counts."""

    @property
    def looks(self) -> int: ...
    @property
    def recorded(self) -> int: ...


class PutStats(Protocol):
    """``objectstore.GuardedPut``: ``counters()`` sums its identities' ``PutCounters``."""

    def counters(self, identity: str | None = None) -> Any: ...


# PutCounters field -> (metric name, help).
_PUT_FIELDS = {
    "puts": ("objectstore_put_requests", "PutObject requests that passed the prefix scope"),
    "attempts": ("objectstore_put_attempts", "PutObject calls made, first tries and retries"),
    "succeeded": ("objectstore_put_succeeded", "PutObject requests that stored their object"),
    "failed": ("objectstore_put_failures", "PutObject requests that failed for good"),
    "throttled_waits": (
        "objectstore_put_throttled",
        "PutObject attempts that waited for the identity's token bucket",
    ),
    "retries": ("objectstore_put_retries", "PutObject retries (after 503 SlowDown and the like)"),
    "budget_refused": (
        "objectstore_put_retry_budget_refused",
        "PutObject retries refused by the retry budget",
    ),
    "deadline_giveups": (
        "objectstore_put_deadline_giveups",
        "PutObject requests given up because the next try would outlive the deadline",
    ),
    "scope_refused": (
        "objectstore_put_scope_refused",
        "PutObject requests refused for a key outside the identity's prefixes",
    ),
}
# transports.Counters field -> (metric name, help); by_admission is its own family.
_TRANSPORT_FIELDS = {
    "received": ("transport_received", "messages received"),
    "notices": ("transport_notices", "notices parsed from received messages"),
    "ignored": ("transport_ignored", "messages that are no notice (test events, other types)"),
    "parse_errors": ("transport_parse_errors", "messages that could not be read"),
    "acked": ("transport_acked", "messages acked, deleted or committed"),
    "left_for_redelivery": (
        "transport_redeliveries",
        "messages left for redelivery because a notice in them could not be claimed",
    ),
    "transport_errors": ("transport_errors", "errors talking to the transport"),
    "released": (
        "transport_released",
        "unsettled messages handed back at once (nack, visibility 0) as the source stopped",
    ),
}


@dataclass
class _Bound:
    ledger: LedgerStats | None = None
    label_drops: Callable[[], Mapping[str, int]] | None = None
    puts: PutStats | None = None
    kube_waiting: Callable[[], int] | None = None
    kube_throttled: Callable[[], int] | None = None
    transports: Mapping[str, Any] | None = None
    scheduler_depth: Callable[[], int] | None = None
    slots: Mapping[str, Slot] | None = None
    restarts: RestartStats | None = None
    runbook: RunbookStats | None = None
    meter: MeterStats | None = None


class _BoundCollector(Collector):
    """Reads the bound parts at scrape time."""

    def __init__(self, bound: _Bound) -> None:
        self.bound = bound

    def collect(self) -> Iterator[Metric]:
        b = self.bound
        if b.ledger is not None:
            yield _gauge("ledger_outbox_depth", "events waiting for Kafka's ack", b.ledger.depth())
            yield _counter("ledger_published", "events Kafka acked (acks=all)", b.ledger.published)
            yield _counter(
                "ledger_publish_failures",
                "failed attempts to publish a batch of ledger events (retried)",
                b.ledger.publish_errors,
            )
            yield _gauge(
                "ledger_outbox_oldest_age_seconds",
                "how long the oldest event waiting for Kafka's ack has waited (0: none waits)",
                b.ledger.oldest_age_s(),
            )
        if b.label_drops is not None:
            family = CounterMetricFamily(
                f"{PREFIX}_ledger_labels_dropped",
                "cost labels kept out of ledger events, by reason (refused_key, bad_value)",
                labels=["reason"],
            )
            for reason, n in sorted(b.label_drops().items()):
                family.add_metric([word(reason)], n)
            yield family
        if b.puts is not None:
            counters = b.puts.counters()
            for name, (metric, help_) in _PUT_FIELDS.items():
                yield _counter(metric, help_, getattr(counters, name, 0))
        if b.kube_waiting is not None:
            yield _gauge(
                "kube_writes_waiting",
                "Kubernetes writes queued behind the client-side rate limiter",
                b.kube_waiting(),
            )
        if b.kube_throttled is not None:
            yield _counter(
                "kube_writes_throttled",
                "Kubernetes writes that waited for the client-side rate limiter",
                b.kube_throttled(),
            )
        if b.transports:
            yield from _transport_families(b.transports)
        if b.scheduler_depth is not None:
            yield _gauge("scheduler_depth", "notices queued or being handled", b.scheduler_depth())
        for name, slot in (b.slots or {}).items():
            yield _gauge(f"{name}_slot", slot.help, slot.held())
        if b.restarts is not None:
            yield _counter(
                "restart_looks",
                "looks the restart watcher finished at the charged gangs (a failed one is not)",
                b.restarts.looks,
            )
            yield _counter(
                "restart_overhead_events",
                "restart-overhead events recorded (one per gang and notice)",
                b.restarts.recorded,
            )
        if b.runbook is not None:
            yield _counter(
                "notices_taken_over",
                "notices taken over from a replica that stopped renewing its claim",
                b.runbook.taken_over,
            )
            yield _counter(
                "notices_fenced",
                "notices this replica stopped acting on: a fence found a peer holds them now",
                b.runbook.fenced,
            )
        if b.meter is not None:
            yield _counter(
                "meter_hours_closed",
                "hours the allocation meter metered and closed (their rows in the outbox)",
                b.meter.hours_closed,
            )
            yield _gauge(
                "meter_last_closed_hour_end_timestamp_seconds",
                "the end of the newest hour the meter closed (at start: the hour it started in)",
                b.meter.last_closed_hour_end,
            )


def _transport_families(transports: Mapping[str, Any]) -> Iterator[Metric]:
    for name, (metric, help_) in _TRANSPORT_FIELDS.items():
        family = CounterMetricFamily(f"{PREFIX}_{metric}", help_, labels=["transport"])
        for transport, counters in sorted(transports.items()):
            family.add_metric([word(transport)], getattr(counters, name, 0))
        yield family
    admissions = CounterMetricFamily(
        f"{PREFIX}_transport_admissions",
        "notices admitted by intake, by transport and admission",
        labels=["transport", "admission"],
    )
    for transport, counters in sorted(transports.items()):
        for admission, n in sorted(getattr(counters, "by_admission", {}).items()):
            admissions.add_metric([word(transport), word(admission)], n)
    yield admissions
    for metric, help_, read in _HEARING:
        hearing = GaugeMetricFamily(f"{PREFIX}_{metric}", help_, labels=["transport"])
        for transport, counters in sorted(transports.items()):
            hearing.add_metric([word(transport)], float(read(counters)))
        yield hearing


# Whether a transport can hear (transports.Counters): gauges, read at scrape time.
_HEARING: tuple[tuple[str, str, Callable[[Any], float]], ...] = (
    ("transport_last_receive_timestamp_seconds",
     "when a receive last worked (Unix time; 0: none yet)", lambda c: c.last_receive),
    ("transport_failing_seconds",
     "how long receives have failed (0: the last one worked)", lambda c: c.failing_s()),
    ("transport_deaf", "1 while receives have failed for longer than a few rounds (a central"
     " source's /readyz then names it)", lambda c: c.deaf()),
)  # fmt: skip


def _gauge(name: str, help_: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"{PREFIX}_{name}", help_, value=value)


def _counter(name: str, help_: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(f"{PREFIX}_{name}", help_, value=value)


# --- the metrics ----------------------------------------------------------------------------


class Metrics:
    """Every series of one process; ``registry`` is a fresh one unless given."""

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        label_policy: LabelPolicy | None = None,
        max_values_per_label: int = MAX_VALUES_PER_LABEL,
    ) -> None:
        if registry is None:
            registry = CollectorRegistry()
            ProcessCollector(registry=registry)
            PlatformCollector(registry=registry)
        self.registry = registry
        # Its own policy object: the ledger's counts what the ledger drops, not what we do.
        self.policy = LabelPolicy(label_policy.allowed if label_policy else DEFAULT_ALLOW)
        r = registry
        p = PREFIX
        Gauge(f"{p}_build_info", "reclaimd's version", ["version"], registry=r).labels(
            __version__
        ).set(1)
        self.label_overflow = Counter(
            f"{p}_metric_label_overflow",
            "label values counted as 'other' because a label had too many distinct values",
            ["label"],
            registry=r,
        )
        self.bounded = BoundedLabels(self.label_overflow, max_values_per_label)
        self.admitted = Counter(
            f"{p}_notices_admitted",
            "notices a transport handed to intake, by source, kind and admission",
            ["source", "kind", "admission"],
            registry=r,
        )
        self.handled = Counter(
            f"{p}_notices_handled",
            "notices the runbook finished, by source, kind and response",
            ["source", "kind", "response"],
            registry=r,
        )
        self.receipt_lag = Histogram(
            f"{p}_notice_receipt_lag_seconds",
            "from the provider's notice time to its receipt (the transport's share of the window)",
            ["source"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.step = Histogram(
            f"{p}_notice_step_seconds",
            "from a notice's receipt to the end of a runbook step",
            ["source", "step"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.misses = Counter(
            f"{p}_deadline_misses",
            "notices whose gangs did not all stop before the deadline",
            ["source", "kind"],
            registry=r,
        )
        self.margin = Histogram(
            f"{p}_deadline_margin_seconds",
            "time left before the deadline when the last pod of a notice stopped (0 if late)",
            ["source"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.rank_acks = Counter(
            f"{p}_checkpoint_rank_acks",
            "ranks asked to checkpoint, by result (durable, not_durable, no_ack, not_opted_in)",
            ["result"],
            registry=r,
        )
        self.ack_latency = Histogram(
            f"{p}_checkpoint_ack_seconds",
            "from the checkpoint request to a rank's ack",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.outcomes = Counter(
            f"{p}_checkpoint_outcomes",
            "gangs charged after a notice, by checkpoint outcome",
            ["outcome"],
            registry=r,
        )
        self.evictions = Counter(
            f"{p}_evictions", "pods drained, by outcome", ["outcome"], registry=r
        )
        self.waste_events = Counter(
            f"{p}_restart_waste_events",
            "restart-waste events recorded (one per gang and notice), by deadline met",
            ["deadline_met"],
            registry=r,
        )
        self.waste = Counter(
            f"{p}_restart_waste_gpu_seconds",
            "GPU-seconds lost since the last durable checkpoint, by cost label",
            list(COST_LABELS),
            registry=r,
        )
        self._bound = _Bound()
        r.register(_BoundCollector(self._bound))

    # --- observed -------------------------------------------------------------------------

    def observe_admission(self, notice: Notice, admission: str) -> None:
        self.admitted.labels(source_label(notice.source), notice.kind.value, str(admission)).inc()

    def observe_report(self, report: Report) -> None:
        notice = report.notice
        source = source_label(notice.source)
        self.handled.labels(source, notice.kind.value, notice.response.value).inc()
        self.receipt_lag.labels(source).observe(
            max(0.0, _seconds(notice.issued_at, notice.received_at))
        )
        received = report.times.get("received", notice.received_at)
        for step in STEPS:
            at = report.times.get(step)
            if at is not None:
                self.step.labels(source, step).observe(max(0.0, _seconds(received, at)))
        if report.wastes and not report.deadline_met:
            self.misses.labels(source, notice.kind.value).inc()
        drained = report.times.get("drained")
        if notice.deadline is not None and drained is not None:
            self.margin.labels(source).observe(max(0.0, _seconds(drained, notice.deadline)))
        for acks in report.acks.values():
            for ack in acks:
                self.rank_acks.labels(rank_result(ack)).inc()
                if ack.acked and ack.latency_s > 0:
                    self.ack_latency.observe(ack.latency_s)
        for outcome in report.evictions.values():
            self.evictions.labels(self.bounded("eviction", word(outcome))).inc()
        for w in report.wastes:
            self.outcomes.labels(w.outcome.value).inc()
            self.waste_events.labels(str(w.deadline_met).lower()).inc()
            tags = self.policy.tags(w.gang.labels)
            values = [self.bounded(k, tags.get(k, "")) for k in COST_LABELS]
            self.waste.labels(*values).inc(max(0.0, w.gpu_seconds_lost))

    # --- bound ----------------------------------------------------------------------------

    def bind(
        self,
        *,
        ledger: LedgerStats | None = None,
        label_drops: Callable[[], Mapping[str, int]] | None = None,
        puts: PutStats | None = None,
        kube_waiting: Callable[[], int] | None = None,
        kube_throttled: Callable[[], int] | None = None,
        transports: Mapping[str, Any] | None = None,
        scheduler_depth: Callable[[], int] | None = None,
        slots: Mapping[str, Slot] | None = None,
        restarts: RestartStats | None = None,
        runbook: RunbookStats | None = None,
        meter: MeterStats | None = None,
    ) -> None:
        """Read these at scrape time; a part bound again replaces the earlier one.

        ``transports`` maps a transport's name (sqs, pubsub, ...) to its ``Counters``;
        ``slots`` a source's name to the slot it holds (``reclaimd_<name>_slot``).
        """
        given = {
            "ledger": ledger,
            "label_drops": label_drops,
            "puts": puts,
            "kube_waiting": kube_waiting,
            "kube_throttled": kube_throttled,
            "transports": dict(transports) if transports is not None else None,
            "scheduler_depth": scheduler_depth,
            "slots": dict(slots) if slots is not None else None,
            "restarts": restarts,
            "runbook": runbook,
            "meter": meter,
        }
        for name, value in given.items():
            if value is not None:
                setattr(self._bound, name, value)

    # --- serving --------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def serve(
        self,
        port: int,
        ready: Callable[[], bool],
        *,
        host: str = "0.0.0.0",  # Prometheus scrapes the pod's IP
    ) -> AsyncIterator[int | None]:
        """``/metrics``, ``/healthz`` (the process answers) and ``/readyz`` (``ready()``) on
        ``host:port`` while the context is open; ``port`` 0 serves nothing and yields None."""
        if port == 0:
            yield None
            return
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/healthz", _healthz)
        app.router.add_get("/readyz", _readyz(ready))
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        try:
            await web.TCPSite(runner, host, port).start()
            logs.event(log, "metrics serving", port=port)
            yield port
        finally:
            await runner.cleanup()

    async def _metrics(self, request: web.Request) -> web.Response:
        encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
        body = encoder(self.registry)
        return web.Response(body=body, headers={"Content-Type": content_type})


async def _healthz(_: web.Request) -> web.Response:
    return web.Response(text="ok\n")


def _readyz(ready: Callable[[], bool]) -> Callable[[web.Request], Any]:
    async def handler(_: web.Request) -> web.Response:
        try:
            ok = ready()
        except Exception as e:  # a broken check is a "not ready", not a 500 with a traceback
            logs.event(log, "readiness check failed", logging.WARNING, error=str(e)[:200])
            ok = False
        if ok:
            return web.Response(text="ok\n")
        # The failing checks by name (health.Readiness keeps them): what a probe's event shows.
        failing = ",".join(getattr(ready, "last_failing", ()))
        text = f"not ready: {failing}\n" if failing else "not ready\n"
        return web.Response(text=text, status=503)

    return handler


def _seconds(a: datetime, b: datetime) -> float:
    return (b - a).total_seconds()
