"""PDB selectors, the wake-up on a change, and an eviction that waits for one."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any, cast

import pytest

from reclaimd.cluster.actions import ClusterActions, EvictResult
from reclaimd.cluster.apiserver import ApiServer, ApiStatus
from reclaimd.cluster.pdbs import PdbIndex, selector_of
from reclaimd.cluster.ratelimit import RateLimiter
from reclaimd.model import Member, utcnow
from reclaimd.settings.policy import EvictionPolicy, PolicySettings


def pdb(name: str, selector: Any, namespace: str = "ns") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": namespace}, "spec": {"selector": selector}}


def test_selectors_follow_label_selector_rules() -> None:
    sel = selector_of(
        {
            "matchLabels": {"app": "train"},
            "matchExpressions": [
                {"key": "tier", "operator": "In", "values": ["gpu", "tpu"]},
                {"key": "canary", "operator": "DoesNotExist"},
                {"key": "zone", "operator": "NotIn", "values": ["c"]},
                {"key": "job", "operator": "Exists"},
            ],
        }
    )
    assert sel is not None
    good = {"app": "train", "tier": "gpu", "job": "j1"}
    assert sel.matches(good)
    assert sel.matches({**good, "zone": "a"})
    assert not sel.matches({**good, "zone": "c"})
    assert not sel.matches({**good, "canary": "yes"})
    assert not sel.matches({**good, "tier": "cpu"})
    assert not sel.matches({"app": "train", "tier": "gpu"})  # no job label
    assert not sel.matches({**good, "app": "eval"})
    # policy/v1: an empty selector selects every pod, a missing one none; an unknown
    # operator (the server would refuse it) selects nothing.
    empty = selector_of({})
    assert empty is not None and empty.matches({})
    assert selector_of(None) is None
    odd = selector_of({"matchExpressions": [{"key": "a", "operator": "Gt", "values": ["1"]}]})
    assert odd is not None and not odd.matches({"a": "2"})


def test_covering_is_per_namespace_and_follows_the_watch() -> None:
    idx = PdbIndex()
    idx.replace("", [pdb("a", {"matchLabels": {"app": "x"}}), pdb("none", None)])
    idx.put(pdb("b", {"matchLabels": {"app": "x"}}, namespace="other"))
    assert idx.covering("ns", {"app": "x"}) == ["a"]
    assert idx.covering("other", {"app": "x"}) == ["b"]
    idx.drop(pdb("a", {}))
    assert idx.covering("ns", {"app": "x"}) == []
    idx.replace("other", [])
    assert idx.covering("other", {"app": "x"}) == [] and len(idx) == 1  # "none" is left


async def test_a_change_wakes_only_the_pods_it_covers() -> None:
    idx = PdbIndex()
    idx.replace(
        "", [pdb("a", {"matchLabels": {"app": "x"}}), pdb("b", {"matchLabels": {"app": "y"}})]
    )
    with idx.watching("ns", {"app": "x"}) as x, idx.watching("ns", {"app": "y"}) as y:
        idx.put(pdb("b", {"matchLabels": {"app": "y"}}))
        assert y.is_set() and not x.is_set()
        idx.put(pdb("a", {"matchLabels": {"app": "x"}}))
        assert x.is_set()
    # A pod no known PDB covers (the cache may not have seen it yet) wakes on any change in
    # its namespace, and on a relist; nothing stays registered after the block.
    with idx.watching("ns", {"app": "z"}) as z, idx.watching("other", {}) as o:
        idx.put(pdb("c", {"matchLabels": {"app": "q"}}))
        assert z.is_set() and not o.is_set()
        idx.replace("other", [])
        assert o.is_set()
    assert not idx._waiters and not idx._namespace_waiters


# --- the eviction loop --------------------------------------------------------------------


REFUSAL = b'{"message": "Cannot evict pod as it would violate the pod\'s disruption budget."}'


class RefusingCore:
    """The API server (``ApiServer``'s calls) as far as the eviction subresource of a pod whose
    PDB refuses until ``opens`` is set, and the pod's delete, go; every request kept."""

    def __init__(self) -> None:
        self.opens = asyncio.Event()
        self.asked = asyncio.Event()
        self.evictions = 0
        self.deletes = 0
        self.deleted_at: list[datetime] = []
        self.requests: list[tuple[str, str, Any, Any]] = []  # method, path, query, body

    async def post(self, path: str, body: Any) -> dict[str, Any]:
        self.requests.append(("POST", path, None, body))
        self.evictions += 1
        self.asked.set()
        if not self.opens.is_set():
            raise ApiStatus(429, body=REFUSAL, headers={})
        return {}

    async def request(
        self, method: str, path: str, *, params: Any = None, body: Any = None, **_: Any
    ) -> dict[str, Any]:
        self.requests.append((method, path, params, body))
        assert method == "DELETE"
        self.deletes += 1
        self.deleted_at.append(utcnow())
        return {}


class Budgets:
    """``budget_changes`` over a real ``PdbIndex``: one PDB ``guard`` covering ``app=x``."""

    def __init__(self, watched: bool = True) -> None:
        self.index = PdbIndex()
        self.index.replace("", [pdb("guard", {"matchLabels": {"app": "x"}})])
        self.watched = watched

    @contextlib.contextmanager
    def __call__(self, namespace: str, name: str) -> Iterator[asyncio.Event | None]:
        if not self.watched:
            yield None
            return
        with self.index.watching(namespace, {"app": "x"}) as event:
            yield event


@pytest.fixture
def core() -> RefusingCore:
    return RefusingCore()


def actions_with(core: RefusingCore, budgets: Budgets, **settings: Any) -> ClusterActions:
    defaults: dict[str, Any] = {"force_before_s": 0.5, "retry_base_s": 0.01, "retry_cap_s": 0.02}
    return ClusterActions(
        cast(ApiServer, core),
        limiter=RateLimiter(),
        settings=PolicySettings(**{**defaults, **settings}),
        budget_changes=budgets,
    )


MEMBER = Member(namespace="ns", name="p", uid="u1", node="n1", gpus=8)


def deadline_in(s: float) -> datetime:
    return utcnow() + timedelta(seconds=s)


async def test_a_refused_eviction_is_asked_again_when_its_pdb_changes(core: RefusingCore) -> None:
    budgets = Budgets()
    # The timer alone would wait 60 s: only the change can bring the second request.
    actions = actions_with(core, budgets, watched_retry_s=60.0)
    task = asyncio.create_task(actions.evict(MEMBER, deadline=deadline_in(30)))
    await asyncio.wait_for(core.asked.wait(), 5)
    await asyncio.sleep(0.05)
    assert core.evictions == 1 and not task.done()  # refused once, waiting, not polling
    core.opens.set()
    budgets.index.put(pdb("guard", {"matchLabels": {"app": "x"}}))  # the watch sees the change
    assert await asyncio.wait_for(task, 5) is EvictResult.EVICTED
    assert core.evictions == 2 and core.deletes == 0


async def test_a_pdb_that_never_opens_costs_one_request_and_the_forced_delete(
    core: RefusingCore,
) -> None:
    actions = actions_with(core, Budgets(), watched_retry_s=60.0, force_before_s=0.5)
    result = await actions.evict(MEMBER, deadline=deadline_in(1.5))
    assert result is EvictResult.FORCED
    # One request: with no change seen since, no last try where the policy gives up (it
    # would be refused again); then the delete.
    assert core.evictions == 1 and core.deletes == 1


async def test_the_eviction_and_the_forced_delete_are_the_requests_the_api_takes(
    core: RefusingCore,
) -> None:
    """The Eviction subresource with the pod's uid as a precondition, then a delete with the
    grace period (in the query and in the DeleteOptions) and the same precondition."""
    actions = released_actions(core, only=True)  # refused once, then deleted at once
    done = actions.evict(MEMBER, deadline=deadline_in(60), saved=True)
    assert await asyncio.wait_for(done, 5) is EvictResult.RELEASED
    pod = "/api/v1/namespaces/ns/pods/p"
    evicted, deleted = core.requests
    assert evicted == (
        "POST",
        pod + "/eviction",
        None,
        {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": "p", "namespace": "ns"},
            "deleteOptions": {"preconditions": {"uid": "u1"}},
        },
    )
    assert deleted == (
        "DELETE",
        pod,
        {"gracePeriodSeconds": 5},
        {"gracePeriodSeconds": 5, "preconditions": {"uid": "u1"}},
    )


async def test_without_a_watch_a_refused_eviction_is_retried_on_the_timer(
    core: RefusingCore,
) -> None:
    actions = actions_with(core, Budgets(watched=False), force_before_s=0.5)
    result = await actions.evict(MEMBER, deadline=deadline_in(1.5))
    assert result is EvictResult.FORCED
    assert core.evictions > 5  # every few tens of milliseconds (the backoff above)


async def test_a_change_just_before_the_end_still_gets_its_try(core: RefusingCore) -> None:
    budgets = Budgets()
    actions = actions_with(core, budgets, watched_retry_s=60.0, force_before_s=0.5)
    task = asyncio.create_task(actions.evict(MEMBER, deadline=deadline_in(1.2)))
    await asyncio.wait_for(core.asked.wait(), 5)
    await asyncio.sleep(0.5)  # shortly before the policy gives up
    core.opens.set()
    budgets.index.put(pdb("guard", {"matchLabels": {"app": "x"}}))
    assert await task is EvictResult.EVICTED
    assert core.evictions == 2 and core.deletes == 0


async def test_respect_pdb_waits_for_the_change_until_the_deadline(core: RefusingCore) -> None:
    actions = actions_with(core, Budgets(), watched_retry_s=60.0)
    result = await actions.evict(
        MEMBER, deadline=deadline_in(0.6), policy=EvictionPolicy.RESPECT_PDB
    )
    assert result is EvictResult.BLOCKED and core.deletes == 0 and core.evictions == 1


# --- a saved gang is not held by its own PDB --------------------------------------------------

JOBSET = "jobset.sigs.k8s.io/jobset-name"


def test_a_pdb_guards_only_a_gang_when_it_pins_the_gangs_identity() -> None:
    idx = PdbIndex()
    own = pdb("own", {"matchLabels": {JOBSET: "g1", "role": "worker"}})
    idx.replace("", [own])
    me = {JOBSET: "g1", "role": "worker"}
    assert idx.guards_only("ns", me, [(JOBSET, "g1")])
    assert not idx.guards_only("ns", me, [])  # a gang no selector can pin
    assert not idx.guards_only("other", me, [(JOBSET, "g1")])  # no PDB covers it there
    # "In" with that value alone pins it too; with another value it does not
    idx.put(
        pdb("expr", {"matchExpressions": [{"key": JOBSET, "operator": "In", "values": ["g1"]}]})
    )
    assert idx.guards_only("ns", me, [(JOBSET, "g1")])
    # one more PDB over the pod that also covers other pods: the drain honours it
    idx.put(pdb("team", {"matchLabels": {"role": "worker"}}))
    assert not idx.guards_only("ns", me, [(JOBSET, "g1")])
    idx.drop(pdb("team", {}))
    idx.put(
        pdb(
            "wide",
            {"matchExpressions": [{"key": JOBSET, "operator": "In", "values": ["g1", "g2"]}]},
        )
    )
    assert not idx.guards_only("ns", me, [(JOBSET, "g1")])


def released_actions(core: RefusingCore, only: bool, **settings: Any) -> ClusterActions:
    a = actions_with(core, Budgets(), watched_retry_s=60.0, force_before_s=0.5, **settings)
    a._only_its_gang = lambda namespace, name: only
    return a


async def test_a_saved_gangs_own_pdb_releases_its_pod_at_once(core: RefusingCore) -> None:
    actions = released_actions(core, only=True)
    result = await asyncio.wait_for(actions.evict(MEMBER, deadline=deadline_in(60), saved=True), 5)
    assert result is EvictResult.RELEASED  # not after 59.5 s: the gang is going anyway
    assert core.evictions == 1 and core.deletes == 1


async def test_a_pdb_still_holds_an_unsaved_gang_a_shared_pdb_and_the_old_policy(
    core: RefusingCore,
) -> None:
    """Each is honoured to the end: forced only at ``force_before_s`` (0.5 s) before the
    deadline, or, told to respect PDBs, never deleted."""
    for actions, saved, end in (
        (released_actions(core, only=True), False, EvictResult.FORCED),  # its ask is not over
        (released_actions(core, only=False), True, EvictResult.FORCED),  # guards others too
        (released_actions(core, only=True, drain_when_saved=False), True, EvictResult.FORCED),
        (
            released_actions(core, only=True, eviction=EvictionPolicy.RESPECT_PDB),
            True,
            EvictResult.BLOCKED,
        ),
    ):
        core.deleted_at.clear()
        deadline = deadline_in(1.5)
        result = await asyncio.wait_for(actions.evict(MEMBER, deadline=deadline, saved=saved), 5)
        assert result is end
        if end is EvictResult.FORCED:
            assert len(core.deleted_at) == 1
            assert core.deleted_at[0] >= deadline - timedelta(seconds=0.5)
        else:
            assert core.deleted_at == []
