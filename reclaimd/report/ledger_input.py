"""The ledger side of the report: restart-waste, restart-overhead and allocation rows,
flattened for the SQL.

Rows come from JSON-lines files or Kafka topics (read from the first offset at or after the
window's start up to the end offsets seen when reading began). Each event is re-policed on the
way in: a label reaches a report only if ``LabelPolicy`` lets it through, whatever the file
says, so an edited export cannot put a pod name or a user's e-mail into a report. Events are
deduped on ``EventId`` (the ledger is at-least-once).
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, TypedDict

from reclaimd.kafkaconn import KafkaConfigError, KafkaSettings, options
from reclaimd.ledger.labels import LabelPolicy, normalize_purchase_option
from reclaimd.model import ParseError, parse_time

WASTE_V1 = "reclaimd.restart-waste/v1"
WASTE_V2 = "reclaimd.restart-waste/v2"
OVERHEAD_V1 = "reclaimd.restart-overhead/v1"
ALLOCATION_V1 = "reclaimd.allocation/v1"
KNOWN: Final = (WASTE_V1, WASTE_V2, OVERHEAD_V1, ALLOCATION_V1)
# How the controller saw the replacement gang training again (docs/ledger.md)
OVERHEAD_SOURCES: Final = ("sdk-first-step", "pods-ready")


class InputError(ValueError):
    """A bad input to the report: one line, exit 2."""


@dataclass(frozen=True)
class WastePart:
    event_id: str
    notice_id: str
    gang_id: str
    stopped_at: datetime  # naive UTC
    resource_id: str | None
    node: str | None
    sku: str | None
    purchase_option: str | None
    labels: Mapping[str, str]
    gpu_seconds: float
    outcome: str
    deadline_met: bool


@dataclass(frozen=True)
class OverheadPart:
    """One replacement instance's share of a gang's restart overhead: a breakdown of the
    allocation's GPU-hours, not a cost of its own (docs/ledger.md)."""

    event_id: str
    notice_id: str
    gang_id: str
    restarted_at: datetime  # naive UTC: the replacement's first step, or all its pods Ready
    resource_id: str | None
    node: str | None
    sku: str | None
    purchase_option: str | None
    labels: Mapping[str, str]
    gpu_seconds: float
    source: str  # one of OVERHEAD_SOURCES


@dataclass(frozen=True)
class AllocationRow:
    hour_start: datetime  # naive UTC
    resource_id: str | None
    node: str | None
    sku: str | None
    purchase_option: str | None
    labels: Mapping[str, str]
    gpu_hours: float
    mig_gpu_hours: float
    mig_profile_hours: float
    hbm_gb_hours: float
    node_gpus: int


@dataclass
class Ledger:
    waste: list[WastePart] = field(default_factory=list)
    overhead: list[OverheadPart] = field(default_factory=list)
    allocation: list[AllocationRow] = field(default_factory=list)
    # the open hour's latest running total kept for a key: metered up to this time
    open_until: datetime | None = None


def _naive(t: datetime) -> datetime:
    return t.astimezone(UTC).replace(tzinfo=None)


def _time(ev: Mapping[str, Any], key: str, where: str) -> datetime:
    raw = ev.get(key)
    if not isinstance(raw, str):
        raise InputError(f"{where}: {key} is missing or not a string")
    try:
        return _naive(parse_time(raw))
    except ParseError as e:
        raise InputError(f"{where}: {key}: {e}") from e


def _number(ev: Mapping[str, Any], key: str, where: str, default: float | None = None) -> float:
    """A quantity: a finite number >= 0 (a negative waste would raise the savings)."""
    raw = ev.get(key, default)
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        raise InputError(f"{where}: {key} is missing or not a number")
    value = float(raw)
    if not math.isfinite(value):
        raise InputError(f"{where}: {key} is {raw!r}, not a finite number")
    if value < 0:
        raise InputError(f"{where}: {key} is {raw!r}, a quantity cannot be negative")
    return value


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _labels(ev: Mapping[str, Any], policy: LabelPolicy) -> dict[str, str]:
    tags = ev.get("Tags")
    if not isinstance(tags, Mapping):
        return {}
    return policy.tags({str(k): v for k, v in tags.items() if isinstance(v, str)})


