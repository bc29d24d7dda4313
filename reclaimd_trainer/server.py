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
``async put(key, body, *, deadline) -> uri`` (``reclaimd_trainer.s3``'s guarded PutObject fits);
the result is durable only if the upload finished before reclaimd stops waiting, and otherwise
points at the stash so the ack still arrives in time.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from datetime import datetime
from types import TracebackType
from typing import Protocol
from urllib.parse import quote

from aiohttp import web

from reclaimd_trainer import budget
from reclaimd_trainer.auth import FROM_ENVIRONMENT, Auth, TokenVerifier, Unauthorized, resolve
from reclaimd_trainer.budget import Share

# The contract's data and the upload step live with the trainer SDK (no aiohttp there); they
# are re-exported here, where asyncio trainers and the drills have always found them.
from reclaimd_trainer.contract import (
    MAX_REQUEST_BYTES,
    CheckpointRequest,
    CheckpointResult,
    ObjectPut,
    served_url,
    upload_checkpoint,
    upload_parts,
)
from reclaimd_trainer.contract import one_line as _one_line
from reclaimd_trainer.times import utcnow

__all__ = [
    "MAX_REQUEST_BYTES",
    "CheckpointRequest",
    "CheckpointResult",
    "CheckpointServer",
    "ObjectPut",
    "PutBudgetSink",
    "SaveFn",
    "upload_checkpoint",
    "upload_parts",
]

log = logging.getLogger(__name__)


SaveFn = Callable[[CheckpointRequest], Awaitable[CheckpointResult]]
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


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

    ``auth``: who may ask (``reclaimd_trainer.auth``; by default what the pod's
    ``reclaimd.io/checkpoint-auth`` annotation says). With a verifier, every request must carry
    reclaimd's ServiceAccount token; any other is answered ``401`` and starts nothing
    (``refused`` counts them).
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
        auth: Auth = FROM_ENVIRONMENT,
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
        self._auth = auth
        self.verifier: TokenVerifier | None = None  # set at start from ``auth``
        self.refused = 0  # requests answered 401

    # --- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        if self._runner is not None:
            raise RuntimeError("checkpoint server already started")
        # The environment and the first key fetch may block: not on the loop.
        self.verifier = await asyncio.to_thread(resolve, self._auth)
        app = web.Application(client_max_size=MAX_REQUEST_BYTES, middlewares=[self._authorize])
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
        return served_url(self._host, self._port, self.path)

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

    @web.middleware
    async def _authorize(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Every request, before its handler (and before its body is read): reclaimd's?"""
        if self.verifier is not None:
            try:
                # a key fetch (unknown key id) blocks: in a thread
                await asyncio.to_thread(self.verifier.verify, request.headers.get("Authorization"))
            except Unauthorized as e:
                self.refused += 1
                log.warning("refused a checkpoint request", extra={"fields": {"error": str(e)}})
                return web.json_response(
                    {"error": f"unauthorized: {e}"},
                    status=401,
                    headers={"WWW-Authenticate": 'Bearer realm="reclaimd-checkpoint"'},
                )
        return await handler(request)

    async def _post(self, request: web.Request) -> web.Response:
        try:
            doc = json.loads(await request.read())
        except (ValueError, UnicodeDecodeError):
            return _error(400, "request body is not JSON")
        try:
            req = CheckpointRequest.from_json(
                doc, traceparent=request.headers.get("traceparent", "")
            )
            polled = budget.parse_header(request.headers.get(budget.HEADER))
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
            share = budget.parse_header(request.headers.get(budget.HEADER))
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
