"""Every Python snippet of docs/checkpoint-contract.md's trainer section, run as written, in
order and in one namespace, against moto, while reclaimd's own signaller asks: each must ack
durably, and the plain loop run again restores the step it saved."""

from __future__ import annotations

import asyncio
import re
import threading
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset
from trainer_helpers import jobset_gang, spot_notice

from chaos.lightningjob import Module
from chaos.torchjob import batch, build_model
from reclaimd.checkpoint import signal_gang
from reclaimd.model import Member, RankAck, utcnow
from reclaimd.objectstore import make_s3_client
from reclaimd.putbudget import TenantPutBudgets

DOC = Path(__file__).resolve().parents[2] / "docs" / "checkpoint-contract.md"
SECTION = "## Trainer side in a few lines: `reclaimd.trainer`"


def snippets() -> list[str]:
    text = DOC.read_text()
    return re.findall(r"```python\n(.*?)```", text[text.index(SECTION) :], re.S)


class SlowBatches(IterableDataset[tuple[torch.Tensor, torch.Tensor]]):
    def __iter__(self) -> Any:
        for step in range(100_000):
            time.sleep(0.02)
            yield batch(7, step, 0)


class Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = build_model(32, 1, 7)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        time.sleep(0.02)
        out = self.net(x)
        return {"loss": torch.nn.functional.mse_loss(out, labels), "logits": out}


async def ask(url: str) -> RankAck:
    now = utcnow()
    notice = spot_notice("doc", now=now, instance_id="i-0")
    member = Member(
        namespace="team-a",
        name="doc-0",
        uid="u0",
        node="n",
        gpus=1,
        rank=0,
        pod_ip="127.0.0.1",
        checkpoint_url=url,
    )
    gang = jobset_gang("doc", (member,))
    async with aiohttp.ClientSession() as session:
        acks = await signal_gang(
            gang,
            notice,
            budget_deadline=now + timedelta(seconds=30),
            session=session,
            put_budgets=TenantPutBudgets(),
        )
    return acks[0]


async def run_and_ask(code: str, ns: dict[str, Any], ready: str = "signal") -> RankAck:
    """Run ``code`` in a thread; once ``ns[ready]`` serves, ask it; the ack."""
    errors: list[BaseException] = []
    before = ns.get(ready)

    def go() -> None:
        try:
            exec(code, ns)
        except BaseException as e:  # surfaced by the test below
            errors.append(e)

    t = threading.Thread(target=go)
    t.start()
    for _ in range(600):
        if ns.get(ready) is not before or errors:
            break
        await asyncio.sleep(0.05)
    await asyncio.sleep(1.5)  # some steps
    assert not errors, errors
    ack = await ask(ns["signal"].url)
    await asyncio.to_thread(t.join, 240)
    assert not errors, errors
    return ack


@pytest.fixture
def ns(stack: Any, tmp_path: Path) -> dict[str, Any]:
    s3 = make_s3_client(endpoint_url=stack.aws_endpoint)
    bucket = f"doc-{uuid.uuid4().hex[:10]}"
    s3.create_bucket(Bucket=bucket)
    model = build_model(64, 2, 7)
    first_steps: list[int] = []

    def train_step(model: Any, optimizer: Any, step: int) -> None:
        first_steps.append(step)
        x, y = batch(7, step, 0)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        time.sleep(0.02)

    from transformers import TrainingArguments

    g = torch.Generator().manual_seed(0)
    xs = torch.randn(8192, 32, generator=g)
    return {
        "tenant": "team-a",
        "bucket": bucket,
        "stash_dir": str(tmp_path / "stash-0"),
        "port": 0,
        "steps": 200,
        "model": model,
        "optimizer": torch.optim.Adam(model.parameters(), lr=1e-3),
        "train_step": train_step,
        "first_steps": first_steps,
        "module": Module(64, 2, 7),
        "data": DataLoader(SlowBatches(), batch_size=None),
        "hf_model": Tiny(),
        "args": TrainingArguments(
            output_dir=str(tmp_path / "hf"),
            max_steps=200,
            per_device_train_batch_size=16,
            save_strategy="no",
            report_to=[],
            use_cpu=True,
            logging_strategy="no",
            disable_tqdm=True,
        ),
        "dataset": [{"x": x, "labels": x.sum().sin().reshape(1)} for x in xs],
        "_s3": s3,
        "_tmp": tmp_path,
    }


async def test_every_trainer_snippet_runs_and_acks_durably(ns: dict[str, Any]) -> None:
    plain, lightning, hf, asyncio_server = snippets()

    ack = await run_and_ask(plain, ns)
    assert ack.acked and ack.durable and ack.step is not None, ack
    assert ack.uri.endswith(f"/checkpoints/team-a/llama/step-{ack.step:010d}/")
    # the same loop on a new node (a fresh stash): restores the saved step from the bucket
    ns["signal"].stop()
    ns["stash_dir"] = str(ns["_tmp"] / "stash-1")
    ns["first_steps"].clear()
    ns["steps"] = ack.step + 3
    await asyncio.to_thread(exec, plain, ns)
    assert ns["first_steps"][0] == ack.step

    ns["steps"] = 200
    ack = await run_and_ask(lightning, ns, ready="trainer")
    assert ack.acked and ack.durable, ack
    assert ns["reclaimd_cb"].saves[0].step == ack.step

    ack = await run_and_ask(hf, ns, ready="trainer")
    assert ack.acked and ack.durable, ack
    assert ns["reclaimd_cb"].saves[0].step == ack.step

    ns["trainer_loop"] = lambda: asyncio.sleep(6)
    exec(asyncio_server, ns)
    servers: list[Any] = []
    real = ns["CheckpointServer"]

    class Recorded(real):  # type: ignore[misc, valid-type]
        def __init__(self, *a: Any, **kw: Any) -> None:
            super().__init__(*a, **kw)
            servers.append(self)

    ns["CheckpointServer"] = Recorded  # the real server, remembered to learn its URL
    t = threading.Thread(target=exec, args=("import asyncio\nasyncio.run(main())", ns))
    t.start()
    for _ in range(200):
        if servers and servers[0].port != 0:
            break
        await asyncio.sleep(0.05)
    ack = await ask(servers[0].url)
    await asyncio.to_thread(t.join, 60)
    assert ack.acked and ack.durable, ack
    assert servers[0].save_count == 1
