"""The watch policy (LIST, WATCH from the version, bookmarks, 410, silence, backoff) on
scripted streams. Each scenario is a named constant: what the server says, in order."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, cast

import pytest

from reclaimd.cluster import errors
from reclaimd.cluster.apiserver import ApiServer, ApiStatus
from reclaimd.cluster.watch import (
    Changed,
    KubeEndpoint,
    Listed,
    WatchEvent,
    watch_objects,
)
from reclaimd.settings.watch import WatchSettings

FAST = WatchSettings(inactivity_timeout_s=30.0, backoff_base_s=0.001, backoff_cap_s=0.001)


class Hang:
    """The stream goes silent without closing (a half-open connection)."""


HANG = Hang()


class ScriptDone(Exception):
    """The server has nothing more scripted: ends the test's iteration."""


def pod(name: str, rv: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "resourceVersion": rv}}


def event(kind: str, obj: Mapping[str, Any]) -> dict[str, Any]:
    return {"type": kind, "object": obj}


def bookmark(rv: str) -> dict[str, Any]:
    return event("BOOKMARK", {"kind": "Pod", "metadata": {"resourceVersion": rv}})


def error(code: int) -> dict[str, Any]:
    return event("ERROR", {"kind": "Status", "code": code, "message": "too old resource version"})


ListStep = tuple[list[Mapping[str, Any]], str] | Exception
StreamItem = Mapping[str, Any] | Exception | Hang
StreamStep = Sequence[StreamItem] | Exception


@dataclass
class ScriptedEndpoint:
    lists: list[ListStep]
    streams: list[StreamStep]
    list_calls: int = 0
    watched_from: list[str] = field(default_factory=list)

    async def list(self) -> tuple[list[Mapping[str, Any]], str]:
        self.list_calls += 1
        if not self.lists:
            raise ScriptDone
        step = self.lists.pop(0)
        if isinstance(step, Exception):
            raise step
        return step

    @asynccontextmanager
    async def watch(
        self, resource_version: str, timeout_s: int
    ) -> AsyncIterator[AsyncIterator[Mapping[str, Any]]]:
        self.watched_from.append(resource_version)
        if not self.streams:
            raise ScriptDone
        step = self.streams.pop(0)
        if isinstance(step, Exception):
            raise step
        yield _play(step)


async def _play(items: Sequence[StreamItem]) -> AsyncIterator[Mapping[str, Any]]:
    for item in items:
        if isinstance(item, Hang):
            await asyncio.Event().wait()
        elif isinstance(item, Exception):
            raise item
        else:
            yield item


async def collect(endpoint: ScriptedEndpoint, settings: WatchSettings = FAST) -> list[WatchEvent]:
    seen: list[WatchEvent] = []
    with pytest.raises(ScriptDone):
        async for ev in watch_objects(endpoint, settings=settings):
            seen.append(ev)
    return seen


def names(ev: WatchEvent) -> list[str]:
    objs = ev.objects if isinstance(ev, Listed) else (ev.object,)
    return [o["metadata"]["name"] for o in objs]


# --- scenarios ----------------------------------------------------------------------------

