"""GCE/GKE preemption end to end: a real reclaimd process, the Pub/Sub emulator carrying
Cloud Logging sink entries, kube-apiserver + kwok nodes with GCE providerIDs, Kafka for the
ledger, fake trainers; and the per-node metadata watcher against chaos/standins/gce.py
(our stand-in: no emulator of the GCE metadata server exists).

The GCE window is 30 s; every test asserts the runbook finished inside it."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from chaos import inject
from chaos import stack as stackenv
from chaos.fleet import GangSpec, NodeSpec
from chaos.harness import Harness
from chaos.process import DaemonProcess
from chaos.standins.gce import GceMetadataServer
from reclaimd.handlers.pubsub import transport as pubsub
from reclaimd.handlers.pubsub.settings import PubSubSettings
from reclaimd.handlers.pubsub.transport import PubSubSource
from reclaimd.intake import Admission
from reclaimd.model import Notice, Windows, parse_time, stable_id, utcnow

TAINT = "reclaimd.io/interruption"
GCE_WINDOW_S = 30.0


@pytest.fixture
async def h(stack: Any) -> AsyncIterator[Harness]:
    async with Harness(stackenv.load()) as harness:
        yield harness


@pytest.fixture
async def channel(h: Harness) -> AsyncIterator[inject.PubSubChannel]:
    ch = await asyncio.to_thread(h.pubsub_channel)
    yield ch
    await asyncio.to_thread(ch.delete)


def pubsub_config(channel: inject.PubSubChannel) -> dict[str, Any]:
    return {
        "sqs": {"enabled": False},
        "pubsub": {
            "enabled": True,
            "project": channel.project,
            "subscription": channel.name,
            "max_messages": 10,
        },
    }


async def four_ranks_on_two_nodes(h: Harness) -> tuple[list[NodeSpec], GangSpec, list[str]]:
    nodes = [h.gce_node_spec(i) for i in range(2)]
    await h.add_nodes(nodes)
    placement = [nodes[0].name, nodes[0].name, nodes[1].name, nodes[1].name]
    gang = await h.add_gang("gke", placement, gpus_per_rank=4)
    return nodes, gang, [gang.pod_name(r) for r in range(4)]


def admissions_logged(d: DaemonProcess, notice_id: str) -> list[str]:
    out = []
    for line in d.log_path.read_text(errors="replace").splitlines():
        if '"notice admitted"' not in line:
            continue
        with_fields = json.loads(line)
        if with_fields.get("notice_id") == notice_id:
            out.append(with_fields["admission"])
    return out


async def until_logged(d: DaemonProcess, notice_id: str, count: int, timeout_s: float = 30) -> None:
    for _ in range(int(timeout_s / 0.2)):
        if len(admissions_logged(d, notice_id)) >= count:
            return
        await asyncio.sleep(0.2)
    raise TimeoutError(f"{notice_id}: {admissions_logged(d, notice_id)}")


async def assert_runbook_inside_the_window(
    h: Harness, notice: Notice, doomed: NodeSpec, healthy: NodeSpec, pods: list[str]
) -> dict[str, Any]:
    """Claimed, cordoned and tainted; every rank asked, every pod gone before the deadline;
    one ledger event for the gang. Returns the event."""
    assert notice.deadline is not None
    assert (notice.deadline - notice.issued_at).total_seconds() == GCE_WINDOW_S
    events = await h.ledger_events(count=1, timeout_s=GCE_WINDOW_S + 30, settle_s=2.0)
    assert len(events) == 1, events
    (event,) = events

    claim = await h.wait_phase(doomed.name, "done")
    assert claim["notice_id"] == notice.id
    node = await h.core.read_node(doomed.name)
    assert node.spec.unschedulable is True
    assert any(t.key == TAINT for t in node.spec.taints or [])
    assert not (await h.core.read_node(healthy.name)).spec.unschedulable

    # every rank, the two on the healthy node too
    assert h.trainers.asked(notice.id) == {f"{h.namespace}/{p}" for p in pods}
    assert await h.pods_left(pods) == []

    assert event["x_NoticeId"] == notice.id
    assert event["x_GangId"].rsplit("/", 1)[-1] == "gke"
    assert event["x_DeadlineMet"] is True
    assert event["x_CheckpointOutcome"] == "checkpointed"
    assert parse_time(event["ChargePeriodEnd"]) <= notice.deadline

    # the trace agrees: every eviction ended before the deadline
    timeline = await h.timeline(notice.id)
    assert timeline.window_s is not None
    evictions = [r for r in timeline.rows if r.step == "evict"]
    assert {r.subject for r in evictions} == {f"{h.namespace}/{p}" for p in pods}
    assert all(r.ok and r.end_s <= timeline.window_s for r in evictions)
    assert timeline.deadline_met
    return event


# --- Cloud Logging sink -> Pub/Sub -> reclaimd ------------------------------------------------


async def test_preemption_via_pubsub_handled_inside_the_window(
    h: Harness, channel: inject.PubSubChannel
) -> None:
    nodes, _, pods = await four_ranks_on_two_nodes(h)
    d = await h.start_daemon(**pubsub_config(channel))
    operation = f"systemevent-{h.run_id}"

    notice = await h.send_gce_preemption(channel, nodes[0], operation_id=operation)
    assert notice.target.provider_id == nodes[0].provider_id
    await assert_runbook_inside_the_window(h, notice, nodes[0], nodes[1], pods)
    print(f"\nGKE via Pub/Sub timings: {json.dumps(await h.timings(notice))}")

    # The sink delivers the same entry again (a replay; a new messageId): same notice, acked
    # as a duplicate, no second event.
    again = await h.send_gce_preemption(channel, nodes[0], operation_id=operation)
    assert again.id == notice.id
    await until_logged(d, notice.id, 2)
    assert admissions_logged(d, notice.id) == ["claimed", "duplicate"]
    assert len(await h.ledger_events(count=2, timeout_s=3)) == 1


# --- the Pub/Sub transport itself, on the emulator --------------------------------------------


class Scripted:
    def __init__(self, *answers: Admission, gate: asyncio.Event | None = None) -> None:
        self.answers, self.gate = list(answers), gate
        self.seen: list[Notice] = []
        self.at: list[float] = []  # time.monotonic() of each call

    async def __call__(self, notice: Notice) -> Admission:
        self.seen.append(notice)
        self.at.append(time.monotonic())
        if self.gate is not None:
            await self.gate.wait()
        return self.answers.pop(0) if self.answers else Admission.CLAIMED


async def _until(cond: Any, timeout_s: float = 30) -> None:
    for _ in range(int(timeout_s / 0.05)):
        if cond():
            return
        await asyncio.sleep(0.05)
    raise TimeoutError("condition not reached")


# A message leased to a stream waits out its ack deadline (10 s) before anyone else can pull
# it. The stack's emulator drops a cancelled stream at once, as the real service does
# (tests/e2e/test_pubsub_emulator.py), so a message published after the cancel reaches a pull
# well within one deadline; a few pulls at once, as one may come back empty.
PULL_WITHIN_S = 5.0
PULLERS = 4
STREAM_THREADS = (
    "Thread-ConsumeBidirectionalStream",
    "Thread-LeaseMaintainer",
    "Thread-Heartbeater",
    "Thread-CallbackRequestDispatcher",
)


def _stream_threads() -> list[str]:
    """The Pub/Sub client's threads of a stream still open in this process."""
    return [t.name for t in threading.enumerate() if t.name.startswith(STREAM_THREADS)]


