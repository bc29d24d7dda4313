"""The claim store (``reclaimd.cluster.claims``); its lease is ``claim_stale_s``."""

from __future__ import annotations

from pydantic import Field

from reclaimd.strict import Strict


class ClaimSettings(Strict):
    """The claim store (``ClaimSettings``; its lease is ``claim_stale_s``)."""

    max_conflicts: int = Field(20, ge=1, le=1000)
    """Rounds of one claim's read-modify-write after 409s before it gives up: each conflict
    means someone else (a peer, the node lifecycle controller) made progress on the node.
    Its own bound, not ``kube.max_conflicts`` (which bounds the client's re-reads of one
    object in ``RateLimiter.update``): a claim races its peers on purpose."""

    unanswered_s: float = Field(10.0, gt=0, le=300)
    """A claim is given up when the API server has answered nothing of ours for this long:
    the message goes back to its transport for a peer that can reach the server, instead of
    a cut-off replica holding it (and extending its lease) until the notice's deadline."""
