"""Where a replica's spans are written (``reclaimd.tracing``)."""

from __future__ import annotations

from pathlib import Path

from reclaimd.strict import Strict


class TracingSettings(Strict):
    span_file: Path | None = Path("/var/lib/reclaimd/spans.jsonl")
