"""Building a process's parts from its settings (``wire``); nothing here runs them.

Every part lives in its own module; this is the one place that knows how they connect: which
part reads which, what a dry run swaps for a "would" part, where the files beside the ledger's
outbox go. ``reclaimd.daemon`` runs what ``wire`` returns.
"""

from __future__ import annotations

import asyncio
import functools
import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import aiohttp
from opentelemetry.trace import SpanContext

from reclaimd import (
    checkpoint,
    dryrun,
    heldnotices,
    ledger,
    meter,
    metrics,
    putbudget,
    restarts,
    sources,
    tracing,
    waste,
)
from reclaimd import sourcing as registry
from reclaimd.afterdrain import NoAfterDrain
from reclaimd.cluster import (
    actions,
    cache,
    claimlog,
    claims,
    events,
    gangclaims,
    holders,
    ledgerlog,
    probe,
    ratelimit,
)
from reclaimd.cluster.apiserver import ApiServer
from reclaimd.config import Settings
from reclaimd.intake import Admission, Admitted, Intake
from reclaimd.model import Notice, utcnow
from reclaimd.pipeline import Budget, Report, Runbook
from reclaimd.scheduler import GangOwners, Scheduler
from reclaimd.settings.policy import UnknownTarget

FLUSH_SPANS_MS = 2000  # a notice's trace written out before its claim is done, at most


@dataclass(frozen=True)
class Parts:
    """A process's parts, built by ``wire`` from its settings."""

    view: cache.ClusterCache
    store: claims.ClaimStore
    holders: holders.HolderLeases
    ledger: ledger.LedgerWriter
    scheduler: Scheduler[Admitted]
    intake: Intake
    limiter: ratelimit.RateLimiter
    metrics: metrics.Metrics
    gang_leases: gangclaims.GangClaims | None = None
    probe: probe.Listener | None = None  # our probe port: refused there = we are gone
    meter: meter.Meter | None = None
    restarts: restarts.RestartWatcher | None = None
    events: events.EventRecorder | None = None
    dry_run: dryrun.WouldParts | None = None  # set: nothing is written, signalled or evicted


