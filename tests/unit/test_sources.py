"""The source registry (handlers/__init__.py, handlers/entry.py), the one delivery step every
transport uses (handlers/transport.py: deliver), and the after-drain parts (reclaimd/afterdrain.py,
handlers/sqs/lifecycle.py's pure side). No network: payloads are the shared samples."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from shared_fixtures import FIXTURES

from reclaimd import handlers
from reclaimd.afterdrain import AfterDrains, NoAfterDrain
from reclaimd.config import Settings
from reclaimd.handlers import running
from reclaimd.handlers.azure_scheduled.transport import AzureStartRequests
from reclaimd.handlers.imds import parser as imds_handler
from reclaimd.handlers.imds import transport as imds_transport
from reclaimd.handlers.sqs.lifecycle import AsgLifecycle, LifecycleAction
from reclaimd.handlers.transport import Counters, Read, deliver
from reclaimd.intake import Admission
from reclaimd.model import Notice, Windows, utcnow

AWS = FIXTURES / "aws"
PARSE = imds_handler.parse
INSTANCE = "i-0123456789abcdef0"


def imds_payload(path: str, body: Any) -> bytes:
    return json.dumps({"instance_id": INSTANCE, "path": path, "body": body}).encode()


def two_events() -> bytes:
    """One IMDS body carrying two active scheduled events: two notices in one payload."""
    events = json.loads((AWS / "imds-scheduled-events.json").read_text())
    second = {**events[0], "EventId": "instance-event-0aaaaaaaaaaaaaaaa"}
    return imds_payload("events/maintenance/scheduled", json.dumps([events[0], second]))


class Script:
    """Stands in for ``Intake.admit``: answers from a list, records every call."""

    def __init__(self, *answers: Admission | Exception) -> None:
        self.answers, self.calls = list(answers), list[Notice]()

    async def admit(self, notice: Notice) -> Admission:
        self.calls.append(notice)
        answer = self.answers.pop(0) if self.answers else Admission.CLAIMED
        if isinstance(answer, Exception):
            raise answer
        return answer


# --- the registry ---------------------------------------------------------------------------


def test_every_entry_names_a_parser_and_a_settings_section_of_its_model() -> None:
    names = [e.name for e in handlers.REGISTRY]
    assert len(set(names)) == len(names)
    for entry in handlers.REGISTRY:
        assert handlers.PARSERS[entry.name] is entry.parse, entry.name
        field = Settings.model_fields[entry.name]
        assert field.annotation is entry.model, entry.name
        assert "enabled" in entry.model.model_fields, entry.name


def test_every_parser_has_a_source() -> None:
    assert {e.name for e in handlers.REGISTRY} == set(handlers.PARSERS)


def test_nothing_enabled_builds_nothing() -> None:
    assert running.build(Settings(), admit=Script().admit) == {}
    assert isinstance(running.after_drain(Settings()), NoAfterDrain)


def enable_all() -> Settings:
    return Settings.model_validate(
        {
            "sqs": {"enabled": True, "queue_url": "http://127.0.0.1:1/q", "endpoint_url": "http://127.0.0.1:1"},
            "imds": {"enabled": True},
            "pubsub": {"enabled": True, "project": "p", "subscription": "s"},
            "gce_metadata": {"enabled": True},
            "azure_scheduled": {"enabled": True},
            "kueue": {"enabled": True},
            "kafka_notices": {"enabled": True, "bootstrap": "127.0.0.1:1"},
        }
    )


def test_each_enabled_source_is_built_with_its_entrys_parser_and_settings() -> None:
    settings = enable_all()
    built = running.build(settings, admit=Script().admit)
    assert list(built) == [e.name for e in handlers.REGISTRY]
    for entry in handlers.REGISTRY:
        source: Any = built[entry.name]
        assert source.parser is entry.parse, entry.name
        assert source.settings is entry.section(settings), entry.name
        assert isinstance(source.counters, Counters)
    assert set(running.counters(built)) == set(built)


def test_only_enabled_sources_are_built() -> None:
    settings = Settings.model_validate({"imds": {"enabled": True}, "kueue": {"enabled": False}})
    assert list(running.build(settings, admit=Script().admit)) == ["imds"]


def test_the_sqs_entry_carries_the_lifecycle_after_drain_part() -> None:
    settings = Settings.model_validate({"sqs": {"enabled": True, "queue_url": "q"}})
    assert isinstance(running.after_drain(settings), AsgLifecycle)


def test_the_azure_entry_approves_its_events_after_the_drain() -> None:
    settings = Settings.model_validate({"azure_scheduled": {"enabled": True}})
    part = running.after_drain(settings)
    assert isinstance(part, AzureStartRequests) and part.settings is settings.azure_scheduled
    both = running.after_drain(
        Settings.model_validate(
            {"azure_scheduled": {"enabled": True}, "sqs": {"enabled": True, "queue_url": "q"}}
        )
    )
    assert isinstance(both, AfterDrains)


def test_an_aks_providerid_names_its_vm() -> None:
    pid = (
        "azure:///subscriptions/8d1a5e3c-0f1b-4c2a-9e7d-2b6f4a1c9e00/resourceGroups/mc_rg_aks_eastus"
        "/providers/Microsoft.Compute/virtualMachineScaleSets/aks-spot-123-vmss/virtualMachines/3"
    )
    assert handlers.instance_of(pid) == "aks-spot-123-vmss_3"
    assert handlers.instance_of("azure:///subscriptions/not-a-guid/x") == ""
    assert handlers.instance_of("gce://p/us-central1-a/vm-1") == "vm-1"  # not Azure's


def test_imds_polls_every_path_its_parser_reads() -> None:
    assert set(imds_transport.PATHS) == set(imds_handler.PATHS)
    assert len(imds_transport.PATHS) == len(set(imds_transport.PATHS))


# --- deliver: parse, count, admit -----------------------------------------------------------


async def test_an_unreadable_payload_is_counted_and_settled_unadmitted() -> None:
    c, intake = Counters(), Script()
    got = await deliver(
        PARSE, b"{not json", admit=intake.admit, windows=Windows(), counters=c, what="t"
    )
    assert got.read is Read.UNREADABLE and got.settled and got.reason
    assert intake.calls == []
    assert (c.received, c.parse_errors, c.notices, c.by_admission) == (1, 1, 0, {})


async def test_a_payload_without_a_notice_is_counted_as_ignored() -> None:
    c = Counters()
    payload = imds_payload("autoscaling/target-lifecycle-state", "InService")
    got = await deliver(
        PARSE, payload, admit=Script().admit, windows=Windows(), counters=c, what="t"
    )
    assert got.read is Read.IGNORED and got.settled
    assert (c.received, c.ignored, c.notices) == (1, 1, 0)


async def test_every_notice_of_a_payload_is_admitted_and_counted() -> None:
    c, intake = Counters(), Script(Admission.CLAIMED, Admission.DUPLICATE)
    got = await deliver(
        PARSE, two_events(), admit=intake.admit, windows=Windows(), counters=c, what="t"
    )
    assert got.read is Read.NOTICES and got.settled
    assert [n for n, _ in got.admitted] == intake.calls and len(intake.calls) == 2
    assert c.notices == 2 and c.by_admission == {"claimed": 1, "duplicate": 1}


async def test_one_retry_keeps_the_whole_payload_unsettled() -> None:
    c, intake = Counters(), Script(Admission.CLAIMED, Admission.RETRY)
    got = await deliver(
        PARSE, two_events(), admit=intake.admit, windows=Windows(), counters=c, what="t"
    )
    assert not got.settled
    assert got.unsettled == [intake.calls[1]]
    assert c.by_admission == {"claimed": 1, "retry": 1}


async def test_an_admission_that_raises_is_a_retry_not_a_crash() -> None:
    c, intake = Counters(), Script(RuntimeError("apiserver gone"))
    payload = (AWS / "imds-spot-instance-action.json").read_text()
    got = await deliver(
        PARSE,
        imds_payload("spot/instance-action", payload),
        admit=intake.admit,
        windows=Windows(),
        counters=c,
        what="t",
    )
    assert not got.settled and c.by_admission == {"retry": 1}


async def test_admit_only_counts_every_notice_but_admits_the_chosen() -> None:
    c, intake = Counters(), Script()
    first = await deliver(
        PARSE, two_events(), admit=intake.admit, windows=Windows(), counters=c, what="t"
    )
    known = {first.admitted[0][0].id}
    again = await deliver(
        PARSE,
        two_events(),
        admit=intake.admit,
        windows=Windows(),
        counters=c,
        what="t",
        admit_only=lambda n: n.id not in known,
    )
    assert [n.id for n in again.skipped] == list(known)
    assert [n.id for n, _ in again.admitted] == [first.admitted[1][0].id]
    assert c.notices == 4 and len(intake.calls) == 3


# --- after the drain ------------------------------------------------------------------------


def lifecycle_notice() -> Notice:
    body = (AWS / "eventbridge-asg-terminate-lifecycle-action.json").read_bytes()
    outcome = handlers.parse("ec2", body, received_at=utcnow())
    assert isinstance(outcome, tuple) and len(outcome) == 1
    return outcome[0]


def spot_notice() -> Notice:
    body = (AWS / "eventbridge-spot-interruption-warning.json").read_bytes()
    outcome = handlers.parse("ec2", body, received_at=utcnow())
    assert isinstance(outcome, tuple)
    return outcome[0]


def test_a_lifecycle_notice_names_its_action() -> None:
    action = LifecycleAction.of(lifecycle_notice())
    assert action == LifecycleAction(
        group="my-asg",
        hook="my-lifecycle-hook",
        token="87654321-4321-4321-4321-210987654321",
        instance_id="i-1234567890abcdef0",
        region="us-west-2",
    )


def test_other_notices_carry_no_action() -> None:
    assert LifecycleAction.of(spot_notice()) is None


class Calls:
    """A boto3 ``autoscaling`` client stand-in for the no-op paths: any call is a failure."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"unexpected call {name}")


