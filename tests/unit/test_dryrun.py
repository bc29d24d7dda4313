"""Dry-run's would-parts: each decides as the real part would, writes nothing, logs one line
per action naming its notice, and counts it."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider

from reclaimd import dryrun, waste
from reclaimd.cluster import claims
from reclaimd.intake import Admission, Admitted, Claimed, Intake
from reclaimd.ledger.event import encode
from reclaimd.ledger.labels import LabelPolicy
from reclaimd.logs import JsonFormatter
from reclaimd.model import (
    Gang,
    GangKey,
    Member,
    Notice,
    NoticeKind,
    Response,
    Target,
    WorkloadRef,
    utcnow,
)
from reclaimd.pipeline import Budget, Runbook
from reclaimd.scheduler import GangOwners

NOW = utcnow()
HOLDER = "me"


def notice(nid: str, node: str = "n1", deadline_s: float = 120, **kw: Any) -> Notice:
    return Notice(
        nid,
        "aws.sqs",
        NoticeKind.SPOT_INTERRUPTION,
        Target(node_name=node),
        NOW,
        NOW + timedelta(seconds=deadline_s),
        NOW,
        **kw,
    )


def member(name: str, node: str) -> Member:
    return Member("ns", name, f"uid-{name}", node, 8, checkpoint_url="http://x/ckpt")


GANG = Gang(GangKey("jobset", "ns", "g"), (member("g-0", "n1"), member("g-1", "n2")))


@dataclass(frozen=True)
class Snapshot:
    claim_text: str | None = None
    resource_version: str = "1"
    unschedulable: bool = False
    taints: tuple[Mapping[str, Any], ...] = ()


class Nodes:
    """The cache's copies of the nodes, as ``claimlog.NodeCopies``."""

    def __init__(self, **nodes: Snapshot) -> None:
        self.nodes = nodes

    def node(self, name: str) -> Snapshot | None:
        return self.nodes.get(name)

    def node_claims(self) -> Iterable[tuple[str, str]]:
        return ()

    # ClusterView, for the runbook
    def resolve_node(self, target: Target) -> str | None:
        return target.node_name if target.node_name in self.nodes else None

    def gangs_on_nodes(
        self, nodes: Iterable[str], *, since: datetime | None = None
    ) -> tuple[Gang, ...]:
        return (GANG,) if GANG.nodes & set(nodes) else ()

    def gangs_of_workload(
        self, ref: WorkloadRef, *, since: datetime | None = None
    ) -> tuple[Gang, ...]:
        return (GANG,)


def peer_claim(nid: str, *, deadline_s: float, age_s: float = 1.0) -> str:
    n = notice(nid, deadline_s=deadline_s)
    at = NOW - timedelta(seconds=age_s)
    c = claims.Claim(
        claims.NodeObj("n1"),
        n.id,
        n.deadline,
        "peer",
        claims.Phase.CLAIMED,
        at,
        at,
        notice=n.to_json(),
    )
    return json.dumps(c.to_json())


class Lines(logging.Handler):
    """The JSON lines the would-parts log, parsed."""

    def __init__(self) -> None:
        super().__init__()
        self.fmt = JsonFormatter()
        self.lines: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(json.loads(self.fmt.format(record)))

    def of(self, msg: str) -> list[dict[str, Any]]:
        return [line for line in self.lines if line["msg"] == msg]


@pytest.fixture
def lines() -> Iterable[Lines]:
    handler = Lines()
    logger = logging.getLogger("reclaimd.dryrun")
    logger.addHandler(handler)
    old = logger.level
    logger.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old)


def log_of(nodes: Nodes) -> tuple[dryrun.WouldClaimLog, dryrun.DryRunCounters]:
    counters = dryrun.DryRunCounters()
    # A fixed clock: a peer claim is as old as the test says, however late the test runs.
    return dryrun.WouldClaimLog(nodes, HOLDER, counters, lease_s=20.0, clock=lambda: NOW), counters


# --- the claim ----------------------------------------------------------------------------


async def test_an_unclaimed_node_would_be_claimed_and_cordoned_but_is_not(lines: Lines) -> None:
    log, counters = log_of(Nodes(n1=Snapshot()))
    got = await log.claim(notice("a"), "n1")
    assert got.admission is Admission.CLAIMED
    assert got.on == claims.NodeObj("n1")
    assert got.cordoned is False  # nothing was cordoned, so the runbook reports no cordon
    [line] = lines.of("would claim")
    assert line["notice_id"] == "a"
    assert line["object"] == "node/n1"
    assert line["cordon"] is True
    assert counters.as_dict() == {"claim": 1}


