"""A replica's death, seen in seconds: a probe of a peer's probe port.

The holder Lease (``holders``) is the truth of who is alive, but a slow one: it runs out
``claim_stale_s`` after the last renewal. A direct probe is fast. Its answers:

- *connection refused*: the peer's own host (or pod network namespace, which outlives a
  crashed container) says nothing listens there, so the process is gone: SIGKILLed,
  OOM-killed, or stopped after handing its claims over. Dead now.
- ``cut``: the peer says it has not renewed its own holder Lease for ``cut_after_s`` although
  its event loop runs: a partition between it and the API server, while its peer still
  reaches it. It reads every claim before acting from then on (``HolderLeases.fresh``), so
  its peer takes the claims over at once.
- any other answer: alive, however busy.
- no answer (a timeout, a reset, an unreachable host): *silent*. A stopped process (SIGSTOP,
  a kernel hang) still has its connection accepted by the kernel but answers nothing; a dead
  node or a dropped network answers nothing at all. Silence alone says nothing of the API
  server's view, so ``HolderLeases`` presumes a peer dead only when its probes stay silent
  *and* its Lease stays unrenewed for ``silent_after_s``, the same bound after which the
  silent replica fences itself.

So the answer must not depend on the asyncio loop: a replica CPU-starved in a storm on two
cores lags its loop by seconds, and a probe answered from that loop would look silent. The
listener answers from a thread of its own, which only a stopped process stops. While the
loop lags (its heartbeat old) the thread says ``slow``, never ``cut``: renewals late for lack
of CPU are not a partition, and a loop that never comes back is left to the Lease.

The same port answers one question more (``ask``): ``GET /acks/<notice label>``, the checkpoints a
replica's ranks acked for a notice. A replica cut off from the API server cannot record them in
the gang's Lease, and by the time its peer takes the notice over, Kueue may have deleted the
ranks that answered: the peer asks the presumed-dead holder (``gangclaims.GangClaims.owned_by``)
and charges from what they saved, not from older checkpoints. The records live on the loop, so
the thread asks the loop for them, for up to ``ASK_WAIT_S``. A peer that sends nothing is hung
up on.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import os
import re
import socket
import threading
import time
from collections.abc import Callable, Mapping
from enum import StrEnum

# What a peer may ask: one notice's acks, by the notice's label (a digest, never the id).
_ACKS = re.compile(rb"^GET /acks/([0-9a-f]{1,64}) HTTP/1\.[01]\r?\n$")
_REACH = re.compile(rb"^GET /reach HTTP/1\.[01]\r?\n$")
CUT = b"cut"  # the body of a /reach answer from a replica cut off from the API server
SLOW = b"slow"  # its loop lags: whatever its renewals say, it is alive and not cut off
REACHES = b"reaches"
READ_S = 1.0  # a peer that connects and says nothing (a probe) is hung up on
MAX_ANSWER = 4 << 20
BEAT_S = 0.1  # the loop's heartbeat, read by the answering thread
LAG_S = 1.0  # a heartbeat older than this: the loop lags
ASK_WAIT_S = 2.0  # how long the thread waits for the loop's answer to /acks
MAX_CONNECTIONS = 32  # answered at once; more are hung up on (a flood, not a peer)

Answer = Callable[[str], Mapping[str, str]]  # notice label -> {gang lease name: acks json}


class Verdict(StrEnum):
    DEAD = "dead"  # refused: nothing listens there
    CUT = "cut"  # it says it cannot reach the API server: it no longer acts on its claims
    ALIVE = "alive"  # it answered
    SILENT = "silent"  # no answer: stopped, its node dead, or unreachable from us


class Listener:
    """Answers peers on ``host:port`` (port 0: any free one) while open, from a thread;
    peers dial ``advertise`` (empty: ``$POD_IP``, else loopback) at the bound port."""

    def __init__(
        self,
        host: str,
        port: int,
        advertise: str = "",
        *,
        answer: Answer | None = None,
        cut: Callable[[], bool] | None = None,
    ) -> None:
        self.host, self.port = host, port
        self.advertise = advertise or os.environ.get("POD_IP", "") or "127.0.0.1"
        self.answer = answer  # set once the gang records exist (``reclaimd.wiring.wire``)
        self.cut = cut  # ``HolderLeases.cut_off``, once the holder Lease exists
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._beating: asyncio.Task[None] | None = None
        self._beat_at = time.monotonic()
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)

    @property
    def address(self) -> str:
        """``host:port`` as peers should dial it; empty unless open."""
        if self._sock is None:
            return ""
        bound = self._sock.getsockname()[1]
        host = self.advertise
        return f"[{host}]:{bound}" if ":" in host else f"{host}:{bound}"

    async def start(self) -> None:
        # One socket, of the advertised address's family: a wildcard bind makes one per family,
        # each on a port of its own with port 0, and peers would dial one nothing listens on.
        v6 = ":" in self.advertise
        host = self.host or ("::" if v6 else "0.0.0.0")
        family = socket.AF_INET6 if v6 or ":" in host else socket.AF_INET
        sock = socket.create_server((host, self.port), family=family, backlog=64)
        self._sock, self._loop = sock, asyncio.get_running_loop()
        self._beat_at = time.monotonic()
        self._beating = asyncio.create_task(self._beat(), name="probe-heartbeat")
        self._thread = threading.Thread(
            target=self._accept, args=(sock,), name="probe-port", daemon=True
        )
        self._thread.start()

    async def close(self) -> None:
        """Refused from now on: peers take our claims over at once."""
        sock, self._sock = self._sock, None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread; refused from now
            sock.close()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 2.0)
            self._thread = None
        if self._beating is not None:
            self._beating.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._beating
            self._beating = None

    async def _beat(self) -> None:
        while True:
            self._beat_at = time.monotonic()
            await asyncio.sleep(BEAT_S)

    def lagging(self) -> bool:
        """The loop has not run its heartbeat for ``LAG_S``."""
        return time.monotonic() - self._beat_at > LAG_S

    def _accept(self, sock: socket.socket) -> None:
        while self._sock is sock:
            try:
                conn, _ = sock.accept()
            except OSError:
                return  # closed
            if not self._slots.acquire(blocking=False):
                conn.close()
                continue
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            conn.settimeout(READ_S)
            body = self._body(_readline(conn))
            if body is not None:
                head = b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body)
                conn.sendall(head + body)
        except (OSError, ValueError, concurrent.futures.TimeoutError):
            pass  # a probe, a stranger or a peer gone mid-answer: nothing to say
        finally:
            conn.close()
            self._slots.release()

    def _body(self, line: bytes) -> bytes | None:
        asked = _ACKS.match(line)
        if asked is not None and self.answer is not None:
            return json.dumps(self._on_loop(self.answer, asked.group(1).decode())).encode()
        if _REACH.match(line):
            if self.lagging():
                return SLOW
            return CUT if self.cut is not None and self.cut() else REACHES
        return None

    def _on_loop(self, answer: Answer, label: str) -> dict[str, str]:
        """``answer(label)`` run on the loop (the records are the loop's), waited for here."""
        loop, done = self._loop, concurrent.futures.Future[dict[str, str]]()
        if loop is None:
            return {}

        def run() -> None:
            try:
                done.set_result(dict(answer(label)))
            except Exception as e:  # the record read failed: the peer learns nothing
                done.set_exception(e)

        try:
            loop.call_soon_threadsafe(run)
        except RuntimeError:
            return {}  # the loop is closed: stopping
        try:
            return done.result(ASK_WAIT_S)
        except Exception:
            return {}


def _readline(conn: socket.socket) -> bytes:
    """The request line, at most 256 bytes."""
    raw = b""
    while not raw.endswith(b"\n") and len(raw) < 256:
        chunk = conn.recv(256 - len(raw))
        if not chunk:
            break
        raw += chunk
    return raw


async def probe(address: str, timeout_s: float) -> Verdict:
    """One TCP connect to ``host:port`` and ``GET /reach`` on it, within ``timeout_s``."""
    try:
        body = await _get(address, "/reach", timeout_s, limit=256)
    except ConnectionRefusedError:
        return Verdict.DEAD
    if body is None:  # paused (the kernel accepted), its node gone, or partitioned from us
        return Verdict.SILENT
    return Verdict.CUT if body == CUT else Verdict.ALIVE


async def ask(address: str, label: str, timeout_s: float) -> dict[str, str]:
    """The acks the replica at ``address`` holds for the notice labelled ``label``: empty
    when it does not answer in ``timeout_s`` (paused, partitioned from us, gone)."""
    if not re.fullmatch(r"[0-9a-f]{1,64}", label):
        return {}
    try:
        body = await _get(address, f"/acks/{label}", timeout_s, limit=MAX_ANSWER)
        found = json.loads(body) if body is not None else None
    except (ConnectionRefusedError, ValueError):
        return {}
    if not isinstance(found, dict):
        return {}
    return {str(k): v for k, v in found.items() if isinstance(v, str)}


async def _get(address: str, path: str, timeout_s: float, *, limit: int) -> bytes | None:
    """The body of a ``200`` to ``GET path`` from the peer at ``host:port`` within
    ``timeout_s``; None for anything else (no answer, another status, more than ``limit``
    bytes). A refused connect raises ``ConnectionRefusedError``: the one answer ``probe``
    trusts."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        return None
    raw = b""
    try:
        async with asyncio.timeout(timeout_s):
            reader, writer = await asyncio.open_connection(host.strip("[]"), int(port))
            try:
                writer.write(f"GET {path} HTTP/1.0\r\n".encode())
                await writer.drain()
                while chunk := await reader.read(65536):  # the peer closes when done
                    raw += chunk
                    if len(raw) > limit:
                        return None
            finally:
                writer.close()
                with contextlib.suppress(Exception):
                    await writer.wait_closed()
    except ConnectionRefusedError:
        raise
    except (OSError, TimeoutError):
        return None
    head, _, body = raw.partition(b"\r\n\r\n")
    return body if head.startswith(b"HTTP/1.0 200") else None
