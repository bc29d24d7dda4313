"""Cloud Logging sink -> Pub/Sub transport (google-cloud-pubsub streaming pull).

The client runs the stream and the user callback on its own threads; reclaimd's intake lives
on the asyncio loop. The bridge is one line: the callback hands each message to the loop with
``asyncio.run_coroutine_threadsafe`` and returns at once, so no client thread ever waits on a
claim. The message stays leased (the client extends its deadline) until the loop settles it,
and ``FlowControl(max_messages)`` bounds how many are leased at a time, so a zone-wide
preemption cannot pile up more work in memory than the daemon can claim.

Leases are 10 s (``lease_extension_s``, Pub/Sub's floor), not the client's 60 s: FlowControl's
min and max per-extension durations pin both the stream ack deadline and every lease extension
to it. A replica that dies without a word (SIGKILL, a lost node) then holds its messages for
about 10 s before a peer gets them, a third of the GCE window rather than twice it; the cost is
a modack per leased message every few seconds, while the client's leaser keeps them.

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
after a backoff. Cancelling ``run()`` (the daemon's SIGTERM) first nacks every message handed
to the loop and not yet acked or nacked, so a peer replica gets it at once instead of after
its lease, and nacks any that arrive from then on; then it cancels the stream future (the
client nacks what it had not handed over yet and flushes the nacks), waits for the client's
threads to stop, closes the subscriber, and cancels the settlements still in flight. Each
message is settled exactly once: whoever takes it out of ``_held`` acks or nacks it.

Slots (``pubsub.slots > 1``, ``SlottedPubSubSource``): each replica consumes a subscription of
its own on the same topic, ``<subscription>-<slot>``, while it holds that slot's Lease; every
replica gets every LogEntry and the claim decides who acts, so a killed replica's leased
messages matter to nobody (see ``reclaimd.cluster.slots``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any, Protocol

from reclaimd import logs
from reclaimd.backoff import Backoff
from reclaimd.handlers.base import Parser
from reclaimd.handlers.entry import Entry
from reclaimd.handlers.pubsub.parser import parse
from reclaimd.handlers.pubsub.settings import PubSubSettings
from reclaimd.handlers.transport import Admit, Counters, Supplies, deliver
from reclaimd.intake import Admission
from reclaimd.model import Windows

log = logging.getLogger(__name__)

RETRY_PAUSE_S = 1.0  # hold a message we could not claim this long before the nack
MAX_BACKOFF_S = 30.0
STABLE_STREAM_S = 60.0  # a stream that lived this long resets the backoff
SHUTDOWN_TIMEOUT_S = 10.0
SEEK_TIMEOUT_S = 5.0  # a slot's rewind; past it the stream opens anyway
# A stream that has not failed this long hears (a missing subscription or a refused
# permission ends it within a second): the source's last receive, while the topic is quiet.
HEARD_EVERY_S = 5.0


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
        parser: Parser = parse,
        subscriber_factory: Any = None,
        counters: Counters | None = None,
    ) -> None:
        if not settings.project or not settings.subscription:
            raise ValueError("pubsub: project and subscription are required")
        self.settings, self.windows, self.parser = settings, windows, parser
        self.admit = admit
        self.counters = counters if counters is not None else Counters()
        self._factory = subscriber_factory or _default_subscriber
        # Settlements scheduled from client threads; shared with those threads, as are
        # ``_held`` and ``_closing``, all under ``_lock``.
        self._pending: set[concurrent.futures.Future[Verdict]] = set()
        self._lock = threading.Lock()
        # Messages handed to the loop and neither acked nor nacked, by id(); a client thread
        # adds, the loop takes. ``_closing``: the source is stopping, nack on arrival.
        self._held: dict[int, Any] = {}
        self._closing = False
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def subscription_path(self) -> str:
        return f"projects/{self.settings.project}/subscriptions/{self.settings.subscription}"

    async def run(self) -> None:
        from google.cloud import pubsub_v1

        self._loop = asyncio.get_running_loop()
        lease = self.settings.lease_extension_s
        flow = pubsub_v1.types.FlowControl(
            max_messages=self.settings.max_messages,
            # The max sets the stream deadline and caps each extension (else the p99 of ack
            # latency); the min keeps it from becoming 60 s under exactly-once delivery.
            min_duration_per_lease_extension=lease,
            max_duration_per_lease_extension=lease,
        )
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
                self.counters.failed(reason)
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
            self._release_held()  # held from a stream that died: nacked there, if it can be
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
                lease_s=self.settings.lease_extension_s,
            )
            # Waited on, not awaited: a cancelled wrap_future would cancel the stream future
            # itself, and the client's shutdown would race the nacks below.
            streaming = asyncio.wrap_future(future)
            while not (await asyncio.wait({streaming}, timeout=HEARD_EVERY_S))[0]:
                self.counters.heard()  # open, and not failed: the stream hears
            streaming.result()
        except asyncio.CancelledError:
            # Before the stream closes: the client's shutdown then flushes these nacks with
            # its own, and the server can redeliver at once.
            self._release_held()
            raise
        finally:
            await _shutdown(subscriber, future)

    # --- the bridge: client thread -> event loop ---------------------------------------------

    def _on_message(self, message: Any) -> None:
        """The client's callback, on one of its threads: hand over and return."""
        loop = self._loop
        with self._lock:
            closing = self._closing
            if not closing:
                self._held[id(message)] = message
        try:
            if closing or loop is None:
                raise RuntimeError("stopping" if closing else "no event loop yet")
            settled = asyncio.run_coroutine_threadsafe(self._settle(message), loop)
        except RuntimeError:
            # Stopping, or the loop is closing: give the message back rather than hold it.
            if closing or self._take(message):
                message.nack()
            return
        with self._lock:
            self._pending.add(settled)
        settled.add_done_callback(self._forget)

    def _forget(self, settled: concurrent.futures.Future[Verdict]) -> None:
        with self._lock:
            self._pending.discard(settled)

    def _take(self, message: Any) -> bool:
        """Take ``message`` out of ``_held``: True for the one caller that is to settle it."""
        with self._lock:
            return self._held.pop(id(message), None) is not None

    def _release_held(self) -> int:
        """Stopping: nack every held message, and from now on each one as it arrives."""
        with self._lock:
            self._closing = True
            held = list(self._held.values())
            self._held.clear()
        for message in held:
            with contextlib.suppress(Exception):  # best effort: else its lease lapses
                message.nack()
        self.counters.released += len(held)
        if held:
            logs.event(
                log,
                "pubsub released unsettled messages",
                subscription=self.settings.subscription,
                released=len(held),
            )
        return len(held)

    def _cancel_pending(self) -> None:
        with self._lock:
            pending = list(self._pending)
        for settled in pending:
            settled.cancel()

    async def _settle(self, message: Any) -> Verdict:
        self.counters.heard()
        try:
            outcome = await self.handle(bytes(message.data), message_id=str(message.message_id))
        except Exception as e:
            # Unsettled, the client would keep extending the lease for up to an hour.
            self.counters.transport_errors += 1
            logs.event(log, "pubsub message failed", logging.WARNING, error=str(e)[:200])
            outcome = Verdict.NACK
        # Not ours to settle once taken: a stopping source nacked it already.
        if outcome is Verdict.ACK:
            if self._take(message):
                message.ack()
                self.counters.acked += 1
        else:
            await asyncio.sleep(RETRY_PAUSE_S)
            if self._take(message):
                message.nack()
                self.counters.left_for_redelivery += 1
        return outcome

    async def rewind(self) -> None:
        """Seek the subscription back ``rewind_s``: a dead holder's leases end now.

        Called on a slot's subscription (``SlottedPubSubSource``), which is this replica's
        alone: whatever is outstanding on it was leased to a holder that is gone; a seek
        marks it unacked and the stream opened next gets it at once. Acked messages stay
        acked (no retained acks). A failed seek costs only time: those messages come back
        when their lease runs out.
        """
        if self.settings.rewind_s <= 0:
            return
        since = datetime.now(UTC) - timedelta(seconds=self.settings.rewind_s)

        def seek() -> None:
            subscriber = self._factory(self.settings)
            try:
                subscriber.seek(request={"subscription": self.subscription_path, "time": since})
            finally:
                with contextlib.suppress(Exception):
                    subscriber.close()

        subscription, rewind_s = self.settings.subscription, self.settings.rewind_s
        try:
            await asyncio.wait_for(asyncio.to_thread(seek), SEEK_TIMEOUT_S)
            logs.event(log, "pubsub slot rewound", subscription=subscription, rewind_s=rewind_s)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            self.counters.transport_errors += 1
            logs.event(
                log,
                "pubsub slot rewind failed",
                logging.WARNING,
                subscription=subscription,
                error=f"{type(e).__name__}: {e}"[:200],
            )

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


