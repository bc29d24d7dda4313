"""The always-on process: wire the parts, resume open claims, run until SIGTERM.

Root tasks (cache watch, ledger publisher, scheduler workers, one task per source, the resume
loop) run in one TaskGroup: if one dies the others are cancelled and the process exits
non-zero, so the orchestrator restarts it and it resumes from the claims in the cluster
(crash-only). SIGTERM stops the sources first, gives notices in flight a grace period, then
flushes the ledger outbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import aiohttp
from opentelemetry import trace as otel

from reclaimd import checkpoint, health, ledger, logs, metrics, tracing, waste
from reclaimd.cluster import actions, cache, claims, client, gangclaims, ratelimit
from reclaimd.config import Settings, UnknownTarget
from reclaimd.intake import Admission, Intake
from reclaimd.model import Gang, Member, Notice, ParseError, RankAck, utcnow
from reclaimd.pipeline import Budget, Report, Runbook
from reclaimd.scheduler import Scheduler

log = logging.getLogger(__name__)

STOP_GRACE_S = 20.0


class _Signaller:
    """The pipeline's ``Signaller`` over ``checkpoint.signal_gang`` with one span per rank."""

    def __init__(self, session: aiohttp.ClientSession, tracer: Any) -> None:
        self.session, self.tracer = session, tracer

    async def signal(
        self, gang: Gang, notice: Notice, *, budget_deadline: datetime
    ) -> tuple[RankAck, ...]:
        spans: dict[str, Any] = {}

        def traceparent(m: Member) -> str:
            span = self.tracer.start_span(
                "reclaimd.checkpoint.rank",
                kind=otel.SpanKind.CLIENT,  # the checkpoint request: an HTTP call to the pod
                attributes={
                    "k8s.namespace.name": m.namespace,
                    "k8s.pod.name": m.name,
                    "k8s.pod.uid": m.uid,
                    "k8s.node.name": m.node,
                    "http.request.method": "POST",
                    "reclaimd.rank": -1 if m.rank is None else m.rank,
                    "reclaimd.gang": str(gang.key),
                },
            )
            spans[m.uid] = span
            with otel.use_span(span, end_on_exit=False):
                return tracing.current_traceparent()

        def on_ack(ack: RankAck) -> None:
            span = spans.pop(ack.member.uid, None)
            if span is None:
                return
            span.set_attribute("reclaimd.acked", ack.acked)
            span.set_attribute("reclaimd.durable", ack.durable)
            if ack.step is not None:
                span.set_attribute("reclaimd.checkpoint.step", ack.step)
            if ack.error:
                span.set_attribute("reclaimd.error", ack.error[:200])
            if not ack.acked:
                span.set_status(otel.StatusCode.ERROR, ack.error[:200] or "no ack")
            span.end()

        try:
            return await checkpoint.signal_gang(
                gang,
                notice,
                budget_deadline=budget_deadline,
                session=self.session,
                traceparent=traceparent,
                on_ack=on_ack,
            )
        finally:
            for span in spans.values():  # cut short (cancelled) before the rank answered
                span.set_status(otel.StatusCode.ERROR, "checkpoint step ended before the answer")
                span.end()


class ClaimLost(RuntimeError):
    """Another holder or notice owns the object now: stop acting on this notice."""


class _Claims:
    """Intake's ``ClaimWriter`` and the runbook's ``Progress`` over the cluster claim store.

    It remembers which object each notice is claimed on, so a phase write needs no lookup.
    """

    def __init__(self, store: claims.ClaimStore, lease_s: float) -> None:
        self.store = store
        self.lease_s = lease_s
        self.objects: dict[str, claims.ClaimTarget] = {}

    @staticmethod
    def object_for(notice: Notice, node: str | None) -> claims.ClaimTarget:
        w = notice.target.workload
        if w is not None:
            return claims.WorkloadObj(w.namespace, w.name)
        assert node is not None
        return claims.NodeObj(node)

    async def claim(self, notice: Notice, node: str | None) -> Admission:
        obj = self.object_for(notice, node)
        result = await self.store.claim(obj, notice)
        admission = _ADMISSION[result.status]
        if admission in (Admission.CLAIMED, Admission.RESUMED):
            self.objects[notice.id] = obj
        return admission

    async def advance(self, notice: Notice, phase: str, **facts: Any) -> None:
        obj = self.objects.get(notice.id)
        if obj is None:
            return
        result = await self.store.advance(obj, notice.id, phase, **facts)
        if result.status is claims.AdvanceStatus.LOST:
            raise ClaimLost(f"{obj.describe()} is no longer ours for {notice.id}")
        if phase == claims.Phase.DONE:
            self.objects.pop(notice.id, None)

    async def keep_alive(self, notice: Notice) -> None:
        """Renew the lease while a long step (checkpoint wait, PDB retries) runs."""
        while True:
            await asyncio.sleep(self.lease_s / 3)
            obj = self.objects.get(notice.id)
            if obj is not None:
                with contextlib.suppress(Exception):
                    await self.store.heartbeat(obj, notice.id)


