"""GCE metadata transport (handlers/gce_metadata/transport.py): envelope building, ETag
handling, the Metadata-Flavor check; and the watcher against chaos/standins/gce.py,
our stand-in for the metadata server (no emulator of it exists), on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta

import aiohttp
import pytest
from multidict import CIMultiDict

from chaos.standins.gce import GceMetadataServer
from reclaimd import handlers
from reclaimd.handlers.gce_metadata import transport as gce_metadata
from reclaimd.handlers.gce_metadata.settings import GceMetadataSettings
from reclaimd.handlers.gce_metadata.transport import (
    GceMetadataSource,
    Identity,
    KeyState,
    MetadataError,
    check_flavor,
    envelope,
)
from reclaimd.intake import Admission
from reclaimd.model import Notice, NoticeKind, Response, Target, Windows, stable_id

PROJECT, ZONE, VM = "reclaimd-local", "us-central1-a", "gke-pool-a-0001"
IDENTITY = Identity(project=PROJECT, zone=ZONE, instance=VM)
OBSERVED = datetime(2025, 9, 16, 10, 42, 1, tzinfo=UTC)


# --- pure parts -----------------------------------------------------------------------------


def test_identity_takes_the_zone_from_its_resource_path() -> None:
    got = Identity.from_values(
        project="reclaimd-local\n", zone="projects/123456789012/zones/us-central1-a", name=VM
    )
    assert got == IDENTITY


def test_envelope_is_what_the_parser_reads() -> None:
    body = envelope(IDENTITY, "instance/preempted", "TRUE\n", "e-1", OBSERVED)
    assert body == {
        "instance": VM,
        "project": PROJECT,
        "zone": ZONE,
        "path": "instance/preempted",
        "value": "TRUE",
        "etag": "e-1",
        "observed_at": "2025-09-16T10:42:01Z",
    }
    outcome = handlers.parse(
        "gce-metadata", json.dumps(body).encode(), received_at=OBSERVED, windows=Windows()
    )
    assert isinstance(outcome, tuple)
    (notice,) = outcome
    assert notice.id == stable_id("gcp.metadata.preempted", PROJECT, ZONE, VM, "TRUE", "e-1")
    assert notice.kind is NoticeKind.PREEMPTION
    assert notice.target == Target(provider_id=f"gce://{PROJECT}/{ZONE}/{VM}", node_name=VM)
    assert notice.deadline == OBSERVED + timedelta(seconds=30)


def test_first_read_is_plain_then_a_hanging_get_on_the_settled_etag() -> None:
    state = KeyState()
    assert state.query(60) == {}
    assert state.observe("e-1") is True  # a new value: deliver it
    assert state.query(60) == {}  # not settled yet: read again, do not hang
    state.settled = True
    assert state.query(60) == {
        "wait_for_change": "true",
        "last_etag": "e-1",
        "timeout_sec": "60",
    }
    assert state.observe("e-1") is False  # a timed-out wait: same value, nothing to deliver
    assert state.observe("e-2") is True  # changed: deliver, and unsettle until admitted
    assert state.query(60) == {}


def test_timeout_sec_is_a_positive_integer() -> None:
    state = KeyState(etag="e", settled=True)
    assert state.query(0.2)["timeout_sec"] == "1"
    assert state.query(12.7)["timeout_sec"] == "12"


def test_a_response_without_the_flavor_header_is_refused() -> None:
    check_flavor({"Metadata-Flavor": "Google"}, "u")
    with pytest.raises(MetadataError, match="Metadata-Flavor"):
        check_flavor({}, "u")
    with pytest.raises(MetadataError):
        check_flavor({"Metadata-Flavor": "Amazon"}, "u")


# --- the stand-in server's semantics ---------------------------------------------------------


@pytest.fixture
async def server() -> AsyncIterator[GceMetadataServer]:
    async with GceMetadataServer(project=PROJECT, zone=ZONE, instance=VM) as s:
        yield s


GOOGLE = {"Metadata-Flavor": "Google"}


async def _get(
    url: str, headers: dict[str, str] | None = None, **params: str
) -> tuple[int, str, CIMultiDict[str]]:
    async with aiohttp.ClientSession() as http, http.get(url, headers=headers, params=params) as r:
        return r.status, await r.text(), r.headers.copy()


async def test_server_refuses_a_request_without_the_header(server: GceMetadataServer) -> None:
    url = f"{server.url}/computeMetadata/v1/instance/name"
    status, _, _ = await _get(url)
    assert status == 403
    status, _, _ = await _get(url, headers={**GOOGLE, "X-Forwarded-For": "10.0.0.1"})
    assert status == 403
    status, text, headers = await _get(url, headers=GOOGLE)
    assert (status, text, headers["Metadata-Flavor"]) == (200, VM, "Google")
    assert (await _get(f"{server.url}/computeMetadata/v1/instance/nope", headers=GOOGLE))[0] == 404


async def test_server_answers_a_stale_etag_at_once_and_a_current_one_on_change(
    server: GceMetadataServer,
) -> None:
    url = f"{server.url}/computeMetadata/v1/instance/preempted"
    _, value, headers = await _get(url, headers=GOOGLE)
    first = headers["ETag"]
    assert value == "FALSE"
    # A stale ETag: the caller missed a change, so no wait.
    status, value, headers = await _get(
        url, headers=GOOGLE, wait_for_change="true", last_etag="stale"
    )
    assert (status, value, headers["ETag"]) == (200, "FALSE", first)
    # The current ETag hangs until the value changes.
    hanging = asyncio.create_task(
        _get(url, headers=GOOGLE, wait_for_change="true", last_etag=first)
    )
    await _until(lambda: server.waiting == 1)
    assert not hanging.done()
    new = await server.set("instance/preempted", "TRUE")
    status, value, headers = await hanging
    assert (status, value, headers["ETag"]) == (200, "TRUE", new)
    assert new != first


async def test_server_timeout_sec_returns_the_unchanged_value(server: GceMetadataServer) -> None:
    url = f"{server.url}/computeMetadata/v1/instance/maintenance-event"
    etag = server.etag("instance/maintenance-event")
    _, value, headers = await _get(
        url, headers=GOOGLE, wait_for_change="true", last_etag=etag, timeout_sec="1"
    )
    assert (value, headers["ETag"]) == ("NONE", etag)
    bad = await _get(url, headers=GOOGLE, wait_for_change="true", timeout_sec="0")
    assert bad[0] == 400


async def test_setting_the_same_value_again_is_a_new_etag(server: GceMetadataServer) -> None:
    a = await server.set("instance/maintenance-event", "TERMINATE_ON_HOST_MAINTENANCE")
    await server.set("instance/maintenance-event", "NONE")
    b = await server.set("instance/maintenance-event", "TERMINATE_ON_HOST_MAINTENANCE")
    assert a != b


# --- the watcher against the stand-in ---------------------------------------------------------


class Admissions:
    def __init__(self, *answers: Admission) -> None:
        self.answers = list(answers)
        self.seen: list[Notice] = []

    async def __call__(self, notice: Notice) -> Admission:
        self.seen.append(notice)
        return self.answers.pop(0) if self.answers else Admission.CLAIMED


async def _until(cond: Callable[[], bool], timeout_s: float = 20) -> None:
    """Poll ``cond``: the watcher's progress is visible only as state, not as an event."""
    for _ in range(int(timeout_s / 0.02)):
        if cond():
            return
        await asyncio.sleep(0.02)
    raise TimeoutError("condition not reached")


