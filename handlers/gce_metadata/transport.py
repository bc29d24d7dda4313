"""GCE metadata-server transport, for per-node mode (one reclaimd per node, hostNetwork).

Two watchers, one per key, ``instance/preempted`` and ``instance/maintenance-event``. Each
reads its key once (so a restart in the middle of a notice acts at once), then loops on
hanging GETs ``?wait_for_change=true&last_etag=<etag>&timeout_sec=N``: the server answers
when the value changes, or after N seconds with the unchanged value and ETag. Every request
carries ``Metadata-Flavor: Google``, and a response without that header back is refused: it
did not come from a metadata server (a proxy, a captive endpoint, a wrong URL).

The instance's name, zone and project are read once at start; with each value they form the
envelope the ``gce-metadata`` parser reads. A value is delivered when its ETag is new, and
again (after a short pause, with a plain read instead of a hanging one) until its admission
allows the ack: a claim that could not be written must not be forgotten because the value
did not change. The parser derives the notice id from VM + value + ETag, so re-delivering
one value is a duplicate the intake absorbs.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import aiohttp

from reclaimd import logs
from reclaimd.backoff import Backoff
from reclaimd.handlers.base import Parser
from reclaimd.handlers.entry import Entry
from reclaimd.handlers.gce_metadata.parser import parse
from reclaimd.handlers.gce_metadata.settings import GceMetadataSettings
from reclaimd.handlers.transport import Admit, Counters, Read, Supplies, deliver
from reclaimd.model import Windows, rfc3339, utcnow

log = logging.getLogger(__name__)

PATHS = ("instance/preempted", "instance/maintenance-event")
FLAVOR = "Metadata-Flavor"
PREFIX = "computeMetadata/v1"
RETRY_PAUSE_S = 1.0  # a value whose claim failed is read and delivered again this soon
UNDEFINED_PAUSE_S = 5.0  # a key this VM does not serve (404) is looked at again this often
MAX_BACKOFF_S = 10.0  # the window is 30 s: never sleep through most of it
PLAIN_TIMEOUT_S = 5.0


class MetadataError(Exception):
    """The metadata server did not answer as one; the message is one line."""


@dataclass(frozen=True)
class Identity:
    project: str
    zone: str
    instance: str

    @classmethod
    def from_values(cls, *, project: str, zone: str, name: str) -> Identity:
        """``zone`` as the server gives it: ``projects/<number>/zones/<zone>``."""
        return cls(project=project.strip(), zone=zone.strip().rsplit("/", 1)[-1], instance=name)


@dataclass
class KeyState:
    """What one watcher knows of its key between requests."""

    etag: str = ""
    settled: bool = False  # the value under ``etag`` was delivered and may be forgotten

    def query(self, timeout_s: float) -> dict[str, str]:
        """The next request: a plain read until the current value is settled, then a hang."""
        if not self.etag or not self.settled:
            return {}
        return {
            "wait_for_change": "true",
            "last_etag": self.etag,
            "timeout_sec": str(max(1, int(timeout_s))),
        }

    def observe(self, etag: str) -> bool:
        """Record a response's ETag; whether its value must be delivered."""
        if etag != self.etag:
            self.etag, self.settled = etag, False
        return not self.settled


def envelope(
    identity: Identity, path: str, value: str, etag: str, observed_at: datetime
) -> dict[str, str]:
    """What the ``gce-metadata`` parser reads (handlers/README.md)."""
    return {
        "instance": identity.instance,
        "project": identity.project,
        "zone": identity.zone,
        "path": path,
        "value": value.strip(),
        "etag": etag,
        "observed_at": rfc3339(observed_at),
    }


def check_flavor(headers: Any, url: str) -> None:
    if headers.get(FLAVOR) != "Google":
        raise MetadataError(f"{url}: response without {FLAVOR}: Google; refused")


