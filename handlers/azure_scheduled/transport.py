"""Azure Scheduled Events transport, for per-node mode (a DaemonSet on AKS Spot node pools).

Polls ``GET /metadata/scheduledevents?api-version=2020-07-01`` with ``Metadata: true`` once per
``poll_interval_s`` (jittered; the docs recommend once a second, a Preempt gives 30 s). The
document lists events for every VM of the availability set or placement group, so this VM's
identity is read once at start from ``/metadata/instance/compute`` and sent with each document
in the envelope the ``azure-scheduled`` parser reads (``handlers/azure_scheduled/parser.py``).

A document is handed to the parser when its ``DocumentIncarnation`` changes (the docs: "documents
with the same incarnation contain the same event information"), and again on every poll until
its admission allows the ack: a claim that could not be written must not be forgotten because
the document did not change. The parser keys a notice on VM + ``EventId``, so a re-read, or
the ``Started`` document that follows our own approval, is a duplicate the intake absorbs.

After the drain, ``AzureStartRequests`` (the source's ``AfterDrain`` part) approves the event
with ``POST {"StartRequests": [{"EventId": ...}]}``, so the platform need not wait out
``NotBefore``; only for notices the parser marked ``approvable`` (still ``Scheduled``, this VM
its only resource), and only when the gangs drained: otherwise the window runs its course.

The first request may take up to two minutes (it enables Scheduled Events for the VM); after
that a slow IMDS is retried on ``reclaimd.backoff.Backoff``, never longer than
``MAX_BACKOFF_S``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp

from reclaimd import logs
from reclaimd.backoff import Backoff
from reclaimd.handlers.azure_scheduled.parser import AzureEventFacts, parse
from reclaimd.handlers.azure_scheduled.settings import AzureScheduledSettings
from reclaimd.handlers.base import Parser
from reclaimd.handlers.entry import Entry
from reclaimd.handlers.transport import Admit, Counters, Read, Supplies, deliver, poll_forever
from reclaimd.model import Notice, Windows, utcnow

log = logging.getLogger(__name__)

API_VERSION = "2020-07-01"
COMPUTE_API_VERSION = "2021-02-01"  # compute.priority needs 2020-12-01 or later
EVENTS_PATH = "/metadata/scheduledevents"
COMPUTE_PATH = "/metadata/instance/compute"
HEADERS = {"Metadata": "true"}
FIRST_TIMEOUT_S = 130.0  # the docs: "a delayed response in your first call of up to two minutes"
TIMEOUT_S = 5.0
MAX_BACKOFF_S = 5.0  # a Preempt gives 30 s: never sleep through a sixth of it
SOURCE_PREFIX = "azure.scheduled."  # its parser's notice sources (parser.SOURCES)


class MetadataError(Exception):
    """IMDS did not answer as IMDS; the message is one line."""


@dataclass(frozen=True)
class Identity:
    """This VM, as ``/metadata/instance/compute`` describes it."""

    vm_name: str
    resource_id: str = ""
    vm_size: str = ""
    priority: str = ""
    location: str = ""
    zone: str = ""

    @classmethod
    def from_compute(cls, compute: Mapping[str, Any]) -> Identity:
        def get(key: str) -> str:
            value = compute.get(key)
            return value.strip() if isinstance(value, str) else ""

        if not get("name"):
            raise MetadataError("compute metadata without a VM name")
        return cls(
            vm_name=get("name"),
            resource_id=get("resourceId"),
            vm_size=get("vmSize"),
            priority=get("priority"),
            location=get("location"),
            zone=get("zone"),
        )


def envelope(identity: Identity, document: str, node_name: str = "") -> dict[str, str]:
    """What the ``azure-scheduled`` parser reads: the identity, and the document as received."""
    pairs = {
        "vm_name": identity.vm_name,
        "resource_id": identity.resource_id,
        "node_name": node_name,
        "vm_size": identity.vm_size,
        "priority": identity.priority,
        "location": identity.location,
        "zone": identity.zone,
        "document": document,
    }
    return {k: v for k, v in pairs.items() if v}


def version_of(document: str) -> str:
    """What tells one document from the next: its ``DocumentIncarnation``, else its digest (a
    document without one is still delivered once, for the parser to refuse and count)."""
    try:
        incarnation = json.loads(document).get("DocumentIncarnation")
    except (ValueError, AttributeError, RecursionError):
        incarnation = None
    if isinstance(incarnation, int | str) and not isinstance(incarnation, bool):
        return f"incarnation:{incarnation}"
    return "sha256:" + hashlib.sha256(document.encode()).hexdigest()


@dataclass
class DocumentState:
    """What the poller knows of the document between polls."""

    version: str = ""
    settled: bool = False  # the document under ``version`` was delivered and may be forgotten

    def observe(self, version: str) -> bool:
        """Record a document's version; whether it must be delivered."""
        if version != self.version:
            self.version, self.settled = version, False
        return not self.settled