def wire(
    s: Settings,
    api: ApiServer,
    provider: Any,
    session: aiohttp.ClientSession,
    on_report: Callable[[Report], None] | None = None,
) -> Parts:
    """Build every part from the settings; nothing runs yet."""
    tracer = provider.get_tracer(tracing.TRACER_NAME)
    limiter = ratelimit.RateLimiter(s.kube)
    view = cache.ClusterCache(
        api,
        labeler=ledger.cost_labels,
        settings=s.cache.model_copy(
            update={
                "snapshot_path": None
                if s.dry_run
                else s.cache.snapshot_path or s.ledger.beside_outbox("pods.snapshot")
            }
        ),
        url_policy=s.checkpoint.url_policy(),
    )
    pp = s.peer_probe
    listener = (
        probe.Listener(pp.host, pp.port, pp.advertise) if pp.enabled and not s.dry_run else None
    )
    group = s.peer_group or f"{s.lease_namespace}/{s.cluster_name}"
    alive = holders.HolderLeases(
        api,
        s.lease_namespace,
        s.holder,
        group=group,
        lease_s=s.claim_stale_s,
        limiter=limiter,
        probe_address=_address_of(listener),
        metrics_address=_metrics_address(s, listener),
        probe_every_s=pp.every_s,
        probe_timeout_s=pp.timeout_s,
    )
    store = claims.ClaimStore(
        api,
        s.holder,
        limiter=limiter,
        lease_s=s.claim_stale_s,
        settings=s.claims,
        liveness=alive.renewed,
        death=alive.dead,
        group=group,
    )
    writer = actions.ClusterActions(
        api,
        limiter=limiter,
        settings=s.policy,
        pod_exists=view.pod_exists,
        budget_changes=view.budget_changes,
        gone_at=view.pod_gone_at,
        only_its_gang=view.pdbs_guard_only_its_gang,
    )
    ledger_writer = ledger.LedgerWriter(
        # A dry run keeps no outbox file and reaches no broker (its writer stays empty).
        bootstrap_servers="" if s.dry_run else s.ledger.bootstrap,
        connection=s.kafka,
        topic=s.ledger.topic,
        outbox_path=":memory:" if s.dry_run else s.ledger.outbox_path,
        policy=ledger.LabelPolicy(allowed=s.ledger.label_allowlist),
        **s.ledger.writer.fields(),
        **_ledger_log(s, api, s.ledger.topic, limiter, alive),
    )
    receipts = tracing.Receipts(
        tracer,
        destinations=sources.destinations(s),
    )
    observed = metrics.Metrics(label_policy=ledger_writer.policy)
    recorder = (
        events.EventRecorder(
            api,
            limiter,
            instance=s.holder,
            settings=s.events,
        )
        if s.events.enabled and not s.dry_run
        else None
    )

    def keep(report: Report) -> None:
        observed.observe_report(report)
        if on_report is not None:
            on_report(report)

    def admitted(notice: Notice, admission: Admission) -> SpanContext | None:
        observed.observe_admission(notice, admission)
        return receipts.on_admission(notice, admission)

    # The one place a dry run differs: the parts that write or signal are "would" parts.
    would = (
        dryrun.WouldParts.build(
            view,
            s.holder,
            ledger_writer.policy,
            lease_s=s.claim_stale_s,
            eviction_policy=str(s.policy.eviction),
        )
        if s.dry_run
        else None
    )
    # One claim log: the intake writes the claims, the runbook marks them done.
    claim_log = (
        claimlog.ClaimLog(store, view, unbroken_since=alive.unbroken_since)
        if would is None
        else would.claim_log
    )
    # One Lease per gang: who charges it, and its durable record for a successor.
    gang_leases = gangclaims.GangClaims(
        api,
        s.lease_namespace,
        s.holder,
        limiter=limiter,
        peer_acks=lambda holder, label: probe.ask(alive.address(holder), label, pp.ask_s),
    )
    if listener is not None:
        listener.answer, listener.cut = gang_leases.held, alive.cut_off
    runbook = Runbook(
        view=view,
        writer=writer if would is None else would.evictor,
        signaller=(
            checkpoint.Signaller(
                session,
                tracer,
                putbudget.TenantPutBudgets(s.max_put_object_qps_per_sa),
                settings=s.checkpoint,
            )
            if would is None
            else would.signaller
        ),
        ledger=ledger_writer if would is None else would.recorder,
        progress=claim_log,
        owners=GangOwners(gang_leases if would is None else would.gang_lock),
        records=gang_leases if would is None else None,
        # A dry run never completes a lifecycle action.
        after_drain=registry.after_drain(s) if would is None else NoAfterDrain(),
        budget=Budget(
            drain_reserve_s=s.policy.drain_reserve_s,
            drain_reserve_fraction=s.policy.drain_reserve_fraction,
            no_deadline_horizon_s=s.windows.default_s,
        ),
        # Each rank's waste is priced where it ran: the event names each node's instance.
        build_waste=waste.with_placements(
            lambda node: ledger.placement(view.node_labels(node), view.provider_id(node))
        ),
        tracer=tracer,
        cluster_name=s.cluster_name,
        evict_concurrency=s.policy.evict_concurrency,
        on_report=keep,
        ledger_topic=s.ledger.topic,
        narrator=events.NoticeEvents(recorder) if recorder is not None else None,
        # Off the loop: an exporter's flush blocks (a file write, an OTLP round trip).
        flush_spans=lambda: asyncio.to_thread(provider.force_flush, FLUSH_SPANS_MS),
    )
    observed.bind(runbook=runbook)  # its takeovers and fenced notices

    scheduler = Scheduler(
        runbook.handle if would is None else dryrun.acting_for(runbook.handle),
        max_in_flight=s.max_in_flight,
        horizon_s=s.schedule_horizon_s,
    )
    intake = Intake(
        claims=claim_log,
        resolver=view,
        submit=scheduler.submit,
        drop_unknown=s.policy.unknown_target is UnknownTarget.DROP,
        expire_after=timedelta(seconds=s.policy.expired_after_s),
        on_admission=admitted,
        memory=s.intake.memory,
        held=None
        if would is not None
        else heldnotices.HeldNotices(s.ledger.beside_outbox("held.sqlite")),
    )
    return Parts(
        view,
        store,
        alive,
        ledger_writer,
        scheduler,
        intake,
        limiter,
        observed,
        gang_leases=gang_leases if would is None else None,
        probe=listener,
        meter=None
        if would is not None
        else _meter(s, api, view=view, policy=ledger_writer.policy, limiter=limiter, alive=alive),
        restarts=None
        if would is not None or not s.restarts.enabled
        else restarts.RestartWatcher(
            gang_leases,
            view,
            ledger_writer,
            holder=s.holder,
            alive=alive.alive,
            cluster=s.cluster_name,
            clock=utcnow,
            first_step=functools.partial(restarts.sdk_first_step, session),
            interval_s=s.restarts.interval_s,
            sdk_wait_s=s.restarts.sdk_wait_s,
        ),
        events=recorder,
        dry_run=would,
    )


