"""Building a process's parts from its settings (``wire``); nothing here runs them.

Every part lives in its own module; this is the one place that knows how they connect: which
part reads which, where the files beside the ledger's outbox go. A dry run is one choice,
made once at the top of ``wire``: ``Live`` or ``DryRun`` builds the parts that write, signal,
keep files or hold a Lease (``Acting``); everything else is built the same way for both.
``reclaimd.daemon`` runs what ``wire`` returns and never asks which it was.
"""

from __future__ import annotations

import asyncio
import functools
import os
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, Protocol

import aiohttp
from opentelemetry.trace import SpanContext, Tracer

from reclaimd import (
    afterdrain,
    checkpoint,
    dryrun,
    handlers,
    health,
    heldnotices,
    meter,
    metrics,
    putbudget,
    restarts,
    tracing,
    waste,
)
from reclaimd.afterdrain import NoAfterDrain
from reclaimd.cluster import (
    actions,
    cache,
    cacheview,
    claimlog,
    claimstore,
    events,
    gangclaims,
    holders,
    ledgerlog,
    probe,
    ratelimit,
)
from reclaimd.cluster.apiserver import ApiServer
from reclaimd.cluster.holders import HolderLeases
from reclaimd.config import Settings
from reclaimd.handlers import running
from reclaimd.intake import Admission, Admitted, ClaimWriter, Intake
from reclaimd.ledger.labels import LabelPolicy, cost_labels, placement
from reclaimd.ledger.writer import LedgerWriter
from reclaimd.model import Notice, utcnow
from reclaimd.pipeline import Budget, ClusterWriter, Ledger, Progress, Report, Runbook, Signaller
from reclaimd.scheduler import GangLock, GangOwners, Scheduler
from reclaimd.settings.policy import UnknownTarget

FLUSH_SPANS_MS = 2000  # a notice's trace written out before its claim is done, at most

Handle = Callable[[Admitted], Awaitable[Report]]  # the runbook's, as the scheduler runs it


@dataclass(frozen=True)
class Parts:
    """A process's parts, built by ``wire`` from its settings."""

    view: cache.ClusterCache
    store: claimstore.ClaimStore
    holders: holders.HolderLeases
    ledger: LedgerWriter
    scheduler: Scheduler[Admitted]
    intake: Intake
    limiter: ratelimit.RateLimiter
    metrics: metrics.Metrics
    # What /readyz checks, by name (a dry run keeps no outbox and holds no Lease).
    readiness: Mapping[str, Callable[[], bool]] = field(default_factory=dict)
    lease: HolderLeases | None = None  # our holder Lease, renewed while we run
    resumer: claimlog.Resumer | None = None  # the resume scan: open claims we may finish
    gang_leases: gangclaims.GangClaims | None = None
    probe: probe.Listener | None = None  # our probe port: refused there = we are gone
    meter: meter.Meter | None = None
    restarts: restarts.RestartWatcher | None = None
    events: events.EventRecorder | None = None
    dry_run: dryrun.WouldParts | None = None  # set: nothing is written, signalled or evicted


@dataclass(frozen=True)
class Core:
    """The parts both modes build alike, which the acting parts read."""

    s: Settings
    api: ApiServer
    limiter: ratelimit.RateLimiter
    cache: cache.ClusterCache
    view: cacheview.CacheView  # what every part but the daemon reads of the cache
    alive: holders.HolderLeases
    store: claimstore.ClaimStore
    ledger: LedgerWriter
    listener: probe.Listener | None


@dataclass(frozen=True)
class Acting:
    """The parts that write, signal, keep files or hold a Lease: real, or a dry run's."""

    claim_log: ClaimWriter
    progress: Progress
    evictor: ClusterWriter
    signaller: Signaller
    recorder: Ledger
    gang_lock: GangLock
    records: gangclaims.GangClaims | None
    after_drain: afterdrain.AfterDrain
    acting_for: Callable[[Handle], Handle]  # the runbook's handle, as the scheduler runs it
    readiness: Mapping[str, Callable[[], bool]]
    held: heldnotices.HeldNotices | None = None
    lease: holders.HolderLeases | None = None
    gang_leases: gangclaims.GangClaims | None = None
    events: events.EventRecorder | None = None
    meter: meter.Meter | None = None
    restarts: restarts.RestartWatcher | None = None
    would: dryrun.WouldParts | None = None


