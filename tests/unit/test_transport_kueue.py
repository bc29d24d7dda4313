"""Kueue transport (reclaimd/transports/kueue.py): version choice, and what it does with the
watch's events: which objects are parsed, which notices are admitted, how often, and what a
claim that could not be stored leads to. The watch itself runs against the real apiserver in
tests/e2e/test_kueue.py; here the events are fed in directly."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import time
from collections.abc import Callable
from typing import Any, cast

import pytest
from shared_fixtures import FIXTURES

import handlers
from reclaimd import kueueapi
from reclaimd.cluster import errors
from reclaimd.cluster.apiserver import ApiServer, ApiStatus
from reclaimd.cluster.watch import Changed, Listed
from reclaimd.intake import Admission
from reclaimd.model import Notice, NoticeKind, Response, Windows, utcnow
from reclaimd.sources import KueueSettings
from reclaimd.transports import DEAF_AFTER_S
from reclaimd.transports.kueue import KueueSource, object_key, pick_version

KUEUE = FIXTURES / "kueue"
T0 = "workload-v1beta2-reclaim-preempted-t0-evicted.json"  # the eviction, as first written
T1 = "workload-v1beta2-reclaim-preempted-t1-requeued.json"  # Kueue's follow-up: same eviction


def load(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((KUEUE / name).read_text())
    doc.pop("_comment", None)
    return doc


def admitted(doc: dict[str, Any]) -> dict[str, Any]:
    """The same Workload before the preemption: admitted, nothing evicted."""
    out = copy.deepcopy(doc)
    out["metadata"]["resourceVersion"] = "191100"
    out["status"]["conditions"] = [
        c for c in out["status"]["conditions"] if c["type"] not in ("Evicted", "Preempted")
    ]
    return out


def renamed(doc: dict[str, Any], name: str, uid: str) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    out["metadata"].update(name=name, uid=uid)
    return out


class Intake:
    """Stands in for ``Intake.admit``: records every call, answers from a script."""

    def __init__(self, answer: Callable[[Notice, int], Admission] | None = None) -> None:
        self.calls: list[Notice] = []
        self._answer = answer or (lambda _n, _i: Admission.CLAIMED)

    async def admit(self, notice: Notice) -> Admission:
        self.calls.append(notice)
        return self._answer(notice, len(self.calls))


def source(intake: Intake, **kw: Any) -> KueueSource:
    # The ApiServer is only used by run(); nothing here reaches a server.
    return KueueSource(
        KueueSettings(enabled=True),
        admit=intake.admit,
        windows=Windows(kueue_grace_s=30),
        api=cast(ApiServer, None),
        **kw,
    )


def expected_notice(doc: dict[str, Any]) -> Notice:
    outcome = handlers.parse("kueue", json.dumps(doc).encode(), received_at=utcnow())
    assert isinstance(outcome, tuple) and len(outcome) == 1
    return outcome[0]


# --- pure parts -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("served", "chosen"),
    [
        (["v1beta1", "v1beta2"], "v1beta2"),
        (["v1beta2"], "v1beta2"),
        (["v1beta1"], "v1beta1"),
        (["v1alpha1", "v1beta1"], "v1beta1"),
        (["v1alpha1"], None),
        ([], None),
    ],
)
def test_the_storage_version_is_preferred(served: list[str], chosen: str | None) -> None:
    assert pick_version(served) == chosen


def test_object_key_tells_a_recreated_workload_apart() -> None:
    doc = load(T0)
    again = renamed(doc, doc["metadata"]["name"], "another-uid")
    assert object_key(doc) == ("team-b", doc["metadata"]["name"], doc["metadata"]["uid"])
    assert object_key(doc) != object_key(again)
    assert object_key({"metadata": None}) == ("", "", "")


class Discovery:
    """``ApiServer.get("/apis")``: an APIGroupList, as the API server sends it."""

    def __init__(self, groups: list[dict[str, Any]], status: int = 200) -> None:
        self.groups, self.status = groups, status
        self.asked: list[str] = []

    async def get(self, path: str, **query: Any) -> dict[str, Any]:
        self.asked.append(path)
        if self.status != 200:
            raise ApiStatus(self.status, b'{"message": "etcdserver: request timed out"}')
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": self.groups}


def api_group(name: str, *versions: str) -> dict[str, Any]:
    served = [{"groupVersion": f"{name}/{v}", "version": v} for v in versions]
    return {"name": name, "versions": served, "preferredVersion": served[0]}


async def test_the_served_versions_are_read_from_discovery_once() -> None:
    apis = Discovery([api_group("apps", "v1"), api_group(kueueapi.GROUP, "v1beta2", "v1beta1")])
    api = cast(ApiServer, apis)
    assert await kueueapi.served_versions(api) == ["v1beta2", "v1beta1"]
    assert await kueueapi.served_versions(api, "nothing.example.com") == []
    versions = kueueapi.WorkloadVersion(api)
    assert [await versions.get() for _ in range(3)] == ["v1beta2"] * 3
    assert apis.asked == ["/apis"] * 3  # the two asks above, then one for all three gets
    assert kueueapi.shared(api) is kueueapi.shared(api)


async def test_no_kueue_or_no_answer_falls_back() -> None:
    absent = cast(ApiServer, Discovery([api_group("apps", "v1")]))
    assert await kueueapi.WorkloadVersion(absent).get() is None
    assert await kueueapi.version_or(absent, "v1beta1") == "v1beta1"
    failing = cast(ApiServer, Discovery([], status=504))
    with pytest.raises(errors.ServerError, match=r"discover kueue\.x-k8s\.io"):
        await kueueapi.served_versions(failing)
    assert await kueueapi.version_or(failing, "v1beta1") == "v1beta1"


def test_workloads_are_watched_at_the_served_version_in_each_namespace() -> None:
    src = source(Intake())
    one = src._endpoint("v1beta1", "team-b", "workloads in team-b")
    every = src._endpoint("v1beta2", "", "workloads")
    assert one._path == "/apis/kueue.x-k8s.io/v1beta1/namespaces/team-b/workloads"
    assert every._path == "/apis/kueue.x-k8s.io/v1beta2/workloads"
    assert one._params == every._params == {}


# --- events to admissions -------------------------------------------------------------------


async def test_an_eviction_is_admitted_once_across_kueues_follow_up_writes() -> None:
    intake = Intake()
    src = source(intake)
    t0, t1 = load(T0), load(T1)
    for event in (
        Listed((admitted(t0),), "191100"),
        Changed("MODIFIED", t0),
        Changed("MODIFIED", t1),  # Requeued, QuotaReserved=False: the same notice
    ):
        src.apply(event)
        await src.wait_idle()

    want = expected_notice(t0)
    assert [n.id for n in intake.calls] == [want.id]
    got = intake.calls[0]
    assert got.kind is NoticeKind.RECLAIM and got.response is Response.NO_CORDON
    assert got.attributes["reason"] == "InCohortReclamation"
    assert got.target.workload is not None and got.target.workload.uid == t0["metadata"]["uid"]
    c = src.counters
    assert (c.received, c.ignored, c.notices, c.acked) == (3, 1, 2, 1)
    assert c.by_admission == {"claimed": 1}


async def test_versions_that_pile_up_are_handled_newest_first() -> None:
    intake = Intake()
    src = source(intake)
    t0, t1 = load(T0), load(T1)
    for doc in (admitted(t0), t0, t1):  # offered before the first one could be handled
        src.apply(Changed("MODIFIED", doc))
    await src.wait_idle()
    assert [n.id for n in intake.calls] == [expected_notice(t0).id]
    assert src.counters.received == 1  # only t1 was parsed: it carries the same eviction


async def test_a_relist_repeating_versions_parses_nothing_again() -> None:
    intake = Intake()
    src = source(intake)
    t0 = load(T0)
    src.apply(Listed((t0,), "191203"))
    await src.wait_idle()
    src.apply(Listed((t0,), "191500"))  # after a 410: same object, same version
    src.apply(Changed("MODIFIED", t0))  # a reconnect replaying the last event
    await src.wait_idle()
    assert len(intake.calls) == 1
    assert src.counters.received == 1


async def test_a_deleted_workload_is_forgotten() -> None:
    intake = Intake()
    src = source(intake)
    t0 = load(T0)
    src.apply(Changed("ADDED", t0))
    await src.wait_idle()
    src.apply(Changed("DELETED", t0))
    src.apply(Changed("ADDED", t0))  # seen fresh: handed to the intake, which dedupes by id
    await src.wait_idle()
    assert [n.id for n in intake.calls] == [expected_notice(t0).id] * 2


async def test_a_relist_forgets_workloads_deleted_while_not_watching() -> None:
    intake = Intake()
    src = source(intake)
    t0 = load(T0)
    src.apply(Listed((t0,), "191203"))
    await src.wait_idle()
    src.apply(Listed((), "191900"))  # gone while the watch was down
    src.apply(Listed((t0,), "192000"))  # and back (a restore): handled afresh
    await src.wait_idle()
    assert len(intake.calls) == 2


async def test_a_claim_that_was_not_stored_is_admitted_again_until_it_is() -> None:
    intake = Intake(lambda _n, i: Admission.RETRY if i < 3 else Admission.CLAIMED)
    src = source(intake, retry_pause_s=0.01)
    t0 = load(T0)
    src.apply(Changed("MODIFIED", t0))
    await src.wait_idle()
    assert [n.id for n in intake.calls] == [expected_notice(t0).id] * 3
    assert src.counters.left_for_redelivery == 2
    assert src.counters.by_admission == {"retry": 2, "claimed": 1}
    src.apply(Changed("MODIFIED", load(T1)))  # settled now: the follow-up admits nothing
    await src.wait_idle()
    assert len(intake.calls) == 3


async def test_a_newer_version_takes_over_from_a_retry() -> None:
    first = asyncio.Event()

    def answer(_n: Notice, i: int) -> Admission:
        first.set()
        return Admission.RETRY if i == 1 else Admission.DUPLICATE

    intake = Intake(answer)
    src = source(intake, retry_pause_s=30)  # the retry would wait long: the new version must not
    t0, t1 = load(T0), load(T1)
    src.apply(Changed("MODIFIED", t0))
    await first.wait()
    src.apply(Changed("MODIFIED", t1))
    async with asyncio.timeout(5):
        await src.wait_idle()
    assert len(intake.calls) == 2  # the retry gave way to t1, which carries the same notice
    assert intake.calls[0].id == intake.calls[1].id


async def test_a_recreated_workload_is_a_new_target() -> None:
    intake = Intake()
    src = source(intake)
    t0 = load(T0)
    again = renamed(t0, t0["metadata"]["name"], "b1c2d3e4-0000-4000-8000-000000000001")
    src.apply(Changed("MODIFIED", t0))
    src.apply(Changed("MODIFIED", again))
    await src.wait_idle()
    assert {n.target.workload.uid for n in intake.calls if n.target.workload} == {
        t0["metadata"]["uid"],
        again["metadata"]["uid"],
    }


async def test_other_evictions_and_unreadable_objects_are_counted_not_admitted() -> None:
    intake = Intake()
    src = source(intake)
    t0 = load(T0)
    timeout = renamed(t0, "timed-out", "uid-timeout")
    for c in timeout["status"]["conditions"]:
        if c["type"] == "Evicted":
            c["reason"] = "PodsReadyTimeout"
    timeout["status"]["conditions"] = [
        c for c in timeout["status"]["conditions"] if c["type"] != "Preempted"
    ]
    broken = renamed(t0, "broken", "uid-broken")
    broken["status"]["conditions"][3]["lastTransitionTime"] = "yesterday"
    src.apply(Listed((timeout, broken), "5"))
    await src.wait_idle()
    assert intake.calls == []
    assert (src.counters.ignored, src.counters.parse_errors) == (1, 1)
    src.apply(Listed((timeout, broken), "6"))  # same versions: not parsed again
    await src.wait_idle()
    assert src.counters.received == 2


async def test_workloads_are_delivered_concurrently() -> None:
    """Ten preempted at once: one slow claim must not hold the others back."""
    release, four = asyncio.Event(), asyncio.Event()
    started: list[str] = []

    class Slow(Intake):
        async def admit(self, notice: Notice) -> Admission:
            started.append(notice.id)
            if len(started) == 4:
                four.set()
            await release.wait()
            return await super().admit(notice)

    intake = Slow()
    src = source(intake, concurrency=4)
    t0 = load(T0)
    for i in range(10):
        src.apply(Changed("MODIFIED", renamed(t0, f"victim-{i}", f"uid-{i}")))
    async with asyncio.timeout(5):
        await four.wait()
    for _ in range(20):  # let every other delivery task run as far as it can
        await asyncio.sleep(0)
    assert len(started) == 4  # bounded
    release.set()
    await src.wait_idle()
    assert len({n.id for n in intake.calls}) == 10


async def test_a_failing_watch_is_retried_not_fatal() -> None:
    """Whatever breaks under the watch (here: no usable API client at all) is counted and
    tried again; the source keeps running, as the daemon needs its other sources."""
    src = source(Intake(), rewatch_pause_s=0.01)
    task = asyncio.create_task(src.run())
    try:
        async with asyncio.timeout(5):
            while src.counters.transport_errors < 3:  # noqa: ASYNC110 - a counter, no event
                await asyncio.sleep(0.01)
        assert not task.done()
        # each failed watch is a failed receive: long enough, the source is deaf (/readyz)
        assert src.counters.failures >= 3 and src.counters.problem
        assert src.counters.deaf(time.monotonic() + DEAF_AFTER_S)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
