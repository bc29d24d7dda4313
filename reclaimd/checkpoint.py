"""The checkpoint-signal contract, reclaimd's side: tell every rank of a gang to save, collect acks.

``signal_gang`` POSTs one JSON request to each opted-in member's checkpoint URL, all at once
(bounded by ``concurrency``), and returns one ``RankAck`` per member, in member order. A rank
acks with ``200`` and ``{checkpoint_time, step, uri, durable}``; ``202`` means "saving": reclaimd
polls the status URL the reply names (``Location`` or ``status_url``; the checkpoint URL itself
when it names none, since a repeated POST for the same notice is idempotent by contract) until a
``200`` or the end of the budget. Anything else is "not acked" with a one-line ``error``: a
workload's misbehaviour never raises, because one broken trainer must not stop the drain of the
others. Cancelling the fan-out cancels every request in flight and re-raises ``CancelledError``.

What a workload replies is untrusted: redirects are not followed and a status URL must stay on
the checkpoint URL's origin (so a pod cannot aim reclaimd at another service), replies are read
up to 64 KiB, and every field is type-checked.

Time. Each request is bounded by ``min(member.checkpoint_timeout_s, budget)``; the budget is
converted once to the loop's monotonic clock, so a wall-clock step does not stretch it. The
budget comes from the notice: ``budget_for`` keeps ``reserve_s`` before the deadline for the
drain, and ``reserve_for`` gives the default reserve, ``min(30 s, 0.34 x window)`` (the
``policy.drain_reserve_s`` / ``drain_reserve_fraction`` settings):

=================  ======  ==========  =====
window             total   checkpoint  drain
=================  ======  ==========  =====
EC2 Spot           120 s   90 s        30 s
GCE preemption     30 s    ~20 s       ~10 s
GCE maintenance    60 s    ~40 s       ~20 s
=================  ======  ==========  =====

A notice with no deadline (an early warning) gets ``open_budget_s`` (120 s) of checkpoint time.

Scope. ``rank``: every member is asked and every member must ack. ``leader``: only the leader
(the member marked ``is_leader``, else the lowest rank, among those with a URL) is asked; the
result still holds one ack per member: the others copy the leader's outcome and name it in
``RankAck.covered_by``.

One rank's exchange (the request, the polls, the reply's checks) is ``checkpointcall``; this
module fans it out, and holds the budget, the leader and the reading of the acks.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
from opentelemetry import trace as otel

from reclaimd import checkpointcall, putbudget, tracing
from reclaimd.identity import TokenFile, bearer
from reclaimd.model import (
    CheckpointOutcome,
    CheckpointScope,
    Gang,
    Member,
    Notice,
    RankAck,
    utcnow,
)
from reclaimd.settings.checkpoint import CheckpointSettings
from reclaimd.settings.policy import PolicySettings

log = logging.getLogger(__name__)

DRAIN_RESERVE_S = PolicySettings().drain_reserve_s
DRAIN_RESERVE_FRACTION = PolicySettings().drain_reserve_fraction
OPEN_BUDGET_S = 120.0
LAST_ASK_S = 1.0
NOT_OPTED_IN = "not opted in"
CUT_SHORT = "cut short: a notice with an earlier deadline joined the gang"


# --- budget -------------------------------------------------------------------------------


def reserve_for(
    notice: Notice, *, max_s: float = DRAIN_RESERVE_S, fraction: float = DRAIN_RESERVE_FRACTION
) -> float:
    """Seconds kept back from the checkpoint budget for the drain: min(max_s, fraction x window).

    The window runs from when the notice was issued to its deadline, so a notice that reached
    us late still keeps the drain its share instead of giving it away to the checkpoint.
    """
    if notice.deadline is None:
        return 0.0
    window = max(0.0, (notice.deadline - notice.issued_at).total_seconds())
    return max(0.0, min(max_s, fraction * window))


def budget_for(
    notice: Notice, now: datetime, *, reserve_s: float, open_budget_s: float = OPEN_BUDGET_S
) -> datetime:
    """When reclaimd stops waiting for checkpoint acks: ``reserve_s`` before the deadline.

    A notice whose budget is spent (taken over from a peer that stopped or paused, received
    late) still asks each rank once, for ``LAST_ASK_S``: a rank that saved for it (asked by
    the replica before) answers with that save at once, one save per notice, so the gang is
    charged from it rather than from an older checkpoint. A rank that never saved costs the
    drain that second only.
    """
    if notice.deadline is None:
        return now + timedelta(seconds=open_budget_s)
    return max(now + timedelta(seconds=LAST_ASK_S), notice.deadline - timedelta(seconds=reserve_s))


# --- who is asked -------------------------------------------------------------------------


def leader_of(gang: Gang) -> Member | None:
    """The member a ``leader``-scope gang is signalled through, or None if nobody opted in."""
    return _pick_leader([m for m in gang.members if m.checkpoint_url])


def _pick_leader(opted: list[Member]) -> Member | None:
    for m in opted:
        if m.is_leader:
            return m
    if not opted:
        return None
    return min(opted, key=lambda m: (m.rank is None, m.rank or 0, m.namespace, m.name))


def leader_ack(gang: Gang, acks: Iterable[RankAck]) -> RankAck | None:
    """In ``leader`` scope, the ack that speaks for the gang: that of its leader, picked as
    ``leader_of`` picks, among the members with a URL *or an answer*. A leader asked earlier
    under this notice whose pod is gone has no URL left (a successor's gang has it from the
    record), yet its save covers every rank; a follower never speaks while its leader can."""
    acks = list(acks)
    answered = {a.member.uid: a for a in acks if a.acked}
    could = [m for m in gang.members if m.checkpoint_url or m.uid in answered]
    speaker = _pick_leader(could)
    if speaker is None:
        return None
    return answered.get(speaker.uid) or next((a for a in acks if a.member.uid == speaker.uid), None)


# --- fan-out ------------------------------------------------------------------------------


async def signal_gang(
    gang: Gang,
    notice: Notice,
    *,
    budget_deadline: datetime,
    session: aiohttp.ClientSession,
    traceparent: Callable[[Member], str] | None = None,
    concurrency: int = CheckpointSettings().concurrency,
    poll_interval_s: float = CheckpointSettings().poll_interval_s,
    on_ack: Callable[[RankAck], None] | None = None,
    cut: asyncio.Event | None = None,
    put_budgets: putbudget.TenantPutBudgets | None = None,
) -> tuple[RankAck, ...]:
    """Ask the gang to checkpoint; one ``RankAck`` per member, in ``gang.members`` order.

    ``put_budgets``: each request (and each status poll) carries the rank's share of its
    tenant's PutObject budget, across every gang this process asks, so that a storm of saves
    stays inside the tenant's rate (docs/checkpoint-contract.md, "Upload budget").

    ``on_ack`` is called once per member as its outcome is known (for spans, metrics, the
    ``last-checkpoint`` annotation). Returns by ``budget_deadline`` (plus the time to cancel),
    or as soon as ``cut`` is set (a notice dying earlier joined the gang): the ranks that have
    not answered by then count as not acked.
    """
    if concurrency < 1:
        raise ValueError("concurrency must be at least 1")
    if poll_interval_s <= 0:
        raise ValueError("poll_interval_s must be positive")
    loop = asyncio.get_running_loop()
    budget_end = loop.time() + (budget_deadline - utcnow()).total_seconds()
    members = gang.members
    leader = leader_of(gang) if gang.scope is CheckpointScope.LEADER else None
    if gang.scope is CheckpointScope.LEADER:
        asked = [i for i, m in enumerate(members) if m is leader]
    else:
        asked = [i for i, m in enumerate(members) if m.checkpoint_url]
    acks: dict[int, RankAck] = {}

    def settle(i: int, ack: RankAck) -> None:
        acks[i] = ack
        if on_ack is not None:
            on_ack(ack)

    if leader is None:
        for i, m in enumerate(members):
            if i not in asked:
                settle(i, RankAck(member=m, acked=False, error=NOT_OPTED_IN))

    limit = asyncio.Semaphore(concurrency)
    tenant = putbudget.tenant_of(gang)
    keys = [putbudget.rank_key(notice, members[i]) for i in asked]
    if put_budgets is not None:
        # Counted before the first grant, so the first rank does not take the whole budget.
        put_budgets.announce(tenant, keys, deadline=budget_end)

    async def one(member: Member) -> RankAck:
        async with limit:
            return await checkpointcall.signal_member(
                member,
                gang,
                notice,
                session=session,
                budget_end=budget_end,
                budget_deadline=budget_deadline,
                traceparent=traceparent(member) if traceparent is not None else "",
                poll_interval_s=poll_interval_s,
                put_budgets=put_budgets,
                tenant=tenant,
            )

    tasks = {asyncio.create_task(one(members[i])): i for i in asked}
    try:
        await _collect(tasks, members, settle, cut)
    finally:
        if put_budgets is not None:
            put_budgets.release_all(tenant, keys)  # the cut short and the never started

    if leader is not None:
        said = acks[asked[0]]
        who = f"{leader.namespace}/{leader.name}"
        for i, m in enumerate(members):
            if i not in acks:
                settle(i, _covered(m, said, who))
    return tuple(acks[i] for i in range(len(members)))


async def _collect(
    tasks: Mapping[asyncio.Task[RankAck], int],
    members: tuple[Member, ...],
    settle: Callable[[int, RankAck], None],
    cut: asyncio.Event | None,
) -> None:
    """Settle each rank as it answers; once ``cut`` is set, the rest as not acked."""
    pending: set[asyncio.Task[RankAck]] = set(tasks)
    stop = asyncio.create_task(cut.wait()) if cut is not None else None
    try:
        while pending:
            waiting: set[asyncio.Future[Any]] = {*pending, *([stop] if stop else [])}
            done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            for task in pending & done:
                pending.discard(task)
                settle(tasks[task], task.result())
            if stop is not None and stop.done():
                for task in pending:
                    i = tasks[task]
                    settle(i, RankAck(member=members[i], acked=False, error=CUT_SHORT))
                break
    finally:
        if stop is not None:
            stop.cancel()
        # Reached with tasks left only when cut, cancelled (or when on_ack raised): take the
        # requests down with us rather than leave them running unowned.
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending)


def _covered(member: Member, said: RankAck, leader: str) -> RankAck:
    return RankAck(
        member=member,
        acked=said.acked,
        durable=said.durable,
        checkpoint_time=said.checkpoint_time,
        step=said.step,
        uri=said.uri,
        error="" if said.acked else f"leader {leader} did not ack: {said.error}",
        covered_by=leader,
    )


# --- reclaimd's signaller: the fan-out with one span per rank --------------------------------


class Signaller:
    """``signal_gang`` over one shared HTTP session, with a client span per rank (whose
    ``traceparent`` the rank receives), for the runbook."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        tracer: otel.Tracer,
        put_budgets: putbudget.TenantPutBudgets | None = None,
        *,
        settings: CheckpointSettings = CheckpointSettings(),
    ) -> None:
        self.session, self.tracer, self.put_budgets = session, tracer, put_budgets
        self.settings = settings

    async def signal(
        self,
        gang: Gang,
        notice: Notice,
        *,
        budget_deadline: datetime,
        cut: asyncio.Event | None = None,
        on_ack: Callable[[RankAck], None] | None = None,
    ) -> tuple[RankAck, ...]:
        spans: dict[str, otel.Span] = {}

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

        def answered(ack: RankAck) -> None:
            if on_ack is not None:
                on_ack(ack)
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
            return await signal_gang(
                gang,
                notice,
                budget_deadline=budget_deadline,
                session=self.session,
                traceparent=traceparent,
                concurrency=self.settings.concurrency,
                poll_interval_s=self.settings.poll_interval_s,
                on_ack=answered,
                cut=cut,
                put_budgets=self.put_budgets,
            )
        finally:
            for span in spans.values():  # cut short (cancelled) before the rank answered
                span.set_status(otel.StatusCode.ERROR, "checkpoint step ended before the answer")
                span.end()


