"""The restart-waste ledger: where its events go and how its writer publishes them
(``reclaimd.ledger``)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from reclaimd.strict import Strict


class LedgerWriterSettings(Strict):
    """The ledger writer's tuning (``LedgerWriter(tuning=s.ledger.writer)``)."""

    batch_size: int = Field(100, ge=1, le=10_000)  # events per Kafka transaction
    backoff_initial_s: float = Field(0.5, gt=0)  # after a failed publish, doubling to
    backoff_max_s: float = Field(30.0, gt=0)
    request_timeout_ms: int = Field(30_000, ge=1000)
    client_id: str = Field("reclaimd-ledger", min_length=1, max_length=200)
    retention_s: float = Field(7 * 86_400, gt=0)  # published rows kept in the outbox
    recover_every_s: float = Field(10.0, gt=0)  # dead peers' events looked for this often
    scan_margin_s: float = Field(600.0, ge=0)  # topic scan for an unknown outcome: back this far
    scan_timeout_s: float = Field(120.0, gt=0)


class LedgerSettings(Strict):
    bootstrap: str = ""  # empty: events stay in the outbox until a broker is configured
    topic: str = "reclaimd.restart-waste"
    outbox_path: Path = Path("/var/lib/reclaimd/outbox.sqlite")
    label_allowlist: tuple[str, ...] = ("tenant", "queue", "sku", "cell", "purchase_option")
    writer: LedgerWriterSettings = LedgerWriterSettings()

    def beside_outbox(self, suffix: str) -> Path:
        """A file of this replica's state next to the outbox (same volume, same lifetime):
        ``outbox.sqlite`` -> ``outbox-<suffix>``."""
        return self.outbox_path.with_name(f"{self.outbox_path.stem}-{suffix}")
