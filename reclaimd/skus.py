"""GPUs and GPU memory per instance type, for the allocation meter and the report.

HBM-GB-hours need the memory of each GPU, which no Kubernetes object states; this table is
the documented source (docs/ledger.md repeats it). Figures are the vendors' published
per-GPU memory for the GPU each instance type carries. An instance type missing here still
meters GPU-hours; its HBM-GB-hours are 0 and the meter counts it as unknown.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final


@dataclass(frozen=True)
class Sku:
    gpu: str
    gpus: int  # GPUs per instance
    hbm_gb: float  # memory per GPU, GB


SKUS: Final[dict[str, Sku]] = {
    # AWS
    "p6-b200.48xlarge": Sku("B200", 8, 179.0),
    "p5en.48xlarge": Sku("H200", 8, 141.0),
    "p5e.48xlarge": Sku("H200", 8, 141.0),
    "p5.48xlarge": Sku("H100", 8, 80.0),
    "p5.4xlarge": Sku("H100", 1, 80.0),
    "p4de.24xlarge": Sku("A100-80GB", 8, 80.0),
    "p4d.24xlarge": Sku("A100-40GB", 8, 40.0),
    "g6e.48xlarge": Sku("L40S", 8, 48.0),
    "g6e.xlarge": Sku("L40S", 1, 48.0),
    "g6.48xlarge": Sku("L4", 8, 24.0),
    "g6.xlarge": Sku("L4", 1, 24.0),
    "g5.48xlarge": Sku("A10G", 8, 24.0),
    "g5.xlarge": Sku("A10G", 1, 24.0),
    # Google Cloud
    "a4-highgpu-8g": Sku("B200", 8, 180.0),
    "a3-ultragpu-8g": Sku("H200", 8, 141.0),
    "a3-megagpu-8g": Sku("H100", 8, 80.0),
    "a3-highgpu-8g": Sku("H100", 8, 80.0),
    "a2-ultragpu-8g": Sku("A100-80GB", 8, 80.0),
    "a2-ultragpu-1g": Sku("A100-80GB", 1, 80.0),
    "a2-highgpu-8g": Sku("A100-40GB", 8, 40.0),
    "a2-highgpu-1g": Sku("A100-40GB", 1, 40.0),
    "g2-standard-96": Sku("L4", 8, 24.0),
    "g2-standard-4": Sku("L4", 1, 24.0),
}

# A MIG profile names its compute slices and memory: "1g.10gb", "3g.40gb", "1g.18gb+me".
_MIG = re.compile(r"(?:mig-)?(\d+)g\.(\d+)gb(?:\+me)?")
MIG_SLICES_PER_GPU: Final = 7  # A100/H100/H200/B200 MIG: seven compute slices


def lookup(sku: str | None) -> Sku | None:
    return SKUS.get(sku or "")


def mig_profile(name: str) -> tuple[int, float] | None:
    """(compute slices, memory GB) of a MIG profile name, ``None`` if it is not one."""
    m = _MIG.fullmatch(name.strip().lower())
    return (int(m.group(1)), float(m.group(2))) if m else None
