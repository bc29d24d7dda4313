"""Restart overhead: from a notice's receipt until its gang trains again (issue 18, item 3).

Restart waste (``waste.py``) is the progress a gang lost. The restart costs more: from the
interruption until the replacement gang is training again, its GPUs are held and do nothing.
For every gang a notice charged (its Lease, ``cluster/gangclaims.py``) the watcher looks for
the gang's next incarnation in the cluster cache: the same gang key, as many pods as the gang
had, none of them one the Lease was taken for. The restart ends when every rank that speaks
the trainer SDK has taken its first step after ``restore()`` (``sdk-first-step``: it says so
at ``<checkpoint url>/incarnation``), else when all of the new pods are Ready
(``pods-ready``). The overhead is the time from the notice's receipt to that end, times the
replacement's GPUs, split by the node each rank runs on so that the report prices it where
it ran. It is one ``reclaimd.restart-overhead/v1`` event on the ledger topic.

Crash-only: the only state is the Lease's mark, written after the event. Any replica may
measure a gang whose charging replica is gone; the ``EventId`` comes from notice and gang, so
a second writer, or the same one after a crash between event and mark, writes the same event
and the ledger keeps it once.

Not measured: a gang that never comes back (cancelled, finished) or comes back smaller
(elastic); a gang whose Lease had no room for its record; a restart after the Lease is swept
(``gangclaims.KEEP_S``).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final, Protocol

import aiohttp

from reclaimd import logs
from reclaimd.cluster.gangclaims import Charged
from reclaimd.ledger.event import gang_kafka_key, instance_part
from reclaimd.ledger.labels import (
    LabelPolicy,
    bounded,
    normalize_purchase_option,
    placement,
    pricing_category,
)
from reclaimd.ledger.writer import LedgerWriter
from reclaimd.model import Gang, GangKey, Member, ParseError, parse_time, rfc3339, stable_id
from reclaimd.settings.restarts import RestartSettings

log = logging.getLogger(__name__)

SCHEMA: Final = "reclaimd.restart-overhead/v1"
SDK_FIRST_STEP: Final = "sdk-first-step"
PODS_READY: Final = "pods-ready"
# A rank that speaks the SDK but has not stepped this long after all pods were Ready is not
# waited for any longer: the restart is measured to Ready (a trainer stuck in its restore
# would otherwise never be charged).
SDK_WAIT_S: Final = RestartSettings().sdk_wait_s


class Leases(Protocol):
    async def charged(self) -> list[Charged]: ...

    async def restart_recorded(self, c: Charged, event_id: str) -> bool: ...


class Pods(Protocol):
    def gang(self, key: GangKey) -> Gang | None: ...

    def node_labels(self, name: str) -> Mapping[str, str]: ...

    def provider_id(self, name: str) -> str: ...


# A rank's checkpoint URL -> (whether it speaks the SDK's ``/incarnation``, when it took its
# first step after restore: None while it has not).
FirstStep = Callable[[str], Awaitable[tuple[bool, datetime | None]]]


async def sdk_first_step(
    session: aiohttp.ClientSession, url: str, timeout_s: float = 2.0
) -> tuple[bool, datetime | None]:
    """Ask a rank at ``<checkpoint url>/incarnation`` (``reclaimd_trainer.Signal``) when it
    first stepped. A rank that does not answer it (no SDK, an older one, unreachable) does not
    speak it: Ready is all there is to know of it."""
    base, _, query = url.partition("?")
    where = base.rstrip("/") + "/incarnation" + (f"?{query}" if query else "")
    try:
        async with session.get(
            where, timeout=aiohttp.ClientTimeout(total=timeout_s), allow_redirects=False
        ) as r:
            if r.status != 200:
                return False, None
            body = await r.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return False, None
    raw = body.get("first_step_at") if isinstance(body, dict) else None
    if raw is None:
        return True, None  # it speaks it, and has not stepped yet
    try:
        return True, parse_time(str(raw))
    except ParseError:
        return False, None


@dataclass(frozen=True)
class Restart:
    charged: Charged
    replacement: Gang
    ended_at: datetime
    source: str

    @property
    def seconds(self) -> float:
        return max(0.0, (self.ended_at - self.charged.received_at).total_seconds())


def event_id(notice_id: str, gang: GangKey) -> str:
    """Derived from notice and gang only: every replica, and every retry, writes the same id."""
    return stable_id("ro", notice_id, str(gang))


def replacement_of(c: Charged, now: Gang | None) -> Gang | None:
    """The gang's next incarnation once it is whole: as many pods as the charged one, none of
    them the charged one's; else None (not there yet)."""
    if now is None:
        return None
    new = tuple(m for m in now.members if m.uid not in c.uids)
    if len(new) < len(c.uids):
        return None
    return Gang(key=now.key, members=new, labels=now.labels, scope=now.scope)


