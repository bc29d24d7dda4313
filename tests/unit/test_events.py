"""EventRecorder: never blocks, drops when full, aggregates repeats, writes last in the budget."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any, cast

import pytest
from fake_apiserver import FakeApiServer

from reclaimd.cluster import errors
from reclaimd.cluster.apiserver import ApiServer
from reclaimd.cluster.events import (
    NOTE_LIMIT,
    EventRecorder,
    KubeEventSink,
    NoticeEvents,
    Reason,
    Regarding,
    notice_note,
)
from reclaimd.cluster.ratelimit import RateLimiter
from reclaimd.model import (
    CheckpointOutcome,
    Gang,
    GangKey,
    Member,
    Notice,
    NoticeKind,
    RankAck,
    RestartWaste,
    Target,
)
from reclaimd.settings.events import EventSettings
from reclaimd.settings.kube import KubeSettings

NODE = Regarding.node("ip-10-0-0-1", uid="n-1")
POD = Regarding.pod("train", "llm-0", uid="p-1")


class Sink:
    """The API server's side, as a list; ``fail`` makes the next writes raise."""

    def __init__(self) -> None:
        self.created: list[tuple[str, dict[str, Any]]] = []
        self.patched: list[tuple[str, str, dict[str, Any]]] = []
        self.fail: errors.KubeError | None = None
        self.gate: asyncio.Event | None = None

    async def create(self, namespace: str, body: dict[str, Any]) -> None:
        if self.gate is not None:
            await self.gate.wait()
        if self.fail is not None:
            raise self.fail
        self.created.append((namespace, body))

    async def patch(self, namespace: str, name: str, body: dict[str, Any]) -> None:
        if self.fail is not None:
            raise self.fail
        self.patched.append((namespace, name, body))


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def recorder(
    sink: Sink, budget: RateLimiter | None = None, clock: Clock | None = None, **settings: Any
) -> EventRecorder:
    return EventRecorder(
        sink,
        budget or RateLimiter(),
        instance="reclaimd-0",
        # Unvalidated: a test may flush at once (0 s), which no config file may ask.
        settings=EventSettings.model_construct(**settings),
        clock=clock or Clock(),
    )


async def test_event_on_node_and_pod_has_the_fields_kubectl_shows() -> None:
    sink = Sink()
    rec = recorder(sink)
    rec.start()
    deadline = datetime(2026, 5, 1, 12, 0, 2, tzinfo=UTC)
    note = notice_note("ec2", "spot-interruption", "msg-1", deadline)
    assert rec.record(NODE, Reason.INTERRUPTED, note)
    assert rec.record(POD, Reason.CHECKPOINT_MISSED, "rank 0 did not ack within 30s")
    await rec.drain()
    await rec.close()
    (node_ns, node_ev), (pod_ns, pod_ev) = sink.created
    assert node_ns == "default"
    assert node_ev["regarding"] == {
        "apiVersion": "v1",
        "kind": "Node",
        "name": "ip-10-0-0-1",
        "uid": "n-1",
    }
    assert node_ev["reason"] == "Interrupted"
    assert node_ev["type"] == "Warning"
    assert node_ev["action"] == "Claim"
    assert node_ev["reportingController"] == "reclaimd.io/reclaimd"
    assert node_ev["reportingInstance"] == "reclaimd-0"
    assert node_ev["note"] == (
        "ec2 spot-interruption notice msg-1; deadline 2026-05-01T12:00:02.000000Z"
    )
    assert node_ev["metadata"]["name"].startswith("ip-10-0-0-1.")
    assert node_ev["eventTime"].endswith("Z")
    assert "series" not in node_ev
    assert pod_ns == "train"
    assert pod_ev["regarding"]["namespace"] == "train"
    assert pod_ev["type"] == "Warning"
    assert rec.emitted == 2


