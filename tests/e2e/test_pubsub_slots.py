"""Pub/Sub slots on the real stack: each replica consumes a subscription of its own on the
sink's topic (``pubsub.slots``), holding the slot's Lease on the real apiserver, so a notice
never waits for a dead replica's lease: the survivor admits its own copy.

The transports run on the Pub/Sub emulator, the slot Leases on kube-apiserver; the first test
drives the transports in this process (an admission that never ends holds a message, as in
tests/e2e/test_gke.py), the second runs ``reclaimd run`` twice and SIGKILLs one."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, cast

import pytest
from kubernetes_asyncio import client as k8s

from chaos import inject
from chaos import stack as stackenv
from chaos.harness import Harness
from chaos.process import DaemonProcess
from reclaimd.cluster import slots
from reclaimd.cluster.apiserver import ApiServer
from reclaimd.cluster.ratelimit import RateLimiter
from reclaimd.cluster.slots import PubSubSlots
from reclaimd.handlers.pubsub.settings import PubSubSettings
from reclaimd.handlers.pubsub.transport import SlottedPubSubSource
from reclaimd.intake import Admission
from reclaimd.model import Notice, Windows

NAMESPACE = "reclaimd"  # lease_namespace: where the chart's Role lets reclaimd keep Leases
SLOTS = 2


class SlotChannel:
    """The sink's topic and one subscription per slot, as deploy/gcp/main.tf makes them."""

    def __init__(self, project: str, name: str, slots: int = SLOTS) -> None:
        self.inner = inject.PubSubChannel(project, name)
        self.project, self.name = project, name
        self.settings = PubSubSettings(
            enabled=True, project=project, subscription=name, slots=slots, max_messages=4
        )
        self.ids = [self.settings.slot_subscription(i) for i in range(slots)]

    def create(self) -> SlotChannel:
        sub = self.inner.subscriber
        self.inner.publisher.create_topic(name=self.inner.topic)
        for sub_id in self.ids:
            sub.create_subscription(
                name=sub.subscription_path(self.project, sub_id),
                topic=self.inner.topic,
                ack_deadline_seconds=10,
            )
        return self

    def delete(self) -> None:
        sub = self.inner.subscriber
        for sub_id in self.ids:
            with contextlib.suppress(Exception):
                sub.delete_subscription(subscription=sub.subscription_path(self.project, sub_id))
        self.inner.delete()


class Scripted:
    """Stands in for the intake: records each notice, answers ``answer`` (after ``gate``)."""

    def __init__(self, answer: Admission = Admission.CLAIMED, gate: asyncio.Event | None = None):
        self.answer, self.gate = answer, gate
        self.seen: list[Notice] = []

    async def __call__(self, notice: Notice) -> Admission:
        self.seen.append(notice)
        if self.gate is not None:
            await self.gate.wait()
        return self.answer


async def _until(cond: Callable[[], bool], timeout_s: float = 30) -> None:
    for _ in range(int(timeout_s / 0.05)):
        if cond():
            return
        await asyncio.sleep(0.05)
    raise TimeoutError("condition not reached")


@pytest.fixture
async def h(stack: Any) -> AsyncIterator[Harness]:
    async with Harness(stackenv.load()) as harness:
        yield harness


@pytest.fixture
async def channel(h: Harness) -> AsyncIterator[SlotChannel]:
    project = h.stack.values["PUBSUB_PROJECT_ID"]
    ch = await asyncio.to_thread(SlotChannel(project, f"reclaimd-{h.run_id}").create)
    yield ch
    await asyncio.to_thread(ch.delete)
    assert h.api is not None
    coord = k8s.CoordinationV1Api(h.api)
    for sub_id in ch.ids:
        with contextlib.suppress(Exception):
            await coord.delete_namespaced_lease(slots.lease_name(sub_id), NAMESPACE)


async def slot_holder(h: Harness, sub_id: str) -> str:
    assert h.api is not None
    lease = await k8s.CoordinationV1Api(h.api).read_namespaced_lease(
        slots.lease_name(sub_id), NAMESPACE
    )
    return str(lease.spec.holder_identity or "")


