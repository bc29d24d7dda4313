"""``reclaimd status``: what is happening now, read from the cluster and from each replica.

One screen for an operator during a storm: the notices in flight (the claims on nodes and
Kueue Workloads), the gangs they charge (their Leases: ranks asked, durable acks recorded,
pods left), the replicas (their holder Leases: alive, last renewal, the slot Leases they hold,
and what their ``/metrics`` says of their outbox) and the last notices finished.

Everything is read, nothing written, with the same readers the replicas use: the claim
annotation through ``claims.Claim``, the notice in it through ``model.Notice``, the gang
records through ``gangrecord``, holder Leases through ``holders.read``, slot Leases through
``slots.SlotLease``. The reads are those the chart's ``reclaimd-viewer`` role allows (get/list
of nodes, pods, Workloads, and Leases in reclaimd's namespace), from a laptop's kubeconfig or
a pod's service account alike.

A replica's ``/metrics`` is where its holder Lease says it is (``reclaimd.io/metrics``: the
replica's metrics port at the host its peers dial; not the probe address, whose port answers
the probe only). One that does not answer (a laptop outside the pod network, a replica gone)
is shown as such; only the cluster is required.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp

from reclaimd import kueueapi
from reclaimd.cluster import (
    apiserver,
    connect,
    errors,
    gangclaims,
    gangrecord,
    holders,
    objects,
    slots,
)
from reclaimd.cluster.apiserver import ApiServer
from reclaimd.cluster.cache import WorkloadApi
from reclaimd.cluster.claims import CLAIM_ANNOTATION, Claim, ClaimTarget, NodeObj, WorkloadObj
from reclaimd.model import Notice, ParseError, rfc3339, utcnow

EXIT_OK, EXIT_USAGE = 0, 2
DEFAULT_NAMESPACE = "reclaimd"
SA_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
# The whole cluster read: an API server that does not answer within it is a failure. A storm
# keeps it busy: a LIST of 1,000 nodes took 40 s from the local stack's under a 1,000-node
# bench, so the default is generous (--timeout).
READ_S = 60.0
# Every LIST is served from the API server's watch cache (resourceVersion "0": no quorum read
# of etcd), as a replica's cache is: a look in the middle of a storm costs the server little,
# and what it shows is as fresh as the watch (well under a second behind).
CACHED = {"resourceVersion": "0"}
METRICS_S = 2.0  # one replica's /metrics: a slow one is shown as not answering
# A replica's Lease not renewed for this long, and holding nothing, is not shown by default:
# a gone pod's Lease lingers an hour (holders.GONE_AFTER_S).
RECENT_S = 600.0
# What a replica's /metrics says, by series name (docs/metrics.md). A replica older than the
# oldest-event gauge shows its depth only.
OUTBOX_DEPTH = "reclaimd_ledger_outbox_depth"
OUTBOX_OLDEST = "reclaimd_ledger_outbox_oldest_age_seconds"
IN_FLIGHT = "reclaimd_scheduler_depth"
WRITES_WAITING = "reclaimd_kube_writes_waiting"


class StatusError(Exception):
    """What could not be read, as one line (the command exits 2)."""


# --- what is shown --------------------------------------------------------------------------


@dataclass(frozen=True)
class GangView:
    gang: str  # kind:namespace/name
    notice_id: str
    holder: str  # the replica charging it
    asked: int  # ranks of the gang as its owner recorded them: each is asked to save
    durable: int | None  # durable acks recorded (before the drain); None: not recorded yet
    pods_left: int | None  # of those ranks' pods, still there; None: not readable


@dataclass(frozen=True)
class NoticeView:
    notice_id: str
    source: str
    kind: str
    target: str
    phase: str  # the claim's phase, or how far its gangs are (checkpointing, draining)
    holder: str
    holder_alive: bool
    deadline: str | None
    seconds_left: float | None  # negative: past its deadline, still open
    claimed_at: str
    gangs: tuple[GangView, ...] = ()


@dataclass(frozen=True)
class ReplicaMetrics:
    in_flight: float | None = None
    outbox_depth: float | None = None
    outbox_oldest_s: float | None = None  # None: no replica series says it
    writes_waiting: float | None = None


@dataclass(frozen=True)
class ReplicaView:
    holder: str
    group: str
    alive: bool
    released: bool
    last_renewal: str
    seconds_since_renewal: float
    slots: tuple[str, ...]  # the subscriptions whose slot Lease it holds
    metrics_address: str
    metrics: ReplicaMetrics | None  # None: not read (see metrics_error)
    metrics_error: str = ""


@dataclass(frozen=True)
class FinishedView:
    notice_id: str
    source: str
    kind: str
    target: str
    holder: str
    finished_at: str
    outcome: str


@dataclass(frozen=True)
class Status:
    at: str
    namespace: str
    in_flight: tuple[NoticeView, ...]
    replicas: tuple[ReplicaView, ...]
    finished: tuple[FinishedView, ...]
    notes: tuple[str, ...] = field(default=())  # what was left out, and why

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


# --- reading --------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Leases:
    gangs: list[objects.Obj]
    holders: list[holders.HolderLease]
    slots: list[objects.Obj]


async def read(
    api: ApiServer,
    namespace: str,
    *,
    finished: int = 10,
    every_replica: bool = False,
    timeout_s: float = READ_S,
) -> Status:
    """One look at the cluster and the replicas. ``StatusError`` when the cluster cannot be
    read (unreachable, refused, not within ``timeout_s``); a replica's ``/metrics`` failing is
    shown, not raised."""
    try:
        async with asyncio.timeout(timeout_s):
            claims, leases, notes = await _read_cluster(api, namespace)
            now = utcnow()
            by_holder = {h.holder: h for h in leases.holders}
            open_claims, done = _split(claims, by_holder, now)
            # The gangs of the notices in flight only: a charged gang's Lease stays for hours.
            ids = {c.notice_id for c in open_claims}
            mine = [
                lease
                for lease in leases.gangs
                if objects.annotations(lease).get(gangclaims.NOTICE_ANNOTATION) in ids
            ]
            gang_views = await _gangs(api, mine, notes)
    except TimeoutError as e:
        raise StatusError(f"the API server did not answer within {timeout_s:g} s") from e
    except errors.KubeError as e:
        raise StatusError(_why(e)) from e

    def alive(holder: str) -> bool:
        h = by_holder.get(holder)
        return h is not None and h.alive(now)

    in_flight = tuple(
        _notice_view(c, now, alive(c.holder), gang_views.get(c.notice_id, ()))
        for c in sorted(open_claims, key=_deadline_order)
    )
    done.sort(key=lambda d: d[0].heartbeat_at, reverse=True)
    finished_views = tuple(_finished_view(c, outcome) for c, outcome in done[:finished])
    holding = {c.holder for c in open_claims}
    held = _slots_held(leases.slots, now)
    shown = [
        h
        for h in leases.holders
        if every_replica
        or h.holder in holding
        or h.holder in held
        or (not h.released and now - h.renewed <= timedelta(seconds=RECENT_S))
    ]
    scraped = await asyncio.gather(*(_scrape(h.metrics) for h in shown if h.metrics))
    by_address = dict(zip([h.metrics for h in shown if h.metrics], scraped, strict=True))
    replicas = []
    for h in sorted(shown, key=lambda h: (not alive(h.holder), h.holder)):
        metrics, error = by_address.get(
            h.metrics, (None, "its Lease names no /metrics (metrics_port 0, or an older reclaimd)")
        )
        replicas.append(
            ReplicaView(
                holder=h.holder,
                group=h.group,
                alive=alive(h.holder),
                released=h.released,
                last_renewal=rfc3339(h.released_at or h.renewed),
                seconds_since_renewal=round((now - h.renewed).total_seconds(), 1),
                slots=tuple(sorted(held.get(h.holder, ()))),
                metrics_address=h.metrics,
                metrics=metrics,
                metrics_error=error,
            )
        )
    hidden = len(leases.holders) - len(shown)
    if hidden:
        notes.append(f"{hidden} replica Lease(s) released or silent for over {RECENT_S:.0f} s")
    return Status(
        at=rfc3339(now),
        namespace=namespace,
        in_flight=in_flight,
        replicas=tuple(replicas),
        finished=finished_views,
        notes=tuple(notes),
    )


def _split(
    claims: list[Claim], by_holder: Mapping[str, holders.HolderLease], now: datetime
) -> tuple[list[Claim], list[tuple[Claim, str]]]:
    """The claims still in flight, and the finished ones with their outcome."""
    open_claims: list[Claim] = []
    done: list[tuple[Claim, str]] = []
    for c in claims:
        h = by_holder.get(c.holder)
        if c.phase.terminal:
            done.append((c, _outcome(c)))
        # As a replica's resume scan decides: open until past its deadline with no live holder.
        elif c.open(now, h.duration_s if h else 0.0, h.renewed if h else None):
            open_claims.append(c)
        else:
            done.append((c, "abandoned: past its deadline, its holder gone"))
    return open_claims, done


async def _read_cluster(api: ApiServer, namespace: str) -> tuple[list[Claim], _Leases, list[str]]:
    notes: list[str] = []
    with errors.kube_errors("list nodes"):
        nodes = await api.get(apiserver.node(), **CACHED)
    found = [_claim(NodeObj(objects.name(n)), n, notes) for n in objects.items(nodes)]
    wl = WorkloadApi()
    version = await kueueapi.version_or(api, wl.version)
    try:
        with errors.kube_errors("list workloads"):
            path = apiserver.group(f"{wl.group}/{version}", wl.plural)
            workloads = await api.get(path, **CACHED)
    except errors.NotFound:
        workloads = {}  # no Kueue here: no Workload claims
    for w in objects.items(workloads):
        meta = objects.meta(w)
        target = WorkloadObj(str(meta.get("namespace") or ""), objects.name(w))
        found.append(_claim(target, w, notes))
    with errors.kube_errors(f"list leases in {namespace}"):
        listed = await api.get(apiserver.lease(namespace), **CACHED)
    leases = _Leases([], [], [])
    for lease in objects.items(listed):
        labels = objects.part(objects.meta(lease), "labels")
        if gangclaims.NOTICE_LABEL in labels:
            leases.gangs.append(lease)
        elif labels.get(holders.HOLDER_LABEL) == "true":
            if (h := holders.read(lease)) is not None:
                leases.holders.append(h)
        elif labels.get(slots.SLOT_LABEL) == "true":
            leases.slots.append(lease)
    return [c for c in found if c is not None], leases, notes


def _claim(target: ClaimTarget, obj: objects.Obj, notes: list[str]) -> Claim | None:
    text = objects.annotations(obj).get(CLAIM_ANNOTATION)
    if not text:
        return None
    try:
        return Claim.from_json(target, text)
    except ParseError as e:
        notes.append(f"unreadable claim: {e}")
        return None


async def _gangs(
    api: ApiServer, gang_leases: list[objects.Obj], notes: list[str]
) -> dict[str, tuple[GangView, ...]]:
    """Per notice id, its gangs as their Leases record them, with the pods still there."""
    records = []
    for lease in gang_leases:
        ann = objects.annotations(lease)
        text = ann.get(gangclaims.RECORD_ANNOTATION)
        if not text:
            continue  # too large to record: owned, but nothing to show of it
        try:
            gang = gangrecord.gang_from_json(text)
            acks = ann.get(gangclaims.ACKS_ANNOTATION, "")
            durable = len(gangrecord.acks_from_json(acks, gang)) if acks else None
        except ParseError as e:
            notes.append(f"lease {objects.name(lease)}: {e}")
            continue
        holder = str(objects.spec(lease).get("holderIdentity") or "")
        records.append((ann.get(gangclaims.NOTICE_ANNOTATION, ""), holder, gang, durable))
    return await _with_pods(api, records, notes)


async def _with_pods(
    api: ApiServer, records: list[tuple[str, str, Any, int | None]], notes: list[str]
) -> dict[str, tuple[GangView, ...]]:
    # One LIST per namespace the recorded gangs run in: pods are many, namespaces few.
    namespaces = sorted({m.namespace for _, _, g, _ in records for m in g.members})
    present: set[str] | None = set()
    try:
        listed = await asyncio.gather(
            *(_pod_uids(api, ns) for ns in namespaces), return_exceptions=False
        )
        for uids in listed:
            assert present is not None
            present |= uids
    except errors.Forbidden as e:
        notes.append(f"pods left unknown: {_why(e)}")
        present = None
    out: dict[str, list[GangView]] = {}
    for notice_id, holder, gang, durable in records:
        left = (
            None if present is None else sum(1 for m in gang.members if m.uid and m.uid in present)
        )
        out.setdefault(notice_id, []).append(
            GangView(
                gang=str(gang.key),
                notice_id=notice_id,
                holder=holder,
                asked=len(gang.members),
                durable=durable,
                pods_left=left,
            )
        )
    return {k: tuple(sorted(v, key=lambda g: g.gang)) for k, v in out.items()}


async def _pod_uids(api: ApiServer, namespace: str) -> set[str]:
    with errors.kube_errors(f"list pods in {namespace}"):
        pods = await api.get(apiserver.pod(namespace), **CACHED)
    return {
        objects.uid(p)
        for p in objects.items(pods)
        # a pod being deleted is leaving: its rank no longer trains
        if not objects.meta(p).get("deletionTimestamp")
    }


def _slots_held(slot_leases: list[objects.Obj], now: datetime) -> dict[str, set[str]]:
    """Holder -> the subscriptions whose slot it holds now (the slot Leases' own rule)."""
    held: dict[str, set[str]] = {}
    for lease in slot_leases:
        seen = slots.SlotLease.of(lease)
        if slots.why_free(seen, "", now, lambda _holder: False) is None:
            name = objects.annotations(lease).get(slots.SUBSCRIPTION_ANNOTATION)
            held.setdefault(seen.holder, set()).add(name or objects.name(lease))
    return held


async def _scrape(address: str) -> tuple[ReplicaMetrics | None, str]:
    """What one replica's /metrics says; (None, why) when it does not answer."""
    from prometheus_client.parser import text_string_to_metric_families

    url = f"http://{address}/metrics"
    try:
        timeout = aiohttp.ClientTimeout(total=METRICS_S)
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.get(url) as response,
        ):
            if response.status != 200:
                return None, f"/metrics answered {response.status}"
            text = await response.text()
    except (aiohttp.ClientError, TimeoutError, OSError) as e:
        return None, f"/metrics at {address} does not answer ({type(e).__name__})"
    values: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                values.setdefault(sample.name, sample.value)
    except ValueError:
        return None, f"/metrics at {address} is not Prometheus text"
    return ReplicaMetrics(
        in_flight=values.get(IN_FLIGHT),
        outbox_depth=values.get(OUTBOX_DEPTH),
        outbox_oldest_s=values.get(OUTBOX_OLDEST),
        writes_waiting=values.get(WRITES_WAITING),
    ), ""


