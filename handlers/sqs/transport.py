"""EventBridge -> SQS transport (boto3).

Long-polls batches of up to 10 and handles a batch's messages concurrently (bounded). A receive
loop polls again as soon as it has handed a batch on, not after the batch is admitted: in a
storm ingest is then bound by SQS, not by the claim writes' latency, and at most
``concurrency`` messages are received and not yet settled. A message
is deleted only after every notice in it is admitted (claimed, or known as a duplicate); a parse
error or a non-notice is deleted and counted, since redelivery cannot fix it; anything transient
leaves the message in the queue and shortens its visibility so it comes back within seconds,
not after the full timeout: a spot notice has two minutes.

Visibility is the lease: short (10 s by default) and extended every third of it, one batch
request per received batch, while a message is unsettled, so a slow claim does not hand it to
a peer replica, and a replica that dies holding one hands it over in at most that long. A
stopping replica (the source cancelled: SIGTERM) sets every unsettled message's visibility to
0, so a peer receives it at once; best effort, bounded by ``RELEASE_TIMEOUT_S``. That covers
a long poll still in flight: boto3 cannot be interrupted, and what that poll returns after the
stop is handed back by its own thread. ``_held`` is the one registry of unsettled messages;
whoever takes a message out of it settles it (delete, retry, release).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, TypeVar

from reclaimd import logs
from reclaimd.backoff import Backoff
from reclaimd.handlers.base import Parser
from reclaimd.handlers.entry import Entry
from reclaimd.handlers.sqs.parser import parse
from reclaimd.handlers.sqs.settings import SqsSettings
from reclaimd.handlers.transport import Admit, Counters, Supplies, deliver
from reclaimd.model import Windows

log = logging.getLogger(__name__)
T = TypeVar("T")

RETRY_VISIBILITY_S = 2  # how soon a message we could not claim comes back
MAX_BACKOFF_S = 30.0
RELEASE_TIMEOUT_S = 2.0  # a stopping source waits this long for its visibility-0 requests
BATCH_MAX = 10  # entries in one ChangeMessageVisibilityBatch


class SqsSource:
    def __init__(
        self,
        client: Any,
        settings: SqsSettings,
        *,
        admit: Admit,
        windows: Windows,
        parser: Parser = parse,
    ) -> None:
        self.client, self.settings, self.admit, self.windows = client, settings, admit, windows
        self.parser = parser
        self.counters = Counters()
        # boto3 blocks; a pool of our own keeps long polls from starving other to_thread users.
        self._pool = ThreadPoolExecutor(
            max_workers=settings.receivers + min(settings.concurrency, 32),
            thread_name_prefix="sqs",
        )
        self._limit = asyncio.Semaphore(settings.concurrency)
        self._unsettled = 0  # messages received and not yet deleted or left for redelivery
        self._room = asyncio.Condition()
        # Unsettled messages by receipt handle; a receive thread adds, the loop takes.
        self._held: dict[str, dict[str, Any]] = {}
        self._closing = False  # stopping: a receive that returns now hands its messages back
        self._lock = threading.Lock()

    async def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, partial(fn, *args, **kwargs))

    async def run(self) -> None:
        """``receivers`` long-poll loops; a storm's ingest is not one round trip at a time."""
        try:
            async with asyncio.TaskGroup() as tg:
                for i in range(self.settings.receivers):
                    tg.create_task(self._receive_loop(tg), name=f"sqs-receive-{i}")
        finally:
            await self.release_held()
            self._pool.shutdown(wait=False, cancel_futures=True)

    async def _receive_loop(self, batches: asyncio.TaskGroup) -> None:
        backoff = Backoff(1.0, MAX_BACKOFF_S)
        while True:
            try:
                await self._wait_for_room()
                messages = await self._receive()
                self.counters.heard()
                if messages:
                    self._unsettled += len(messages)
                    batches.create_task(self._settle(messages), name="sqs-settle")
                backoff.reset()
            except asyncio.CancelledError:
                raise
            except Exception as e:
                self.counters.transport_errors += 1
                self.counters.failed(f"{type(e).__name__}: {e}")
                logs.event(log, "sqs poll failed", logging.WARNING, error=str(e)[:200])
                await backoff.sleep()

    async def poll_once(self) -> int:
        """One receive, its messages settled (admitted, then deleted) before it returns."""
        messages = await self._receive()
        self._unsettled += len(messages)
        await self._settle(messages)
        return len(messages)

    async def _wait_for_room(self) -> None:
        """Receive no more than can be admitted at once: a message waiting for a slot would
        be kept from a peer replica that could claim it now."""
        limit = max(self.settings.concurrency - self.settings.batch_size, 0)
        async with self._room:
            await self._room.wait_for(lambda: self._unsettled <= limit)

    async def _receive(self) -> list[dict[str, Any]]:
        messages: list[dict[str, Any]] = await self._call(self._receive_and_hold)
        return messages

    def _receive_and_hold(self) -> list[dict[str, Any]]:
        """On a pool thread: one receive, its messages held before the loop sees them.

        Held here, not on the loop, so a receive whose awaiting task was cancelled still
        leaves its messages where the stop finds them; one that returns after the stop hands
        them back itself."""
        reply = self.client.receive_message(
            QueueUrl=self.settings.queue_url,
            MaxNumberOfMessages=self.settings.batch_size,
            WaitTimeSeconds=self.settings.wait_time_s,
            VisibilityTimeout=self.settings.visibility_timeout_s,
            MessageSystemAttributeNames=["ApproximateReceiveCount", "SentTimestamp"],
        )
        messages: list[dict[str, Any]] = reply.get("Messages", [])
        with self._lock:
            closing = self._closing
            if not closing:
                self._held.update((m["ReceiptHandle"], m) for m in messages)
        if closing and messages:
            self._set_visibility_now(messages, 0)
            self.counters.released += len(messages)
            return []
        return messages

    def _take(self, messages: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
        """Take ``messages`` out of ``_held``: those still there, for the caller to settle."""
        with self._lock:
            return [m for m in messages if self._held.pop(m["ReceiptHandle"], None) is not None]

    def _still_held(self, messages: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
        with self._lock:
            return [m for m in messages if m["ReceiptHandle"] in self._held]

    async def release_held(self) -> int:
        """Stopping: every unsettled message visible again now (best effort, bounded), and
        from now on each one a late receive returns. How many were handed back."""
        with self._lock:
            self._closing = True
            held = list(self._held.values())
            self._held.clear()
        if not held:
            return 0
        batches = [held[i : i + BATCH_MAX] for i in range(0, len(held), BATCH_MAX)]
        requests = [self._call(self._set_visibility_now, b, 0) for b in batches]
        try:
            async with asyncio.timeout(RELEASE_TIMEOUT_S):
                await asyncio.gather(*requests, return_exceptions=True)
        except TimeoutError:
            self.counters.transport_errors += 1  # what did not go comes back after its timeout
        self.counters.released += len(held)
        logs.event(log, "sqs released unsettled messages", released=len(held))
        return len(held)

    def _set_visibility_now(self, messages: list[dict[str, Any]], seconds: int) -> None:
        """On a pool thread: one ChangeMessageVisibilityBatch (at most 10); never raises."""
        entries = [
            {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"], "VisibilityTimeout": seconds}
            for i, m in enumerate(messages)
        ]
        try:
            reply = self.client.change_message_visibility_batch(
                QueueUrl=self.settings.queue_url, Entries=entries
            )
        except Exception as e:
            self.counters.transport_errors += 1
            logs.event(log, "sqs visibility change failed", logging.WARNING, error=str(e)[:200])
            return
        for f in reply.get("Failed") or []:
            # A receipt that no longer holds (deleted, or received by a peer): nothing to do.
            logs.event(
                log, "sqs visibility change refused", logging.DEBUG, code=str(f.get("Code", ""))
            )

    async def _settle(self, messages: list[dict[str, Any]]) -> None:
        """Admit a batch's messages, then delete the admitted ones in one request."""
        heartbeat = asyncio.create_task(self._keep_invisible(messages), name="sqs-heartbeat")
        try:
            settled = await asyncio.gather(
                *(self._bounded(m) for m in messages), return_exceptions=True
            )
            for outcome in settled:
                if isinstance(outcome, BaseException):
                    # No longer extended: it comes back when its visibility ends.
                    self.counters.transport_errors += 1
                    logs.event(
                        log, "sqs message failed", logging.WARNING, error=str(outcome)[:200]
                    )
            admitted = [m for m, ok in zip(messages, settled, strict=True) if ok is True]
            self._take(m for m, ok in zip(messages, settled, strict=True) if ok is not True)
            # One DeleteMessageBatch for the batch received together: a storm's deletes are a
            # tenth of the requests (SQS bills them, and a slow endpoint serves them).
            await self._delete(self._take(admitted))
        finally:
            heartbeat.cancel()
            self._unsettled -= len(messages)
            async with self._room:
                self._room.notify_all()

    async def _bounded(self, message: dict[str, Any]) -> bool:
        async with self._limit:
            return await self.handle(message)

    async def handle(self, message: dict[str, Any]) -> bool:
        """True when the message is to be deleted (every notice in it admitted)."""
        delivered = await deliver(
            self.parser,
            message.get("Body", "").encode(),
            admit=self.admit,
            windows=self.windows,
            counters=self.counters,
            what="sqs message",
            message_id=message.get("MessageId", ""),
        )
        if delivered.settled:  # a parse error or a non-notice too: redelivery cannot fix it
            return True
        if not self._take([message]) and self._closing:
            return False  # the stop handed it back already
        self.counters.left_for_redelivery += 1
        with contextlib.suppress(Exception):
            await self._call(
                self.client.change_message_visibility,
                QueueUrl=self.settings.queue_url,
                ReceiptHandle=message["ReceiptHandle"],
                VisibilityTimeout=RETRY_VISIBILITY_S,
            )
        return False

    async def _delete(self, messages: list[dict[str, Any]]) -> int:
        """Delete ``messages`` (at most 10: one receive), one request; how many went."""
        if not messages:
            return 0
        entries = [
            {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)
        ]
        try:
            reply = await self._call(
                self.client.delete_message_batch, QueueUrl=self.settings.queue_url, Entries=entries
            )
        except Exception as e:
            # The claims are stored; a redelivery is admitted as a duplicate and deleted then.
            self.counters.transport_errors += 1
            logs.event(log, "sqs delete failed", logging.WARNING, error=str(e)[:200])
            return 0
        failed = reply.get("Failed") or []
        for f in failed:
            self.counters.transport_errors += 1
            logs.event(
                log, "sqs delete failed", logging.WARNING, error=str(f.get("Code", ""))[:200]
            )
        deleted = len(messages) - len(failed)
        self.counters.acked += deleted
        return deleted

    async def _keep_invisible(self, messages: list[dict[str, Any]]) -> None:
        """The batch's heartbeat: every third of the visibility, its unsettled messages get a
        full visibility again, so one late or failed extension still leaves time for the next."""
        period = max(self.settings.visibility_timeout_s / 3, 1)
        while True:
            await asyncio.sleep(period)
            held = self._still_held(messages)
            if not held:
                return
            await self._call(self._set_visibility_now, held, self.settings.visibility_timeout_s)


# --- built by the registry (reclaimd.handlers.build), for an enabled source ----------------


def build(entry: Entry[SqsSettings], w: Supplies) -> SqsSource:
    import boto3
    from botocore.config import Config

    s = entry.section(w.settings)
    # One connection per receiver and per message being settled: botocore's default pool of
    # 10 makes every delete in a storm wait for a socket.
    pool = Config(max_pool_connections=s.receivers + s.concurrency)
    sqs = boto3.client("sqs", region_name=s.region, endpoint_url=s.endpoint_url, config=pool)
    return SqsSource(sqs, s, admit=w.admit, windows=w.windows, parser=entry.parse)