async def test_a_live_peer_claim_dying_no_later_supersedes(lines: Lines) -> None:
    log, counters = log_of(Nodes(n1=Snapshot(peer_claim("earlier", deadline_s=60))))
    got = await log.claim(notice("later", deadline_s=120), "n1")
    assert got.admission is Admission.SUPERSEDED
    assert got.admission.ack  # the transport deletes it, as it would have
    [line] = lines.of("would not claim")
    assert line["held_by"] == "earlier"
    assert counters.as_dict() == {"not claim": 1}


async def test_a_peer_claim_dying_later_would_be_replaced() -> None:
    log, _ = log_of(Nodes(n1=Snapshot(peer_claim("later", deadline_s=600))))
    got = await log.claim(notice("sooner", deadline_s=60), "n1")
    assert got.admission is Admission.CLAIMED


async def test_the_same_notice_held_by_a_live_peer_is_a_duplicate() -> None:
    log, _ = log_of(Nodes(n1=Snapshot(peer_claim("same", deadline_s=120))))
    assert (await log.claim(notice("same"), "n1")).admission is Admission.DUPLICATE


async def test_its_own_would_claims_count_though_the_cache_never_shows_them() -> None:
    log, counters = log_of(Nodes(n1=Snapshot()))
    assert (await log.claim(notice("first", deadline_s=60), "n1")).admission is Admission.CLAIMED
    # A second notice for the node, dying later: covered by the first, as for real.
    second = await log.claim(notice("second", deadline_s=120), "n1")
    assert second.admission is Admission.SUPERSEDED
    # The same notice again (a restart's redelivery): ours already.
    again = await log.claim(notice("first", deadline_s=60), "n1")
    assert again.admission is Admission.RESUMED
    assert counters.as_dict() == {"claim": 2, "not claim": 1}


async def test_once_done_a_redelivery_is_a_duplicate_and_another_notice_claims(
    lines: Lines,
) -> None:
    log, counters = log_of(Nodes(n1=Snapshot()))
    n = notice("a", deadline_s=60)
    claimed = await log.claim(n, "n1")
    await log.done(Admitted(n, claimed), deadline_met=True)
    [line] = lines.of("would mark done")
    assert line["notice_id"] == "a"
    assert line["deadline_met"] is True
    assert (await log.claim(n, "n1")).admission is Admission.DUPLICATE
    assert (await log.claim(notice("b", deadline_s=120), "n1")).admission is Admission.CLAIMED
    assert counters["mark done"] == 1


async def test_a_node_not_in_the_cache_is_an_unknown_target() -> None:
    log, counters = log_of(Nodes())
    assert (await log.claim(notice("a", node="gone"), "gone")).admission is (
        Admission.UNKNOWN_TARGET
    )
    assert counters.as_dict() == {}


async def test_the_intake_acks_what_the_would_claim_decides() -> None:
    """Through the real intake: claimed and superseded are acked; the claimed one is queued."""
    nodes = Nodes(n1=Snapshot(peer_claim("held", deadline_s=30)), n2=Snapshot())
    log, _ = log_of(nodes)
    queued: list[Admitted] = []

    async def submit(a: Admitted) -> bool:
        queued.append(a)
        return True

    # The notices' times are fixed at import (NOW): keep the intake from calling them expired
    # however late in the session this runs; expiry is not what this test is about.
    intake = Intake(
        claims=log,
        resolver=nodes,
        submit=submit,
        drop_unknown=True,
        expire_after=timedelta(days=1),
    )
    first = await intake.admit(notice("held-over", node="n1"))
    second = await intake.admit(notice("fresh", node="n2"))
    assert (first, second) == (Admission.SUPERSEDED, Admission.CLAIMED)
    assert first.ack and second.ack
    assert [a.id for a in queued] == ["fresh"]


# --- the gang lock, the evictor, the signaller, the ledger -------------------------------


async def test_the_first_notice_per_gang_owns_it(lines: Lines) -> None:
    counters = dryrun.DryRunCounters()
    lock = dryrun.WouldLock(counters)
    assert await lock.acquire(GANG, notice("a")) is True
    assert await lock.acquire(GANG, notice("b", node="n2")) is False
    assert await lock.acquire(GANG, notice("a")) is True  # the owner again (a resume)
    assert [line["owner"] for line in lines.of("would skip gang")] == ["a"]
    assert counters.as_dict() == {"own gang": 2, "skip gang": 1}


