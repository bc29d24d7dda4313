"""Kubernetes Events (``events.k8s.io/v1``) on the node and on each affected pod.

What an operator watches (``kubectl get events -A --field-selector reason=Interrupted -w``):
``Interrupted`` when a notice is claimed, then ``Cordoned``, ``CheckpointRequested``,
``CheckpointAcked`` or ``CheckpointMissed``, ``Evicted``, ``Drained`` and
``RestartWasteRecorded``.

Events are best effort and never on the critical path:

- ``record`` never blocks and never raises: it puts the event on a bounded queue and returns.
  When the queue is full the event is dropped and counted: in a storm a notice is never delayed
  for the sake of telling someone about it.
- The writer takes its tokens from the shared Kubernetes write budget with no deadline, which
  sorts after every notice's write, so events use only what the storm leaves over. It makes one
  attempt per event (a 429 still slows the shared budget down) and drops what fails or what has
  waited longer than ``max_age_s``.
- A repeat of the same event (same object, reason, action and note) within ``series_window_s``
  is not a new object: the first one gains a ``series`` (count, last observed), patched at most
  once per ``series_flush_s`` however often it repeats, as client-go's recorder does.
- Sizes are bounded (note 1 kB, reason and action 128 characters, as the API requires), and a
  note is built only from what the caller passes: no labels, so no label value outside the
  ledger's allowlist can reach an Event.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Protocol, TypeVar

from reclaimd.cluster import apiserver, errors
from reclaimd.cluster.apiserver import ApiServer
from reclaimd.model import Gang, Member, Notice, RankAck, RestartWaste
from reclaimd.settings.events import EventSettings

log = logging.getLogger(__name__)

T = TypeVar("T")

CONTROLLER = "reclaimd.io/reclaimd"
NODE_EVENT_NAMESPACE = "default"  # where the kubelet and the node controller put node events
NOTE_LIMIT = 1024
FIELD_LIMIT = 128


class Reason(StrEnum):
    INTERRUPTED = "Interrupted"
    CORDONED = "Cordoned"
    CHECKPOINT_REQUESTED = "CheckpointRequested"
    CHECKPOINT_ACKED = "CheckpointAcked"
    CHECKPOINT_MISSED = "CheckpointMissed"
    EVICTED = "Evicted"
    DRAINED = "Drained"
    RESTART_WASTE_RECORDED = "RestartWasteRecorded"


# The action (what reclaimd did) and the type of each reason: a missed checkpoint or an
# interruption is worth a Warning; the steps of a normal drain are not.
_ACTION: dict[Reason, tuple[str, str]] = {
    Reason.INTERRUPTED: ("Claim", "Warning"),
    Reason.CORDONED: ("Cordon", "Normal"),
    Reason.CHECKPOINT_REQUESTED: ("Checkpoint", "Normal"),
    Reason.CHECKPOINT_ACKED: ("Checkpoint", "Normal"),
    Reason.CHECKPOINT_MISSED: ("Checkpoint", "Warning"),
    Reason.EVICTED: ("Evict", "Normal"),
    Reason.DRAINED: ("Drain", "Normal"),
    Reason.RESTART_WASTE_RECORDED: ("Record", "Normal"),
}


class WriteBudget(Protocol):
    """The part of ``ratelimit.RateLimiter`` the recorder needs."""

    async def call(
        self,
        what: str,
        deadline: datetime | None,
        write: Callable[[], Awaitable[T]],
        *,
        retry_until: datetime | None = None,
    ) -> T: ...


class EventSink(Protocol):
    """Where Events go: the API server (``KubeEventSink``), or a list in a unit test."""

    async def create(self, namespace: str, body: dict[str, Any]) -> None: ...

    async def patch(self, namespace: str, name: str, body: dict[str, Any]) -> None: ...


EVENTS_API = "events.k8s.io/v1"


class KubeEventSink:
    def __init__(self, api: ApiServer) -> None:
        self._api = api

    async def create(self, namespace: str, body: dict[str, Any]) -> None:
        await self._api.post(apiserver.group(EVENTS_API, "events", namespace=namespace), body)

    async def patch(self, namespace: str, name: str, body: dict[str, Any]) -> None:
        await self._api.patch(apiserver.group(EVENTS_API, "events", name, namespace), body)


@dataclass(frozen=True)
class Regarding:
    """The object an Event is about: a Node (cluster-scoped) or a Pod."""

    kind: str
    name: str
    namespace: str = ""
    uid: str = ""

    @classmethod
    def node(cls, name: str, uid: str = "") -> Regarding:
        return cls("Node", name, "", uid)

    @classmethod
    def pod(cls, namespace: str, name: str, uid: str = "") -> Regarding:
        return cls("Pod", name, namespace, uid)

    @property
    def event_namespace(self) -> str:
        return self.namespace or NODE_EVENT_NAMESPACE

    def to_json(self) -> dict[str, str]:
        ref = {"apiVersion": "v1", "kind": self.kind, "name": self.name}
        if self.namespace:
            ref["namespace"] = self.namespace
        if self.uid:
            ref["uid"] = self.uid
        return ref


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _cut_bytes(text: str, limit: int) -> str:
    data = text.encode("utf-8")
    if len(data) <= limit:
        return text
    return data[: limit - 3].decode("utf-8", "ignore") + "…"


def micro_time(when: datetime) -> str:
    """RFC 3339 with microseconds, what a MicroTime field takes."""
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class _Entry:
    """One event object on the server (or about to be): the first record and its repeats."""

    key: tuple[str, ...]
    regarding: Regarding
    reason: Reason
    note: str
    name: str
    first_seen: float  # loop time
    first_time: datetime
    count: int = 1
    last_time: datetime = field(default_factory=lambda: datetime.now(UTC))
    created: bool = False
    queued: bool = False
    flush_scheduled: bool = False
    flushed_count: int = 1
    flushed_at: float = 0.0
    enqueued_at: float = 0.0


class EventRecorder:
    """Emits Events through a background writer; ``record`` is the only call on the hot path.

    ``start`` the writers once the loop runs, ``close`` on shutdown (pending events are
    dropped, not waited for).
    """

    def __init__(
        self,
        sink: EventSink | ApiServer,
        budget: WriteBudget,
        *,
        instance: str,
        settings: EventSettings = EventSettings(),
        clock: Callable[[], float] = time.monotonic,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._sink = KubeEventSink(sink) if isinstance(sink, ApiServer) else sink
        self._budget = budget
        self._instance = _cut(instance, FIELD_LIMIT)
        self.settings = settings
        self._clock = clock
        self._now = now
        self._queue: asyncio.Queue[_Entry] = asyncio.Queue(maxsize=settings.queue_size)
        self._entries: OrderedDict[tuple[str, ...], _Entry] = OrderedDict()
        self._tasks: list[asyncio.Task[None]] = []
        self._closed = False
        self.emitted = 0  # create or series patch accepted by the server
        self.aggregated = 0  # records that joined an existing series
        self.dropped: Counter[str] = Counter()  # by cause: queue_full, stale, failed, closed

    # --- the hot path ------------------------------------------------------------------------

    def record(self, regarding: Regarding, reason: Reason, note: str) -> bool:
        """Queue one event; False when it was dropped (counted in ``dropped``)."""
        note = _cut_bytes(note, NOTE_LIMIT)
        key = (
            regarding.kind,
            regarding.namespace,
            regarding.name,
            regarding.uid,
            reason.value,
            note,
        )
        now = self._clock()
        entry = self._entries.get(key)
        if entry is not None and now - entry.first_seen <= self.settings.series_window_s:
            entry.count += 1
            entry.last_time = self._now()
            self._entries.move_to_end(key)
            self.aggregated += 1
            if entry.queued or not entry.created or entry.flush_scheduled:
                return True  # a pending write will carry the new count
            wait = entry.flushed_at + self.settings.series_flush_s - now
            if wait > 0:
                # Flushed recently: one patch later carries every repeat until then.
                entry.flush_scheduled = True
                asyncio.get_running_loop().call_later(wait, self._flush_later, entry)
                return True
            return self._enqueue(entry, now)
        stamp = self._now()
        entry = _Entry(
            key=key,
            regarding=regarding,
            reason=reason,
            note=note,
            name=self._name(regarding, reason, note, stamp),
            first_seen=now,
            first_time=stamp,
            last_time=stamp,
        )
        self._entries[key] = entry
        self._entries.move_to_end(key)
        while len(self._entries) > self.settings.series_cache:
            self._entries.popitem(last=False)
        return self._enqueue(entry, now)

    def _flush_later(self, entry: _Entry) -> None:
        entry.flush_scheduled = False
        if not self._closed and self._entries.get(entry.key) is entry and not entry.queued:
            self._enqueue(entry, self._clock())

    def _enqueue(self, entry: _Entry, now: float) -> bool:
        try:
            self._queue.put_nowait(entry)
        except asyncio.QueueFull:
            self.dropped["queue_full"] += 1
            if not entry.created:
                # Never written: forget it, so a later repeat starts over instead of
                # counting into an object that does not exist.
                self._entries.pop(entry.key, None)
            return False
        entry.queued = True
        entry.enqueued_at = now
        return True

    @staticmethod
    def _name(regarding: Regarding, reason: Reason, note: str, stamp: datetime) -> str:
        # Unique per event like client-go's "<object>.<hex time>", plus a digest so two
        # reasons recorded in the same microsecond do not collide.
        digest = hashlib.sha256(f"{reason}|{note}|{stamp.timestamp()}".encode()).hexdigest()
        return f"{regarding.name[:200]}.{digest[:16]}"

    @property
    def queued(self) -> int:
        return self._queue.qsize()

    # --- the writer --------------------------------------------------------------------------

    async def run(self) -> None:
        """The writers, as one supervised task: ``start``, then wait until cancelled."""
        self.start()
        try:
            await asyncio.gather(*self._tasks)
        finally:
            await self.close()

    def start(self) -> None:
        if self._tasks:
            return
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._writer(), name=f"k8s-events-{i}")
            for i in range(self.settings.writers)
        ]

    async def close(self) -> None:
        self._closed = True
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        while not self._queue.empty():
            self._queue.get_nowait()
            self.dropped["closed"] += 1

    async def drain(self) -> None:
        """Wait until every queued event is written or dropped (tests, orderly shutdown)."""
        await self._queue.join()

    async def _writer(self) -> None:
        while True:
            entry = await self._queue.get()
            entry.queued = False  # from now on a repeat must queue it again
            try:
                await self._write(entry)
            except Exception as e:  # best effort: an event never takes the daemon down
                self.dropped["failed"] += 1
                log.debug("event %s on %s dropped: %s", entry.reason, entry.regarding.name, e)
            finally:
                self._queue.task_done()

    async def _write(self, entry: _Entry) -> None:
        if self._clock() - entry.enqueued_at > self.settings.max_age_s:
            self.dropped["stale"] += 1
            if not entry.created:
                self._entries.pop(entry.key, None)
            return
        ns = entry.regarding.event_namespace
        # One attempt: retry_until now means a throttled write is not retried (the budget
        # still hears the 429 and slows every writer down).
        once = self._now()
        if not entry.created:
            body = self._body(entry)
            what = f"create event/{entry.reason} on {entry.regarding.name}"
            with contextlib.suppress(errors.Conflict):  # a name collision: it is there already
                await self._budget.call(
                    what,
                    None,
                    lambda: self._sink.create(ns, body),
                    retry_until=once,
                )
            entry.created = True
        else:
            count = entry.count
            patch = {"series": {"count": count, "lastObservedTime": micro_time(entry.last_time)}}
            what = f"patch event/{entry.reason} on {entry.regarding.name}"
            try:
                await self._budget.call(
                    what,
                    None,
                    lambda: self._sink.patch(ns, entry.name, patch),
                    retry_until=once,
                )
            except errors.NotFound:
                # Expired (events live an hour by default): the repeat starts a new object.
                self._entries.pop(entry.key, None)
                raise
            entry.flushed_count = count
        entry.flushed_at = self._clock()
        self.emitted += 1
        if entry.count > entry.flushed_count:
            # Repeats arrived while this write was in flight: one more flush, later.
            self._enqueue(entry, self._clock())

    def _body(self, entry: _Entry) -> dict[str, Any]:
        action, kind = _ACTION[entry.reason]
        body: dict[str, Any] = {
            "apiVersion": EVENTS_API,
            "kind": "Event",
            "metadata": {"name": entry.name, "namespace": entry.regarding.event_namespace},
            "eventTime": micro_time(entry.first_time),
            "reportingController": CONTROLLER,
            "reportingInstance": self._instance,
            "action": action,
            "reason": entry.reason.value,
            "type": kind,
            "regarding": entry.regarding.to_json(),
            "note": entry.note,
        }
        if entry.count > 1:
            body["series"] = {"count": entry.count, "lastObservedTime": micro_time(entry.last_time)}
            entry.flushed_count = entry.count
        return body


def notice_note(source: str, kind: str, notice_id: str, deadline: datetime | None) -> str:
    """The ``Interrupted`` note: where the notice came from, what it says, when the node goes."""
    when = micro_time(deadline) if deadline is not None else "none"
    return f"{_cut(source, 40)} {_cut(kind, 40)} notice {_cut(notice_id, 200)}; deadline {when}"


class NoticeEvents:
    """The pipeline's steps as Events: one call per step, each never blocking or raising.

    Notes carry only the notice's source, kind, id and deadline, object names, outcomes and
    numbers: never a label value, so nothing outside the ledger's label allowlist is shown.
    """

    def __init__(self, recorder: EventRecorder) -> None:
        self.recorder = recorder

    def claimed(self, notice: Notice, nodes: tuple[str, ...], *, cordoned: bool) -> None:
        note = notice_note(notice.source, notice.kind.value, notice.id, notice.deadline)
        for node in nodes:
            self.recorder.record(Regarding.node(node), Reason.INTERRUPTED, note)
            if cordoned:
                self.recorder.record(
                    Regarding.node(node),
                    Reason.CORDONED,
                    f"cordoned and tainted {_cut(notice.kind.value, 40)} "
                    f"for notice {_cut(notice.id, 200)}",
                )

    def checkpoint_requested(self, notice: Notice, gang: Gang, budget_end: datetime) -> None:
        note = (
            f"checkpoint requested for gang {_cut(gang.key.name, 200)} by "
            f"{micro_time(budget_end)} (notice {_cut(notice.id, 200)})"
        )
        for member in gang.members:
            self.recorder.record(_pod(member), Reason.CHECKPOINT_REQUESTED, note)

    def checkpoint_answered(self, acks: tuple[RankAck, ...] | list[RankAck]) -> None:
        for ack in acks:
            if ack.acked:
                where = f" covered by {_cut(ack.covered_by, 200)}" if ack.covered_by else ""
                durable = "durable" if ack.durable else "not durable"
                note = f"checkpoint acked ({durable}, {ack.latency_s:.1f}s){where}"
                self.recorder.record(_pod(ack.member), Reason.CHECKPOINT_ACKED, note)
            else:
                why = _cut(ack.error, 200) or "no answer within the budget"
                self.recorder.record(
                    _pod(ack.member), Reason.CHECKPOINT_MISSED, f"checkpoint missed: {why}"
                )

    def evicted(self, member: Member, outcome: str) -> None:
        self.recorder.record(_pod(member), Reason.EVICTED, f"drain: {_cut(outcome, 40)}")

    def drained(self, notice: Notice, nodes: tuple[str, ...]) -> None:
        for node in nodes:
            self.recorder.record(
                Regarding.node(node), Reason.DRAINED, f"drained for notice {_cut(notice.id, 200)}"
            )

    def recorded(self, waste: RestartWaste) -> None:
        note = (
            f"restart waste {waste.gpu_seconds_lost:.0f} GPU-seconds, checkpoint "
            f"{waste.outcome.value}, deadline {'met' if waste.deadline_met else 'missed'} "
            f"(event {_cut(waste.event_id, 100)})"
        )
        for member in waste.gang.members:
            self.recorder.record(_pod(member), Reason.RESTART_WASTE_RECORDED, note)


def _pod(member: Member) -> Regarding:
    return Regarding.pod(member.namespace, member.name, member.uid)