def waste_parts(ev: Mapping[str, Any], where: str, policy: LabelPolicy) -> list[WastePart]:
    """One row per instance part of a restart-waste event (v1: one part, the gang's labels)."""
    labels = _labels(ev, policy)
    base = WastePart(
        event_id=str(ev.get("EventId") or ""),
        notice_id=str(ev.get("x_NoticeId") or ""),
        gang_id=str(ev.get("x_GangId") or ""),
        stopped_at=_time(ev, "ChargePeriodEnd", where),
        resource_id=None,
        node=None,
        sku=labels.get("sku"),
        purchase_option=labels.get("purchase_option"),
        labels=labels,
        gpu_seconds=0.0,
        outcome=str(ev.get("x_CheckpointOutcome") or ""),
        deadline_met=ev.get("x_DeadlineMet") is True,
    )
    if not base.event_id:
        raise InputError(f"{where}: EventId is missing")
    raw_parts = ev.get("x_WasteByInstance")
    if ev.get("schema") == WASTE_V1 or raw_parts is None:
        # v1 has no split: the gang's labels price the whole loss
        return [replace(base, gpu_seconds=_number(ev, "x_WastedGpuSeconds", where))]
    if not isinstance(raw_parts, list):
        raise InputError(f"{where}: x_WasteByInstance is not a list")
    _number(ev, "x_WastedGpuSeconds", where, 0.0)  # the gang's total: refused as its parts are
    out = []
    for i, p in enumerate(raw_parts):
        if not isinstance(p, Mapping):
            raise InputError(f"{where}: x_WasteByInstance[{i}] is not an object")
        out.append(
            replace(
                base,
                **_placed(p, base.sku),
                gpu_seconds=_number(p, "x_WastedGpuSeconds", f"{where}: part {i}"),
            )
        )
    return out


class _Placement(TypedDict):
    resource_id: str | None
    node: str | None
    sku: str | None
    purchase_option: str | None


def _placed(p: Mapping[str, Any], gang_sku: str | None) -> _Placement:
    """A part's instance facts (restart waste and overhead alike): its node's, the SKU else
    the gang's; the purchase option is the node's own (a gang can span spot and on-demand)."""
    return _Placement(
        resource_id=_text(p.get("ResourceId")),
        node=_text(p.get("x_K8sNodeName")),
        sku=_text(p.get("SkuId")) or gang_sku,
        purchase_option=normalize_purchase_option(_text(p.get("x_PurchaseOption"))),
    )


def _overhead_source(ev: Mapping[str, Any], where: str) -> str:
    source = ev.get("x_RestartOverheadSource")
    if source is None:
        raise InputError(f"{where}: x_RestartOverheadSource is missing")
    if source not in OVERHEAD_SOURCES:
        raise InputError(
            f"{where}: x_RestartOverheadSource {str(source)[:40]!r} is not one of"
            f" {', '.join(OVERHEAD_SOURCES)}"
        )
    return str(source)


def _overhead_raw_parts(ev: Mapping[str, Any], where: str) -> list[Mapping[str, Any]]:
    """The event's parts, refused when missing, or empty while the event has overhead (it
    would vanish from the report unpriced and unseen)."""
    raw = ev.get("x_RestartOverheadByInstance")
    if not isinstance(raw, list):
        raise InputError(f"{where}: x_RestartOverheadByInstance is missing or not a list")
    total = _number(ev, "x_RestartOverheadGpuSeconds", where, 0.0)
    if not raw and total > 0:
        raise InputError(
            f"{where}: x_RestartOverheadByInstance is empty, but x_RestartOverheadGpuSeconds"
            f" is {total:g}"
        )
    for i, p in enumerate(raw):
        if not isinstance(p, Mapping):
            raise InputError(f"{where}: x_RestartOverheadByInstance[{i}] is not an object")
    return raw


def overhead_parts(ev: Mapping[str, Any], where: str, policy: LabelPolicy) -> list[OverheadPart]:
    """One row per replacement instance of a restart-overhead event, at x_RestartedAt."""
    event_id = _text(ev.get("EventId"))
    if event_id is None:
        raise InputError(f"{where}: EventId is missing or not a string")
    source = _overhead_source(ev, where)
    restarted_at = _time(ev, "x_RestartedAt", where)
    labels = _labels(ev, policy)
    return [
        OverheadPart(
            event_id=event_id,
            notice_id=str(ev.get("x_NoticeId") or ""),
            gang_id=str(ev.get("x_GangId") or ""),
            restarted_at=restarted_at,
            **_placed(p, labels.get("sku")),
            labels=labels,
            gpu_seconds=_number(p, "x_RestartOverheadGpuSeconds", f"{where}: part {i}"),
            source=source,
        )
        for i, p in enumerate(_overhead_raw_parts(ev, where))
    ]


