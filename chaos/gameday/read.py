"""Game day: what the release wrote, read for this drill only. Its ledger topic from where it
stood when the drill started, for the drill's namespace alone (the topic also carries the
fleet's real interruptions); its spans, the whole traces of the drill's notices."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from chaos.gameday.target import GameDayError
from reclaimd.kafkaconn import KafkaSettings, options


def traces_of(ids: Sequence[str], paths: Sequence[str]) -> list[str]:
    """Every span line of the traces that name one of ``ids``."""
    spans: list[tuple[str, str]] = []  # (trace id, line), each line parsed once
    for path in paths:
        with contextlib.suppress(OSError), open(path) as f:
            spans.extend((_trace_id(line), line) for line in f)
    traces = {trace for trace, line in spans if any(i in line for i in ids)}
    return [line for trace, line in spans if trace in traces]


def _trace_id(line: str) -> str:
    try:
        return str(json.loads(line).get("trace_id", ""))
    except ValueError:
        return ""


class FromOffsets(AIOKafkaConsumer):  # type: ignore[misc]
    """The release's ledger from where it stood when the drill started, and only the events
    of the drill's namespace: the topic also carries the fleet's real interruptions."""

    def __init__(self, offsets: dict[TopicPartition, int], namespace: str, **kw: Any) -> None:
        super().__init__(**kw)
        self._offsets = offsets
        self._namespace = namespace

    async def start(self) -> None:
        await super().start()
        self.assign(list(self._offsets))
        for tp, offset in self._offsets.items():
            self.seek(tp, offset)

    async def getmany(self, *partitions: TopicPartition, **kw: Any) -> dict[Any, list[Any]]:
        batch = await super().getmany(*partitions, **kw)
        return {tp: [r for r in rs if self._ours(r.value)] for tp, rs in batch.items()}

    def _ours(self, value: bytes) -> bool:
        try:
            return bool(json.loads(value).get("x_K8sNamespaceName") == self._namespace)
        except (ValueError, AttributeError):
            return False


async def end_offsets(
    bootstrap: str, topic: str, kafka: KafkaSettings | None = None
) -> dict[TopicPartition, int]:
    """The topic's end offsets, reached as the release's ``kafka`` settings say."""
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(**options(kafka, bootstrap))
    await admin.start()
    try:
        (described,) = await admin.describe_topics([topic])
    finally:
        await admin.close()
    tps = [TopicPartition(topic, p["partition"]) for p in described.get("partitions", [])]
    if described.get("error_code") or not tps:
        raise GameDayError(f"the release's ledger topic {topic!r} does not exist")
    consumer = AIOKafkaConsumer(**options(kafka, bootstrap), group_id=None)
    await consumer.start()
    try:
        ends = await consumer.end_offsets(tps)
    finally:
        await consumer.stop()
    return {tp: int(ends[tp]) for tp in tps}
