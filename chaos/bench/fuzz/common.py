"""What every part of ``make bench-fuzz`` shares: the transports and how many real notices each
carries, the fleet's shape, the progress line and a real notice's record."""

from __future__ import annotations

import hashlib
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

OUT = Path("out") / "bench-fuzz.json"
TRANSPORTS = ("sqs", "pubsub", "kafka_notices", "kueue", "imds", "gce_metadata", "azure_scheduled")
REAL = {
    "sqs": 4,
    "pubsub": 4,
    "kafka_notices": 4,
    "kueue": 2,
    "imds": 1,
    "gce_metadata": 1,
    "azure_scheduled": 1,
}
ACKED_TRANSPORTS = ("sqs", "pubsub", "kafka_notices")  # the ones with an ack to check
FLAT_TOLERANCE = 0.10
KUEUE = ("kueue.x-k8s.io", "v1beta2")
FUZZ_LABEL = "reclaimd.io/fuzz"
# kubernetes_asyncio's own keyword (its stubs do not declare it): a merge patch of the status.
MERGE_PATCH: dict[str, Any] = {"_content_type": "application/merge-patch+json"}
GCE_PROJECT = "reclaimd-local"
GCE_ZONE = "us-central1-a"
AWS_ZONE = "us-east-2a"
AZURE_PROJECT = "reclaimd-fuzz"  # names the AKS node resource group (fleet.azure_resource_group)
AZURE_LOCATION, AZURE_ZONE = "eastus", "1"  # the node's zone label: eastus-1, as AKS writes it
AZURE_SKU = "Standard_ND96isr_H100_v5"
MIN_NODES = sum(v for k, v in REAL.items() if k != "kueue")  # one node per real node notice


def progress(text: str) -> None:
    print(f"[bench-fuzz {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def _instance_id(run: str, key: str) -> str:
    return "i-" + hashlib.sha256(f"{run}/{key}".encode()).hexdigest()[:17]


@dataclass
class RealNotice:
    transport: str
    notice_id: str
    kind: str  # node | workload
    name: str
    namespace: str = ""
    sent_at: float = 0.0
    claimed_after_s: float | None = None


# --- the run ------------------------------------------------------------------------------
