"""The fuzz bench's pure parts: the flat-memory rule, where real notices go, the table; and the
Azure route's answers against the real Scheduled Events poller, on loopback."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
from collections.abc import Callable

from aiohttp import web

from chaos.bench.fuzz import common as fuzz_common
from chaos.bench.fuzz import report as fuzz_report
from chaos.bench.fuzz import run as bench_fuzz
from chaos.fleet import NodeSpec
from chaos.standins import azure as azure_metadata_server
from chaos.standins import fuzzing
from chaos.standins.azure import Compute, preempt_document
from reclaimd import handlers
from reclaimd.handlers.azure_scheduled.settings import AzureScheduledSettings
from reclaimd.handlers.azure_scheduled.transport import (
    AzureScheduledSource,
    AzureStartRequests,
    DocumentState,
    Identity,
    envelope,
    version_of,
)
from reclaimd.intake import Admission
from reclaimd.model import Notice, NoticeKind, Target, Windows, utcnow


def test_memory_is_flat_when_the_last_quarter_stays_near_the_second() -> None:
    steady = [100.0] * 10 + [150.0] * 30
    assert fuzz_report._flat(steady)["flat"]
    growing = [100.0 + i * 5 for i in range(40)]
    assert not fuzz_report._flat(growing)["flat"]
    assert not fuzz_report._flat([1.0, 2.0])["flat"]  # too few samples to say


def test_real_notices_are_spread_among_the_hostile_ones() -> None:
    run = object.__new__(bench_fuzz.FuzzRun)
    run.args = argparse.Namespace(per_transport=10_000)
    at = run._spread("sqs")
    assert len(at) == fuzz_common.REAL["sqs"]
    assert min(at) > 0 and max(at) < 10_000


def test_bad_arguments_exit_2() -> None:
    assert bench_fuzz.main(["--per-transport", "1"]) == 2
    assert bench_fuzz.main(["--nodes", str(fuzz_common.MIN_NODES - 1)]) == 2


def _fleet(nodes: int) -> tuple[list[NodeSpec], ...]:
    run = object.__new__(bench_fuzz.FuzzRun)
    run.args = argparse.Namespace(nodes=nodes)
    run.run = "r1"
    return run._fleet()


def test_the_fleet_has_a_node_per_real_node_notice_azure_included() -> None:
    aws, gce, azure = _fleet(fuzz_common.MIN_NODES)
    assert len(aws) + len(gce) + len(azure) == fuzz_common.MIN_NODES
    assert len(azure) == fuzz_common.REAL["azure_scheduled"]
    assert sum(len(part) for part in _fleet(20)) == 20


def test_the_azure_nodes_real_preempt_is_one_notice_for_that_node() -> None:
    """What ``_expect`` records: the stand-in's compute metadata names the kwok node's VM (its
    providerID as AKS writes it), and the real document is one approvable Spot eviction."""
    (node,) = _fleet(20)[2]
    identity = Identity.from_compute(azure_metadata_server.compute_of(node).to_json())
    document = preempt_document(identity.vm_name, 9, 30)
    payload = json.dumps(envelope(identity, document, node.name)).encode()
    outcome = handlers.parse("azure-scheduled", payload, received_at=utcnow())
    assert isinstance(outcome, tuple)
    (notice,) = outcome
    assert notice.kind is NoticeKind.PREEMPTION
    assert notice.target == Target(node.instance_id, node.provider_id, node.name)
    assert notice.attributes["approvable"] == "true"


def test_every_scheduled_events_answer_is_a_new_document_to_the_poller() -> None:
    """Read as the poller reads (a document per new version): each hostile answer is one
    delivery, the real document one however often it is read, an idle one once."""
    events = fuzzing.ScheduledEvents(random.Random(5))
    poller, delivered = DocumentState(), [0]

    def read(times: int) -> None:
        for _ in range(times):
            if poller.observe(version_of(events.answer())):
                delivered[0] += 1
                poller.settled = True

    read(3)
    assert delivered == [1] and events.tally.hostile == events.tally.real == 0
    events.budget = 600
    read(600)
    assert events.budget == 0 and events.tally.hostile == 600 and delivered == [601]
    events.real = preempt_document("fuzz-vmss_0", events.next_incarnation(), 30)
    read(3)
    events.real = ""
    assert events.tally.real == 1 and events.real_reads == 3 and delivered == [602]
    read(2)
    assert delivered == [603]


async def _until(done: Callable[[], bool], timeout_s: float = 60) -> None:
    for _ in range(int(timeout_s / 0.02)):
        if done():
            return
        await asyncio.sleep(0.02)
    raise TimeoutError("condition not reached")


async def test_the_azure_route_against_the_real_poller() -> None:
    """The bench's Azure answers through AzureScheduledSource: every hostile document read and
    counted (refused or ignored, no notice, no poll failing), then the real Preempt admitted
    once and approved on the same route."""
    compute = Compute()
    state = fuzzing.MetadataState(
        {},
        {},
        random.Random(1),
        azure_compute=compute.to_json(),
        azure=fuzzing.ScheduledEvents(random.Random(2)),
    )
    runner = web.AppRunner(fuzzing.metadata_app(state), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    settings = AzureScheduledSettings(
        enabled=True, url=url, node_name=compute.computer_name, poll_interval_s=0.01
    )
    seen: list[Notice] = []

    async def admit(notice: Notice) -> Admission:
        seen.append(notice)
        return Admission.CLAIMED

    src = AzureScheduledSource(settings, admit=admit, windows=Windows())
    task = asyncio.create_task(src.run())
    events, counters = state.azure, src.counters
    try:
        await _until(lambda: counters.received == 1)  # the idle document
        events.budget = 150
        await _until(lambda: events.budget == 0 and counters.received >= 151)
        await asyncio.sleep(0.1)
        assert events.tally.hostile == 150 and seen == []
        assert counters.transport_errors == 0
        assert counters.received == counters.parse_errors + counters.ignored
        events.real = preempt_document(compute.name, events.next_incarnation(), 30)
        await _until(lambda: len(seen) == 1 and events.real_reads >= 3)
        events.real = ""
        assert events.tally.real == 1 and counters.notices == 1
        await AzureStartRequests(settings).finished(seen[0], drained=True)
        assert events.approvals == 1
        assert state.served["azure_scheduled"] is events.tally
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await runner.cleanup()