# --- views ----------------------------------------------------------------------------------


def _deadline_order(c: Claim) -> tuple[bool, datetime]:
    return (c.deadline is None, c.deadline or c.claimed_at)


def _notice(c: Claim) -> Notice | None:
    try:
        return Notice.from_json(c.notice)
    except ParseError:
        return None


def _notice_view(
    c: Claim, now: datetime, holder_alive: bool, gangs: tuple[GangView, ...]
) -> NoticeView:
    n = _notice(c)
    left = round((c.deadline - now).total_seconds(), 1) if c.deadline is not None else None
    return NoticeView(
        notice_id=c.notice_id,
        source=n.source if n is not None else "?",
        kind=n.kind.value if n is not None else "?",
        target=c.target.describe(),
        phase=_stage(c, gangs),
        holder=c.holder,
        holder_alive=holder_alive,
        deadline=rfc3339(c.deadline) if c.deadline is not None else None,
        seconds_left=left,
        claimed_at=rfc3339(c.claimed_at),
        gangs=gangs,
    )


def _stage(c: Claim, gangs: tuple[GangView, ...]) -> str:
    """How far an open notice is. Its claim is written when claimed and when done only, so
    the gangs say the rest: owned and saving until their acks are recorded or pods leave."""
    if not gangs:
        return c.phase.value
    if all(g.pods_left == 0 for g in gangs):
        return "drained"  # every pod gone: the charge is being written, then the claim done
    if any(g.durable is not None or (g.pods_left or 0) < g.asked for g in gangs):
        return "draining"
    return "checkpointing"