def _pull_within(channel: inject.PubSubChannel, within_s: float = PULL_WITHIN_S) -> list[bytes]:
    """Pull with ``PULLERS`` pulls at a time until one gets something or ``within_s`` passes
    (a pull may end empty or time out); the first one's messages, unacked."""
    from google.api_core import exceptions

    deadline = time.monotonic() + within_s
    got: list[bytes] = []
    done, first = threading.Event(), threading.Lock()

    def puller() -> None:
        while not done.is_set() and (left := deadline - time.monotonic()) > 0:
            try:
                reply = channel.subscriber.pull(
                    subscription=channel.subscription, max_messages=10, timeout=min(left, 5.0)
                )
            except exceptions.DeadlineExceeded:
                continue
            with first:
                if reply.received_messages and not done.is_set():
                    got.extend(m.message.data for m in reply.received_messages)
                    done.set()

    with concurrent.futures.ThreadPoolExecutor(PULLERS, thread_name_prefix="pull") as pool:
        for _ in range(PULLERS):
            pool.submit(puller)
    return got


async def test_pubsub_nack_redelivers_and_cancel_releases_the_stream(
    channel: inject.PubSubChannel, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pubsub, "RETRY_PAUSE_S", 0.2)
    admit = Scripted(Admission.RETRY)
    settings = PubSubSettings(
        enabled=True, project=channel.project, subscription=channel.name, max_messages=4
    )
    src = PubSubSource(settings, admit=admit, windows=Windows())
    run = asyncio.create_task(src.run())
    try:
        entry = inject.gce_log_entry(
            project="reclaimd-local", zone="us-central1-a", instance="vm-nack"
        )
        await asyncio.to_thread(channel.publish, entry)
        await _until(lambda: src.counters.acked == 1)
        # first delivery not claimed -> nacked -> redelivered -> claimed -> acked
        assert len(admit.seen) == 2
        assert len({n.id for n in admit.seen}) == 1
        assert src.counters.left_for_redelivery == 1
        assert src.counters.by_admission == {"retry": 1, "claimed": 1}
    finally:
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run
    # The stream is closed: the client's threads for it are gone, and a message published now
    # reaches a plain pull within half a lease, never the cancelled source. (A stream still
    # consuming would claim and ack it, and the pulls would come back empty; one the emulator
    # still leased messages to would hold it for the 10 s lease.)
    await _until(lambda: not _stream_threads(), timeout_s=5)
    later = inject.gce_log_entry(
        project="reclaimd-local", zone="us-central1-a", instance="vm-later"
    )
    await asyncio.to_thread(channel.publish, later)
    pulled = await asyncio.to_thread(_pull_within, channel)
    assert [json.loads(p)["operation"]["id"] for p in pulled] == [later["operation"]["id"]]
    assert len(admit.seen) == 2  # the cancelled source never saw it
    assert src.counters.released == 0  # it held nothing when it stopped