class Slots(Protocol):
    """Which subscription this replica may consume, and when (``reclaimd.cluster.slots``)."""

    @property
    def held(self) -> int | None: ...

    async def run(self, consume: Callable[[int], Coroutine[Any, Any, None]]) -> None: ...


class SlottedPubSubSource:
    """``pubsub.slots > 1``: a subscription per replica slot, consumed only while this
    replica holds the slot (``slots.run``). Each slot taken gets a fresh ``PubSubSource`` on
    ``<subscription>-<slot>``, and so does each free slot minded meanwhile (``slots.mind``);
    all of them count into one ``counters``. Cancelled (SIGTERM), the sources nack what they
    hold before the slot is released."""

    slot_help = "the Pub/Sub slot this replica holds and consumes (-1: none, waiting for one)"

    def __init__(
        self,
        settings: PubSubSettings,
        slots: Slots,
        *,
        admit: Admit,
        windows: Windows,
        parser: Parser = parse,
        subscriber_factory: Any = None,
    ) -> None:
        if not settings.project or not settings.subscription:
            raise ValueError("pubsub: project and subscription are required")
        self.settings, self.slots = settings, slots
        self._admit, self._windows, self._parser = admit, windows, parser
        self._factory = subscriber_factory
        self.counters = Counters()
        self.current: PubSubSource | None = None  # the held slot's source

    @property
    def held_slot(self) -> int | None:
        return self.slots.held

    async def run(self) -> None:
        await self.slots.run(self._consume)

    async def _consume(self, slot: int) -> None:
        one = self.settings.model_copy(
            update={"subscription": self.settings.slot_subscription(slot), "slots": 1}
        )
        source = PubSubSource(
            one,
            admit=self._admit,
            windows=self._windows,
            parser=self._parser,
            subscriber_factory=self._factory,
            counters=self.counters,
        )
        if slot == self.slots.held:  # a guest does not seek: peers may stream that slot too
            self.current = source
            await source.rewind()
        await source.run()


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


