"""Azure Scheduled Events transport (handlers/azure_scheduled/transport.py): incarnation
tracking, the envelope, the StartRequests approval; and the poller against
chaos/standins/azure.py, our stand-in for IMDS (no emulator of it exists), on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import MappingProxyType
from typing import Any

import aiohttp
import pytest

from chaos.standins.azure import AzureMetadataServer, Compute, rfc1123
from reclaimd import handlers
from reclaimd.afterdrain import AfterDrain
from reclaimd.handlers.azure_scheduled.settings import AzureScheduledSettings
from reclaimd.handlers.azure_scheduled.transport import (
    AzureScheduledSource,
    AzureStartRequests,
    DocumentState,
    Identity,
    MetadataError,
    approvable_event,
    envelope,
    version_of,
)
from reclaimd.handlers.fields import as_gmt_time
from reclaimd.intake import Admission
from reclaimd.model import Notice, NoticeKind, Response, Target, Windows, stable_id

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "azure"
COMPUTE = Compute()
VM = COMPUTE.name
NODE = "aks-spotgpu-12345678-vmss000003"
PROVIDER_ID = "azure://" + COMPUTE.resource_id.replace(
    COMPUTE.resource_group, COMPUTE.resource_group.lower()
)
META = {"Metadata": "true"}


# --- pure parts -----------------------------------------------------------------------------


def test_the_compute_fixture_is_this_vm_and_the_stand_ins_default() -> None:
    compute = json.loads((FIXTURES / "instance-compute-aks-spot.json").read_text())
    identity = Identity.from_compute(compute)
    assert identity == Identity.from_compute(COMPUTE.to_json())
    assert identity == Identity(
        vm_name=VM,
        resource_id=COMPUTE.resource_id,
        vm_size="Standard_ND96isr_H100_v5",
        priority="Spot",
        location="eastus",
        zone="1",
    )
    assert compute["osProfile"]["computerName"] == COMPUTE.computer_name == NODE


def test_compute_without_a_name_is_not_imds() -> None:
    with pytest.raises(MetadataError, match="without a VM name"):
        Identity.from_compute({"vmSize": "Standard_D2s_v3"})


def test_envelope_is_what_the_parser_reads() -> None:
    identity = Identity.from_compute(COMPUTE.to_json())
    document = (FIXTURES / "scheduledevents-preempt-aks-spot.json").read_text()
    body = envelope(identity, document, NODE)
    assert body["document"] == document  # as received: the digest covers the platform's bytes
    received = datetime(2025, 1, 15, 12, 0, 2, tzinfo=UTC)
    outcome = handlers.parse(
        "azure-scheduled", json.dumps(body).encode(), received_at=received, windows=Windows()
    )
    assert isinstance(outcome, tuple)
    (notice,) = outcome
    assert notice.id == stable_id(
        "azure.scheduled.preempt", VM, "5DD55B64-45AD-49D3-BBC9-F57D4EA97BD7"
    )
    assert notice.target == Target(instance_id=VM, provider_id=PROVIDER_ID, node_name=NODE)
    assert approvable_event(notice) == "5DD55B64-45AD-49D3-BBC9-F57D4EA97BD7"


def test_a_document_is_known_by_its_incarnation() -> None:
    assert version_of('{"DocumentIncarnation": 7, "Events": []}') == "incarnation:7"
    assert version_of('{"DocumentIncarnation": 7, "Events": [{}]}') == "incarnation:7"
    # Without one it is known by its bytes: delivered once, for the parser to refuse.
    a, b = version_of('{"Events": []}'), version_of("not json")
    assert a.startswith("sha256:") and b.startswith("sha256:") and a != b
    assert version_of('{"DocumentIncarnation": true}').startswith("sha256:")


def test_a_document_is_delivered_until_settled_then_not_until_it_changes() -> None:
    state = DocumentState()
    assert state.observe("incarnation:1") is True
    assert state.observe("incarnation:1") is True  # not settled: deliver again
    state.settled = True
    assert state.observe("incarnation:1") is False
    assert state.observe("incarnation:2") is True
    assert state.settled is False


def notice(**attributes: str) -> Notice:
    now = datetime.now(UTC)
    return Notice(
        id="n-1",
        source=attributes.pop("source", "azure.scheduled.preempt"),
        kind=NoticeKind.PREEMPTION,
        target=Target(instance_id=VM),
        issued_at=now,
        deadline=now + timedelta(seconds=30),
        received_at=now,
        response=Response.FULL,
        attributes=MappingProxyType(attributes),
    )


def test_start_requests_is_an_after_drain_part() -> None:
    part: AfterDrain = AzureStartRequests(AzureScheduledSettings())  # mypy checks the protocol
    assert isinstance(part.holding(notice()), contextlib.AbstractAsyncContextManager)


def test_only_approvable_azure_notices_are_approved() -> None:
    assert approvable_event(notice(event_id="E1", approvable="true")) == "E1"
    assert approvable_event(notice(event_id="E1")) == ""  # several resources, or started
    assert approvable_event(notice(event_id="E1", approvable="true", source="aws.imds.spot")) == ""


# --- the stand-in server's semantics ---------------------------------------------------------


@pytest.fixture
async def server() -> AsyncIterator[AzureMetadataServer]:
    async with AzureMetadataServer(started_s=0.3) as s:
        yield s


async def _call(
    method: str, url: str, headers: dict[str, str] | None = None, **kwargs: Any
) -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession() as http,
        http.request(method, url, headers=headers, **kwargs) as r,
    ):
        text = await r.text()
        return r.status, json.loads(text) if text else None


def events_url(server: AzureMetadataServer) -> str:
    return f"{server.url}/metadata/scheduledevents?api-version=2020-07-01"


async def test_server_requires_the_metadata_header_and_a_version(
    server: AzureMetadataServer,
) -> None:
    status, body = await _call("GET", events_url(server))
    assert (status, body["error"]) == (400, "Bad request. Required metadata header not specified")
    status, _ = await _call("GET", events_url(server), {**META, "X-Forwarded-For": "10.0.0.1"})
    assert status == 400
    status, body = await _call("GET", f"{server.url}/metadata/scheduledevents", META)
    assert status == 400 and body["newest-versions"][0] == "2020-07-01"
    status, body = await _call("GET", events_url(server), META)
    assert (status, body) == (200, {"DocumentIncarnation": 1, "Events": []})
    status, _ = await _call("POST", events_url(server), json={"StartRequests": []})
    assert status == 400


async def test_server_serves_the_compute_metadata(server: AzureMetadataServer) -> None:
    url = f"{server.url}/metadata/instance/compute?api-version=2021-02-01"
    status, body = await _call("GET", url, META)
    assert (status, body["name"], body["priority"]) == (200, VM, "Spot")
    assert body["resourceId"] == COMPUTE.resource_id


async def test_a_scheduled_event_follows_the_published_schema(server: AzureMetadataServer) -> None:
    before = datetime.now(UTC).replace(microsecond=0)
    event_id = server.preempt(not_before_s=30)
    _, body = await _call("GET", events_url(server), META)
    assert body["DocumentIncarnation"] == 2
    (event,) = body["Events"]
    assert event == {
        "EventId": event_id,
        "EventStatus": "Scheduled",
        "EventType": "Preempt",
        "ResourceType": "VirtualMachine",
        "Resources": [VM],
        "NotBefore": event["NotBefore"],
        "Description": "",
        "EventSource": "Platform",
        "DurationInSeconds": -1,
    }
    not_before = as_gmt_time(event["NotBefore"], "NotBefore")
    assert before + timedelta(seconds=29) <= not_before <= before + timedelta(seconds=32)
    assert rfc1123(not_before) == event["NotBefore"]


async def test_start_requests_start_the_event_then_it_leaves(server: AzureMetadataServer) -> None:
    event_id = server.preempt(not_before_s=60)
    status, _ = await _call(
        "POST", events_url(server), META, json={"StartRequests": [{"EventId": event_id}]}
    )
    assert status == 200
    _, body = await _call("GET", events_url(server), META)
    assert body["DocumentIncarnation"] == 3
    assert (body["Events"][0]["EventStatus"], body["Events"][0]["NotBefore"]) == ("Started", "")
    await _until(lambda: server.event(event_id) is None)
    assert server.document() == {"DocumentIncarnation": 4, "Events": []}
    assert server.approvals == [event_id]


async def test_server_start_requests_edge_cases(server: AzureMetadataServer) -> None:
    for bad in ("{", json.dumps({"StartRequests": [{}]}), json.dumps({"Start": []})):
        status, _ = await _call("POST", events_url(server), META, data=bad)
        assert status == 400
    # Well formed but unknown (approved by another VM, gone): 200, and nothing changes.
    status, _ = await _call(
        "POST", events_url(server), META, json={"StartRequests": [{"EventId": "NOPE"}]}
    )
    assert (status, server.incarnation) == (200, 1)


async def test_an_unapproved_event_starts_at_its_not_before(server: AzureMetadataServer) -> None:
    started: list[dict[str, Any]] = []

    async def on_start(event: dict[str, Any]) -> None:
        started.append(event)

    server.on_start = on_start
    event_id = server.schedule("Terminate", not_before_s=0.2)
    await _until(lambda: len(started) == 1)
    assert started[0]["EventId"] == event_id and started[0]["EventStatus"] == "Started"
    await _until(lambda: server.event(event_id) is None)
    assert server.approvals == []


async def test_a_canceled_event_leaves_unstarted(server: AzureMetadataServer) -> None:
    event_id = server.schedule("Reboot", not_before_s=60, source="User")
    assert server.cancel(event_id) is True
    assert server.document() == {"DocumentIncarnation": 3, "Events": []}
    assert server.cancel(event_id) is False
    with pytest.raises(ValueError, match="Hibernate"):
        server.schedule("Hibernate")


async def test_server_control_endpoint_schedules_for_a_drill(server: AzureMetadataServer) -> None:
    status, body = await _call(
        "POST",
        f"{server.url}/chaos/v1/events",
        json={"EventType": "Preempt", "NotBeforeSeconds": 30},
    )
    assert status == 200
    assert server.event(body["EventId"]) is not None
    status, _ = await _call("POST", f"{server.url}/chaos/v1/events", json={"EventType": "Nap"})
    assert status == 400


# --- the poller against the stand-in ---------------------------------------------------------


class Admissions:
    def __init__(self, *answers: Admission) -> None:
        self.answers = list(answers)
        self.seen: list[Notice] = []

    async def __call__(self, notice: Notice) -> Admission:
        self.seen.append(notice)
        return self.answers.pop(0) if self.answers else Admission.CLAIMED


async def _until(cond: Callable[[], bool], timeout_s: float = 20) -> None:
    """Poll ``cond``: the poller's progress is visible only as state, not as an event."""
    for _ in range(int(timeout_s / 0.02)):
        if cond():
            return
        await asyncio.sleep(0.02)
    raise TimeoutError("condition not reached")


