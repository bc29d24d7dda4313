"""Pub/Sub transport: what it decides for a message, single flight per notice id, and the
thread-to-loop bridge (handlers/pubsub/transport.py). The streaming pull itself runs
against the emulator in tests/e2e/test_gke.py."""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import json
import threading
from typing import Any

import pytest
from pydantic import ValidationError
from shared_fixtures import FIXTURES as SHARED

from reclaimd.handlers.pubsub import transport as pubsub
from reclaimd.handlers.pubsub.settings import PubSubSettings
from reclaimd.handlers.pubsub.transport import PubSubSource, Verdict, verdict
from reclaimd.intake import Admission
from reclaimd.model import Notice, Windows, stable_id

FIXTURES = SHARED / "gcp"
SETTINGS = PubSubSettings(enabled=True, project="p", subscription="s", max_messages=5)
PREEMPT_OP = "systemevent-1758019346116-63ee7a3e1f2b0-5c0d6a1e-9b7f3c21"
SPOT_VM = "gke-train-cluster-spot-a100-5b909138-nr65"
EXPECTED_ID = stable_id(
    "gcp.compute.preempted", PREEMPT_OP, "example-project", "us-central1-a", SPOT_VM
)


def entry() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / "preempted-logentry.json").read_bytes())
    return data


def data(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj).encode()


class Admissions:
    """An ``admit`` that records notices and answers from a script (default: claimed)."""

    def __init__(self, *answers: Admission, gate: asyncio.Event | None = None) -> None:
        self.answers = list(answers)
        self.seen: list[Notice] = []
        self.gate = gate
        self.called = asyncio.Event()

    async def __call__(self, notice: Notice) -> Admission:
        self.seen.append(notice)
        self.called.set()
        if self.gate is not None:
            await self.gate.wait()
        return self.answers.pop(0) if self.answers else Admission.CLAIMED


def source(admit: Any) -> PubSubSource:
    return PubSubSource(SETTINGS, admit=admit, windows=Windows())


# --- the decision ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("admissions", "expected"),
    [
        ([Admission.CLAIMED], Verdict.ACK),
        ([Admission.DUPLICATE, Admission.SUPERSEDED], Verdict.ACK),
        ([Admission.UNKNOWN_TARGET], Verdict.ACK),
        ([Admission.RESUMED], Verdict.ACK),
        ([Admission.RETRY], Verdict.NACK),
        ([Admission.CLAIMED, Admission.RETRY], Verdict.NACK),
    ],
)
def test_ack_only_when_every_admission_allows_it(
    admissions: list[Admission], expected: Verdict
) -> None:
    assert verdict(admissions) is expected


async def test_a_preemption_entry_is_admitted_then_acked() -> None:
    admit = Admissions()
    src = source(admit)
    assert await src.handle(data(entry()), message_id="1") is Verdict.ACK
    assert [n.id for n in admit.seen] == [EXPECTED_ID]
    assert admit.seen[0].target.node_name == SPOT_VM
    assert (src.counters.received, src.counters.notices) == (1, 1)
    assert src.counters.by_admission == {"claimed": 1}


async def test_a_claim_that_was_not_stored_is_nacked() -> None:
    admit = Admissions(Admission.RETRY)
    src = source(admit)
    assert await src.handle(data(entry())) is Verdict.NACK
    assert src.counters.by_admission == {"retry": 1}


async def test_a_redelivery_is_the_same_notice() -> None:
    admit = Admissions(Admission.CLAIMED, Admission.DUPLICATE)
    src = source(admit)
    first, again = entry(), entry()
    again["receiveTimestamp"] = "2025-09-16T10:42:40Z"  # a second publish: new envelope
    assert await src.handle(data(first), message_id="1") is Verdict.ACK
    assert await src.handle(data(again), message_id="2") is Verdict.ACK
    assert [n.id for n in admit.seen] == [EXPECTED_ID, EXPECTED_ID]