LIST_THEN_EVENTS_THEN_SERVER_CLOSE = dict(
    lists=[([pod("a", "9")], "10")],
    streams=[
        [
            event("ADDED", pod("b", "11")),
            event("MODIFIED", pod("a", "12")),
            event("DELETED", pod("b", "13")),
        ]
    ],
)
BOOKMARK_ONLY = dict(
    lists=[([], "10")],
    streams=[[bookmark("20")], [bookmark("25")]],
)
EXPIRED_IN_STREAM = dict(
    lists=[([pod("a", "9"), pod("b", "9")], "10"), ([pod("a", "30")], "31")],
    streams=[[event("ADDED", pod("c", "11")), error(410)], []],
)
GONE_ON_CONNECT = dict(
    lists=[([pod("a", "9")], "10"), ([pod("a", "9")], "40")],
    streams=[errors.Gone("watch pods", 410)],
)
SILENT_STREAM = dict(
    lists=[([], "10")],
    streams=[[event("ADDED", pod("a", "11")), HANG], [event("ADDED", pod("b", "12"))]],
)
LIST_FAILS_THEN_WORKS = dict(
    lists=[
        errors.ServerError("list pods", 503),
        errors.ServerError("list pods", 0),
        ([pod("a", "9")], "10"),
    ],
    streams=[],
)
STREAM_BREAKS_MIDWAY = dict(
    lists=[([], "10")],
    streams=[
        [event("ADDED", pod("a", "11")), errors.ServerError("watch pods", 0)],
        [event("ADDED", pod("b", "12"))],
    ],
)
LIST_FORBIDDEN = dict(
    lists=[errors.Forbidden("list pods", 403)],
    streams=[],
)
ERROR_EVENT_INTERNAL = dict(
    lists=[([], "10")],
    streams=[[event("ADDED", pod("a", "11")), error(500)], []],
)
ERROR_EVENT_FORBIDDEN = dict(
    lists=[([], "10")],
    streams=[[error(403)]],
)
UNKNOWN_AND_MALFORMED_EVENTS = dict(
    lists=[([], "10")],
    streams=[
        [
            {"type": "SURPRISE", "object": pod("x", "11")},
            {"type": "ADDED"},
            event("ADDED", pod("a", "12")),
        ]
    ],
)


def endpoint(scenario: Mapping[str, Any]) -> ScriptedEndpoint:
    return ScriptedEndpoint(lists=list(scenario["lists"]), streams=list(scenario["streams"]))


async def test_lists_then_watches_from_the_listed_version() -> None:
    ep = endpoint(LIST_THEN_EVENTS_THEN_SERVER_CLOSE)
    seen = await collect(ep)
    assert seen[0] == Listed((pod("a", "9"),), "10")
    assert [(e.type, names(e)) for e in seen[1:] if isinstance(e, Changed)] == [
        ("ADDED", ["b"]),
        ("MODIFIED", ["a"]),
        ("DELETED", ["b"]),
    ]
    assert len(seen) == 4
    # The server closed the stream: resume from the last event's version, no relist.
    assert ep.watched_from == ["10", "13"]
    assert ep.list_calls == 1


async def test_bookmarks_advance_the_version_and_are_not_emitted() -> None:
    ep = endpoint(BOOKMARK_ONLY)
    seen = await collect(ep)
    assert seen == [Listed((), "10")]
    assert ep.watched_from == ["10", "20", "25"]


async def test_410_in_stream_relists_and_the_snapshot_replaces() -> None:
    ep = endpoint(EXPIRED_IN_STREAM)
    seen = await collect(ep)
    listed = [e for e in seen if isinstance(e, Listed)]
    assert [names(e) for e in listed] == [["a", "b"], ["a"]]
    assert listed[1].resource_version == "31"
    assert ep.watched_from[:2] == ["10", "31"]


async def test_410_on_connect_relists() -> None:
    ep = endpoint(GONE_ON_CONNECT)
    seen = await collect(ep)
    assert [e.resource_version for e in seen if isinstance(e, Listed)] == ["10", "40"]
    assert ep.watched_from[0] == "10"
    assert ep.watched_from[1] == "40"


async def test_silent_stream_reconnects_from_the_current_version() -> None:
    ep = endpoint(SILENT_STREAM)
    seen = await collect(ep, WatchSettings(inactivity_timeout_s=0.05, backoff_base_s=0.001))
    assert [names(e) for e in seen if isinstance(e, Changed)] == [["a"], ["b"]]
    assert ep.watched_from == ["10", "11", "12"]
    assert ep.list_calls == 1  # a silent stream is reconnected, not relisted


