"""One jittered exponential backoff for every restart loop (sources, watches).

Full jitter: the n-th delay after a run of failures is uniform in ``[0, min(cap, base * 2**n))``,
so a fleet of replicas (or a DaemonSet on every node) that lost the same dependency at once
does not come back in lockstep. ``reset()`` after a success starts the series over.
No dependencies: the RNG can be seeded for tests.
"""

from __future__ import annotations

import asyncio
import random


class Backoff:
    """``next_delay()`` grows ``base_s * 2**n`` up to ``cap_s``, jittered; ``reset()`` on success.

    ``floor_s`` (default 0) keeps a minimum pause, for loops that must never spin hot.
    """

    def __init__(
        self, base_s: float, cap_s: float, rng: random.Random | None = None, *, floor_s: float = 0
    ) -> None:
        if base_s <= 0 or cap_s < base_s:
            raise ValueError(f"backoff: need 0 < base_s <= cap_s, got {base_s}, {cap_s}")
        if not 0 <= floor_s <= cap_s:
            raise ValueError(f"backoff: need 0 <= floor_s <= cap_s, got {floor_s}")
        self.base_s, self.cap_s, self.floor_s = base_s, cap_s, floor_s
        self._rng = rng or random.Random()
        self.failures = 0  # since the last reset

    def ceiling(self) -> float:
        """The upper bound of the next delay (no jitter): what logs may show."""
        # The exponent is bounded so a long outage cannot overflow the float.
        return min(self.cap_s, self.base_s * 2.0 ** min(self.failures, 62))

    def next_delay(self) -> float:
        """The next pause, and count one more failure."""
        delay = max(self.floor_s, self._rng.uniform(0, self.ceiling()))
        self.failures += 1
        return delay

    def reset(self) -> None:
        self.failures = 0

    async def sleep(self) -> float:
        """Sleep ``next_delay()`` seconds; returns how long it slept."""
        delay = self.next_delay()
        await asyncio.sleep(delay)
        return delay
