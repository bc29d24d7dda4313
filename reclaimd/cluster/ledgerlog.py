"""Ledger events not yet acked by Kafka, recorded in the cluster so any replica can publish them.

The local outbox (``reclaimd.outbox``) survives a crash but not the loss of its disk (in a
cluster it is an emptyDir). So before the runbook's ledger call returns, the event is also
written here: one Lease per pending event in reclaimd's namespace, named from the topic and the
event id, holding the encoded event (an annotation) and its holder. Once Kafka acked the event
the writer marks the record published (the event body goes, a tombstone stays for
``KEEP_PUBLISHED_S``): a replica that takes the notice over later and charges the same gang
again finds the tombstone when it records, and publishes nothing. So the record is the event
id's lock, before and after publication. A replica whose holder Lease goes stale leaves its
records behind, and a
peer adopts them (a resourceVersion-preconditioned patch naming itself, so two peers cannot
both adopt) and publishes them (``ledger.writer.LedgerWriter``, which also makes that exactly once).

Every holder a record ever had is kept on it (``reclaimd.io/ledger-holders``): an adopter fences
each of their Kafka transactions before it looks at the topic, so a paused replica that wakes
up cannot commit a copy behind its back.

Writes go through the one write budget (``RateLimiter.call``): a record at its notice's
deadline priority (the runbook waits for it), an adoption or a deletion last (nothing waits).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final

from reclaimd.cluster import apiserver, errors, leases, objects
from reclaimd.cluster.apiserver import ApiServer
from reclaimd.cluster.ratelimit import RateLimiter
from reclaimd.model import parse_time, rfc3339, utcnow

log = logging.getLogger(__name__)

EVENT_LABEL: Final = "reclaimd.io/ledger-event"
TOPIC_LABEL: Final = "reclaimd.io/ledger-topic"
EVENT_ANNOTATION: Final = "reclaimd.io/ledger-event"
HOLDER_ANNOTATION: Final = "reclaimd.io/holder"
HOLDERS_ANNOTATION: Final = "reclaimd.io/ledger-holders"
PUBLISHED_ANNOTATION: Final = "reclaimd.io/ledger-published"  # {"topic", "id", "at"}
# A tombstone outlives every takeover of its notice (they come within one window); then it goes.
KEEP_PUBLISHED_S: Final = 6 * 3600.0
# The API server refuses more than 256 KiB of annotations on one object; leave room for the
# others and for JSON escaping. An event is a few KiB (one part per node of the gang).
MAX_EVENT_BYTES: Final = 200 * 1024
# Nothing waits on an adoption or a deletion: served after every notice's write.
LAST: Final = timedelta(days=1)
AFTER_DRAINS: Final = timedelta(seconds=60)

Headers = tuple[tuple[str, bytes], ...]


class TooLarge(ValueError):
    """The encoded event does not fit in an annotation: it stays in the local outbox only."""


@dataclass(frozen=True)
class PendingEvent:
    """One cluster record: the event as the outbox holds it, and who holds it now."""

    name: str
    topic: str
    event_id: str
    key: bytes | None
    value: bytes
    headers: Headers
    recorded_at: datetime
    holder: str
    holders: tuple[str, ...]  # every holder it had, the first writer first
    resource_version: str = ""
    published_at: datetime | None = None  # set: a tombstone (the event is on the topic)


def record_name(topic: str, event_id: str) -> str:
    # Event ids and topics need not be valid object names (or short enough): hash them.
    digest = hashlib.sha256(f"{topic}\0{event_id}".encode("utf-8", "surrogatepass")).hexdigest()
    return "reclaimd-ledger-" + digest[:40]


def topic_label(topic: str) -> str:
    return hashlib.sha256(topic.encode()).hexdigest()[:40]


def encode_event(
    topic: str,
    event_id: str,
    *,
    key: bytes | None,
    value: bytes,
    headers: Iterable[tuple[str, bytes]],
    recorded_at: datetime,
) -> str:
    """The annotation's JSON; ``TooLarge`` past ``MAX_EVENT_BYTES``."""
    doc: dict[str, Any] = {
        "topic": topic,
        "id": event_id,
        "key": None if key is None else base64.b64encode(key).decode(),
        "headers": [[k, base64.b64encode(v).decode()] for k, v in headers],
        "recorded_at": rfc3339(recorded_at),
    }
    try:
        doc["value"] = value.decode()  # ledger rows are JSON: readable with kubectl
    except UnicodeDecodeError:
        doc["value_b64"] = base64.b64encode(value).decode()
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"))
    if len(text.encode()) > MAX_EVENT_BYTES:
        raise TooLarge(f"ledger event {event_id}: {len(text)} bytes, over {MAX_EVENT_BYTES}")
    return text