PEERS = 2  # peer replicas on the same subscription


async def test_pubsub_a_stopping_source_hands_its_messages_to_a_peer(
    channel: inject.PubSubChannel,
) -> None:
    """A source cancelled (SIGTERM) while a claim hangs nacks the message before its stream
    closes: a peer replica's stream gets it at once, not after a lease. The figure is the
    emulator's, not production's."""
    gate = asyncio.Event()  # the first replica's claim never ends
    first_admit, peer_admits = Scripted(gate=gate), [Scripted() for _ in range(PEERS)]
    settings = PubSubSettings(
        enabled=True, project=channel.project, subscription=channel.name, max_messages=4
    )
    first = PubSubSource(settings, admit=first_admit, windows=Windows())
    peers = [PubSubSource(settings, admit=a, windows=Windows()) for a in peer_admits]
    runs = [asyncio.create_task(first.run())]
    try:
        entry = inject.gce_log_entry(
            project="reclaimd-local", zone="us-central1-a", instance="vm-held"
        )
        await asyncio.to_thread(channel.publish, entry)
        await _until(lambda: len(first_admit.seen) == 1)
        runs += [asyncio.create_task(peer.run()) for peer in peers]
        await asyncio.sleep(2.0)  # the peers' streams open; the message stays leased
        assert not any(a.seen for a in peer_admits)

        stopping = time.monotonic()
        runs[0].cancel()
        with pytest.raises(asyncio.CancelledError):
            await runs[0]
        stop_s = time.monotonic() - stopping
        assert first.counters.released == 1
        await _until(lambda: any(a.seen for a in peer_admits), timeout_s=30)
        back_s = min(a.at[0] for a in peer_admits if a.at) - stopping
        print(f"\nPub/Sub hand-back: stop {stop_s:.2f} s, a peer had it {back_s:.2f} s after")
        # Without the nack the message would wait out the 10 s lease: half of it is plenty.
        assert back_s < 5.0
        got = [n.id for a in peer_admits for n in a.seen]
        assert got[0] == first_admit.seen[0].id
        await _until(lambda: sum(p.counters.acked for p in peers) >= 1)
    finally:
        gate.set()
        for run in runs:
            run.cancel()
        await asyncio.gather(*runs, return_exceptions=True)


