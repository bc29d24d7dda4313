"""The cluster cache's LIST+WATCH loops (``reclaimd.cluster.watch``)."""

from __future__ import annotations

from pydantic import Field

from reclaimd.strict import Strict


class WatchSettings(Strict):
    """The cluster cache's LIST+WATCH loops (``reclaimd.cluster.watch``)."""

    inactivity_timeout_s: float = Field(70.0, gt=0)
    """The server sends a BOOKMARK about every 60 s on an idle watch; 70 s of silence means
    the connection is dead, not that nothing happens."""

    server_timeout_s: int = Field(300, ge=1, le=3600)
    """``timeoutSeconds`` asked of the server; it closes the stream then and we reconnect,
    which also rebalances watches across API servers behind a load balancer."""

    page_size: int = Field(250, ge=1, le=10_000)
    """LIST page size: bounds the memory of one response on a large cluster. A page is parsed
    whole before it is projected, so this is the LIST's transient cost (``make bench-cache``
    at 10,000 nodes and 100,000 pods: 500 per page peaked 13 MB higher than 250)."""

    backoff_base_s: float = Field(0.5, gt=0)
    backoff_cap_s: float = Field(30.0, gt=0)
    """Full-jitter backoff after a transient failure: uniform(0, min(cap, base * 2**n))."""
