"""The per-node IMDS source (handlers/imds/transport.py) against the stack's EC2 metadata mock
(aemm, IMDSv2 only): every notice path its parser reads is polled and admitted, the instance
identity comes from the mock, repeat polls map to the same notices, and an IMDS that does not
answer is counted and polled again, never fatal."""

from __future__ import annotations

import asyncio
import contextlib

import aiohttp
import pytest
from stack import Stack

from reclaimd.handlers.imds import transport as imds
from reclaimd.handlers.imds.settings import ImdsSettings
from reclaimd.handlers.imds.transport import ImdsSource
from reclaimd.intake import Admission
from reclaimd.model import Notice, Windows

# What the mock serves by default (aemm v1.13): one notice on each path.
SOURCES_BY_PATH = {
    "spot/instance-action": "aws.imds.spot",
    "events/maintenance/scheduled": "aws.imds.scheduled",
    "autoscaling/target-lifecycle-state": "aws.imds.asg",
    "events/recommendations/rebalance": "aws.imds.rebalance",
}


class Recorded:
    def __init__(self) -> None:
        self.seen: list[Notice] = []

    async def admit(self, notice: Notice) -> Admission:
        self.seen.append(notice)
        return Admission.DUPLICATE if len(self.seen) > len(SOURCES_BY_PATH) else Admission.CLAIMED


async def _mock_identity(url: str) -> str:
    async with aiohttp.ClientSession() as s:
        async with s.put(
            f"{url}/latest/api/token", headers={"X-aws-ec2-metadata-token-ttl-seconds": "60"}
        ) as r:
            token = await r.text()
        async with s.get(
            f"{url}/latest/meta-data/instance-id", headers={"X-aws-ec2-metadata-token": token}
        ) as r:
            return (await r.text()).strip()


async def test_every_path_the_parser_reads_is_polled_and_admitted(stack: Stack) -> None:
    assert set(SOURCES_BY_PATH) == set(imds.PATHS)
    intake = Recorded()
    src = ImdsSource(
        ImdsSettings(enabled=True, url=stack.imds_url),
        admit=intake.admit,
        windows=Windows(),
        node_name="node-imds-e2e",
    )
    async with aiohttp.ClientSession() as session:
        found = await src.poll_once(session)
        again = await src.poll_once(session)
    assert found == again == len(SOURCES_BY_PATH)
    first, second = intake.seen[:4], intake.seen[4:]
    assert sorted(n.source for n in first) == sorted(SOURCES_BY_PATH.values())
    instance = await _mock_identity(stack.imds_url)
    assert {n.target.instance_id for n in first} == {instance}
    assert {n.target.node_name for n in first} == {"node-imds-e2e"}
    # The same bodies polled again are the same notices (the intake absorbs them); the mock's
    # Spot answer carries the request's time plus two minutes, so a poll in the next second
    # is a new notice there, and only there.
    spot = "aws.imds.spot"
    moved = [a.id != b.id for a, b in zip(first, second, strict=True) if a.source == spot]
    assert [n.id for n in second if n.source != spot] == [n.id for n in first if n.source != spot]
    c = src.counters
    assert (c.received, c.notices, c.parse_errors, c.transport_errors) == (8, 8, 0, 0)
    assert c.by_admission == {"claimed": 4 + sum(moved), "duplicate": 4 - sum(moved)}


async def test_the_poll_loop_keeps_polling(stack: Stack) -> None:
    intake = Recorded()
    src = ImdsSource(
        ImdsSettings(enabled=True, url=stack.imds_url, poll_interval_s=0.05),
        admit=intake.admit,
        windows=Windows(),
    )
    task = asyncio.create_task(src.run())
    try:
        async with asyncio.timeout(30):
            while src.counters.received < 3 * len(SOURCES_BY_PATH):  # noqa: ASYNC110
                await asyncio.sleep(0.05)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    ids: dict[str, set[str]] = {}
    for n in intake.seen:
        ids.setdefault(n.source, set()).add(n.id)
    assert set(ids) == set(SOURCES_BY_PATH.values())  # every path, polled again and again
    # The same answer is the same notice. The mock stamps its Spot instance-action with the
    # time of each request plus two minutes (EC2 keeps one time), so that one may differ by
    # the second the poll landed in; the others' answers do not change.
    assert all(len(v) == 1 for source, v in ids.items() if source != "aws.imds.spot")
    assert src.counters.transport_errors == 0


async def test_an_imds_that_does_not_answer_is_retried_not_fatal(
    unused_tcp_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(imds, "MAX_BACKOFF_S", 0.05)
    src = ImdsSource(
        ImdsSettings(enabled=True, url=f"http://127.0.0.1:{unused_tcp_port}", poll_interval_s=0.01),
        admit=Recorded().admit,
        windows=Windows(),
    )
    task = asyncio.create_task(src.run())
    try:
        async with asyncio.timeout(30):
            while src.counters.transport_errors < 3:  # noqa: ASYNC110 - a counter, no event
                await asyncio.sleep(0.02)
        assert not task.done()
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert src.counters.received == 0