def allocation_row(ev: Mapping[str, Any], where: str, policy: LabelPolicy) -> AllocationRow:
    labels = _labels(ev, policy)
    resource_id = _text(ev.get("ResourceId"))
    project = _text(ev.get("SubAccountId"))
    if resource_id is not None and project is not None:
        resource_id = f"{project}/{resource_id}"  # a GCE name is unique within its project
    return AllocationRow(
        hour_start=_time(ev, "ChargePeriodStart", where),
        resource_id=resource_id,
        node=_text(ev.get("x_K8sNodeName")),
        sku=_text(ev.get("SkuId")) or labels.get("sku"),
        purchase_option=normalize_purchase_option(_text(ev.get("x_PurchaseOption")))
        or labels.get("purchase_option"),
        labels=labels,
        gpu_hours=_number(ev, "x_GpuHours", where),
        mig_gpu_hours=_number(ev, "x_MigGpuEquivalentHours", where, 0.0),
        mig_profile_hours=_number(ev, "x_MigProfileHours", where, 0.0),
        hbm_gb_hours=_number(ev, "x_HbmGbHours", where, 0.0),
        node_gpus=int(_number(ev, "x_NodeGpus", where, 0.0)),
    )


def _revision(ev: Mapping[str, Any], where: str) -> tuple[bool, int]:
    """How an allocation row ranks among its EventId's: a closed hour (rows before open hours
    were metered are closed), then the highest ``x_Revision``."""
    closed = ev.get("x_HourClosed", True)
    rev = ev.get("x_Revision", 0)
    if not isinstance(closed, bool) or isinstance(rev, bool) or not isinstance(rev, int):
        raise InputError(f"{where}: x_HourClosed / x_Revision are not a boolean and an integer")
    return closed, rev


def collect(events: Iterable[tuple[str, Mapping[str, Any]]], policy: LabelPolicy) -> Ledger:
    """Sort events into waste parts, overhead parts and allocation rows, deduped on EventId:
    a restart-waste or restart-overhead event's first copy, an allocation key's closed row or
    else its latest running total."""
    ledger = Ledger()
    seen: set[tuple[str, str]] = set()  # (kind, EventId): each kind's ids are its own
    alloc: dict[str, tuple[tuple[bool, int], AllocationRow]] = {}
    for where, ev in events:
        event_id = str(ev.get("EventId") or "")
        schema = ev.get("schema")
        # The schema first: a row this report cannot read is refused even when its EventId
        # repeats an earlier event's (it is not a replay of a row of a known schema).
        if schema not in KNOWN:
            raise InputError(
                f"{where}: unknown schema {str(schema)[:60]!r} (this report reads"
                f" {', '.join(KNOWN)})"
            )
        if schema == ALLOCATION_V1:
            rank = _revision(ev, where)
            row = allocation_row(ev, where, policy)
            if event_id not in alloc or rank > alloc[event_id][0]:
                alloc[event_id] = (rank, row)
            continue
        kind = "overhead" if schema == OVERHEAD_V1 else "waste"
        if event_id and (kind, event_id) in seen:
            continue
        seen.add((kind, event_id))
        if kind == "overhead":
            ledger.overhead.extend(overhead_parts(ev, where, policy))
        else:
            ledger.waste.extend(waste_parts(ev, where, policy))
    ledger.allocation = [r for _, r in alloc.values()]
    opened = [rank[1] for rank, _ in alloc.values() if not rank[0]]
    if opened:
        ledger.open_until = datetime.fromtimestamp(max(opened) / 1000, UTC).replace(tzinfo=None)
    return ledger


def read_jsonl(path: Path) -> Iterator[tuple[str, Mapping[str, Any]]]:
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"{path}: {getattr(e, 'strerror', None) or e}") from e
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            ev = json.loads(line)
        except ValueError as e:
            raise InputError(f"{path}:{n}: not JSON ({str(e)[:60]})") from e
        if not isinstance(ev, dict):
            raise InputError(f"{path}:{n}: not a JSON object")
        yield f"{path}:{n}", ev


def read_kafka(
    bootstrap: str,
    topic: str,
    since: datetime | None,
    timeout_s: float = 30.0,
    kafka: KafkaSettings | None = None,
) -> list[tuple[str, Mapping[str, Any]]]:
    """Every event of ``topic`` from the window's start to the end offsets seen at start,
    connecting as ``kafka`` says (the ``kafka:`` section of reclaimd's settings)."""
    try:
        return asyncio.run(asyncio.wait_for(_read_kafka(bootstrap, topic, since, kafka), timeout_s))
    except TimeoutError as e:
        raise InputError(f"kafka {topic}: not read within {timeout_s:g}s") from e


