"""Judging a drill (``chaos.drill.run``, step 6): functions over the facts the drill gathered
(what it sent, what it saw, the faults it applied, what it built) and what is left once
reclaimd is stopped (pods, spans, the queue), handed to ``chaos.drill.verdict.evaluate``."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from chaos.drill.common import yaml_holder
from chaos.drill.plan import Plan, PlannedGang
from chaos.drill.scenario import FaultKind, Source
from chaos.drill.verdict.evaluate import evaluate
from chaos.drill.verdict.facts import (
    RECORD_MARGIN_S,
    Arrival,
    ClaimSeen,
    Expectations,
    FaultFacts,
    GangFacts,
    GaveUp,
    NoticeFacts,
    Observed,
    RankFacts,
    Save,
)
from chaos.drill.verdict.model import Verdict
from reclaimd import postmortem
from reclaimd.model import utcnow

if TYPE_CHECKING:
    from chaos.drill.faults import FaultRecord
    from chaos.drill.world import Built
    from chaos.harness import Harness
    from chaos.process import DaemonProcess
    from chaos.trainers import SaveRecord, ScriptedTrainer


async def judge(
    h: Harness,
    plan: Plan,
    *,
    claims: dict[str, str],
    sent: list[NoticeFacts],
    garbage_sent: int,
    events: list[dict[str, Any]],
    claim_history: dict[str, list[ClaimSeen]],
    arrivals: list[Arrival],
    gave_up: GaveUp | None,
    faults: Sequence[FaultRecord],
    gang_facts: Callable[[PlannedGang, str, set[str]], GangFacts],
) -> Verdict:
    """The verdict on one run, from what the drill did (``sent``, ``faults``), what it saw
    (``claims`` as last read, the ledger ``events`` and their ``arrivals``, the
    ``claim_history``, ``gave_up``) and what is left of the pods, the spans and the queue
    (read here, once reclaimd is stopped); ``gang_facts`` gives each gang's ground truth."""
    from kubernetes_asyncio import client as k8s

    assert h.api is not None
    pods = await k8s.CoreV1Api(h.api).list_namespaced_pod(h.namespace)
    alive = {
        p.metadata.name
        for p in pods.items
        if not p.metadata.deletion_timestamp
        and (p.status is None or p.status.phase not in ("Succeeded", "Failed"))
    }
    spans: list[dict[str, Any]] = []
    holder_of = {span_file(d): yaml_holder(d) for d in h.daemons}
    by_holder: dict[str, list[dict[str, Any]]] = {}
    for path in sorted(h.workdir.glob("spans-*.jsonl")):  # one per reclaimd process
        mine = list(postmortem.read_spans(path))
        spans.extend(mine)
        if path in holder_of:
            by_holder.setdefault(holder_of[path], []).extend(mine)
    sqs_used = any(n.source is Source.EC2_SQS for n in plan.notices) or any(
        g.source is Source.EC2_SQS for g in plan.garbage
    )
    depth = await asyncio.to_thread(h.queue_depth) if sqs_used else None
    e = plan.scenario.expect
    verdict = evaluate(
        scenario=plan.scenario.name,
        run_id=plan.run_id,
        expect=Expectations(
            deadlines_met=e.deadlines_met,
            all_signaled=e.all_signaled,
            evicted=e.evicted,
            ledger_exact=e.ledger_exact,
            gpu_seconds_tolerance=e.gpu_seconds_tolerance,
            max_notice_to_drained_s=e.max_notice_to_drained_s,
            traces=e.traces,
            transport_drained=e.transport_drained,
            min_ask_budget=e.min_ask_budget,
        ),
        notices=sent,
        gangs=[gang_facts(g, h.namespace, alive) for g in plan.gangs],
        observed=Observed(
            events=events,
            spans=spans,
            claims=claims,
            queue_depth=depth,
            garbage_sent=garbage_sent,
            claim_history=claim_history,
            arrivals=arrivals,
            gave_up=gave_up,
            spans_by_holder=by_holder,
        ),
        faults=[
            FaultFacts(
                label=f.label,
                kind=f.fault.kind.value,
                started_at=f.started_at,
                ended_at=f.ended_at,
                holder=f.holder,
                successor=f.successor,
                replica=f.fault.replica,
                held=dict(f.held),
                resent=f.resent,
                error=f.error,
                readiness=tuple(f.readiness),
                exited_at=f.exited_at,
                exit_code=f.exit_code,
                grace_s=f.grace_s,
                sigkilled=f.sigkilled,
                connections_cut=f.connections_cut,
            )
            for f in sorted(faults, key=lambda f: f.started_at)
        ],
        replicas=plan.scenario.reclaimd.replicas,
    )
    files = tuple(str(p) for p in sorted(h.workdir.glob("spans-*.jsonl")))
    daemons = tuple((d.name, d.stats()) for d in h.daemons)
    return dataclasses.replace(verdict, span_files=files, daemons=daemons)