def _outcome(c: Claim) -> str:
    facts = c.facts
    if "outcome" in facts:
        return str(facts["outcome"])
    met = facts.get("deadline_met")
    if met is True:
        return "deadline met"
    if met is False:
        return "deadline missed"
    return "done"


def _finished_view(c: Claim, outcome: str) -> FinishedView:
    n = _notice(c)
    return FinishedView(
        notice_id=c.notice_id,
        source=n.source if n is not None else "?",
        kind=n.kind.value if n is not None else "?",
        target=c.target.describe(),
        holder=c.holder,
        finished_at=rfc3339(c.heartbeat_at),
        outcome=outcome,
    )


def _why(e: errors.KubeError) -> str:
    """One line: what failed, and the cause a connection failure carries."""
    cause = e.__cause__
    if e.status == 0 and cause is not None and str(cause):
        return f"{e.what}: {str(cause).splitlines()[0][:200]}"
    if isinstance(e, errors.Forbidden | errors.Unauthorized):
        return f"{e} (is the reclaimd-viewer role bound to this identity?)"
    return str(e)


# --- the command ----------------------------------------------------------------------------


def add_parser(sub: Any) -> None:
    """``reclaimd status`` under the CLI's subcommands."""
    p = sub.add_parser(
        "status",
        help="notices in flight, gangs, replicas and recent outcomes, from the cluster",
        description="What reclaimd is doing now: read from the cluster (claims, gang, holder"
        " and slot Leases) and each replica's /metrics. Read-only: the chart's"
        " reclaimd-viewer role is all it needs.",
    )
    p.add_argument("--kubeconfig", help="kubeconfig file (default: in a pod its service"
                   " account, else $KUBECONFIG, else ~/.kube/config)")  # fmt: skip
    p.add_argument("--context", help="kubeconfig context")
    p.add_argument("--config", help="settings file: its lease_namespace and kube.kubeconfig")
    p.add_argument(
        "-n",
        "--namespace",
        help="reclaimd's namespace (its Leases; default: --config's lease_namespace, in a pod"
        f" its own, else {DEFAULT_NAMESPACE})",
    )
    p.add_argument("--finished", type=int, default=10, metavar="N", help="last N finished")
    p.add_argument(
        "--timeout",
        type=float,
        default=READ_S,
        metavar="SECONDS",
        help=f"for the cluster's answers to one look ({READ_S:g})",
    )
    p.add_argument("--all-replicas", action="store_true", help="also replicas long silent")
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.add_argument(
        "--watch",
        nargs="?",
        type=float,
        const=2.0,
        default=None,
        metavar="SECONDS",
        help="redraw every SECONDS (2); with --format json, one document per line",
    )
    p.set_defaults(func=cmd_status)