class Mode(Protocol):
    """Where a process keeps things and what it does: ``Live`` or ``DryRun``."""

    def snapshot_path(self, s: Settings) -> Path | None: ...
    def listener(self, s: Settings) -> probe.Listener | None: ...
    def ledger_writer(
        self,
        s: Settings,
        api: ApiServer,
        limiter: ratelimit.RateLimiter,
        alive: holders.HolderLeases,
    ) -> LedgerWriter: ...
    def acting(self, core: Core, session: aiohttp.ClientSession, tracer: Tracer) -> Acting: ...


class Live:
    """The real thing: files beside the outbox, a broker, Leases, evictions, signals."""

    def snapshot_path(self, s: Settings) -> Path | None:
        return s.cache.snapshot_path or s.ledger.beside_outbox("pods.snapshot")

    def listener(self, s: Settings) -> probe.Listener | None:
        pp = s.peer_probe
        return probe.Listener(pp.host, pp.port, pp.advertise) if pp.enabled else None

    def ledger_writer(
        self,
        s: Settings,
        api: ApiServer,
        limiter: ratelimit.RateLimiter,
        alive: holders.HolderLeases,
    ) -> LedgerWriter:
        log = _ledger_log(s, api, s.ledger.topic, limiter, alive)
        return _ledger_writer(s, s.ledger.bootstrap, s.ledger.outbox_path, **log)

    def acting(self, core: Core, session: aiohttp.ClientSession, tracer: Tracer) -> Acting:
        s, api, view, alive = core.s, core.api, core.view, core.alive
        # One Lease per gang: who charges it, and its durable record for a successor.
        gang_leases = gangclaims.GangClaims(
            api,
            s.lease_namespace,
            s.holder,
            limiter=core.limiter,
            peer_acks=lambda holder, label: probe.ask(
                alive.address(holder), label, s.peer_probe.ask_s
            ),
        )
        if core.listener is not None:
            core.listener.answer, core.listener.cut = gang_leases.held, alive.cut_off
        # One claim log: the intake writes the claims, the runbook marks them done.
        claim_log = claimlog.ClaimLog(core.store, view, unbroken_since=alive.unbroken_since)
        return Acting(
            claim_log=claim_log,
            progress=claim_log,
            evictor=actions.ClusterActions(
                api,
                limiter=core.limiter,
                settings=s.policy,
                pod_exists=view.pod_exists,
                budget_changes=view.budget_changes,
                gone_at=view.pod_gone_at,
                only_its_gang=view.pdbs_guard_only_its_gang,
            ),
            signaller=checkpoint.Signaller(
                session,
                tracer,
                putbudget.TenantPutBudgets(s.max_put_object_qps_per_sa),
                settings=s.checkpoint,
            ),
            recorder=core.ledger,
            gang_lock=gang_leases,
            records=gang_leases,
            after_drain=running.after_drain(s),
            acting_for=lambda handle: handle,
            readiness={
                # Listed, and every watch running and connected: a frozen cache would
                # resolve notices to pods long gone.
                "cache": lambda: core.cache.current,
                "outbox": health.outbox_writable(s.ledger.outbox_path),
                # The broker refuses us (credentials, certificates, ACLs): events wait in
                # the outbox until the setting is mended; a broker merely down is no fault.
                "kafka": lambda: core.ledger.kafka_problem is None,
                # Our claims are live only while our holder Lease is renewed.
                "holder_lease": alive.fresh,
            },
            held=heldnotices.HeldNotices(s.ledger.beside_outbox("held.sqlite")),
            lease=alive,
            gang_leases=gang_leases,
            events=events.EventRecorder(api, core.limiter, instance=s.holder, settings=s.events)
            if s.events.enabled
            else None,
            meter=_meter(core),
            restarts=_restarts(core, gang_leases, session),
        )


class DryRun:
    """Decide everything, do nothing (``reclaimd.dryrun``): no file, no broker, no Lease, no
    probe port; the parts that write or signal are "would" parts, which log and count."""

    def snapshot_path(self, s: Settings) -> Path | None:
        return None

    def listener(self, s: Settings) -> probe.Listener | None:
        return None

    def ledger_writer(
        self,
        s: Settings,
        api: ApiServer,
        limiter: ratelimit.RateLimiter,
        alive: holders.HolderLeases,
    ) -> LedgerWriter:
        # No outbox file and no broker: the writer stays empty (the would-recorder logs).
        return _ledger_writer(s, "", ":memory:")

    def acting(self, core: Core, session: aiohttp.ClientSession, tracer: Tracer) -> Acting:
        s, view = core.s, core.view
        would = dryrun.WouldParts.build(
            view,
            s.holder,
            core.ledger.policy,
            lease_s=s.claim_stale_s,
            eviction_policy=str(s.policy.eviction),
        )
        return Acting(
            claim_log=would.claim_log,
            progress=would.claim_log,
            evictor=would.evictor,
            signaller=would.signaller,
            recorder=would.recorder,
            gang_lock=would.gang_lock,
            records=None,
            after_drain=NoAfterDrain(),  # a dry run never completes a lifecycle action
            acting_for=dryrun.acting_for,
            readiness={"cache": lambda: core.cache.current},  # no outbox or Lease: the cache
            would=would,
        )