async def test_the_evictor_evicts_nothing_and_names_the_notice_it_acts_for(
    lines: Lines,
) -> None:
    counters = dryrun.DryRunCounters()
    evictor = dryrun.WouldEvict(counters, policy="respect-pdb")
    deadline = NOW + timedelta(seconds=60)

    async def handle(admitted: Admitted) -> str:
        outcomes = await asyncio.gather(
            *(evictor.evict(m, deadline=deadline) for m in GANG.members)
        )
        return ",".join(outcomes)

    got = await dryrun.acting_for(handle)(Admitted(notice("a"), Claimed(Admission.CLAIMED)))
    assert got == "would-evict,would-evict"
    evicts = lines.of("would evict")
    assert [(e["notice_id"], e["pod"]) for e in evicts] == [("a", "ns/g-0"), ("a", "ns/g-1")]
    assert evicts[0]["policy"] == "respect-pdb"
    gone = await evictor.wait_gone(GANG.members[0], deadline=deadline)
    assert gone is not None
    assert gone <= utcnow()
    assert counters.as_dict() == {"evict": 2}


async def test_the_signaller_asks_nobody(lines: Lines) -> None:
    counters = dryrun.DryRunCounters()
    acks = await dryrun.WouldSignal(counters).signal(
        GANG, notice("a"), budget_deadline=NOW + timedelta(seconds=30)
    )
    assert [(a.member.name, a.acked, a.error) for a in acks] == [
        ("g-0", False, "dry-run"),
        ("g-1", False, "dry-run"),
    ]
    assert {line["pod"] for line in lines.of("would signal")} == {"ns/g-0", "ns/g-1"}
    assert counters.as_dict() == {"signal": 2}


async def test_the_ledger_logs_the_event_the_writer_would_encode(lines: Lines) -> None:
    counters = dryrun.DryRunCounters()
    policy = LabelPolicy()
    n = notice("a")
    w = waste.build_restart_waste(n, GANG, (), NOW, deadline_met=True, cluster="c")
    await dryrun.WouldRecord(counters, policy).record(w)
    [line] = lines.of("would record")
    assert line["notice_id"] == "a"
    _, _, value, _ = encode(w, policy)
    assert line["event"] == json.loads(value)
    assert counters.as_dict() == {"record": 1}


# --- the whole runbook, on would-parts ------------------------------------------------------


async def test_a_runbook_on_would_parts_logs_every_step_of_its_notice(lines: Lines) -> None:
    nodes = Nodes(n1=Snapshot(), n2=Snapshot())
    parts = dryrun.WouldParts.build(
        nodes, HOLDER, LabelPolicy(), lease_s=20.0, eviction_policy="p"
    )
    runbook = Runbook(
        view=nodes,
        writer=parts.evictor,
        signaller=parts.signaller,
        ledger=parts.recorder,
        progress=parts.claim_log,
        owners=GangOwners(parts.gang_lock),
        budget=Budget(30, 0.34, 120),
        build_waste=waste.build_restart_waste,
        tracer=TracerProvider().get_tracer("t"),
        cluster_name="test",
    )
    n = notice("a", response=Response.FULL)
    claimed = await parts.claim_log.claim(n, "n1")
    now = utcnow()
    report = await dryrun.acting_for(runbook.handle)(Admitted(n, claimed, (now, now)))
    assert set(report.evictions.values()) == {"would-evict"}
    assert "cordoned" not in report.times
    assert [w.notice.id for w in report.wastes] == ["a"]
    assert parts.counters.as_dict() == {
        "claim": 1,
        "evict": 2,
        "mark done": 1,
        "own gang": 1,
        "record": 1,
        "signal": 2,
    }
    assert {line["notice_id"] for line in lines.lines} == {"a"}


# --- the switch -----------------------------------------------------------------------------


def test_the_flag_and_the_setting(tmp_path: Any) -> None:
    from reclaimd import cli, config

    args = cli.build_parser().parse_args(["run", "--config", "c.yaml", "--dry-run"])
    assert args.dry_run is True
    assert cli.build_parser().parse_args(["run", "--config", "c.yaml"]).dry_run is False
    path = tmp_path / "c.yaml"
    path.write_text("dry_run: true\n")
    assert config.load(path).dry_run is True
    assert config.Settings().dry_run is False


def test_the_charts_arguments_run_the_daemon_dry(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The flag overrides a config that says otherwise, with the arguments the chart renders
    (deploy/helm/reclaimd/templates/_helpers.tpl, ``reclaimd.args``)."""
    from reclaimd import cli, config, daemon, logs

    path = tmp_path / "config.yaml"
    path.write_text("dry_run: false\ncluster_name: c\n")
    seen: list[config.Settings] = []

    async def run(settings: config.Settings) -> int:
        seen.append(settings)
        return 0

    monkeypatch.setattr(daemon, "run", run)
    monkeypatch.setattr(logs, "setup", lambda level: None)
    args = ["run", f"--config={path}", "--log-level=info"]
    assert cli.main([*args, "--dry-run"]) == 0
    assert cli.main(args) == 0
    assert [(s.dry_run, s.cluster_name) for s in seen] == [(True, "c"), (False, "c")]
