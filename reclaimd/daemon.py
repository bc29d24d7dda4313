"""The always-on process: run the parts ``reclaimd.wiring`` builds, resume open claims, run
until SIGTERM.

Root tasks (cache supervisor,
ledger publisher, scheduler, holder Lease, resume scan, one task per source) run in one
TaskGroup: if one dies the others are cancelled and the process exits non-zero, so the
orchestrator restarts it and it resumes from the claims in the cluster (crash-only). SIGTERM
stops the sources first, gives notices in flight a grace period, then flushes the ledger
outbox. The daemon never asks whether it dry-runs: it runs the parts ``wire`` built, and a
dry run's have no holder Lease, resume scan, probe port, meter or Events to run.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
import signal
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from reclaimd import (
    checkpoint,
    dryrun,
    health,
    heldnotices,
    logs,
    metrics,
    tracing,
)
from reclaimd.cluster import (
    connect,
    errors,
    peers,
    ratelimit,
)
from reclaimd.cluster.apiserver import ApiServer
from reclaimd.config import Settings
from reclaimd.handlers import destinations, enabled
from reclaimd.handlers import running as running_sources
from reclaimd.handlers.transport import Source, Supplies
from reclaimd.pipeline import Report
from reclaimd.wiring import Parts, wire

log = logging.getLogger(__name__)

STOP_GRACE_S = 20.0  # alone (no live peer): notices in flight may finish this long
HAND_BACK_S = 3.0  # transports returning their messages, runbooks unwinding


@dataclass
class Daemon:
    """Everything one reclaimd process holds; ``run`` drives it."""

    settings: Settings
    on_report: Callable[[Report], None] | None = None
    limiter: ratelimit.RateLimiter | None = None  # the write budget, once wired
    dry_run: dryrun.DryRunCounters | None = None  # what a dry run would have done
    _stopping: asyncio.Event = field(default_factory=asyncio.Event)
    _resume_task: asyncio.Task[None] | None = None

    def stop(self) -> None:
        """Begin a graceful stop (SIGTERM): see ``run``."""
        self._stopping.set()

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
        api = await connect.build_api_client(
            str(s.kube.kubeconfig) if s.kube.kubeconfig else None, pool_size=s.kube.connections
        )
        session = checkpoint.session(s.checkpoint_connections, s.checkpoint.identity_token_file)
        parts = wire(s, api, provider, session, self.on_report)
        self.limiter = parts.limiter
        self.dry_run = parts.dry_run.counters if parts.dry_run is not None else None
        view, scheduler, ledger_writer = parts.view, parts.scheduler, parts.ledger
        self.intake, self.scheduler, self.ledger = parts.intake, scheduler, ledger_writer
        serving = contextlib.AsyncExitStack()
        try:
            sources_by_name = self._sources(parts, api)
            observed = self.metrics = _bind_gauges(parts, sources_by_name)
            readiness = health.Readiness(parts.readiness)
            # Each central source, by its name: not ready while it cannot hear (its receives
            # failed for longer than a few rounds: a deleted queue, a refused subscription).
            readiness.checks.update(running_sources.hearing(sources_by_name))
            # Up before the cache syncs: /healthz answers and /readyz says why not yet.
            await serving.enter_async_context(observed.serve(s.metrics_port, readiness))
            await view.start()
            if not await view.wait_synced(timeout_s=s.cache_sync_timeout_s):
                raise RuntimeError(
                    f"cluster cache did not sync within {s.cache_sync_timeout_s:.0f} s"
                )
            async with asyncio.TaskGroup() as tg:
                await self._announce(parts)
                background = _background(tg, parts, api, s)
                acting = self._acting(tg, parts)
                sources = _receiving(tg, parts, sources_by_name)
                logs.event(
                    log,
                    "reclaimd running",
                    holder=s.holder,
                    cluster=s.cluster_name,
                    dry_run=s.dry_run,
                )
                if ready is not None:
                    ready.set()
                await self._stopping.wait()
                await self._hand_over(parts, sources, acting)
                await ledger_writer.flush(timeout_s=5.0)
                if parts.meter is not None:
                    await parts.meter.writer.flush(timeout_s=2.0)
                for task in background:
                    task.cancel()
        finally:
            if parts.probe is not None:
                await parts.probe.close()
            await serving.aclose()
            await session.close()
            with contextlib.suppress(Exception):
                await ledger_writer.close()
            if parts.meter is not None:
                with contextlib.suppress(Exception):
                    await parts.meter.writer.close()
            await view.stop()
            if parts.intake.held is not None:
                parts.intake.held.close()
            await api.close()
            provider.shutdown()

    async def _announce(self, parts: Parts) -> None:
        """Our Lease first: the claims we write are live only while it is renewed (a failure
        is retried by its task and shows in /readyz); it names our probe port, open by then."""
        if parts.probe is not None:
            await parts.probe.start()
        if parts.lease is not None:
            with contextlib.suppress(errors.KubeError):
                await parts.lease.renew()

    def _acting(self, tg: asyncio.TaskGroup, parts: Parts) -> list[asyncio.Task[None]]:
        """What acts on claims: stopped first on SIGTERM, before the claims are handed over
        (a peer must never act beside us on the same claim)."""
        tasks = [tg.create_task(parts.scheduler.run(), name="scheduler")]
        # A dry run holds no Lease and resumes nothing (it claimed nothing): the parts below
        # are absent from its wiring.
        if parts.lease is not None:
            tasks.append(tg.create_task(parts.lease.run(), name="holder-lease"))
        if parts.probe is not None:
            tasks.append(tg.create_task(parts.holders.run_probes(), name="peer-probe"))
        if parts.gang_leases is not None:
            tasks.append(tg.create_task(parts.gang_leases.run_sweeps(), name="gang-sweep"))
        if parts.restarts is not None:
            tasks.append(tg.create_task(parts.restarts.run(), name="restart-overhead"))
        if parts.resumer is not None:
            # First to stop on SIGTERM: a stopping replica takes no claim over.
            self._resume_task = tg.create_task(parts.resumer.run(), name="resume")
            tasks.append(self._resume_task)
        return tasks

    async def _hand_over(
        self,
        parts: Parts,
        sources: list[asyncio.Task[None]],
        acting: list[asyncio.Task[None]],
    ) -> None:
        """SIGTERM: take no new notices (each transport hands back what it had not settled),
        then, with a live peer, stop acting and hand every claim over at once (the peer runs
        them from their durable records, as after a crash); alone, finish what is in flight
        within the grace first. Either way our claims are released before we exit."""
        first = [*sources, *([self._resume_task] if self._resume_task is not None else [])]
        for task in first:
            task.cancel()
        await _settle(first, HAND_BACK_S)
        peer = await parts.holders.peer_alive_now()
        logs.event(log, "stopping", in_flight=parts.scheduler.depth, hand_over=peer)
        if not peer:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(STOP_GRACE_S):
                    await parts.scheduler.wait_idle()
        for task in acting:
            task.cancel()
        await _settle(acting, HAND_BACK_S)
        if parts.probe is not None:
            await parts.probe.close()  # refused from now on: peers take our claims over now
        if parts.lease is not None:
            with contextlib.suppress(errors.KubeError):
                await parts.lease.release()

    def _sources(self, parts: Parts, api: ApiServer) -> dict[str, Source]:
        """One transport per enabled entry of the source registry (``reclaimd.handlers``)."""
        supplies = Supplies(
            self.settings,
            parts.intake.admit,
            self.settings.windows,
            api,
            limiter=parts.limiter,
            dead=parts.holders.dead,
        )
        return {e.name: running_sources.build_one(e, supplies) for e in enabled(self.settings)}


def _our_queue(s: Settings) -> tuple[str, ...]:
    """Every queue, subscription and topic our enabled sources consume (a peer on one of
    them takes messages from us)."""
    return tuple(d for d in destinations(s).values() if d)


def _background(
    tg: asyncio.TaskGroup, parts: Parts, api: ApiServer, s: Settings
) -> list[asyncio.Task[Any]]:
    """What runs beside the notices until the stop: cancelled last."""
    tasks: list[asyncio.Task[Any]] = [
        tg.create_task(parts.view.run(), name="cache"),  # restarts a dead or stuck watch
        tg.create_task(parts.ledger.run(), name="ledger"),
    ]
    if parts.meter is not None:
        tasks.append(tg.create_task(parts.meter.writer.run(), name="allocation-ledger"))
        tasks.append(tg.create_task(parts.meter.run(), name="allocation-meter"))
    if parts.events is not None:
        tasks.append(tg.create_task(parts.events.run(), name="events"))
    # Karpenter or NTH draining on the same Spot warnings: one line each.
    tasks.append(tg.create_task(peers.warn(api, _our_queue(s)), name="peers"))
    return tasks


def _receiving(
    tg: asyncio.TaskGroup, parts: Parts, sources: Mapping[str, Source]
) -> list[asyncio.Task[None]]:
    """Every transport's task, and the one admitting what this disk's last process held."""
    tasks = [
        tg.create_task(source.run(), name=f"source-{name}") for name, source in sources.items()
    ]
    intake = parts.intake
    if intake.held is not None:
        held = heldnotices.HeldSource(intake.held, intake.admit, busy=intake.in_flight)
        tasks.append(tg.create_task(held.run(), name="source-held"))
    return tasks


async def _settle(tasks: list[asyncio.Task[None]], limit_s: float) -> None:
    """Wait (bounded) for cancelled tasks to unwind; a straggler does not hold the stop."""
    if tasks:
        await asyncio.wait(tasks, timeout=limit_s)


def _bind_gauges(parts: Parts, running: Mapping[str, Source]) -> metrics.Metrics:
    """The parts' own counters, read at scrape time."""
    ledger_writer, scheduler, limiter = parts.ledger, parts.scheduler, parts.limiter
    parts.metrics.bind(
        ledger=ledger_writer,
        label_drops=lambda: ledger_writer.policy.dropped,
        transports=running_sources.counters(running),
        scheduler_depth=lambda: scheduler.depth,
        slots=running_sources.slots(running),
        kube_waiting=lambda: limiter.waiting,
        kube_throttled=lambda: limiter.throttled,
        restarts=parts.restarts,
        meter=parts.meter,
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
        _stopped(daemon)
    except asyncio.CancelledError:
        _stopped(daemon)
        return 0
    except Exception as e:
        logs.event(log, "reclaimd failed", logging.ERROR, error="; ".join(_leaves(e))[:1000])
        return 1
    return 0


def _stopped(daemon: Daemon) -> None:
    """The last line: what this process cost the API server and the machine (the storm
    bench reads it)."""
    limiter = daemon.limiter
    extra: dict[str, Any] = {}
    if daemon.dry_run is not None:
        extra["dry_run"] = daemon.dry_run.as_dict()  # what it would have done, by action
    logs.event(
        log,
        "reclaimd stopped",
        kube_writes=dict(limiter.by_kind) if limiter is not None else {},
        kube_budget=limiter.tally() if limiter is not None else {},
        peak_rss_mb=peak_rss_mb(),
        modules_loaded=len(sys.modules),  # what the enabled sources made it import
        **extra,
    )


def peak_rss_mb() -> float:
    """This process's own peak RSS (``VmHWM``). Not ``ru_maxrss``: Linux keeps that across
    ``execve``, so a replica started by a large parent (a test runner with torch loaded)
    reported the parent's peak, 930 MB, as its own."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def _leaves(e: BaseException) -> list[str]:
    """One line per root cause, with the task-group wrapping taken off."""
    if isinstance(e, BaseExceptionGroup):
        return [line for sub in e.exceptions for line in _leaves(sub)]
    return [f"{type(e).__name__}: {e}"]