def wire(
    s: Settings,
    api: ApiServer,
    provider: Any,
    session: aiohttp.ClientSession,
    on_report: Callable[[Report], None] | None = None,
) -> Parts:
    """Build every part from the settings; nothing runs yet."""
    mode: Mode = DryRun() if s.dry_run else Live()  # the one place a dry run differs
    tracer = provider.get_tracer(tracing.TRACER_NAME)
    limiter = ratelimit.RateLimiter(s.kube)
    cluster_cache = cache.ClusterCache(
        api,
        labeler=cost_labels,
        settings=s.cache.model_copy(update={"snapshot_path": mode.snapshot_path(s)}),
        url_policy=s.checkpoint.url_policy(),
    )
    view = cluster_cache.view
    listener = mode.listener(s)
    alive = _holders(s, api, limiter, listener)
    store = claimstore.ClaimStore(
        api,
        s.holder,
        limiter=limiter,
        lease_s=s.claim_stale_s,
        settings=s.claims,
        liveness=alive.renewed,
        death=alive.dead,
        group=alive.group,
    )
    writer = mode.ledger_writer(s, api, limiter, alive)
    core = Core(s, api, limiter, cluster_cache, view, alive, store, writer, listener)
    acting = mode.acting(core, session, tracer)
    observed = metrics.Metrics(label_policy=writer.policy)
    runbook = _runbook(
        core, acting, provider=provider, tracer=tracer, observed=observed, on_report=on_report
    )
    scheduler = Scheduler(
        acting.acting_for(runbook.handle),
        max_in_flight=s.max_in_flight,
        horizon_s=s.schedule_horizon_s,
    )
    intake = _intake(s, acting, view=view, scheduler=scheduler, observed=observed, tracer=tracer)
    return Parts(
        cluster_cache,
        store,
        alive,
        writer,
        scheduler,
        intake,
        limiter,
        observed,
        readiness=acting.readiness,
        lease=acting.lease,
        resumer=None if acting.lease is None else _resumer(core, intake, scheduler),
        gang_leases=acting.gang_leases,
        probe=listener,
        meter=acting.meter,
        restarts=acting.restarts,
        events=acting.events,
        dry_run=acting.would,
    )


def _holders(
    s: Settings, api: ApiServer, limiter: ratelimit.RateLimiter, listener: probe.Listener | None
) -> holders.HolderLeases:
    """The replicas' holder Leases: ours (renewed only by a live process) and the peers'."""
    return holders.HolderLeases(
        api,
        s.lease_namespace,
        s.holder,
        group=s.peer_group or f"{s.lease_namespace}/{s.cluster_name}",
        lease_s=s.claim_stale_s,
        limiter=limiter,
        probe_address=_address_of(listener),
        metrics_address=_metrics_address(s, listener),
        probe_every_s=s.peer_probe.every_s,
        probe_timeout_s=s.peer_probe.timeout_s,
        renew_every_s=s.peer_probe.renew_every_s,
        silent_after_s=s.peer_probe.silent_after_s,
    )


