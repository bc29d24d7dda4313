"""Cloud Logging sink -> Pub/Sub transport (google-cloud-pubsub streaming pull).

The client runs the stream and the user callback on its own threads; reclaimd's intake lives
on the asyncio loop. The bridge is one line: the callback hands each message to the loop with
``asyncio.run_coroutine_threadsafe`` and returns at once, so no client thread ever waits on a
claim. The message stays leased (the client extends its deadline) until the loop settles it,
and ``FlowControl(max_messages)`` bounds how many are leased at a time, so a zone-wide
preemption cannot pile up more work in memory than the daemon can claim.

Settling a message (``handle`` decides, the bridge applies it):

- every notice in it admitted (claimed, duplicate, superseded, dropped): ack;
- a parse error or a non-notice: ack and count, since redelivery cannot fix it;
- any admission that says retry (claim not stored): nack after a short pause, so the message
  comes back within a second or two (the window is 30 s) without a hot loop on a sick
  apiserver.

Dedupe: the parser derives the notice id from the LogEntry's ``operation.id``, which a
redelivery or a second publish of the same entry keeps; concurrent deliveries of one notice
share a single admission (the intake's single flight), later ones hit its memory.

Lifecycle: ``run()`` opens the stream and waits on its future. A stream that dies (a
non-retryable error: subscription deleted, permission denied) is reopened with a fresh client
after a backoff. Cancelling ``run()`` cancels the stream future, waits for the client's
threads to stop, closes the subscriber, and cancels settlements still in flight: their
messages are neither acked nor nacked, so their leases lapse and Pub/Sub redelivers them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
import time
from collections.abc import Sequence
from enum import StrEnum
from typing import Any

from reclaimd import logs
from reclaimd.backoff import Backoff
from reclaimd.config import PubSubSettings
from reclaimd.intake import Admission
from reclaimd.model import Windows
from reclaimd.transports import Admit, Counters, deliver

log = logging.getLogger(__name__)

RETRY_PAUSE_S = 1.0  # hold a message we could not claim this long before the nack
MAX_BACKOFF_S = 30.0
STABLE_STREAM_S = 60.0  # a stream that lived this long resets the backoff
SHUTDOWN_TIMEOUT_S = 10.0


class Verdict(StrEnum):
    ACK = "ack"
    NACK = "nack"


def verdict(admissions: Sequence[Admission]) -> Verdict:
    """Ack only when every notice of the message is admitted for good."""
    return Verdict.ACK if all(a.ack for a in admissions) else Verdict.NACK


class PubSubSource:
    def __init__(
        self,
        settings: PubSubSettings,
        *,
        admit: Admit,
        windows: Windows,
        parser: str = "gke",
        subscriber_factory: Any = None,
    ) -> None:
        if not settings.project or not settings.subscription:
            raise ValueError("pubsub: project and subscription are required")
        self.settings, self.windows, self.parser = settings, windows, parser
        self.admit = admit
        self.counters = Counters()
        self._factory = subscriber_factory or _default_subscriber
        # Settlements scheduled from client threads; the set is shared with those threads.
        self._pending: set[concurrent.futures.Future[Verdict]] = set()
        self._pending_lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def subscription_path(self) -> str:
        return f"projects/{self.settings.project}/subscriptions/{self.settings.subscription}"

    async def run(self) -> None:
        from google.cloud import pubsub_v1

        self._loop = asyncio.get_running_loop()
        flow = pubsub_v1.types.FlowControl(max_messages=self.settings.max_messages)
        backoff = Backoff(1.0, MAX_BACKOFF_S)
        try:
            while True:
                opened = time.monotonic()
                try:
                    await self._stream_once(flow)
                    reason = "stream ended"
                except asyncio.CancelledError:
                    raise
                except Exception as e:
                    reason = f"{type(e).__name__}: {e}"
                self.counters.transport_errors += 1
                if time.monotonic() - opened > STABLE_STREAM_S:
                    backoff.reset()
                delay = backoff.next_delay()
                logs.event(
                    log,
                    "pubsub stream closed; reopening",
                    logging.WARNING,
                    subscription=self.settings.subscription,
                    error=reason[:200],
                    backoff_s=round(delay, 2),
                )
                await asyncio.sleep(delay)
        finally:
            self._cancel_pending()

    async def _stream_once(self, flow: Any) -> None:
        subscriber = await asyncio.to_thread(self._factory, self.settings)
        future: concurrent.futures.Future[Any] | None = None
        try:
            future = subscriber.subscribe(
                self.subscription_path, callback=self._on_message, flow_control=flow
            )
            logs.event(
                log,
                "pubsub stream open",
                subscription=self.settings.subscription,
                max_messages=self.settings.max_messages,
            )
            await asyncio.wrap_future(future)
        finally:
            await _shutdown(subscriber, future)

    # --- the bridge: client thread -> event loop ---------------------------------------------

    def _on_message(self, message: Any) -> None:
        """The client's callback, on one of its threads: hand over and return."""
        loop = self._loop
        try:
            if loop is None:
                raise RuntimeError("no event loop yet")
            settled = asyncio.run_coroutine_threadsafe(self._settle(message), loop)
        except RuntimeError:
            # The loop is closing: give the message back rather than hold its lease.
            message.nack()
            return
        with self._pending_lock:
            self._pending.add(settled)
        settled.add_done_callback(self._forget)

    def _forget(self, settled: concurrent.futures.Future[Verdict]) -> None:
        with self._pending_lock:
            self._pending.discard(settled)

    def _cancel_pending(self) -> None:
        with self._pending_lock:
            pending = list(self._pending)
        for settled in pending:
            settled.cancel()

    async def _settle(self, message: Any) -> Verdict:
        try:
            outcome = await self.handle(bytes(message.data), message_id=str(message.message_id))
        except Exception as e:
            # Unsettled, the client would keep extending the lease for up to an hour.
            self.counters.transport_errors += 1
            logs.event(log, "pubsub message failed", logging.WARNING, error=str(e)[:200])
            outcome = Verdict.NACK
        if outcome is Verdict.ACK:
            message.ack()
            self.counters.acked += 1
        else:
            await asyncio.sleep(RETRY_PAUSE_S)
            message.nack()
            self.counters.left_for_redelivery += 1
        return outcome

    # --- the decision, free of the client ----------------------------------------------------

    async def handle(self, data: bytes, *, message_id: str = "") -> Verdict:
        """Parse one message's data, admit its notices, and say how to settle it."""
        delivered = await deliver(
            self.parser,
            data,
            admit=self.admit,
            windows=self.windows,
            counters=self.counters,
            what="pubsub message",
            message_id=message_id,
        )
        return verdict([a for _, a in delivered.admitted])


def _default_subscriber(settings: PubSubSettings) -> Any:
    """A subscriber client; ``PUBSUB_EMULATOR_HOST`` (read by the client) wins over all."""
    from google.cloud import pubsub_v1

    options = {"api_endpoint": settings.endpoint} if settings.endpoint else None
    return pubsub_v1.SubscriberClient(client_options=options)


async def _shutdown(subscriber: Any, future: concurrent.futures.Future[Any] | None) -> None:
    """Stop the stream, wait for the client's threads, close the channel: never raises.

    Runs while ``run()`` is being cancelled too, so the waits are shielded from that
    cancellation and bounded instead.
    """

    def stop() -> None:
        if future is not None:
            future.cancel()  # only triggers the shutdown; result() waits for it
            with contextlib.suppress(Exception):
                future.result(timeout=SHUTDOWN_TIMEOUT_S)
        with contextlib.suppress(Exception):
            subscriber.close()

    stopping = asyncio.ensure_future(asyncio.to_thread(stop))
    try:
        await asyncio.shield(stopping)
    except asyncio.CancelledError:
        # Cancelled again while stopping: finish the cleanup before giving in.
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.shield(stopping), SHUTDOWN_TIMEOUT_S + 2)
        raise