async def test_events_go_to_the_events_api_of_their_namespace() -> None:
    api = FakeApiServer()
    sink = KubeEventSink(api)
    await sink.create("train", {"note": "n"})
    await sink.patch("default", "ip-10-0-0-1.abc", {"series": {"count": 2}})
    assert api.requests == [
        ("POST", "/apis/events.k8s.io/v1/namespaces/train/events", {"note": "n"}),
        (
            "PATCH",
            "/apis/events.k8s.io/v1/namespaces/default/events/ip-10-0-0-1.abc",
            {"series": {"count": 2}},
        ),
    ]


def test_a_recorder_given_the_api_server_writes_through_it() -> None:
    api = ApiServer(cast(Any, SimpleNamespace(server="https://kube")), cast(Any, None))
    rec = EventRecorder(api, RateLimiter(), instance="reclaimd-0")
    assert isinstance(rec._sink, KubeEventSink)
    sink = Sink()
    assert EventRecorder(sink, RateLimiter(), instance="reclaimd-0")._sink is sink


async def test_record_never_waits_and_drops_when_the_queue_is_full() -> None:
    sink = Sink()
    rec = recorder(sink, queue_size=3)  # not started: nothing drains the queue
    results = [
        rec.record(Regarding.pod("t", f"p-{i}"), Reason.EVICTED, "evicted") for i in range(5)
    ]
    assert results == [True, True, True, False, False]
    assert rec.dropped["queue_full"] == 2
    assert rec.queued == 3
    rec.start()
    await rec.drain()
    await rec.close()
    assert [b["regarding"]["name"] for _, b in sink.created] == ["p-0", "p-1", "p-2"]


async def test_a_dropped_event_is_forgotten_so_its_repeat_starts_over() -> None:
    sink = Sink()
    rec = recorder(sink, queue_size=1)
    assert rec.record(NODE, Reason.CORDONED, "cordoned")
    assert not rec.record(POD, Reason.EVICTED, "evicted")
    rec.start()
    await rec.drain()
    assert rec.record(POD, Reason.EVICTED, "evicted")  # a new event, not a series of nothing
    await rec.drain()
    await rec.close()
    assert [b["reason"] for _, b in sink.created] == ["Cordoned", "Evicted"]
    assert "series" not in sink.created[1][1]
    assert sink.patched == []


async def test_repeats_become_one_series_patched_not_new_events() -> None:
    sink = Sink()
    clock = Clock()
    rec = recorder(sink, clock=clock, series_flush_s=0.0)
    rec.start()
    rec.record(NODE, Reason.INTERRUPTED, "same notice")
    await rec.drain()
    clock.t += 5
    rec.record(NODE, Reason.INTERRUPTED, "same notice")
    await rec.drain()
    clock.t += 5
    rec.record(NODE, Reason.INTERRUPTED, "same notice")
    await rec.drain()
    await rec.close()
    assert len(sink.created) == 1
    name = sink.created[0][1]["metadata"]["name"]
    assert [(ns, n, b["series"]["count"]) for ns, n, b in sink.patched] == [
        ("default", name, 2),
        ("default", name, 3),
    ]
    assert rec.aggregated == 2


async def test_repeats_while_queued_are_carried_by_the_one_pending_write() -> None:
    sink = Sink()
    rec = recorder(sink)
    for _ in range(50):
        rec.record(NODE, Reason.DRAINED, "drained")
    assert rec.queued == 1
    rec.start()
    await rec.drain()
    await rec.close()
    assert len(sink.created) == 1
    assert sink.created[0][1]["series"]["count"] == 50
    assert sink.patched == []


async def test_a_series_is_flushed_at_most_once_per_flush_interval() -> None:
    sink = Sink()
    rec = recorder(sink, series_flush_s=0.2)
    rec.start()
    rec.record(POD, Reason.CHECKPOINT_REQUESTED, "x")
    await rec.drain()
    for _ in range(20):  # within one flush interval: one delayed patch carries them all
        rec.record(POD, Reason.CHECKPOINT_REQUESTED, "x")
    assert sink.patched == []
    for _ in range(50):
        await asyncio.sleep(0.02)
        if sink.patched:
            break
    await rec.drain()
    await rec.close()
    assert [b["series"]["count"] for *_, b in sink.patched] == [21]