def decode_event(
    name: str,
    annotations: dict[str, str],
    resource_version: str = "",
) -> PendingEvent:
    """The record back from its annotations; ``ValueError`` if they are not one of ours."""
    if PUBLISHED_ANNOTATION in annotations:
        return _decode_tombstone(name, annotations, resource_version)
    try:
        doc = json.loads(annotations[EVENT_ANNOTATION])
        holder = annotations[HOLDER_ANNOTATION]
        holders = json.loads(annotations.get(HOLDERS_ANNOTATION) or "[]")
        value = (
            doc["value"].encode()
            if "value" in doc
            else base64.b64decode(doc["value_b64"], validate=True)
        )
        key = None if doc["key"] is None else base64.b64decode(doc["key"], validate=True)
        headers = tuple((str(k), base64.b64decode(v, validate=True)) for k, v in doc["headers"])
        if not isinstance(holders, list) or not all(isinstance(h, str) for h in holders):
            raise ValueError("holders is not a list of names")
        return PendingEvent(
            name=name,
            topic=str(doc["topic"]),
            event_id=str(doc["id"]),
            key=key,
            value=value,
            headers=headers,
            recorded_at=parse_time(str(doc["recorded_at"])),
            holder=str(holder),
            holders=tuple(holders) if holders else (str(holder),),
            resource_version=resource_version,
        )
    except (KeyError, TypeError, AttributeError, ValueError) as e:
        raise ValueError(f"ledger record {name}: {type(e).__name__}: {e}"[:200]) from e


def _decode_tombstone(
    name: str, annotations: dict[str, str], resource_version: str
) -> PendingEvent:
    try:
        doc = json.loads(annotations[PUBLISHED_ANNOTATION])
        at = parse_time(str(doc["at"]))
        holder = str(annotations.get(HOLDER_ANNOTATION, ""))
        return PendingEvent(
            name=name,
            topic=str(doc["topic"]),
            event_id=str(doc["id"]),
            key=None,
            value=b"",
            headers=(),
            recorded_at=at,
            holder=holder,
            holders=(holder,),
            resource_version=resource_version,
            published_at=at,
        )
    except (KeyError, TypeError, AttributeError, ValueError) as e:
        raise ValueError(f"ledger record {name}: {type(e).__name__}: {e}"[:200]) from e


def _holders(previous: Sequence[str], holder: str) -> tuple[str, ...]:
    return (*[h for h in previous if h != holder], holder)


