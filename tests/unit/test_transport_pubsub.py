"""Pub/Sub transport: what it decides for a message, single flight per notice id, and the
thread-to-loop bridge (reclaimd/transports/pubsub.py). The streaming pull itself runs
against the emulator in tests/e2e/test_gke.py."""

from __future__ import annotations

import asyncio
import copy
import json
import threading
from typing import Any

import pytest
from shared_fixtures import FIXTURES as SHARED

from reclaimd.config import PubSubSettings
from reclaimd.intake import Admission
from reclaimd.model import Notice, Windows, stable_id
from reclaimd.transports import pubsub
from reclaimd.transports.pubsub import PubSubSource, Verdict, verdict

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


async def test_pending_settlements_are_cancelled_on_shutdown() -> None:
    gate = asyncio.Event()  # never set: the claim hangs
    admissions = Admissions(gate=gate)
    src = source(admissions)
    message = Message(data(entry()))
    src._loop = asyncio.get_running_loop()
    await asyncio.to_thread(src._on_message, message)
    for _ in range(100):
        if src._pending and admissions.called.is_set():
            break
        await asyncio.sleep(0.01)
    assert len(src._pending) == 1
    src._cancel_pending()
    for _ in range(100):
        if not src._pending:
            break
        await asyncio.sleep(0.01)
    assert not src._pending
    assert message.settled == []  # neither acked nor nacked: the lease lapses, Pub/Sub redelivers