def kills(faults: Sequence[FaultRecord]) -> list[datetime]:
    """When a replica was SIGKILLed (its memory lost)."""
    return [f.started_at for f in faults if f.fault.kind in (FaultKind.KILL, FaultKind.FRESH_DISK)]


def pauses(faults: Sequence[FaultRecord]) -> list[tuple[datetime, datetime]]:
    """When a replica was stopped (SIGSTOP to SIGCONT; to now if never continued)."""
    return [(f.started_at, f.ended_at or utcnow()) for f in faults if f.fault.kind == "pause"]


def gang_facts(
    g: PlannedGang,
    namespace: str,
    alive: set[str],
    built: Built,
    faults: Sequence[FaultRecord],
) -> GangFacts:
    """Gang ``g`` as the drill made it (``built``) and what its trainers went through (each
    save judged against the faults' pauses and kills)."""
    ranks = []
    for r in g.ranks:
        pod = f"{g.name}-{r.rank}"
        trainer = built.trainers.get(pod)
        saves = (
            {
                nid: save_facts(trainer, nid, s, pauses(faults), kills(faults))
                for nid, s in trainer.saves.items()
            }
            if trainer is not None
            else {}
        )
        ranks.append(
            RankFacts(
                pod=pod,
                rank=r.rank,
                gpus=g.gpus_per_rank,
                annotated_checkpoint=built.annotated[g.name],
                started_at=built.started.get(pod),
                stopped_at=built.stopped.get(pod),
                opted_in=g.opt_in,
                leader=r.rank == 0,
                saves=saves,
            )
        )
    return GangFacts(
        name=g.name,
        namespace=namespace,
        scope=g.scope.value,
        ranks=tuple(ranks),
        pods_left=tuple(p for r in g.ranks if (p := f"{g.name}-{r.rank}") in alive),
    )


def save_facts(
    trainer: ScriptedTrainer,
    notice_id: str,
    s: SaveRecord,
    pauses: Sequence[tuple[datetime, datetime]] = (),
    kills: Sequence[datetime] = (),
) -> Save:
    """One save as the judge sees it: answered when the trainer first answered it done, by
    the deadline of the latest request for it before that answer (a replica that took a
    notice over asks the rank again, with a deadline of its own). An answer given while a
    replica was paused, past a deadline that also fell in the pause, is one reclaimd cannot
    place before or after the deadline (the kernel took it; the process saw it on waking):
    too close to call (``unplaceable``). So is an answer to a request a replica sent just
    before it was SIGKILLed, between the request and just after the answer: killed first, it
    never got the answer; killed after, it may not have written it yet (each durable ack is
    written as it comes, but a write takes its time, ``RECORD_MARGIN_S``), and what the
    process had not written dies with it."""
    answered = trainer.server.answered.get(notice_id)
    before = [
        r
        for r in trainer.requests
        if r.notice_id == notice_id and (answered is None or r.received_at <= answered)
    ]
    asked = [r.deadline for r in before]
    asked_at = max((r.received_at for r in before), default=s.received_at)
    return Save(
        received_at=s.received_at,
        deadline=max([s.deadline, *asked]),
        finished_at=s.finished_at,
        saved=s.saved,
        durable=s.durable,
        checkpoint_time=s.checkpoint_time,
        answered_at=answered,
        answers_known=True,
        unplaceable=answered is not None
        and (
            any(a <= answered <= b and a <= s.deadline <= b for a, b in pauses)
            or any(
                asked_at <= k <= answered + timedelta(seconds=RECORD_MARGIN_S) for k in kills
            )
        ),
    )


def span_file(d: DaemonProcess) -> Path:
    """Where a drill daemon writes its spans (from its config file)."""
    import yaml

    doc = yaml.safe_load(d.config_path.read_text())
    tracing = doc.get("tracing") if isinstance(doc, dict) else None
    return Path(str((tracing or {}).get("span_file", "")))
