"""The command line as a user meets it: exit codes, one-line errors, JSON lines."""

import json
import subprocess
import sys
from pathlib import Path

from shared_fixtures import FIXTURES as SHARED

FIXTURES = SHARED


def run(*args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "reclaimd.cli", *args], input=stdin, capture_output=True, check=False
    )


def test_version() -> None:
    r = run("version")
    assert r.returncode == 0 and r.stdout.startswith(b"reclaimd ")


def test_parse_spot_warning_prints_one_notice() -> None:
    r = run(
        "parse",
        "--source",
        "ec2",
        str(FIXTURES / "aws" / "eventbridge-spot-interruption-warning.json"),
    )
    assert r.returncode == 0, r.stderr
    lines = r.stdout.decode().splitlines()
    assert len(lines) == 1
    n = json.loads(lines[0])
    assert {"id", "source", "kind", "issued_at", "deadline", "target", "attributes"} <= n.keys()
    assert n["kind"] == "spot_interruption"
    assert n["deadline"] == "2025-01-01T12:02:00Z"
    assert n["target"]["instance_id"] == "i-1234567890abcdef0"


def test_parse_from_stdin_and_ids_are_stable() -> None:
    body = (FIXTURES / "aws" / "eventbridge-spot-interruption-warning.json").read_bytes()
    a, b = (
        run("parse", "--source", "ec2", "-", stdin=body),
        run("parse", "--source", "ec2", "-", stdin=body),
    )
    assert json.loads(a.stdout)["id"] == json.loads(b.stdout)["id"]


def test_parse_non_notice_prints_nothing() -> None:
    r = run(
        "parse", "--source", "ec2", str(FIXTURES / "aws" / "asg-test-notification-direct-sqs.json")
    )
    assert r.returncode == 0 and r.stdout == b""


def test_parse_bad_input_is_exit_2_and_one_line() -> None:
    for stdin in (b"{not json", b"[1, 2]", b'{"detail-type": 3}'):
        r = run("parse", "--source", "ec2", "-", stdin=stdin)
        assert r.returncode == 2
        assert len(r.stderr.decode().strip().splitlines()) == 1
        assert b"Traceback" not in r.stderr
    r = run("parse", "--source", "ec2", "/nonexistent/file.json")
    assert r.returncode == 2 and b"No such file" in r.stderr


def test_check_config(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    url = "https://sqs.us-east-2.amazonaws.com/123456789012/reclaimd-interruptions"
    good.write_text(f"cluster_name: prod\nsqs:\n  enabled: true\n  queue_url: {url}\n")
    assert run("check-config", str(good)).returncode == 0
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"sqs:\n  batch_size: 50\n  enabled: true\n  queue_url: {url}\n")
    r = run("check-config", str(bad))
    assert r.returncode == 2
    assert r.stderr.decode().count("\n") == 1 and b"sqs.batch_size" in r.stderr