async def restart_of(
    c: Charged,
    replacement: Gang,
    first_step: FirstStep | None,
    now: datetime,
    sdk_wait_s: float = SDK_WAIT_S,
) -> Restart | None:
    """When the replacement trains again, and how that is known; None while it does not."""
    ready = [m.ready_at for m in replacement.members]
    if any(r is None for r in ready):
        return None
    all_ready = max(r for r in ready if r is not None)
    urls = [m.checkpoint_url for m in replacement.members if m.checkpoint_url]
    if first_step is None or not urls:
        return Restart(c, replacement, all_ready, PODS_READY)
    said = await asyncio.gather(*(first_step(u) for u in urls))
    steps = [at for speaks, at in said if speaks]
    if not steps:  # no rank speaks it: Ready is all there is to know
        return Restart(c, replacement, all_ready, PODS_READY)
    if all(s is not None for s in steps):
        stepped = max(s for s in steps if s is not None)
        return Restart(c, replacement, max(stepped, all_ready), SDK_FIRST_STEP)
    if (now - all_ready).total_seconds() < sdk_wait_s:
        return None  # ranks that speak the SDK have not all stepped yet
    return Restart(c, replacement, all_ready, PODS_READY)


def _by_node(members: tuple[Member, ...]) -> dict[str, tuple[int, int]]:
    """node -> (ranks, GPUs) of the replacement."""
    out: dict[str, tuple[int, int]] = {}
    for m in members:
        ranks, gpus = out.get(m.node, (0, 0))
        out[m.node] = (ranks + 1, gpus + m.gpus)
    return out


def to_event(
    r: Restart,
    *,
    cluster: str,
    policy: LabelPolicy,
    place: Callable[[str], Mapping[str, str]],
) -> dict[str, Any]:
    """The ledger row of one restart (docs/ledger.md, "Restart overhead")."""
    gang, seconds = r.replacement, r.seconds
    gang_facts = {
        "sku": gang.labels.get("sku"),
        "purchase_option": gang.labels.get("purchase_option"),
    }
    parts = [
        {
            **instance_part(
                node, place(node) if node else None, gang_facts, ranks=ranks, gpus=gpus
            ),
            "x_RestartOverheadGpuSeconds": round(gpus * seconds, 3),
        }
        for node, (ranks, gpus) in sorted(_by_node(gang.members).items())
    ]
    purchase = normalize_purchase_option(gang.labels.get("purchase_option"))
    first = next((p["ResourceId"] for p in parts if p["ResourceId"]), None)
    c = r.charged
    return {
        "schema": SCHEMA,
        "EventId": event_id(c.notice_id, c.key),
        "ChargePeriodStart": rfc3339(c.received_at),
        "ChargePeriodEnd": rfc3339(max(r.ended_at, c.received_at)),
        "ChargeCategory": "Usage",
        "PricingCategory": pricing_category(purchase),
        "ConsumedQuantity": round(gang.gpus * seconds / 3600.0, 6),
        "ConsumedUnit": "GPU-Hours",
        "ResourceId": first or str(gang.key),
        "ResourceType": "GPU training gang restart",
        "SkuId": bounded(gang.labels.get("sku")),
        "Tags": policy.tags(gang.labels),
        "x_RestartOverheadSeconds": round(seconds, 3),
        "x_RestartOverheadGpuSeconds": round(gang.gpus * seconds, 3),
        "x_RestartOverheadSource": r.source,
        "x_RestartedAt": rfc3339(r.ended_at),
        "x_WasteEventId": stable_id("rw", c.notice_id, str(c.key)),
        "x_GangId": str(gang.key),
        "x_GangSize": len(gang.members),
        "x_GpuCount": gang.gpus,
        "x_NoticeId": c.notice_id,
        "x_NoticeReceivedAt": rfc3339(c.received_at),
        "x_K8sClusterName": bounded(cluster),
        "x_K8sNamespaceName": gang.key.namespace,
        "x_RestartOverheadByInstance": parts,
    }