async def test_a_notice_without_lifecycle_fields_calls_nothing() -> None:
    part = AsgLifecycle(lambda _region: Calls(), heartbeat_s=0.01)
    notice = spot_notice()
    async with part.holding(notice):
        pass
    await part.finished(notice, drained=True)
    assert part.counters.errors == 0 and part.counters.completed == 0


class Recorder:
    def __init__(self, name: str, log: list[str]) -> None:
        self.name, self.log = name, log

    @contextlib.asynccontextmanager
    async def holding(self, notice: Notice) -> AsyncIterator[None]:
        self.log.append(f"{self.name} holds")
        try:
            yield
        finally:
            self.log.append(f"{self.name} lets go")

    async def finished(self, notice: Notice, drained: bool) -> None:
        self.log.append(f"{self.name} finished {drained}")


async def test_several_after_drain_parts_act_as_one() -> None:
    log: list[str] = []
    both = AfterDrains([Recorder("a", log), Recorder("b", log)])
    notice = spot_notice()
    async with both.holding(notice):
        log.append("drain")
    await both.finished(notice, drained=False)
    assert log == [
        "a holds",
        "b holds",
        "drain",
        "b lets go",
        "a lets go",
        "a finished False",
        "b finished False",
    ]


@pytest.mark.parametrize("drained", [True, False])
async def test_no_after_drain_does_nothing(drained: bool) -> None:
    part = NoAfterDrain()
    async with part.holding(spot_notice()):
        pass
    assert await part.finished(spot_notice(), drained) is None