async def test_pubsub_flow_control_bounds_messages_in_flight(
    channel: inject.PubSubChannel,
) -> None:
    gate = asyncio.Event()
    admit = Scripted(gate=gate)
    settings = PubSubSettings(
        enabled=True, project=channel.project, subscription=channel.name, max_messages=2
    )
    src = PubSubSource(settings, admit=admit, windows=Windows())
    run = asyncio.create_task(src.run())
    try:
        for i in range(5):
            entry = inject.gce_log_entry(
                project="reclaimd-local", zone="us-central1-a", instance=f"vm-{i}"
            )
            await asyncio.to_thread(channel.publish, entry)
        await _until(lambda: len(admit.seen) >= 2)
        await asyncio.sleep(1.0)  # room for a third delivery, if flow control let one through
        assert len(admit.seen) == 2
        gate.set()
        await _until(lambda: src.counters.acked == 5)
        assert len({n.id for n in admit.seen}) == 5
    finally:
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run


async def test_pubsub_dead_stream_is_reopened(channel: inject.PubSubChannel) -> None:
    admit = Scripted()
    settings = PubSubSettings(enabled=True, project=channel.project, subscription=channel.name)
    src = PubSubSource(settings, admit=admit, windows=Windows())
    run = asyncio.create_task(src.run())
    try:
        first = inject.gce_log_entry(
            project="reclaimd-local", zone="us-central1-a", instance="vm-before"
        )
        await asyncio.to_thread(channel.publish, first)
        await _until(lambda: src.counters.acked == 1)  # the stream is up
        # The subscription goes away under the stream (a non-retryable error), then returns.
        await asyncio.to_thread(
            channel.subscriber.delete_subscription, subscription=channel.subscription
        )
        await _until(lambda: src.counters.transport_errors >= 1)
        await asyncio.to_thread(
            channel.subscriber.create_subscription,
            name=channel.subscription,
            topic=channel.topic,
        )
        after = inject.gce_log_entry(
            project="reclaimd-local", zone="us-central1-a", instance="vm-after"
        )
        await asyncio.to_thread(channel.publish, after)
        await _until(lambda: src.counters.acked == 2)
        assert [n.target.node_name for n in admit.seen] == ["vm-before", "vm-after"]
        assert not run.done()
    finally:
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run


# --- per-node mode: the metadata server ---------------------------------------------------------


async def test_metadata_preempted_flip_runs_the_same_runbook(h: Harness) -> None:
    nodes, _, pods = await four_ranks_on_two_nodes(h)
    doomed = nodes[0]
    async with GceMetadataServer(
        project=doomed.project, zone=doomed.zone, instance=doomed.name
    ) as metadata:
        d = await h.start_daemon(
            sqs={"enabled": False},
            gce_metadata={
                "enabled": True,
                "url": metadata.url,
                "node_name": doomed.name,
                "timeout_s": 10,
            },
        )
        await _until(lambda: metadata.waiting == 2)  # both keys watched with hanging GETs
        flipped = utcnow()
        etag = await metadata.set("instance/preempted", "TRUE")
        notice_id = stable_id(
            "gcp.metadata.preempted", doomed.project, doomed.zone, doomed.name, "TRUE", etag
        )
        await until_logged(d, notice_id, 1)
        claim = await h.wait_phase(doomed.name, "done", timeout_s=GCE_WINDOW_S + 30)
        notice = Notice.from_json(claim["notice"])  # observed_at is the daemon's
        assert notice.id == notice_id
        await assert_runbook_inside_the_window(h, notice, doomed, nodes[1], pods)
        timings = await h.timings(notice)
        # The notice's time is when the watcher read the value; add the flip -> read lag.
        timings["flip_to_read_s"] = (notice.issued_at - flipped).total_seconds()
        print(f"\nGCE metadata timings: {json.dumps(timings)}")
        # The watcher hangs on the new ETag again and admits nothing more.
        await _until(lambda: metadata.waiting == 2)
        assert admissions_logged(d, notice_id) == ["claimed"]
        assert any(
            key == "instance/preempted" and query.get("last_etag") == etag
            for key, query in metadata.requests
        )