async def test_unreadable_data_is_acked_and_counted_without_admission() -> None:
    admit = Admissions()
    src = source(admit)
    assert await src.handle(b"{not json", message_id="9") is Verdict.ACK
    assert src.counters.parse_errors == 1
    assert admit.seen == []


async def test_another_system_event_is_acked_as_ignored() -> None:
    admit = Admissions()
    src = source(admit)
    other = copy.deepcopy(entry())
    other["protoPayload"]["methodName"] = "compute.instances.hostError"
    assert await src.handle(data(other)) is Verdict.ACK
    assert src.counters.ignored == 1
    assert admit.seen == []


def test_settings_without_a_subscription_are_refused() -> None:
    settings = PubSubSettings(enabled=True, project="p")
    with pytest.raises(ValueError, match="subscription"):
        PubSubSource(settings, admit=Admissions(), windows=Windows())


# --- the bridge: a client thread hands the message to the loop -----------------------------


class Message:
    """The two calls the bridge makes on a client message, recorded across threads."""

    def __init__(self, payload: bytes, message_id: str = "1") -> None:
        self.data, self.message_id = payload, message_id
        self.settled: list[str] = []
        self.done = threading.Event()

    def ack(self) -> None:
        self.settled.append("ack")
        self.done.set()

    def nack(self) -> None:
        self.settled.append("nack")
        self.done.set()


async def _deliver_from_a_thread(src: PubSubSource, message: Message) -> None:
    src._loop = asyncio.get_running_loop()
    thread = threading.Thread(target=src._on_message, args=(message,))
    thread.start()
    await asyncio.to_thread(thread.join)
    assert await asyncio.to_thread(message.done.wait, 10)


async def test_callback_thread_hands_over_and_the_loop_acks() -> None:
    admit = Admissions()
    src = source(admit)
    message = Message(data(entry()))
    await _deliver_from_a_thread(src, message)
    assert message.settled == ["ack"]
    assert src.counters.acked == 1
    assert [n.id for n in admit.seen] == [EXPECTED_ID]


async def test_callback_thread_nack_on_retry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pubsub, "RETRY_PAUSE_S", 0.0)
    src = source(Admissions(Admission.RETRY))
    message = Message(data(entry()))
    await _deliver_from_a_thread(src, message)
    assert message.settled == ["nack"]
    assert src.counters.left_for_redelivery == 1