async def test_the_survivors_own_copy_admits_a_notice_its_peer_held_and_a_released_slot_is_taken(
    h: Harness, channel: SlotChannel, api: ApiServer
) -> None:
    limiter = RateLimiter()

    def replica(holder: str, admit: Scripted) -> SlottedPubSubSource:
        leases = PubSubSlots(
            api, NAMESPACE, holder, subscriptions=channel.ids, lease_s=6.0, limiter=limiter
        )
        return SlottedPubSubSource(channel.settings, leases, admit=admit, windows=Windows())

    never = asyncio.Event()  # replica a's claim never ends: it holds its copy, unsettled
    a_admit, b_admit, c_admit = Scripted(gate=never), Scripted(), Scripted(Admission.DUPLICATE)
    a, b, c = (
        replica(f"a-{h.run_id}", a_admit),
        replica(f"b-{h.run_id}", b_admit),
        replica(f"c-{h.run_id}", c_admit),
    )
    runs: dict[str, asyncio.Task[None]] = {}
    try:
        runs["a"] = asyncio.create_task(a.run())
        await _until(lambda: a.held_slot == 0)
        runs["b"] = asyncio.create_task(b.run())
        await _until(lambda: b.held_slot == 1)
        # A third replica (a surge pod) finds no free slot and waits.
        runs["c"] = asyncio.create_task(c.run())
        await asyncio.sleep(3.0)  # more than one of its looks for a slot
        assert c.held_slot is None
        assert await slot_holder(h, channel.ids[0]) == f"a-{h.run_id}"
        assert await slot_holder(h, channel.ids[1]) == f"b-{h.run_id}"

        entry = inject.gce_log_entry(
            project="reclaimd-local", zone="us-central1-a", instance=f"vm-{h.run_id}"
        )
        await asyncio.to_thread(channel.inner.publish, entry)
        # Each slot's subscription carries its own copy: a holds one (its claim never ends),
        # b admits the other, from subscription -1, whatever a does with its own.
        await _until(lambda: bool(a_admit.seen) and b.counters.acked == 1, timeout_s=15)
        assert [n.id for n in b_admit.seen] == [a_admit.seen[0].id]
        assert a.current is not None and a.current.settings.subscription == channel.ids[0]
        assert b.current is not None and b.current.settings.subscription == channel.ids[1]
        assert a.counters.acked == 0  # still held by a, unsettled

        # a stops (SIGTERM): its source nacks what it held, then its slot is released...
        stopping = runs.pop("a")
        stopping.cancel()
        with pytest.raises(asyncio.CancelledError):
            await stopping
        assert a.held_slot is None
        assert a.counters.released == 1
        # ...and the waiting replica takes it; a's copy, back on subscription -0, goes to it
        # or to b, who minds the slot while it is free.
        await _until(lambda: c.held_slot == 0, timeout_s=15)
        assert await slot_holder(h, channel.ids[0]) == f"c-{h.run_id}"
        # At once: a's stream is closed, so its nacked copy is not leased to it again (the
        # emulator's fix, tests/e2e/test_pubsub_emulator.py): well within one 10 s lease.
        t0 = time.monotonic()
        await _until(lambda: c.counters.acked + b.counters.acked == 2, timeout_s=5)
        print(f"\na's nacked copy admitted again {time.monotonic() - t0:.2f} s after c took slot 0")
        again = c_admit.seen + b_admit.seen[1:]
        assert [n.id for n in again] == [b_admit.seen[0].id]  # once more, not twice
        # b leaves slot 0 to its holder.
        await _until(lambda: not cast(PubSubSlots, b.slots).minded, timeout_s=15)
    finally:
        never.set()
        for task in runs.values():
            task.cancel()
        await asyncio.gather(*runs.values(), return_exceptions=True)


