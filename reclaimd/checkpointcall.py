"""One rank's checkpoint request, reclaimd's side: the POST, the status polls, the reply checked.

``signal_member`` asks one member (``checkpoint.signal_gang`` fans it out over a gang) and
returns its ``RankAck``, never raising for what the workload does: a refusal, a timeout or a
malformed reply is "not acked" with a one-line ``error``. What a workload replies is
untrusted: redirects are not followed, a status URL must stay on the checkpoint URL's origin,
replies are read up to ``MAX_REPLY_BYTES`` and every field is type-checked.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import aiohttp
from yarl import URL

from reclaimd import putbudget
from reclaimd.model import (
    Gang,
    Member,
    Notice,
    ParseError,
    RankAck,
    parse_time,
    rfc3339,
    utcnow,
)

# The fan-out's logger: a rank's "did not ack" line reads as it did before the split.
log = logging.getLogger("reclaimd.checkpoint")

MAX_REPLY_BYTES = 64 * 1024
_MAX_URI = 2048
# A timer this late woke from a pause (SIGSTOP, a frozen VM) or a starved loop: the replies
# that came in meanwhile get LATE_LOOK_S to be read before the rank counts as not acked.
LATE_TIMER_S = 0.5
LATE_LOOK_S = 0.2


def request_body(gang: Gang, notice: Notice, member: Member, deadline: datetime) -> dict[str, Any]:
    """The JSON a rank receives; ``deadline`` is when reclaimd stops waiting for this rank."""
    return {
        "notice_id": notice.id,
        "reason": notice.kind.value,
        "deadline": rfc3339(deadline),
        "notice_deadline": rfc3339(notice.deadline) if notice.deadline else None,
        "gang": str(gang.key),
        "rank": member.rank,
        "namespace": member.namespace,
        "pod": member.name,
    }


class _Refused(Exception):
    """A reply that is not an ack; the message is the one-line reason."""


@dataclass
class _Progress:
    saving: bool = False  # a 202 was seen: the rank is working on it
    last_error: str = ""
    polls: int = 0  # status polls answered
    answered_at: float | None = None  # loop time of the last answer (the POST's or a poll's)

    def describe(self, end: float) -> str:
        """What a post-mortem needs of a rank still saving at the end: a rank that answered
        "saving" until the end, or one whose answers stopped coming (a busy rank, a lost
        connection)."""
        since = "" if self.answered_at is None else f", the last {end - self.answered_at:.1f}s"
        return f"{self.polls} poll(s) answered{since} before the end"


async def signal_member(
    member: Member,
    gang: Gang,
    notice: Notice,
    *,
    session: aiohttp.ClientSession,
    budget_end: float,
    budget_deadline: datetime,
    traceparent: str,
    poll_interval_s: float,
    put_budgets: putbudget.TenantPutBudgets | None = None,
    tenant: str = "",
) -> RankAck:
    loop = asyncio.get_running_loop()
    start = loop.time()
    end = budget_end
    deadline = budget_deadline
    if member.checkpoint_timeout_s > 0 and start + member.checkpoint_timeout_s < budget_end:
        end = start + member.checkpoint_timeout_s
        deadline = utcnow() + timedelta(seconds=member.checkpoint_timeout_s)

    def miss(error: str) -> RankAck:
        ack = RankAck(
            member=member, acked=False, error=_one_line(error), latency_s=loop.time() - start
        )
        log.info(
            "rank did not ack",
            extra={
                "fields": {
                    "notice_id": notice.id,
                    "gang": str(gang.key),
                    "pod": f"{member.namespace}/{member.name}",
                    "error": ack.error,
                }
            },
        )
        return ack

    if end <= start:
        return miss("budget spent before the request could be sent")
    headers = {"traceparent": traceparent} if traceparent else {}
    body = request_body(gang, notice, member, deadline)
    key = putbudget.rank_key(notice, member)

    def poll_headers() -> Mapping[str, str]:
        if put_budgets is None:
            return headers
        return {**headers, putbudget.HEADER: put_budgets.refresh(tenant, key).header_value()}

    if put_budgets is not None:
        body[putbudget.REQUEST_FIELD] = put_budgets.grant(tenant, key, deadline=end).to_json()
    progress = _Progress()
    try:
        saved = await _until(
            end,
            _exchange(
                session,
                url=member.checkpoint_url,
                body=body,
                headers=headers,
                poll_headers=poll_headers,
                poll_interval_s=poll_interval_s,
                progress=progress,
                end=end,
            ),
        )
    except TimeoutError:
        waited = f"{end - start:.1f}s"
        if progress.saving:
            last = f"; last poll: {progress.last_error}" if progress.last_error else ""
            return miss(f"still saving after {waited} ({progress.describe(end)}){last}")
        return miss(f"no reply within {waited}")
    except _Refused as e:
        return miss(str(e))
    except (aiohttp.ClientError, OSError, ValueError) as e:
        return miss(_describe(e))
    finally:
        if put_budgets is not None:
            put_budgets.release(tenant, key)
    return RankAck(
        member=member,
        acked=True,
        durable=saved.durable,
        checkpoint_time=saved.checkpoint_time,
        step=saved.step,
        uri=saved.uri,
        latency_s=loop.time() - start,
    )


async def _until(end: float, exchange: Awaitable[_Saved]) -> _Saved:
    """``exchange`` by loop time ``end``, else ``TimeoutError``.

    A timer that fires late (the process was paused or starved past ``end``) first lets the
    replies that arrived meanwhile be read: the kernel took them in time, and the loop wakes
    the timer before the socket's reader. Without this look, a rank that answered in time
    reads as no ack and its gang is charged from an older checkpoint."""
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(exchange)
    try:
        done, _ = await asyncio.wait({task}, timeout=max(0.0, end - loop.time()))
        if not done and loop.time() - end > LATE_TIMER_S:
            done, _ = await asyncio.wait({task}, timeout=LATE_LOOK_S)
        if done:
            return task.result()
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    raise TimeoutError


@dataclass(frozen=True)
class _Saved:
    checkpoint_time: datetime
    step: int | None
    uri: str
    durable: bool


async def _exchange(
    session: aiohttp.ClientSession,
    *,
    url: str,
    body: Mapping[str, Any],
    headers: Mapping[str, str],
    poll_headers: Callable[[], Mapping[str, str]],
    poll_interval_s: float,
    progress: _Progress,
    end: float,
) -> _Saved:
    """One rank's request, then its status polls until a ``200``; no poll is sent at or
    after loop time ``end`` (a late look reads what came in, it asks nothing new)."""
    loop = asyncio.get_running_loop()
    status, reply, location = await _call(session, "POST", URL(url), body, headers)
    if status == 200:
        return _parse_saved(reply)
    if status != 202:
        raise _Refused(f"checkpoint request answered HTTP {status}{_detail(reply)}")
    poll = _status_url(URL(url), location, reply)
    progress.saving = True
    progress.answered_at = asyncio.get_running_loop().time()
    while True:
        await asyncio.sleep(poll_interval_s)
        if loop.time() >= end:
            raise TimeoutError  # the budget is over: an answer now would be a late one
        try:
            # Every poll carries the rank's current share (it moves as ranks come and go).
            if poll is None:
                status, reply, _ = await _call(session, "POST", URL(url), body, poll_headers())
            else:
                status, reply, _ = await _call(session, "GET", poll, None, poll_headers())
        except aiohttp.ClientError as e:
            # A busy trainer may drop a poll; the budget, not one failure, decides.
            progress.last_error = _describe(e)
            continue
        progress.polls += 1
        progress.answered_at = asyncio.get_running_loop().time()
        if status == 200:
            return _parse_saved(reply)
        if status != 202:
            raise _Refused(f"status poll answered HTTP {status}{_detail(reply)}")


async def _call(
    session: aiohttp.ClientSession,
    method: str,
    url: URL,
    body: Mapping[str, Any] | None,
    headers: Mapping[str, str],
) -> tuple[int, bytes, str | None]:
    async with session.request(
        method, url, json=body, headers=headers, allow_redirects=False
    ) as resp:
        if resp.content_length is not None and resp.content_length > MAX_REPLY_BYTES:
            raise _Refused(f"reply larger than {MAX_REPLY_BYTES} bytes")
        data = bytearray()
        async for chunk in resp.content.iter_chunked(8192):
            data += chunk
            if len(data) > MAX_REPLY_BYTES:
                raise _Refused(f"reply larger than {MAX_REPLY_BYTES} bytes")
        return resp.status, bytes(data), resp.headers.get("Location")


def _json_object(reply: bytes) -> dict[str, Any] | None:
    try:
        doc = json.loads(reply)
    except (ValueError, UnicodeDecodeError):
        return None
    return doc if isinstance(doc, dict) else None


def _parse_saved(reply: bytes) -> _Saved:
    doc = _json_object(reply)
    if doc is None:
        raise _Refused("malformed reply: not a JSON object")
    raw_time = doc.get("checkpoint_time")
    if not isinstance(raw_time, str):
        raise _Refused("malformed reply: checkpoint_time missing or not a string")
    try:
        checkpoint_time = parse_time(raw_time)
    except ParseError as e:
        raise _Refused(f"malformed reply: checkpoint_time: {e}") from None
    step = doc.get("step")
    if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 0):
        raise _Refused("malformed reply: step is not a non-negative integer")
    uri = doc.get("uri") or ""
    if not isinstance(uri, str) or len(uri) > _MAX_URI:
        raise _Refused("malformed reply: uri is not a string (of at most 2048 characters)")
    durable = doc.get("durable", False)
    if not isinstance(durable, bool):
        raise _Refused("malformed reply: durable is not true or false")
    return _Saved(checkpoint_time=checkpoint_time, step=step, uri=uri, durable=durable)


def _status_url(base: URL, location: str | None, reply: bytes) -> URL | None:
    ref = location
    if not ref:
        doc = _json_object(reply)
        found = doc.get("status_url") if doc is not None else None
        ref = found if isinstance(found, str) else None
    if not ref:
        return None
    try:
        target = base.join(URL(ref))
        same_origin = target.origin() == base.origin()
    except ValueError:
        raise _Refused(f"malformed status URL {ref[:80]!r}") from None
    if not same_origin:
        raise _Refused(f"status URL leaves the checkpoint URL's origin: {str(target)[:80]!r}")
    return target


def _detail(reply: bytes) -> str:
    doc = _json_object(reply)
    error = doc.get("error") if doc is not None else None
    return f": {error}" if isinstance(error, str) and error else ""


def _describe(e: BaseException) -> str:
    text = str(e)
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def _one_line(text: str, limit: int = 240) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."
