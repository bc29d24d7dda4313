"""The checkpoint requests reclaimd sends to the ranks (``reclaimd.checkpoint``;
docs/checkpoint-contract.md)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator

from reclaimd.annotations import UrlPolicy
from reclaimd.strict import Strict


class CheckpointSettings(Strict):
    """The checkpoint requests reclaimd sends to the ranks (docs/checkpoint-contract.md)."""

    require_pod_ip: bool = True
    """On: a checkpoint URL must name the pod's own IP or an allowed host; off: any host."""

    allowed_hosts: tuple[str, ...] = ()
    """Exceptions: host names (matched exactly), IP addresses and CIDRs, e.g. 127.0.0.1 for
    trainers on loopback in a drill, or a checkpoint sidecar's Service name."""

    poll_interval_s: float = Field(0.5, gt=0, le=60)
    """A rank that answered with a status URL is polled this often."""

    concurrency: int = Field(64, ge=1, le=65_536)
    """Checkpoint requests of one gang in flight at once."""

    identity_token_file: Path | None = None
    """reclaimd's projected ServiceAccount token (audience reclaimd.io/checkpoint), sent with
    every request to a rank so that ranks can verify who asks (``reclaimd/identity.py``);
    the chart mounts it here. None: requests carry no token (a rank that verifies refuses
    them)."""

    @field_validator("allowed_hosts")
    @classmethod
    def _hosts(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        UrlPolicy.parse(value)  # a ValueError becomes one line naming the field
        return value

    def url_policy(self) -> UrlPolicy:
        """Where checkpoint URLs may point: the pod's own IP (if required), plus the allowed
        hosts. Derived, so the cluster cache takes it as a constructor argument."""
        return UrlPolicy.parse(self.allowed_hosts, require_pod_ip=self.require_pod_ip)
