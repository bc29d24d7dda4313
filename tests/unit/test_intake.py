import asyncio
from datetime import timedelta

from reclaimd.intake import Admission, Admitted, Claimed, Intake
from reclaimd.model import Notice, NoticeKind, Target, WorkloadRef, utcnow

EXPIRE = timedelta(minutes=5)  # the settings' default policy.expired_after_s


def notice(nid: str, target: Target) -> Notice:
    now = utcnow()
    return Notice(nid, "test", NoticeKind.SPOT_INTERRUPTION, target, now, now, now)


class Claims:
    def __init__(self, answer: Admission | Exception) -> None:
        self.answer = answer
        self.calls: list[tuple[str, str | None]] = []

    async def claim(self, n: Notice, node: str | None) -> Claimed:
        self.calls.append((n.id, node))
        if isinstance(self.answer, Exception):
            raise self.answer
        return Claimed(self.answer, on=("obj", node), node=node or "", cordoned=node is not None)


class Resolver:
    def resolve_node(self, target: Target) -> str | None:
        return {"i-1": "node-1"}.get(target.instance_id)


async def run(claims: Claims, n: Notice, *, drop: bool = True) -> tuple[Admission, list[str]]:
    submitted: list[str] = []

    async def submit(x: Admitted) -> None:
        submitted.append(x.id)

    intake = Intake(
        claims=claims, resolver=Resolver(), submit=submit, drop_unknown=drop, expire_after=EXPIRE
    )
    return await intake.admit(n), submitted


async def test_claimed_is_submitted_and_acked() -> None:
    claims = Claims(Admission.CLAIMED)
    a, sub = await run(claims, notice("n1", Target(instance_id="i-1")))
    assert a is Admission.CLAIMED and a.ack and sub == ["n1"]
    assert claims.calls == [("n1", "node-1")]


async def test_redelivery_is_a_duplicate_without_a_second_claim() -> None:
    claims = Claims(Admission.CLAIMED)
    submitted: list[str] = []

    async def submit(x: Admitted) -> None:
        submitted.append(x.id)

    intake = Intake(
        claims=claims, resolver=Resolver(), submit=submit, drop_unknown=True, expire_after=EXPIRE
    )
    n = notice("n1", Target(instance_id="i-1"))
    assert await intake.admit(n) is Admission.CLAIMED
    assert await intake.admit(n) is Admission.DUPLICATE
    assert len(claims.calls) == 1 and submitted == ["n1"]


async def test_claim_failure_leaves_message_for_redelivery() -> None:
    a, sub = await run(
        Claims(RuntimeError("apiserver down")), notice("n", Target(instance_id="i-1"))
    )
    assert a is Admission.RETRY and not a.ack and sub == []


async def test_unknown_instance_follows_policy() -> None:
    n = notice("n", Target(instance_id="i-unknown"))
    dropped, _ = await run(Claims(Admission.CLAIMED), n, drop=True)
    kept, _ = await run(Claims(Admission.CLAIMED), n, drop=False)
    assert dropped is Admission.UNKNOWN_TARGET and dropped.ack
    assert kept is Admission.RETRY and not kept.ack


async def test_workload_target_needs_no_node() -> None:
    claims = Claims(Admission.CLAIMED)
    a, sub = await run(claims, notice("w", Target(workload=WorkloadRef("ns", "wl"))))
    assert a is Admission.CLAIMED and claims.calls == [("w", None)] and sub == ["w"]


async def test_peer_duplicate_is_not_run_here() -> None:
    a, sub = await run(Claims(Admission.DUPLICATE), notice("n", Target(instance_id="i-1")))
    assert a is Admission.DUPLICATE and a.ack and sub == []


