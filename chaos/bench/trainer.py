"""The trainer side, measured: a real gloo job (chaos/torchjob.py) asked by reclaimd's own
signaller, saving through DCP and the guarded PutObject to a moto of its own.

For each model size: the time to stash (``dcp.save`` to the stash directory), to upload each
rank's shards and commit, the ack latency reclaimd saw (``RankAck.latency_s``), the bytes per
second of the stash and of the upload against the physical limits measured in the same run
(the stash disk's write rate with fsync, ``/dev/shm``'s, and one plain PutObject to the same
moto), and the restart overhead: a fresh incarnation from process start to its first step
after ``restore()`` from S3 (restore alone, too). That incarnation then makes routine saves
(``Checkpointer(every=1)``, DCP's ``async_save``): how long they hold the loop (the copy to
CPU memory) against the whole save, which an asked (blocking) save holds it for.

``python -m chaos.bench.trainer [--sizes 1,8,32,128] [--world 2]``: sizes in millions of
parameters (each is 12 bytes of state with Adam's two moments). out/bench-trainer.json.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import aiohttp

from chaos.ports import free_port as _free_port
from chaos.torchjob import TorchGang, read_log
from reclaimd.checkpoint import signal_gang
from reclaimd.model import Gang, GangKey, Member, Notice, NoticeKind, Target, utcnow
from reclaimd.putbudget import TenantPutBudgets
from reclaimd_trainer.s3 import make_s3_client

LAYERS = 4


def start_moto() -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    exe = Path(sys.executable).with_name("moto_server")
    proc = subprocess.Popen(
        [str(exe), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return proc, url
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("moto did not start")


def disk_rate(directory: Path, size: int) -> float:
    """Bytes/s of one write of ``size`` bytes with fsync, as DCP's FileSystemWriter does."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"rate-{uuid.uuid4().hex}"
    data = os.urandom(1 << 20) * (size >> 20)
    t = time.perf_counter()
    with path.open("wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    rate = len(data) / (time.perf_counter() - t)
    path.unlink()
    return rate


def moto_rate(s3: Any, bucket: str, size: int) -> float:
    """Bytes/s of one plain PutObject of ``size`` bytes (no guard): the object store's limit."""
    data = os.urandom(1 << 20) * (size >> 20)
    t = time.perf_counter()
    s3.put_object(Bucket=bucket, Key="checkpoints/bench/rate", Body=data)
    rate = len(data) / (time.perf_counter() - t)
    s3.delete_object(Bucket=bucket, Key="checkpoints/bench/rate")
    return rate


def hidden_for(mparams: float) -> int:
    return max(8, int(math.sqrt(mparams * 1e6 / LAYERS)))


async def ask(urls: list[str], deadline_s: float) -> list[Any]:
    now = utcnow()
    notice = Notice(
        id=f"ec2-bench-{uuid.uuid4().hex[:8]}",
        source="ec2",
        kind=NoticeKind.SPOT_INTERRUPTION,
        target=Target(instance_id="i-bench", node_name="node-0"),
        issued_at=now,
        deadline=now + timedelta(seconds=deadline_s + 30),
        received_at=now,
    )
    gang = Gang(
        key=GangKey("jobset", "bench", "gloo-job"),
        members=tuple(
            Member(
                namespace="bench",
                name=f"r{i}",
                uid=f"u{i}",
                node=f"node-{i}",
                gpus=1,
                rank=i,
                pod_ip="127.0.0.1",
                checkpoint_url=u,
            )
            for i, u in enumerate(urls)
        ),
    )
    async with aiohttp.ClientSession() as session:
        return list(
            await signal_gang(
                gang,
                notice,
                budget_deadline=now + timedelta(seconds=deadline_s),
                session=session,
                put_budgets=TenantPutBudgets(),
            )
        )


def one_size(
    mparams: float, world: int, *, endpoint: str, bucket: str, root: Path, deadline_s: float
) -> dict[str, Any]:
    workdir = root / f"m{mparams:g}"
    common: dict[str, Any] = {
        "bucket": bucket,
        "endpoint": endpoint,
        "tenant": "bench",
        "run": f"m{mparams:g}",
        "hidden": hidden_for(mparams),
        "layers": LAYERS,
    }
    first = TorchGang(workdir, world, incarnation=0, stash=str(workdir / "stash-0"), **common)
    try:
        urls = first.start(timeout_s=600)
        time.sleep(1.0)
        acks = asyncio.run(ask(urls, deadline_s))
    finally:
        first.kill()
    saved = [[e for e in read_log(workdir, r) if e["event"] == "saved"] for r in range(world)]
    if not all(saved) or not all(a.acked for a in acks):
        return {"mparams": mparams, "error": [a.error for a in acks] or first.stderr()}
    step = saved[0][0]["step"]
    step_ts = [e["t"] for e in read_log(workdir, 0) if e["event"] in ("start", "step")]
    step_s = max((b - a for a, b in itertools.pairwise(step_ts)), default=0.0)
    t0 = time.time()
    # three steps with a routine save due at each: the first starts one, the others find it
    # in flight (skipped) or start the next; closing waits for the last to commit
    second = TorchGang(
        workdir,
        world,
        incarnation=1,
        stash=str(workdir / "stash-1"),
        steps=step + 3,
        every=1,
        **common,
    )
    try:
        second.start(timeout_s=600)
        second.wait(timeout_s=600)
    finally:
        second.kill()
    logs = [read_log(workdir, r) for r in range(world)]
    starts = [[e for e in log if e["event"] == "start"][-1] for log in logs]
    # the logs go on across incarnations: the new one's first step follows its start
    last = [log[max(i for i, e in enumerate(log) if e["event"] == "start") :] for log in logs]
    first_steps = [next(e for e in log if e["event"] == "step") for log in last]
    routine = [e for log in logs for e in log if e["event"] == "routine"]
    s = [x[0] for x in saved]
    stash_bytes = sum(x["stash_bytes"] for x in s)
    stash_s = max(x["stash_s"] for x in s)
    upload_s = max(x["upload_s"] for x in s)
    shutil.rmtree(workdir, ignore_errors=True)
    return {
        "mparams": mparams,
        "params": starts[0]["params"],
        "world": world,
        "checkpoint_bytes": stash_bytes,
        "step": step,
        "durable": all(a.durable for a in acks),
        "stash_s": round(stash_s, 3),
        "upload_s": round(upload_s, 3),
        "commit_s": round(max(x["commit_s"] for x in s), 3),
        "ack_latency_s": [round(a.latency_s, 3) for a in acks],
        # the longest step (or start to first step) before the save: a request waits for the
        # step boundary, so the ack latency is about a step plus the save
        "step_s_max": round(step_s, 3),
        "stash_bytes_per_s": round(stash_bytes / stash_s) if stash_s else None,
        "upload_bytes_per_s": round(stash_bytes / upload_s) if upload_s else None,
        "restore_s": round(max(x["restore_s"] or 0.0 for x in starts), 3),
        "restart_to_first_step_s": round(max(e["t"] for e in first_steps) - t0, 3),
        "restored_equal": all(
            st["digest"] == sv["digest"] for st, sv in zip(starts, s, strict=True)
        ),
        "routine_saves": len(routine) // world,
        # async_save: the loop waits for the copy to CPU memory, not for the save
        "routine_stall_s": round(max((e["stall_s"] for e in routine), default=0.0), 3),
        "routine_save_s": round(
            max((e["stash_s"] + e["upload_s"] + e["commit_s"] for e in routine), default=0.0), 3
        ),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1,8,32,128", help="millions of parameters")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--deadline-s", type=float, default=90.0, help="the checkpoint budget")
    ap.add_argument("--stash", default="", help="stash directory (default: a temp dir on disk)")
    ap.add_argument("--out", default="out/bench-trainer.json")
    args = ap.parse_args(argv)
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    root = Path(args.stash or tempfile.mkdtemp(prefix="bench-trainer-", dir="/var/tmp"))
    moto, endpoint = start_moto()
    try:
        s3: Any = make_s3_client(endpoint_url=endpoint)
        bucket = f"bench-{uuid.uuid4().hex[:8]}"
        s3.create_bucket(Bucket=bucket)
        limits = {
            "disk_fsync_bytes_per_s": round(disk_rate(root, 256 << 20)),
            "dev_shm_bytes_per_s": round(disk_rate(Path("/dev/shm"), 256 << 20)),
            "moto_put_bytes_per_s": round(moto_rate(s3, bucket, 256 << 20)),
        }
        print(json.dumps({"limits": limits}), flush=True)
        rows = []
        for size in [float(x) for x in args.sizes.split(",") if x]:
            row = one_size(
                size,
                args.world,
                endpoint=endpoint,
                bucket=bucket,
                root=root,
                deadline_s=args.deadline_s,
            )
            print(json.dumps(row), flush=True)
            rows.append(row)
            # moto keeps objects in memory: a fresh bucket's worth per size is enough
            for key in s3.list_objects_v2(Bucket=bucket).get("Contents", []):
                s3.delete_object(Bucket=bucket, Key=key["Key"])
    finally:
        moto.kill()
        moto.wait()
        shutil.rmtree(root, ignore_errors=True)
    doc = {"limits": limits, "sizes": rows, "stash_dir": str(root), "world": args.world}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    print(
        f"{'Mparams':>8} {'MB':>8} {'step s':>7} {'stash s':>8} {'upload s':>9} {'ack s':>7} "
        f"{'stash MB/s':>10} {'upload MB/s':>11} {'restore s':>9} {'restart s':>9} equal "
        f"{'async held s':>12} {'of save s':>9}"
    )
    for r in rows:
        if "error" in r:
            print(f"{r['mparams']:>8g} error: {r['error']}")
            continue
        print(
            f"{r['mparams']:>8g} {r['checkpoint_bytes'] / 1e6:>8.1f} {r['step_s_max']:>7.2f} "
            f"{r['stash_s']:>8.2f} "
            f"{r['upload_s']:>9.2f} {max(r['ack_latency_s']):>7.2f} "
            f"{(r['stash_bytes_per_s'] or 0) / 1e6:>10.0f} "
            f"{(r['upload_bytes_per_s'] or 0) / 1e6:>11.0f} {r['restore_s']:>9.2f} "
            f"{r['restart_to_first_step_s']:>9.2f} {r['restored_equal']!s:>5} "
            f"{r['routine_stall_s']:>12.3f} {r['routine_save_s']:>9.2f}"
        )
    print(
        "limits: disk (fsync) {:.0f} MB/s, /dev/shm {:.0f} MB/s, moto PutObject {:.0f} MB/s".format(
            limits["disk_fsync_bytes_per_s"] / 1e6,
            limits["dev_shm_bytes_per_s"] / 1e6,
            limits["moto_put_bytes_per_s"] / 1e6,
        )
    )
    ok = all("error" not in r and r["durable"] and r["routine_saves"] for r in rows)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