async def test_a_different_note_or_object_is_a_different_event() -> None:
    sink = Sink()
    rec = recorder(sink)
    rec.start()
    rec.record(NODE, Reason.INTERRUPTED, "notice a")
    rec.record(NODE, Reason.INTERRUPTED, "notice b")
    rec.record(Regarding.node("other"), Reason.INTERRUPTED, "notice a")
    await rec.drain()
    await rec.close()
    assert len(sink.created) == 3
    assert len({b["metadata"]["name"] for _, b in sink.created}) == 3


async def test_a_repeat_after_the_series_window_is_a_new_event() -> None:
    sink = Sink()
    clock = Clock()
    rec = recorder(sink, clock=clock, series_window_s=60.0)
    rec.start()
    rec.record(NODE, Reason.CORDONED, "c")
    await rec.drain()
    clock.t += 61
    rec.record(NODE, Reason.CORDONED, "c")
    await rec.drain()
    await rec.close()
    assert len(sink.created) == 2
    assert sink.patched == []


async def test_stale_events_are_dropped_not_written() -> None:
    sink = Sink()
    clock = Clock()
    rec = recorder(sink, clock=clock, max_age_s=10.0)
    rec.record(NODE, Reason.CORDONED, "c")
    clock.t += 11  # waited in the queue longer than max_age_s
    rec.start()
    await rec.drain()
    await rec.close()
    assert sink.created == []
    assert rec.dropped["stale"] == 1


async def test_failures_are_counted_and_never_raised() -> None:
    sink = Sink()
    sink.fail = errors.Forbidden("create event", 403, "no RBAC")
    rec = recorder(sink)
    rec.start()
    assert rec.record(NODE, Reason.CORDONED, "c")
    await rec.drain()
    await rec.close()
    assert rec.dropped["failed"] == 1
    assert rec.emitted == 0


async def test_a_throttled_event_is_not_retried_but_slows_the_budget() -> None:
    sink = Sink()
    sink.fail = errors.Throttled("create event", 429, "slow down", retry_after_s=None)
    budget = RateLimiter(KubeSettings(qps=100.0, burst=10))
    rec = recorder(sink, budget)
    rec.start()
    rec.record(NODE, Reason.CORDONED, "c")
    await rec.drain()
    await rec.close()
    assert budget.pushed_back == 1
    assert budget.rate == 50.0
    assert rec.dropped["failed"] == 1


async def test_events_wait_behind_every_write_that_has_a_deadline() -> None:
    """The budget serves earliest deadline first; an event has none, so it goes last."""
    order: list[str] = []
    budget = RateLimiter(KubeSettings(qps=50.0, burst=1, min_qps=1.0))
    sink = Sink()

    async def create(namespace: str, body: dict[str, Any]) -> None:
        order.append("event")

    sink.create = create  # type: ignore[method-assign]
    rec = recorder(sink, budget)
    await budget.acquire(None)  # spend the only token: everything below queues

    async def notice_write(i: int) -> None:
        deadline = datetime.now(UTC) + timedelta(seconds=30 + i)

        async def write() -> None:
            order.append(f"notice-{i}")

        await budget.call(f"cordon {i}", deadline, write)

    rec.record(NODE, Reason.INTERRUPTED, "first in")
    rec.start()
    await asyncio.sleep(0)  # the event's writer queues for a token first
    writes = [asyncio.create_task(notice_write(i)) for i in range(3)]
    await asyncio.gather(*writes)
    await rec.drain()
    await rec.close()
    assert order == ["notice-0", "notice-1", "notice-2", "event"]