class GceMetadataSource:
    def __init__(
        self,
        settings: GceMetadataSettings,
        *,
        admit: Admit,
        windows: Windows,
        parser: Parser = parse,
    ) -> None:
        self.settings, self.admit, self.windows = settings, admit, windows
        self.parser = parser
        self.base = f"{settings.url.rstrip('/')}/{PREFIX}"
        self.counters = Counters()
        self.identity: Identity | None = None
        self.states = {path: KeyState() for path in PATHS}

    async def run(self) -> None:
        async with aiohttp.ClientSession(headers={FLAVOR: "Google"}) as session:
            self.identity = await self._identity_with_retry(session)
            async with asyncio.TaskGroup() as tg:
                for path in PATHS:
                    tg.create_task(self._watch(session, path), name=f"gce-metadata-{path}")

    async def _identity_with_retry(self, session: aiohttp.ClientSession) -> Identity:
        backoff = Backoff(1.0, MAX_BACKOFF_S)
        while True:
            try:
                return await self.read_identity(session)
            except (aiohttp.ClientError, TimeoutError, MetadataError) as e:
                self.counters.transport_errors += 1
                logs.event(log, "gce metadata identity failed", logging.WARNING, error=str(e))
                await backoff.sleep()

    async def read_identity(self, session: aiohttp.ClientSession) -> Identity:
        values = {}
        for key, path in (
            ("name", "instance/name"),
            ("zone", "instance/zone"),
            ("project", "project/project-id"),
        ):
            got = await self.get(session, path, {})
            if got is None:
                raise MetadataError(f"{path}: not served")
            values[key] = got[0].strip()
        identity = Identity.from_values(**values)
        if self.settings.node_name and self.settings.node_name != identity.instance:
            # GKE names the node after the VM; a mismatch is a misconfigured DaemonSet, and
            # the notice still targets the VM (node name and providerID both name it).
            logs.event(
                log,
                "node name is not the instance name",
                logging.WARNING,
                node_name=self.settings.node_name,
                instance=identity.instance,
            )
        logs.event(
            log,
            "gce metadata watching",
            instance=identity.instance,
            zone=identity.zone,
            project=identity.project,
        )
        return identity

    async def _watch(self, session: aiohttp.ClientSession, path: str) -> None:
        state = self.states[path]
        backoff = Backoff(1.0, MAX_BACKOFF_S)
        while True:
            try:
                got = await self.get(session, path, state.query(self.settings.timeout_s))
                backoff.reset()
            except Exception as e:  # a per-node watcher outlives any one bad response
                self.counters.transport_errors += 1
                logs.event(
                    log,
                    "gce metadata read failed",
                    logging.WARNING,
                    path=path,
                    error=f"{type(e).__name__}: {e}"[:200],
                )
                await backoff.sleep()
                continue
            if got is None:
                await asyncio.sleep(UNDEFINED_PAUSE_S)
                continue
            value, etag = got
            if state.observe(etag):
                state.settled = await self.deliver(path, value, etag)
                if not state.settled:
                    await asyncio.sleep(RETRY_PAUSE_S)

    async def get(
        self, session: aiohttp.ClientSession, path: str, query: dict[str, str]
    ) -> tuple[str, str] | None:
        """``(value, etag)``, or None for a key this VM does not serve."""
        url = f"{self.base}/{path}"
        hang = self.settings.timeout_s + 10 if query else PLAIN_TIMEOUT_S
        async with session.get(
            url, params=query, timeout=aiohttp.ClientTimeout(total=hang), allow_redirects=False
        ) as r:
            check_flavor(r.headers, url)
            if r.status == 404:
                return None
            if r.status != 200:
                raise MetadataError(f"{url}: HTTP {r.status}")
            return await r.text(), r.headers.get("ETag", "")

    async def deliver(self, path: str, value: str, etag: str) -> bool:
        """Parse and admit one value; True when it needs no further delivery."""
        assert self.identity is not None
        delivered = await deliver(
            self.parser,
            json.dumps(envelope(self.identity, path, value, etag, utcnow())).encode(),
            admit=self.admit,
            windows=self.windows,
            counters=self.counters,
            what="gce metadata value",
            path=path,
        )
        if delivered.read is Read.NOTICES:  # a value's ack is its settling; a non-notice has none
            if delivered.settled:
                self.counters.acked += 1
            else:
                self.counters.left_for_redelivery += 1
        return delivered.settled


# --- built by the registry (reclaimd.handlers.build), for an enabled source ----------------


def build(entry: Entry[GceMetadataSettings], w: Supplies) -> GceMetadataSource:
    s = entry.section(w.settings)
    return GceMetadataSource(s, admit=w.admit, windows=w.windows, parser=entry.parse)