class LedgerLog:
    """The cluster records of one topic's pending events, as seen by ``holder``."""

    def __init__(
        self,
        api: ApiServer,
        namespace: str,
        holder: str,
        topic: str,
        *,
        limiter: RateLimiter,
        write_s: float = 10.0,
    ) -> None:
        self._api = api
        self.namespace, self.holder, self.topic = namespace, holder, topic
        self._limiter = limiter
        self._write_s = write_s  # how long a record's write is retried (past the deadline too)
        self.undecodable = 0  # records found that are not ours to read: left alone, counted

    def _body(self, name: str, event: str, holders: tuple[str, ...]) -> dict[str, Any]:
        return {
            "metadata": {
                "name": name,
                "labels": {EVENT_LABEL: "true", TOPIC_LABEL: topic_label(self.topic)},
                "annotations": {
                    EVENT_ANNOTATION: event,
                    HOLDER_ANNOTATION: self.holder,
                    HOLDERS_ANNOTATION: json.dumps(list(holders)),
                },
            },
            "spec": {"holderIdentity": self.holder[:128]},
        }

    async def put(
        self,
        event_id: str,
        key: bytes | None,
        value: bytes,
        headers: Iterable[tuple[str, bytes]],
        *,
        deadline: datetime | None,
    ) -> bool:
        """Record the event, held by us; a record already there (a replay, or a peer's copy)
        is left as it is. True if this call created it. Raises ``TooLarge`` or
        ``errors.KubeError`` (the event then lives in the outbox only)."""
        now = utcnow()
        name = record_name(self.topic, event_id)
        body = self._body(
            name,
            encode_event(
                self.topic, event_id, key=key, value=value, headers=headers, recorded_at=now
            ),
            (self.holder,),
        )
        # After the evictions due by the same deadline: a storm's drains make the deadlines,
        # this only how soon the event is published (it is in the outbox already).
        order = deadline + AFTER_DRAINS if deadline is not None else None
        # Conflict: recorded before (by us, or adopted since: the publisher checks the holder).
        try:
            await self._limiter.call(
                f"create lease/{name}",
                order,
                lambda: self._api.post(apiserver.lease(self.namespace), body),
                retry_until=now + timedelta(seconds=self._write_s),
            )
        except errors.Conflict:
            return False
        return True

    async def pending(self) -> list[PendingEvent]:
        """The records of events not yet published."""
        return [r for r in await self.records() if r.published_at is None]

    async def records(self) -> list[PendingEvent]:
        """Every record of this topic, tombstones too, read now (a quorum read, not a cache)."""
        return [ev for _, ev in await self._listed()]

    async def _listed(self) -> list[tuple[objects.Obj, PendingEvent]]:
        selector = f"{EVENT_LABEL}=true,{TOPIC_LABEL}={topic_label(self.topic)}"
        found = await self._limiter.read(
            "list ledger leases",
            None,
            lambda: self._api.get(apiserver.lease(self.namespace), labelSelector=selector),
            retry_until=utcnow() + timedelta(seconds=self._write_s),
        )
        out: list[tuple[objects.Obj, PendingEvent]] = []
        for lease in objects.items(found):
            try:
                ev = decode_event(
                    objects.name(lease), objects.annotations(lease), objects.version(lease)
                )
            except ValueError as e:
                self.undecodable += 1
                log.warning("%s", e)
                continue
            if ev.topic == self.topic:
                out.append((lease, ev))
        return out

    async def adopt(self, ev: PendingEvent) -> PendingEvent | None:
        """Name ourselves its holder, if nobody wrote the record since ``ev`` was read; the
        adopted record, or ``None`` when a peer adopted it first or it is gone (published)."""
        holders = _holders(ev.holders, self.holder)
        body: dict[str, Any] = {
            "metadata": {
                "resourceVersion": ev.resource_version,  # the precondition: 409 if it moved
                "annotations": {
                    HOLDER_ANNOTATION: self.holder,
                    HOLDERS_ANNOTATION: json.dumps(list(holders)),
                },
            },
            "spec": {"holderIdentity": self.holder[:128]},
        }
        now = utcnow()
        try:
            lease = await self._limiter.call(
                f"adopt lease/{ev.name}",
                now + LAST,
                lambda: self._api.patch(apiserver.lease(self.namespace, ev.name), body),
                retry_until=now + timedelta(seconds=self._write_s),
            )
        except (errors.Conflict, errors.NotFound):
            return None
        return PendingEvent(
            name=ev.name,
            topic=ev.topic,
            event_id=ev.event_id,
            key=ev.key,
            value=ev.value,
            headers=ev.headers,
            recorded_at=ev.recorded_at,
            holder=self.holder,
            holders=holders,
            resource_version=objects.version(lease),
        )

    async def mark_published(self, event_id: str) -> None:
        """The event is on the topic: its record becomes a tombstone (gone already: fine)."""
        name = record_name(self.topic, event_id)
        now = utcnow()
        stone = json.dumps({"topic": self.topic, "id": event_id, "at": rfc3339(now)})
        body = {"metadata": {"annotations": {PUBLISHED_ANNOTATION: stone, EVENT_ANNOTATION: None}}}
        with contextlib.suppress(errors.NotFound):
            await self._limiter.call(
                f"publish lease/{name}",
                now + LAST,
                lambda: self._api.patch(apiserver.lease(self.namespace, name), body),
                retry_until=now + timedelta(seconds=60),
            )

    async def sweep(self, keep_s: float = KEEP_PUBLISHED_S) -> int:
        """Delete the tombstones older than ``keep_s``; how many went."""
        cutoff = utcnow() - timedelta(seconds=keep_s)
        gone = 0
        for lease, rec in await self._listed():
            if rec.published_at is not None and rec.published_at < cutoff:
                gone += await leases.delete_unchanged(
                    self._api, self._limiter, self.namespace, lease
                )
        return gone