def _ledger_log(
    s: Settings,
    api: ApiServer,
    topic: str,
    limiter: ratelimit.RateLimiter,
    alive: holders.HolderLeases,
) -> dict[str, Any]:
    """What a ledger writer needs so that its unsent events survive this replica and its
    disk: a record in the cluster for each, adopted by a peer when this holder is gone."""
    if s.dry_run:
        return {}
    return {
        "holder": s.holder,
        "cluster": ledgerlog.LedgerLog(api, s.lease_namespace, s.holder, topic, limiter=limiter),
        "alive": alive.alive,
    }


def _meter(
    s: Settings,
    api: ApiServer,
    *,
    view: cache.ClusterCache,
    policy: ledger.LabelPolicy,
    limiter: ratelimit.RateLimiter,
    alive: holders.HolderLeases,
) -> meter.Meter | None:
    a = s.allocation
    if not a.enabled:
        return None
    outbox = a.outbox_path or s.ledger.beside_outbox("allocation.sqlite")
    rows = ledger.LedgerWriter(
        bootstrap_servers=s.ledger.bootstrap,
        connection=s.kafka,
        topic=a.topic,
        outbox_path=outbox,
        policy=policy,
        **_ledger_log(s, api, a.topic, limiter, alive),
    )
    lock = meter.LeaseHourLock(api, s.lease_namespace, s.holder, s.cluster_name, limiter=limiter)
    return meter.Meter(
        meter.CacheFleet(view),
        rows,
        lock,
        cluster=s.cluster_name,
        interval_s=a.interval_s,
        open_every_s=a.open_every_s,
    )


def _metrics_address(s: Settings, listener: probe.Listener | None) -> Callable[[], str]:
    """Our /metrics as the Lease names it for ``reclaimd status``: the host peers dial (the
    probe's advertised one) at ``metrics_port``, which the server binds on every interface;
    "" when metrics are off (port 0)."""
    if s.metrics_port == 0:
        return str
    host = (
        listener.advertise
        if listener is not None
        else s.peer_probe.advertise or os.environ.get("POD_IP", "") or "127.0.0.1"
    )
    address = holders.host_port(host, s.metrics_port)
    return lambda: address


def _address_of(listener: probe.Listener | None) -> Callable[[], str]:
    """Our probe address as the Lease should name it (known once the listener started)."""
    return (lambda: listener.address) if listener is not None else str
