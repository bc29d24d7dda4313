"""Restart overhead: the replacement found, its end known, one event written, the Lease marked."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest

from reclaimd import restarts
from reclaimd.cluster import gangs
from reclaimd.cluster.gangclaims import Charged
from reclaimd.cluster.indexes import slim_pod
from reclaimd.ledger.event import encode
from reclaimd.ledger.labels import LabelPolicy
from reclaimd.ledger.writer import LedgerWriter
from reclaimd.model import (
    CheckpointOutcome,
    Gang,
    GangKey,
    Member,
    Notice,
    NoticeKind,
    RestartWaste,
    Target,
    stable_id,
)

T0 = datetime(2026, 3, 1, 12, 0, 5, tzinfo=UTC)
KEY = GangKey("job", "ml", "train")
LABELS = {"tenant": "team-a", "purchase_option": "spot", "sku": "p5.48xlarge", "user_email": "x"}


def member(uid: str, node: str, *, ready_s: float | None = None, url: str = "") -> Member:
    return Member(
        namespace="ml",
        name=f"train-{uid}",
        uid=uid,
        node=node,
        gpus=4,
        checkpoint_url=url,
        ready_at=None if ready_s is None else T0 + timedelta(seconds=ready_s),
    )


def charged(holder: str = "r0", uids: frozenset[str] = frozenset({"a", "b"})) -> Charged:
    return Charged(
        lease="gang-x",
        version="7",
        holder=holder,
        notice_id="n-1",
        received_at=T0,
        key=KEY,
        uids=uids,
    )


def now_gang(*members: Member) -> Gang:
    return Gang(KEY, members, labels=LABELS)


def test_the_replacement_is_the_new_pods_once_there_are_as_many() -> None:
    c = charged()
    assert restarts.replacement_of(c, None) is None
    # one old pod still terminating and one new one: not whole yet
    assert restarts.replacement_of(c, now_gang(member("a", "n1"), member("c", "n3"))) is None
    got = restarts.replacement_of(
        c, now_gang(member("a", "n1"), member("c", "n3"), member("d", "n3"))
    )
    assert got is not None and [m.uid for m in got.members] == ["c", "d"]


async def test_without_the_sdk_the_restart_ends_when_every_new_pod_is_ready() -> None:
    c = charged()
    waiting = now_gang(member("c", "n3", ready_s=100), member("d", "n4"))
    assert await restarts.restart_of(c, waiting, None, T0) is None
    whole = now_gang(member("c", "n3", ready_s=100), member("d", "n4", ready_s=130))
    r = await restarts.restart_of(c, whole, None, T0)
    assert r is not None and r.source == restarts.PODS_READY and r.seconds == 130


async def test_ranks_that_speak_the_sdk_end_it_at_their_last_first_step() -> None:
    c = charged()
    whole = now_gang(
        member("c", "n3", ready_s=100, url="http://10.0.0.3:8080/checkpoint"),
        member("d", "n4", ready_s=130, url="http://10.0.0.4:8080/checkpoint"),
    )
    steps: dict[str, datetime | None] = {
        "http://10.0.0.3:8080/checkpoint": T0 + timedelta(seconds=190),
        "http://10.0.0.4:8080/checkpoint": None,  # still restoring
    }

    async def first_step(url: str) -> tuple[bool, datetime | None]:
        return True, steps[url]

    ready = T0 + timedelta(seconds=130)
    assert await restarts.restart_of(c, whole, first_step, ready) is None  # waits for rank d
    steps["http://10.0.0.4:8080/checkpoint"] = T0 + timedelta(seconds=200)
    r = await restarts.restart_of(c, whole, first_step, ready)
    assert r is not None and r.source == restarts.SDK_FIRST_STEP and r.seconds == 200
    # a rank stuck in its restore past the wait: measured to Ready, and said so
    steps["http://10.0.0.4:8080/checkpoint"] = None
    late = ready + timedelta(seconds=restarts.SDK_WAIT_S + 1)
    r = await restarts.restart_of(c, whole, first_step, late)
    assert r is not None and r.source == restarts.PODS_READY and r.seconds == 130


async def test_ranks_that_do_not_speak_it_leave_ready_as_the_end() -> None:
    whole = now_gang(member("c", "n3", ready_s=100, url="http://10.0.0.3:8080/checkpoint"))
    c = charged(uids=frozenset({"a"}))

    async def first_step(url: str) -> tuple[bool, datetime | None]:
        return False, None  # a trainer of the contract without /incarnation (404)

    r = await restarts.restart_of(c, whole, first_step, T0)
    assert r is not None and r.source == restarts.PODS_READY and r.seconds == 100


def placement(node: str) -> Mapping[str, str]:
    known = {
        "n3": {"instance_id": "i-3", "sku": "p5.48xlarge", "purchase_option": "on-demand"},
        "n4": {"instance_id": "i-4", "sku": "p5.48xlarge", "purchase_option": "spot"},
    }
    return known.get(node, {})


def test_the_event_splits_the_overhead_by_the_replacements_nodes() -> None:
    c = charged()
    whole = now_gang(
        member("c", "n3", ready_s=90), member("d", "n3", ready_s=90), member("e", "n5", ready_s=90)
    )
    r = restarts.Restart(c, whole, T0 + timedelta(seconds=90), restarts.PODS_READY)
    ev = restarts.to_event(r, cluster="c1", policy=LabelPolicy(), place=placement)
    assert ev["schema"] == restarts.SCHEMA
    assert ev["EventId"] == restarts.event_id("n-1", KEY)
    assert ev["x_WasteEventId"] == stable_id("rw", "n-1", str(KEY))  # the gang's waste event
    assert ev["x_RestartOverheadSeconds"] == 90
    assert ev["x_RestartOverheadGpuSeconds"] == 12 * 90
    assert ev["ConsumedQuantity"] == pytest.approx(12 * 90 / 3600)
    assert "user_email" not in ev["Tags"] and ev["Tags"]["tenant"] == "team-a"
    parts = ev["x_RestartOverheadByInstance"]
    assert [(p["x_K8sNodeName"], p["ResourceId"], p["x_GpuCount"]) for p in parts] == [
        ("n3", "i-3", 8),
        ("n5", None, 4),  # a node gone from the cache: the gang's own labels price it
    ]
    assert parts[0]["x_PurchaseOption"] == "on_demand" and parts[0]["x_PlacementSource"] == "node"
    assert parts[1]["x_PurchaseOption"] == "spot" and parts[1]["x_PlacementSource"] == "gang"
    assert sum(p["x_RestartOverheadGpuSeconds"] for p in parts) == ev["x_RestartOverheadGpuSeconds"]
    eid, key, value, headers = restarts.encode(ev)
    assert eid == ev["EventId"] and key == b"team-a|job:ml/train"
    assert json.loads(value) == ev and dict(headers)["schema"] == restarts.SCHEMA.encode()


@pytest.mark.parametrize("name", ["train", "t" * 250])
def test_the_overhead_event_has_its_gang_waste_events_kafka_key(name: str) -> None:
    """The same key, so the same partition: a consumer reads a gang's restart after its
    waste. Pinned bytes, the hashed tail of a key too long included."""
    key = GangKey("job", "ml", name)
    notice = Notice(
        id="n-1",
        source="aws.ec2.spot",
        kind=NoticeKind.SPOT_INTERRUPTION,
        target=Target(node_name="n1"),
        issued_at=T0,
        deadline=T0 + timedelta(seconds=120),
        received_at=T0,
    )
    waste = RestartWaste(
        event_id=stable_id("rw", "n-1", str(key)),
        notice=notice,
        gang=Gang(key, (member("a", "n1"), member("b", "n2")), labels=LABELS),
        gpu_seconds_lost=60.0,
        stopped_at=T0 + timedelta(seconds=30),
        last_good_checkpoint=None,
        outcome=CheckpointOutcome.NO_ACK,
        deadline_met=True,
    )
    back = Gang(key, (member("c", "n3", ready_s=60), member("d", "n4", ready_s=60)), labels=LABELS)
    c = Charged("gang-x", "7", "r0", "n-1", T0, key, frozenset({"a", "b"}))
    r = restarts.Restart(c, back, T0 + timedelta(seconds=60), restarts.PODS_READY)
    ev = restarts.to_event(r, cluster="c1", policy=LabelPolicy(), place=placement)
    _, overhead_key, _, _ = restarts.encode(ev)
    _, waste_key, _, _ = encode(waste, LabelPolicy())
    raw = f"team-a|job:ml/{name}".encode()
    tail = b"~" + hashlib.sha256(raw).hexdigest()[:16].encode()
    want = raw if len(raw) <= 200 else raw[:183] + tail
    assert overhead_key == waste_key == want and len(want) <= 200


class Leases:
    def __init__(self, *found: Charged) -> None:
        self.found = list(found)
        self.marked: list[tuple[str, str]] = []

    async def charged(self) -> list[Charged]:
        return [c for c in self.found if c.lease not in {m for m, _ in self.marked}]

    async def restart_recorded(self, c: Charged, event_id: str) -> bool:
        self.marked.append((c.lease, event_id))
        return True


class Pods:
    def __init__(self, gang: Gang | None) -> None:
        self.now = gang

    def gang(self, key: GangKey) -> Gang | None:
        return self.now

    def node_labels(self, name: str) -> Mapping[str, str]:
        return {}

    def provider_id(self, name: str) -> str:
        return ""


class Writer:
    policy = LabelPolicy()

    def __init__(self) -> None:
        self.rows: list[tuple[str, bytes]] = []

    async def record_encoded(
        self, event_id: str, key: bytes, value: bytes, headers: tuple[tuple[str, bytes], ...]
    ) -> bool:
        self.rows.append((event_id, value))
        return True


def watcher(
    leases: Leases, pods: Pods, writer: Writer, *, dead: frozenset[str] = frozenset()
) -> restarts.RestartWatcher:
    async def alive(holder: str) -> bool:
        return holder not in dead

    return restarts.RestartWatcher(
        leases,
        pods,
        cast(LedgerWriter, writer),
        holder="r1",
        alive=alive,
        cluster="c1",
        clock=lambda: T0 + timedelta(minutes=5),
    )


async def test_the_charging_replica_records_once_and_marks_the_lease() -> None:
    leases, writer = Leases(charged(holder="r1")), Writer()
    pods = Pods(now_gang(member("c", "n3", ready_s=60), member("d", "n4", ready_s=70)))
    w = watcher(leases, pods, writer)
    assert await w.tick() == 1
    assert await w.tick() == 0  # marked: never measured again
    assert (w.looks, w.recorded) == (2, 1)
    ((eid, value),) = writer.rows
    assert leases.marked == [("gang-x", eid)]
    assert json.loads(value)["x_RestartOverheadSeconds"] == 70


async def test_a_live_peers_gang_is_left_to_it_a_dead_peers_is_taken() -> None:
    pods = Pods(now_gang(member("c", "n3", ready_s=60), member("d", "n4", ready_s=70)))
    leases, writer = Leases(charged(holder="r0")), Writer()
    assert await watcher(leases, pods, writer).tick() == 0
    assert await watcher(leases, pods, writer, dead=frozenset({"r0"})).tick() == 1


async def test_a_gang_not_back_yet_writes_nothing() -> None:
    leases, writer = Leases(charged(holder="r1")), Writer()
    w = watcher(leases, Pods(now_gang(member("a", "n1"))), writer)
    assert await w.tick() == 0
    assert writer.rows == [] and leases.marked == []
    assert (w.looks, w.recorded) == (1, 0)  # a look, finished, found nothing to write


async def test_a_look_that_fails_is_not_counted_as_a_look() -> None:
    class Broken(Leases):
        async def charged(self) -> list[Charged]:
            raise OSError("apiserver gone")

    w = watcher(Broken(), Pods(None), Writer())
    with pytest.raises(OSError):
        await w.tick()
    assert w.looks == 0


def test_the_cache_keeps_when_a_pod_became_ready() -> None:
    raw: dict[str, Any] = {
        "metadata": {"name": "p", "namespace": "ml", "uid": "u"},
        "spec": {"nodeName": "n1", "containers": []},
        "status": {
            "phase": "Running",
            "conditions": [
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": "T0"},
                {"type": "Ready", "status": "True", "lastTransitionTime": "2026-03-01T12:01:30Z"},
            ],
        },
    }
    slim = slim_pod(raw)
    assert slim["status"]["readyAt"] == "2026-03-01T12:01:30Z"
    assert gangs.member_of(slim).ready_at == datetime(2026, 3, 1, 12, 1, 30, tzinfo=UTC)
    assert gangs.member_of(raw).ready_at == datetime(2026, 3, 1, 12, 1, 30, tzinfo=UTC)
    raw["status"]["conditions"][1]["status"] = "False"
    assert "readyAt" not in slim_pod(raw)["status"] and gangs.member_of(raw).ready_at is None


async def test_the_sdk_says_when_the_loop_first_stepped_and_the_watcher_reads_it() -> None:
    import aiohttp

    from reclaimd_trainer.signal import Signal

    with Signal(host="127.0.0.1", port=0) as signal:
        async with aiohttp.ClientSession() as session:
            assert await restarts.sdk_first_step(session, signal.url) == (True, None)
            assert signal.requested is False  # the loop's first step boundary
            speaks, at = await restarts.sdk_first_step(session, signal.url)
            assert speaks and at is not None and at == signal.first_step_at
            # a trainer without /incarnation (404), or nobody there: it does not speak it
            assert await restarts.sdk_first_step(session, signal.url + "x") == (False, None)
    async with aiohttp.ClientSession() as session:
        assert await restarts.sdk_first_step(session, signal.url, 0.5) == (False, None)


def test_a_gang_key_reads_back_from_its_lease_annotation() -> None:
    from reclaimd.cluster.gangclaims import gang_key_of

    assert gang_key_of(str(KEY)) == KEY
    assert gang_key_of("jobset:ml/a/b") == GangKey("jobset", "ml", "a/b")
    assert gang_key_of("") is None and gang_key_of("job:ml") is None
