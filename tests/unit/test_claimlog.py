"""The resume scan: which open claims this replica takes back, and which it leaves alone."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from reclaimd.cluster import claims
from reclaimd.cluster.claimlog import Resumer
from reclaimd.intake import Admission
from reclaimd.model import Notice, NoticeKind, Target, utcnow

LEASE_S = 20.0


def notice(nid: str, deadline_s: float) -> Notice:
    now = utcnow()  # at the call: the scan compares with the clock it reads itself
    return Notice(nid, "t", NoticeKind.SPOT_INTERRUPTION, Target(node_name=nid), now,
                  now + timedelta(seconds=deadline_s), now)


def claim(
    nid: str, holder: str, *, deadline_s: float = 100, age_s: float = 60, group: str = ""
) -> claims.Claim:
    n = notice(nid, deadline_s)
    written = utcnow() - timedelta(seconds=age_s)
    return claims.Claim(claims.NodeObj(f"node-{nid}"), n.id, n.deadline, holder,
                        claims.Phase.CLAIMED, written, written, notice=n.to_json(), group=group)


class Store:
    holder = "me"
    group = "reclaimd/prod"

    def __init__(self, found: list[claims.Claim]) -> None:
        self.found = found
        self.given: Any = None

    async def list_open(self, *, node_claims: Iterable[tuple[str, str]]) -> list[claims.Claim]:
        self.given = list(node_claims)
        return self.found


class Nodes:
    def node(self, name: str) -> None:
        return None

    def node_claims(self) -> list[tuple[str, str]]:
        return [("node-x", "{}")]


async def test_the_scan_takes_back_ours_and_the_dead_and_leaves_the_live_and_the_busy() -> None:
    store = Store([
        claim("mine", "me"),  # ours from before a restart
        claim("busy", "me"),  # ours and running here: a resume would only write again
        claim("dead", "peer-dead"),  # its holder stopped renewing
        claim("live", "peer-live"),  # its holder's Lease is fresh
        # Past its deadline, its holder gone: its gangs are still to charge.
        claim("late", "peer-dead", deadline_s=-5),
        claim("gone", "peer-dead", deadline_s=-301),  # long past: the node may be recreated
    ])
    renewals: dict[str, datetime] = {"peer-live": utcnow() - timedelta(seconds=2)}
    resumed: list[tuple[str, str | None]] = []

    async def resume(n: Notice, node: str | None) -> Admission:
        resumed.append((n.id, node))
        return Admission.RESUMED

    r = Resumer(store, Nodes(), resume=resume, in_flight=lambda nid: nid == "busy",  # type: ignore[arg-type]
                renewed=renewals.get, lease_s=LEASE_S)
    assert await r.once() == 3
    assert resumed == [("mine", "node-mine"), ("dead", "node-dead"), ("late", "node-late")]
    assert store.given == [("node-x", "{}")]  # node claims from the cache, not a LIST


async def test_a_stale_looking_peer_is_asked_once_more_before_its_claim_is_taken() -> None:
    store = Store([claim("slow", "peer-slow")])
    resumed: list[str] = []
    asked: list[str] = []

    async def resume(n: Notice, node: str | None) -> Admission:
        resumed.append(n.id)
        return Admission.RESUMED

    async def alive(holder: str) -> bool:
        asked.append(holder)
        return True  # it renewed since the last LIST: a busy peer, not a dead one

    r = Resumer(store, Nodes(), resume=resume, in_flight=lambda _: False,  # type: ignore[arg-type]
                renewed=lambda _: None, lease_s=LEASE_S, alive=alive)
    assert await r.once() == 0 and resumed == [] and asked == ["peer-slow"]


async def test_the_scan_leaves_another_deployments_claims_alone() -> None:
    store = Store([
        claim("ours", "peer-dead", group="reclaimd/prod"),
        claim("canary", "canary-dead", group="reclaimd-canary/prod"),  # not ours to resume
        claim("old", "peer-dead"),  # written before claims named their group
    ])
    resumed: list[str] = []

    async def resume(n: Notice, node: str | None) -> Admission:
        resumed.append(n.id)
        return Admission.RESUMED

    r = Resumer(store, Nodes(), resume=resume, in_flight=lambda _: False,  # type: ignore[arg-type]
                renewed=lambda _: None, lease_s=LEASE_S)
    assert await r.once() == 2 and resumed == ["ours", "old"]
