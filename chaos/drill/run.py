"""``reclaimd drill run SCENARIO``: rehearse an interruption on the local stack, then judge it.
``Drill`` and ``run_drill`` are here; the command line itself is ``chaos.drill.cli``.

One drill, top to bottom:

1. **Plan** the scenario (``chaos.drill.scenario``): nodes, gangs, behaviours and notices, seeded.
2. **Build** the cluster on kwok with bounded concurrency: labelled nodes, one fake trainer per
   opted-in rank (``chaos.trainers.ScriptedTrainer``), the gangs' pods backdated to their start
   time, PDBs, and for Kueue gangs an admitted Workload.
3. **Start reclaimd** as real processes: ``replicas`` central daemons with every source the
   scenario uses (SQS, Pub/Sub, Kafka notices, Kueue), plus one per-node daemon for each node
   an IMDS or metadata-server notice targets, each with its own mock server.
4. **Inject** each notice through its real transport at its planned time (``chaos.inject``),
   with its duplicates and the garbage around it, and keep the notice each payload must become
   (parsed from the very bytes sent): that is the ground truth of ids and deadlines.
5. **Wait** for the ledger events of every affected gang and for every claim to be done,
   reading Kafka as events arrive (one progress line each, on stderr), then a settle period
   to catch duplicates.
6. **Judge** (``chaos.drill.verdict``): stop reclaimd (its spans flush), gather what is left of the
   pods, what each trainer received, the claims, the queue and the spans, and check it all.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import sys
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from chaos.drill import judge as drill_judge
from chaos.drill import restart as drill_restart
from chaos.drill import teardown as drill_teardown
from chaos.drill.cli import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    add_parser,
    cmd_drill,
    describe_plan,
    main,
)
from chaos.drill.common import SEND_RETRY_S, retrying, yaml_holder
from chaos.drill.faultdriver import FaultDriver
from chaos.drill.injector import Injector
from chaos.drill.judge import save_facts as _save_facts
from chaos.drill.local import SPAWN_LIMIT, World
from chaos.drill.plan import Plan, PlannedGang
from chaos.drill.plan import plan as plan_scenario
from chaos.drill.restart import Restarter
from chaos.drill.scenario import FaultKind, Scenario, Source
from chaos.drill.verdict.facts import GangFacts
from chaos.drill.verdict.model import Verdict
from chaos.drill.watch import CLAIM_POLL_S, LATE_READ_S, Watcher
from chaos.drill.world import KUEUE_CLUSTER_QUEUE, Built
from reclaimd import postmortem
from reclaimd.model import utcnow

if TYPE_CHECKING:
    from datetime import datetime

    from chaos.harness import Harness
    from chaos.stack import StackEnv

# Names other modules and tests take from here (the parts now live in chaos/drill_*.py).
__all__ = [
    "CLAIM_POLL_S",
    "EXIT_FAILED",
    "EXIT_OK",
    "EXIT_USAGE",
    "KUEUE_CLUSTER_QUEUE",
    "LATE_READ_S",
    "SEND_RETRY_S",
    "SPAWN_LIMIT",
    "Built",
    "Drill",
    "Progress",
    "_save_facts",
    "add_parser",
    "cmd_drill",
    "describe_plan",
    "main",
    "run_drill",
    "slowest",
    "slowest_timeline",
    "yaml_holder",
]


class Progress:
    """One line per event, with seconds since the drill started, on ``out`` (stderr)."""

    def __init__(self, out: TextIO | None = None, *, quiet: bool = False) -> None:
        self.out = out if out is not None else sys.stderr
        self.quiet = quiet
        self._start: datetime = utcnow()

    def __call__(self, message: str) -> None:
        if self.quiet:
            return
        at = (utcnow() - self._start).total_seconds()
        print(f"+{at:7.2f}s  {message}", file=self.out, flush=True)


class Drill:
    """One run of one scenario against the stack; ``run`` returns the verdict. Its parts, each
    with the state it owns: the ``world`` (what was built and started), the ``injector``
    (what was sent), the ``saboteur`` (the faults applied), the ``watcher`` (what was seen);
    ``chaos.drill.judge`` judges those facts and ``chaos.drill.teardown`` cleans up."""

    def __init__(
        self,
        scenario: Scenario,
        stack: StackEnv,
        *,
        progress: Progress | None = None,
        run_id: str = "",
        apiserver_proxy: bool | None = None,
    ) -> None:
        self.plan: Plan = plan_scenario(scenario, run_id=run_id or uuid.uuid4().hex[:8])
        # Each central replica reaches the apiserver through a proxy of its own when a fault
        # cuts one off (None: only then; True or False to measure what the proxy costs).
        self.proxied = (
            any(f.kind is FaultKind.PARTITION for f in scenario.faults)
            if apiserver_proxy is None
            else apiserver_proxy
        )
        self.stack = stack
        self.say = progress or Progress()
        self.world = World(self.plan, stack, proxied=self.proxied, say=self.say)
        self.injector = Injector(self.plan, self.world, say=self.say)
        self.saboteur = FaultDriver(self.plan, stack, self.world, self.injector, say=self.say)
        self.watcher = Watcher(
            self.plan, sent=self.injector.sent, faults=self.saboteur.faults, say=self.say
        )
        self.restarter = (
            Restarter(self.plan, self.world.built, self.watcher, self.say)
            if scenario.restart.enabled
            else None
        )

    @property
    def scenario(self) -> Scenario:
        return self.plan.scenario

    @property
    def sources(self) -> frozenset[Source]:
        return self.plan.sources()

    # What tests/e2e/test_report_drill.py reads of a run (its ground truth).
    @property
    def built(self) -> Built:
        return self.world.built

    @property
    def events(self) -> list[dict[str, Any]]:
        return self.watcher.events

    # --- the run ----------------------------------------------------------------------------

    async def run(self) -> Verdict:
        from chaos.harness import Harness

        # A failing or cut-off fake trainer is the scenario working, not news for the console.
        logging.getLogger("reclaimd_trainer.server").setLevel(logging.ERROR)
        # The drill's own Kafka clients retry through a stop_kafka outage; one line a retry
        # would bury the progress lines (the reader says once that it reads again).
        logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
        p = self.plan
        ranks = sum(len(g.ranks) for g in p.gangs)
        self.say(
            f"drill {self.scenario.name} run {p.run_id}: {len(p.nodes)} nodes, {len(p.gangs)}"
            f" gangs ({ranks} ranks), {len(p.notices)} notices, {len(p.garbage)} garbage"
        )
        world, watcher = self.world, self.watcher
        async with Harness(self.stack, name=p.run_id) as h:
            try:
                await world.build(h)
                await world.transports(h)
                await world.start_reclaimd(h)
                reader = asyncio.create_task(watcher.read_ledger(h))
                poller = asyncio.create_task(watcher.poll_claims(h))
                tasks = [reader, poller]
                if self.restarter is not None:
                    tasks.append(asyncio.create_task(self.restarter.run(h)))
                try:
                    await self._inject(h)
                    await watcher.wait(h, reader)
                    if self.restarter is not None:
                        await self.restarter.wait(self.scenario.expect.timeout_s)
                    # Stopped while the ledger is still read: an event its outbox flushes as
                    # it stops is seen (late, after a give-up; a duplicate, otherwise).
                    await world.stop_reclaimd(h)
                    if watcher.gave_up is not None:
                        await watcher.read_late(reader)
                finally:
                    for task in tasks:
                        task.cancel()
                        with contextlib.suppress(asyncio.CancelledError):
                            await task
                return await self._judge(h)
            finally:
                await drill_teardown.teardown(h, world, stop_pods=self.injector.stop_pods)

    # --- the steps a subclass may wrap (tests/e2e/test_report_drill.py does) ---------------

    async def _inject(self, h: Harness) -> None:
        """Notices, garbage and faults, each at its planned time."""
        await self.injector.run(h, lambda f: self.saboteur.apply(h, f))

    async def _judge(self, h: Harness) -> Verdict:
        await self.world.stop_reclaimd(h)  # done already, unless the wait failed
        assert h.api is not None
        claims = await retrying(lambda: self.watcher.claims(h))
        w = self.watcher
        verdict = await drill_judge.judge(
            h,
            self.plan,
            claims=claims,
            sent=self.injector.sent,
            garbage_sent=self.injector.garbage_sent,
            events=w.events,
            claim_history=w.claim_history,
            arrivals=w.arrivals,
            gave_up=w.gave_up,
            faults=self.saboteur.faults,
            gang_facts=self._gang_facts,
        )
        if self.restarter is None:
            return verdict
        rows = self.restarter.rows()
        return dataclasses.replace(
            verdict, restarts=rows, checks=(*verdict.checks, drill_restart.check(rows))
        )

    def _gang_facts(self, g: PlannedGang, namespace: str, alive: set[str]) -> GangFacts:
        return drill_judge.gang_facts(g, namespace, alive, self.world.built, self.saboteur.faults)


async def run_drill(
    scenario: Scenario,
    *,
    stack: StackEnv | None = None,
    progress: Progress | None = None,
    run_id: str = "",
    apiserver_proxy: bool | None = None,
) -> Verdict:
    """Run ``scenario`` on the local stack and return its verdict (the e2e tests' entry).
    ``apiserver_proxy``: each replica through a proxy of its own (None: when a fault needs it)."""
    from chaos import stack as stackenv

    env = stack or stackenv.load()
    drill = Drill(scenario, env, progress=progress, run_id=run_id, apiserver_proxy=apiserver_proxy)
    return await drill.run()


def slowest(verdict: Verdict) -> postmortem.Timeline | None:
    """The post-mortem of the notice that took longest to drain (``make demo``)."""
    if verdict.slowest is None:
        return None
    for path in verdict.span_files:
        try:
            return postmortem.load(Path(path), verdict.slowest.facts.notice_id)
        except postmortem.NotFound:
            continue
    return None


def slowest_timeline(verdict: Verdict) -> str | None:
    timeline = slowest(verdict)
    return postmortem.render_text(timeline) if timeline is not None else None


if __name__ == "__main__":
    sys.exit(main())
