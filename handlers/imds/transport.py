"""EC2 instance metadata transport, for per-node mode (one reclaimd per node).

IMDSv2: a session token from ``PUT /latest/api/token``, refreshed before it expires and on 401.
Polls every path the ``imds`` parser reads (``PATHS``: the spot ``instance-action``, the
scheduled maintenance events, the Auto Scaling target lifecycle state and the rebalance
recommendation) with jitter, so a fleet of DaemonSet pods does not poll in lockstep; a 404
means "no notice". Every non-404 body is wrapped in the envelope ``handlers.imds`` reads and
admitted; the parser derives the notice id from the content, so polling the same notice again
is a duplicate the intake absorbs without an apiserver call. A failing IMDS is polled again
after a jittered backoff, never longer than ``MAX_BACKOFF_S``: a spot notice has two minutes.
"""

from __future__ import annotations

import json
import logging
import time

import aiohttp

from reclaimd.handlers.base import Parser
from reclaimd.handlers.entry import Entry
from reclaimd.handlers.imds.parser import parse
from reclaimd.handlers.imds.settings import ImdsSettings
from reclaimd.handlers.transport import Admit, Counters, Delivered, Supplies, deliver, poll_forever
from reclaimd.model import Windows

log = logging.getLogger(__name__)

# Every path handlers/imds/parser.py reads (a unit test keeps the two lists equal); the deadline
# carriers first, so a poll that fails part way has read those.
PATHS = (
    "spot/instance-action",
    "events/maintenance/scheduled",
    "autoscaling/target-lifecycle-state",
    "events/recommendations/rebalance",
)
MAX_BACKOFF_S = 10.0
_TIMEOUT = aiohttp.ClientTimeout(total=2.0)


class ImdsSource:
    def __init__(
        self,
        settings: ImdsSettings,
        *,
        admit: Admit,
        windows: Windows,
        node_name: str = "",
        parser: Parser = parse,
    ) -> None:
        self.settings, self.admit, self.windows = settings, admit, windows
        self.parser = parser
        self.node_name = node_name
        self.base = settings.url.rstrip("/")
        self.counters = Counters()
        self._token = ""
        self._token_expiry = 0.0
        self._identity: dict[str, str] = {}

    async def run(self) -> None:
        async with aiohttp.ClientSession(timeout=_TIMEOUT) as session:
            await poll_forever(
                lambda: self.poll_once(session), interval_s=self.settings.poll_interval_s,
                max_backoff_s=MAX_BACKOFF_S, counters=self.counters, what="imds",
                errors=(aiohttp.ClientError, TimeoutError),
            )  # fmt: skip

    async def poll_once(self, session: aiohttp.ClientSession) -> int:
        if not self._identity:
            self._identity = await self._read_identity(session)
        found = 0
        for path in PATHS:
            body = await self._get(session, path)
            if body is None:
                continue
            found += 1
            await self._deliver(path, body)
        return found

    async def _deliver(self, path: str, body: str) -> Delivered:
        envelope = {"path": path, "body": body, **self._identity}
        if self.node_name:
            envelope["node_name"] = self.node_name
        # Nothing to settle: the next poll reads the body again while IMDS serves it.
        return await deliver(
            self.parser,
            json.dumps(envelope).encode(),
            admit=self.admit,
            windows=self.windows,
            counters=self.counters,
            what="imds body",
            path=path,
        )

    async def _read_identity(self, session: aiohttp.ClientSession) -> dict[str, str]:
        identity = {}
        for key, path in (
            ("instance_id", "instance-id"),
            ("zone", "placement/availability-zone"),
            ("region", "placement/region"),
            ("instance_type", "instance-type"),
        ):
            value = await self._get(session, path)
            if value:
                identity[key] = value.strip()
        if "instance_id" not in identity:
            raise aiohttp.ClientError("IMDS did not return an instance id")
        return identity

    async def _token_header(self, session: aiohttp.ClientSession) -> dict[str, str]:
        if not self._token or time.monotonic() > self._token_expiry:
            ttl = self.settings.token_ttl_s
            async with session.put(
                f"{self.base}/latest/api/token",
                headers={"X-aws-ec2-metadata-token-ttl-seconds": str(ttl)},
            ) as r:
                r.raise_for_status()
                self._token = (await r.text()).strip()
            # Refresh well before expiry so a poll never carries a stale token.
            self._token_expiry = time.monotonic() + ttl * 0.8
        return {"X-aws-ec2-metadata-token": self._token}

    async def _get(self, session: aiohttp.ClientSession, path: str) -> str | None:
        for _ in range(2):
            headers = await self._token_header(session)
            async with session.get(f"{self.base}/latest/meta-data/{path}", headers=headers) as r:
                if r.status == 404:
                    return None
                if r.status == 401:
                    self._token = ""
                    continue
                r.raise_for_status()
                return await r.text()
        raise aiohttp.ClientError("IMDS refused a fresh token")


# --- built by the registry (reclaimd.handlers.build), for an enabled source ----------------


def build(entry: Entry[ImdsSettings], w: Supplies) -> ImdsSource:
    s = entry.section(w.settings)
    return ImdsSource(s, admit=w.admit, windows=w.windows, parser=entry.parse)