async def test_transient_list_failures_back_off_and_retry() -> None:
    ep = endpoint(LIST_FAILS_THEN_WORKS)
    seen = await collect(ep)
    assert seen == [Listed((pod("a", "9"),), "10")]
    assert ep.list_calls == 3


async def test_broken_stream_resumes_without_relisting() -> None:
    ep = endpoint(STREAM_BREAKS_MIDWAY)
    seen = await collect(ep)
    assert [names(e) for e in seen if isinstance(e, Changed)] == [["a"], ["b"]]
    assert ep.watched_from == ["10", "11", "12"]
    assert ep.list_calls == 1


async def test_permanent_list_error_is_raised() -> None:
    ep = endpoint(LIST_FORBIDDEN)
    with pytest.raises(errors.Forbidden):
        async for _ in watch_objects(ep, settings=FAST):
            pass


async def test_internal_error_event_reconnects_from_the_version() -> None:
    ep = endpoint(ERROR_EVENT_INTERNAL)
    await collect(ep)
    assert ep.watched_from == ["10", "11", "11"]
    assert ep.list_calls == 1


async def test_forbidden_error_event_is_raised() -> None:
    ep = endpoint(ERROR_EVENT_FORBIDDEN)
    with pytest.raises(errors.Forbidden):
        async for _ in watch_objects(ep, settings=FAST):
            pass


async def test_unknown_and_malformed_events_are_skipped() -> None:
    ep = endpoint(UNKNOWN_AND_MALFORMED_EVENTS)
    seen = await collect(ep)
    assert [(e.type, names(e)) for e in seen if isinstance(e, Changed)] == [("ADDED", ["a"])]


async def test_closing_the_consumer_closes_the_stream() -> None:
    closed = asyncio.Event()

    class Tracking(ScriptedEndpoint):
        @asynccontextmanager
        async def watch(
            self, resource_version: str, timeout_s: int
        ) -> AsyncIterator[AsyncIterator[Mapping[str, Any]]]:
            try:
                yield _play([event("ADDED", pod("a", "11")), HANG])
            finally:
                closed.set()

    gen = watch_objects(Tracking(lists=[([], "10")], streams=[]), settings=FAST)
    assert isinstance(await anext(gen), Listed)
    assert isinstance(await anext(gen), Changed)
    await gen.aclose()
    assert closed.is_set()


class Heard:
    def __init__(self) -> None:
        self.said: list[str] = []

    def progressed(self) -> None:
        self.said.append("ok")

    def failed(self, reason: str) -> None:
        self.said.append("failed")


class FlakyList:
    """A LIST that fails once (503 with a Retry-After), then answers; no watch events."""

    def __init__(self) -> None:
        self.calls = 0

    async def list(self) -> tuple[list[Any], str]:
        self.calls += 1
        if self.calls == 1:
            raise errors.ServerError("list nodes", 503, retry_after_s=0.01)
        return [], "7"

    @asynccontextmanager
    async def watch(self, resource_version: str, timeout_s: int) -> AsyncIterator[Any]:
        async def nothing() -> AsyncIterator[Any]:
            await asyncio.sleep(3600)
            yield {}

        yield nothing()


async def test_progress_hears_of_failures_and_of_recovery() -> None:
    heard = Heard()
    gen = watch_objects(FlakyList(), settings=FAST, progress=heard)
    assert isinstance(await asyncio.wait_for(anext(gen), 5.0), Listed)
    await gen.aclose()
    assert heard.said == ["failed", "ok"]


# --- KubeEndpoint over the API server ---------------------------------------------------------


class WatchResponse:
    """An open watch response (what ``ApiServer.stream`` gives): JSON lines, then the end."""

    def __init__(self, events: Sequence[Mapping[str, Any]]) -> None:
        self.content = self
        self._lines = [json.dumps(e).encode() + b"\n" for e in events] + [b"\n"]
        self.released = False

    async def readline(self) -> bytes:
        return self._lines.pop(0) if self._lines else b""

    def release(self) -> None:
        self.released = True