async def test_an_admission_that_raises_nacks_instead_of_holding_the_lease(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(pubsub, "RETRY_PAUSE_S", 0.0)

    async def broken(notice: Notice) -> Admission:
        raise RuntimeError("boom")

    src = source(broken)
    message = Message(data(entry()))
    await _deliver_from_a_thread(src, message)
    assert message.settled == ["nack"]
    assert src.counters.by_admission == {"retry": 1}  # the failure is a retry, not a crash
    assert src.counters.left_for_redelivery == 1


async def _hand_over_and_wait(src: PubSubSource, message: Any, admit: Admissions) -> None:
    """A client thread hands ``message`` over; returns once its claim is under way."""
    src._loop = asyncio.get_running_loop()
    await asyncio.to_thread(src._on_message, message)
    await asyncio.wait_for(admit.called.wait(), 10)


async def test_stopping_nacks_what_is_held_and_the_settlement_leaves_it() -> None:
    gate = asyncio.Event()  # the claim hangs until the source stops
    admissions = Admissions(gate=gate)
    src = source(admissions)
    message = Message(data(entry()))
    await _hand_over_and_wait(src, message, admissions)
    assert src._release_held() == 1
    assert message.settled == ["nack"]  # a peer can have it now, not after the lease
    gate.set()  # the claim ends after the stop: the message is not this source's to ack
    for _ in range(200):
        if not src._pending:
            break
        await asyncio.sleep(0.01)
    assert not src._pending
    assert message.settled == ["nack"]
    assert (src.counters.released, src.counters.acked) == (1, 0)


async def test_a_message_that_arrives_while_stopping_is_nacked_unadmitted() -> None:
    admissions = Admissions()
    src = source(admissions)
    src._loop = asyncio.get_running_loop()
    assert src._release_held() == 0
    late = Message(data(entry()))
    await asyncio.to_thread(src._on_message, late)
    assert late.settled == ["nack"]
    assert admissions.seen == [] and not src._pending


async def test_pending_settlements_are_cancelled_on_shutdown() -> None:
    gate = asyncio.Event()  # never set: the claim hangs
    admissions = Admissions(gate=gate)
    src = source(admissions)
    message = Message(data(entry()))
    await _hand_over_and_wait(src, message, admissions)
    assert len(src._pending) == 1
    src._cancel_pending()
    for _ in range(100):
        if not src._pending:
            break
        await asyncio.sleep(0.01)
    assert not src._pending
    assert message.settled == []  # a cancelled claim settles nothing: _release_held nacks


# --- the stream's lifecycle, with a stand-in for the client ---------------------------------


class StreamFuture(concurrent.futures.Future[Any]):
    def __init__(self, events: list[str]) -> None:
        super().__init__()
        self.events = events

    def cancel(self) -> bool:
        if not self.done():  # wrap_future's chain cancels it again once done: a no-op
            self.events.append("stream cancelled")
        return super().cancel()


class FakeSubscriber:
    """What ``_stream_once`` calls on a SubscriberClient, recorded in one list of events."""

    def __init__(self, events: list[str]) -> None:
        self.events = events
        self.subscribed = threading.Event()
        self.callback: Any = None
        self.flow: Any = None

    def subscribe(self, path: str, *, callback: Any, flow_control: Any) -> StreamFuture:
        self.callback, self.flow = callback, flow_control
        self.subscribed.set()
        return StreamFuture(self.events)

    def close(self) -> None:
        self.events.append("subscriber closed")


class LoggedMessage(Message):
    def __init__(self, payload: bytes, events: list[str]) -> None:
        super().__init__(payload)
        self.events = events

    def nack(self) -> None:
        self.events.append("nack")
        super().nack()


async def test_cancelled_run_nacks_what_it_holds_before_closing_the_stream() -> None:
    events: list[str] = []
    fake = FakeSubscriber(events)
    admissions = Admissions(gate=asyncio.Event())  # the claim never ends
    src = PubSubSource(
        SETTINGS, admit=admissions, windows=Windows(), subscriber_factory=lambda _: fake
    )
    run = asyncio.create_task(src.run())
    assert await asyncio.to_thread(fake.subscribed.wait, 10)
    held = LoggedMessage(data(entry()), events)
    await asyncio.to_thread(fake.callback, held)
    await asyncio.wait_for(admissions.called.wait(), 10)

    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    # The nack is queued while the stream is up: the client's shutdown flushes it.
    assert events == ["nack", "stream cancelled", "subscriber closed"]
    assert held.settled == ["nack"]
    assert (src.counters.released, src.counters.acked) == (1, 0)
    assert not src._pending


async def test_flow_control_pins_the_leases_to_the_setting() -> None:
    fake = FakeSubscriber([])
    src = PubSubSource(
        SETTINGS, admit=Admissions(), windows=Windows(), subscriber_factory=lambda _: fake
    )
    run = asyncio.create_task(src.run())
    try:
        assert await asyncio.to_thread(fake.subscribed.wait, 10)
    finally:
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run
    assert fake.flow.max_messages == SETTINGS.max_messages
    # both set: the stream ack deadline and every extension are 10 s, not the client's 60 s
    assert fake.flow.min_duration_per_lease_extension == 10
    assert fake.flow.max_duration_per_lease_extension == 10


@pytest.mark.parametrize("seconds", [9, 601])
def test_a_lease_outside_pubsubs_range_is_refused(seconds: int) -> None:
    with pytest.raises(ValidationError, match="lease_extension_s"):
        PubSubSettings(lease_extension_s=seconds)


def test_the_lease_defaults_to_pubsubs_floor() -> None:
    assert PubSubSettings().lease_extension_s == 10
    assert PubSubSettings(lease_extension_s=600).lease_extension_s == 600
