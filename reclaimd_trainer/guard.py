"""The guarded put's pure parts: what an identity may write, and how fast it may write it.

No boto3 here (``reclaimd_trainer.s3`` is the S3 side): the prefix scope a tenant's keys must
keep to, the token bucket that paces an identity at reclaimd's share of its tenant's PutObject
budget, and the retry budget that keeps a storm of 503 SlowDown from becoming a storm of retries.
Clocks are passed in, so each is tested without waiting.
"""

from __future__ import annotations

import math
import re
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

DEFAULT_PREFIX: Final = "checkpoints/{tenant}/"
MAX_KEY_BYTES: Final = 1024  # S3's limit
_IDENTITY = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,62}")
# AWS's "safe characters" for object keys, plus a few that timestamps and k=v paths need.
_KEY_CHARS = re.compile(r"[A-Za-z0-9/!_.*'()=+,:@-]+")
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")


class ObjectStoreError(Exception):
    """A guarded put that did not happen; the message is one line."""


class ScopeRefused(ObjectStoreError):
    """The key (or bucket, or identity) is outside what the identity may write. No request."""


# --- scope -------------------------------------------------------------------------------


def check_identity(identity: str) -> str:
    if not _IDENTITY.fullmatch(identity):
        raise ScopeRefused(f"identity {identity[:64]!r} is not a valid tenant name")
    return identity


def _bad_key_reason(key: str) -> str | None:
    if not key:
        return "empty key"
    if len(key.encode()) > MAX_KEY_BYTES:
        return "key longer than 1024 bytes"
    if key.startswith("/"):
        return "absolute key"
    if not _KEY_CHARS.fullmatch(key):
        return "key has characters outside the safe set"
    if any(seg in ("", ".", "..") for seg in key.split("/")):
        return "key has an empty, '.' or '..' segment"
    return None


@dataclass(frozen=True)
class PrefixScope:
    """Where an identity may write: key prefixes (each ending in ``/``), optionally buckets."""

    prefixes: tuple[str, ...]
    buckets: frozenset[str] | None = None  # None: any bucket

    def __post_init__(self) -> None:
        for p in self.prefixes:
            if not p.endswith("/") or _bad_key_reason(p[:-1]) is not None:
                raise ValueError(f"not a usable prefix: {p[:80]!r}")

    @classmethod
    def for_tenant(
        cls, tenant: str, template: str = DEFAULT_PREFIX, buckets: Iterable[str] | None = None
    ) -> PrefixScope:
        check_identity(tenant)
        return cls((template.replace("{tenant}", tenant),), _frozen(buckets))

    def check(self, bucket: str, key: str) -> None:
        """Raise ``ScopeRefused`` unless ``key`` in ``bucket`` is this identity's to write."""
        if not _BUCKET.fullmatch(bucket) or (
            self.buckets is not None and bucket not in self.buckets
        ):
            raise ScopeRefused(f"bucket {bucket[:64]!r} is not allowed")
        reason = _bad_key_reason(key)
        if reason is not None:
            raise ScopeRefused(f"key refused: {reason}")
        if not any(key.startswith(p) for p in self.prefixes):
            raise ScopeRefused(f"key outside the allowed prefixes {list(self.prefixes)}")


def _frozen(buckets: Iterable[str] | None) -> frozenset[str] | None:
    return None if buckets is None else frozenset(buckets)


# --- rate and budget (pure, clock passed in) ---------------------------------------------


class TokenBucket:
    """Tokens refill at ``rate`` up to ``burst``. A reservation may drive the balance below
    zero: the callers then queue in reservation order, each sleeping its own share."""

    def __init__(self, rate: float, burst: float, now: float) -> None:
        self.rate = rate
        self.burst = burst
        self._tokens = burst
        self._t = now

    def _refill(self, now: float) -> None:
        if now > self._t:
            # Never below one token of room: a bucket must hold the token it sends.
            room = max(self.burst, 1.0)
            self._tokens = min(room, self._tokens + (now - self._t) * self.rate)
            self._t = now

    def set_rate(self, rate: float, burst: float, now: float) -> None:
        """Change the rate and size while running. Tokens accrued so far are kept, clamped to
        the new size: a new share never comes with tokens, it only changes how fast they
        accrue (reclaimd's split of the tenant budget relies on that, see ``putbudget``)."""
        self._refill(now)
        self.rate = rate
        self.burst = burst
        self._tokens = min(self._tokens, burst)

    def take(self, now: float) -> float:
        """Take a token if there is one (``0.0``); else how long until one accrues at the
        current rate (``math.inf`` at rate 0), taking nothing."""
        self._refill(now)
        if self._tokens >= 1:
            self._tokens -= 1
            return 0.0
        if self.rate <= 0:
            return math.inf
        return max((1 - self._tokens) / self.rate, 1e-9)

    def reserve(self, now: float, max_wait: float) -> float | None:
        """Take a token; return how long to wait for it, or ``None`` (nothing taken) if that
        is longer than ``max_wait``."""
        self._refill(now)
        wait = 0.0 if self._tokens >= 1 else (1 - self._tokens) / self.rate
        if wait > max_wait:
            return None
        self._tokens -= 1
        return wait


class RetryBudget:
    """Retries in the last ``window_s`` stay ``<= floor + ratio x requests`` in it."""

    def __init__(self, ratio: float, floor: int, window_s: float) -> None:
        self.ratio = ratio
        self.floor = floor
        self.window_s = window_s
        self._requests: deque[float] = deque()
        self._retries: deque[float] = deque()

    def _prune(self, now: float) -> None:
        edge = now - self.window_s
        for q in (self._requests, self._retries):
            while q and q[0] <= edge:
                q.popleft()

    def note_request(self, now: float) -> None:
        self._prune(now)
        self._requests.append(now)

    def try_spend(self, now: float) -> bool:
        self._prune(now)
        if len(self._retries) + 1 > self.floor + self.ratio * len(self._requests):
            return False
        self._retries.append(now)
        return True
