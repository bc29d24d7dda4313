"""Watching a drill (``chaos.drill.run``, step 5): the claims polled as they change (takeovers
are timed from them), the ledger read as events arrive (one progress line each), the wait
for every gang to be charged and every claim done, the give-up, and the late read after it.
What was seen is kept on the ``Watcher`` for the judge."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from chaos.drill.common import yaml_holder
from chaos.drill.plan import Plan
from chaos.drill.scenario import Integration
from chaos.drill.verdict.facts import Arrival, ClaimSeen, GaveUp, NoticeFacts, gang_of
from chaos.drill.verdict.traces import time_of
from reclaimd import restarts
from reclaimd.model import utcnow

if TYPE_CHECKING:
    from chaos.drill.faults import FaultRecord
    from chaos.harness import Harness

CLAIM_POLL_S = 0.5  # how often the drill reads the claims (a takeover is timed from them)
LATE_READ_S = 10.0  # after giving up and stopping reclaimd, the ledger is read this much longer
EPOCH = datetime.fromisoformat("1970-01-01T00:00:00+00:00")


class Watcher:
    """What the drill sees of reclaimd: owns ``events``, ``arrivals``, ``claim_history`` and
    ``gave_up``; reads the notices sent (``sent``, for labels and what must be charged) and
    the faults applied (``faults``: a claim read that fails during one is not news)."""

    def __init__(
        self,
        plan: Plan,
        *,
        sent: Sequence[NoticeFacts],
        faults: Sequence[FaultRecord],
        say: Callable[[str], None],
    ) -> None:
        self.plan = plan
        self.sent = sent  # the injector's list, as it grows
        self.faults = faults  # the fault driver's list, as it grows
        self.say = say
        self.events: list[dict[str, Any]] = []  # restart waste: one per gang charged
        self.restarts: list[dict[str, Any]] = []  # restart overhead of gangs that came back
        self.arrivals: list[Arrival] = []
        self.claim_history: dict[str, list[ClaimSeen]] = {}
        self.gave_up: GaveUp | None = None
        self._claims_seen: dict[str, str] = {}  # the last phases read (the apiserver may be down)

    async def poll_claims(self, h: Harness) -> None:
        """Every claim version the drill can see, with who wrote it and when (takeovers)."""
        while True:
            with contextlib.suppress(Exception):  # the apiserver may be down for a moment
                docs = await claim_docs(h, self.plan)
                now = utcnow()
                for key, doc in docs.items():
                    seen = ClaimSeen(
                        seen_at=now,
                        holder=str(doc.get("holder", "")),
                        phase=str(doc.get("phase", "")),
                        notice_id=str(doc.get("notice_id", "")),
                        heartbeat_at=time_of(doc.get("heartbeat_at")),
                    )
                    history = self.claim_history.setdefault(key, [])
                    last = history[-1] if history else None
                    if last is None or dataclasses.replace(last, seen_at=now) != seen:
                        history.append(seen)  # a new version: record when it was first seen
            await asyncio.sleep(CLAIM_POLL_S)

    async def read_ledger(self, h: Harness) -> None:
        """Read the run's ledger topic from the start for as long as the drill runs; a broker
        that goes away (a fault) is read again from where the reader was."""
        seen: set[tuple[int, int]] = set()
        while True:
            consumer = h.ledger_consumer()
            try:
                await consumer.start()
                while True:
                    batch = await consumer.getmany(timeout_ms=300)
                    for records in batch.values():
                        for r in records:
                            if (r.partition, r.offset) in seen:
                                continue
                            seen.add((r.partition, r.offset))
                            self._arrived(json.loads(r.value), r.timestamp, r.timestamp_type)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # a broker outage: read again once it is back
                self.say(f"ledger reader: {type(e).__name__}; reading again")
                await asyncio.sleep(1.0)
            finally:
                with contextlib.suppress(Exception):
                    await consumer.stop()

    def _arrived(self, event: dict[str, Any], timestamp_ms: int, timestamp_type: int) -> None:
        if event.get("schema") == restarts.SCHEMA:
            self.restarts.append(event)
            seconds = event.get("x_RestartOverheadSeconds")
            source = event.get("x_RestartOverheadSource")
            self.say(f"ledger: {event.get('x_GangId')} back after {seconds} s ({source})")
            return
        self.events.append(event)
        appended = (
            EPOCH + timedelta(milliseconds=timestamp_ms) if timestamp_type == 1 else None
        )  # 1: LogAppendTime, the broker's clock; 0 would be the producer's
        self.arrivals.append(
            Arrival(
                gang=gang_of(event),
                event_id=str(event.get("EventId", "")),
                produced_at=time_of(event.get("ChargePeriodEnd")),
                appended_at=appended,
                received_at=utcnow(),
            )
        )
        self._say_event(event)

    def _say_event(self, e: dict[str, Any]) -> None:
        label = next(
            (n.label for n in self.sent if n.notice_id == e.get("x_NoticeId")), "an unknown notice"
        )
        met = "" if e.get("x_DeadlineMet") else ", DEADLINE MISSED"
        self.say(
            f"ledger: {gang_of(e)} charged by {label}: {e.get('x_WastedGpuSeconds')} GPU-s"
            f" ({e.get('x_CheckpointOutcome')}{met})"
        )

    async def wait(self, h: Harness, reader: asyncio.Task[None]) -> None:
        expect = self.plan.scenario.expect
        charging = {g for n in self.sent if n.response != "checkpoint_only" for g in n.gangs}
        keys = {n.claim_key for n in self.sent if n.claim_key}
        loop = asyncio.get_running_loop()
        end = loop.time() + expect.timeout_s
        self.say(f"waiting for {len(charging)} ledger event(s) and {len(keys)} claim(s) done")
        claims: dict[str, str] = {}
        while loop.time() < end:
            if reader.done():
                reader.result()  # the reader died: say why
            claims = await self.claims(h)
            charged = {gang_of(e) for e in self.events}
            if charged >= charging and all(claims.get(k) == "done" for k in keys):
                break
            await asyncio.sleep(1.0)
        else:
            open_ = {k: claims.get(k, "") for k in sorted(keys) if claims.get(k) != "done"}
            charged = {gang_of(e) for e in self.events}
            holders: dict[str, str] = {}
            with contextlib.suppress(Exception):  # the apiserver may be the thing that is down
                docs = await claim_docs(h, self.plan)
                holders = {k: str(docs.get(k, {}).get("holder", "")) for k in open_}
            self.gave_up = GaveUp(
                at=utcnow(),
                timeout_s=expect.timeout_s,
                events=len(charged & charging),
                events_wanted=len(charging),
                open_claims=open_,
                claim_holders=holders,
                # a claim whose holder is gone and that nobody took over is abandoned: lost
                live_holders=frozenset(yaml_holder(d) for d in h.daemons if d.running)
                if holders
                else None,
            )
            self.say(
                f"gave up after {expect.timeout_s:g}s: {len(charged & charging)}/{len(charging)}"
                f" events, {len(open_)} claim(s) not done"
            )
        await asyncio.sleep(expect.settle_s)  # a duplicate would arrive now

    async def read_late(self, reader: asyncio.Task[None]) -> None:
        """After a give-up: read the ledger ``LATE_READ_S`` more (or until every gang is
        charged), so that an event that was only late is not judged lost."""
        charging = {g for n in self.sent if n.response != "checkpoint_only" for g in n.gangs}
        loop = asyncio.get_running_loop()
        end = loop.time() + LATE_READ_S
        while loop.time() < end and not reader.done():
            if {gang_of(e) for e in self.events} >= charging:
                break
            await asyncio.sleep(0.5)
        late = [a for a in self.arrivals if self.gave_up and a.received_at > self.gave_up.at]
        self.say(f"after giving up: {len(late)} ledger event(s) more")

    async def claims(self, h: Harness) -> dict[str, str]:
        """Claim phase on every drill node, and on every Workload of the run's namespace (the
        last phases read, while the apiserver is down)."""
        try:
            docs = await claim_docs(h, self.plan)
        except Exception:
            if not self.faults and not self.plan.scenario.faults:
                raise
            return dict(self._claims_seen)
        self._claims_seen = {k: str(d.get("phase", "")) for k, d in docs.items()}
        return dict(self._claims_seen)


# --- claims ----------------------------------------------------------------------------------


async def claim_docs(h: Harness, plan: Plan) -> dict[str, dict[str, Any]]:
    """The claim on every drill node and Workload, decoded ({} for none)."""
    from kubernetes_asyncio import client as k8s

    from chaos import fleet
    from chaos.harness import CLAIM

    assert h.api is not None
    out: dict[str, dict[str, Any]] = {}
    nodes = await k8s.CoreV1Api(h.api).list_node(
        label_selector=f"{fleet.DRILL_LABEL}={plan.run_id}"
    )
    for n in nodes.items:
        out[n.metadata.name] = claim_doc((n.metadata.annotations or {}).get(CLAIM))
    if any(g.integration is Integration.KUEUE for g in plan.gangs):
        wls = await k8s.CustomObjectsApi(h.api).list_namespaced_custom_object(
            fleet.KUEUE_GROUP, fleet.KUEUE_VERSION, h.namespace, "workloads"
        )
        for w in wls.get("items", []):
            annotations = w["metadata"].get("annotations") or {}
            key = f"{h.namespace}/{w['metadata']['name']}"
            out[key] = claim_doc(annotations.get(CLAIM))
    return out


def claim_doc(raw: str | None) -> dict[str, Any]:
    if not raw:
        return {}
    try:
        doc = json.loads(raw)
    except ValueError:
        return {"phase": "unreadable"}
    return doc if isinstance(doc, dict) else {"phase": "unreadable"}