def session(max_connections: int, identity_token_file: Path | None = None) -> aiohttp.ClientSession:
    """The HTTP session every checkpoint request goes through (status polls and /incarnation
    reads too). Its pool is sized for a storm (thousands of ranks asked within seconds); each
    rank is its own host, so no per-host cap beyond a few sockets (a rank sees a POST and then
    polls). With ``identity_token_file``, every request carries reclaimd's ServiceAccount token
    from it (``identity``), for the ranks that verify who asks."""
    connector = aiohttp.TCPConnector(limit=max_connections, limit_per_host=4)
    middlewares = () if identity_token_file is None else (bearer(TokenFile(identity_token_file)),)
    return aiohttp.ClientSession(
        connector=connector,
        timeout=aiohttp.ClientTimeout(total=None),
        raise_for_status=False,
        middlewares=middlewares,
    )


# --- pure reading of the result -------------------------------------------------------------


def outcome_of(gang: Gang, acks: tuple[RankAck, ...] | list[RankAck]) -> CheckpointOutcome:
    """The gang's checkpoint outcome: every required rank acked durably, some, none, ...

    Scope ``rank`` requires every member, a member without a URL included (its state is not
    saved); scope ``leader`` requires only the leader's ack.
    """
    by_pod = {(a.member.namespace, a.member.name): a for a in acks}
    if gang.scope is CheckpointScope.LEADER:
        spoke = leader_ack(gang, acks)
        speaker = spoke.member if spoke is not None else leader_of(gang)
        if speaker is None:
            return CheckpointOutcome.NOT_OPTED_IN
        required: tuple[Member, ...] = (speaker,)
    else:
        if not any(m.checkpoint_url for m in gang.members):
            return CheckpointOutcome.NOT_OPTED_IN
        required = gang.members
    got = [by_pod.get((m.namespace, m.name)) for m in required]
    acked = [a for a in got if a is not None and a.acked]
    if not acked:
        return CheckpointOutcome.NO_ACK
    if len(acked) < len(required):
        return CheckpointOutcome.PARTIAL
    # A durable save whose time is unknown cannot reset the waste clock: not "checkpointed".
    if not all(a.durable and a.checkpoint_time is not None for a in acked):
        return CheckpointOutcome.NOT_DURABLE
    return CheckpointOutcome.CHECKPOINTED