class AzureScheduledSource:
    def __init__(
        self,
        settings: AzureScheduledSettings,
        *,
        admit: Admit,
        windows: Windows,
        parser: Parser = parse,
    ) -> None:
        self.settings, self.admit, self.windows = settings, admit, windows
        self.parser = parser
        self.base = settings.url.rstrip("/")
        self.counters = Counters()
        self.identity: Identity | None = None
        self.state = DocumentState()
        self._first = True  # the first events request may take two minutes

    async def run(self) -> None:
        async with aiohttp.ClientSession(headers=HEADERS) as session:
            # A per-node poller outlives any one bad response.
            await poll_forever(
                lambda: self.poll_once(session), interval_s=self.settings.poll_interval_s,
                max_backoff_s=MAX_BACKOFF_S, counters=self.counters,
                what="azure scheduled events",
            )  # fmt: skip

    async def poll_once(self, session: aiohttp.ClientSession) -> bool:
        """One poll; True when a document was handed to the parser."""
        if self.identity is None:
            self.identity = await self.read_identity(session)
        document = await self.get_document(session)
        if not self.state.observe(version_of(document)):
            return False
        self.state.settled = await self.deliver(document)
        return True

    async def read_identity(self, session: aiohttp.ClientSession) -> Identity:
        compute = json.loads(await self._get(session, COMPUTE_PATH, COMPUTE_API_VERSION))
        if not isinstance(compute, dict):
            raise MetadataError("compute metadata is not an object")
        identity = Identity.from_compute(compute)
        computer = str((compute.get("osProfile") or {}).get("computerName", "")).lower()
        if self.settings.node_name and computer and self.settings.node_name != computer:
            # AKS names the node after the computer name; a mismatch is a misconfigured
            # DaemonSet, and the notice still targets the VM by its providerID.
            logs.event(
                log,
                "node name is not the computer name",
                logging.WARNING,
                node_name=self.settings.node_name,
                computer_name=computer,
            )
        logs.event(
            log,
            "azure scheduled events watching",
            vm=identity.vm_name,
            vm_size=identity.vm_size,
            priority=identity.priority,
        )
        return identity

    async def get_document(self, session: aiohttp.ClientSession) -> str:
        limit_s = FIRST_TIMEOUT_S if self._first else TIMEOUT_S
        document = await self._get(session, EVENTS_PATH, API_VERSION, limit_s)
        self._first = False
        return document

    async def _get(
        self, session: aiohttp.ClientSession, path: str, version: str, limit_s: float = TIMEOUT_S
    ) -> str:
        url = f"{self.base}{path}"
        async with session.get(
            url,
            params={"api-version": version},
            timeout=aiohttp.ClientTimeout(total=limit_s),
            allow_redirects=False,  # IMDS never redirects; a redirect is not IMDS
        ) as r:
            if r.status != 200:
                raise MetadataError(f"{path}: HTTP {r.status}")
            return await r.text()

    async def deliver(self, document: str) -> bool:
        """Parse and admit one document; True when it needs no further delivery."""
        assert self.identity is not None
        delivered = await deliver(
            self.parser,
            json.dumps(envelope(self.identity, document, self.settings.node_name)).encode(),
            admit=self.admit,
            windows=self.windows,
            counters=self.counters,
            what="azure scheduled events document",
            incarnation=self.state.version,
        )
        if delivered.read is Read.NOTICES:  # a document's ack is its settling
            if delivered.settled:
                self.counters.acked += 1
            else:
                self.counters.left_for_redelivery += 1
        return delivered.settled