def settings(server: AzureMetadataServer, **changes: Any) -> AzureScheduledSettings:
    fields: dict[str, Any] = {
        "enabled": True,
        "url": server.url,
        "node_name": NODE,
        "poll_interval_s": 0.05,
        **changes,
    }
    return AzureScheduledSettings(**fields)


@contextlib.asynccontextmanager
async def polling(
    server: AzureMetadataServer, admit: Admissions
) -> AsyncIterator[AzureScheduledSource]:
    src = AzureScheduledSource(settings(server), admit=admit, windows=Windows())
    task = asyncio.create_task(src.run())
    try:
        yield src
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def gets(server: AzureMetadataServer) -> int:
    return sum(1 for m, p in server.requests if (m, p) == ("GET", "/metadata/scheduledevents"))


async def test_poller_parses_a_document_once_per_incarnation(server: AzureMetadataServer) -> None:
    admit = Admissions()
    async with polling(server, admit) as src:
        await _until(lambda: gets(server) >= 5)
        assert src.identity == Identity.from_compute(COMPUTE.to_json())
        assert src.counters.received == 1  # five polls, one incarnation, one parse
        assert src.counters.ignored == 1  # no events
        assert admit.seen == []


async def test_poller_admits_a_preemption_and_approves_it_after_the_drain(
    server: AzureMetadataServer,
) -> None:
    admit = Admissions()
    async with polling(server, admit) as src:
        await _until(lambda: src.counters.received == 1)
        event_id = server.preempt(not_before_s=30)
        await _until(lambda: len(admit.seen) == 1)
        (notice,) = admit.seen
        assert notice.id == stable_id("azure.scheduled.preempt", VM, event_id)
        assert notice.target == Target(instance_id=VM, provider_id=PROVIDER_ID, node_name=NODE)
        assert notice.deadline == as_gmt_time(server.event(event_id)["NotBefore"], "t")  # type: ignore[index]
        assert src.counters.by_admission == {"claimed": 1}

        ack = AzureStartRequests(settings(server))
        async with ack.holding(notice):
            pass  # the drain
        await ack.finished(notice, drained=True)
        assert server.approvals == [event_id]
        assert ack.counters.approved == 1
        # The Started document maps to the same notice; then the event leaves the document.
        await _until(lambda: len(admit.seen) == 2)
        assert admit.seen[1].id == notice.id
        assert admit.seen[1].attributes["event_status"] == "Started"
        await _until(lambda: server.event(event_id) is None)
        await ack.finished(notice, drained=True)  # a resumed notice: approved once
        assert server.approvals == [event_id]


