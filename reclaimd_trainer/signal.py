"""The synchronous facade: a background thread serves the contract, the loop checks a flag.

A plain PyTorch loop, a Lightning or a Hugging Face ``Trainer`` has no event loop to run
``reclaimd_trainer.server.CheckpointServer`` in. ``Signal`` serves the same contract
(docs/checkpoint-contract.md) from a standard-library HTTP server on a daemon thread, and the
training thread meets it only at step boundaries::

    signal = Signal(port=8080).start()
    for step in range(start, steps):
        train_step()
        if signal.requested:                  # a request is waiting for its answer
            result = save(step)               # at a step boundary: never mid-collective
            signal.ack(result)                # every waiting request gets this answer

What the thread does on its own:

- ``POST`` waits up to ``sync_window_s`` (1 s) for the ack: ``200`` with the result if it came,
  otherwise ``202`` with a ``Location`` that ``GET`` answers ``202`` until the ack, then ``200``.
- One save per notice: a repeated ``notice_id`` joins the request already waiting, or gets the
  result it was answered with. ``fail(error)`` answers ``500`` with one line, and keeps doing so.
- ``ack(result, covers=ids)`` also answers notices this rank has not been asked for yet: the
  other ranks of the gang saved the same step for them (``reclaimd_trainer.torch`` agrees on
  the step), so the request, when it arrives, is answered at once rather than saved again.
- ``GET <path>/incarnation`` says when this process started serving and when the loop first
  reached a step boundary (its first read of ``requested``): reclaimd ends a restarted gang's
  restart overhead at its ranks' first steps after ``restore()`` (docs/ledger.md).
- Who may ask: with a verifier (``auth``: by default what the pod's
  ``reclaimd.io/checkpoint-auth`` annotation says, ``reclaimd_trainer.auth``), every request
  (POST, status, ``/incarnation``) must carry reclaimd's ServiceAccount token; any other gets
  ``401`` and is not seen by the loop (``refused`` counts them).
- The PutObject share (``put_budget`` in the request, ``X-Reclaimd-Put-Budget`` on polls) is
  kept in ``put_budget`` while a request waits, ``None`` once none does; ``on_share`` is called
  (on the server thread) with every change.

The server never installs a signal handler: SIGTERM stays the framework's (Lightning's, HF's,
torchrun's) business.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any
from urllib.parse import quote, unquote

from reclaimd_trainer import budget
from reclaimd_trainer.auth import FROM_ENVIRONMENT, Auth, TokenVerifier, Unauthorized, resolve
from reclaimd_trainer.budget import Share
from reclaimd_trainer.contract import (
    MAX_REQUEST_BYTES,
    CheckpointRequest,
    CheckpointResult,
    one_line,
    served_url,
)
from reclaimd_trainer.times import rfc3339, utcnow

log = logging.getLogger(__name__)


@dataclass
class _Notice:
    first: CheckpointRequest | None  # None: answered before this rank was asked (covers)
    done: threading.Event = field(default_factory=threading.Event)
    result: CheckpointResult | None = None
    error: str = ""


class Signal:
    """reclaimd's checkpoint requests for a synchronous training loop (see the module doc).

    ``port=0`` picks a free port; ``url`` is the URL to announce once started (a wildcard
    ``host`` names the loopback address; in a pod the annotation's ``{pod_ip}`` does that).
    """

    def __init__(
        self,
        *,
        host: str = "0.0.0.0",  # a pod is reached on its own IP
        port: int = 8080,
        path: str = "/checkpoint",
        sync_window_s: float = 1.0,
        keep_results: int = 256,
        keep_requests: int = 4096,
        on_share: Callable[[Share | None], None] | None = None,
        auth: Auth = FROM_ENVIRONMENT,
    ) -> None:
        if not path.startswith("/") or path.endswith("/"):
            raise ValueError(f"path must start and not end with '/': {path!r}")
        self.path = path
        self.sync_window_s = sync_window_s
        self._host = host
        self._port = port
        self._keep_results = keep_results
        self._on_share = on_share
        self._auth = auth
        self.verifier: TokenVerifier | None = None  # set at start from ``auth``
        self.refused = 0  # requests answered 401
        self._lock = threading.Condition()
        self._notices: OrderedDict[str, _Notice] = OrderedDict()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.requests: deque[CheckpointRequest] = deque(maxlen=keep_requests)
        self.answered: dict[str, datetime] = {}  # when each notice's result was first sent
        self.put_budget: Share | None = None
        self.ack_count = 0
        self.started_at: datetime | None = None
        # the loop's first step boundary: training (again, after a restore)
        self.first_step_at: datetime | None = None

    # --- lifecycle ---------------------------------------------------------------------------

    def start(self) -> Signal:
        if self._server is not None:
            raise RuntimeError("signal already started")
        self.verifier = resolve(self._auth)
        server = ThreadingHTTPServer((self._host, self._port), _handler(self))
        server.daemon_threads = True
        self._server = server
        self._port = int(server.server_address[1])
        self._thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.2},
            daemon=True,
            name="reclaimd-signal",
        )
        self._thread.start()
        self.started_at = utcnow()
        return self

    def stop(self) -> None:
        """Close the port; requests still waiting are answered 503 by their handler threads."""
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        with self._lock:
            self._lock.notify_all()

    def __enter__(self) -> Signal:
        return self if self._server is not None else self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def port(self) -> int:
        return self._port

    @property
    def url(self) -> str:
        return served_url(self._host, self._port, self.path)

    # --- what the training loop reads ----------------------------------------------------------

    @property
    def requested(self) -> bool:
        """A request is waiting for its answer: save at this step boundary, then ``ack``."""
        with self._lock:
            if self.first_step_at is None:
                self.first_step_at = utcnow()
            return any(not n.done.is_set() for n in self._notices.values())

    def incarnation(self) -> dict[str, str | None]:
        """What ``GET <path>/incarnation`` answers."""
        with self._lock:
            stepped, started = self.first_step_at, self.started_at
        return {
            "started_at": rfc3339(started) if started is not None else None,
            "first_step_at": rfc3339(stepped) if stepped is not None else None,
        }

    def pending(self) -> list[CheckpointRequest]:
        """The requests waiting for an answer, earliest deadline first."""
        with self._lock:
            out = [n.first for n in self._notices.values() if not n.done.is_set() and n.first]
        return sorted(out, key=lambda r: r.deadline)

    @property
    def request(self) -> CheckpointRequest | None:
        """The waiting request with the earliest deadline (the one the save must beat)."""
        waiting = self.pending()
        return waiting[0] if waiting else None

    def wait(self, timeout: float | None = None) -> CheckpointRequest | None:
        """Block until a request waits (for loops that do nothing else, and tests)."""
        with self._lock:
            self._lock.wait_for(
                lambda: (
                    any(not n.done.is_set() for n in self._notices.values()) or self._server is None
                ),
                timeout,
            )
        return self.request

    def result_of(self, notice_id: str) -> CheckpointResult | None:
        with self._lock:
            n = self._notices.get(notice_id)
            return n.result if n is not None and n.done.is_set() else None

    # --- answering ---------------------------------------------------------------------------

    def ack(self, result: CheckpointResult, *, covers: Iterable[str] = ()) -> list[str]:
        """Answer every waiting request, and the notices in ``covers`` that have not arrived
        yet, with ``result``. Returns the notice ids answered."""
        if not isinstance(result, CheckpointResult):
            raise TypeError(f"ack takes a CheckpointResult, not {type(result).__name__}")
        return self._settle(result, "", covers)

    def fail(self, error: str, *, covers: Iterable[str] = ()) -> list[str]:
        """Answer every waiting request ``500`` with ``error`` (one line): not acked."""
        return self._settle(None, one_line(error) or "checkpoint save failed", covers)

    def _settle(
        self, result: CheckpointResult | None, error: str, covers: Iterable[str]
    ) -> list[str]:
        with self._lock:
            for notice_id in covers:
                if notice_id not in self._notices:
                    self._notices[notice_id] = _Notice(first=None)
            settled = []
            for notice_id, n in self._notices.items():
                if not n.done.is_set():
                    n.result, n.error = result, error
                    n.done.set()
                    settled.append(notice_id)
            if result is not None and settled:
                self.ack_count += 1
            self._forget_old()
            self._lock.notify_all()
        self._hand(None)
        return settled

    # --- the server thread's side ------------------------------------------------------------

    def _receive(self, req: CheckpointRequest, polled: Share | None) -> _Notice:
        with self._lock:
            self.requests.append(req)
            n = self._notices.get(req.notice_id)
            if n is None:
                n = self._notices[req.notice_id] = _Notice(first=req)
                self._lock.notify_all()
            fresh = not n.done.is_set()
        if fresh:
            share = polled if polled is not None else req.put_budget
            if share is not None or n.first is req:
                self._hand(share)
        return n

    def _notice(self, notice_id: str) -> _Notice | None:
        with self._lock:
            return self._notices.get(notice_id)

    def _hand(self, share: Share | None) -> None:
        with self._lock:
            if share is None and self.requested_unlocked():
                return  # another request still waits: its share stands
            changed = share != self.put_budget
            self.put_budget = share
        if changed and self._on_share is not None:
            try:
                self._on_share(share)
            except Exception:
                log.exception("on_share failed")

    def requested_unlocked(self) -> bool:
        return any(not n.done.is_set() for n in self._notices.values())

    def _answered(self, notice_id: str) -> None:
        with self._lock:
            self.answered.setdefault(notice_id, utcnow())

    def _forget_old(self) -> None:
        finished = [k for k, n in self._notices.items() if n.done.is_set()]
        for key in finished[: max(0, len(self._notices) - self._keep_results)]:
            del self._notices[key]
            self.answered.pop(key, None)


def _handler(signal: Signal) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "reclaimd-trainer"

        def log_message(self, format: str, *args: Any) -> None:  # quiet: no access log
            return

        def _refused(self) -> bool:
            """401 (and the connection closed: the body is left unread) unless the request
            proves it is reclaimd's."""
            if signal.verifier is None:
                return False
            try:
                signal.verifier.verify(self.headers.get("Authorization"))
            except Unauthorized as e:
                with signal._lock:
                    signal.refused += 1
                log.warning("refused a checkpoint request: %s", e)
                self.close_connection = True
                self._json(401, {"error": f"unauthorized: {e}"}, challenge=True)
                return True
            return False

        def do_POST(self) -> None:
            if self._refused():
                return
            if self.path.split("?", 1)[0] != signal.path:
                self._json(404, {"error": "not found"})
                return
            try:
                length = int(self.headers.get("Content-Length", "0"))
            except ValueError:
                self._json(400, {"error": "bad Content-Length"})
                return
            if length > MAX_REQUEST_BYTES:
                self._json(413, {"error": "request body too large"})
                return
            raw = self.rfile.read(length)
            try:
                doc = json.loads(raw)
            except (ValueError, UnicodeDecodeError):
                self._json(400, {"error": "request body is not JSON"})
                return
            try:
                req = CheckpointRequest.from_json(
                    doc, traceparent=self.headers.get("traceparent", "")
                )
                polled = budget.parse_header(self.headers.get(budget.HEADER))
            except ValueError as e:
                self._json(400, {"error": one_line(str(e))})
                return
            n = signal._receive(req, polled)
            n.done.wait(signal.sync_window_s)
            self._answer(req.notice_id, n)

        def do_GET(self) -> None:
            if self._refused():
                return
            if self.path.split("?", 1)[0] == signal.path + "/incarnation":
                self._json(200, signal.incarnation())
                return
            prefix = signal.path + "/status/"
            if not self.path.startswith(prefix):
                self._json(404, {"error": "not found"})
                return
            notice_id = unquote(self.path[len(prefix) :])
            n = signal._notice(notice_id)
            if n is None:
                self._json(404, {"error": "no checkpoint requested for this notice"})
                return
            if not n.done.is_set():
                try:
                    share = budget.parse_header(self.headers.get(budget.HEADER))
                except ValueError as e:
                    log.warning("ignored a malformed put budget: %s", e)
                    share = None
                if share is not None:
                    signal._hand(share)
            self._answer(notice_id, n)

        def _answer(self, notice_id: str, n: _Notice) -> None:
            if not n.done.is_set():
                if signal._server is None:
                    self._json(503, {"error": "checkpoint signal stopped"})
                    return
                where = f"{signal.path}/status/{quote(notice_id, safe='')}"
                self._json(202, {"status": "saving", "status_url": where}, location=where)
                return
            if n.result is None:
                self._json(500, {"error": n.error})
                return
            signal._answered(notice_id)
            self._json(200, n.result.to_json())

        def _json(
            self, status: int, body: dict[str, Any], *, location: str = "", challenge: bool = False
        ) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            if location:
                self.send_header("Location", location)
            if challenge:
                self.send_header("WWW-Authenticate", 'Bearer realm="reclaimd-checkpoint"')
            if self.close_connection:
                self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(data)

    return Handler