def _runbook(
    core: Core,
    acting: Acting,
    *,
    provider: Any,
    tracer: Tracer,
    observed: metrics.Metrics,
    on_report: Callable[[Report], None] | None,
) -> Runbook:
    s, view = core.s, core.view

    def keep(report: Report) -> None:
        observed.observe_report(report)
        if on_report is not None:
            on_report(report)

    runbook = Runbook(
        view=view,
        writer=acting.evictor,
        signaller=acting.signaller,
        ledger=acting.recorder,
        progress=acting.progress,
        owners=GangOwners(acting.gang_lock),
        records=acting.records,
        after_drain=acting.after_drain,
        budget=Budget(
            drain_reserve_s=s.policy.drain_reserve_s,
            drain_reserve_fraction=s.policy.drain_reserve_fraction,
            no_deadline_horizon_s=s.windows.default_s,
        ),
        # Each rank's waste is priced where it ran: the event names each node's instance.
        build_waste=waste.with_placements(
            lambda node: placement(view.node_labels(node), view.provider_id(node))
        ),
        tracer=tracer,
        cluster_name=s.cluster_name,
        evict_concurrency=s.policy.evict_concurrency,
        on_report=keep,
        ledger_topic=s.ledger.topic,
        narrator=events.NoticeEvents(acting.events) if acting.events is not None else None,
        # Off the loop: an exporter's flush blocks (a file write, an OTLP round trip).
        flush_spans=lambda: asyncio.to_thread(provider.force_flush, FLUSH_SPANS_MS),
    )
    observed.bind(runbook=runbook)  # its takeovers and fenced notices
    return runbook


def _intake(
    s: Settings,
    acting: Acting,
    *,
    view: cacheview.CacheView,
    scheduler: Scheduler[Admitted],
    observed: metrics.Metrics,
    tracer: Tracer,
) -> Intake:
    receipts = tracing.Receipts(tracer, destinations=handlers.destinations(s))

    def admitted(notice: Notice, admission: Admission) -> SpanContext | None:
        observed.observe_admission(notice, admission)
        return receipts.on_admission(notice, admission)

    return Intake(
        claims=acting.claim_log,
        resolver=view,
        submit=scheduler.submit,
        drop_unknown=s.policy.unknown_target is UnknownTarget.DROP,
        expire_after=timedelta(seconds=s.policy.expired_after_s),
        on_admission=admitted,
        settings=s.intake,
        held=acting.held,
    )


def _resumer(core: Core, intake: Intake, scheduler: Scheduler[Admitted]) -> claimlog.Resumer:
    """The resume scan of a process that holds a Lease (a dry run claimed nothing)."""
    s, alive = core.s, core.alive
    return claimlog.Resumer(
        core.store,
        core.view,
        resume=intake.resume,
        in_flight=scheduler.running,
        renewed=alive.renewed,
        lease_s=s.claim_stale_s,
        dead=alive.dead,
        wake=alive.deaths,
        expire_after=timedelta(seconds=s.policy.expired_after_s),
    )


def _ledger_writer(s: Settings, bootstrap: str, outbox: Path | str, **log: Any) -> LedgerWriter:
    """The restart-waste ledger's writer: its broker, its outbox and (``log``) its record in
    the cluster for a peer to adopt."""
    return LedgerWriter(
        bootstrap_servers=bootstrap,
        connection=s.kafka,
        topic=s.ledger.topic,
        outbox_path=outbox,
        policy=LabelPolicy(allowed=s.ledger.label_allowlist),
        tuning=s.ledger.writer,
        **log,
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
    return {
        "holder": s.holder,
        "cluster": ledgerlog.LedgerLog(api, s.lease_namespace, s.holder, topic, limiter=limiter),
        "alive": alive.alive,
    }


def _meter(core: Core) -> meter.Meter | None:
    s, a = core.s, core.s.allocation
    if not a.enabled:
        return None
    outbox = a.outbox_path or s.ledger.beside_outbox("allocation.sqlite")
    rows = LedgerWriter(
        bootstrap_servers=s.ledger.bootstrap,
        connection=s.kafka,
        topic=a.topic,
        outbox_path=outbox,
        policy=core.ledger.policy,
        **_ledger_log(s, core.api, a.topic, core.limiter, core.alive),
    )
    lock = meter.LeaseHourLock(
        core.api, s.lease_namespace, s.holder, s.cluster_name, limiter=core.limiter
    )
    return meter.Meter(
        meter.CacheFleet(core.view),
        rows,
        lock,
        cluster=s.cluster_name,
        settings=a,
    )


def _restarts(
    core: Core, gang_leases: gangclaims.GangClaims, session: aiohttp.ClientSession
) -> restarts.RestartWatcher | None:
    s = core.s
    if not s.restarts.enabled:
        return None
    return restarts.RestartWatcher(
        gang_leases,
        core.view,
        core.ledger,
        holder=s.holder,
        alive=core.alive.alive,
        cluster=s.cluster_name,
        clock=utcnow,
        first_step=functools.partial(restarts.sdk_first_step, session),
        interval_s=s.restarts.interval_s,
        sdk_wait_s=s.restarts.sdk_wait_s,
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
