"""``dry_run``: a real Spot notice through SQS to a reclaimd that decides everything and does
nothing. Its identity may only read, so a write would fail loudly; the cluster, the trainers
and the ledger topic show that none was tried, and its log says what it would have done."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from chaos import stack as stackenv
from chaos.harness import Harness


@pytest.fixture
async def h(stack: Any) -> AsyncIterator[Harness]:
    async with Harness(stackenv.load()) as harness:
        yield harness


def log_lines(path: Path) -> list[dict[str, Any]]:
    out = []
    for raw in path.read_text(errors="replace").splitlines():
        try:
            doc = json.loads(raw)
        except ValueError:
            continue
        if isinstance(doc, dict):
            out.append(doc)
    return out


async def wait_for(what: str, check: Any, timeout_s: float = 60) -> None:
    end = asyncio.get_running_loop().time() + timeout_s
    while not check():
        if asyncio.get_running_loop().time() > end:
            raise TimeoutError(f"still waiting for {what} after {timeout_s:.0f} s")
        await asyncio.sleep(0.5)


async def test_dry_run_acks_and_logs_but_touches_nothing(h: Harness) -> None:
    nodes = [h.node_spec(i) for i in range(2)]
    await h.add_nodes(nodes)
    gang = await h.add_gang("dry", [n.name for n in nodes])
    pods = [gang.pod_name(r) for r in range(2)]
    readonly = await h.readonly_kubeconfig()
    d = await h.start_daemon("dry", dry_run=True, kube={"kubeconfig": str(readonly)})

    notice = h.send_spot(nodes[0])

    def mine(msg: str) -> list[dict[str, Any]]:
        return [
            line
            for line in log_lines(d.log_path)
            if line.get("msg") == msg and line.get("notice_id") == notice.id
        ]

    # It would charge the gang once: the last line of the runbook.
    await wait_for("the would-record line", lambda: mine("would record"), timeout_s=90)
    await wait_for("the message to be deleted", lambda: h.queue_depth() == 0)

    [claim] = mine("would claim")
    assert claim["object"] == f"node/{nodes[0].name}"
    assert claim["cordon"] is True
    assert claim["admission"] == "claimed"
    evicted = {line["pod"] for line in mine("would evict")}
    assert evicted == {f"{h.namespace}/{p}" for p in pods}
    signalled = {line["pod"] for line in mine("would signal")}
    assert signalled == {f"{h.namespace}/{p}" for p in pods}
    [record] = mine("would record")
    assert record["event"]["x_NoticeId"] == notice.id
    assert len(mine("would mark done")) == 1

    # Nothing was claimed, cordoned, tainted, asked or evicted.
    assert await h.claim_of(nodes[0].name) is None
    node = await h.core.read_node(nodes[0].name)
    assert not node.spec.unschedulable
    assert not any(t.key == "reclaimd.io/interruption" for t in node.spec.taints or [])
    assert h.trainers.asked(notice.id) == set()
    assert await h.pods_left(pods) == pods
    # ...and nothing recorded: no event on the run's topic, no outbox file.
    assert await h.ledger_events(count=1, timeout_s=5) == []
    assert not (h.workdir / f"{h.holder('dry')}-outbox.sqlite").exists()

    assert await d.stop() == 0
    [stopped] = [line for line in log_lines(d.log_path) if line.get("msg") == "reclaimd stopped"]
    counts = stopped["dry_run"]
    assert counts["claim"] == 1
    assert counts["evict"] == 2
    assert counts["signal"] == 2
    assert counts["record"] == 1
    # Its identity could not have written: no write reached the API server's budget.
    assert stopped["kube_writes"] == {}