_ADMISSION = {
    claims.ClaimStatus.CLAIMED: Admission.CLAIMED,
    claims.ClaimStatus.ALREADY_OURS: Admission.RESUMED,
    claims.ClaimStatus.TAKEN_OVER: Admission.RESUMED,
    claims.ClaimStatus.DUPLICATE: Admission.DUPLICATE,
    claims.ClaimStatus.SUPERSEDED: Admission.SUPERSEDED,
    claims.ClaimStatus.TARGET_NOT_FOUND: Admission.UNKNOWN_TARGET,
}


@dataclass(frozen=True)
class _Parts:
    view: cache.ClusterCache
    store: claims.ClaimStore
    claims: _Claims
    ledger: ledger.LedgerWriter
    scheduler: Scheduler
    intake: Intake
    limiter: ratelimit.RateLimiter
    metrics: metrics.Metrics


@dataclass
class Daemon:
    """Everything one reclaimd process holds; ``run`` drives it."""

    settings: Settings
    on_report: Callable[[Report], None] | None = None
    _stopping: asyncio.Event = field(default_factory=asyncio.Event)

    def stop(self) -> None:
        """Begin a graceful stop (SIGTERM): see ``run``."""
        self._stopping.set()

    def _wire(self, api: Any, tracer: Any, session: aiohttp.ClientSession) -> _Parts:
        """Build every part from the settings; nothing runs yet."""
        s = self.settings
        limiter = ratelimit.RateLimiter(ratelimit.RateSettings(qps=s.kube.qps, burst=s.kube.burst))
        view = cache.ClusterCache(api, labeler=ledger.cost_labels)
        store = claims.ClaimStore(
            api,
            s.holder,
            limiter=limiter,
            settings=claims.ClaimSettings(lease_s=s.claim_stale_s),
        )
        claim_log = _Claims(store, s.claim_stale_s)
        writer = actions.ClusterActions(
            api,
            limiter=limiter,
            settings=actions.ActionSettings(
                policy=s.policy.eviction,
                force_before_s=s.policy.force_before_s,
                delete_grace_s=s.policy.delete_grace_s,
            ),
            pod_exists=view.pod_exists,
        )
        ledger_writer = ledger.LedgerWriter(
            bootstrap_servers=s.ledger.bootstrap,
            topic=s.ledger.topic,
            outbox_path=s.ledger.outbox_path,
            policy=ledger.LabelPolicy(allowed=s.ledger.label_allowlist),
        )

        receipts = tracing.Receipts(
            tracer,
            destinations={
                "aws_sqs": s.sqs.queue_url.rsplit("/", 1)[-1],
                "gcp_pubsub": s.pubsub.subscription,
                "kafka": s.kafka_notices.topic,
            },
        )

        observed = metrics.Metrics(label_policy=ledger_writer.policy)

        def keep(report: Report) -> None:
            observed.observe_report(report)
            if self.on_report is not None:
                self.on_report(report)

        def admitted(notice: Notice, admission: Admission) -> None:
            # A receive span and a count per admitted notice.
            receipts.on_admission(notice, admission)
            observed.observe_admission(notice, admission)

        runbook = Runbook(
            view=view,
            writer=writer,
            signaller=_Signaller(session, tracer),
            ledger=ledger_writer,
            progress=claim_log,
            gang_lock=gangclaims.GangClaims(api, s.lease_namespace, s.holder, limiter=limiter),
            budget=Budget(
                drain_reserve_s=s.policy.drain_reserve_s,
                drain_reserve_fraction=s.policy.drain_reserve_fraction,
                no_deadline_horizon_s=s.windows.default_s,
            ),
            build_waste=waste.build_restart_waste,
            tracer=tracer,
            cluster_name=s.cluster_name,
            evict_concurrency=s.policy.evict_concurrency,
            on_report=keep,
            # late-bound: the intake is built below, once the scheduler exists
            claim_times=lambda notice_id: intake.claim_times(notice_id),  # noqa: PLW0108
            receipts=receipts.context,
            ledger_topic=s.ledger.topic,
        )

        async def handle(notice: Notice) -> Report:
            alive = asyncio.create_task(claim_log.keep_alive(notice))
            try:
                return await runbook.handle(notice)
            finally:
                alive.cancel()

        scheduler = Scheduler(handle, workers=s.workers, horizon_s=s.schedule_horizon_s)
        intake = Intake(
            claims=claim_log,
            resolver=view,
            submit=scheduler.submit,
            drop_unknown=s.policy.unknown_target is UnknownTarget.DROP,
            expire_after=timedelta(seconds=s.policy.expired_after_s),
            on_admission=admitted,
        )
        return _Parts(view, store, claim_log, ledger_writer, scheduler, intake, limiter, observed)

    async def run(self, *, ready: asyncio.Event | None = None) -> None:
        s = self.settings
        provider = tracing.setup(
            service="reclaimd",
            span_file=s.tracing.span_file,
            resource_attributes={
                "k8s.cluster.name": s.cluster_name,
                "service.instance.id": s.holder,
            },
        )
        tracer = provider.get_tracer(tracing.TRACER_NAME)
        api = await client.build_api_client(str(s.kube.kubeconfig) if s.kube.kubeconfig else None)
        session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=None), raise_for_status=False
        )
        parts = self._wire(api, tracer, session)
        view, scheduler, ledger_writer = parts.view, parts.scheduler, parts.ledger
        self.intake, self.scheduler, self.ledger = parts.intake, scheduler, ledger_writer
        serving = contextlib.AsyncExitStack()
        try:
            sources_by_name = self._sources(parts.intake, api)
            observed = self.metrics = _bind_gauges(parts, sources_by_name)
            readiness = health.Readiness(
                {
                    "cache": lambda: view.synced,
                    "outbox": health.outbox_writable(s.ledger.outbox_path),
                }
            )
            # Up before the cache syncs: /healthz answers and /readyz says why not yet.
            await serving.enter_async_context(observed.serve(s.metrics_port, readiness))
            await view.start()
            if not await view.wait_synced(timeout_s=60):
                raise RuntimeError("cluster cache did not sync within 60 s")
            async with asyncio.TaskGroup() as tg:
                background = [
                    tg.create_task(ledger_writer.run(), name="ledger"),
                    tg.create_task(scheduler.run(), name="scheduler"),
                    tg.create_task(
                        self._resume_loop(parts.store, parts.claims, scheduler), name="resume"
                    ),
                ]
                sources = [
                    tg.create_task(source.run(), name=f"source-{name}")
                    for name, source in sources_by_name.items()
                ]
                logs.event(log, "reclaimd running", holder=s.holder, cluster=s.cluster_name)
                if ready is not None:
                    ready.set()
                await self._stopping.wait()
                # Take no new notices; give those in flight a grace period, then flush the
                # ledger. Whatever is cut short keeps its claim and is resumed by a peer.
                for task in sources:
                    task.cancel()
                logs.event(log, "stopping", in_flight=scheduler.depth)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(STOP_GRACE_S):
                        await scheduler.wait_idle()
                await ledger_writer.flush(timeout_s=5.0)
                for task in background:
                    task.cancel()
        finally:
            await serving.aclose()
            await session.close()
            with contextlib.suppress(Exception):
                await ledger_writer.close()
            await view.stop()
            await api.close()
            provider.shutdown()

    async def _resume_loop(
        self, store: claims.ClaimStore, claim_log: _Claims, scheduler: Scheduler
    ) -> None:
        """Resume open claims at start, then keep looking: a peer that dies mid-storm leaves
        claims whose messages are already acked, and only this scan finds them."""
        while True:
            try:
                await self._resume(store, claim_log, scheduler)
            except Exception as e:
                logs.event(log, "resume scan failed", logging.WARNING, error=str(e)[:200])
            await asyncio.sleep(claim_log.lease_s / 2)

    async def _resume(
        self, store: claims.ClaimStore, claim_log: _Claims, scheduler: Scheduler
    ) -> None:
        """Queue every open claim this holder may finish (ours, or a dead peer's)."""
        now = utcnow()
        for claim in await store.list_open():
            try:
                notice = Notice.from_json(claim.notice)
            except ParseError:
                continue  # written by a newer or broken version: leave it to its holder
            if notice.deadline is not None and notice.deadline < now:
                continue
            if claim.holder != self.settings.holder and not claim.stale(now, claim_log.lease_s):
                continue
            node = claim.target.name if isinstance(claim.target, claims.NodeObj) else None
            if await claim_log.claim(notice, node) is Admission.RESUMED:
                logs.event(log, "resuming notice", notice_id=notice.id, phase=claim.phase.value)
                await scheduler.submit(notice)

    def _sources(self, intake: Intake, api: Any) -> dict[str, Any]:
        s = self.settings
        sources: dict[str, Any] = {}
        if s.sqs.enabled:
            import boto3

            from reclaimd.transports.sqs import SqsSource

            sqs = boto3.client("sqs", region_name=s.sqs.region, endpoint_url=s.sqs.endpoint_url)
            sources["sqs"] = SqsSource(sqs, s.sqs, admit=intake.admit, windows=s.windows)
        if s.imds.enabled:
            from reclaimd.transports.imds import ImdsSource

            sources["imds"] = ImdsSource(s.imds, admit=intake.admit, windows=s.windows)
        if s.pubsub.enabled:
            from reclaimd.transports.pubsub import PubSubSource

            sources["pubsub"] = PubSubSource(s.pubsub, admit=intake.admit, windows=s.windows)
        if s.gce_metadata.enabled:
            from reclaimd.transports.gce_metadata import GceMetadataSource

            sources["gce_metadata"] = GceMetadataSource(
                s.gce_metadata, admit=intake.admit, windows=s.windows
            )
        if s.kueue.enabled:
            from reclaimd.transports.kueue import KueueSource

            sources["kueue"] = KueueSource(s.kueue, admit=intake.admit, windows=s.windows, api=api)
        if s.kafka_notices.enabled:
            from reclaimd.transports.kafka_notices import KafkaNoticeSource

            sources["kafka_notices"] = KafkaNoticeSource(
                s.kafka_notices, admit=intake.admit, windows=s.windows
            )
        return sources


