"""What every part of a drill (``chaos.drill.run``) shares: retrying a call into a stack a fault
may have taken down, and the holder name a drill daemon runs as."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from chaos.process import DaemonProcess

T = TypeVar("T")
SEND_RETRY_S = 60.0  # a send into a transport that is down is retried this long (a real
# producer retries too; the fault drills take moto and the Pub/Sub emulator down for seconds)


async def retrying(call: Callable[[], Awaitable[T]], limit_s: float = SEND_RETRY_S) -> T:
    """``call()``, again every half second while it fails, for ``limit_s`` at most: a part of
    the stack a fault took down comes back within seconds."""
    loop = asyncio.get_running_loop()
    end = loop.time() + limit_s
    while True:
        try:
            return await call()
        except Exception:
            if loop.time() > end:
                raise
            await asyncio.sleep(0.5)


def yaml_holder(d: DaemonProcess) -> str:
    """The holder name a drill daemon runs as (from its config file)."""
    import yaml

    doc = yaml.safe_load(d.config_path.read_text())
    return str(doc.get("holder", "")) if isinstance(doc, dict) else ""
