"""``reclaimd parse --source imds`` and ``--source gce-metadata`` on what people save from the
metadata services: the body IMDS returns (``curl .../latest/meta-data/spot/instance-action``)
and the value the GCE metadata server returns (``curl -H Metadata-Flavor:Google
.../computeMetadata/v1/instance/preempted``), each for the instance ``--vm`` names, as the
node poller would have read it; the poller's envelope as before; and, when something is
missing, one line that says what to add. Run as a user runs it: a process, its exit code, its
output."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime
from typing import Any

import pytest

from reclaimd import handlers

INSTANCE = "i-0123456789abcdef0"
VM = "my-project/us-central1-a/gke-gpu-pool-1-abcd"
SPOT = {"action": "terminate", "time": "2026-12-06T07:10:00Z"}  # AWS's documented shape
SCHEDULED = [
    {
        "NotBefore": "21 Jan 2027 09:00:43 GMT",
        "Code": "system-reboot",
        "Description": "scheduled reboot",
        "EventId": "instance-event-0d59937288b749b32",
        "NotAfter": "21 Jan 2027 09:17:23 GMT",
        "State": "active",
    }
]


def run(source: str, *args: str, stdin: bytes) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "reclaimd.cli", "parse", "--source", source, *args, "-"],
        input=stdin,
        capture_output=True,
        check=False,
    )


def notices(r: subprocess.CompletedProcess[bytes]) -> list[dict[str, Any]]:
    assert r.returncode == 0, r.stderr
    return [json.loads(line) for line in r.stdout.decode().splitlines()]


def error(r: subprocess.CompletedProcess[bytes]) -> str:
    assert r.returncode == 2 and r.stdout == b""
    (line,) = r.stderr.decode().splitlines()
    return line


def test_the_spot_body_imds_returns_is_the_pollers_notice() -> None:
    (n,) = notices(run("imds", "--vm", INSTANCE, stdin=json.dumps(SPOT).encode()))
    assert (n["source"], n["kind"]) == ("aws.imds.spot", "spot_interruption")
    assert n["target"]["instance_id"] == INSTANCE and n["deadline"] == "2026-12-06T07:10:00Z"
    # the poller's envelope of the same body: the same notice
    envelope = {"instance_id": INSTANCE, "path": "spot/instance-action", "body": json.dumps(SPOT)}
    (same,) = notices(run("imds", stdin=json.dumps(envelope).encode()))
    assert same["id"] == n["id"] and same["deadline"] == n["deadline"]


@pytest.mark.parametrize(
    ("body", "source"),
    [
        (json.dumps({"noticeTime": "2026-12-06T07:00:00Z"}), "aws.imds.rebalance"),
        (json.dumps(SCHEDULED), "aws.imds.scheduled"),
        ("Terminated\n", "aws.imds.asg"),
    ],
)
def test_every_imds_notice_body_is_told_by_its_shape(body: str, source: str) -> None:
    (n,) = notices(run("imds", "--vm", INSTANCE, stdin=body.encode()))
    assert n["source"] == source and n["target"]["instance_id"] == INSTANCE


def test_a_value_the_metadata_server_returns_is_the_watchers_notice() -> None:
    (n,) = notices(run("gce-metadata", "--vm", VM, stdin=b"TRUE\n"))
    assert (n["source"], n["kind"]) == ("gcp.metadata.preempted", "preemption")
    assert n["target"]["provider_id"] == f"gce://{VM}"
    for vm in (
        f"gce://{VM}",
        "projects/my-project/zones/us-central1-a/instances/gke-gpu-pool-1-abcd",
    ):
        (again,) = notices(run("gce-metadata", "--vm", vm, stdin=b"TRUE"))
        assert again["id"] == n["id"]
    (m,) = notices(run("gce-metadata", "--vm", VM, stdin=b"TERMINATE_ON_HOST_MAINTENANCE"))
    assert m["kind"] == "maintenance"
    r = run("gce-metadata", "--vm", VM, "-v", stdin=b"FALSE")
    assert r.returncode == 0 and r.stdout == b"" and b"not preempted" in r.stderr
    # the watcher's envelope as before, and its notice the one handlers.parse makes
    envelope = {"instance": "gke-gpu-pool-1-abcd", "project": "my-project",
                "zone": "us-central1-a", "path": "instance/preempted", "value": "TRUE"}  # fmt: skip
    (w,) = notices(run("gce-metadata", stdin=json.dumps(envelope).encode()))
    direct = handlers.parse(
        "gce-metadata", json.dumps(envelope).encode(), received_at=datetime.now(UTC)
    )
    assert isinstance(direct, tuple) and w["id"] == direct[0].id


@pytest.mark.parametrize(
    ("source", "args", "body", "says"),
    [
        ("imds", [], json.dumps(SPOT), "an IMDS body does not name its instance: add --vm"
         " <instance id> (IMDS serves it at /latest/meta-data/instance-id)"),
        ("imds", ["--vm", "web-1"], json.dumps(SPOT), "vm: not an EC2 instance id: 'web-1'"),
        ("imds", ["--vm", INSTANCE], json.dumps({"hello": 1}), "body: not an IMDS notice body"),
        ("gce-metadata", [], "TRUE", "a metadata value does not name its VM: add --vm"
         " <project>/<zone>/<instance>"),
        ("gce-metadata", ["--vm", "gke-gpu-1"], "TRUE", "vm: 'gke-gpu-1' is not"
         " <project>/<zone>/<instance>: give it so, or the node's providerID"),
        ("gce-metadata", ["--vm", VM], "MIGRATE", "value: 'MIGRATE' is no value of"
         " instance/preempted or instance/maintenance-event"),
    ],
)  # fmt: skip
def test_what_is_missing_is_one_line_saying_what_to_do(
    source: str, args: list[str], body: str, says: str
) -> None:
    line = error(run(source, *args, stdin=body.encode()))
    assert line.startswith(f"reclaimd parse: {says}"), line


def test_version() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "reclaimd.cli", "--version"], capture_output=True, check=False
    )
    assert r.returncode == 0 and r.stdout.decode().startswith("reclaimd ")


def test_a_payload_that_is_not_the_sources_says_to_check_the_source() -> None:
    line = error(run("ec2", stdin=b"TRUE"))
    assert line.startswith("reclaimd parse: not JSON")
    assert line.endswith(
        ": is it what --source ec2 reads? Check --source, or give the message body as it was"
        " delivered"
    )
