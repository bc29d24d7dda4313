"""Notices not yet claimed are kept on the replica's disk, and the next process on that disk
admits them at once (``reclaimd.heldnotices``), not when a transport's lease runs out."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from test_intake import EXPIRE, Claims, Resolver, notice

from reclaimd.heldnotices import HeldNotices, HeldSource
from reclaimd.intake import Admission, Admitted, Claimed, Intake
from reclaimd.model import Notice, Target


def intake(claims: Claims, held: HeldNotices, submitted: list[str]) -> Intake:
    async def submit(x: Admitted) -> None:
        submitted.append(x.id)

    return Intake(claims=claims, resolver=Resolver(), submit=submit, drop_unknown=True, held=held,
        expire_after=EXPIRE,
    )


async def test_a_notice_not_claimed_is_admitted_by_the_next_process_on_the_disk(
    tmp_path: Path,
) -> None:
    path = tmp_path / "held.sqlite"
    n = notice("n1", Target(instance_id="i-1"))
    down: list[str] = []
    first = intake(Claims(RuntimeError("apiserver down")), HeldNotices(path), down)
    assert await first.admit(n) is Admission.RETRY  # held from before the claim was tried
    assert first.held is not None
    assert "n1" in first.held and down == []  # not claimed: on disk, the message kept too
    first.held.close()  # the process dies here, its transport's copy leased elsewhere

    submitted: list[str] = []
    claims = Claims(Admission.CLAIMED)
    second = intake(claims, HeldNotices(path), submitted)
    assert second.held is not None and len(second.held) == 1
    (back,) = second.held.notices()
    assert back == n  # the notice as received: its id, its deadline
    source = HeldSource(second.held, second.admit, second.in_flight, every_s=0.01)
    task = asyncio.create_task(source.run())
    try:
        for _ in range(200):
            if submitted:
                break
            await asyncio.sleep(0.01)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert submitted == ["n1"] and claims.calls == [("n1", "node-1")]
    assert len(second.held) == 0 and len(HeldNotices(path)) == 0  # admitted: forgotten


async def test_every_admission_for_good_forgets_the_notice(tmp_path: Path) -> None:
    for answer in (Admission.DUPLICATE, Admission.SUPERSEDED, Admission.CLAIMED):
        held = HeldNotices(tmp_path / f"{answer.value}.sqlite")
        n = notice("n1", Target(instance_id="i-1"))
        held.hold(n)
        assert await intake(Claims(answer), held, []).admit(n) is answer
        assert len(held) == 0
    # and a notice for an instance not in this cluster, dropped by policy
    held = HeldNotices(tmp_path / "unknown.sqlite")
    n = notice("n2", Target(instance_id="i-nowhere"))
    held.hold(n)
    assert await intake(Claims(Admission.CLAIMED), held, []).admit(n) is Admission.UNKNOWN_TARGET
    assert len(held) == 0


def test_a_row_that_does_not_parse_is_dropped(tmp_path: Path) -> None:
    path = tmp_path / "held.sqlite"
    held = HeldNotices(path)
    held.hold(notice("n1", Target(instance_id="i-1")))
    held._db.execute("INSERT INTO held VALUES ('bad', '{\"id\": 1}', '0')")
    again = HeldNotices(path)
    assert [n.id for n in again.notices()] == ["n1"]
    assert len(again) == 1


class Hanging(Claims):
    """A claim that waits on a server out of reach, until the process dies."""

    async def claim(self, n: Notice, node: str | None) -> Claimed:
        self.calls.append((n.id, node))
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


async def test_a_notice_is_on_disk_while_its_claim_still_waits(tmp_path: Path) -> None:
    path = tmp_path / "held.sqlite"
    live = intake(Hanging(Admission.CLAIMED), HeldNotices(path), [])
    n = notice("n1", Target(instance_id="i-1"))
    admitting = asyncio.create_task(live.admit(n))
    await asyncio.sleep(0.05)
    assert live.in_flight("n1")
    assert [x.id for x in HeldNotices(path).notices()] == ["n1"]  # what a successor reads
    # the live process's own replay leaves a notice being admitted alone
    assert live.held is not None and live.held.notices(skip=live.in_flight) == []
    admitting.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await admitting
    assert "n1" in live.held  # cancelled (SIGTERM): still the next process's to admit