async def test_poller_delivers_again_until_the_claim_is_stored(
    server: AzureMetadataServer,
) -> None:
    admit = Admissions(Admission.RETRY, Admission.RETRY, Admission.CLAIMED)
    server.preempt(not_before_s=60)
    async with polling(server, admit) as src:
        await _until(lambda: len(admit.seen) == 3)
        await _until(lambda: gets(server) >= 8)
        assert len({n.id for n in admit.seen}) == 1
        assert src.counters.by_admission == {"retry": 2, "claimed": 1}
        assert src.counters.left_for_redelivery == 2 and src.counters.acked == 1
        assert len(admit.seen) == 3  # settled: the same incarnation is not parsed again


async def test_an_undrained_or_shared_event_is_not_approved(server: AzureMetadataServer) -> None:
    ack = AzureStartRequests(settings(server))
    event_id = server.preempt(not_before_s=60)
    await ack.finished(notice(event_id=event_id, approvable="true"), drained=False)
    await ack.finished(notice(event_id=event_id), drained=True)  # several resources
    no_approve = AzureStartRequests(settings(server, approve=False))
    await no_approve.finished(notice(event_id=event_id, approvable="true"), drained=True)
    assert server.approvals == []
    assert ack.counters.not_drained == 1
    assert server.event(event_id)["EventStatus"] == "Scheduled"  # type: ignore[index]


