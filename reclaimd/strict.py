"""The base of every settings section: unknown keys refused, values frozen.

Its own module so that ``reclaimd.config`` (which assembles ``Settings``), the parts' own
models (``reclaimd.settings``) and ``reclaimd.handlers.entry`` (whose entries carry their
sections' models) can build on it without importing each other's way round.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    # Unknown keys are typos more often than not: refuse them.
    model_config = ConfigDict(extra="forbid", frozen=True)
