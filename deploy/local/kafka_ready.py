"""Readiness probe for the local Kafka broker, used by stack.sh.

An open port is not readiness for a KRaft broker: it accepts connections before it has
registered with its controller. The probe bootstraps a real client (ApiVersions + Metadata) and
succeeds only when the broker lists itself. Exit 0 when ready, 1 with one line otherwise.
"""

from __future__ import annotations

import asyncio
import sys

from aiokafka import AIOKafkaProducer


async def _probe(bootstrap: str) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, request_timeout_ms=3000)
    try:
        await producer.start()
        if not producer.client.cluster.brokers():
            raise RuntimeError("broker has not registered yet")
    finally:
        await producer.stop()


def main() -> int:
    bootstrap = sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:19092"
    try:
        asyncio.run(asyncio.wait_for(_probe(bootstrap), timeout=10))
    except Exception as exc:  # a probe reports every failure the same way: not ready
        print(f"kafka {bootstrap} not ready: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