@dataclass
class Api:
    """``ApiServer``'s ``get`` over scripted LIST pages (by continue token) and its ``stream``
    over scripted watch events; every call kept as (method, path, query)."""

    pages: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    events: Sequence[Mapping[str, Any]] = ()
    status: int = 200
    calls: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)
    responses: list[WatchResponse] = field(default_factory=list)

    async def get(self, path: str, **query: Any) -> Mapping[str, Any]:
        self.calls.append(("GET", path, query))
        if self.status != 200:
            raise ApiStatus(self.status, b'{"message": "pods is forbidden"}')
        return self.pages[query.get("continue", "")]

    async def stream(self, path: str, **query: Any) -> WatchResponse:
        self.calls.append(("STREAM", path, query))
        if self.status != 200:
            raise ApiStatus(self.status, b'{"message": "pods is forbidden"}')
        self.responses.append(WatchResponse(self.events))
        return self.responses[-1]


def pods_of(api: Api, **kwargs: Any) -> KubeEndpoint:
    return KubeEndpoint(cast(ApiServer, api), "/api/v1/namespaces/ns/pods", "pods", **kwargs)


async def test_list_pages_through_continue_and_projects_each_page() -> None:
    pages = {
        "": {"metadata": {"continue": "p2", "resourceVersion": "1"}, "items": [pod("a", "1")]},
        "p2": {
            "metadata": {"continue": "p3", "resourceVersion": "1"},
            "items": [pod("skip-b", "2"), pod("c", "3")],
        },
        "p3": {"metadata": {"resourceVersion": "40"}, "items": [pod("d", "4")]},
    }
    api = Api(pages)

    def project(obj: Mapping[str, Any]) -> str | None:
        name = str(obj["metadata"]["name"])
        return None if name.startswith("skip") else name.upper()

    projected = pods_of(api, page_size=2, project=project, labelSelector="gpu=yes")
    objects, version = await projected.list()
    assert (objects, version) == (["A", "C", "D"], "40")
    assert api.calls == [
        ("GET", "/api/v1/namespaces/ns/pods", {"labelSelector": "gpu=yes", "limit": 2}),
        (
            "GET",
            "/api/v1/namespaces/ns/pods",
            {"labelSelector": "gpu=yes", "limit": 2, "continue": "p2"},
        ),
        (
            "GET",
            "/api/v1/namespaces/ns/pods",
            {"labelSelector": "gpu=yes", "limit": 2, "continue": "p3"},
        ),
    ]

    raw, _ = await pods_of(api, page_size=2).list()
    assert [o["metadata"]["name"] for o in raw] == ["a", "skip-b", "c", "d"]


async def test_a_watch_asks_from_the_version_with_bookmarks_and_is_released() -> None:
    added = {"type": "ADDED", "object": pod("a", "41")}
    api = Api(events=[added, {"type": "BOOKMARK", "object": pod("", "42")}])
    async with pods_of(api, fieldSelector="spec.nodeName=n1").watch("40", 290) as events:
        got = [e async for e in events]
    assert got == [added, {"type": "BOOKMARK", "object": pod("", "42")}]
    assert api.calls == [
        (
            "STREAM",
            "/api/v1/namespaces/ns/pods",
            {
                "fieldSelector": "spec.nodeName=n1",
                "watch": True,
                "resourceVersion": "40",
                "allowWatchBookmarks": True,
                "timeoutSeconds": 290,
            },
        )
    ]
    assert api.responses[0].released


async def test_a_refused_list_or_watch_is_a_kube_error_of_its_status() -> None:
    api = Api(status=403)
    with pytest.raises(errors.Forbidden, match="list pods"):
        await pods_of(api).list()
    with pytest.raises(errors.Forbidden, match="watch pods"):
        async with pods_of(api).watch("1", 30):
            pass
