"""Each rank's share of its tenant's PutObject budget, handed out by reclaimd (pure logic).

A storm makes every rank of a tenant upload at once. A guard in each pod caps that pod, so 500
ranks would still send 500 x the tenant's rate (ARCHITECTURE §6, §8). reclaimd asks every rank,
so it splits the tenant's budget (``maxPutObjectQpsPerSa``, default 20 PutObject/s) among the
ranks it is waiting for, and each rank paces its uploads with a token bucket at its share.

What keeps the *sum* inside the budget, not just the average:

- A rank's share is ``(qps, burst)``: its bucket refills at ``qps`` and holds at most
  ``burst`` tokens. The shares handed out and not yet released never sum above the tenant's
  ``qps`` and ``burst``; a rank that sends at all holds ``burst >= 1`` (a bucket needs one whole
  token to send), so at most ``burst`` ranks of a tenant send at any time and the rest wait
  (share 0). In any window of T seconds a tenant then sends at most ``burst + qps x T``.
- Tokens are never handed over with a share: a rank keeps the tokens it has (clamped to its new
  burst) when its share changes, so a raise only lets tokens accrue faster. Only a grant (the
  checkpoint request itself) may start a rank with a full bucket, and only from the tenant's
  *cold* burst: the burst a storm starts with. Burst once handed out stays warm (it may just have
  been spent) until the tenant has had nothing in flight for ``idle_reset_s``, the time an empty
  tenant bucket takes to fill.
- Shares move at the pace of reclaimd's status polls: a rank above its target is lowered at its
  next refresh, one below is raised from what is unallocated. Lowering frees room only for
  later refreshes, so the sum never overshoots on the way.

Targets. Ranks in flight are ordered by deadline, then by arrival. With ``n`` in flight, the first
``k = min(n, burst, qps in milli-units)`` get ``qps / k`` and ``burst / k`` each (remainders to
the earliest), the others 0: the earliest deadlines upload first, and a rank that finishes hands
its room to the next one in line. Rates are kept in integer milli-PutObject/s so that the sum is
exact, not a float that rounds past the budget.

Wire format (docs/checkpoint-contract.md): the request body carries ``put_budget: {"qps": <float>,
"burst": <int>}``; every status poll carries ``X-Reclaimd-Put-Budget: qps=<float>;burst=<int>``.
Absent means "the pod's own guard limit" (reclaimd without this feature).
"""

from __future__ import annotations

import bisect
import math
import re
import time
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field

from reclaimd.model import Gang, Member, Notice

# The share and its wire forms are the trainer SDK's (it reads them); re-exported for the
# controller's callers.
from reclaimd_trainer.budget import (
    DEFAULT_QPS,
    HEADER,
    MAX_BURST,
    MAX_QPS,
    MILLI,
    REQUEST_FIELD,
    Share,
    parse_field,
    parse_header,
)

# Re-exported: the share and its wire forms, which the trainer SDK owns.
__all__ = [
    "DEFAULT_QPS", "HEADER", "MAX_BURST", "MAX_QPS", "MILLI", "REQUEST_FIELD", "Share",
    "parse_field", "parse_header",
]

# --- whose budget a rank draws on ---------------------------------------------------------

_TENANT = re.compile(r"[A-Za-z0-9._-]{1,63}")


def tenant_of(gang: Gang) -> str:
    """The tenant whose budget a gang's ranks share: its ``tenant`` cost label (the pods'
    ``reclaimd.io/tenant``), else its namespace (the service account's scope)."""
    label = gang.labels.get("tenant")
    return label if isinstance(label, str) and _TENANT.fullmatch(label) else gang.key.namespace


def rank_key(notice: Notice, member: Member) -> tuple[str, str]:
    """One rank asked for one notice. Two notices asking one pod at once count twice: the
    pod takes one share at a time, so that errs on the budget's side."""
    return notice.id, member.uid or f"{member.namespace}/{member.name}"


# --- the allocator ------------------------------------------------------------------------

RankId = Hashable


@dataclass
class _Rank:
    key: tuple[float, int]  # (deadline or +inf, arrival): the order ranks are served in
    qps: int = 0  # milli-PutObject/s
    burst: int = 0
    granted: bool = False  # announced ranks count towards targets before they are asked


