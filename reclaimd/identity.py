"""reclaimd's own identity, shown to the ranks it asks (docs/checkpoint-contract.md, "Who may ask").

Every request reclaimd sends a rank (the checkpoint POST, its status polls, ``/incarnation``)
carries ``Authorization: Bearer <token>``: reclaimd's ServiceAccount token, projected by the
kubelet into the pod (the chart's ``checkpoint-identity`` volume: audience
``reclaimd.io/checkpoint``, ten minutes). The kubelet rewrites the file well before the token
expires, so the file is the truth: it is re-read when it changes (a new inode or mtime: the
kubelet swaps a symlink) and, in case a change was missed, once the token held has used 80 % of
its lifetime. A rank that verifies (``reclaimd_trainer.auth``) refuses a request without it.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

import aiohttp

log = logging.getLogger(__name__)

REFRESH_FRACTION = 0.8  # of a token's lifetime, when it is re-read whatever the file says
RETRY_S = 10.0  # an unreadable file or token is tried again this often


class TokenFile:
    """The token in ``path``, re-read on change and before it expires. ``token()`` is cheap (a
    ``stat``) and never raises: with no readable token it returns ``None`` (the request goes
    without, and a rank that verifies refuses it), said once per distinct problem."""

    def __init__(self, path: Path, *, clock: Callable[[], float] = time.time) -> None:
        self.path = path
        self._clock = clock
        self._token: str | None = None
        self._seen: tuple[int, int, int] | None = None  # (inode, mtime ns, size) read
        self._refresh_at = 0.0
        self._expires_at = 0.0
        self._problem = ""
        self.reads = 0  # how often the file was read

    def token(self) -> str | None:
        now = self._clock()
        try:
            st = os.stat(self.path)  # follows the kubelet's ..data symlink
            seen = (st.st_ino, st.st_mtime_ns, st.st_size)
        except OSError as e:
            self._say(f"cannot read reclaimd's identity token {self.path}: {e.strerror or e}")
            return self._still_valid(now)
        if seen != self._seen or now >= self._refresh_at:
            self._read(seen, now)
        return self._still_valid(now)

    def _read(self, seen: tuple[int, int, int], now: float) -> None:
        self.reads += 1
        try:
            token = self.path.read_text().strip()
        except OSError as e:
            self._say(f"cannot read reclaimd's identity token {self.path}: {e.strerror or e}")
            self._refresh_at = now + RETRY_S
            return
        issued, expires = _lifetime(token)
        if expires is None:
            self._say(f"{self.path} holds no JWT with an expiry: not sent")
            self._seen, self._refresh_at = seen, now + RETRY_S
            return
        start = issued if issued is not None and issued < expires else now
        self._token, self._seen, self._expires_at = token, seen, expires
        self._refresh_at = max(now + 1.0, start + REFRESH_FRACTION * (expires - start))
        if self._problem:
            log.info("reclaimd's identity token is readable again")
        self._problem = ""

    def _still_valid(self, now: float) -> str | None:
        return self._token if self._token is not None and now < self._expires_at else None

    def _say(self, problem: str) -> None:
        if problem != self._problem:
            log.error(problem)
            self._problem = problem


def _lifetime(token: str) -> tuple[float | None, float | None]:
    """``iat`` and ``exp`` of a JWT, read without verifying: when to read the file again is
    ours to decide; whether the token is good is the rank's."""
    parts = token.split(".")
    if len(parts) != 3:
        return None, None
    try:
        claims = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except ValueError:
        return None, None
    if not isinstance(claims, dict):
        return None, None
    iat, exp = claims.get("iat"), claims.get("exp")
    number = (int, float)
    return (
        float(iat) if isinstance(iat, number) and not isinstance(iat, bool) else None,
        float(exp) if isinstance(exp, number) and not isinstance(exp, bool) else None,
    )


def bearer(identity: TokenFile) -> aiohttp.ClientMiddlewareType:
    """A client middleware putting the token on every request of the session it is given to."""

    async def middleware(
        request: aiohttp.ClientRequest, handler: aiohttp.ClientHandlerType
    ) -> aiohttp.ClientResponse:
        token = identity.token()
        if token is not None:
            request.headers["Authorization"] = f"Bearer {token}"
        return await handler(request)

    return middleware
