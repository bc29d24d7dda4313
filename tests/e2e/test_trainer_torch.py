"""Real torch.distributed trainers (gloo on CPU, one process per rank, chaos/torchjob.py) speak
the checkpoint contract through the trainer SDK and save through DCP to S3 (moto).

1. reclaimd's own signaller (``signal_gang``, with the tenant's PutObject shares) asks the
   ranks at different moments; they agree on one step, save, ack durable; the gang is killed
   (the node went away), started again on fresh stashes, restores from S3 and continues.
2. The same through the whole controller: a Spot warning through SQS, a real ``reclaimd run``
   asks the ranks announced at their loopback endpoints as pods of the drill's cluster, drains
   them (the ranks are killed when their pods are gone), charges the gang; the ledger's lost
   GPU-seconds are compared with the job's own step log; a plain loop and Lightning alike.

Judged by the job's step log (``rank-<R>.jsonl``), the objects in S3 and the ledger.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import statistics
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from trainer_helpers import jobset_gang, spot_notice

from chaos import fleet
from chaos import stack as stackenv
from chaos.harness import Harness
from chaos.torchjob import TorchGang, read_log
from reclaimd import restarts
from reclaimd.checkpoint import signal_gang
from reclaimd.model import Member, parse_time, utcnow
from reclaimd.putbudget import TenantPutBudgets
from reclaimd_trainer.s3 import make_s3_client

STEP_SLEEP_S = 0.05  # a step of ~60 ms: lost work is measurable in steps


@pytest.fixture
def s3(stack: Any) -> Any:
    return make_s3_client(endpoint_url=stack.aws_endpoint)


@pytest.fixture
def bucket(s3: Any) -> str:
    name = f"ckpt-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=name)
    return name


@pytest.fixture
def gangs() -> Iterator[list[TorchGang]]:
    started: list[TorchGang] = []
    yield started
    for g in started:
        g.kill()


def job(
    workdir: Path, world: int, bucket: str, stack: Any, incarnation: int, **kw: Any
) -> TorchGang:
    return TorchGang(
        workdir,
        world,
        incarnation=incarnation,
        bucket=bucket,
        endpoint=stack.aws_endpoint,
        tenant="team-a",
        run="gloo-job",
        stash=str(workdir / f"stash-{incarnation}"),
        step_sleep=STEP_SLEEP_S,
        **kw,
    )


def events(workdir: Path, rank: int, kind: str, incarnation: int | None = None) -> list[Any]:
    out, inc = [], None
    for e in read_log(workdir, rank):
        if e["event"] == "start":
            inc = e["incarnation"]
        if e["event"] == kind and (incarnation is None or inc == incarnation):
            out.append(e)
    return out


def step_time(workdir: Path, rank: int, incarnation: int = 0) -> float:
    ts = [e["t"] for e in events(workdir, rank, "step", incarnation)]
    return statistics.median(b - a for a, b in itertools.pairwise(ts))


def judge_restart(workdir: Path, world: int, s3: Any, bucket: str) -> int:
    """The saved step is one for all ranks, COMMITTED in S3, and what incarnation 1 restored
    bit for bit; incarnation 1 continues from the step after it. Returns the saved step."""
    saved = [events(workdir, r, "saved", 0) for r in range(world)]
    assert all(len(s) == 1 for s in saved), saved
    step = saved[0][0]["step"]
    assert {s[0]["step"] for s in saved} == {step}  # every rank saved the same step
    assert all(s[0]["durable"] for s in saved), saved
    # the state was taken at that step: no step after it is in the checkpoint
    for r in range(world):
        taken = parse_time(saved[r][0]["checkpoint_time"]).timestamp()
        steps = {e["step"]: e["t"] for e in events(workdir, r, "step", 0)}
        assert steps[step] <= taken, (r, step)
        assert step + 1 not in steps or steps[step + 1] > taken, (r, step)
    manifest = json.loads(
        s3.get_object(Bucket=bucket, Key=f"checkpoints/team-a/gloo-job/step-{step:010d}/COMMITTED")[
            "Body"
        ].read()
    )
    assert (manifest["step"], manifest["world_size"]) == (step, world)
    for r in range(world):
        start = events(workdir, r, "start", 1)
        assert len(start) == 1 and start[0]["restored"] == step, start
        # parameters and optimizer state restored bit for bit (SHA-256 of the tensors' bytes)
        assert start[0]["digest"] == saved[r][0]["digest"]
        assert events(workdir, r, "step", 1)[0]["step"] == step + 1
    # the ranks of the new incarnation stay in step with each other (DDP)
    finals = {events(workdir, r, "final", 1)[-1]["digest"] for r in range(world)}
    assert len(finals) == 1
    return int(step)


def member(i: int, url: str) -> Member:
    return Member(
        namespace="team-a",
        name=f"gloo-job-{i}",
        uid=f"uid-gloo-{i}",
        node=f"node-{i}",
        gpus=8,
        rank=i,
        pod_ip="127.0.0.1",
        checkpoint_url=url,
    )


async def test_real_gloo_ranks_save_on_reclaimds_ask_restore_and_continue(
    tmp_path: Path, s3: Any, bucket: str, stack: Any, gangs: list[TorchGang]
) -> None:
    world = 3
    first = job(tmp_path, world, bucket, stack, 0)
    gangs.append(first)
    urls = await asyncio.to_thread(first.start)
    await asyncio.sleep(1.0)  # some steps
    now = utcnow()
    notice = spot_notice("torch", now=now, node_name="node-0")
    gang = jobset_gang("gloo-job", (member(i, u) for i, u in enumerate(urls)))
    budgets = TenantPutBudgets(qps_per_tenant=4.0)
    async with aiohttp.ClientSession() as session:
        acks = await signal_gang(
            gang,
            notice,
            budget_deadline=now + timedelta(seconds=30),
            session=session,
            put_budgets=budgets,
        )
    assert all(a.acked and a.durable for a in acks), acks
    assert len({a.step for a in acks}) == 1
    step = acks[0].step
    assert step is not None
    assert all(
        a.uri == f"s3://{bucket}/checkpoints/team-a/gloo-job/step-{step:010d}/" for a in acks
    )
    assert budgets.outstanding("team-a") == (0, 0)  # every share went back
    # each rank uploaded at a share reclaimd handed it (never above the tenant's 4/s)
    shares = [events(tmp_path, r, "saved", 0)[0]["shares"] for r in range(world)]
    assert all(s and s[0] is not None and s[0]["qps"] <= 4.0 for s in shares), shares
    first.kill()

    second = job(tmp_path, world, bucket, stack, 1, steps=step + 15)
    gangs.append(second)
    await asyncio.to_thread(second.start)
    assert await asyncio.to_thread(second.wait) == [0] * world, second.stderr()
    assert judge_restart(tmp_path, world, s3, bucket) == step


async def come_back(
    h: Harness, gang: TorchGang, nodes: list[str], gpus: int, start_s: float
) -> dict[str, Any]:
    """Start the job's next incarnation as pods of the same gang on ``nodes``; its restart
    overhead event, once reclaimd wrote it."""
    urls = await asyncio.to_thread(gang.start, start_s)
    back = fleet.GangSpec(
        name="gloo",
        ranks=[fleet.RankSpec(n, u) for n, u in zip(nodes, urls, strict=True)],
        gpus_per_rank=gpus,
        incarnation=1,
    )
    await fleet.wait_running(h.api, h.namespace, await fleet.create_gang(h.api, back, h.namespace))
    (overhead,) = await h.ledger_events(count=1, timeout_s=60, settle_s=1.0, schema=restarts.SCHEMA)
    return overhead


# The loops, with their start allowance (Lightning's imports and DDP set-up take longer).
START_S = {"chaos.torchjob": 120.0, "chaos.lightningjob": 240.0}


async def kubelet(h: Harness, names: list[str], gang: TorchGang) -> tuple[datetime, datetime]:
    """The kubelet's part: a rank whose pod is gone is gone (SIGKILL, nothing more saved);
    JobSet restarts the whole gang, so the first pod gone stops every rank. reclaimd evicts
    every rank and charges the gang until its last pod stops: a rank killed with the first
    pod holds its GPUs through its own pod until then. When the ranks were killed, and when
    the last pod was seen gone (each at most a poll, 0.1 s, after the fact)."""
    killed_at: datetime | None = None
    for _ in range(1500):
        left = len(await h.pods_left(names))
        if killed_at is None and left < len(names):
            gang.kill()
            killed_at = utcnow()
        if killed_at is not None and not left:
            return killed_at, utcnow()
        await asyncio.sleep(0.1)
    raise AssertionError(f"reclaimd never drained the gang (ranks killed at {killed_at})")


@pytest.mark.parametrize("module", list(START_S), ids=["torch", "lightning"])
async def test_spot_notice_through_sqs_drains_a_real_torch_gang_that_restores(
    tmp_path: Path, s3: Any, bucket: str, stack: Any, gangs: list[TorchGang], *, module: str
) -> None:
    """A plain torch loop (Checkpointer) or a Lightning ``Trainer`` (ReclaimdCallback)."""
    world, gpus, start_s = 2, 8, START_S[module]
    async with Harness(stackenv.load()) as h:
        first = job(tmp_path, world, bucket, stack, 0, module=module)
        gangs.append(first)
        urls = await asyncio.to_thread(first.start, start_s)
        nodes = [h.node_spec(i) for i in range(2 * world)]  # the second half for the restart
        await h.add_nodes(nodes)
        spec = fleet.GangSpec(
            name="gloo",
            ranks=[
                fleet.RankSpec(n.name, url, last_checkpoint=fleet.ago(600))
                for n, url in zip(nodes[:world], urls, strict=True)
            ],
            gpus_per_rank=gpus,
        )
        names = await fleet.create_gang(h.api, spec, h.namespace)
        await fleet.wait_running(h.api, h.namespace, names)
        await h.start_daemon(restarts={"interval_s": 0.5})
        notice = h.send_spot(nodes[0])

        killed_at, gone_at = await kubelet(h, names, first)
        ledger = await h.ledger_events(count=1, timeout_s=90, settle_s=1.0)
        assert len(ledger) == 1, ledger
        event = ledger[0]
        assert event["x_NoticeId"] == notice.id
        assert event["x_CheckpointOutcome"] == "checkpointed"
        assert event["x_DeadlineMet"] is True

        # The job comes back on the other nodes (its controller's part), restores and trains
        # on: reclaimd charges the restart to its ranks' first step after the restore, which
        # the SDK reports at <checkpoint url>/incarnation.
        saved_step = events(tmp_path, 0, "saved", 0)[0]["step"]
        second = job(tmp_path, world, bucket, stack, 1, module=module, steps=saved_step + 300)
        gangs.append(second)
        overhead = await come_back(h, second, [n.name for n in nodes[world:]], gpus, start_s)
    assert await asyncio.to_thread(second.wait, start_s) == [0] * world, second.stderr()
    step = judge_restart(tmp_path, world, s3, bucket)
    assert overhead["x_RestartOverheadSource"] == restarts.SDK_FIRST_STEP
    assert overhead["x_WasteEventId"] == event["EventId"]
    # the last rank's first step after its restore, as the job's own log has it (the SDK
    # marks it at the poll that follows the step: milliseconds later)
    first_steps = [events(tmp_path, r, "step", 1)[0]["t"] for r in range(world)]
    restarted = parse_time(overhead["x_RestartedAt"]).timestamp()
    print(f"restart overhead {overhead['x_RestartOverheadSeconds']} s, to the first step")
    assert 0 <= restarted - max(first_steps) < 0.5

    # The ledger's lost GPU-seconds against the job's own log. A rank's GPUs were lost from the
    # state it saved until the gang's last pod stopped: the steps it ran after the saved one
    # (at its measured step time), the save itself (stash, upload, commit: no training ran),
    # then its pod held until the last one stopped. Tolerance per rank: the step in flight at
    # the kill is not in the log (one step time), and our polls see the first pod gone and the
    # last pod gone up to 0.1 s late, plus 50 ms.
    true_lost = tolerance = upper = 0.0
    held_s = (gone_at - killed_at).total_seconds()
    for r in range(world):
        saved = events(tmp_path, r, "saved", 0)[0]
        after = [e for e in events(tmp_path, r, "step", 0) if e["step"] > step]
        dt = step_time(tmp_path, r)
        save_s = saved["stash_s"] + saved["upload_s"] + saved["commit_s"]
        true_lost += gpus * (len(after) * dt + save_s + held_s)
        tolerance += gpus * (dt + 0.15)
        upper += gpus * (gone_at - parse_time(saved["checkpoint_time"])).total_seconds()
    print(
        f"ledger {event['x_WastedGpuSeconds']:.3f} GPU-s, job's log {true_lost:.3f} GPU-s "
        f"(tolerance {tolerance:.3f}, pods held {held_s:.3f} s after the kill), checkpoint "
        f"to the last pod gone {upper:.3f}, saved step {step}"
    )
    assert event["x_WastedGpuSeconds"] == pytest.approx(true_lost, abs=tolerance)
    assert event["x_WastedGpuSeconds"] <= upper  # never charged past the gang's stop


async def test_lightning_ranks_save_with_the_callback_and_resume_from_it(
    tmp_path: Path, s3: Any, bucket: str, stack: Any, gangs: list[TorchGang]
) -> None:
    """The same with a Lightning ``Trainer`` (DDP on gloo) and ``ReclaimdCallback``: one
    Lightning checkpoint at the agreed step, uploaded and COMMITTED; ``fit(ckpt_path=
    callback.resume_path())`` resumes the global step and the state bit for bit."""
    world = 2
    first = job(tmp_path, world, bucket, stack, 0, module="chaos.lightningjob")
    gangs.append(first)
    urls = await asyncio.to_thread(first.start, 240)
    await asyncio.sleep(1.0)
    now = utcnow()
    notice = spot_notice("lightning", now=now)
    gang = jobset_gang("gloo-job", (member(i, u) for i, u in enumerate(urls)))
    async with aiohttp.ClientSession() as session:
        acks = await signal_gang(
            gang,
            notice,
            budget_deadline=now + timedelta(seconds=30),
            session=session,
            put_budgets=TenantPutBudgets(),
        )
    assert all(a.acked and a.durable for a in acks), acks
    step = acks[0].step
    assert step is not None and {a.step for a in acks} == {step}
    first.kill()
    keys = {
        o["Key"].rsplit("/", 1)[-1]
        for o in s3.list_objects_v2(
            Bucket=bucket, Prefix=f"checkpoints/team-a/gloo-job/step-{step:010d}/"
        )["Contents"]
    }
    assert keys == {"lightning.ckpt", "COMMITTED"}  # once, by rank 0: never saved twice

    second = job(tmp_path, world, bucket, stack, 1, module="chaos.lightningjob", steps=step + 15)
    gangs.append(second)
    await asyncio.to_thread(second.start, 240)
    assert await asyncio.to_thread(second.wait, 240) == [0] * world, second.stderr()
    assert judge_restart(tmp_path, world, s3, bucket) == step


def model_digest(model: Any) -> str:
    import hashlib

    h = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        h.update(name.encode() + p.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


async def test_hf_trainer_saves_with_the_callback_and_resumes_from_it(  # noqa: PLR0915
    tmp_path: Path, s3: Any, bucket: str, stack: Any
) -> None:
    """A Hugging Face ``Trainer`` (one process, CPU) with ``ReclaimdTrainerCallback``: asked by
    reclaimd's signaller, it writes its own checkpoint-<step> once, uploads and commits it;
    a new Trainer resumes from ``resume_path`` at that step with the same parameters."""
    import time as _time

    import torch
    from torch.nn import functional
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from chaos.torchjob import build_model
    from reclaimd_trainer import Signal
    from reclaimd_trainer.hf import ReclaimdTrainerCallback
    from reclaimd_trainer.s3 import GuardedPut
    from reclaimd_trainer.torch import S3Reader

    class Tiny(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = build_model(32, 1, 7)

        def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
            out = self.net(x)
            return {"loss": functional.mse_loss(out, labels), "logits": out}

    g = torch.Generator().manual_seed(0)
    xs = torch.randn(4096, 32, generator=g)
    data = [{"x": x, "labels": x.sum().sin().reshape(1)} for x in xs]

    class Slow(TrainerCallback):  # type: ignore[misc]
        def on_step_end(self, *a: Any, **kw: Any) -> None:
            _time.sleep(0.03)

    def run(output_dir: Path, max_steps: int, signal: Signal) -> tuple[Any, Any, Any]:
        s3c: Any = make_s3_client(endpoint_url=stack.aws_endpoint)
        cb = ReclaimdTrainerCallback(
            signal,
            run="hf-job",
            store=GuardedPut(s3c).bind("team-a", bucket),
            reader=S3Reader(s3c, bucket),
            prefix="checkpoints/team-a/hf-job/",
            stop_after_save=True,
        )
        args = TrainingArguments(
            output_dir=str(output_dir),
            max_steps=max_steps,
            per_device_train_batch_size=16,
            save_strategy="no",
            report_to=[],
            use_cpu=True,
            logging_strategy="no",
            disable_tqdm=True,
            dataloader_num_workers=0,
        )
        model = Tiny()
        trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[Slow(), cb])
        resume = cb.resume_path(output_dir)
        trainer.train(resume_from_checkpoint=resume)
        return trainer, cb, model

    with Signal(host="127.0.0.1", port=0) as signal:
        job1 = asyncio.create_task(asyncio.to_thread(run, tmp_path / "out-0", 10_000, signal))
        await asyncio.sleep(3.0)
        now = utcnow()
        notice = spot_notice("hf", now=now, instance_id="i-0")
        gang = jobset_gang("hf-job", (member(0, signal.url),))
        async with aiohttp.ClientSession() as session:
            acks = await signal_gang(
                gang,
                notice,
                budget_deadline=now + timedelta(seconds=30),
                session=session,
                put_budgets=TenantPutBudgets(),
            )
        trainer1, cb1, model1 = await job1
    assert acks[0].acked and acks[0].durable, acks
    step = acks[0].step
    assert step is not None and step == trainer1.state.global_step  # stopped after the save
    assert len(cb1.saves) == 1
    keys = {
        o["Key"].rsplit("/", 1)[-1]
        for o in s3.list_objects_v2(
            Bucket=bucket, Prefix=f"checkpoints/team-a/hf-job/step-{step:010d}/"
        )["Contents"]
    }
    assert {"COMMITTED", "trainer_state.json", "optimizer.pt", "model.safetensors"} <= keys
    saved = model_digest(model1)

    with Signal(host="127.0.0.1", port=0) as signal:
        loaded: list[str] = []

        class Peek(TrainerCallback):  # type: ignore[misc]
            def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
                loaded.append(model_digest(kw["model"]))
                loaded.append(str(state.global_step))

        s3c: Any = make_s3_client(endpoint_url=stack.aws_endpoint)
        cb2 = ReclaimdTrainerCallback(
            signal, run="hf-job", reader=S3Reader(s3c, bucket), prefix="checkpoints/team-a/hf-job/"
        )
        out = tmp_path / "out-1"
        path = cb2.resume_path(out)
        assert path == str(out / f"checkpoint-{step}")
        args = TrainingArguments(
            output_dir=str(out),
            max_steps=step + 5,
            per_device_train_batch_size=16,
            save_strategy="no",
            report_to=[],
            use_cpu=True,
            logging_strategy="no",
            disable_tqdm=True,
        )
        t2 = Trainer(model=Tiny(), args=args, train_dataset=data, callbacks=[Peek(), cb2])
        await asyncio.to_thread(t2.train, resume_from_checkpoint=path)
    assert loaded == [saved, str(step)]  # the saved parameters, bit for bit, at the saved step
    assert t2.state.global_step == step + 5


async def test_ranks_asked_seconds_apart_save_one_step_and_the_late_one_answers_at_once(
    tmp_path: Path, s3: Any, bucket: str, stack: Any, gangs: list[TorchGang]
) -> None:
    """Only rank 0 is asked; the gang agrees and saves anyway (DCP is collective). Rank 1's own
    request, 2 s later, is answered at once with that save: no second save, same step."""
    import time
    import urllib.request

    from reclaimd.model import rfc3339

    world = 2
    first = job(tmp_path, world, bucket, stack, 0)
    gangs.append(first)
    urls = await asyncio.to_thread(first.start)
    await asyncio.sleep(1.0)
    body = {"notice_id": "ec2-apart", "deadline": rfc3339(utcnow() + timedelta(seconds=30))}

    def post(url: str) -> tuple[float, dict[str, Any]]:
        req = urllib.request.Request(
            url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        start = utcnow()
        with urllib.request.urlopen(req, timeout=30) as r:
            doc = json.loads(r.read())
        took = (utcnow() - start).total_seconds()
        for _ in range(60):  # a save longer than the 1 s window: poll its status URL
            if "status_url" not in doc:
                break
            time.sleep(0.5)
            with urllib.request.urlopen(url.rsplit("/", 1)[0] + doc["status_url"]) as r:
                doc = json.loads(r.read())
        return took, doc

    _, doc0 = await asyncio.to_thread(post, urls[0])
    await asyncio.sleep(2.0)
    took, doc1 = await asyncio.to_thread(post, urls[1])
    same = ("step", "uri", "durable")
    assert doc0["durable"] and [doc1[k] for k in same] == [doc0[k] for k in same]
    assert took < 0.5  # answered from the save already made, not held for a new one
    for r in range(world):
        assert [e["step"] for e in events(tmp_path, r, "saved", 0)] == [doc0["step"]]


async def test_routine_async_saves_train_on_and_a_gang_lost_without_notice_restores_one(
    tmp_path: Path, s3: Any, bucket: str, stack: Any, gangs: list[TorchGang]
) -> None:
    """``Checkpointer(every=N)``: routine saves through DCP's ``async_save`` while the loop
    trains on; the gang dies without any notice (SIGKILL), the next incarnation restores the
    newest COMMITTED routine step bit for bit; then asked, it saves once, after the routine
    save in flight."""
    from reclaimd_trainer.torch import S3Reader, durable_steps

    world, every = 2, 10
    # ~4 M parameters (~50 MB with Adam's state): a save takes several steps to finish
    big = {"hidden": 1024, "layers": 4, "every": every}
    first = job(tmp_path, world, bucket, stack, 0, **big)
    gangs.append(first)
    await asyncio.to_thread(first.start)
    reader, prefix = S3Reader(s3, bucket), "checkpoints/team-a/gloo-job/"
    for _ in range(600):
        if len(durable_steps(reader, prefix)) >= 3:
            break
        await asyncio.sleep(0.1)
    first.kill()  # the node is gone: no notice, no ask, nothing more saved
    committed = durable_steps(reader, prefix)
    assert len(committed) >= 3 and all(c % every == 0 for c in committed), committed
    for r in range(world):
        assert events(tmp_path, r, "saved", 0) == []  # nothing was asked
        done = events(tmp_path, r, "routine", 0)
        assert done, first.stderr()
        # the loop trained on behind every save: it held the loop only for the copy
        assert all(d["at_step"] > d["step"] for d in done), done
        assert all(d["stall_s"] < d["stash_s"] + d["upload_s"] + d["commit_s"] for d in done)
        print(
            f"rank {r}: {len(done)} routine saves, loop held {max(d['stall_s'] for d in done):.3f}"
            f" s at most, durable after {max(d['at_step'] - d['step'] for d in done)} steps"
        )

    second = job(tmp_path, world, bucket, stack, 1, **big)
    gangs.append(second)
    urls = await asyncio.to_thread(second.start)
    newest = max(committed)  # settled: no rank of incarnation 0 is left to write
    states = [{e["step"]: e["digest"] for e in events(tmp_path, r, "state", 0)} for r in range(2)]
    for r in range(world):
        (start,) = events(tmp_path, r, "start", 1)
        assert start["restored"] == newest
        assert start["digest"] == states[r][newest]  # the state at that step, bit for bit
    await asyncio.sleep(1.0)
    now = utcnow()
    gang = jobset_gang("gloo-job", (member(i, u) for i, u in enumerate(urls)))
    async with aiohttp.ClientSession() as session:
        acks = await signal_gang(
            gang,
            spot_notice("routine", now=now),
            budget_deadline=now + timedelta(seconds=60),
            session=session,
            put_budgets=TenantPutBudgets(),
        )
    assert all(a.acked and a.durable for a in acks), acks
    (asked,) = {a.step for a in acks}
    for r in range(world):
        assert [e["step"] for e in events(tmp_path, r, "saved", 1)] == [asked]
        assert asked not in [e["step"] for e in events(tmp_path, r, "routine", 1)]
    second.kill()


def test_restore_skips_a_newer_step_without_committed_and_an_incomplete_stash(
    tmp_path: Path, s3: Any, bucket: str
) -> None:
    """One process (no process group): step 5 is saved and COMMITTED; step 9's shards are in
    the bucket without COMMITTED (the gang died mid-upload) and its stash lost a shard file.
    restore() takes step 5, bit for bit."""
    import torch

    from chaos.torchjob import build_model, digest
    from reclaimd_trainer import Signal
    from reclaimd_trainer.s3 import GuardedPut
    from reclaimd_trainer.torch import Checkpointer, Decision, S3Reader, TrainState

    model = build_model(16, 1, 3)
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(2, 32)).sum().backward()
    opt.step()
    prefix = "checkpoints/team-a/solo/"
    with Signal(host="127.0.0.1", port=0) as signal:
        ckpt = Checkpointer(
            signal,
            run="solo",
            stash_dir=tmp_path / "stash",
            prefix=prefix,
            store=GuardedPut(s3).bind("team-a", bucket),
            reader=S3Reader(s3, bucket),
        )
        deadline = utcnow() + timedelta(seconds=30)
        saved = digest(model, opt)
        r5 = ckpt.save(Decision(5, (), deadline), TrainState(model, opt))
        assert r5.result.durable
        opt.step()
        r9 = ckpt.save(Decision(9, (), deadline), TrainState(model, opt))
        assert r9.result.durable
    s3.delete_object(Bucket=bucket, Key=f"{prefix}step-0000000009/COMMITTED")
    next((tmp_path / "stash" / "solo" / "step-0000000009").glob("__0_*.distcp")).unlink()
    assert ckpt.durable_steps() == [5] and ckpt.stashed_steps() == [5]

    fresh = build_model(16, 1, 3)
    fresh_opt = torch.optim.Adam(fresh.parameters())
    with Signal(host="127.0.0.1", port=0) as signal:
        again = Checkpointer(
            signal,
            run="solo",
            stash_dir=tmp_path / "other-node",
            prefix=prefix,
            reader=S3Reader(s3, bucket),
        )
        assert again.restore(fresh, fresh_opt) == 5
    assert digest(fresh, fresh_opt) == saved
