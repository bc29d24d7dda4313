"""SQS transport (handlers/sqs/transport.py) with a stand-in client: the heartbeat that keeps an
unsettled message invisible, the hand-back of what a stopping source holds, and the settings.
Against moto: tests/e2e/test_sqs_transport.py."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any

import pytest
from pydantic import ValidationError
from shared_fixtures import FIXTURES

from reclaimd.handlers.sqs import transport as sqs
from reclaimd.handlers.sqs.settings import SqsSettings
from reclaimd.handlers.sqs.transport import SqsSource
from reclaimd.intake import Admission
from reclaimd.model import Notice, Windows

SPOT = (FIXTURES / "aws" / "eventbridge-spot-interruption-warning.json").read_text()


class FakeSqs:
    """The calls SqsSource makes on a boto3 client; thread-safe, every call recorded.

    ``receive_message`` hands out ``batches`` one per call, then waits ``WaitTimeSeconds``
    (capped) and returns nothing, as a long poll does; ``hold_receive`` makes the next
    receive wait until it is set."""

    def __init__(self, *batches: list[dict[str, Any]]) -> None:
        self.batches = list(batches)
        self.lock = threading.Lock()
        self.visibility: list[tuple[str, int]] = []  # (receipt, seconds) in call order
        self.deleted: list[str] = []
        self.hold_receive: threading.Event | None = None
        self.receiving = threading.Event()

    def receive_message(self, **kw: Any) -> dict[str, Any]:
        self.receiving.set()
        if self.hold_receive is not None:
            self.hold_receive.wait(10)
        with self.lock:
            batch = self.batches.pop(0) if self.batches else None
        if batch is None:
            time.sleep(min(kw["WaitTimeSeconds"], 0.05))
            return {}
        return {"Messages": batch}

    def change_message_visibility(self, **kw: Any) -> None:
        with self.lock:
            self.visibility.append((kw["ReceiptHandle"], kw["VisibilityTimeout"]))

    def change_message_visibility_batch(self, **kw: Any) -> dict[str, Any]:
        with self.lock:
            self.visibility += [(e["ReceiptHandle"], e["VisibilityTimeout"]) for e in kw["Entries"]]
        return {"Successful": [{"Id": e["Id"]} for e in kw["Entries"]]}

    def delete_message_batch(self, **kw: Any) -> dict[str, Any]:
        with self.lock:
            self.deleted += [e["ReceiptHandle"] for e in kw["Entries"]]
        return {"Successful": [{"Id": e["Id"]} for e in kw["Entries"]]}

    def seconds_for(self, receipt: str) -> list[int]:
        with self.lock:
            return [s for r, s in self.visibility if r == receipt]


def message(n: int) -> dict[str, Any]:
    body = json.loads(SPOT)
    body["id"] = f"event-{n}"
    body["detail"]["instance-id"] = f"i-{n:017x}"
    return {"MessageId": f"m-{n}", "ReceiptHandle": f"r-{n}", "Body": json.dumps(body)}


class Gated:
    """An ``admit`` that records notices and waits on ``gate``; then answers ``answer``."""

    def __init__(self, answer: Admission = Admission.CLAIMED) -> None:
        self.answer = answer
        self.gate = asyncio.Event()
        self.called = asyncio.Event()
        self.seen: list[Notice] = []

    async def __call__(self, notice: Notice) -> Admission:
        self.seen.append(notice)
        self.called.set()
        await self.gate.wait()
        return self.answer


def settings(**kw: Any) -> SqsSettings:
    return SqsSettings(enabled=True, queue_url="q", wait_time_s=1, receivers=1, **kw)


async def until(cond: Any, timeout_s: float = 10) -> None:
    for _ in range(int(timeout_s / 0.02)):
        if cond():
            return
        await asyncio.sleep(0.02)
    raise TimeoutError("condition not reached")


async def stop(run: asyncio.Task[None]) -> None:
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run


async def test_an_unsettled_message_is_kept_invisible_then_deleted() -> None:
    client = FakeSqs([message(1)])
    admit = Gated()
    src = SqsSource(client, settings(visibility_timeout_s=5), admit=admit, windows=Windows())
    run = asyncio.create_task(src.run())
    try:
        await asyncio.wait_for(admit.called.wait(), 10)
        # a third of 5 s: the heartbeat gives it a full visibility again before it lapses
        await until(lambda: client.seconds_for("r-1") == [5], timeout_s=4)
        admit.gate.set()
        await until(lambda: client.deleted == ["r-1"])
        await asyncio.sleep(2.0)  # a heartbeat's period: none comes after the delete
        assert client.seconds_for("r-1") == [5]
    finally:
        await stop(run)
    assert src.counters.released == 0  # nothing was held at the stop


async def test_a_stopping_source_hands_back_what_it_holds() -> None:
    client = FakeSqs([message(1), message(2)])
    admit = Gated()  # never opened: both claims hang
    src = SqsSource(client, settings(), admit=admit, windows=Windows())
    run = asyncio.create_task(src.run())
    await until(lambda: len(admit.seen) == 2)
    await stop(run)
    assert client.seconds_for("r-1") == [0] and client.seconds_for("r-2") == [0]
    assert client.deleted == []
    assert (src.counters.released, src.counters.acked) == (2, 0)


async def test_a_receive_that_returns_after_the_stop_hands_back_its_messages() -> None:
    client = FakeSqs([message(3)])
    client.hold_receive = threading.Event()
    admit = Gated()
    src = SqsSource(client, settings(), admit=admit, windows=Windows())
    run = asyncio.create_task(src.run())
    assert await asyncio.to_thread(client.receiving.wait, 10)
    await stop(run)  # the long poll is still out: boto3 cannot be interrupted
    client.hold_receive.set()
    await until(lambda: client.seconds_for("r-3") == [0])
    assert admit.seen == []
    assert src.counters.released == 1


async def test_a_claim_to_retry_comes_back_soon_and_is_not_handed_back_again() -> None:
    client = FakeSqs([message(4)])
    admit = Gated(Admission.RETRY)
    admit.gate.set()
    src = SqsSource(client, settings(), admit=admit, windows=Windows())
    run = asyncio.create_task(src.run())
    await until(lambda: client.seconds_for("r-4") == [sqs.RETRY_VISIBILITY_S])
    await stop(run)
    assert client.seconds_for("r-4") == [sqs.RETRY_VISIBILITY_S]
    assert client.deleted == []
    assert (src.counters.left_for_redelivery, src.counters.released) == (1, 0)


async def test_the_hand_back_is_bounded_when_sqs_does_not_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sqs, "RELEASE_TIMEOUT_S", 0.2)
    client = FakeSqs([message(5)])
    answer = threading.Event()

    def hangs(**kw: Any) -> dict[str, Any]:
        answer.wait(10)
        return {}

    client.change_message_visibility_batch = hangs  # type: ignore[method-assign]
    admit = Gated()
    src = SqsSource(client, settings(), admit=admit, windows=Windows())
    run = asyncio.create_task(src.run())
    await asyncio.wait_for(admit.called.wait(), 10)
    started = time.monotonic()
    try:
        await stop(run)
        assert time.monotonic() - started < 2.0
        assert src.counters.transport_errors == 1
    finally:
        answer.set()


def test_visibility_defaults_to_10_s_and_refuses_less_than_5() -> None:
    assert SqsSettings().visibility_timeout_s == 10
    with pytest.raises(ValidationError, match="visibility_timeout_s"):
        SqsSettings(visibility_timeout_s=4)
