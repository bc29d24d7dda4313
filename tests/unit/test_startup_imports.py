"""Only what runs is loaded: a replica imports a source's client library only when the source is
enabled, and an OTLP exporter only when OTEL_EXPORTER_OTLP_* turns trace export on.

Each case runs the real ``reclaimd run`` in a subprocess (a fresh ``sys.modules``) up to the
point where the daemon would start its tasks: every part wired and every enabled source built
(tests/startup_probe.py says how, without a server). Lazy imports inside functions are what
keeps these libraries out, and import-linter cannot see laziness: this test is the proof.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from reclaimd import handlers

REPO = Path(__file__).resolve().parents[2]
PROBE = REPO / "tests" / "startup_probe.py"

PUBSUB = {"google.cloud.pubsub_v1", "google.api_core", "grpc", "google.protobuf"}
AWS = {"boto3", "botocore"}
EXPORTERS = {
    "opentelemetry.exporter",
    "opentelemetry.exporter.otlp.proto.grpc",
    "opentelemetry.exporter.otlp.proto.http",
}
# The report command's engine; the trainers' S3 guard; the generated Kubernetes client (60 MB:
# the product speaks to the API server through its own reclaimd.cluster.apiserver).
NEVER = {"duckdb", "reclaimd_trainer.s3", "kubernetes_asyncio"}
ALWAYS = {"aiokafka", "reclaimd.cluster.apiserver"}  # the ledger writer; the cluster side


def probe(which: str, *, rig: bool = False, **otel: str) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "PROBE_"))}
    env.update(otel, PYTHONPATH=str(REPO))
    if rig:
        env["PROBE_WITH_RIG"] = "1"  # chaos importable, as in a checkout or the chaos image
    out = subprocess.run(
        [sys.executable, str(PROBE), which],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    doc: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return doc


def test_sqs_alone_loads_boto3_and_no_pubsub_grpc_or_exporter() -> None:
    doc = probe("sqs")
    assert doc["built"] == ["sqs"]
    loaded = set(doc["loaded"])
    assert loaded >= AWS | ALWAYS
    assert loaded.isdisjoint(PUBSUB | EXPORTERS | NEVER), loaded


def test_a_replica_loads_no_rig_and_no_other_command_where_the_rig_is_installed() -> None:
    """``reclaimd run`` parses its own command only: ``drill`` (the rig, and with it the
    generated Kubernetes client) and the report commands stay out of a replica."""
    doc = probe("sqs", rig=True)
    loaded = set(doc["loaded"])
    assert loaded.isdisjoint({"chaos", "reclaimd.report", "reclaimd.status"} | NEVER), loaded


def test_pubsub_alone_loads_its_client_before_the_tasks_start_and_no_boto3() -> None:
    doc = probe("pubsub")
    assert doc["built"] == ["pubsub"]
    loaded = set(doc["loaded"])
    # At build, not on the loop inside run().
    assert loaded >= PUBSUB | ALWAYS
    assert loaded.isdisjoint(AWS | EXPORTERS | NEVER), loaded


@pytest.mark.parametrize(
    ("otel", "present", "absent"),
    [
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"},
            {"opentelemetry.exporter.otlp.proto.grpc", "grpc"},
            {"opentelemetry.exporter.otlp.proto.http"},
        ),
        (
            {"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"},
            {"opentelemetry.exporter.otlp.proto.http"},
            {"opentelemetry.exporter.otlp.proto.grpc", "grpc"},
        ),
        # Another signal's variable alone: the span file, no exporter.
        ({"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://127.0.0.1:9"}, set(), EXPORTERS),
    ],
)
def test_an_otlp_exporter_only_when_trace_export_is_on(
    otel: dict[str, str], present: set[str], absent: set[str]
) -> None:
    loaded = set(probe("sqs", **otel)["loaded"])
    assert loaded >= present
    assert loaded.isdisjoint(absent | {"google.cloud.pubsub_v1"}), loaded


def test_the_probe_can_enable_every_source() -> None:
    """``all`` is every registry entry: a new source gives the probe its minimal settings."""
    spec = importlib.util.spec_from_file_location("startup_probe", PROBE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert set(module.SOURCES) == {e.name for e in handlers.REGISTRY}
