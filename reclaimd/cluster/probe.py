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
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from enum import StrEnum


class Verdict(StrEnum):
    DEAD = "dead"  # refused: nothing listens there
    UNKNOWN = "unknown"  # accepted, timed out, unreachable: the Lease decides


class Listener:
    """Accepts and closes connections on ``host:port`` (port 0: any free one) while open;
    peers dial ``advertise`` (empty: ``$POD_IP``, else loopback) at the bound port."""

    def __init__(self, host: str, port: int, advertise: str = "") -> None:
        self.host, self.port = host, port
        self.advertise = advertise or os.environ.get("POD_IP", "") or "127.0.0.1"
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
        self._server = await asyncio.start_server(_hang_up, host, self.port)

    async def close(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
            with contextlib.suppress(Exception):
                await server.wait_closed()


async def _hang_up(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(Exception):
        await writer.wait_closed()


async def probe(address: str, timeout_s: float) -> Verdict:
    """One TCP connect to ``host:port``."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        return Verdict.UNKNOWN
    try:
        async with asyncio.timeout(timeout_s):
            _, writer = await asyncio.open_connection(host.strip("[]"), int(port))
    except ConnectionRefusedError:
        return Verdict.DEAD
    except (OSError, TimeoutError):
        return Verdict.UNKNOWN
    writer.close()
    with contextlib.suppress(Exception):
        await writer.wait_closed()
    return Verdict.UNKNOWN
