"""The checkpoint-signal contract, the workload's side: what a trainer imports.

A trainer gives ``CheckpointServer`` one async callable, ``on_checkpoint(CheckpointRequest) ->
CheckpointResult``, and the server speaks the rest of the contract (docs/checkpoint-contract.md):

- ``POST {path}`` with reclaimd's JSON starts the save and waits for it up to ``sync_window_s``
  (1 s): ``200`` with the result when it finished, otherwise ``202`` with a ``Location`` (and
  ``status_url``) that ``GET`` answers ``202`` until the save ends, then ``200``. So a quick save
  costs one round trip and a long one never holds a request open past reclaimd's patience.
- One save per notice: a POST repeating a ``notice_id`` (a retry, a second reclaimd replica, a
  reclaimd poll) joins the save already running or gets its result; ``on_checkpoint`` is never
  called twice for one notice. A failed save answers ``500`` with a one-line error, and keeps
  answering so: idempotent, and a second attempt inside the same window would not fare better.
- ``requests`` records every accepted request (duplicates included), newest last: the e2e
  tests' fake trainers and the chaos drills' fake fleet read it.

``upload_checkpoint`` is the stash-then-upload pattern of ARCHITECTURE §4 as one call: the
trainer has stashed its state (host memory, local disk), then hands the bytes to any object with
``async put(key, body, *, deadline) -> uri`` (``reclaimd.objectstore``'s guarded PutObject fits);
the result is durable only if the upload finished before reclaimd stops waiting, and otherwise
points at the stash so the ack still arrives in time.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from types import TracebackType
from typing import Any, Protocol
from urllib.parse import quote

from aiohttp import web

from reclaimd import putbudget
from reclaimd.model import parse_time, rfc3339, utcnow
from reclaimd.putbudget import Share

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
            put_budget=putbudget.parse_field(doc),
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


SaveFn = Callable[[CheckpointRequest], Awaitable[CheckpointResult]]


class PutBudgetSink(Protocol):
    """Where the server hands reclaimd's PutObject share (``BoundPut`` of the guarded put)."""

    def set_put_budget(self, share: Share | None) -> None: ...