# --- built by the registry (reclaimd.handlers.build), for an enabled source ----------------


def build(entry: Entry[PubSubSettings], w: Supplies) -> PubSubSource | SlottedPubSubSource:
    # The client library (and grpc) loaded now, while the daemon builds: first imported in
    # run(), its import (~0.3 s, ~50 MB) would stall the loop the cache and Leases run on.
    import google.cloud.pubsub_v1  # noqa: F401

    s = entry.section(w.settings)
    if s.slots == 1:
        return PubSubSource(s, admit=w.admit, windows=w.windows, parser=entry.parse)
    from reclaimd.cluster.slots import PubSubSlots

    if w.settings.dry_run:
        # A slot is a Lease, a write: and a dry run must not take a live replica's slot.
        raise ValueError("pubsub.slots > 1 is not for a dry run: give it a subscription of its own")
    if w.api is None or w.limiter is None:
        raise ValueError("pubsub.slots > 1 needs the Kubernetes API for the slot Leases")
    slots = PubSubSlots(
        w.api,
        w.settings.lease_namespace,
        w.settings.holder,
        subscriptions=[s.slot_subscription(i) for i in range(s.slots)],
        lease_s=w.settings.claim_stale_s,
        limiter=w.limiter,
        dead=w.dead,
    )
    return SlottedPubSubSource(s, slots, admit=w.admit, windows=w.windows, parser=entry.parse)