def test_notes_are_bounded_to_the_api_limit() -> None:
    sink = Sink()
    rec = recorder(sink)
    rec.record(POD, Reason.CHECKPOINT_MISSED, "é" * 2000)
    entry = next(iter(rec._entries.values()))
    assert len(entry.note.encode("utf-8")) <= NOTE_LIMIT
    assert entry.note.endswith("…")


def test_notice_note_without_a_deadline() -> None:
    assert notice_note("kueue", "kueue-reclaim", "w-1", None).endswith("deadline none")


@pytest.mark.parametrize("reason", list(Reason))
def test_every_reason_has_an_action_and_a_type(reason: Reason) -> None:
    sink = Sink()
    rec = recorder(sink)
    rec.record(NODE, reason, "n")
    entry = next(iter(rec._entries.values()))
    body = rec._body(entry)
    assert body["type"] in ("Normal", "Warning")
    assert 0 < len(body["action"]) <= 128


# --- NoticeEvents: the pipeline's steps -----------------------------------------------------


def _gang() -> Gang:
    members = tuple(
        Member(namespace="train", name=f"llm-{r}", uid=f"u-{r}", node=f"n-{r}", gpus=8, rank=r)
        for r in range(2)
    )
    # Cost labels are on the gang; none may reach an Event.
    return Gang(GangKey("jobset", "train", "llm"), members, labels={"tenant": "secret-team"})


def _notice() -> Notice:
    now = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
    return Notice(
        id="msg-7",
        source="ec2",
        kind=NoticeKind.SPOT_INTERRUPTION,
        target=Target(instance_id="i-1"),
        issued_at=now,
        deadline=now + timedelta(minutes=2),
        received_at=now,
    )


async def test_the_steps_of_one_notice_as_events() -> None:
    sink = Sink()
    rec = recorder(sink)
    steps = NoticeEvents(rec)
    gang, notice = _gang(), _notice()
    steps.claimed(notice, ("n-0", "n-1"), cordoned=True)
    steps.checkpoint_requested(notice, gang, notice.deadline - timedelta(seconds=40))
    steps.checkpoint_answered(
        [RankAck(gang.members[0], acked=True, durable=True, latency_s=3.2),
         RankAck(gang.members[1], acked=False, error="timed out")]
    )  # fmt: skip
    steps.evicted(gang.members[0], "evicted")
    steps.drained(notice, ("n-0",))
    steps.recorded(
        RestartWaste(
            event_id="ev-1", notice=notice, gang=gang, gpu_seconds_lost=960.0,
            stopped_at=notice.deadline, last_good_checkpoint=None,
            outcome=CheckpointOutcome.PARTIAL, deadline_met=True,
        )
    )  # fmt: skip
    rec.start()
    await rec.drain()
    await rec.close()
    seen = [(b["regarding"]["name"], b["reason"]) for _, b in sink.created]
    assert seen == [
        ("n-0", "Interrupted"), ("n-0", "Cordoned"), ("n-1", "Interrupted"), ("n-1", "Cordoned"),
        ("llm-0", "CheckpointRequested"), ("llm-1", "CheckpointRequested"),
        ("llm-0", "CheckpointAcked"), ("llm-1", "CheckpointMissed"),
        ("llm-0", "Evicted"), ("n-0", "Drained"),
        ("llm-0", "RestartWasteRecorded"), ("llm-1", "RestartWasteRecorded"),
    ]  # fmt: skip
    notes = {(b["regarding"]["name"], b["reason"]): b["note"] for _, b in sink.created}
    assert notes[("n-0", "Interrupted")] == (
        "ec2 spot_interruption notice msg-7; deadline 2026-05-01T12:02:00.000000Z"
    )
    assert notes[("llm-1", "CheckpointMissed")] == "checkpoint missed: timed out"
    assert "960 GPU-seconds" in notes[("llm-0", "RestartWasteRecorded")]
    assert all("secret-team" not in b["note"] for _, b in sink.created)