def encode(ev: Mapping[str, Any]) -> tuple[str, bytes, bytes, tuple[tuple[str, bytes], ...]]:
    """(event id, Kafka key ``tenant|gang`` as the gang's waste event has, value, headers)."""
    key = gang_kafka_key(ev["Tags"], ev["x_GangId"])
    value = json.dumps(ev, sort_keys=True, separators=(",", ":")).encode()
    eid = str(ev["EventId"])
    return eid, key, value, (("event_id", eid.encode()), ("schema", SCHEMA.encode()))


class RestartWatcher:
    """Looks every ``interval_s`` for charged gangs that came back; ``run`` until cancelled."""

    def __init__(
        self,
        leases: Leases,
        pods: Pods,
        writer: LedgerWriter,
        *,
        holder: str,
        alive: Callable[[str], Awaitable[bool]],
        cluster: str,
        clock: Callable[[], datetime],
        first_step: FirstStep | None = None,
        interval_s: float = RestartSettings().interval_s,
        sdk_wait_s: float = SDK_WAIT_S,
    ) -> None:
        self.leases, self.pods, self.writer = leases, pods, writer
        self.holder, self.alive, self.cluster = holder, alive, cluster
        self.clock, self.first_step, self.interval_s = clock, first_step, interval_s
        self.sdk_wait_s = sdk_wait_s
        self.recorded = 0
        # Looks run to their end (a failed one is not counted): a test of "nothing written"
        # waits for the next looks instead of a guessed sleep (reclaimd_restart_looks_total).
        self.looks = 0

    async def _ours(self, c: Charged) -> bool:
        """The replica that charged the gang measures its restart; anyone, once it is gone."""
        return c.holder == self.holder or not c.holder or not await self.alive(c.holder)

    async def tick(self) -> int:
        """One look; the restarts recorded."""
        n = 0
        for c in await self.leases.charged():
            replacement = replacement_of(c, self.pods.gang(c.key))
            if replacement is None or not await self._ours(c):
                continue
            r = await restart_of(c, replacement, self.first_step, self.clock(), self.sdk_wait_s)
            if r is None:
                continue
            ev = to_event(r, cluster=self.cluster, policy=self.writer.policy, place=self._place)
            await self.writer.record_encoded(*encode(ev))
            await self.leases.restart_recorded(c, ev["EventId"])
            logs.event(
                log,
                "restart overhead recorded",
                gang=ev["x_GangId"],
                event_id=ev["EventId"],
                seconds=ev["x_RestartOverheadSeconds"],
                source=r.source,
            )
            n += 1
        self.recorded += n
        self.looks += 1
        return n

    def _place(self, node: str) -> Mapping[str, str]:
        return placement(self.pods.node_labels(node), self.pods.provider_id(node))

    async def run(self) -> None:
        while True:
            try:
                await self.tick()
            except Exception as e:  # one bad look must not end the watching
                log.warning("restart watcher: %s: %s", type(e).__name__, str(e)[:200])
            await asyncio.sleep(self.interval_s)