@dataclass
class _Tenant:
    qps: int  # the tenant's budget, milli-PutObject/s
    burst: int
    cold: int  # burst that may start a rank with a full bucket (see the module docstring)
    ranks: dict[RankId, _Rank] = field(default_factory=dict)
    order: list[tuple[float, int]] = field(default_factory=list)  # sorted keys of ``ranks``
    qps_out: int = 0  # sum over ranks
    burst_out: int = 0
    idle_since: float | None = None


class TenantPutBudgets:
    """Per-tenant PutObject budgets split into per-rank shares.

    ``qps_per_tenant`` is the tenant's budget in PutObject/s, ``burst_per_tenant`` the size of
    its bucket (default: one second of the rate, at least 1). ``budgets`` overrides both for
    named tenants. ``now`` defaults to ``clock()``; it only matters for ``idle_reset_s``.
    """

    def __init__(
        self,
        qps_per_tenant: float = DEFAULT_QPS,
        burst_per_tenant: int | None = None,
        *,
        budgets: Mapping[str, tuple[float, int]] | None = None,
        idle_reset_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._default = _check_budget(qps_per_tenant, burst_per_tenant)
        self._budgets = {t: _check_budget(q, b) for t, (q, b) in (budgets or {}).items()}
        if idle_reset_s is not None and not (math.isfinite(idle_reset_s) and idle_reset_s >= 0):
            raise ValueError("idle_reset_s must be a non-negative number")
        self._idle_reset_s = idle_reset_s
        self._clock = clock
        self._tenants: dict[str, _Tenant] = {}
        self._seq = 0

    # --- reading ----------------------------------------------------------------------------

    def budget(self, tenant: str) -> Share:
        qps, burst = self._budgets.get(tenant, self._default)
        return Share.of_milli(qps, burst)

    def outstanding(self, tenant: str) -> tuple[int, int]:
        """(milli-PutObject/s, burst) handed out and not released: never above the budget."""
        t = self._tenants.get(tenant)
        return (0, 0) if t is None else (t.qps_out, t.burst_out)

    def in_flight(self, tenant: str) -> int:
        t = self._tenants.get(tenant)
        return 0 if t is None else len(t.ranks)

    def share_of(self, tenant: str, rank_id: RankId) -> Share | None:
        t = self._tenants.get(tenant)
        r = None if t is None else t.ranks.get(rank_id)
        return None if r is None else Share.of_milli(r.qps, r.burst)

    # --- the calls reclaimd makes -----------------------------------------------------------

    def announce(
        self,
        tenant: str,
        rank_ids: Iterable[RankId],
        *,
        deadline: float | None = None,
        now: float | None = None,
    ) -> None:
        """Count ranks about to be asked (one gang's fan-out) before the first is granted, so
        the first grant does not take the whole budget. Each must be granted or released."""
        t = self._tenant(tenant, self._now(now))
        for rank_id in rank_ids:
            if rank_id not in t.ranks:
                self._add(t, rank_id, deadline)

    def grant(
        self,
        tenant: str,
        rank_id: RankId,
        *,
        deadline: float | None = None,
        now: float | None = None,
    ) -> Share:
        """The share to send with a checkpoint request: ``min(target, unallocated)``, its burst
        from the cold burst only. Granting a rank already granted is a refresh."""
        t = self._tenant(tenant, self._now(now))
        r = t.ranks.get(rank_id)
        if r is None:
            r = self._add(t, rank_id, deadline)
        elif r.granted:
            return self._refresh(t, r)
        r.granted = True
        want_qps, want_burst = self._target(t, r)
        burst = min(want_burst - r.burst, t.cold) if want_burst > r.burst else 0
        t.cold -= burst
        self._move(t, r, r.qps, r.burst + burst)
        if want_qps > r.qps and r.burst > 0:
            self._move(t, r, min(want_qps, r.qps + t.qps - t.qps_out), r.burst)
        return Share.of_milli(r.qps, r.burst)

    def refresh(self, tenant: str, rank_id: RankId, *, now: float | None = None) -> Share:
        """The share to send with a status poll; a rank not in flight gets 0 (wait)."""
        t = self._tenants.get(tenant)
        r = None if t is None else t.ranks.get(rank_id)
        if t is None or r is None:
            return Share(0.0, 0)
        return self._refresh(t, r)

    def release(self, tenant: str, rank_id: RankId, *, now: float | None = None) -> None:
        """The rank answered or was given up: its share goes back. Idempotent."""
        t = self._tenants.get(tenant)
        r = None if t is None else t.ranks.pop(rank_id, None)
        if t is None or r is None:
            return
        del t.order[bisect.bisect_left(t.order, r.key)]
        t.qps_out -= r.qps
        t.burst_out -= r.burst
        if not t.ranks:
            t.idle_since = self._now(now)

    def release_all(self, tenant: str, rank_ids: Iterable[RankId]) -> None:
        for rank_id in rank_ids:
            self.release(tenant, rank_id)

    # --- inside -----------------------------------------------------------------------------

    def _now(self, now: float | None) -> float:
        return self._clock() if now is None else now

    def _tenant(self, tenant: str, now: float) -> _Tenant:
        t = self._tenants.get(tenant)
        qps, burst = self._budgets.get(tenant, self._default)
        if t is None:
            t = _Tenant(qps=qps, burst=burst, cold=burst)
            self._tenants[tenant] = t
        elif not t.ranks and t.idle_since is not None:
            # Idle long enough for an empty tenant bucket to fill: the storm starts cold again.
            reset = self._idle_reset_s if self._idle_reset_s is not None else burst * MILLI / qps
            if now - t.idle_since >= reset:
                t.cold = t.burst
        t.idle_since = None
        return t

    def _add(self, t: _Tenant, rank_id: RankId, deadline: float | None) -> _Rank:
        self._seq += 1
        order = deadline if deadline is not None and math.isfinite(deadline) else math.inf
        r = _Rank(key=(order, self._seq))
        t.ranks[rank_id] = r
        bisect.insort(t.order, r.key)
        return r

    def _target(self, t: _Tenant, r: _Rank) -> tuple[int, int]:
        k = min(len(t.ranks), t.burst, t.qps)
        pos = bisect.bisect_left(t.order, r.key)
        if pos >= k:
            return 0, 0
        qps = t.qps // k + (1 if pos < t.qps % k else 0)
        burst = t.burst // k + (1 if pos < t.burst % k else 0)
        return qps, burst

    def _move(self, t: _Tenant, r: _Rank, qps: int, burst: int) -> None:
        t.qps_out += qps - r.qps
        t.burst_out += burst - r.burst
        r.qps, r.burst = qps, burst

    def _refresh(self, t: _Tenant, r: _Rank) -> Share:
        if not r.granted:
            return Share(0.0, 0)
        want_qps, want_burst = self._target(t, r)
        # Lower first: what a rank gives back is only taken at later refreshes.
        qps, burst = min(r.qps, want_qps), min(r.burst, want_burst)
        self._move(t, r, qps, burst)
        if burst < want_burst:
            # Raised without tokens, so any burst will do; warm first, keeping the cold burst
            # for grants (which may start a rank full).
            free = t.burst - t.burst_out
            more = min(want_burst - burst, free)
            t.cold -= max(0, more - (free - t.cold))
            self._move(t, r, qps, burst + more)
        if r.burst == 0:
            self._move(t, r, 0, 0)  # a bucket that holds no token cannot send: rate is useless
        elif r.qps < want_qps:
            self._move(t, r, min(want_qps, r.qps + t.qps - t.qps_out), r.burst)
        return Share.of_milli(r.qps, r.burst)


def _check_budget(qps: float, burst: int | None) -> tuple[int, int]:
    if not (math.isfinite(qps) and 0 < qps <= MAX_QPS):
        raise ValueError(f"a tenant's PutObject budget must be in (0, {MAX_QPS:g}] per second")
    milli = max(1, math.floor(qps * MILLI))
    b = max(1, math.ceil(qps)) if burst is None else burst
    if isinstance(b, bool) or not isinstance(b, int) or not 1 <= b <= MAX_BURST:
        raise ValueError(f"a tenant's PutObject burst must be an integer in [1, {MAX_BURST}]")
    return milli, b
