"""EventBridge -> SQS transport (boto3).

Long-polls batches of up to 10 and handles a batch's messages concurrently (bounded). A receive
loop polls again as soon as it has handed a batch on, not after the batch is admitted: in a
storm ingest is then bound by SQS, not by the claim writes' latency, and at most
``concurrency`` messages are received and not yet settled. A message
is deleted only after every notice in it is admitted (claimed, or known as a duplicate); a parse
error or a non-notice is deleted and counted, since redelivery cannot fix it; anything transient
leaves the message in the queue and shortens its visibility so it comes back within seconds,
not after the full timeout: a spot notice has two minutes. While a message is in flight its
visibility is extended so a slow claim does not hand it to a peer replica.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, TypeVar

from reclaimd import logs
from reclaimd.backoff import Backoff
from reclaimd.config import SqsSettings
from reclaimd.model import Windows
from reclaimd.transports import Admit, Counters, deliver

log = logging.getLogger(__name__)
T = TypeVar("T")

RETRY_VISIBILITY_S = 2  # how soon a message we could not claim comes back
MAX_BACKOFF_S = 30.0


class SqsSource:
    def __init__(
        self,
        client: Any,
        settings: SqsSettings,
        *,
        admit: Admit,
        windows: Windows,
        parser: str = "ec2",
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

    async def _call(self, fn: Any, **kwargs: Any) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, partial(fn, **kwargs))

    async def run(self) -> None:
        """``receivers`` long-poll loops; a storm's ingest is not one round trip at a time."""
        try:
            async with asyncio.TaskGroup() as tg:
                for i in range(self.settings.receivers):
                    tg.create_task(self._receive_loop(tg), name=f"sqs-receive-{i}")
        finally:
            self._pool.shutdown(wait=False, cancel_futures=True)

    async def _receive_loop(self, batches: asyncio.TaskGroup) -> None:
        backoff = Backoff(1.0, MAX_BACKOFF_S)
        while True:
            try:
                await self._wait_for_room()
                messages = await self._receive()
                if messages:
                    self._unsettled += len(messages)
                    batches.create_task(self._settle(messages), name="sqs-settle")
                backoff.reset()
            except asyncio.CancelledError:
                raise
            except Exception as e:
                self.counters.transport_errors += 1
                logs.event(log, "sqs poll failed", logging.WARNING, error=str(e)[:200])
                await backoff.sleep()

    async def poll_once(self) -> int:
        """One receive, its messages settled (admitted, then deleted) before it returns."""
        messages = await self._receive()
        self._unsettled += len(messages)
        await self._settle(messages)
        return len(messages)

    async def _wait_for_room(self) -> None:
        """Receive no more than can be admitted at once: a message waiting here for a slot
        would not have its visibility extended, and a peer would get it."""
        limit = max(self.settings.concurrency - self.settings.batch_size, 0)
        async with self._room:
            await self._room.wait_for(lambda: self._unsettled <= limit)

    async def _receive(self) -> list[dict[str, Any]]:
        reply = await self._call(
            self.client.receive_message,
            QueueUrl=self.settings.queue_url,
            MaxNumberOfMessages=self.settings.batch_size,
            WaitTimeSeconds=self.settings.wait_time_s,
            VisibilityTimeout=self.settings.visibility_timeout_s,
            MessageSystemAttributeNames=["ApproximateReceiveCount", "SentTimestamp"],
        )
        messages: list[dict[str, Any]] = reply.get("Messages", [])
        return messages

    async def _settle(self, messages: list[dict[str, Any]]) -> None:
        """Admit a batch's messages, then delete the admitted ones in one request."""
        try:
            settled = await asyncio.gather(
                *(self._bounded(m) for m in messages), return_exceptions=True
            )
            for outcome in settled:
                if isinstance(outcome, BaseException):
                    # Left in the queue: it comes back when its visibility ends.
                    self.counters.transport_errors += 1
                    logs.event(
                        log, "sqs message failed", logging.WARNING, error=str(outcome)[:200]
                    )
            # One DeleteMessageBatch for the batch received together: a storm's deletes are a
            # tenth of the requests (SQS bills them, and a slow endpoint serves them).
            await self._delete([m for m, ok in zip(messages, settled, strict=True) if ok is True])
        finally:
            self._unsettled -= len(messages)
            async with self._room:
                self._room.notify_all()

    async def _bounded(self, message: dict[str, Any]) -> bool:
        async with self._limit:
            heartbeat = asyncio.create_task(self._keep_invisible(message["ReceiptHandle"]))
            try:
                return await self.handle(message)
            finally:
                heartbeat.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await heartbeat

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

    async def _keep_invisible(self, receipt: str) -> None:
        period = max(self.settings.visibility_timeout_s / 2, 1)
        while True:
            await asyncio.sleep(period)
            with contextlib.suppress(Exception):
                await self._call(
                    self.client.change_message_visibility,
                    QueueUrl=self.settings.queue_url,
                    ReceiptHandle=receipt,
                    VisibilityTimeout=self.settings.visibility_timeout_s,
                )
