"""``reclaimd parse --source azure-scheduled`` as people debug with it: on the document IMDS
returns (``curl -H Metadata:true http://169.254.169.254/metadata/scheduledevents?api-version=
2020-07-01 > events.json``), for one VM (``--vm``) or every VM its events name, and on the
poller's envelope as before. Run as a user runs it: a process, its exit code, its output."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

AZURE = Path(__file__).parents[1] / "fixtures" / "azure"  # Microsoft's documented documents
AKS = AZURE / "scheduledevents-preempt-aks-spot.json"  # Preempt vmss_3; Freeze vmss_4, vmss_5
VMSS_3 = "aks-spotgpu-12345678-vmss_3"


def run(*args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "reclaimd.cli", "parse", "--source", "azure-scheduled", *args],
        input=stdin,
        capture_output=True,
        check=False,
    )


def notices(r: subprocess.CompletedProcess[bytes]) -> list[dict[str, Any]]:
    assert r.returncode == 0, r.stderr
    return [json.loads(line) for line in r.stdout.decode().splitlines()]


def test_the_bare_document_for_one_vm() -> None:
    (n,) = notices(run("--vm", VMSS_3, str(AKS)))
    assert (n["kind"], n["source"]) == ("preemption", "azure.scheduled.preempt")
    assert n["target"]["instance_id"] == VMSS_3
    assert n["deadline"] == "2025-01-15T12:00:30Z"  # NotBefore, Wed, 15 Jan 2025 12:00:30 GMT
    assert n["attributes"]["event_id"] == "5DD55B64-45AD-49D3-BBC9-F57D4EA97BD7"
    assert n["attributes"]["approvable"] == "true"  # Scheduled, and vmss_3 its only resource
    # the notice the poller's envelope of the same document makes: the same id
    envelope = json.dumps({"vm_name": VMSS_3, "document": json.loads(AKS.read_bytes())})
    (same,) = notices(run("-", stdin=envelope.encode()))
    assert same["id"] == n["id"] and same["deadline"] == n["deadline"]
    # and the envelope with --vm naming its VM (in another case: Azure names are not cased)
    (again,) = notices(run("--vm", VMSS_3.upper(), "-", stdin=envelope.encode()))
    assert again["id"] == n["id"]


def test_the_bare_document_for_every_vm_it_names(tmp_path: Path) -> None:
    # the AKS document: vmss_3's Preempt; vmss_4's and vmss_5's Freeze are no notice
    (n,) = notices(run(str(AKS)))
    assert (n["target"]["instance_id"], n["kind"]) == (VMSS_3, "preemption")
    # a Redeploy of two instances: one notice each, neither approvable (approving starts it
    # for both)
    doc = {
        "DocumentIncarnation": 5,
        "Events": [
            {
                "EventId": "602d9444-d2cd-49c7-8624-8643e7171297",
                "EventStatus": "Scheduled",
                "EventType": "Redeploy",
                "ResourceType": "VirtualMachine",
                "Resources": ["aks-gpu-1-vmss_0", "aks-gpu-1-vmss_1"],
                "NotBefore": "Mon, 19 Sep 2016 18:29:47 GMT",
                "Description": "Host server is undergoing maintenance.",
                "EventSource": "Platform",
                "DurationInSeconds": -1,
            }
        ],
    }
    path = tmp_path / "events.json"
    path.write_text(json.dumps(doc))
    got = notices(run(str(path)))
    assert [(n["target"]["instance_id"], n["kind"], n["deadline"]) for n in got] == [
        ("aks-gpu-1-vmss_0", "maintenance", "2016-09-19T18:29:47Z"),
        ("aks-gpu-1-vmss_1", "maintenance", "2016-09-19T18:29:47Z"),
    ]
    assert got[0]["id"] != got[1]["id"]
    assert {n["attributes"].get("approvable", "") for n in got} == {""}
    # --vm picks one of them, the same notice
    (one,) = notices(run("--vm", "aks-gpu-1-vmss_1", str(path)))
    assert one == {**got[1], "received_at": one["received_at"],
                   "issued_at": one["issued_at"]}  # fmt: skip


def test_a_document_with_no_notice_says_why_when_asked() -> None:
    # Microsoft's Freeze example: a pause of seconds for both VMs, no notice
    r = run("-v", str(AZURE / "scheduledevents-freeze-scheduled.json"))
    assert (r.returncode, r.stdout) == (0, b"")
    reason = "Freeze C7061BAC-AFDC-4513-B24B-AA5F13A16123: pauses the VM for seconds"
    assert r.stderr.decode().splitlines() == [
        f"ignored: WestNO_0: {reason} (memory and open files kept);"
        f" WestNO_1: {reason} (memory and open files kept)"
    ]
    # a VM the document does not name
    r = run("-v", "--vm", "aks-other-vmss_9", str(AKS))
    assert (r.returncode, r.stdout) == (0, b"")
    assert r.stderr.decode() == "ignored: 2 event(s), none for aks-other-vmss_9\n"
    # Microsoft's Redeploy example names cloud-service role instances ("FrontEnd_IN_0"), no
    # VM name reclaimd acts on (the poller refuses one as its own): skipped, and said so
    r = run("-v", str(AZURE / "scheduledevents-redeploy-platform.json"))
    assert (r.returncode, r.stdout) == (0, b"")
    assert r.stderr.decode().startswith("ignored: FrontEnd_IN_0: skipped (vm_name: ")
    assert len(r.stderr.decode().splitlines()) == 1
    r = run("-v", str(AZURE / "scheduledevents-empty.json"))
    assert (r.returncode, r.stdout, r.stderr) == (0, b"", b"ignored: no scheduled events\n")


@pytest.mark.parametrize(
    ("args", "stdin", "says"),
    [
        (("-",), b"{not json", "reclaimd parse: "),
        (("-",), b"[1, 2]", "expected an object, got a list"),
        (("-",), b'{"DocumentIncarnation": 1}', "document.Events: missing"),
        (
            ("-",),
            b'{"DocumentIncarnation": 1, "Events": [{"EventId": "e-1", "EventStatus":'
            b' "Scheduled", "EventType": "Evict", "Resources": ["vm-1"]}]}',
            "document.Events[0].EventType: 'Evict' is not one of",
        ),
        (("--vm", "not a vm!", str(AKS)), b"", "vm: "),
        (
            ("--vm", "aks-other-vmss_9", "-"),
            json.dumps(
                {"vm_name": VMSS_3, "document": {"DocumentIncarnation": 1, "Events": []}}
            ).encode(),
            f"vm: 'aks-other-vmss_9' is not the envelope's VM, '{VMSS_3}'",
        ),
        (("/nonexistent/events.json",), b"", "No such file"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args: tuple[str, ...], stdin: bytes, says: str) -> None:
    r = run(*args, stdin=stdin)
    err = r.stderr.decode()
    assert r.returncode == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert says in err, err
    assert r.stdout == b""


def test_vm_is_only_for_azure_scheduled_events() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "reclaimd.cli", "parse", "--source", "ec2", "--vm", "x", "-"],
        input=b"{}",
        capture_output=True,
        check=False,
    )
    assert r.returncode == 2
    assert r.stderr.decode() == (
        "reclaimd parse: --vm: only with --source azure_scheduled, gce_metadata, imds:"
        " leave it out for ec2 (its payload names its instance)\n"
    )
