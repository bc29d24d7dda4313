"""Gang Leases, the requests they make: one POST claims a gang, a takeover is a merge patch at
the version read, the sweep deletes at that version, and reads are plain JSON. The server is a
recording fake; the Lease semantics run against a real one in tests/e2e/test_cluster_api.py."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta

from fake_apiserver import FakeApiServer

from reclaimd.cluster import gangclaims, gangrecord
from reclaimd.cluster.apiserver import MERGE_PATCH
from reclaimd.cluster.gangclaims import (
    NOTICE_ANNOTATION,
    PODS_ANNOTATION,
    RECORD_ANNOTATION,
    RESTARTED_LABEL,
    GangClaims,
    lease_name,
)
from reclaimd.cluster.ratelimit import RateLimiter
from reclaimd.model import Gang, GangKey, Member, Notice, NoticeKind, Target, utcnow

LEASES = "/apis/coordination.k8s.io/v1/namespaces/reclaimd/leases"


T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
KEY = GangKey("job", "ml", "train")


def gang(*uids: str) -> Gang:
    return Gang(KEY, tuple(Member("ml", f"p-{u}", u, "n1", 8, rank=i) for i, u in enumerate(uids)))


def notice(id: str = "n-1") -> Notice:
    deadline = utcnow() + timedelta(seconds=60)
    return Notice(
        id=id,
        source="aws.ec2.spot",
        kind=NoticeKind.SPOT_INTERRUPTION,
        target=Target(node_name="n1"),
        issued_at=T0,
        deadline=deadline,
        received_at=T0,
    )


def claims(api: FakeApiServer) -> GangClaims:
    return GangClaims(api, "reclaimd", "replica-a", limiter=RateLimiter())


async def test_the_first_notice_creates_the_gang_lease() -> None:
    api = FakeApiServer(None, {"metadata": {"resourceVersion": "1"}})
    assert await claims(api).acquire(gang("a", "b"), notice())
    ((method, path, params, body, content),) = api.sent
    assert (method, path, params, content) == ("POST", LEASES, {}, "application/json")
    assert body["metadata"]["name"] == lease_name(gang("a", "b"))
    assert body["metadata"]["annotations"][PODS_ANNOTATION] == "a,b"
    assert body["spec"]["holderIdentity"] == "replica-a"


async def test_a_new_incarnation_takes_the_lease_over_at_the_version_read() -> None:
    old = {
        "metadata": {
            "name": lease_name(gang("a")),
            "resourceVersion": "41",
            "annotations": {NOTICE_ANNOTATION: "n-0", PODS_ANNOTATION: "a"},
        }
    }
    api = FakeApiServer(None, 409, old, {"metadata": {"resourceVersion": "42"}})
    assert await claims(api).acquire(gang("c", "d"), notice())
    create, read, take = api.sent
    name = lease_name(gang("c"))
    assert create[:2] == ("POST", LEASES)
    assert read[:4] == ("GET", f"{LEASES}/{name}", {}, None)
    assert take[:2] == ("PATCH", f"{LEASES}/{name}") and take[4] == MERGE_PATCH
    meta = take[3]["metadata"]
    assert meta["resourceVersion"] == "41"
    assert meta["labels"][RESTARTED_LABEL] is None  # removed by the merge patch


async def test_the_same_incarnation_is_left_to_its_notice() -> None:
    other = {"metadata": {"annotations": {NOTICE_ANNOTATION: "n-0", PODS_ANNOTATION: "a"}}}
    api = FakeApiServer(None, 409, other)
    assert not await claims(api).acquire(gang("a", "b"), notice())
    assert [s[0] for s in api.sent] == ["POST", "GET"]


async def test_owned_by_reads_the_records_and_asks_the_other_holders() -> None:
    record = gangrecord.gang_json(gang("a"))
    listed = {
        "items": [
            {
                "metadata": {
                    "name": "gang-1",
                    "annotations": {NOTICE_ANNOTATION: "n-1", RECORD_ANNOTATION: record},
                },
                "spec": {"holderIdentity": "replica-b"},
            },
            {"metadata": {"name": "gang-2", "annotations": {NOTICE_ANNOTATION: "n-9"}}},
        ]
    }
    asked: list[tuple[str, str]] = []

    async def peer_acks(holder: str, label: str) -> Mapping[str, str]:
        asked.append((holder, label))
        return {}

    api = FakeApiServer(None, listed)
    leases = GangClaims(api, "reclaimd", "replica-a", limiter=RateLimiter(), peer_acks=peer_acks)
    owned = await leases.owned_by(notice("n-1"))
    assert list(owned) == [KEY]
    ((method, path, params, _, _),) = api.sent
    label = gangclaims.notice_label("n-1")
    assert (method, path, params) == (
        "GET",
        LEASES,
        {"labelSelector": f"reclaimd.io/notice={label}"},
    )
    assert asked == [("replica-b", label)]


async def test_the_sweep_deletes_old_leases_at_the_version_read() -> None:
    def at(t: datetime) -> str:
        return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")

    listed = {
        "items": [
            {"metadata": {"name": "old", "resourceVersion": "7"}, "spec": {"acquireTime": at(T0)}},
            {
                "metadata": {"name": "new", "resourceVersion": "8"},
                "spec": {"acquireTime": at(utcnow())},
            },
            {"metadata": {"name": "never", "resourceVersion": "9"}, "spec": {}},
        ]
    }
    api = FakeApiServer(None, listed, {})
    assert await claims(api).sweep(keep_s=3600) == 1
    listing, delete = api.sent
    # One page of LIST_PAGE (no continue token in the answer: the list is whole).
    assert listing[:3] == ("GET", LEASES, {"labelSelector": "reclaimd.io/notice", "limit": 250})
    assert delete[:4] == (
        "DELETE",
        f"{LEASES}/old",
        {},
        {"preconditions": {"resourceVersion": "7"}},
    )


async def test_charged_lists_the_unmeasured_gangs_and_marks_one_at_its_version() -> None:
    listed = {
        "items": [
            {
                "metadata": {
                    "name": "gang-1",
                    "resourceVersion": "5",
                    "annotations": {
                        NOTICE_ANNOTATION: "n-1",
                        RECORD_ANNOTATION: "{}",
                        PODS_ANNOTATION: "a,b",
                        gangclaims.GANG_ANNOTATION: str(KEY),
                        gangclaims.RECEIVED_ANNOTATION: "2026-03-01T12:00:00Z",
                    },
                },
                "spec": {"holderIdentity": "replica-b"},
            }
        ]
    }
    api = FakeApiServer(None, listed, 409)
    leases = claims(api)
    (c,) = await leases.charged()
    assert (c.lease, c.version, c.holder, c.received_at, c.uids) == (
        "gang-1",
        "5",
        "replica-b",
        T0,
        frozenset({"a", "b"}),
    )
    assert not await leases.restart_recorded(c, "ev-1")  # written since: 409
    listing, mark = api.sent
    assert listing[2] == {
        "labelSelector": "reclaimd.io/notice,!reclaimd.io/restarted",
        "limit": 250,
    }
    assert mark[:2] == ("PATCH", f"{LEASES}/gang-1") and mark[4] == MERGE_PATCH
    assert mark[3]["metadata"]["resourceVersion"] == "5"


async def test_the_lists_of_every_gang_lease_come_a_page_at_a_time() -> None:
    """Thousands of Leases after a day of storms: LIST_PAGE a page, continued, one list."""

    class Paged:
        def __init__(self) -> None:
            self.asked: list[dict[str, object]] = []

        async def get(self, path: str, **params: object) -> dict[str, object]:
            self.asked.append(params)
            page = int(str(params.get("continue") or "0"))
            lease = {"metadata": {"name": f"l{page}", "resourceVersion": "1"}, "spec": {}}
            more = {"continue": str(page + 1)} if page < 2 else {}
            return {"metadata": more, "items": [lease]}

    api = Paged()
    leases = GangClaims(api, "reclaimd", "replica-a", limiter=RateLimiter())  # type: ignore[arg-type]
    found = await leases._list_pages("reclaimd.io/notice")
    assert [lease["metadata"]["name"] for lease in found] == ["l0", "l1", "l2"]
    assert [a.get("continue") for a in api.asked] == [None, "1", "2"]
    assert all(a["limit"] == 250 and a["labelSelector"] == "reclaimd.io/notice" for a in api.asked)
