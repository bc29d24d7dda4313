"""LIST+WATCH: the one module that knows the Kubernetes watch protocol.

``watch_objects`` yields a ``Listed`` snapshot, then ``Changed`` events, forever:

- LIST (paged, one consistent resourceVersion), yield ``Listed`` so the consumer *replaces*
  its contents: an object deleted while we were not watching is gone from the snapshot, so
  a gap never leaves a ghost behind.
- WATCH from the listed resourceVersion with bookmarks on. The resourceVersion advances on
  every event, BOOKMARK included, so a reconnect resumes where the stream stopped instead of
  replaying or relisting.
- A stream that ends (the server's ``timeoutSeconds``) reconnects from the current version.
- A stream silent for longer than ``inactivity_timeout_s`` is presumed dead (a half-open TCP
  connection is silent forever) and reconnects the same way.
- ``410 Gone`` (in the stream as an ERROR event or as the HTTP status) means the version is
  older than the server's event window: relist.
- Transient failures (5xx, 429, connection errors) back off with full jitter, capped, and
  retry the step that failed; anything else (401, 403, 404, ...) is raised to the consumer,
  which knows whether a missing resource is fatal.

Objects are raw dicts as the server sent them (camelCase), not generated models: the cache
keeps a few fields of many objects, and parsing each into a model would cost more than the
rest of the daemon. ``KubeEndpoint`` is one collection's path on the ``ApiServer``; its
``project`` turns each listed object into what the consumer keeps (or drops it) page by
page, so a LIST of 50,000 pods never holds more than one page of them whole.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager, aclosing, asynccontextmanager
from dataclasses import dataclass
from typing import Any, Literal, Protocol, cast

from reclaimd.backoff import Backoff
from reclaimd.cluster import errors
from reclaimd.cluster.apiserver import ApiServer
from reclaimd.settings.watch import WatchSettings

log = logging.getLogger(__name__)

RawObject = Mapping[str, Any]
ChangeType = Literal["ADDED", "MODIFIED", "DELETED"]
_CHANGE_TYPES: frozenset[str] = frozenset({"ADDED", "MODIFIED", "DELETED"})


@dataclass(frozen=True)
class Listed:
    """Everything that exists as of ``resource_version``: replace, do not merge.

    ``objects`` are raw objects, or what the endpoint's projection made of them."""

    objects: tuple[Any, ...]
    resource_version: str


@dataclass(frozen=True)
class Changed:
    type: ChangeType
    object: RawObject


WatchEvent = Listed | Changed


class Endpoint(Protocol):
    """One resource collection, as the watch loop needs it."""

    async def list(self) -> tuple[list[Any], str]:
        """Every object (raw, or projected) and the collection's resourceVersion."""
        ...

    def watch(
        self, resource_version: str, timeout_s: int
    ) -> AbstractAsyncContextManager[AsyncIterator[RawObject]]:
        """Raw watch events (``{"type": ..., "object": ...}``) after ``resource_version``."""
        ...


class _Relist(Exception):
    """The stream's resourceVersion is too old: take a new snapshot."""


class _Inactive(Exception):
    """The stream was silent past the inactivity timeout."""


class Progress(Protocol):
    """Told how a stream is doing, so its owner can say whether it is current."""

    def progressed(self) -> None:
        """A LIST, an event or a BOOKMARK arrived: the stream is current."""
        ...

    def failed(self, reason: str) -> None:
        """The stream is broken and backing off: what is held is no longer current."""
        ...


async def _pause(backoff: Backoff, hint_s: float | None, cap_s: float) -> None:
    # A server's Retry-After is a floor: coming back sooner only earns another 429.
    delay = backoff.next_delay()
    if hint_s is not None:
        delay = max(delay, min(hint_s, cap_s))
    await asyncio.sleep(delay)


async def watch_objects(
    endpoint: Endpoint,
    *,
    settings: WatchSettings = WatchSettings(),
    name: str = "",
    progress: Progress | None = None,
) -> AsyncGenerator[WatchEvent, None]:
    """``Listed``, then ``Changed`` events, relisting and reconnecting as the protocol says.
    ``progress`` hears of every step forward and every failure."""
    backoff = Backoff(settings.backoff_base_s, settings.backoff_cap_s)
    label = name or "watch"
    told = progress or _Nobody()
    while True:
        try:
            objects, resource_version = await endpoint.list()
        except errors.KubeError as e:
            if not e.retriable:
                told.failed(str(e))
                raise
            log.warning("%s: list failed, backing off: %s", label, e)
            told.failed(str(e))
            await _pause(backoff, e.retry_after_s, settings.backoff_cap_s)
            continue
        backoff.reset()
        told.progressed()
        listed = Listed(tuple(objects), resource_version)
        # Held only by the consumer from here: a pod deleted later is not kept alive by us.
        del objects
        yield listed
        del listed

        # Watch sessions from the listed version until the version expires.
        while True:
            try:
                async with aclosing(_one_session(endpoint, resource_version, settings)) as session:
                    async for event in session:
                        told.progressed()
                        if isinstance(event, str):
                            resource_version = event
                            continue
                        resource_version = _version_of(event.object) or resource_version
                        backoff.reset()
                        yield event
            except _Relist:
                log.info("%s: resourceVersion %s expired, relisting", label, resource_version)
                break
            except errors.Gone:
                log.info("%s: resourceVersion %s gone, relisting", label, resource_version)
                break
            except _Inactive:
                log.info(
                    "%s: stream silent for %.0fs, reconnecting",
                    label,
                    settings.inactivity_timeout_s,
                )
                continue
            except errors.KubeError as e:
                told.failed(str(e))
                if not e.retriable:
                    raise
                log.warning("%s: watch failed, backing off: %s", label, e)
                await _pause(backoff, e.retry_after_s, settings.backoff_cap_s)
                continue
            # The server closed the stream (its timeout): resume from where we are.


