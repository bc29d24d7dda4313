"""The API server, spoken to directly: one aiohttp session, plain JSON in and out.

reclaimd makes about twenty kinds of call (Nodes, Pods, Evictions, Leases, Events, Kueue
Workloads) and reads every answer as JSON already; the generated ``kubernetes_asyncio`` client
would import some 1,200 model modules (60 MB of every replica) to make them. Paths are built
by the small functions below; every patch is a JSON merge patch; a status other than 2xx is
raised as ``ApiStatus`` and becomes a ``KubeError`` in ``errors.kube_errors``, the one place
errors become ours.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

import aiohttp

from reclaimd.cluster.kubeconfig import Connection

JsonObject = dict[str, Any]
MERGE_PATCH = "application/merge-patch+json"
USER_AGENT = "reclaimd"


class ApiStatus(Exception):
    """An answer other than 2xx, as the server sent it."""

    def __init__(self, status: int, body: bytes = b"", headers: Mapping[str, str] | None = None):
        self.status = status
        self.body = body
        self.headers: Mapping[str, str] = headers or {}
        super().__init__(f"HTTP {status}")


class ApiServer:
    """Calls to one API server with one identity. ``close()`` when done."""

    def __init__(self, connection: Connection, session: aiohttp.ClientSession) -> None:
        self._conn = connection
        self._session = session
        self._base = connection.server
        # time.monotonic() of the last answer of any status: whether the API server can be
        # reached at all (``HolderLeases.cut_off``: slow under a storm is not cut off).
        self.answered_at: float | None = None

    @classmethod
    def open(cls, connection: Connection, pool_size: int = 64) -> ApiServer:
        """In a running loop. ``pool_size`` sockets: a storm's writes must not queue behind a
        handful of connections, far below what the API server takes."""
        connector = aiohttp.TCPConnector(limit=pool_size, ssl=connection.ssl)
        # No total timeout: a watch is a long response; callers bound each call themselves.
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
        session = aiohttp.ClientSession(connector=connector, timeout=timeout)
        return cls(connection, session)

    async def close(self) -> None:
        await self._session.close()

    async def __aenter__(self) -> ApiServer:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def get(self, path: str, **params: Any) -> JsonObject:
        return await self.request("GET", path, params=params)

    async def post(self, path: str, body: Mapping[str, Any]) -> JsonObject:
        return await self.request("POST", path, body=body)

    async def patch(self, path: str, body: Mapping[str, Any]) -> JsonObject:
        """A JSON merge patch (RFC 7386): what a map says replaces, ``None`` removes."""
        return await self.request("PATCH", path, body=body, content_type=MERGE_PATCH)

    async def delete(self, path: str, body: Mapping[str, Any] | None = None) -> JsonObject:
        return await self.request("DELETE", path, body=body)

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        body: Mapping[str, Any] | None = None,
        content_type: str = "application/json",
    ) -> JsonObject:
        """One call; its answer's JSON object (``{}`` for an empty one). ``ApiStatus`` for an
        answer other than 2xx; aiohttp's errors for a failed connection."""
        headers = await self._headers()
        data = None
        if body is not None:
            headers["Content-Type"] = content_type
            data = json.dumps(body, separators=(",", ":"))
        async with self._session.request(
            method, self._base + path, params=query(params), data=data, headers=headers
        ) as response:
            self.answered_at = time.monotonic()
            raw = await response.read()
            if not 200 <= response.status < 300:
                raise ApiStatus(response.status, raw, response.headers)
        if not raw:
            return {}
        try:
            answer = json.loads(raw)
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            # Status 0, as a failed connection: a garbled answer may be right next time.
            raise ApiStatus(0, b'{"message":"response is not a JSON object"}')
        return answer

    async def stream(self, path: str, **params: Any) -> aiohttp.ClientResponse:
        """A GET whose answer is read as it comes (a watch): the open response, which the
        caller releases."""
        response = await self._session.get(
            self._base + path, params=query(params), headers=await self._headers()
        )
        self.answered_at = time.monotonic()
        if response.status != 200:
            try:
                raise ApiStatus(response.status, await response.read(), response.headers)
            finally:
                response.release()
        return response

    async def _headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json", "User-Agent": USER_AGENT}
        if self._conn.token is not None:
            headers["Authorization"] = "Bearer " + await self._conn.token.get()
        return headers


def query(params: Mapping[str, Any] | None) -> dict[str, str]:
    """Query parameters as the API server spells them: booleans in lower case, None left out."""
    out: dict[str, str] = {}
    for key, value in (params or {}).items():
        if value is None:
            continue
        out[key] = ("true" if value else "false") if isinstance(value, bool) else str(value)
    return out


# --- paths ------------------------------------------------------------------------------------


def _seg(name: str) -> str:
    return quote(name, safe="")


def core(resource: str, name: str = "", namespace: str = "") -> str:
    """``/api/v1[/namespaces/<ns>]/<resource>[/<name>]``."""
    return _path("/api/v1", resource, name, namespace)


def group(group_version: str, resource: str, name: str = "", namespace: str = "") -> str:
    """``/apis/<group>/<version>[/namespaces/<ns>]/<resource>[/<name>]``."""
    return _path(f"/apis/{group_version}", resource, name, namespace)


def node(name: str = "") -> str:
    return core("nodes", name)


def pod(namespace: str, name: str = "") -> str:
    return core("pods", name, namespace)


def lease(namespace: str, name: str = "") -> str:
    return group("coordination.k8s.io/v1", "leases", name, namespace)


def _path(prefix: str, resource: str, name: str, namespace: str) -> str:
    path = prefix + (f"/namespaces/{_seg(namespace)}" if namespace else "") + f"/{resource}"
    return path + (f"/{_seg(name)}" if name else "")