async def test_a_free_slot_is_minded_until_a_replica_holds_it(
    h: Harness, channel: SlotChannel, api: ApiServer
) -> None:
    """The only copy left on a replica's own slot is leased to a dead stream (pulled by hand,
    its deadline pushed to 600 s; no seek, ``rewind_s: 0``), its peer stopped and released
    the other slot: the replica admits the other slot's copy now, minding the free slot
    without its Lease, and leaves the slot to the first replica that takes it."""
    settings = channel.settings.model_copy(update={"rewind_s": 0})
    limiter = RateLimiter()

    def replica(holder: str, admit: Scripted) -> SlottedPubSubSource:
        leases = PubSubSlots(
            api, NAMESPACE, holder, subscriptions=channel.ids, lease_s=6.0, limiter=limiter
        )
        return SlottedPubSubSource(settings, leases, admit=admit, windows=Windows())

    # The peer held slot 1 and stopped (released it); nobody has read slot 0 yet.
    peer = replica(f"b-{h.run_id}", Scripted())
    peer_leases = cast(PubSubSlots, peer.slots)
    assert await peer_leases._take(1, None)
    await peer_leases.release()
    assert await slot_holder(h, channel.ids[1]) == ""

    raw = channel.inner.subscriber
    path = raw.subscription_path(channel.project, channel.ids[0])
    instance = f"vm-{h.run_id}"

    def leased_to_a_dead_stream() -> None:
        entry = inject.gce_log_entry(
            project="reclaimd-local", zone="us-central1-a", instance=instance
        )
        channel.inner.publish(entry)
        for _ in range(20):
            got = list(raw.pull(subscription=path, max_messages=1, timeout=5).received_messages)
            if got:
                raw.modify_ack_deadline(
                    subscription=path, ack_ids=[got[0].ack_id], ack_deadline_seconds=600
                )
                return
        raise TimeoutError("the copy on slot 0 never came")

    await asyncio.to_thread(leased_to_a_dead_stream)
    admit = Scripted()
    a = replica(f"a-{h.run_id}", admit)
    a_leases = cast(PubSubSlots, a.slots)
    runs = [asyncio.create_task(a.run())]
    try:
        await _until(lambda: a.held_slot == 0, timeout_s=15)
        await _until(lambda: a.counters.acked == 1, timeout_s=30)  # not 600 s
        (seen,) = admit.seen
        assert instance in seen.target.describe() + seen.target.provider_id
        assert a_leases.minded == {1}
        assert await slot_holder(h, channel.ids[1]) == ""  # minded, not taken

        # A replica taking slot 1 gets it; a stops reading it.
        c = replica(f"c-{h.run_id}", Scripted())
        runs.append(asyncio.create_task(c.run()))
        await _until(lambda: c.held_slot == 1, timeout_s=15)
        await _until(lambda: not a_leases.minded, timeout_s=15)
        assert a.held_slot == 0
    finally:
        for task in runs:
            task.cancel()
        await asyncio.gather(*runs, return_exceptions=True)


def _logged(d: DaemonProcess, message: str) -> list[dict[str, Any]]:
    out = []
    for line in d.log_path.read_text(errors="replace").splitlines():
        if f'"{message}"' in line:
            with contextlib.suppress(ValueError):
                out.append(json.loads(line))
    return out


def _admissions(d: DaemonProcess, notice_id: str) -> list[str]:
    return [
        str(e["admission"])
        for e in _logged(d, "notice admitted")
        if e.get("notice_id") == notice_id
    ]


