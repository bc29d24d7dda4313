"""Restart overhead (``reclaimd.restarts``; docs/ledger.md)."""

from __future__ import annotations

from pydantic import Field

from reclaimd.strict import Strict


class RestartSettings(Strict):
    """Restart overhead (docs/ledger.md): from a notice's receipt until the gang it charged
    trains again, on the ledger topic as ``reclaimd.restart-overhead/v1``."""

    enabled: bool = True
    interval_s: float = Field(15.0, gt=0)  # the charged gangs' Leases are read this often
    # A rank that speaks the SDK's /incarnation but has not stepped this long after all pods
    # were Ready: the restart is measured to Ready.
    sdk_wait_s: float = Field(600.0, ge=0)
