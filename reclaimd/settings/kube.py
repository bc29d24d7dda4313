"""How reclaimd reaches the API server: its credentials and connections, and the one write
budget every write shares (``reclaimd.cluster.ratelimit.RateLimiter`` takes this as it is)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from reclaimd.strict import Strict


class KubeSettings(Strict):
    kubeconfig: Path | None = None
    """None: in-cluster service account. A kubeconfig may give a client certificate, a token
    or tokenFile, or an exec plugin (EKS, GKE, AKS); auth-provider is refused
    (``kubeconfig.py``)."""

    # The write budget adapts between min_qps and qps: it starts at start_qps, grows while the
    # API server accepts, halves on 429 / Retry-After / priority-and-fairness rejections, and
    # never exceeds qps. Every write (claims, evictions, Leases) shares it, earliest deadline
    # first.
    qps: float = Field(1000.0, gt=0)
    """The operator's cap on writes per second; the adaptive rate never goes above it."""

    start_qps: float = Field(300.0, gt=0)
    """Where the adaptive rate starts (above ``qps``: at the cap). A local kube-apiserver
    takes about 450 node PATCHes/s from one client; priority and fairness tells us when we
    are above."""

    min_qps: float = Field(5.0, gt=0)
    """The rate never backs off below this: a storm must still make progress."""

    burst: int = Field(100, ge=1)
    """Writes allowed at once after a quiet period."""

    connections: int = Field(64, ge=1, le=1024)
    """Connections to the API server: a storm's writes in flight at once."""

    growth_per_s: float = Field(0.25, gt=0, le=10)
    """While the server accepts, the write rate grows by this fraction of itself per second."""

    retry_base_s: float = Field(0.2, gt=0)
    retry_cap_s: float = Field(5.0, gt=0)
    """Backoff of a retried write (full jitter), never past its deadline."""

    max_attempts: int = Field(8, ge=1, le=100)
    """Attempts of one call when it has no deadline to bound it."""

    attempt_timeout_s: float = Field(10.0, gt=0)
    """One attempt's limit (a request the server never answers is a transient failure)."""

    max_conflicts: int = Field(8, ge=1, le=1000)
    """Re-reads of one object by ``RateLimiter.update`` before its 409s are raised, for every
    read-modify-write that names no bound of its own (Leases, cordons, gang records). A node
    claim has its own, ``claims.max_conflicts``."""

    forbidden_grace_s: float = Field(3.0, ge=0)
    """A 403 is retried for this long: a kube-apiserver that just restarted answers 403 until
    its authorizer has synced (about half a second). Past it, a 403 is RBAC's answer."""

    max_in_flight: int = Field(32, ge=1, le=1024)
    """Writes sent and not yet answered, at most. Past what the API server works on at once,
    more in flight only queue there, in the server's order: a cordon would wait behind
    Events and evictions sent before it. Queued here, the earliest deadline goes first.
    (A local kube-apiserver takes about as many writes/s at 32 in flight as at 128.)"""
