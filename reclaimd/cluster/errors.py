"""The Kubernetes API error hierarchy: the one place API errors become ours.

Every module under ``reclaimd.cluster`` talks to the API server through an ``ApiServer``
(built by ``connect.build_api_client``) and turns every failure into a ``KubeError`` through
``kube_errors()``. The classes carry the retry policy (``retriable``: the same call may work
later; ``transient``: the same request, unchanged, may pass after a pause, which the write
budget retries itself; ``retried_in_grace``: retried for a while only), so callers decide on
the class, never on a status code or a message string; the pauses come from
``reclaimd.backoff``. A message holds the operation, the status and at most the first line of
the server's ``message`` field, cut to a bounded length: a response body can echo a request
body (tokens in a Secret, a kubeconfig in an annotation) and never reaches a log whole.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import aiohttp

from reclaimd.cluster.apiserver import ApiStatus

MESSAGE_LIMIT = 160


class KubeError(Exception):
    """An API call that failed. ``retriable`` says whether the same call may work later."""

    retriable = False
    # About the server's load or health, not the object: the write budget retries it.
    transient = False
    # Retried for the write budget's grace only (``kube.forbidden_grace_s``).
    retried_in_grace = False

    def __init__(
        self, what: str, status: int = 0, message: str = "", retry_after_s: float | None = None
    ) -> None:
        self.what = what
        self.status = status
        self.message = message
        self.retry_after_s = retry_after_s
        detail = f" {status}" if status else ""
        super().__init__(f"{what}: failed{detail}" + (f": {message}" if message else ""))


class NotFound(KubeError):
    pass


class Conflict(KubeError):
    """409: a resourceVersion precondition failed (or the object already exists)."""

    retriable = True


class Gone(KubeError):
    """410: the resourceVersion is older than the server keeps; relist."""


class TooManyRequests(KubeError):
    """429: API priority and fairness, or an eviction that a PodDisruptionBudget blocks."""

    retriable = True


class Throttled(TooManyRequests):
    """429 for load, not for the object: API Priority and Fairness or max-in-flight. Retried
    by the write budget, which also slows down (``ratelimit.RateLimiter.call``)."""

    transient = True


class Forbidden(KubeError):
    """403. A restarted API server answers it until its RBAC caches fill: retried for a grace."""

    retried_in_grace = True


class Unauthorized(KubeError):
    pass


class Invalid(KubeError):
    """400/422: the request itself is wrong; retrying it cannot help."""


class ServerError(KubeError):
    """5xx, or a transport failure (connection refused, reset, timed out)."""

    retriable = True
    transient = True


class ConfigError(KubeError):
    """No usable kubeconfig or in-cluster service account."""


_BY_STATUS: Mapping[int, type[KubeError]] = {
    400: Invalid,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    410: Gone,
    422: Invalid,
    429: TooManyRequests,
}


def server_message(body: Any) -> str:
    """The first line of a ``Status`` body's ``message``, bounded; never the whole body."""
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    if isinstance(body, str):
        try:
            body = json.loads(body)
        except ValueError:
            return ""
    if not isinstance(body, Mapping):
        return ""
    message = str(body.get("message") or "")
    first = message.splitlines()[0] if message else ""
    return first if len(first) <= MESSAGE_LIMIT else first[: MESSAGE_LIMIT - 1] + "…"


def _retry_after(headers: Any) -> float | None:
    if not headers:
        return None
    try:
        value = headers.get("Retry-After")
        return float(value) if value is not None else None
    except (TypeError, ValueError):
        return None


# Headers the API server's priority and fairness filter puts on every answer it shapes.
_APF_HEADERS = ("X-Kubernetes-PF-FlowSchema-UID", "X-Kubernetes-PF-PriorityLevel-UID")


def _is_load_shed(message: str, headers: Any) -> bool:
    """A 429 about load (retry later, slower) rather than an Eviction a PDB refuses: the
    latter names the disruption budget and carries no Retry-After."""
    if "disruption budget" in message.lower():
        return False
    if _retry_after(headers) is not None:
        return True
    return bool(headers) and any(headers.get(h) for h in _APF_HEADERS)


def error_for(what: str, status: int, body: Any = None, headers: Any = None) -> KubeError:
    """Map an HTTP status (and the Status body, when there is one) to our class."""
    cls = _BY_STATUS.get(status) or (ServerError if status >= 500 or status == 0 else KubeError)
    message = server_message(body)
    if cls is TooManyRequests and _is_load_shed(message, headers):
        cls = Throttled
    return cls(what, status, message, _retry_after(headers))


def from_api_status(what: str, e: ApiStatus) -> KubeError:
    return error_for(what, e.status, e.body, e.headers)


@contextmanager
def kube_errors(what: str) -> Iterator[None]:
    """Run an API call, turning its failures into ``KubeError`` (chained, bounded message)."""
    try:
        yield
    except ApiStatus as e:
        raise from_api_status(what, e) from e
    except (aiohttp.ClientError, TimeoutError) as e:
        # Connection-level failures carry no status; they are worth another try.
        raise ServerError(what, 0, type(e).__name__) from e
