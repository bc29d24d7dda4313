"""Ports for the servers the rig starts: below the kernel's ephemeral range.

A port the kernel hands out for ``bind(0)`` comes from the ephemeral range, the same range
outgoing connections draw their local ports from. Between choosing such a port and the server
binding it (or between a replica's stop and its restart on the same port) any client
connection can take it: CI saw ``address already in use`` exactly so. A port below that range
is never given to an outgoing connection, and the stack's own fixed ports (11338-19443) stay
below ``_LOW``.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

_LOW = 20000
_given: set[int] = set()


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A port nothing listens on, not handed out before by this process."""
    high = _ephemeral_low()
    if high - _LOW < 1000:  # an odd kernel range: fall back to what the kernel picks
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])
    rng = random.SystemRandom()  # not the drills' seeded random: that would repeat ports
    for _ in range(200):
        port = rng.randrange(_LOW, high)
        if port not in _given and _bindable(port):
            _given.add(port)
            return port
    raise RuntimeError(f"no free port in {_LOW}-{high - 1}")
