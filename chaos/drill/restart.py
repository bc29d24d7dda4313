"""The job controller's part in a drill: charged gangs come back, and what the restart cost.

With ``restart.enabled`` a gang the ledger charged is made again once all of its pods are gone
(``restart.after_s`` later), with new pods on nodes no notice targets: what a JobSet or a
PyTorchJob controller does after its pods were evicted. reclaimd charges each comeback's
restart overhead (``reclaimd/restarts.py``); the drill shows it per gang and checks that every
gang that came back was charged once. Kueue gangs are left to Kueue.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING

from chaos import fleet
from chaos.drill.plan import Plan
from chaos.drill.scenario import Integration
from chaos.drill.verdict.facts import gang_of
from chaos.drill.verdict.model import Check, RestartRow
from chaos.drill.watch import Watcher
from reclaimd.model import utcnow

if TYPE_CHECKING:
    from chaos.drill.world import Built
    from chaos.harness import Harness

POLL_S = 0.5


class Restarter:
    def __init__(self, plan: Plan, built: Built, watcher: Watcher, say: Callable[[str], None]):
        self.plan, self.built, self.watcher, self.say = plan, built, watcher, say
        self.after_s = plan.scenario.restart.after_s
        self.made: dict[str, datetime] = {}
        self._gone: dict[str, datetime] = {}  # gang -> when its last pod was seen gone
        targeted = {n.node for n in plan.notices if n.node is not None}
        self._spares = [n.key for n in plan.nodes if n.key not in targeted]
        self._next = 0

    def _restartable(self) -> list[str]:
        charged = {gang_of(e) for e in self.watcher.events}
        return sorted(
            g.name
            for g in self.plan.gangs
            if g.name in charged
            and g.name not in self.made
            and g.integration is not Integration.KUEUE
        )

    async def run(self, h: Harness) -> None:
        """Until cancelled: make every charged gang again once its pods are gone."""
        from kubernetes_asyncio import client as k8s

        core = k8s.CoreV1Api(h.api)
        selector = f"{fleet.DRILL_LABEL}={self.plan.run_id}"
        while True:
            todo = self._restartable()
            if todo and self._spares:
                with contextlib.suppress(Exception):  # the apiserver restarting (a fault)
                    pods = await core.list_namespaced_pod(h.namespace, label_selector=selector)
                    present = {p.metadata.name for p in pods.items}
                    now = utcnow()
                    for name in todo:
                        spec = self.built.specs[name]
                        if any(spec.pod_name(r) in present for r in range(len(spec.ranks))):
                            continue
                        gone = self._gone.setdefault(name, now)
                        if (now - gone).total_seconds() >= self.after_s:
                            await self._make(h, spec)
            await asyncio.sleep(POLL_S)

    async def _make(self, h: Harness, spec: fleet.GangSpec) -> None:
        assert h.api is not None
        ranks = []
        for _ in spec.ranks:
            node = self.built.nodes[self._spares[self._next % len(self._spares)]].name
            self._next += 1
            ranks.append(fleet.RankSpec(node))  # a new incarnation: new uids, no trainer
        again = dataclasses.replace(spec, ranks=ranks, incarnation=spec.incarnation + 1)
        await fleet.create_gang(h.api, again, h.namespace)
        self.made[spec.name] = utcnow()

    async def wait(self, timeout_s: float) -> None:
        """Until every gang made again has its restart charged (or ``timeout_s``)."""
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout_s
        while loop.time() < end and set(self.made) - self._charged():  # noqa: ASYNC110
            await asyncio.sleep(POLL_S)  # the ledger reader appends; nothing to wait on
        missing = sorted(set(self.made) - self._charged())
        self.say(
            f"restarts: {len(self.made)} gang(s) made again, {len(self.made) - len(missing)}"
            " charged their restart" + (f"; not: {', '.join(missing[:5])}" if missing else "")
        )

    def _charged(self) -> set[str]:
        return {gang_of(e) for e in self.watcher.restarts}

    def rows(self) -> tuple[RestartRow, ...]:
        out = []
        for name, made in sorted(self.made.items()):
            evs = [e for e in self.watcher.restarts if gang_of(e) == name]
            first = evs[0] if evs else {}
            seconds = first.get("x_RestartOverheadSeconds")
            out.append(
                RestartRow(
                    gang=name,
                    made_at=made,
                    events=len(evs),
                    seconds=float(seconds) if seconds is not None else None,
                    source=first.get("x_RestartOverheadSource"),
                )
            )
        return tuple(out)


def check(rows: tuple[RestartRow, ...]) -> Check:
    """Every gang that came back is charged its restart once."""
    wrong = [f"{r.gang}: {r.events} events" for r in rows if r.events != 1]
    return Check(
        "restart overhead once per gang back",
        not wrong,
        "; ".join(wrong[:5]) or f"{len(rows)} gang(s) back, each charged once",
    )
