"""Our holder Lease: fresh, and whether it lapsed (a peer may have taken our claims over)."""

from datetime import timedelta
from typing import Any, cast

from reclaimd.cluster.holders import HolderLeases
from reclaimd.model import utcnow


class Accepting:
    """A write budget whose every write goes through (no API server needed)."""

    async def call(self, what: str, deadline: Any, write: Any, **kw: Any) -> None:
        return None


def leases() -> HolderLeases:
    return HolderLeases(
        cast(Any, None), "reclaimd", "me", lease_s=10.0, limiter=cast(Any, Accepting())
    )


async def test_a_renewal_after_a_gap_past_the_lease_marks_a_lapse() -> None:
    h = leases()
    assert not h.fresh()
    await h.renew()
    claimed = utcnow()
    assert h.fresh() and h.unbroken_since(claimed - timedelta(seconds=1))
    # An API server down for longer than the Lease: our last renewal is 30 s old.
    assert h.renewed_at is not None
    h.renewed_at -= timedelta(seconds=30)
    assert not h.fresh()
    await h.renew()
    assert h.fresh()  # renewed again...
    assert not h.unbroken_since(claimed)  # ...but a peer may have taken that claim over
    assert h.unbroken_since(utcnow() + timedelta(seconds=1))  # a claim made after is safe