async def test_approval_against_a_dead_imds_gives_up_without_raising() -> None:
    async with AzureMetadataServer() as gone:
        dead = settings(gone)
    ack = AzureStartRequests(dead)
    await ack.finished(notice(event_id="E1", approvable="true"), drained=True)
    assert (ack.counters.approved, ack.counters.errors) == (0, AzureStartRequests.ATTEMPTS)


async def test_poller_counts_a_server_that_refuses_it_and_keeps_going() -> None:
    async with AzureMetadataServer() as server:
        admit = Admissions()
        src = AzureScheduledSource(
            settings(server, url=server.url + "/nope"), admit=admit, windows=Windows()
        )
        task = asyncio.create_task(src.run())
        try:
            await _until(lambda: src.counters.transport_errors >= 2)
            assert src.identity is None and admit.seen == []
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def test_the_drills_expected_notice_is_what_the_poller_admits(
    server: AzureMetadataServer,
) -> None:
    """chaos.drill.injector judges an azure-scheduled notice by the envelope it builds from the
    stand-in: the poller must make the same notice of the same event."""
    from chaos.drill.injector import azure_envelope

    admit = Admissions()
    async with polling(server, admit) as src:
        await _until(lambda: src.counters.received == 1)
        event_id = server.preempt(not_before_s=30)
        expected = handlers.parse(
            "azure-scheduled",
            json.dumps(azure_envelope(server, event_id, NODE)).encode(),
            received_at=datetime.now(UTC),
            windows=Windows(),
        )
        await _until(lambda: len(admit.seen) == 1)
    assert isinstance(expected, tuple)
    (want,) = expected
    (got,) = admit.seen
    assert (got.id, got.deadline, got.target, got.response) == (
        want.id, want.deadline, want.target, want.response,
    )  # fmt: skip