async def _read_kafka(
    bootstrap: str, topic: str, since: datetime | None, kafka: KafkaSettings | None
) -> list[tuple[str, Mapping[str, Any]]]:
    from aiokafka import AIOKafkaConsumer, TopicPartition
    from aiokafka.errors import KafkaError

    from reclaimd import kafkaprobe

    # Committed records only: the ledger publishes in transactions, and what a fenced or
    # aborted one wrote stays in the log (it is not an event).
    try:
        client = options(kafka, bootstrap)
    except KafkaConfigError as e:
        raise InputError(str(e)) from e
    consumer = AIOKafkaConsumer(
        **client,
        enable_auto_commit=False,
        group_id=None,
        isolation_level="read_committed",
    )
    out: list[tuple[str, Mapping[str, Any]]] = []
    try:
        await consumer.start()
        # Listing topics never creates one (a metadata request for a name may, on a broker
        # that auto-creates); only a topic that exists is described.
        partitions = await _partitions(client, topic) if topic in await consumer.topics() else []
        if not partitions:
            raise InputError(f"kafka {topic}: no such topic")
        tps = [TopicPartition(topic, p) for p in partitions]
        consumer.assign(tps)
        end = await consumer.end_offsets(tps)
        start: dict[TopicPartition, int] = dict.fromkeys(tps, 0)
        if since is not None:
            ms = int(since.replace(tzinfo=UTC).timestamp() * 1000)
            found = await consumer.offsets_for_times(dict.fromkeys(tps, ms))
            start = {tp: (o.offset if o is not None else end[tp]) for tp, o in found.items()}
        else:
            begin = await consumer.beginning_offsets(tps)
            start = dict(begin)
        for tp in tps:
            consumer.seek(tp, start[tp])
        left = {tp for tp in tps if start[tp] < end[tp]}
        while left:
            batch = await consumer.getmany(*left, timeout_ms=1000)
            for tp, records in batch.items():
                for r in records:
                    if r.offset >= end[tp]:
                        continue
                    try:
                        ev = json.loads(r.value or b"")
                    except ValueError as e:
                        where = f"kafka {topic}[{tp.partition}]@{r.offset}"
                        raise InputError(f"{where}: not JSON") from e
                    if isinstance(ev, dict):
                        out.append((f"kafka {topic}[{tp.partition}]@{r.offset}", ev))
            left = {tp for tp in left if await consumer.position(tp) < end[tp]}
    except (KafkaError, OSError) as e:
        problem = await kafkaprobe.problem(e, bootstrap, kafka, topic)
        raise InputError(
            f"kafka {bootstrap}: {problem or f'{type(e).__name__}: {str(e)[:80]}'}"
        ) from e
    finally:
        await _stop(consumer)
    return out


async def _partitions(client: dict[str, Any], topic: str) -> list[int]:
    """The topic's partition ids (the consumer's own metadata only knows assigned topics)."""
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(**client)
    await admin.start()
    try:
        described = await admin.describe_topics([topic])
    finally:
        await admin.close()
    return sorted(
        int(p["partition"])
        for t in described
        if t.get("topic") == topic and not t.get("error_code")
        for p in t.get("partitions") or ()
    )


async def _stop(consumer: Any) -> None:
    try:
        await consumer.stop()
    except asyncio.CancelledError:
        # aiokafka 0.14 re-raises the cancellation of its own coordinator task when the
        # consumer stops before that task ran; only a cancellation of this task goes on.
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise


def connection_of(path: Path | None) -> KafkaSettings:
    """The kafka section of reclaimd's settings file at ``path`` (with no file, the
    environment's ``RECLAIMD_KAFKA__*`` alone): the report reaches the ledger as replicas do."""
    from reclaimd import config

    try:
        return config.load(path).kafka
    except config.ConfigError as e:
        raise InputError(f"--config: {e}") from e


def read(
    sources: Iterable[str],
    since: datetime | None,
    policy: LabelPolicy,
    kafka: KafkaSettings | None = None,
) -> Ledger:
    """``sources``: JSON-lines paths or ``kafka://host:port[,host:port]/topic`` (reached as
    ``kafka`` says: TLS, SASL)."""
    events: list[tuple[str, Mapping[str, Any]]] = []
    for src in sources:
        if src.startswith("kafka://"):
            rest = src.removeprefix("kafka://")
            bootstrap, _, topic = rest.partition("/")
            if not bootstrap or not topic:
                raise InputError(f"{src}: expected kafka://host:port/topic")
            events.extend(read_kafka(bootstrap, topic, since, kafka=kafka))
        else:
            events.extend(read_jsonl(Path(src)))
    return collect(events, policy)