async def _one_session(
    endpoint: Endpoint, resource_version: str, settings: WatchSettings
) -> AsyncGenerator[Changed | str, None]:
    """One watch connection: ``Changed`` events, or a new resourceVersion (a BOOKMARK)."""
    async with endpoint.watch(resource_version, settings.server_timeout_s) as stream:
        iterator = aiter(stream)
        while True:
            try:
                async with asyncio.timeout(settings.inactivity_timeout_s) as scope:
                    raw = await anext(iterator)
            except StopAsyncIteration:
                return
            except TimeoutError as e:
                if scope.expired():
                    raise _Inactive from e
                raise errors.ServerError("watch", 0, "read timed out") from e
            kind = str(raw.get("type", ""))
            obj = raw.get("object")
            if not isinstance(obj, Mapping):
                log.warning("watch: event %r without an object, skipped", kind)
                continue
            if kind == "ERROR":
                code = int(obj.get("code") or 0)
                if code == 410:
                    raise _Relist
                raise errors.error_for("watch", code or 500, obj)
            if kind == "BOOKMARK":
                version = _version_of(obj)
                if version:
                    yield version
                continue
            if kind not in _CHANGE_TYPES:
                log.warning("watch: unknown event type %r, skipped", kind)
                continue
            yield Changed(cast(ChangeType, kind), obj)


class _Nobody:
    def progressed(self) -> None:
        return None

    def failed(self, reason: str) -> None:
        return None


def _version_of(obj: RawObject) -> str:
    metadata = obj.get("metadata")
    if isinstance(metadata, Mapping):
        return str(metadata.get("resourceVersion") or "")
    return ""


# --- the real endpoint ----------------------------------------------------------------------

Projection = Callable[[RawObject], object | None]


class KubeEndpoint:
    """An ``Endpoint`` over one collection's path (``apiserver.node()``, ``apiserver.pod("")``
    for every namespace, ...) with its query (``labelSelector``, ``fieldSelector``).

    ``project`` (listed objects only; watch events stay raw) maps each object to what is
    kept, None to drop it.
    """

    def __init__(
        self,
        api: ApiServer,
        path: str,
        what: str,
        *,
        page_size: int = WatchSettings().page_size,
        project: Projection | None = None,
        **params: str,
    ) -> None:
        self._api = api
        self._path = path
        self._what = what
        self._params = params
        self._page_size = page_size
        self._project = project

    async def list(self) -> tuple[list[Any], str]:
        objects: list[Any] = []
        token = ""
        while True:
            page: dict[str, Any] = {**self._params, "limit": self._page_size}
            if token:
                page["continue"] = token
            with errors.kube_errors(f"list {self._what}"):
                body = await self._api.get(self._path, **page)
            items = body.get("items") or []
            if self._project is None:
                objects.extend(items)
            else:
                objects.extend(p for p in map(self._project, items) if p is not None)
            metadata = body.get("metadata") or {}
            token = str(metadata.get("continue") or "")
            version = str(metadata.get("resourceVersion") or "")
            del body, items, metadata  # this page goes before the next one is read
            if not token:
                return objects, version

    @asynccontextmanager
    async def watch(
        self, resource_version: str, timeout_s: int
    ) -> AsyncIterator[AsyncIterator[RawObject]]:
        what = f"watch {self._what}"
        with errors.kube_errors(what):
            response = await self._api.stream(
                self._path,
                **self._params,
                watch=True,
                resourceVersion=resource_version,
                allowWatchBookmarks=True,
                timeoutSeconds=timeout_s,
            )
        try:
            yield _lines(response, what)
        finally:
            response.release()


async def _lines(response: Any, what: str) -> AsyncIterator[RawObject]:
    while True:
        with errors.kube_errors(what):
            line = await response.content.readline()
        if not line:
            return
        if not line.strip():
            continue
        try:
            event = json.loads(line)
        except ValueError as e:
            raise errors.ServerError(what, 0, "undecodable watch event") from e
        if isinstance(event, Mapping):
            yield event