def durable_since(ack: RankAck) -> datetime | None:
    """The last durable checkpoint of the member after this ack: where its waste counts from."""
    before = ack.member.last_checkpoint
    if ack.acked and ack.durable and ack.checkpoint_time is not None:
        return ack.checkpoint_time if before is None else max(before, ack.checkpoint_time)
    return before


# --- what a successor needs ----------------------------------------------------------


def durable(acks: Iterable[RankAck]) -> list[RankAck]:
    """The acks a successor needs: those naming a durable checkpoint."""
    return [a for a in acks if a.acked and a.durable and a.checkpoint_time is not None]


def merge_acks(fresh: Iterable[RankAck], recorded: Iterable[RankAck]) -> tuple[RankAck, ...]:
    """This run's acks, each replaced by a recorded durable checkpoint that is newer (a rank
    that acked the dead owner may not answer again, or answer with nothing new). A rank's own
    recorded save is never replaced by a copy of another rank's answer (``covered_by``): a
    resumed run that finds the leader's pod gone asks a follower, whose later save is not the
    gang's (failover-4020099555: the leader's recorded save replaced, charged 12 GPU-s of 72)."""
    prior = {a.member.uid: a for a in durable(recorded) if a.member.uid}
    out: list[RankAck] = []
    for ack in fresh:
        old = prior.pop(ack.member.uid, None)
        own = old is not None and not old.covered_by
        if old is not None and (not _newer(ack, old) or (own and ack.covered_by)):
            out.append(replace(old, member=ack.member, latency_s=ack.latency_s))
        else:
            out.append(ack)
    out.extend(prior.values())  # a rank this run did not ask (its pod is gone)
    return tuple(out)


def _newer(ack: RankAck, old: RankAck) -> bool:
    if not (ack.acked and ack.durable and ack.checkpoint_time is not None):
        return False
    return old.checkpoint_time is None or ack.checkpoint_time >= old.checkpoint_time
