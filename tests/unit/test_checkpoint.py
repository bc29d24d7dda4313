"""reclaimd's side of the checkpoint contract, against real HTTP servers on loopback.

Every workload here is a real server: ``CheckpointServer`` (the helper trainers use), a bare
aiohttp app for replies the helper would never send, or a TCP listener that never answers.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from datetime import UTC, datetime, timedelta

import aiohttp
import pytest
from aiohttp import web

from reclaimd import annotations as ann
from reclaimd.checkpoint import (
    CUT_SHORT,
    LAST_ASK_S,
    NOT_OPTED_IN,
    budget_for,
    durable_since,
    leader_of,
    outcome_of,
    reserve_for,
    signal_gang,
)
from reclaimd.checkpointcall import request_body
from reclaimd.model import (
    CheckpointOutcome,
    CheckpointScope,
    Gang,
    GangKey,
    Member,
    Notice,
    NoticeKind,
    RankAck,
    Target,
    parse_time,
    utcnow,
)
from reclaimd_trainer.server import (
    CheckpointRequest,
    CheckpointResult,
    CheckpointServer,
    SaveFn,
    upload_checkpoint,
)

T0 = datetime(2026, 11, 30, 1, 0, 0, tzinfo=UTC)
SLACK_S = 1.5  # cancellation and scheduling on a busy machine; a logical bound, not a perf claim


# --- builders -----------------------------------------------------------------------------


def make_notice(window_s: float | None = 120.0, *, issued_ago_s: float = 0.0) -> Notice:
    now = utcnow()
    issued = now - timedelta(seconds=issued_ago_s)
    return Notice(
        id="ec2-3f1c0de5a1b2c3d4e5f6a7b8",
        source="ec2",
        kind=NoticeKind.SPOT_INTERRUPTION,
        target=Target(instance_id="i-0abc", node_name="gpu-node-1"),
        issued_at=issued,
        deadline=issued + timedelta(seconds=window_s) if window_s is not None else None,
        received_at=now,
    )


def make_member(
    name: str,
    *,
    rank: int | None,
    url: str = "",
    timeout_s: float = 0.0,
    leader: bool = False,
    last: datetime | None = None,
) -> Member:
    return Member(
        namespace="team-a",
        name=name,
        uid=f"uid-{name}",
        node="gpu-node-1",
        gpus=8,
        rank=rank,
        pod_ip="127.0.0.1",
        checkpoint_url=url,
        checkpoint_timeout_s=timeout_s,
        is_leader=leader,
        last_checkpoint=last,
    )


def make_gang(*members: Member, scope: CheckpointScope = CheckpointScope.RANK) -> Gang:
    return Gang(key=GangKey("jobset", "team-a", "llama"), members=members, scope=scope)


def trainer(
    *, delay_s: float = 0.0, durable: bool = True, step: int = 1200, fail: bool = False
) -> SaveFn:
    async def save(req: CheckpointRequest) -> CheckpointResult:
        if delay_s:
            await asyncio.sleep(delay_s)
        if fail:
            raise RuntimeError("disk full\nwhile writing shard 3")
        return CheckpointResult(
            checkpoint_time=T0, step=step, uri=f"s3://ckpt/{req.pod}/{step}", durable=durable
        )

    return save


class Silent:
    """A TCP listener that reads the request and never answers: a hung trainer."""

    def __init__(self) -> None:
        self.connected = asyncio.Event()
        self.closed = asyncio.Event()
        self.url = ""

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connected.set()
        while await reader.read(65536):
            pass
        self.closed.set()
        writer.close()


@asynccontextmanager
async def silent_server() -> AsyncIterator[Silent]:
    silent = Silent()
    server = await asyncio.start_server(silent._handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    silent.url = f"http://127.0.0.1:{port}/checkpoint"
    try:
        yield silent
    finally:
        server.close()


@asynccontextmanager
async def app_server(routes: list[web.RouteDef]) -> AsyncIterator[str]:
    app = web.Application()
    app.add_routes(routes)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


def workload(save: SaveFn, *, sync_window_s: float = 1.0) -> CheckpointServer:
    return CheckpointServer(save, host="127.0.0.1", port=0, sync_window_s=sync_window_s)


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


def budget(seconds: float) -> datetime:
    return utcnow() + timedelta(seconds=seconds)


# --- annotations --------------------------------------------------------------------------


def test_expand_url_fills_the_placeholders() -> None:
    assert (
        ann.expand_url("http://{pod_ip}:8080/checkpoint", "10.1.2.3", "team-a", "llama-0")
        == "http://10.1.2.3:8080/checkpoint"
    )
    assert (
        ann.expand_url(
            "https://ckpt.{namespace}.svc/{pod}/save",
            "10.1.2.3",
            "team-a",
            "llama-0",
            policy=ann.ANY_HOST,
        )
        == "https://ckpt.team-a.svc/llama-0/save"
    )


def test_expand_url_brackets_an_ipv6_pod_ip_once() -> None:
    assert (
        ann.expand_url("http://{pod_ip}:8080/c", "fd00::5", "ns", "p") == "http://[fd00::5]:8080/c"
    )
    assert (
        ann.expand_url("http://[{pod_ip}]:8080/c", "fd00::5", "ns", "p")
        == "http://[fd00::5]:8080/c"
    )


@pytest.mark.parametrize(
    ("template", "pod_ip", "says"),
    [
        ("", "10.1.2.3", "empty"),
        ("   ", "10.1.2.3", "empty"),
        ("ftp://{pod_ip}/checkpoint", "10.1.2.3", "http or https"),
        ("file:///etc/passwd", "10.1.2.3", "http or https"),
        ("{pod_ip}:8080/checkpoint", "10.1.2.3", "http or https"),
        ("http://{pod_ip}:8080/checkpoint", "", "no IP yet"),
        ("http://{pod_ip}:8080/checkpoint", "not-an-ip", "not an IP"),
        ("http://{pod_ip.__class__}/", "10.1.2.3", "unknown placeholder"),
        ("http://{host}:8080/", "10.1.2.3", "unknown placeholder"),
        ("http://{pod_ip:8080/", "10.1.2.3", "brace"),
        ("http://user:secret@{pod_ip}/", "10.1.2.3", "credentials"),
        ("http:///checkpoint", "10.1.2.3", "no host"),
        ("http://{pod_ip}:99999/", "10.1.2.3", "not a URL"),
        ("http://{pod_ip}/a b", "10.1.2.3", "not a URL"),
    ],
)
def test_expand_url_refuses(template: str, pod_ip: str, says: str) -> None:
    with pytest.raises(ValueError, match=says) as caught:
        ann.expand_url(template, pod_ip, "team-a", "llama-0")
    assert "\n" not in str(caught.value)


def test_expand_url_insists_on_the_pod_itself_by_default() -> None:
    with pytest.raises(ValueError, match="pod's own IP"):
        ann.expand_url("http://10.9.9.9/c", "10.1.2.3", "ns", "p")
    assert ann.expand_url("http://{pod_ip}/c", "10.1.2.3", "ns", "p") == "http://10.1.2.3/c"


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("45s", 45.0), ("2m", 120.0), ("1m30s", 90.0), ("500ms", 0.5), ("1h", 3600.0), ("1.5s", 1.5)],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert ann.parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "45", "0s", "30s1m", "1m1m", "-5s", "5 s", "1d", "45S", "x"])
def test_parse_duration_refuses(text: str) -> None:
    with pytest.raises(ValueError) as caught:
        ann.parse_duration(text)
    assert "\n" not in str(caught.value)


def test_parse_scope() -> None:
    assert ann.parse_scope(None) is CheckpointScope.RANK
    assert ann.parse_scope(" Leader ") is CheckpointScope.LEADER
    assert ann.parse_scope("rank") is CheckpointScope.RANK
    with pytest.raises(ValueError, match="rank or leader"):
        ann.parse_scope("everyone")


def test_read_pod_takes_every_annotation() -> None:
    got = ann.read_pod(
        {
            ann.CHECKPOINT_URL: "http://{pod_ip}:8080/checkpoint",
            ann.CHECKPOINT_TIMEOUT: "45s",
            ann.CHECKPOINT_SCOPE: "leader",
            ann.LAST_CHECKPOINT: "2026-11-30T00:58:00Z",
            ann.CHECKPOINT_DURABLE: "true",
            ann.RANK: "3",
            ann.LEADER: "true",
        },
        pod_ip="10.1.2.3",
        namespace="team-a",
        name="llama-3",
    )
    assert got == ann.PodContract(
        checkpoint_url="http://10.1.2.3:8080/checkpoint",
        checkpoint_timeout_s=45.0,
        scope=CheckpointScope.LEADER,
        last_checkpoint=datetime(2026, 11, 30, 0, 58, tzinfo=UTC),
        last_checkpoint_durable=True,
        rank=3,
        is_leader=True,
    )


def test_read_pod_drops_bad_values_and_says_why() -> None:
    got = ann.read_pod(
        {
            ann.CHECKPOINT_URL: "gopher://{pod_ip}/",
            ann.CHECKPOINT_TIMEOUT: "soon",
            ann.LAST_CHECKPOINT: "2026-11-30T00:58:00Z",
            ann.CHECKPOINT_DURABLE: "false",
            ann.RANK: "-1",
        },
        pod_ip="10.1.2.3",
        namespace="team-a",
        name="llama-3",
    )
    assert got.checkpoint_url == ""
    assert got.checkpoint_timeout_s == 0.0
    assert got.rank is None
    assert got.last_checkpoint is not None
    assert got.last_durable_checkpoint is None
    assert len(got.problems) == 3
    assert all("\n" not in p for p in got.problems)


def test_last_checkpoint_patch_records_only_durable_checkpoints() -> None:
    assert ann.last_checkpoint_patch(T0, durable=True) == {
        ann.LAST_CHECKPOINT: "2026-11-30T01:00:00Z",
        ann.CHECKPOINT_DURABLE: "true",
    }
    assert ann.last_checkpoint_patch(T0, durable=False) == {}


# --- budget -------------------------------------------------------------------------------


def test_budget_splits_an_ec2_window_90_30() -> None:
    notice = make_notice(120.0)
    assert notice.deadline is not None
    reserve = reserve_for(notice)
    assert reserve == pytest.approx(30.0)
    got = budget_for(notice, notice.received_at, reserve_s=reserve)
    assert got == notice.deadline - timedelta(seconds=30)


def test_budget_splits_a_gce_window_about_20_10() -> None:
    notice = make_notice(30.0)
    assert notice.deadline is not None
    reserve = reserve_for(notice)
    assert reserve == pytest.approx(10.2)
    got = budget_for(notice, notice.received_at, reserve_s=reserve)
    assert (got - notice.issued_at).total_seconds() == pytest.approx(19.8)


def test_budget_of_a_late_notice_is_one_last_ask_not_the_past() -> None:
    """Inside the drain reserve: the budget is spent, but a rank that saved still answers."""
    notice = make_notice(120.0, issued_ago_s=100.0)
    now = utcnow()
    assert budget_for(notice, now, reserve_s=30.0) == now + timedelta(seconds=LAST_ASK_S)


def test_a_notice_past_its_deadline_still_asks_each_rank_briefly() -> None:
    """Resumed after the deadline (a takeover, a pause): a rank that saved for the notice
    answers with that save, so the budget is short, not empty."""
    notice = make_notice(30.0, issued_ago_s=45.0)
    now = utcnow()
    got = budget_for(notice, now, reserve_s=10.0)
    assert got == now + timedelta(seconds=LAST_ASK_S)
    assert 0 < LAST_ASK_S <= 2  # the drain's reserve pays for it


async def test_a_rank_that_saved_answers_a_notice_resumed_past_its_deadline(
    session: aiohttp.ClientSession,
) -> None:
    """The successor's ask after the deadline gets the save the rank already made for the
    notice (asked by the replica that stopped), at once."""
    saves = 0

    async def save(req: CheckpointRequest) -> CheckpointResult:
        nonlocal saves
        saves += 1
        return CheckpointResult(checkpoint_time=T0, step=4242, uri="s3://ckpt/r0", durable=True)

    async with workload(save) as w:
        notice = make_notice(30.0, issued_ago_s=40.0)
        gang = make_gang(make_member("r0", rank=0, url=w.url))
        first = await signal_gang(gang, notice, budget_deadline=budget(5), session=session)
        late = budget_for(notice, utcnow(), reserve_s=10.0)
        again = await signal_gang(gang, notice, budget_deadline=late, session=session)
    assert first[0].acked and again[0].acked and again[0].step == 4242, again[0]
    assert saves == 1  # the same save, not a second one


def test_budget_of_a_notice_without_deadline() -> None:
    notice = make_notice(None)
    now = utcnow()
    assert reserve_for(notice) == 0.0
    assert budget_for(notice, now, reserve_s=30.0) == now + timedelta(seconds=120)
    assert budget_for(notice, now, reserve_s=30.0, open_budget_s=10) == now + timedelta(seconds=10)


# --- fan-out ------------------------------------------------------------------------------


async def test_fan_out_to_a_mixed_gang(session: aiohttp.ClientSession) -> None:
    """Fast, slow (202 then done), silent, failing and not-opted-in ranks in one gang."""
    async with AsyncExitStack() as stack:
        fast = await stack.enter_async_context(workload(trainer()))
        # A zero sync window forces the 202-then-poll path.
        slow = await stack.enter_async_context(
            workload(trainer(delay_s=0.3, step=1201), sync_window_s=0.0)
        )
        failing = await stack.enter_async_context(workload(trainer(fail=True)))
        silent = await stack.enter_async_context(silent_server())
        gang = make_gang(
            make_member("llama-0", rank=0, url=fast.url),
            make_member("llama-1", rank=1, url=slow.url),
            make_member("llama-2", rank=2, url=silent.url),
            make_member("llama-3", rank=3, url=failing.url),
            make_member("llama-4", rank=4),
        )
        seen: list[RankAck] = []
        loop = asyncio.get_running_loop()
        started = loop.time()
        acks = await signal_gang(
            gang,
            make_notice(),
            budget_deadline=budget(2.0),
            session=session,
            poll_interval_s=0.05,
            on_ack=seen.append,
        )
        elapsed = loop.time() - started

        assert [a.member.name for a in acks] == [m.name for m in gang.members]
        assert [a.acked for a in acks] == [True, True, False, False, False]
        assert acks[0].durable and acks[0].step == 1200 and acks[0].uri == "s3://ckpt/llama-0/1200"
        assert acks[0].checkpoint_time == T0
        assert acks[1].step == 1201
        # The slow rank was acked through the status URL: one POST, one save.
        assert len(slow.requests) == 1 and slow.save_count == 1
        assert acks[2].error.startswith("no reply within")
        assert "HTTP 500" in acks[3].error and "disk full while writing shard 3" in acks[3].error
        assert acks[4].error == NOT_OPTED_IN
        assert all("\n" not in a.error for a in acks)
        assert sorted(a.member.name for a in seen) == sorted(m.name for m in gang.members)
        assert outcome_of(gang, acks) is CheckpointOutcome.PARTIAL
        # The silent rank held the fan-out to the budget and no further.
        assert elapsed < 2.0 + SLACK_S
        await asyncio.wait_for(silent.closed.wait(), timeout=5)


async def test_member_timeout_ends_a_rank_before_the_budget(
    session: aiohttp.ClientSession,
) -> None:
    async with silent_server() as silent:
        gang = make_gang(make_member("llama-0", rank=0, url=silent.url, timeout_s=0.2))
        loop = asyncio.get_running_loop()
        started = loop.time()
        (ack,) = await signal_gang(
            gang, make_notice(), budget_deadline=budget(60.0), session=session
        )
        assert not ack.acked
        assert ack.error == "no reply within 0.2s"
        assert loop.time() - started < 60.0


async def test_every_rank_gets_the_request_and_its_own_traceparent(
    session: aiohttp.ClientSession,
) -> None:
    async with workload(trainer()) as a, workload(trainer()) as b:
        gang = make_gang(
            make_member("llama-0", rank=0, url=a.url), make_member("llama-1", rank=1, url=b.url)
        )
        notice = make_notice()
        ends = budget(10.0)

        def traceparent(m: Member) -> str:
            return f"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b{m.rank}-01"

        acks = await signal_gang(
            gang, notice, budget_deadline=ends, session=session, traceparent=traceparent
        )
        assert all(x.acked for x in acks)
        (ra,) = a.requests
        (rb,) = b.requests
        assert ra.traceparent == "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b0-01"
        assert rb.traceparent == "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b1-01"
        assert (ra.notice_id, ra.reason, ra.gang) == (
            notice.id,
            "spot_interruption",
            "jobset:team-a/llama",
        )
        assert (ra.rank, ra.namespace, ra.pod) == (0, "team-a", "llama-0")
        assert rb.rank == 1
        assert ra.notice_deadline is not None and notice.deadline is not None
        assert abs((ra.notice_deadline - notice.deadline).total_seconds()) < 0.001
        assert abs((ra.deadline - ends).total_seconds()) < 0.001


async def test_leader_scope_asks_only_the_leader(session: aiohttp.ClientSession) -> None:
    async with AsyncExitStack() as stack:
        servers = [await stack.enter_async_context(workload(trainer())) for _ in range(3)]
        gang = make_gang(
            make_member("llama-0", rank=0, url=servers[0].url),
            make_member("llama-1", rank=1, url=servers[1].url, leader=True),
            make_member("llama-2", rank=2, url=servers[2].url),
            make_member("llama-3", rank=3),
            scope=CheckpointScope.LEADER,
        )
        acks = await signal_gang(gang, make_notice(), budget_deadline=budget(10), session=session)

        assert [s.save_count for s in servers] == [0, 1, 0]
        assert [len(s.requests) for s in servers] == [0, 1, 0]
        assert all(a.acked and a.durable and a.checkpoint_time == T0 for a in acks)
        assert acks[1].covered_by == ""
        covered = [a for a in acks if a.covered_by]
        assert [a.member.name for a in covered] == ["llama-0", "llama-2", "llama-3"]
        assert all(a.covered_by == "team-a/llama-1" for a in covered)
        assert outcome_of(gang, acks) is CheckpointOutcome.CHECKPOINTED


async def test_leader_scope_falls_back_to_the_lowest_rank(session: aiohttp.ClientSession) -> None:
    async with AsyncExitStack() as stack:
        servers = [await stack.enter_async_context(workload(trainer())) for _ in range(3)]
        gang = make_gang(
            make_member("llama-a", rank=2, url=servers[0].url),
            make_member("llama-b", rank=1, url=servers[1].url),
            make_member("llama-c", rank=0),  # the lowest rank, but it did not opt in
            make_member("llama-d", rank=None, url=servers[2].url),
            scope=CheckpointScope.LEADER,
        )
        assert leader_of(gang) == gang.members[1]
        acks = await signal_gang(gang, make_notice(), budget_deadline=budget(10), session=session)
        assert [s.save_count for s in servers] == [0, 1, 0]
        assert all(a.acked for a in acks)


async def test_a_leader_that_fails_fails_the_whole_gang(session: aiohttp.ClientSession) -> None:
    async with workload(trainer(fail=True)) as leader:
        gang = make_gang(
            make_member("llama-0", rank=0, url=leader.url),
            make_member("llama-1", rank=1),
            scope=CheckpointScope.LEADER,
        )
        acks = await signal_gang(gang, make_notice(), budget_deadline=budget(10), session=session)
        assert [a.acked for a in acks] == [False, False]
        assert acks[1].error.startswith("leader team-a/llama-0 did not ack: ")
        assert outcome_of(gang, acks) is CheckpointOutcome.NO_ACK


async def test_leader_scope_without_any_url_is_not_opted_in(
    session: aiohttp.ClientSession,
) -> None:
    gang = make_gang(make_member("llama-0", rank=0), scope=CheckpointScope.LEADER)
    acks = await signal_gang(gang, make_notice(), budget_deadline=budget(10), session=session)
    assert [(a.acked, a.error) for a in acks] == [(False, NOT_OPTED_IN)]
    assert outcome_of(gang, acks) is CheckpointOutcome.NOT_OPTED_IN


async def test_signalling_twice_saves_once(session: aiohttp.ClientSession) -> None:
    async with workload(trainer(delay_s=0.1), sync_window_s=0.0) as server:
        gang = make_gang(make_member("llama-0", rank=0, url=server.url))
        notice = make_notice()
        first, second = await asyncio.gather(
            signal_gang(
                gang, notice, budget_deadline=budget(10), session=session, poll_interval_s=0.05
            ),
            signal_gang(
                gang, notice, budget_deadline=budget(10), session=session, poll_interval_s=0.05
            ),
        )
        assert first[0].acked and second[0].acked
        assert first[0].checkpoint_time == second[0].checkpoint_time
        assert server.save_count == 1
        assert len(server.requests) == 2


async def test_durable_is_false_when_the_upload_fails(session: aiohttp.ClientSession) -> None:
    class BrokenStore:
        async def put(self, key: str, body: bytes, *, deadline: datetime) -> str:
            raise OSError("503 SlowDown")

    async def save(req: CheckpointRequest) -> CheckpointResult:
        return await upload_checkpoint(
            req,
            b"weights",
            store=BrokenStore(),
            key=f"checkpoints/team-a/{req.pod}/1200",
            step=1200,
            checkpoint_time=T0,
            stash_uri="file:///stash/1200",
        )

    async with workload(save) as server:
        gang = make_gang(make_member("llama-0", rank=0, url=server.url))
        (ack,) = await signal_gang(gang, make_notice(), budget_deadline=budget(10), session=session)
        assert ack.acked and not ack.durable
        assert ack.uri == "file:///stash/1200"
        assert outcome_of(gang, (ack,)) is CheckpointOutcome.NOT_DURABLE


async def test_a_spent_budget_sends_nothing(session: aiohttp.ClientSession) -> None:
    async with workload(trainer()) as server:
        gang = make_gang(make_member("llama-0", rank=0, url=server.url))
        (ack,) = await signal_gang(
            gang, make_notice(), budget_deadline=utcnow() - timedelta(seconds=1), session=session
        )
        assert not ack.acked
        assert ack.error == "budget spent before the request could be sent"
        assert len(server.requests) == 0


async def test_fan_out_respects_the_concurrency_bound(session: aiohttp.ClientSession) -> None:
    in_flight = 0
    most = 0

    async def save(req: CheckpointRequest) -> CheckpointResult:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        await asyncio.sleep(0.05)
        in_flight -= 1
        return CheckpointResult(checkpoint_time=T0, durable=True)

    async with AsyncExitStack() as stack:
        servers = [await stack.enter_async_context(workload(save)) for _ in range(4)]
        gang = make_gang(
            *(make_member(f"llama-{i}", rank=i, url=s.url) for i, s in enumerate(servers))
        )
        acks = await signal_gang(
            gang, make_notice(), budget_deadline=budget(20), session=session, concurrency=1
        )
        assert all(a.acked for a in acks)
        assert most == 1


# --- replies the helper would never send --------------------------------------------------


async def test_malformed_replies_are_not_acks(session: aiohttp.ClientSession) -> None:
    replies = {
        "/no-time": {"step": 3, "durable": True},
        "/bad-time": {"checkpoint_time": "yesterday", "durable": True},
        "/bad-step": {"checkpoint_time": "2026-11-30T01:00:00Z", "step": "3"},
        "/bad-durable": {"checkpoint_time": "2026-11-30T01:00:00Z", "durable": "yes"},
        "/array": [1, 2],
    }

    def route(path: str) -> web.RouteDef:
        async def handle(_: web.Request) -> web.Response:
            return web.json_response(replies[path])

        return web.post(path, handle)

    async def not_json(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async with app_server([*map(route, replies), web.post("/text", not_json)]) as base:
        paths = [*replies, "/text"]
        gang = make_gang(*(make_member(f"p{i}", rank=i, url=base + p) for i, p in enumerate(paths)))
        acks = await signal_gang(gang, make_notice(), budget_deadline=budget(10), session=session)
        assert not any(a.acked for a in acks)
        assert all(a.error.startswith("malformed reply:") for a in acks), [a.error for a in acks]


async def test_a_status_url_on_another_origin_is_refused(session: aiohttp.ClientSession) -> None:
    async with workload(trainer()) as elsewhere:

        async def accepted(_: web.Request) -> web.Response:
            return web.json_response({}, status=202, headers={"Location": elsewhere.url})

        async with app_server([web.post("/checkpoint", accepted)]) as base:
            gang = make_gang(make_member("llama-0", rank=0, url=base + "/checkpoint"))
            (ack,) = await signal_gang(
                gang, make_notice(), budget_deadline=budget(10), session=session
            )
            assert not ack.acked
            assert "leaves the checkpoint URL's origin" in ack.error
            assert len(elsewhere.requests) == 0


async def test_a_202_without_status_url_is_polled_by_posting_again(
    session: aiohttp.ClientSession,
) -> None:
    calls = 0

    async def handle(request: web.Request) -> web.Response:
        nonlocal calls
        calls += 1
        if calls < 3:
            return web.json_response({}, status=202)
        body = await request.json()
        return web.json_response(
            {"checkpoint_time": "2026-11-30T01:00:00Z", "step": 7, "uri": body["pod"]}
        )

    async with app_server([web.post("/checkpoint", handle)]) as base:
        gang = make_gang(make_member("llama-0", rank=0, url=base + "/checkpoint"))
        (ack,) = await signal_gang(
            gang, make_notice(), budget_deadline=budget(10), session=session, poll_interval_s=0.01
        )
        assert ack.acked and not ack.durable  # a reply without "durable" is not durable
        assert (ack.step, ack.uri, calls) == (7, "llama-0", 3)


async def test_redirects_are_not_followed(session: aiohttp.ClientSession) -> None:
    async with workload(trainer()) as target:

        async def moved(_: web.Request) -> web.Response:
            return web.Response(status=307, headers={"Location": target.url})

        async with app_server([web.post("/checkpoint", moved)]) as base:
            gang = make_gang(make_member("llama-0", rank=0, url=base + "/checkpoint"))
            (ack,) = await signal_gang(
                gang, make_notice(), budget_deadline=budget(10), session=session
            )
            assert not ack.acked and "HTTP 307" in ack.error
            assert len(target.requests) == 0


async def test_nobody_listening_is_not_an_ack(session: aiohttp.ClientSession) -> None:
    async with silent_server() as gone:
        url = gone.url
    gang = make_gang(make_member("llama-0", rank=0, url=url))
    (ack,) = await signal_gang(gang, make_notice(), budget_deadline=budget(10), session=session)
    assert not ack.acked and ack.error
    assert "\n" not in ack.error


# --- cancellation -------------------------------------------------------------------------


async def test_cancelling_the_fan_out_cancels_its_requests(session: aiohttp.ClientSession) -> None:
    async with silent_server() as silent:
        gang = make_gang(make_member("llama-0", rank=0, url=silent.url))
        task = asyncio.create_task(
            signal_gang(gang, make_notice(), budget_deadline=budget(300), session=session)
        )
        await asyncio.wait_for(silent.connected.wait(), timeout=10)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, timeout=10)  # a hang fails as TimeoutError
        # The request was torn down with the fan-out, not left running until its budget.
        await asyncio.wait_for(silent.closed.wait(), timeout=10)


# --- outcome ------------------------------------------------------------------------------


def _ack(m: Member, *, acked: bool = True, durable: bool = True) -> RankAck:
    return RankAck(member=m, acked=acked, durable=durable, checkpoint_time=T0 if acked else None)


def test_outcome_of() -> None:
    a = make_member("a", rank=0, url="http://10.0.0.1/c")
    b = make_member("b", rank=1, url="http://10.0.0.2/c")
    c = make_member("c", rank=2)
    both = make_gang(a, b)
    assert outcome_of(both, [_ack(a), _ack(b)]) is CheckpointOutcome.CHECKPOINTED
    assert outcome_of(both, [_ack(a), _ack(b, durable=False)]) is CheckpointOutcome.NOT_DURABLE
    assert outcome_of(both, [_ack(a), _ack(b, acked=False)]) is CheckpointOutcome.PARTIAL
    assert outcome_of(both, [_ack(a)]) is CheckpointOutcome.PARTIAL  # b's ack is missing
    assert (
        outcome_of(both, [_ack(a, acked=False), _ack(b, acked=False)]) is CheckpointOutcome.NO_ACK
    )
    # In rank scope a rank that cannot be asked still has state to lose.
    assert outcome_of(make_gang(a, c), [_ack(a), _ack(c, acked=False)]) is (
        CheckpointOutcome.PARTIAL
    )
    assert outcome_of(make_gang(c), [_ack(c, acked=False)]) is CheckpointOutcome.NOT_OPTED_IN
    assert outcome_of(make_gang(), []) is CheckpointOutcome.NOT_OPTED_IN
    led = make_gang(a, b, c, scope=CheckpointScope.LEADER)
    assert outcome_of(led, [_ack(a)]) is CheckpointOutcome.CHECKPOINTED
    assert outcome_of(led, [_ack(b)]) is CheckpointOutcome.NO_ACK  # b is not the leader


def test_durable_since() -> None:
    earlier = T0 - timedelta(minutes=20)
    m = make_member("a", rank=0, url="http://10.0.0.1/c", last=earlier)
    assert durable_since(_ack(m)) == T0
    assert durable_since(_ack(m, durable=False)) == earlier
    assert durable_since(_ack(m, acked=False)) == earlier
    fresh = make_member("b", rank=0, url="http://10.0.0.1/c")
    assert durable_since(_ack(fresh, durable=False)) is None
    # An ack that names an older checkpoint than the one on record does not move the clock back.
    newer = make_member("c", rank=0, last=T0 + timedelta(minutes=1))
    assert durable_since(_ack(newer)) == T0 + timedelta(minutes=1)


def test_parse_time_round_trip_of_the_request_deadline() -> None:
    # The request carries milliseconds; the trainer must read back the same instant.
    ends = datetime(2026, 11, 30, 1, 1, 30, 250000, tzinfo=UTC)
    body = request_body(make_gang(), make_notice(), make_member("a", rank=0), ends)
    assert parse_time(body["deadline"]) == ends


async def test_a_cut_ends_the_wait_and_keeps_the_acks_already_in(
    session: aiohttp.ClientSession,
) -> None:
    async with silent_server() as silent, workload(trainer()) as quick:
        gang = make_gang(
            make_member("llama-0", rank=0, url=quick.url),
            make_member("llama-1", rank=1, url=silent.url),
        )
        cut = asyncio.Event()
        asyncio.get_running_loop().call_later(0.3, cut.set)
        acks = await asyncio.wait_for(
            signal_gang(
                gang, make_notice(), budget_deadline=budget(60.0), session=session, cut=cut
            ),
            10,
        )
        assert [a.acked for a in acks] == [True, False]
        assert acks[1].error == CUT_SHORT


async def test_each_request_carries_the_ranks_share_of_its_tenants_put_budget(
    session: aiohttp.ClientSession,
) -> None:
    from reclaimd.putbudget import TenantPutBudgets, tenant_of

    budgets = TenantPutBudgets(20.0)
    async with workload(trainer()) as a, workload(trainer()) as b:
        gang = make_gang(
            make_member("llama-0", rank=0, url=a.url), make_member("llama-1", rank=1, url=b.url)
        )
        acks = await signal_gang(
            gang, make_notice(), budget_deadline=budget(10), session=session, put_budgets=budgets
        )
        assert all(ack.acked for ack in acks)
        assert tenant_of(gang) == "team-a"  # no tenant label: the gang's namespace
        shares = [s.requests[-1].put_budget for s in (a, b)]
    assert all(share is not None for share in shares)
    assert sum(share.qps for share in shares if share is not None) <= 20.0
    # every share went back once the ranks answered
    assert budgets.in_flight("team-a") == 0 and budgets.outstanding("team-a") == (0, 0)


# --- a pause across the end of the budget ----------------------------------------------------


class _ThreadedTrainer:
    """A trainer in a thread of its own: it answers while the test's event loop is blocked,
    as a real trainer answers while reclaimd is SIGSTOPped (the kernel keeps the reply)."""

    def __init__(self, answer_after_s: float) -> None:
        import http.server
        import threading

        delay = answer_after_s

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", "0")))
                import time

                time.sleep(delay)
                body = (
                    b'{"checkpoint_time": "2026-11-30T01:00:00Z", "step": 7,'
                    b' "uri": "s3://ckpt/r0/7", "durable": true}'
                )
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:
                    pass  # reclaimd stopped waiting and hung up: the answer is too late

            def log_message(self, *args: object) -> None:
                return None

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/checkpoint"

    def __enter__(self) -> _ThreadedTrainer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


async def test_a_reply_that_came_in_while_the_process_was_paused_counts_as_the_ack() -> None:
    """The rank answers 0.3 s in, inside its 1 s budget, but the loop is blocked from 0.1 s
    to 2.1 s (a SIGSTOP): when it wakes, the budget's timer is due and so is the socket. The
    reply the kernel took in time is read before the rank is declared silent."""
    import time

    with _ThreadedTrainer(answer_after_s=0.3) as t:
        gang = make_gang(make_member("r0", rank=0, url=t.url))
        loop = asyncio.get_running_loop()
        loop.call_later(0.1, time.sleep, 2.0)  # the pause: nothing in this loop runs
        async with aiohttp.ClientSession() as s:
            acks = await signal_gang(
                gang,
                make_notice(),
                budget_deadline=utcnow() + timedelta(seconds=1.0),
                session=s,
            )
    assert acks[0].acked and acks[0].durable and acks[0].step == 7, acks[0]


async def test_a_rank_silent_through_a_pause_is_still_not_acked() -> None:
    """The late look reads what came in; it does not wait for a rank that never answered."""
    import time

    with _ThreadedTrainer(answer_after_s=5.0) as t:
        gang = make_gang(make_member("r0", rank=0, url=t.url))
        loop = asyncio.get_running_loop()
        loop.call_later(0.1, time.sleep, 1.5)
        started = loop.time()
        async with aiohttp.ClientSession() as s:
            acks = await signal_gang(
                gang,
                make_notice(),
                budget_deadline=utcnow() + timedelta(seconds=0.5),
                session=s,
            )
        waited = loop.time() - started
    assert not acks[0].acked and "no reply" in acks[0].error, acks[0]
    assert waited < 1.6 + SLACK_S  # the look is bounded: no wait for the 5 s answer


class _ThreadedSavingTrainer(_ThreadedTrainer):
    """Answers the POST ``202`` (saving) at once and any status poll ``200`` (done)."""

    def __init__(self) -> None:
        import http.server
        import threading

        done = (
            b'{"checkpoint_time": "2026-11-30T01:00:00Z", "step": 9,'
            b' "uri": "s3://ckpt/r0/9", "durable": true}'
        )
        self.polls = 0
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _send(self, code: int, body: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                if code == 202:
                    self.send_header("Location", "/status")
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", "0")))
                self._send(202, b"{}")

            def do_GET(self) -> None:
                outer.polls += 1
                self._send(200, done)

            def log_message(self, *args: object) -> None:
                return None

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/checkpoint"


async def test_a_process_that_wakes_past_the_budget_sends_no_new_status_poll() -> None:
    """Saving (202) when the loop is blocked from 0.1 s to 2.1 s, past the 1 s budget: on
    waking, a poll now would be answered after the deadline. None is sent; no ack."""
    import time

    with _ThreadedSavingTrainer() as t:
        gang = make_gang(make_member("r0", rank=0, url=t.url))
        asyncio.get_running_loop().call_later(0.1, time.sleep, 2.0)
        async with aiohttp.ClientSession() as s:
            acks = await signal_gang(
                gang,
                make_notice(),
                budget_deadline=utcnow() + timedelta(seconds=1.0),
                session=s,
                poll_interval_s=0.5,
            )
        polls = t.polls
    assert not acks[0].acked and "still saving" in acks[0].error, acks[0]
    assert polls == 0
