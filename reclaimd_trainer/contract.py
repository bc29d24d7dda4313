"""The checkpoint-signal contract's workload side, without the controller.

What every trainer integration shares (docs/checkpoint-contract.md): the request reclaimd
sends (``CheckpointRequest``), the answer (``CheckpointResult``), and the stash-then-upload step
(``upload_parts``): the trainer has stashed its state (host memory, local disk), then hands the
bytes to any object with ``async put(key, body, *, deadline) -> uri`` (``reclaimd_trainer.s3``'s
guarded PutObject fits); the result is durable only if every part was stored before reclaimd
stops waiting, and otherwise points at the stash so the ack still arrives in time.

Standard library only (and the SDK's ``budget`` and ``times``, which are too): the async server
(``reclaimd_trainer.server``, aiohttp) and the synchronous one (``reclaimd_trainer.Signal``)
both speak it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol

from reclaimd_trainer import budget
from reclaimd_trainer.budget import Share
from reclaimd_trainer.times import parse_time, rfc3339, utcnow

log = logging.getLogger(__name__)

MAX_REQUEST_BYTES = 64 * 1024
_MAX_FIELD = 512


@dataclass(frozen=True)
class CheckpointRequest:
    """What reclaimd asked for; ``deadline`` is when it stops waiting for the answer."""

    notice_id: str
    deadline: datetime
    reason: str = ""
    gang: str = ""
    rank: int | None = None
    namespace: str = ""
    pod: str = ""
    notice_deadline: datetime | None = None  # when the capacity goes away; None: not known
    traceparent: str = ""
    received_at: datetime = field(default_factory=utcnow)
    put_budget: Share | None = None  # this rank's share of the tenant's PutObject budget

    @classmethod
    def from_json(cls, doc: Any, *, traceparent: str = "") -> CheckpointRequest:
        """Validate reclaimd's request body. Raises ``ValueError`` with one line."""
        if not isinstance(doc, dict):
            raise ValueError("request is not a JSON object")
        notice_id = _text(doc, "notice_id")
        if not notice_id:
            raise ValueError("notice_id is missing")
        raw_deadline = doc.get("deadline")
        if not isinstance(raw_deadline, str):
            raise ValueError("deadline is missing or not a string")
        raw_notice_deadline = doc.get("notice_deadline")
        if raw_notice_deadline is not None and not isinstance(raw_notice_deadline, str):
            raise ValueError("notice_deadline is not a string")
        rank = doc.get("rank")
        if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int) or rank < 0):
            raise ValueError("rank is not a non-negative integer")
        return cls(
            notice_id=notice_id,
            deadline=parse_time(raw_deadline),
            reason=_text(doc, "reason"),
            gang=_text(doc, "gang"),
            rank=rank,
            namespace=_text(doc, "namespace"),
            pod=_text(doc, "pod"),
            notice_deadline=parse_time(raw_notice_deadline) if raw_notice_deadline else None,
            traceparent=traceparent[:_MAX_FIELD],
            put_budget=budget.parse_field(doc),
        )


def _text(doc: Mapping[str, Any], key: str) -> str:
    value = doc.get(key)
    if value is None:
        return ""
    if not isinstance(value, str) or len(value) > _MAX_FIELD:
        raise ValueError(f"{key} is not a string of at most {_MAX_FIELD} characters")
    return value


@dataclass(frozen=True)
class CheckpointResult:
    """What a trainer saved: ``durable`` only if the checkpoint is off the doomed machine."""

    checkpoint_time: datetime  # when the saved state was taken, not when the save ended
    step: int | None = None
    uri: str = ""
    durable: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "checkpoint_time": rfc3339(self.checkpoint_time),
            "step": self.step,
            "uri": self.uri,
            "durable": self.durable,
        }


def one_line(text: str, limit: int = 240) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def served_url(host: str, port: int, path: str) -> str:
    """The URL a server bound to ``host:port`` answers at (a wildcard bind: loopback)."""
    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}{path}"


# --- stash, then upload ---------------------------------------------------------------------


class ObjectPut(Protocol):
    """Anything that can put one object before a deadline and say where it went."""

    async def put(self, key: str, body: bytes, *, deadline: datetime) -> str: ...


async def upload_checkpoint(
    request: CheckpointRequest,
    body: bytes,
    *,
    store: ObjectPut,
    key: str,
    step: int | None = None,
    checkpoint_time: datetime | None = None,
    stash_uri: str = "",
    reply_margin_s: float = 0.5,
) -> CheckpointResult:
    """Upload a stashed checkpoint; durable only if ``store.put`` finished in time.

    The upload must end ``reply_margin_s`` before ``request.deadline`` so the answer still
    reaches reclaimd: an upload that cannot finish by then is abandoned and the result names
    ``stash_uri`` with ``durable=False``, which is an ack that does not reset the waste clock.
    """
    return await upload_parts(
        request,
        [(key, body)],
        store=store,
        step=step,
        checkpoint_time=checkpoint_time,
        stash_uri=stash_uri,
        reply_margin_s=reply_margin_s,
    )


async def upload_parts(
    request: CheckpointRequest,
    parts: Sequence[tuple[str, bytes]],
    *,
    store: ObjectPut,
    uri: str = "",
    step: int | None = None,
    checkpoint_time: datetime | None = None,
    stash_uri: str = "",
    reply_margin_s: float = 0.5,
    concurrency: int = 4,
) -> CheckpointResult:
    """``upload_checkpoint`` for a checkpoint in several objects (shards, parts): durable only
    if every part was stored in time. ``uri`` names the whole (default: the last part's).

    Parts go up at most ``concurrency`` at a time; pacing is the store's business (the guarded
    put paces at reclaimd's share of the tenant's budget, see ``CheckpointServer``).
    """
    if not parts:
        raise ValueError("no parts to upload")
    if concurrency < 1:
        raise ValueError("concurrency must be at least 1")
    taken = checkpoint_time or utcnow()
    deadline = request.deadline - timedelta(seconds=reply_margin_s)
    loop = asyncio.get_running_loop()
    end = loop.time() + (deadline - utcnow()).total_seconds()
    limit = asyncio.Semaphore(concurrency)

    async def one(key: str, body: bytes) -> str:
        async with limit:
            return await store.put(key, body, deadline=deadline)

    tasks = [asyncio.create_task(one(key, body)) for key, body in parts]
    error = ""
    try:
        async with asyncio.timeout_at(end):
            await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    except TimeoutError:
        error = "upload did not finish before the deadline"
    finally:
        # One failed part dooms the whole: the others stop rather than spend the budget.
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    if not error:
        failures = [t.exception() for t in tasks if not t.cancelled()]
        first = next((f for f in failures if f is not None), None)
        if first is None and not any(t.cancelled() for t in tasks):
            last = tasks[-1].result()
            return CheckpointResult(checkpoint_time=taken, step=step, uri=uri or last, durable=True)
        # any failure of the upload means "not durable"; the stash stands
        error = one_line(f"{type(first).__name__}: {first}") if first else "upload cancelled"
    log.warning(
        "checkpoint upload failed, acking the stash",
        extra={
            "fields": {
                "notice_id": request.notice_id,
                "key": parts[0][0],
                "parts": len(parts),
                "error": error,
            }
        },
    )
    return CheckpointResult(checkpoint_time=taken, step=step, uri=stash_uri, durable=False)
