"""A replica's death, seen in under a second: a TCP probe of a peer's probe port.

The holder Lease (``holders``) is the truth of who is alive, but a slow one: it runs out
``claim_stale_s`` after the last renewal. A direct probe is fast, and only one answer of it is
trusted: *connection refused*. A refused connect is the peer's own host (or pod network
namespace, which outlives a crashed container) saying nothing listens there, so the process is
gone: SIGKILLed, OOM-killed, or stopped after handing its claims over. Anything else (a
timeout, a reset, an accepted connection) says nothing: a paused process still has its socket
accepted by the kernel, and a partition drops packets. Those wait for the Lease, as before.

So a false "dead" needs a live process that is not listening on the address it advertised,
and a replica closes its listener only once it has stopped acting on claims (``Daemon.run``).

A probe also asks one thing: ``GET /reach``. A replica whose own holder Lease has not been
renewed for ``cut_after_s`` says it is *cut off* from the API server (a partition between it
and the API server, while its peer still reaches it): it cannot act on its claims, and it
reads every claim before acting from then on (``HolderLeases.fresh``), so its peer takes the
claims over at once rather than a whole Lease later. Only the replica itself can say this; a
silence (a pause) still waits for the Lease.

The same port answers one question more (``ask``): ``GET /acks/<notice label>``, the checkpoints a
replica's ranks acked for a notice. A replica cut off from the API server cannot record them in
the gang's Lease, and by the time its peer takes the notice over, Kueue may have deleted the
ranks that answered: the peer asks the presumed-dead holder (``gangclaims.GangClaims.owned_by``)
and charges from what they saved, not from older checkpoints. A peer that sends nothing is
hung up on.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
from collections.abc import Callable, Mapping
from enum import StrEnum

# What a peer may ask: one notice's acks, by the notice's label (a digest, never the id).
_ACKS = re.compile(rb"^GET /acks/([0-9a-f]{1,64}) HTTP/1\.[01]\r?\n$")
_REACH = re.compile(rb"^GET /reach HTTP/1\.[01]\r?\n$")
CUT = b"cut"  # the body of a /reach answer from a replica cut off from the API server
READ_S = 1.0  # a peer that connects and says nothing (a probe) is hung up on
MAX_ANSWER = 4 << 20

Answer = Callable[[str], Mapping[str, str]]  # notice label -> {gang lease name: acks json}


class Verdict(StrEnum):
    DEAD = "dead"  # refused: nothing listens there
    CUT = "cut"  # it says it cannot reach the API server: it no longer acts on its claims
    UNKNOWN = "unknown"  # accepted, timed out, unreachable: the Lease decides


class Listener:
    """Accepts and closes connections on ``host:port`` (port 0: any free one) while open;
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
        self._server: asyncio.Server | None = None

    @property
    def address(self) -> str:
        """``host:port`` as peers should dial it; empty unless open."""
        if self._server is None or not self._server.sockets:
            return ""
        bound = self._server.sockets[0].getsockname()[1]
        host = self.advertise
        return f"[{host}]:{bound}" if ":" in host else f"{host}:{bound}"

    async def start(self) -> None:
        # One socket, of the advertised address's family: a wildcard bind makes one per family,
        # each on a port of its own with port 0, and peers would dial one nothing listens on.
        host = self.host or ("::" if ":" in self.advertise else "0.0.0.0")
        self._server = await asyncio.start_server(self._serve, host, self.port)

    async def close(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
            with contextlib.suppress(Exception):
                await server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(READ_S):
                line = await reader.readline()
            asked = _ACKS.match(line)
            body: bytes | None = None
            if asked is not None and self.answer is not None:
                body = json.dumps(dict(self.answer(asked.group(1).decode()))).encode()
            elif _REACH.match(line) and self.cut is not None:
                body = CUT if self.cut() else b"reaches"
            if body is not None:
                writer.write(b"HTTP/1.0 200 OK\r\n")
                writer.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
                await writer.drain()
        except (OSError, TimeoutError, ValueError):
            pass  # a probe, a stranger or a peer gone mid-answer: nothing to say
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()


async def probe(address: str, timeout_s: float) -> Verdict:
    """One TCP connect to ``host:port`` and ``GET /reach`` on it, within ``timeout_s``."""
    try:
        body = await _get(address, "/reach", timeout_s, limit=256)
    except ConnectionRefusedError:
        return Verdict.DEAD
    # No answer: paused (the kernel accepted), partitioned from us, or an older replica.
    return Verdict.CUT if body == CUT else Verdict.UNKNOWN


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
