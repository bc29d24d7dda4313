"""The one retry helper: a jittered exponential backoff policy, and its per-loop series.

Every retry loop in the product takes its pauses from here (restart loops of sources and
watches, the Kubernetes write budget, evictions a PDB refuses, the ledger's publisher); what
is retried is the error's own verdict (``cluster.errors``: ``retriable``, ``transient``),
never a status code read at the loop.

``RetryPolicy`` is the arithmetic: the n-th delay after a run of failures grows as
``base * 2**n`` up to a cap, jittered (``full``: uniform in ``[0, ceiling)``, so a fleet that
lost the same dependency at once does not come back in lockstep; ``half``: uniform in
``[ceiling/2, ceiling)``, for loops that must not retry early), never below a floor or a
server's hint, and ``allows`` says whether another try fits (a deadline, else a number of
attempts). ``Backoff`` is one loop's series under a policy: ``next_delay()`` counts a failure,
``reset()`` after a success starts over. No dependencies: the RNG can be seeded for tests.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass
from typing import Literal

Jitter = Literal["full", "half"]


@dataclass(frozen=True)
class RetryPolicy:
    """Delays ``base_s * 2**failures`` up to ``cap_s``, jittered, at least ``floor_s``."""

    base_s: float
    cap_s: float
    jitter: Jitter = "full"
    floor_s: float = 0.0

    def ceiling(self, failures: int, cap_s: float | None = None) -> float:
        """The upper bound of the delay after ``failures`` (no jitter): what logs may show.
        ``cap_s`` overrides the policy's cap for one delay (a cap that grows with the time
        left)."""
        # The exponent is bounded so a long outage cannot overflow the float.
        cap = self.cap_s if cap_s is None else cap_s
        return min(cap, self.base_s * 2.0 ** min(failures, 62))

    def delay(
        self,
        failures: int,
        rng: random.Random | None = None,
        *,
        hint_s: float | None = None,
        cap_s: float | None = None,
    ) -> float:
        """The pause after ``failures``, jittered; never below the floor or ``hint_s`` (a
        server's Retry-After, which the caller bounds as it sees fit)."""
        ceiling = self.ceiling(failures, cap_s)
        uniform = (rng or _RNG).uniform
        jittered = uniform(0, ceiling) if self.jitter == "full" else uniform(ceiling / 2, ceiling)
        return max(self.floor_s, jittered, hint_s or 0.0)

    @staticmethod
    def allows(
        delay_s: float, attempt: int, *, left_s: float | None, max_attempts: int | None
    ) -> bool:
        """Whether another try after ``delay_s`` fits: before the deadline (``left_s``
        seconds away) when there is one, else within ``max_attempts``."""
        if left_s is not None:
            return left_s > delay_s
        return max_attempts is None or attempt < max_attempts


# The module's own RNG for callers that need no seeded one (``random``'s global functions
# would do the same; one instance keeps the policy free of global state it does not own).
_RNG = random.Random()


class Backoff:
    """``next_delay()`` grows ``base_s * 2**n`` up to ``cap_s``, jittered; ``reset()`` on success.

    ``floor_s`` (default 0) keeps a minimum pause, for loops that must never spin hot;
    ``jitter`` is ``full`` (default) or ``half`` (``RetryPolicy``).
    """

    def __init__(
        self,
        base_s: float,
        cap_s: float,
        rng: random.Random | None = None,
        *,
        floor_s: float = 0,
        jitter: Jitter = "full",
    ) -> None:
        # Checked here, not in the policy: settings the write budget and the evictions take
        # as they come (a cap below the base just means "the cap") must keep working.
        if base_s <= 0 or cap_s < base_s:
            raise ValueError(f"backoff: need 0 < base_s <= cap_s, got {base_s}, {cap_s}")
        if not 0 <= floor_s <= cap_s:
            raise ValueError(f"backoff: need 0 <= floor_s <= cap_s, got {floor_s}")
        self.policy = RetryPolicy(base_s, cap_s, jitter, floor_s)
        self.base_s, self.cap_s, self.floor_s = base_s, cap_s, floor_s
        self._rng = rng or random.Random()
        self.failures = 0  # since the last reset

    def ceiling(self) -> float:
        """The upper bound of the next delay (no jitter): what logs may show."""
        return self.policy.ceiling(self.failures)

    def next_delay(self) -> float:
        """The next pause, and count one more failure."""
        delay = self.policy.delay(self.failures, self._rng)
        self.failures += 1
        return delay

    def reset(self) -> None:
        self.failures = 0

    async def sleep(self) -> float:
        """Sleep ``next_delay()`` seconds; returns how long it slept."""
        delay = self.next_delay()
        await asyncio.sleep(delay)
        return delay