# --- after the drain: approve the event --------------------------------------------------------


def approvable_event(notice: Notice) -> str:
    """The EventId to approve for a notice, or "" (another source's, or not approvable)."""
    if not notice.source.startswith(SOURCE_PREFIX):
        return ""
    facts = AzureEventFacts.of(notice)
    return facts.event_id if facts.approvable == "true" else ""


@dataclass
class ApprovalCounters:
    approved: int = 0
    not_drained: int = 0  # left to run to NotBefore: the gangs are not off the node
    errors: int = 0


class AzureStartRequests:
    """The source's after-drain part (``reclaimd.afterdrain.AfterDrain``): StartRequests."""

    ATTEMPTS = 3

    def __init__(self, settings: AzureScheduledSettings) -> None:
        self.settings = settings
        self.url = f"{settings.url.rstrip('/')}{EVENTS_PATH}"
        self.counters = ApprovalCounters()
        self._done: set[str] = set()  # approved (a resumed notice approves once)

    @contextlib.asynccontextmanager
    async def holding(self, notice: Notice) -> AsyncIterator[None]:
        yield  # nothing to keep alive while draining: NotBefore is the platform's clock

    async def finished(self, notice: Notice, drained: bool) -> None:
        event_id = approvable_event(notice)
        if not event_id or event_id in self._done or not self.settings.approve:
            return
        if not drained:
            self.counters.not_drained += 1
            logs.event(log, "scheduled event left to its NotBefore", event_id=event_id)
            return
        if await self.approve(event_id, notice):
            self._done.add(event_id)
            self.counters.approved += 1
            logs.event(log, "scheduled event approved", notice_id=notice.id, event_id=event_id)

    async def approve(self, event_id: str, notice: Notice) -> bool:
        """POST StartRequests, retried on the one backoff until approved, refused (400) or
        past the notice's deadline (the event starts by itself then). Never raises."""
        backoff = Backoff(0.2, 2.0)
        body = {"StartRequests": [{"EventId": event_id}]}
        for attempt in range(self.ATTEMPTS):
            try:
                async with (
                    aiohttp.ClientSession(headers=HEADERS) as session,
                    session.post(
                        self.url,
                        params={"api-version": API_VERSION},
                        json=body,
                        timeout=aiohttp.ClientTimeout(total=TIMEOUT_S),
                        allow_redirects=False,
                    ) as r,
                ):
                    status = r.status
            except asyncio.CancelledError:
                raise
            except Exception as e:
                status, error = 0, f"{type(e).__name__}: {e}"[:200]
            else:
                error = f"HTTP {status}"
            if status == 200:
                return True
            self.counters.errors += 1
            logs.event(log, "StartRequests failed", logging.WARNING, event_id=event_id, error=error)
            late = notice.deadline is not None and utcnow() >= notice.deadline
            if status == 400 or late or attempt == self.ATTEMPTS - 1:
                return False  # a malformed request stays malformed; a started event needs none
            await backoff.sleep()
        return False


# --- built by the registry (reclaimd.handlers.build), for an enabled source ----------------


def build(entry: Entry[AzureScheduledSettings], w: Supplies) -> AzureScheduledSource:
    s = entry.section(w.settings)
    return AzureScheduledSource(s, admit=w.admit, windows=w.windows, parser=entry.parse)


def after_drain(s: AzureScheduledSettings) -> AzureStartRequests:
    """Approve the drained notice's event on this node's metadata service."""
    return AzureStartRequests(s)