def _bind_gauges(parts: _Parts, sources: dict[str, Any]) -> metrics.Metrics:
    """The parts' own counters, read at scrape time."""
    ledger_writer, scheduler, limiter = parts.ledger, parts.scheduler, parts.limiter
    parts.metrics.bind(
        ledger=ledger_writer,
        label_drops=lambda: ledger_writer.policy.dropped,
        transports={name: source.counters for name, source in sources.items()},
        scheduler_depth=lambda: scheduler.depth,
        kube_waiting=lambda: limiter.waiting,
        kube_throttled=lambda: limiter.throttled,
    )
    return parts.metrics


async def run(settings: Settings) -> int:
    """Run until SIGTERM/SIGINT; 0 on a clean stop."""
    daemon = Daemon(settings)
    task = asyncio.create_task(daemon.run())
    loop = asyncio.get_running_loop()

    def on_signal() -> None:
        # First signal: graceful stop. A second one: stop now.
        if daemon._stopping.is_set():
            task.cancel()
        daemon.stop()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    try:
        await task
        logs.event(log, "reclaimd stopped")
    except asyncio.CancelledError:
        logs.event(log, "reclaimd stopped")
        return 0
    except Exception as e:
        logs.event(log, "reclaimd failed", logging.ERROR, error="; ".join(_leaves(e))[:1000])
        return 1
    return 0


def _leaves(e: BaseException) -> list[str]:
    """One line per root cause, with the task-group wrapping taken off."""
    if isinstance(e, BaseExceptionGroup):
        return [line for sub in e.exceptions for line in _leaves(sub)]
    return [f"{type(e).__name__}: {e}"]
