"""What reclaimd does to the cluster: cordon and taint a node, evict a pod, wait for it to go.

Every action is idempotent and every write goes through the shared ``RateLimiter`` with the
notice's deadline, so in a storm the most urgent node is served first.

- ``cordon_and_taint`` sets ``spec.unschedulable`` and one ``reclaimd.io/interruption=<kind>
  :NoSchedule`` taint, keeping every other taint. The patch carries the resourceVersion it
  was computed from (the taint list is replaced whole), so a concurrent edit is re-read, not
  overwritten. Nothing is written when the node already looks right; a vanished node is done.
- ``evict`` uses the Eviction subresource, which honours PodDisruptionBudgets, with a uid
  precondition so a StatefulSet's replacement pod of the same name is never hit. 429 (a PDB
  says no) and the 500 the server gives for a pod under several PDBs are retried when a
  PDB covering the pod changes (``budget_changes``, the cache's PDB watch; a long timer
  covers a change the watch missed), or with capped backoff when there is no watch, never
  past the point where the policy gives up:
  ``respect-pdb`` retries until the deadline and reports ``blocked``;
  ``force-near-deadline`` retries until ``deadline - force_before_s``, then deletes the pod
  with a short grace period: a PDB protects availability, and the node takes every pod with
  it at the deadline anyway, so the last seconds are better spent on an orderly SIGTERM.
  Under ``force-near-deadline``, a gang whose checkpoint ask is over (``saved``) is not held
  by a PDB that guards only its own pods (``only_its_gang``; ``drain_when_saved``): the gang
  is going either way, and every second it waits for ``force_before_s`` is a second its
  replacement does not train. Such a refused pod is deleted at once, with the same grace.
  ``respect-pdb`` honours every PDB to the end, as it says.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from datetime import datetime
from enum import StrEnum

from reclaimd.backoff import RetryPolicy
from reclaimd.cluster import apiserver, errors, objects, taints
from reclaimd.cluster.apiserver import ApiServer, JsonObject
from reclaimd.cluster.ratelimit import RateLimiter
from reclaimd.model import Member, Notice, utcnow
from reclaimd.settings.policy import EvictionPolicy, PolicySettings

log = logging.getLogger(__name__)


# The cache's PDB watch: (namespace, pod) -> a context holding an event set when a PDB
# covering the pod changes (None: no watch to trust, retry on a timer).
BudgetChanges = Callable[[str, str], AbstractContextManager[asyncio.Event | None]]


class EvictResult(StrEnum):
    EVICTED = "evicted"  # the API accepted the eviction; the pod is terminating
    GONE = "gone"  # the pod (this uid) was already gone
    BLOCKED = "blocked"  # respect-pdb: a PDB refused until the deadline
    FORCED = "forced"  # force-near-deadline: deleted despite the PDB
    RELEASED = "released"  # saved, and its PDB guards only its own gang: deleted at once
    FAILED = "failed"  # a non-retriable error (RBAC, invalid request)


class ClusterActions:
    def __init__(
        self,
        api_client: ApiServer,
        *,
        limiter: RateLimiter,
        settings: PolicySettings = PolicySettings(),
        pod_exists: Callable[[str, str, str], bool] | None = None,
        budget_changes: BudgetChanges | None = None,
        clock: Callable[[], datetime] = utcnow,
        gone_at: Callable[[str], datetime | None] | None = None,
        only_its_gang: Callable[[str, str], bool] | None = None,
    ) -> None:
        """``pod_exists``: the cache's view (cheap in a storm); without it, ask the API.
        ``budget_changes``: the cache's PDB watch (``CacheView.budget_changes``).
        ``gone_at``: when the cache saw a pod (by uid) leave (``CacheView.pod_gone_at``).
        ``only_its_gang``: whether every PDB covering a pod guards only its gang's pods
        (``CacheView.pdbs_guard_only_its_gang``); without it, none is taken to."""
        self._api = api_client
        self._limiter = limiter
        self._settings = settings
        self._pod_exists = pod_exists
        self._budget_changes = budget_changes
        self._clock = clock
        self._gone_at = gone_at
        self._only_its_gang = only_its_gang

    # --- cordon and taint --------------------------------------------------------------

    async def cordon_and_taint(self, node: str, notice: Notice) -> None:
        """Mark ``node`` unschedulable with our taint; no-op when already so or gone.

        The storm path cordons in the claim's own write (``claims``); this stands alone for
        callers that hold no claim."""
        what = f"cordon node/{node}"

        async def change(current: objects.Obj) -> None:
            now = objects.spec(current)
            spec = taints.cordon_spec(
                bool(now.get("unschedulable")),
                [t for t in now.get("taints") or () if isinstance(t, Mapping)],
                notice.kind.value,
            )
            if spec is None:
                return
            body = {
                "metadata": {"resourceVersion": objects.meta(current).get("resourceVersion")},
                "spec": spec,
            }
            await self._limiter.call(
                what,
                notice.deadline,
                functools.partial(self._api.patch, apiserver.node(node), body),
            )
            log.info("%s: cordoned, tainted %s=%s", what, taints.TAINT_KEY, notice.kind.value)

        try:
            await self._limiter.update(
                what,
                notice.deadline,
                lambda: self._api.get(apiserver.node(node)),
                change,
                conflicts=20,
            )
        except errors.NotFound:
            log.info("%s: node is gone, nothing to cordon", what)

    # --- eviction ------------------------------------------------------------------------

    async def evict(
        self,
        member: Member,
        *,
        deadline: datetime,
        policy: EvictionPolicy | None = None,
        saved: bool = False,
    ) -> EvictResult:
        """Evict one pod under ``policy`` (default: the configured one); ``saved``: its gang's
        checkpoint ask is over. See the module doc."""
        policy = policy or self._settings.eviction
        give_up_at = deadline.timestamp()
        if policy is EvictionPolicy.FORCE_NEAR_DEADLINE:
            give_up_at -= self._settings.force_before_s
        what = f"evict pod/{member.namespace}/{member.name}"
        give_up = datetime.fromtimestamp(give_up_at, tz=deadline.tzinfo)
        attempt = 0
        while True:
            hint_s: float | None = None
            # Entered before the request: a PDB change while it is in flight still wakes us.
            with self._watch_budgets(member) as changed:
                try:
                    await self._limiter.call(
                        what,
                        deadline,
                        lambda: self._api.post(_eviction_path(member), _eviction(member)),
                        retry_until=give_up,
                    )
                    return EvictResult.EVICTED
                except errors.NotFound:
                    return EvictResult.GONE
                except errors.Conflict:
                    # The uid precondition failed: a different pod holds the name now.
                    if not await self._still_there(member):
                        return EvictResult.GONE
                except (errors.TooManyRequests, errors.ServerError) as e:
                    # 429: a PDB refuses. 500: the pod is under several PDBs (the server
                    # cannot pick one). Load shedding was already retried by the budget.
                    hint_s = e.retry_after_s
                    if (
                        saved
                        and policy is EvictionPolicy.FORCE_NEAR_DEADLINE
                        and self._releases(member)
                    ):
                        return await self._force_delete(
                            member, self._clock(), deadline, what, EvictResult.RELEASED
                        )
                except errors.KubeError as e:
                    log.warning("%s: %s", what, e)
                    return EvictResult.FAILED
                attempt += 1
                remaining = give_up_at - self._clock().timestamp()
                if remaining <= 0:
                    break
                # Never sleep past the point of giving up; one last try happens right there,
                # unless the watch saw no PDB of the pod change since this refusal (it would
                # be refused again, and in a storm every forced delete is due at once).
                delay = self._retry_delay(attempt, hint_s, remaining, watched=changed is not None)
                woke = await _until_set(changed, min(delay, remaining))
                if changed is not None and not woke and self._clock().timestamp() >= give_up_at:
                    break
        if policy is EvictionPolicy.RESPECT_PDB:
            log.warning("%s: blocked until the deadline (respect-pdb)", what)
            return EvictResult.BLOCKED
        return await self._force_delete(member, give_up, deadline, what, EvictResult.FORCED)

    def _releases(self, member: Member) -> bool:
        return (
            self._settings.drain_when_saved
            and self._only_its_gang is not None
            and self._only_its_gang(member.namespace, member.name)
        )

    def _watch_budgets(self, member: Member) -> AbstractContextManager[asyncio.Event | None]:
        if self._budget_changes is None:
            return contextlib.nullcontext()
        return self._budget_changes(member.namespace, member.name)

    def _retry_delay(
        self, attempt: int, hint_s: float | None, remaining_s: float, *, watched: bool
    ) -> float:
        if watched:
            return self._settings.watched_retry_s
        # A PDB that stays shut (a budget no deletion can free) is asked less often the
        # further off its deadline is: a tenth of the time left, at least the cap.
        s = self._settings
        policy = RetryPolicy(s.retry_base_s, s.retry_cap_s, jitter="half")
        return policy.delay(
            attempt,
            cap_s=max(s.retry_cap_s, remaining_s / 10),
            hint_s=min(hint_s or 0.0, s.retry_cap_s),
        )

    async def _force_delete(
        self, member: Member, due: datetime, deadline: datetime, what: str, outcome: EvictResult
    ) -> EvictResult:
        left = int(max(0.0, deadline.timestamp() - self._clock().timestamp()))
        grace = min(self._settings.delete_grace_s, left)
        try:
            # Due now, not at the deadline: it goes before evictions that can still wait.
            await self._limiter.call(
                what,
                due,
                # The grace in the query too, as the generated client sent it.
                lambda: self._api.request(
                    "DELETE",
                    apiserver.pod(member.namespace, member.name),
                    params={"gracePeriodSeconds": grace},
                    body={"gracePeriodSeconds": grace, **_preconditions(member)},
                ),
                retry_until=deadline,
            )
        except (errors.NotFound, errors.Conflict):
            return EvictResult.GONE
        except errors.KubeError as e:
            log.warning("%s: forced delete failed: %s", what, e)
            return EvictResult.FAILED
        if outcome is EvictResult.FORCED:
            log.warning("%s: PDB refusing near the deadline, deleted with %ds grace", what, grace)
        else:
            log.info("%s: saved, its PDB guards only its gang: deleted, %ds grace", what, grace)
        return outcome

    # --- waiting -------------------------------------------------------------------------

    async def wait_gone(self, member: Member, *, deadline: datetime) -> datetime | None:
        """When the pod was first seen gone, or None if it was still there at ``deadline``."""
        while True:
            if not await self._still_there(member):
                # Gone before we looked (a dead owner evicted it): charged to when it went.
                # A process that never saw it go (it started after) knows only that it went
                # by now, and by the deadline, when the capacity went with it.
                seen = self._gone_at(member.uid) if self._gone_at is not None else None
                return seen or min(self._clock(), deadline)
            left = deadline.timestamp() - self._clock().timestamp()
            if left <= 0:
                return None
            await asyncio.sleep(min(self._settings.poll_interval_s, left))

    async def _still_there(self, member: Member) -> bool:
        if self._pod_exists is not None:
            return self._pod_exists(member.namespace, member.name, member.uid)
        try:
            pod = await self._limiter.read(
                f"read pod/{member.namespace}/{member.name}",
                None,
                lambda: self._api.get(apiserver.pod(member.namespace, member.name)),
            )
        except errors.NotFound:
            return False
        return not member.uid or objects.uid(pod) == member.uid


async def _until_set(event: asyncio.Event | None, timeout_s: float) -> bool:
    """Sleep ``timeout_s``, or less if ``event`` is set first; whether it was."""
    if event is None:
        await asyncio.sleep(timeout_s)
        return False
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout_s):
            await event.wait()
    return event.is_set()


def _preconditions(member: Member) -> JsonObject:
    """DeleteOptions' uid precondition, when the pod's uid is known (else none)."""
    return {"preconditions": {"uid": member.uid}} if member.uid else {}


def _eviction_path(member: Member) -> str:
    return apiserver.core("pods", member.name, member.namespace) + "/eviction"


def _eviction(member: Member) -> JsonObject:
    """The Eviction of ``member``, with its uid as a precondition when known."""
    return {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": member.name, "namespace": member.namespace},
        "deleteOptions": _preconditions(member),
    }