async def test_long_expired_notice_is_acked_without_a_claim() -> None:
    claims = Claims(Admission.CLAIMED)
    now = utcnow()
    old = Notice(
        "old",
        "test",
        NoticeKind.SPOT_INTERRUPTION,
        Target(instance_id="i-1"),
        now - timedelta(hours=1),
        now - timedelta(minutes=58),
        now,
    )
    a, sub = await run(claims, old)
    assert a is Admission.EXPIRED and a.ack and sub == [] and claims.calls == []
    recent = Notice(
        "late",
        "test",
        NoticeKind.SPOT_INTERRUPTION,
        Target(instance_id="i-1"),
        now - timedelta(minutes=3),
        now - timedelta(minutes=1),
        now,
    )
    a, _ = await run(claims, recent)
    assert a is Admission.CLAIMED  # past its deadline, but recent: still worth the cleanup


class Gated(Claims):
    """Claims that wait for ``gate`` (or raise ``fail``) so deliveries can overlap."""

    def __init__(self, answer: Admission | Exception) -> None:
        super().__init__(answer)
        self.gate = asyncio.Event()
        self.entered = asyncio.Event()

    async def claim(self, n: Notice, node: str | None) -> Claimed:
        self.entered.set()
        await self.gate.wait()
        return await super().claim(n, node)


async def test_concurrent_deliveries_of_one_notice_share_one_claim() -> None:
    claims = Gated(Admission.CLAIMED)
    submitted: list[str] = []

    async def submit(x: Admitted) -> None:
        submitted.append(x.id)

    intake = Intake(
        claims=claims, resolver=Resolver(), submit=submit, drop_unknown=True, expire_after=EXPIRE
    )
    n = notice("n1", Target(instance_id="i-1"))
    first = asyncio.create_task(intake.admit(n))
    await claims.entered.wait()
    second = asyncio.create_task(intake.admit(n))
    await asyncio.sleep(0)
    claims.gate.set()
    assert await asyncio.gather(first, second) == [Admission.CLAIMED, Admission.CLAIMED]
    assert len(claims.calls) == 1 and submitted == ["n1"]


async def test_a_cancelled_admission_tells_its_waiters_to_retry() -> None:
    claims = Gated(Admission.CLAIMED)

    async def submit(x: Admitted) -> None:
        return None

    intake = Intake(
        claims=claims, resolver=Resolver(), submit=submit, drop_unknown=True, expire_after=EXPIRE
    )
    n = notice("n1", Target(instance_id="i-1"))
    leader = asyncio.create_task(intake.admit(n))
    await claims.entered.wait()
    follower = asyncio.create_task(intake.admit(n))
    await asyncio.sleep(0)
    leader.cancel()
    assert await follower is Admission.RETRY
    assert intake._flights == {}


async def test_the_admitted_value_carries_claim_times_receipt_and_the_claim() -> None:
    claims = Claims(Admission.CLAIMED)
    got: list[Admitted] = []
    seen: list[tuple[str, Admission]] = []

    async def submit(x: Admitted) -> None:
        got.append(x)

    def on_admission(n: Notice, a: Admission) -> None:
        seen.append((n.id, a))

    intake = Intake(
        claims=claims, resolver=Resolver(), submit=submit, drop_unknown=True,
        expire_after=EXPIRE, on_admission=on_admission,
    )
    n = notice("n1", Target(instance_id="i-1"))
    assert await intake.admit(n) is Admission.CLAIMED
    (a,) = got
    assert a.notice is n and a.claim.node == "node-1" and a.claim.cordoned
    assert a.claim_times is not None and a.claim_times[0] <= a.claim_times[1]
    assert seen == [("n1", Admission.CLAIMED)]  # observed before the runbook got it


async def test_resume_claims_again_and_submits_without_claim_times() -> None:
    claims = Claims(Admission.RESUMED)
    got: list[Admitted] = []

    async def submit(x: Admitted) -> None:
        got.append(x)

    intake = Intake(
        claims=claims, resolver=Resolver(), submit=submit, drop_unknown=True, expire_after=EXPIRE
    )
    n = notice("n1", Target(instance_id="i-1"))
    assert await intake.resume(n, "node-1") is Admission.RESUMED
    assert [a.claim_times for a in got] == [None] and claims.calls == [("n1", "node-1")]