class CheckpointServer:
    """A small aiohttp server answering reclaimd's checkpoint requests with ``on_checkpoint``.

    ``port=0`` picks a free port; after ``start()``, ``url`` is the checkpoint URL to announce
    (with a wildcard ``host`` it names the loopback address; in a pod the annotation's
    ``{pod_ip}`` template does that job).

    ``put_budget`` receives this rank's share of its tenant's PutObject budget while a save
    runs: from the request's ``put_budget`` field (absent: ``None``, the uploader's own limit),
    then from the ``X-Reclaimd-Put-Budget`` header of every status poll, and ``None`` again
    once no save is running.
    """

    def __init__(
        self,
        on_checkpoint: SaveFn,
        *,
        host: str = "0.0.0.0",  # a pod is reached on its own IP
        port: int = 8080,
        path: str = "/checkpoint",
        sync_window_s: float = 1.0,
        keep_results: int = 256,
        keep_requests: int = 4096,
        put_budget: PutBudgetSink | None = None,
    ) -> None:
        if not path.startswith("/") or path.endswith("/"):
            raise ValueError(f"path must start and not end with '/': {path!r}")
        self._on_checkpoint = on_checkpoint
        self._host = host
        self._port = port
        self.path = path
        self.sync_window_s = sync_window_s
        self._keep_results = keep_results
        self._saves: dict[str, asyncio.Task[CheckpointResult]] = {}
        # When each notice's result was first answered (a 200 on the POST or a status poll):
        # what a caller could have learned, and when (drills judge acks by it).
        self.answered: dict[str, datetime] = {}
        self._save_count = 0
        self.requests: deque[CheckpointRequest] = deque(maxlen=keep_requests)
        self._runner: web.AppRunner | None = None
        self._sink = put_budget
        self.put_budget: Share | None = None  # the share in force, as last handed to the sink

    # --- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        if self._runner is not None:
            raise RuntimeError("checkpoint server already started")
        app = web.Application(client_max_size=MAX_REQUEST_BYTES)
        app.router.add_post(self.path, self._post)
        app.router.add_get(self.path + "/status/{notice_id}", self._status)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        try:
            await web.TCPSite(runner, self._host, self._port).start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        self._port = int(runner.addresses[0][1])

    async def stop(self) -> None:
        """Cancel saves still running (their requests are answered 503) and close the port."""
        running = [t for t in self._saves.values() if not t.done()]
        for task in running:
            task.cancel()
        if running:
            await asyncio.wait(running)
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    async def __aenter__(self) -> CheckpointServer:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    @property
    def port(self) -> int:
        return self._port

    @property
    def url(self) -> str:
        host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(self._host, self._host)
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self._port}{self.path}"

    @property
    def save_count(self) -> int:
        """How many times ``on_checkpoint`` was called: once per distinct notice."""
        return self._save_count

    def result_of(self, notice_id: str) -> CheckpointResult | None:
        """The finished, successful result for a notice, if there is one."""
        task = self._saves.get(notice_id)
        if task is None or not task.done() or task.cancelled() or task.exception() is not None:
            return None
        return task.result()

    # --- handlers ----------------------------------------------------------------------------

    async def _post(self, request: web.Request) -> web.Response:
        try:
            doc = json.loads(await request.read())
        except (ValueError, UnicodeDecodeError):
            return _error(400, "request body is not JSON")
        try:
            req = CheckpointRequest.from_json(
                doc, traceparent=request.headers.get("traceparent", "")
            )
            polled = putbudget.parse_header(request.headers.get(putbudget.HEADER))
        except ValueError as e:
            return _error(400, _one_line(str(e)))
        self.requests.append(req)
        share = polled if polled is not None else req.put_budget
        task = self._saves.get(req.notice_id)
        if task is None:
            self._hand(share)  # before the save starts, so its first put is paced already
            task = asyncio.create_task(self._run(req), name=f"checkpoint {req.notice_id}")
            task.add_done_callback(_report)
            task.add_done_callback(self._save_ended)
            self._saves[req.notice_id] = task
            self._save_count += 1
            self._forget_old()
        elif share is not None and not task.done():
            self._hand(share)
        # asyncio.wait leaves the save running when the window closes: the poll picks it up.
        await asyncio.wait({task}, timeout=self.sync_window_s)
        return self._answer(req.notice_id, task)

    async def _run(self, req: CheckpointRequest) -> CheckpointResult:
        return await self._on_checkpoint(req)

    async def _status(self, request: web.Request) -> web.Response:
        notice_id = request.match_info["notice_id"]
        task = self._saves.get(notice_id)
        if task is None:
            return _error(404, "no checkpoint requested for this notice")
        if not task.done():
            self._take_polled_share(request)
        return self._answer(notice_id, task)

    def _take_polled_share(self, request: web.Request) -> None:
        try:
            share = putbudget.parse_header(request.headers.get(putbudget.HEADER))
        except ValueError as e:
            # A save under way is not failed over a bad header: it keeps the share it has.
            log.warning("ignored a malformed put budget", extra={"fields": {"error": str(e)}})
            return
        if share is not None:
            self._hand(share)

    def _hand(self, share: Share | None) -> None:
        self.put_budget = share
        if self._sink is not None:
            self._sink.set_put_budget(share)

    def _save_ended(self, task: asyncio.Task[CheckpointResult]) -> None:
        # Back to the uploader's own limit once no save is left to pace.
        if all(t.done() for t in self._saves.values()):
            self._hand(None)

    def _answer(self, notice_id: str, task: asyncio.Task[CheckpointResult]) -> web.Response:
        if not task.done():
            where = f"{self.path}/status/{quote(notice_id, safe='')}"
            return web.json_response(
                {"status": "saving", "status_url": where}, status=202, headers={"Location": where}
            )
        if task.cancelled():
            return _error(503, "checkpoint save was cancelled")
        failure = task.exception()
        if failure is not None:
            return _error(
                500, _one_line(f"checkpoint save failed: {type(failure).__name__}: {failure}")
            )
        result = task.result()
        if not isinstance(result, CheckpointResult):
            return _error(
                500, f"on_checkpoint returned {type(result).__name__}, not CheckpointResult"
            )
        self.answered.setdefault(notice_id, utcnow())
        return web.json_response(result.to_json())

    def _forget_old(self) -> None:
        # Notices are few, but a trainer lives for weeks: keep the newest finished results.
        finished = [k for k, t in self._saves.items() if t.done()]
        for key in finished[: max(0, len(self._saves) - self._keep_results)]:
            del self._saves[key]
            self.answered.pop(key, None)


def _report(task: asyncio.Task[CheckpointResult]) -> None:
    # Retrieving the exception here also keeps asyncio from warning that nobody did.
    if not task.cancelled() and (failure := task.exception()) is not None:
        log.warning(
            "checkpoint save failed",
            extra={"fields": {"task": task.get_name(), "error": _one_line(str(failure))}},
        )


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


def _one_line(text: str, limit: int = 240) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


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
            return CheckpointResult(
                checkpoint_time=taken, step=step, uri=uri or last, durable=True
            )
        # any failure of the upload means "not durable"; the stash stands
        error = _one_line(f"{type(first).__name__}: {first}") if first else "upload cancelled"
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
