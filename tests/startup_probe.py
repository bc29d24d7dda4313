"""What a replica has imported when ``reclaimd run`` is about to start its tasks.

Runs the real ``reclaimd run`` (``cli.main``) with a config enabling the named sources, and
stops it where the cluster cache would start (``ClusterCache.start``): the settings loaded,
tracing set up, the API client, every part wired and every enabled source built, nothing
running. No server is needed: the kubeconfig names a closed port, which is never dialled
before that point, and the metrics port is 0 (not served). Prints one JSON line: the sources
built, the module count, VmRSS/VmHWM (KiB) and which of ``HEAVY`` are loaded.

    PYTHONPATH=. python tests/startup_probe.py sqs     # or pubsub, sqs,imds, ..., all
    PYTHONPATH=/other/checkout python tests/startup_probe.py all   # another tree's figures

Used by tests/unit/test_startup_imports.py; also the measurement of issue 21 item 3.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

# The client libraries a replica should load only for what it runs (aiokafka, for the ledger,
# is always needed; kubernetes_asyncio never is: reclaimd.cluster.apiserver speaks to the API
# server).
HEAVY = (
    "boto3",
    "botocore",
    "google.cloud.pubsub_v1",
    "google.api_core",
    "grpc",
    "google.protobuf",
    "opentelemetry.exporter",
    "opentelemetry.exporter.otlp.proto.grpc",
    "opentelemetry.exporter.otlp.proto.http",
    "duckdb",
    "reclaimd_trainer.s3",
    "aiokafka",
    "kubernetes_asyncio",
    "reclaimd.cluster.apiserver",
    "chaos",
    "reclaimd.report",
)

CLOSED = "127.0.0.1:9"  # discard: nothing is dialled before the seam anyway

SOURCES: dict[str, dict[str, Any]] = {
    "sqs": {"queue_url": f"http://{CLOSED}/1/q", "endpoint_url": f"http://{CLOSED}"},
    "imds": {"url": f"http://{CLOSED}"},
    "pubsub": {"project": "p", "subscription": "s", "endpoint": CLOSED},
    "gce_metadata": {"url": f"http://{CLOSED}", "node_name": "n"},
    "azure_scheduled": {"url": f"http://{CLOSED}", "node_name": "n"},
    "kueue": {},
    "kafka_notices": {"bootstrap": CLOSED},
}


class Seam(Exception):
    """Where the probe stops the daemon."""


def write_config(tmp: Path, names: list[str]) -> Path:
    kubeconfig = tmp / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "c",
                "clusters": [{"name": "c", "cluster": {"server": f"https://{CLOSED}"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
            }
        )
    )
    doc: dict[str, Any] = {name: {"enabled": True, **SOURCES[name]} for name in names}
    doc.update(
        kube={"kubeconfig": str(kubeconfig)},
        ledger={"bootstrap": CLOSED, "outbox_path": str(tmp / "outbox.sqlite")},
        tracing={"span_file": str(tmp / "spans.jsonl")},
        metrics_port=0,
        holder="probe",
    )
    path = tmp / "reclaimd.json"
    path.write_text(json.dumps(doc))
    return path


def vm(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def main(which: str) -> dict[str, Any]:
    names = list(SOURCES) if which == "all" else which.split(",")
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "probe")  # boto3 clients are built, not used
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "probe")
    seen: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        config = write_config(Path(tmp), names)
        if not os.environ.get("PROBE_WITH_RIG"):
            sys.modules["chaos"] = None  # type: ignore[assignment]  # as in the image: no rig
        from reclaimd import cli, daemon
        from reclaimd.cluster import cache

        built = daemon.Daemon._sources

        def sources(self: daemon.Daemon, parts: Any, api: Any) -> Any:
            made = built(self, parts, api)
            seen["built"] = sorted(made)
            return made

        async def start(self: cache.ClusterCache) -> None:
            seen["modules"] = len(sys.modules)
            seen["rss_kib"], seen["hwm_kib"] = vm("VmRSS"), vm("VmHWM")
            seen["loaded"] = [m for m in HEAVY if m in sys.modules]
            raise Seam

        daemon.Daemon._sources = sources  # type: ignore[method-assign]
        cache.ClusterCache.start = start  # type: ignore[method-assign]
        cli.main(["run", "--config", str(config), "--log-level", "error"])
    if "modules" not in seen:
        raise SystemExit("the daemon stopped before the seam (its log is above)")
    return seen


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1] if len(sys.argv) > 1 else "all")))
