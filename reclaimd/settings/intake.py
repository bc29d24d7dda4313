"""The intake's dedup memory (``reclaimd.intake``)."""

from __future__ import annotations

from pydantic import Field

from reclaimd.strict import Strict


class IntakeSettings(Strict):
    memory: int = Field(50_000, ge=100, le=10_000_000)
    """Notice ids remembered as seen (a redelivered notice is recognised while remembered)."""
