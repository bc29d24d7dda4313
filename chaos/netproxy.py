"""A loopback TCP proxy that can partition one replica from the apiserver (``partition``).

Each drill replica's kubeconfig names a proxy of its own in front of the kube-apiserver (the
TLS stream passes through untouched: the server's certificate is for 127.0.0.1, any port).
``cut`` is a network partition as the client sees it: bytes stop flowing both ways on the
connections that are open, and a new connection is accepted but gets nothing (no upstream
connection is made), so reads time out, as across a real partition, rather than failing
fast with a reset. ``heal`` lets everything flow again: bytes that were read just before the
cut are delivered then, as TCP would retransmit them, and a connection the client gave up
on meanwhile is closed once its close is read. Nothing else of the replica goes through it:
Kafka, SQS and the trainers stay reachable.

``NetProxy`` runs in the caller's event loop (the unit tests). The drill runs each proxy as a
process of its own (``ProxyProcess``: ``python -m chaos.netproxy``, driven over stdin
and stdout) so that its forwarding never waits on the drill's busy loop. Standard library
only: it starts in a few tens of milliseconds.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from typing import Any

CHUNK = 256 * 1024


class NetProxy:
    """Forward ``host:port`` (``port`` 0: any free one) to ``upstream``; ``cut`` and ``heal``."""

    def __init__(self, upstream: tuple[str, int], host: str = "127.0.0.1", port: int = 0) -> None:
        self.upstream = upstream
        self.host, self.port = host, port
        self._open = asyncio.Event()
        self._open.set()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self.connections = 0  # accepted, in all
        self.active = 0  # open now
        self.bytes = 0  # forwarded, both ways
        self.cuts = 0

    @property
    def is_cut(self) -> bool:
        return not self._open.is_set()

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._accept, self.host, self.port)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self.port

    def cut(self) -> int:
        """Partition: nothing flows from now on. Returns the connections open at the cut."""
        if not self.is_cut:
            self.cuts += 1
        self._open.clear()
        return self.active

    def heal(self) -> None:
        self._open.set()

    async def stop(self) -> None:
        self.heal()
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._server is not None:
            with contextlib.suppress(Exception):
                await self._server.wait_closed()

    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self.connections += 1
        self.active += 1
        upstream_w: asyncio.StreamWriter | None = None
        try:
            await self._open.wait()  # accepted during a cut: nothing until it heals
            try:
                upstream_r, upstream_w = await asyncio.open_connection(*self.upstream)
            except OSError:
                return  # the apiserver is down (a restart): the client sees the close
            await asyncio.gather(self._pump(client_r, upstream_w), self._pump(upstream_r, client_w))
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            self.active -= 1
            for w in (client_w, upstream_w):
                if w is not None:
                    w.close()
                    with contextlib.suppress(Exception):
                        await w.wait_closed()
            self._tasks.discard(task)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                await self._open.wait()
                data = await reader.read(CHUNK)
                # read just before a cut (bytes or the peer's close): passed on after the heal
                await self._open.wait()
                if not data:
                    break
                writer.write(data)
                await writer.drain()
                self.bytes += len(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError, RuntimeError):
                if writer.can_write_eof():
                    writer.write_eof()


def _address(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit():
        raise argparse.ArgumentTypeError(f"{value!r} is not HOST:PORT")
    return host or "127.0.0.1", int(port)


async def _serve(upstream: tuple[str, int], listen: tuple[str, int]) -> None:
    proxy = NetProxy(upstream, *listen)
    port = await proxy.start()
    print(f"listening {port}", flush=True)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    try:
        while line := await reader.readline():
            command = line.decode().strip()
            if command == "cut":
                print(f"cut {proxy.cut()}", flush=True)
            elif command == "heal":
                proxy.heal()
                print("healed", flush=True)
            elif command == "stats":
                print(
                    f"stats {proxy.connections} {proxy.active} {proxy.bytes} {proxy.cuts}",
                    flush=True,
                )
            else:
                print(f"error unknown command {command!r}", flush=True)
    finally:
        await proxy.stop()


def main(argv: list[str] | None = None) -> int:
    """``python -m chaos.netproxy --upstream HOST:PORT``: prints ``listening PORT``,
    then answers ``cut``, ``heal`` and ``stats`` on stdin; stops at end of input."""
    p = argparse.ArgumentParser(prog="netproxy", description=__doc__.splitlines()[0])
    p.add_argument("--upstream", type=_address, required=True, help="HOST:PORT to forward to")
    p.add_argument("--listen", type=_address, default=("127.0.0.1", 0), help="HOST:PORT (port 0)")
    args = p.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(args.upstream, args.listen))
    return 0


class ProxyProcess:
    """A ``NetProxy`` in a process of its own, driven from the drill's loop."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.port = 0
        self._proc: asyncio.subprocess.Process | None = None
        self._lock = asyncio.Lock()

    async def start(self, timeout_s: float = 20.0) -> int:
        host, port = self.upstream
        self._proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "chaos.netproxy",
            "--upstream",
            f"{host}:{port}",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        line = await self._answer(timeout_s)
        if not line.startswith("listening "):
            raise RuntimeError(f"netproxy did not start: {line!r}")
        self.port = int(line.split()[1])
        return self.port

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def _answer(self, timeout_s: float = 10.0) -> str:
        assert self._proc is not None and self._proc.stdout is not None
        raw = await asyncio.wait_for(self._proc.stdout.readline(), timeout_s)
        if not raw:
            raise RuntimeError(f"netproxy exited ({self._proc.returncode})")
        return raw.decode().strip()

    async def _ask(self, command: str) -> str:
        assert self._proc is not None and self._proc.stdin is not None
        async with self._lock:
            self._proc.stdin.write(f"{command}\n".encode())
            await self._proc.stdin.drain()
            return await self._answer()

    async def cut(self) -> int:
        """The partition begins; the connections that were open."""
        answer = await self._ask("cut")
        return int(answer.split()[1])

    async def heal(self) -> None:
        await self._ask("heal")

    async def stats(self) -> dict[str, int]:
        _, *values = (await self._ask("stats")).split()
        keys = ("connections", "active", "bytes", "cuts")
        return dict(zip(keys, (int(v) for v in values), strict=True))

    async def stop(self) -> None:
        if self._proc is None or self._proc.returncode is not None:
            return
        assert self._proc.stdin is not None
        with contextlib.suppress(Exception):
            self._proc.stdin.close()
        try:
            await asyncio.wait_for(self._proc.wait(), 5.0)
        except TimeoutError:
            self._proc.kill()
            await self._proc.wait()


if __name__ == "__main__":
    sys.exit(main())