async def test_a_slot_taken_gets_back_at_once_what_its_dead_holder_had_leased(
    h: Harness, channel: SlotChannel, api: ApiServer
) -> None:
    """A holder killed with a message leased (here: pulled by hand, its deadline pushed to
    600 s, never settled) would strand it for that long. The next holder of the slot seeks
    the subscription back (``pubsub.rewind_s``): the leased message is admitted now, and one
    the dead holder had acked is not seen again."""
    raw = channel.inner.subscriber
    path = raw.subscription_path(channel.project, channel.ids[0])

    def dead_holder() -> str:
        # One settled (acked) and one leased for 600 s and never settled.
        for i in range(2):
            entry = inject.gce_log_entry(
                project="reclaimd-local", zone="us-central1-a", instance=f"vm{i}-{h.run_id}"
            )
            channel.inner.publish(entry)
            got: list[Any] = []
            for _ in range(20):
                got = list(raw.pull(subscription=path, max_messages=1, timeout=5).received_messages)
                if got:
                    break
            (m,) = got
            if i == 0:
                raw.acknowledge(subscription=path, ack_ids=[m.ack_id])
            else:
                raw.modify_ack_deadline(
                    subscription=path, ack_ids=[m.ack_id], ack_deadline_seconds=600
                )
        return f"vm1-{h.run_id}"

    leased = await asyncio.to_thread(dead_holder)
    admit = Scripted()
    leases = PubSubSlots(
        api,
        NAMESPACE,
        f"n-{h.run_id}",
        subscriptions=channel.ids[:1],
        lease_s=6.0,
        limiter=RateLimiter(),
    )
    source = SlottedPubSubSource(channel.settings, leases, admit=admit, windows=Windows())
    run = asyncio.create_task(source.run())
    try:
        await _until(lambda: source.counters.acked == 1, timeout_s=30)  # not 600 s
        # A marker sent after the seek: an acked message redelivered by it would come first.
        marker = f"vm-marker-{h.run_id}"
        entry = inject.gce_log_entry(
            project="reclaimd-local", zone="us-central1-a", instance=marker
        )
        await asyncio.to_thread(channel.inner.publish, entry)
        await _until(lambda: source.counters.acked == 2, timeout_s=30)
        seen, last = admit.seen
        assert leased in seen.target.describe() + seen.target.provider_id
        assert marker in last.target.describe() + last.target.provider_id
        assert source.counters.transport_errors == 0
    finally:
        run.cancel()
        await asyncio.gather(run, return_exceptions=True)


async def test_a_replica_killed_holding_its_copy_strands_nothing_and_its_slot_goes_to_a_successor(
    h: Harness, channel: SlotChannel
) -> None:
    """Two ``reclaimd run`` on two slots. reclaimd-a is stopped (SIGSTOP: its stream stays
    open, what the emulator pushed to it sits there) when the preemption is published, then
    SIGKILLed: reclaimd-b's own copy is claimed and run to the end. A successor with a new
    name takes a's slot as soon as the peer probe finds a dead, not when its Lease expires."""
    node = h.gce_node_spec(0)
    await h.add_nodes([node])
    config: dict[str, Any] = {
        "sqs": {"enabled": False},
        "lease_namespace": NAMESPACE,
        "pubsub": {
            "enabled": True,
            "project": channel.project,
            "subscription": channel.name,
            "slots": SLOTS,
        },
    }
    a = await h.start_daemon("reclaimd-a", **config)
    await _until(lambda: bool(_logged(a, "pubsub slot taken")))
    b = await h.start_daemon("reclaimd-b", **config)
    await _until(lambda: bool(_logged(b, "pubsub slot taken")))
    assert [e["slot"] for e in _logged(a, "pubsub slot taken")] == [0]
    assert [e["slot"] for e in _logged(b, "pubsub slot taken")] == [1]
    # a minded slot 1 if b was slow to start: it has left it to b before it stops.
    await _until(
        lambda: (
            len(_logged(a, "pubsub free slot minded"))
            == len(_logged(a, "pubsub free slot left to its holder"))
        )
    )

    a.pause()
    notice = await h.send_gce_preemption(channel.inner, node)
    await _until(lambda: _admissions(b, notice.id) == ["claimed"], timeout_s=15)
    await a.crash()  # stopped until the end: it dies holding whatever it was sent

    # a's pod is replaced by one of another name: a's Lease is still fresh, its probe port
    # refuses, so the successor takes slot 0 as soon as it knows, not when the Lease expires.
    successor = await h.start_daemon("reclaimd-c", **config)
    claim = await h.wait_phase(node.name, "done")
    assert claim["notice_id"] == notice.id
    assert claim["holder"] == h.holder("reclaimd-b")
    assert _admissions(a, notice.id) == []  # a never admitted its copy

    await _until(lambda: bool(_logged(successor, "pubsub slot taken")), timeout_s=30)
    (taken,) = _logged(successor, "pubsub slot taken")
    assert (taken["slot"], taken["why"]) == (0, "dead")
    assert taken["previous_holder"] == h.holder("reclaimd-a")
    assert await slot_holder(h, channel.ids[0]) == h.holder("reclaimd-c")

    # SIGTERM: the successor releases its slot (and says so) on the way out.
    await successor.stop()
    assert [e["slot"] for e in _logged(successor, "pubsub slot released")] == [0]
    assert await slot_holder(h, channel.ids[0]) == ""