@contextlib.asynccontextmanager
async def watching(
    server: GceMetadataServer, admit: Callable[[Notice], Awaitable[Admission]]
) -> AsyncIterator[GceMetadataSource]:
    settings = GceMetadataSettings(enabled=True, url=server.url, node_name=VM, timeout_s=30)
    src = GceMetadataSource(settings, admit=admit, windows=Windows())
    task = asyncio.create_task(src.run())
    try:
        yield src
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_watcher_reads_identity_then_hangs_on_both_keys(server: GceMetadataServer) -> None:
    admit = Admissions()
    async with watching(server, admit) as src:
        await _until(lambda: server.waiting == 2)
        assert src.identity == IDENTITY
        hangs = [q for k, q in server.requests if q.get("wait_for_change") == "true"]
        assert {q["last_etag"] for q in hangs} == {
            server.etag("instance/preempted"),
            server.etag("instance/maintenance-event"),
        }
        assert all(q["timeout_sec"] == "30" for q in hangs)
        assert admit.seen == []  # FALSE and NONE are no notices
        assert src.counters.ignored == 2


async def test_watcher_admits_a_preemption_when_the_key_flips(server: GceMetadataServer) -> None:
    admit = Admissions()
    async with watching(server, admit) as src:
        await _until(lambda: server.waiting == 2)
        etag = await server.set("instance/preempted", "TRUE")
        await _until(lambda: len(admit.seen) == 1)
        await _until(lambda: server.waiting == 2)  # settled: hanging again, on the new ETag
        (notice,) = admit.seen
        assert notice.id == stable_id("gcp.metadata.preempted", PROJECT, ZONE, VM, "TRUE", etag)
        assert notice.target.node_name == VM
        assert src.counters.by_admission == {"claimed": 1}
        assert src.states["instance/preempted"] == KeyState(etag=etag, settled=True)


async def test_watcher_delivers_again_until_the_claim_is_stored(
    server: GceMetadataServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gce_metadata, "RETRY_PAUSE_S", 0.05)
    admit = Admissions(Admission.RETRY, Admission.RETRY, Admission.CLAIMED)
    async with watching(server, admit) as src:
        await _until(lambda: server.waiting == 2)
        await server.set("instance/maintenance-event", "TERMINATE_ON_HOST_MAINTENANCE")
        await _until(lambda: len(admit.seen) == 3)
        await _until(lambda: server.waiting == 2)
        assert len({n.id for n in admit.seen}) == 1
        assert admit.seen[0].kind is NoticeKind.MAINTENANCE
        assert admit.seen[0].response is Response.FULL
        assert src.counters.by_admission == {"retry": 2, "claimed": 1}
        assert len(admit.seen) == 3  # settled: no fourth delivery


async def test_watcher_acts_at_once_on_a_value_set_before_it_started(
    server: GceMetadataServer,
) -> None:
    etag = await server.set("instance/preempted", "TRUE")  # a restart mid-notice
    admit = Admissions()
    async with watching(server, admit):
        await _until(lambda: len(admit.seen) == 1)
        assert admit.seen[0].id == stable_id(
            "gcp.metadata.preempted", PROJECT, ZONE, VM, "TRUE", etag
        )


async def test_watcher_refuses_a_server_that_does_not_say_it_is_one() -> None:
    admit = Admissions()
    async with GceMetadataServer(
        project=PROJECT, zone=ZONE, instance=VM, flavor_header=False
    ) as server:
        await server.set("instance/preempted", "TRUE")
        async with watching(server, admit) as src:
            await _until(lambda: src.counters.transport_errors >= 2)
            assert src.identity is None
            assert admit.seen == []
