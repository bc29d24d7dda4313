"""The drill's partition proxy (chaos.netproxy): forwards, cuts like a partition, heals."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from chaos.netproxy import NetProxy, ProxyProcess, main


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(65536):
        writer.write(data)
        await writer.drain()
    writer.close()


@pytest.fixture
async def upstream() -> AsyncIterator[tuple[str, int]]:
    server = await asyncio.start_server(_echo, "127.0.0.1", 0)
    yield "127.0.0.1", int(server.sockets[0].getsockname()[1])
    server.close()


async def _roundtrip(port: int, payload: bytes, timeout_s: float = 2.0) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(payload)
        await writer.drain()
        return await asyncio.wait_for(reader.readexactly(len(payload)), timeout_s)
    finally:
        writer.close()


async def test_forwards_both_ways(upstream: tuple[str, int]) -> None:
    proxy = NetProxy(upstream)
    port = await proxy.start()
    try:
        big = bytes(range(256)) * 4096  # 1 MiB, more than one chunk
        assert await _roundtrip(port, b"hello") == b"hello"
        assert await _roundtrip(port, big) == big
        assert proxy.connections == 2 and proxy.bytes == 2 * (5 + len(big))
    finally:
        await proxy.stop()


async def test_a_cut_holds_open_and_new_connections_until_it_heals(
    upstream: tuple[str, int],
) -> None:
    proxy = NetProxy(upstream)
    port = await proxy.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"a")
        assert await asyncio.wait_for(reader.readexactly(1), 2) == b"a"
        assert proxy.cut() == 1  # one connection open at the cut
        writer.write(b"b")
        await writer.drain()
        # an open connection gets nothing: a timeout, not a reset
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(reader.readexactly(1), 0.3)
        # a new one is accepted (the connect succeeds) and gets nothing either
        reader2, writer2 = await asyncio.open_connection("127.0.0.1", port)
        writer2.write(b"c")
        await writer2.drain()
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(reader2.readexactly(1), 0.3)
        assert proxy.is_cut and proxy.cuts == 1
        proxy.heal()
        # what was sent during the cut arrives after it, like a TCP retransmission
        assert await asyncio.wait_for(reader.readexactly(1), 2) == b"b"
        assert await asyncio.wait_for(reader2.readexactly(1), 2) == b"c"
        for w in (writer, writer2):
            w.close()
    finally:
        await proxy.stop()


async def test_a_client_that_gave_up_during_the_cut_is_closed_after_it(
    upstream: tuple[str, int],
) -> None:
    proxy = NetProxy(upstream)
    port = await proxy.start()
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        await asyncio.sleep(0.05)
        proxy.cut()
        writer.close()
        await asyncio.sleep(0.1)
        assert proxy.active == 1  # nothing read during the cut, not even the close
        proxy.heal()
        for _ in range(40):
            if proxy.active == 0:
                break
            await asyncio.sleep(0.05)
        assert proxy.active == 0
        assert await _roundtrip(port, b"again") == b"again"
    finally:
        await proxy.stop()


async def test_an_upstream_that_is_down_closes_the_client() -> None:
    server = await asyncio.start_server(_echo, "127.0.0.1", 0)
    port = int(server.sockets[0].getsockname()[1])
    server.close()
    await server.wait_closed()
    proxy = NetProxy(("127.0.0.1", port))
    listen = await proxy.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", listen)
        assert await asyncio.wait_for(reader.read(1), 2) == b""  # closed: connection refused
        writer.close()
    finally:
        await proxy.stop()


async def test_the_proxy_process_is_driven_over_stdin(upstream: tuple[str, int]) -> None:
    proxy = ProxyProcess(upstream)
    port = await proxy.start()
    try:
        assert await _roundtrip(port, b"ping") == b"ping"
        assert await proxy.cut() in (0, 1)  # the first connection may not be closed yet
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"x")
        await writer.drain()
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(reader.readexactly(1), 0.3)
        await proxy.heal()
        assert await asyncio.wait_for(reader.readexactly(1), 2) == b"x"
        writer.close()
        stats = await proxy.stats()
        assert stats["connections"] == 2 and stats["cuts"] == 1
    finally:
        await proxy.stop()


def test_bad_upstream_is_a_usage_error() -> None:
    with pytest.raises(SystemExit) as e:
        main(["--upstream", "nowhere"])
    assert e.value.code == 2