def cmd_status(args: argparse.Namespace) -> int:
    """0 shown; 2 (one line on stderr) when the cluster cannot be read or the input is bad."""
    try:
        kubeconfig, namespace = _where(args)
        if args.finished < 0 or args.timeout <= 0 or (args.watch is not None and args.watch <= 0):
            raise StatusError("--finished, --timeout and --watch take positive numbers")
        return asyncio.run(_run(args, kubeconfig, namespace))
    except StatusError as e:
        print(f"reclaimd status: {e}", file=sys.stderr)
        return EXIT_USAGE


def _where(args: argparse.Namespace) -> tuple[str | None, str]:
    kubeconfig: str | None = args.kubeconfig
    namespace: str | None = args.namespace
    if args.config:
        from reclaimd import config

        try:
            settings = config.load(args.config)
        except config.ConfigError as e:
            raise StatusError(str(e)) from e
        namespace = namespace or settings.lease_namespace
        if kubeconfig is None and settings.kube.kubeconfig is not None:
            kubeconfig = str(settings.kube.kubeconfig)
    if namespace is None and kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        try:
            namespace = SA_NAMESPACE.read_text().strip() or None
        except OSError:
            namespace = None
    return kubeconfig, namespace or DEFAULT_NAMESPACE


async def _run(args: argparse.Namespace, kubeconfig: str | None, namespace: str) -> int:
    from reclaimd import statusview

    try:
        api = await connect.build_api_client(kubeconfig, context=args.context, pool_size=8)
    except errors.KubeError as e:
        raise StatusError(_why(e)) from e
    async with api:
        first = True
        while True:
            try:
                status = await read(
                    api,
                    namespace,
                    finished=args.finished,
                    every_replica=args.all_replicas,
                    timeout_s=args.timeout,
                )
            except StatusError as e:
                if first or args.watch is None:
                    raise
                # Watching: a failed look is shown and the next one tried.
                print(f"\x1b[H\x1b[2Jreclaimd status: {e}", flush=True)
            else:
                if args.format == "json":
                    print(json.dumps(status.to_json(), separators=(",", ":")), flush=True)
                else:
                    clear = "\x1b[H\x1b[2J" if args.watch is not None else ""
                    print(clear + statusview.render(status), end="", flush=True)
            first = False
            if args.watch is None:
                return EXIT_OK
            await asyncio.sleep(args.watch)
