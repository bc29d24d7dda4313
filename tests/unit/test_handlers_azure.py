"""Azure Scheduled Events (handlers/azure_scheduled/parser.py) over the public-doc fixtures, and its
Azure id grammars and providerID mapping."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reclaimd import handlers
from reclaimd.handlers.azure_scheduled import parser as azure_scheduled
from reclaimd.model import (
    Ignored,
    Notice,
    NoticeKind,
    ParseError,
    ParseOutcome,
    Response,
    Target,
    Windows,
    digest,
    stable_id,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "azure"
RECEIVED = datetime(2025, 1, 15, 12, 0, 2, tzinfo=UTC)
SUB = "8d1a5e3c-0f1b-4c2a-9e7d-2b6f4a1c9e00"
RG = "MC_gpu-rg_train-aks_eastus"
VMSS = "aks-spotgpu-12345678-vmss"
VM = f"{VMSS}_3"
NODE = "aks-spotgpu-12345678-vmss000003"
RESOURCE_ID = (
    f"/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Compute"
    f"/virtualMachineScaleSets/{VMSS}/virtualMachines/3"
)
PROVIDER_ID = "azure://" + RESOURCE_ID.replace(RG, RG.lower())


def doc(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / name).read_text())
    return data


def envelope(document: Any, vm: str = VM, **extra: Any) -> dict[str, Any]:
    """What the transport hands over for an AKS Spot instance (handlers/README.md)."""
    body = {
        "vm_name": vm,
        "resource_id": RESOURCE_ID,
        "node_name": NODE,
        "vm_size": "Standard_ND96isr_H100_v5",
        "priority": "Spot",
        "location": "eastus",
        "zone": "1",
        "document": document,
    }
    if vm != VM:  # a fixture about another VM: no resource id of ours
        body.pop("resource_id")
        body.pop("node_name")
    body.update(extra)
    return {k: v for k, v in body.items() if v is not None}


def encode(obj: Any) -> bytes:
    return obj if isinstance(obj, bytes) else json.dumps(obj).encode()


def parse(payload: Any) -> ParseOutcome:
    return azure_scheduled.parse(encode(payload), received_at=RECEIVED, windows=Windows())


def one(payload: Any) -> Notice:
    out = parse(payload)
    assert isinstance(out, tuple), out
    (notice,) = out
    return notice


def error(payload: Any) -> str:
    with pytest.raises(ParseError) as e:
        parse(payload)
    message = str(e.value)
    assert "\n" not in message and len(message) < 200
    return message


# --- every fixture ---------------------------------------------------------------------------


def test_preempt_of_an_aks_spot_instance_is_a_full_preemption_notice() -> None:
    payload = encode(envelope(doc("scheduledevents-preempt-aks-spot.json")))
    event_id = "5DD55B64-45AD-49D3-BBC9-F57D4EA97BD7"
    assert one(payload) == Notice(
        id=stable_id("azure.scheduled.preempt", VM, event_id),
        source="azure.scheduled.preempt",
        kind=NoticeKind.PREEMPTION,
        target=Target(instance_id=VM, provider_id=PROVIDER_ID, node_name=NODE),
        issued_at=RECEIVED,
        deadline=datetime(2025, 1, 15, 12, 0, 30, tzinfo=UTC),  # NotBefore
        received_at=RECEIVED,
        response=Response.FULL,
        attributes={
            "vm_name": VM,
            "subscription": SUB,
            "resource_group": RG.lower(),
            "scale_set": VMSS,
            "scale_set_instance": "3",
            "priority": "Spot",
            "region": "eastus",
            "zone": "1",
            "instance_type": "Standard_ND96isr_H100_v5",
            "event_id": event_id,
            "event_type": "Preempt",
            "event_status": "Scheduled",
            "event_source": "Platform",
            "not_before": "2025-01-15T12:00:30Z",
            "duration_s": "-1",
            "resources": "1",
            "approvable": "true",
        },
        payload_digest=digest(payload),
    )


def test_the_freeze_in_the_same_document_is_another_vms() -> None:
    # Instance 4 is in the Freeze's Resources: ignored (a pause), and the Preempt is not its.
    out = parse(envelope(doc("scheduledevents-preempt-aks-spot.json"), vm=f"{VMSS}_4"))
    assert isinstance(out, Ignored)
    assert "Freeze" in out.reason and "C7061BAC" in out.reason


def test_preempt_of_a_standalone_spot_vm() -> None:
    notice = one(envelope(doc("scheduledevents-preempt-spot-vm.json"), vm="vm-spot"))
    assert notice.kind is NoticeKind.PREEMPTION
    assert notice.deadline == datetime(2022, 8, 9, 17, 7, 32, tzinfo=UTC)
    assert notice.target == Target(instance_id="vm-spot")
    assert notice.attributes["approvable"] == "true"


def test_terminate_of_a_scale_set_instance_is_a_scheduled_change() -> None:
    # The terminate-notification page's response has no EventSource, Description or duration.
    notice = one(envelope(doc("scheduledevents-terminate-vmss.json"), vm="nsgvmss_85"))
    assert notice.source == "azure.scheduled.terminate"
    assert (notice.kind, notice.response) == (NoticeKind.SCHEDULED_CHANGE, Response.FULL)
    assert notice.deadline == datetime(2025, 1, 15, 12, 5, tzinfo=UTC)
    assert notice.id == stable_id(
        "azure.scheduled.terminate", "nsgvmss_85", "f020ba2e-3bc0-4c40-a10b-86575a9eabd5"
    )
    assert {"event_source", "duration_s", "description"}.isdisjoint(notice.attributes)


def test_user_reboot_is_maintenance() -> None:
    notice = one(envelope(doc("scheduledevents-reboot-user.json"), vm="flatcar-vm1"))
    assert notice.source == "azure.scheduled.maintenance"
    assert (notice.kind, notice.response) == (NoticeKind.MAINTENANCE, Response.FULL)
    assert notice.attributes["event_source"] == "User"
    assert notice.deadline == datetime(2021, 7, 22, 4, 50, 17, tzinfo=UTC)


def test_redeploy_for_cloud_service_role_instances_is_read_but_not_ours() -> None:
    # Role instance names (two underscores) are no VM names; they are only compared with ours.
    out = parse(envelope(doc("scheduledevents-redeploy-platform.json")))
    assert out == Ignored(f"1 event(s), none for {VM}")


def test_redeploy_of_two_vms_is_noticed_but_not_approvable() -> None:
    # Approving would start the Redeploy for the other instance too, mid-drain.
    document = doc("scheduledevents-redeploy-platform.json")
    document["Events"][0]["Resources"] = [VM, f"{VMSS}_4"]
    notice = one(envelope(document))
    assert notice.source == "azure.scheduled.maintenance"
    assert (notice.kind, notice.response) == (NoticeKind.MAINTENANCE, Response.FULL)
    assert notice.deadline == datetime(2016, 9, 19, 18, 29, 47, tzinfo=UTC)
    assert notice.attributes["resources"] == "2"
    assert "approvable" not in notice.attributes
    assert notice.attributes["description"] == "Host server is undergoing maintenance."


def test_freeze_is_ignored_scheduled_or_started() -> None:
    for name in ("scheduledevents-freeze-scheduled.json", "scheduledevents-freeze-started.json"):
        out = parse(envelope(doc(name), vm="WestNO_0"))
        assert isinstance(out, Ignored)
        assert out.reason.startswith("Freeze C7061BAC-AFDC-4513-B24B-AA5F13A16123: pauses")


def test_empty_document_is_ignored() -> None:
    out = parse(envelope(doc("scheduledevents-empty.json")))
    assert out == Ignored("no scheduled events")


# --- statuses, times, resources --------------------------------------------------------------


def aks_preempt(**changes: Any) -> dict[str, Any]:
    document = doc("scheduledevents-preempt-aks-spot.json")
    document["Events"] = [document["Events"][0]]
    document["Events"][0].update(changes)
    return document


def test_started_preempt_is_acted_on_at_once_under_the_same_id() -> None:
    scheduled = one(envelope(aks_preempt()))
    started = one(envelope(aks_preempt(EventStatus="Started", NotBefore="")))
    assert started.id == scheduled.id  # our own approval must not make a second notice
    assert started.deadline == RECEIVED
    assert started.attributes["event_status"] == "Started"
    assert "approvable" not in started.attributes
    assert "not_before" not in started.attributes


def test_a_scheduled_preempt_with_a_blank_not_before_gets_the_documented_30_s() -> None:
    notice = one(envelope(aks_preempt(NotBefore="")))
    assert notice.deadline == RECEIVED + timedelta(seconds=30)
    windows = handlers.windows(azure_preempt_s=12.0)
    out = azure_scheduled.parse(
        encode(envelope(aks_preempt(NotBefore=""))), received_at=RECEIVED, windows=windows
    )
    assert isinstance(out, tuple) and out[0].deadline == RECEIVED + timedelta(seconds=12)


def test_another_scheduled_event_with_a_blank_not_before_is_acted_on_at_once() -> None:
    notice = one(envelope(aks_preempt(EventType="Terminate", NotBefore="")))
    assert notice.deadline == RECEIVED


def test_a_started_reboot_without_scheduled_is_maintenance_now() -> None:
    # A host failure: the platform skips Scheduled and starts a Reboot at once.
    notice = one(envelope(aks_preempt(EventType="Reboot", EventStatus="Started", NotBefore="")))
    assert (notice.kind, notice.deadline) == (NoticeKind.MAINTENANCE, RECEIVED)


def test_an_event_for_other_vms_only_is_ignored() -> None:
    out = parse(envelope(aks_preempt(Resources=[f"{VMSS}_9"])))
    assert out == Ignored(f"1 event(s), none for {VM}")


def test_resource_names_compare_case_insensitively() -> None:
    notice = one(envelope(aks_preempt(Resources=[VM.upper()])))
    assert notice.attributes["approvable"] == "true"


def test_one_notice_per_event_for_this_vm() -> None:
    document = aks_preempt()
    terminate = dict(document["Events"][0], EventId="0e0e0e0e-1111-2222-3333-444444444444")
    terminate["EventType"] = "Terminate"
    document["Events"].append(terminate)
    out = parse(envelope(document))
    assert isinstance(out, tuple)
    assert [n.source for n in out] == ["azure.scheduled.preempt", "azure.scheduled.terminate"]


def test_document_may_arrive_as_the_response_text() -> None:
    as_object = one(envelope(aks_preempt()))
    as_text = one(envelope(json.dumps(aks_preempt())))
    assert (as_text.id, as_text.deadline) == (as_object.id, as_object.deadline)


def test_envelope_without_resource_id_targets_the_node_and_vm() -> None:
    notice = one(envelope(aks_preempt(), resource_id=None))
    assert notice.target == Target(instance_id=VM, node_name=NODE)


# --- malformed input: one line each ----------------------------------------------------------


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        ({"EventType": "Hibernate"}, "EventType: 'Hibernate' is not one of"),
        ({"EventStatus": "Completed"}, "EventStatus: 'Completed' is not one of"),
        ({"EventSource": "Customer"}, "EventSource: 'Customer' is not one of"),
        ({"ResourceType": "Disk"}, "ResourceType: 'Disk' is not one of"),
        ({"NotBefore": "2025-01-15T12:00:30Z"}, "NotBefore: not a 'DD Mon YYYY"),
        ({"NotBefore": "Wed, 32 Jan 2025 12:00:30 GMT"}, "NotBefore: no such time"),
        ({"EventId": "x; rm -rf /"}, "EventId: not a Scheduled Events EventId"),
        ({"EventId": None}, "EventId: missing"),
        ({"Resources": "aks-spotgpu-12345678-vmss_3"}, "Resources: expected a list"),
        ({"Resources": [3]}, "Resources[0]: expected a string"),
        ({"DurationInSeconds": True}, "DurationInSeconds: expected an integer"),
    ],
)
def test_malformed_event_is_a_one_line_parse_error(edit: dict[str, Any], expected: str) -> None:
    message = error(envelope(aks_preempt(**edit)))
    assert message.startswith("document.Events[0].")
    assert expected in message


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        (b"not json", "not JSON"),
        ([], "scheduled events envelope: expected an object"),
        ({"document": {"DocumentIncarnation": 1, "Events": []}}, "vm_name: missing"),
        (envelope({"Events": []}), "document.DocumentIncarnation: missing"),
        (envelope({"DocumentIncarnation": "x", "Events": []}), "expected an integer"),
        (envelope({"DocumentIncarnation": 1}), "document.Events: missing"),
        (envelope({"DocumentIncarnation": 1, "Events": [7]}), "Events[0]: expected an object"),
        (envelope("{"), "not JSON"),
        (envelope(None), "document: missing"),
        (envelope(aks_preempt(), vm="vm\nname"), "vm_name: not an Azure VM"),
        (envelope(aks_preempt(), node_name="Not_A_Node"), "node_name: not a Kubernetes name"),
        (envelope(aks_preempt(), priority="Cheap"), "priority: 'Cheap' is not one of"),
        (envelope(aks_preempt(), zone="eastus-1"), "zone: not an Azure availability zone"),
        (envelope(aks_preempt(), resource_id="/subscriptions/x"), "not an Azure VM resource ID"),
        (
            envelope(aks_preempt(), resource_id=RESOURCE_ID.replace("/3", "/4")),
            "resource_id: names VM",
        ),
    ],
)
def test_malformed_envelope_is_a_one_line_parse_error(payload: Any, expected: str) -> None:
    assert expected in error(payload)


def test_a_huge_identifier_is_refused_by_length() -> None:
    assert "EventId" in error(envelope(aks_preempt(EventId="A" * 10_000_000)))


def test_parse_never_mutates_or_depends_on_the_windows() -> None:
    document = aks_preempt()
    before = copy.deepcopy(document)
    a = azure_scheduled.parse(encode(envelope(document)), received_at=RECEIVED, windows=Windows())
    b = azure_scheduled.parse(
        encode(envelope(document)), received_at=RECEIVED, windows=Windows(default_s=1)
    )
    assert a == b
    assert document == before


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=8,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(where=st.sampled_from(["envelope", "document", "event"]), data=st.data())
def test_any_edit_of_a_member_is_an_outcome_or_a_one_line_error(
    where: str, data: st.DataObject
) -> None:
    # The whole parser contract (handlers/base.py) around a real document: nothing but
    # ParseError escapes, and whatever comes out can be stored.
    payload = envelope(aks_preempt())
    obj = {"envelope": payload, "document": payload["document"]}.get(
        where, payload["document"]["Events"][0]
    )
    obj[data.draw(st.sampled_from([*sorted(obj), "extra"]))] = data.draw(_JSON)
    try:
        out = parse(payload)
    except ParseError as e:
        assert str(e) and "\n" not in str(e)
        return
    if isinstance(out, tuple):
        for notice in out:
            assert Notice.from_json(json.loads(json.dumps(notice.to_json()))) == notice
            assert all(v and "\n" not in v for v in notice.attributes.values())


# --- id grammars and the providerID mapping --------------------------------------------------


@pytest.mark.parametrize(
    "name",
    ["vm-spot", "flatcar-vm1", "nsgvmss_85", f"{VMSS}_3", "myflexvmss_1a2b3c4d", "A1", "v"],
)
def test_vm_resource_names(name: str) -> None:
    assert azure_scheduled.VM_RESOURCE_NAME.matches(name)


@pytest.mark.parametrize(
    "name",
    ["", "_vm", "vm-", "vm.", "vm_", "vm__3", "vm_1a2b3c4dz", "vm name", "vm/../x", "v" * 65],
)
def test_not_vm_resource_names(name: str) -> None:
    assert not azure_scheduled.VM_RESOURCE_NAME.matches(name)


def test_uniform_scale_set_provider_id_maps_to_the_vm_name() -> None:
    vm = azure_scheduled.provider_id(PROVIDER_ID)
    assert vm == azure_scheduled.AzureVm(SUB, RG.lower(), VM, VMSS, "3")
    assert vm.instance_id == VM
    assert vm.provider_id == PROVIDER_ID
    assert vm.facts() == {
        "subscription": SUB,
        "resource_group": RG.lower(),
        "vm_name": VM,
        "scale_set": VMSS,
        "scale_set_instance": "3",
    }
    assert vm.focus_resource_id() == (
        f"/subscriptions/{SUB}/resourcegroups/{RG.lower()}"
        f"/providers/microsoft.compute/virtualmachinescalesets/{VMSS}"
    )


def test_availability_set_vm_provider_id() -> None:
    pid = (
        f"azure:///subscriptions/{SUB}/resourceGroups/train-rg/providers/Microsoft.Compute"
        "/virtualMachines/gpu-vm-7"
    )
    vm = azure_scheduled.provider_id(pid)
    assert vm == azure_scheduled.AzureVm(SUB, "train-rg", "gpu-vm-7")
    assert (vm.instance_id, vm.provider_id) == ("gpu-vm-7", pid)
    assert vm.focus_resource_id() == pid.removeprefix("azure://").lower()


def test_resource_id_from_imds_lowercases_the_group_in_the_provider_id() -> None:
    vm = azure_scheduled.resource_id(RESOURCE_ID, "resource_id")
    assert vm.resource_group == RG  # kept as IMDS gives it
    assert vm.provider_id == PROVIDER_ID


def test_arm_segment_names_match_case_insensitively() -> None:
    lowered = PROVIDER_ID.replace("resourceGroups", "resourcegroups").replace(
        "virtualMachineScaleSets", "virtualmachinescalesets"
    )
    assert azure_scheduled.provider_id(lowered).provider_id == PROVIDER_ID


@pytest.mark.parametrize(
    "value",
    [
        "aws:///us-east-2a/i-0abc12345678def01",
        "azure://" + RESOURCE_ID.replace(SUB, "not-a-guid"),
        "azure://" + RESOURCE_ID.replace("/virtualMachines/3", "/virtualMachines/3a"),
        "azure://" + RESOURCE_ID.replace("/virtualMachines/3", "/virtualMachines/../3"),
        "azure://" + RESOURCE_ID + "/networkInterfaces/0",
        "azure://" + RESOURCE_ID.replace(RG, "rg."),
        "azure://" + RESOURCE_ID.replace(RG, "r\u00e9sum\u00e9"),
        "azure://" + RESOURCE_ID + "x" * 600,
        "azure:///subscriptions/" + SUB,
    ],
)
def test_not_azure_provider_ids(value: str) -> None:
    assert not azure_scheduled.is_provider_id(value)
    with pytest.raises(ParseError) as e:
        azure_scheduled.provider_id(value)
    assert "\n" not in str(e.value)
