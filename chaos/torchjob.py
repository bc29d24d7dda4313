"""A real torch.distributed training job for the drills, e2e tests and bench (gloo on CPU).

Each rank is a process of its own (``python -m chaos.torchjob --rank R ...``); rank 0
hosts the rendezvous on loopback. The model is built here (an MLP, no downloaded weights), the
data is generated from (seed, step, rank), so two incarnations compute the same thing. Each rank
serves reclaimd's checkpoint contract with ``reclaimd_trainer.Signal`` on a loopback port
(written to ``<workdir>/rank-<R>.url`` for the drill to announce) and saves through
``reclaimd_trainer.torch.Checkpointer``: DCP to a stash, then the guarded PutObject to S3.

Every rank writes its step log, ``<workdir>/rank-<R>.jsonl`` (appended across incarnations),
one JSON object per line: ``start`` (incarnation, restored step, parameters' digest),
``step`` (step, wall time), ``saved`` (step, durable, uri, timings, digest of the saved state,
notices), ``stop``. The tests judge the job by it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal as signals
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from chaos.ports import free_port
from reclaimd_trainer import Signal
from reclaimd_trainer.torch import Checkpointer, S3Reader, SaveReport


def build_model(hidden: int, layers: int, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    mods: list[nn.Module] = [nn.Linear(32, hidden), nn.ReLU()]
    for _ in range(layers):
        mods += [nn.Linear(hidden, hidden), nn.ReLU()]
    mods.append(nn.Linear(hidden, 1))
    return nn.Sequential(*mods)


def digest(model: nn.Module, optimizer: torch.optim.Optimizer) -> str:
    """SHA-256 of every parameter's and optimizer tensor's bytes, in a fixed order."""
    h = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(p.detach().cpu().contiguous().numpy().tobytes())
    for idx, st in sorted(optimizer.state_dict()["state"].items()):
        for key, value in sorted(st.items()):
            h.update(f"{idx}.{key}".encode())
            if isinstance(value, torch.Tensor):
                h.update(value.detach().cpu().contiguous().numpy().tobytes())
            else:
                h.update(repr(value).encode())
    return h.hexdigest()


def batch(seed: int, step: int, rank: int, size: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed * 1_000_003 + step * 101 + rank)
    x = torch.randn(size, 32, generator=g)
    return x, x.sum(dim=1, keepdim=True).sin()


def main(argv: list[str] | None = None) -> int:  # noqa: PLR0915 (one job, read top down)
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--master-port", type=int, required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--run", default="job")
    ap.add_argument("--tenant", default="acme")
    ap.add_argument("--bucket", default="")
    ap.add_argument("--endpoint", default="")
    ap.add_argument("--stash", default="")
    ap.add_argument("--steps", type=int, default=1_000_000)
    ap.add_argument("--step-sleep", type=float, default=0.0, help="extra seconds per step")
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--incarnation", type=int, default=0)
    ap.add_argument("--stop-after-save", action="store_true")
    ap.add_argument("--put-qps", type=float, default=0.0, help="the guard's own limit (0: default)")
    ap.add_argument("--every", type=int, default=0, help="routine async saves every N steps")
    args = ap.parse_args(argv)

    workdir = Path(args.workdir)
    log_path = workdir / f"rank-{args.rank}.jsonl"
    log = log_path.open("a", buffering=1)

    def emit(event: str, **fields: Any) -> None:
        doc = {"event": event, "rank": args.rank, "t": time.time(), **fields}
        log.write(json.dumps(doc) + "\n")

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(args.master_port))
    dist.init_process_group("gloo", rank=args.rank, world_size=args.world)
    torch.set_num_threads(1)
    stopping = False

    def on_term(signum: int, frame: Any) -> None:
        nonlocal stopping
        stopping = True

    signals.signal(signals.SIGTERM, on_term)

    signal = Signal(host="127.0.0.1", port=0).start()
    url_file = workdir / f"rank-{args.rank}.url"
    url_file.with_suffix(".tmp").write_text(signal.url)
    url_file.with_suffix(".tmp").rename(url_file)

    store = reader = None
    if args.bucket:
        from reclaimd_trainer.s3 import GuardedPut, PutLimits, make_s3_client

        s3: Any = make_s3_client(endpoint_url=args.endpoint or None)
        limits = PutLimits(rate_per_s=args.put_qps) if args.put_qps else None
        store = GuardedPut(s3, limits=limits).bind(args.tenant, args.bucket)
        reader = S3Reader(s3, args.bucket)
    prefix = f"checkpoints/{args.tenant}/{args.run}/"

    def saved(report: SaveReport) -> None:
        # logged before the ack: the log holds every save reclaimd can hear of
        emit(
            "saved",
            step=report.step,
            durable=report.result.durable,
            uri=report.result.uri,
            checkpoint_time=report.result.checkpoint_time.isoformat(),
            stash_s=report.stash_s,
            upload_s=report.upload_s,
            commit_s=report.commit_s,
            stash_bytes=report.stash_bytes,
            parts=report.parts,
            error=report.error,
            digest=digest(model, optimizer),
            shares=[x.to_json() if x else None for x in report.shares],
        )

    def routine(report: SaveReport) -> None:
        # on the SDK's worker thread, once a routine save is COMMITTED: where the loop is now
        emit(
            "routine",
            step=report.step,
            at_step=step,
            checkpoint_time=report.result.checkpoint_time.isoformat(),
            stall_s=report.stall_s,
            stash_s=report.stash_s,
            upload_s=report.upload_s,
            commit_s=report.commit_s,
            stash_bytes=report.stash_bytes,
        )

    ckpt = Checkpointer(
        signal,
        on_saved=saved,
        every=args.every,
        on_durable=routine,
        run=args.run,
        stash_dir=args.stash or workdir / "stash",
        store=store,
        reader=reader,
        prefix=prefix,
    )
    model = build_model(args.hidden, args.layers, args.seed)
    ddp = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.Adam(ddp.parameters(), lr=1e-3)
    params = sum(p.numel() for p in model.parameters())

    t0 = time.perf_counter()
    restored = ckpt.restore(model, optimizer)
    restore_s = time.perf_counter() - t0
    step = restored or 0
    emit(
        "start",
        incarnation=args.incarnation,
        restored=restored,
        restore_s=restore_s,
        digest=digest(model, optimizer),
        params=params,
        world=args.world,
        url=signal.url,
    )
    loss_fn = nn.MSELoss()
    try:
        while step < args.steps and not stopping:
            x, y = batch(args.seed, step, args.rank)
            optimizer.zero_grad()
            loss = loss_fn(ddp(x), y)
            loss.backward()
            optimizer.step()
            step += 1
            if args.step_sleep:
                time.sleep(args.step_sleep)
            emit("step", step=step, loss=float(loss.item()))
            if args.every and step % args.every == 0:  # what a routine save there holds
                emit("state", step=step, digest=digest(model, optimizer))
            report = ckpt.maybe_save(step, model, optimizer)
            if report is not None and args.stop_after_save:
                break
        emit("final", step=step, digest=digest(model, optimizer))
    finally:
        emit("stop", step=step, stopping=stopping)
        signal.stop()
        ckpt.close()
        dist.destroy_process_group()
    return 0


# --- the drill's side: start the gang, read its logs -------------------------------------


class TorchGang:
    """One incarnation of the job: ``world`` rank processes on loopback."""

    def __init__(
        self,
        workdir: Path,
        world: int,
        *,
        incarnation: int = 0,
        module: str = "chaos.torchjob",  # or chaos.lightningjob
        **options: Any,
    ) -> None:
        self.module = module
        self.workdir = workdir
        self.world = world
        self.incarnation = incarnation
        self.options = options
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, timeout_s: float = 120.0) -> list[str]:
        """Start every rank; returns their checkpoint URLs once all serve (and restored)."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        for r in range(self.world):
            (self.workdir / f"rank-{r}.url").unlink(missing_ok=True)
        port = free_port()
        flags: list[str] = []
        for key, value in self.options.items():
            name = "--" + key.replace("_", "-")
            if value is True:
                flags.append(name)
            elif value is not False and value is not None:
                flags += [name, str(value)]
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
        for r in range(self.world):
            err = (self.workdir / f"rank-{r}.err").open("ab")
            self.procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        self.module,
                        "--rank",
                        str(r),
                        "--world",
                        str(self.world),
                        "--master-port",
                        str(port),
                        "--workdir",
                        str(self.workdir),
                        "--incarnation",
                        str(self.incarnation),
                        *flags,
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=err,
                    env=env,
                )
            )
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            if all(self.started(r) for r in range(self.world)):
                return [(self.workdir / f"rank-{r}.url").read_text() for r in range(self.world)]
            dead = [p for p in self.procs if p.poll() is not None]
            if dead:
                raise RuntimeError(f"a rank exited with {dead[0].returncode}: {self.stderr()}")
            time.sleep(0.1)
        raise TimeoutError(f"the ranks did not start in {timeout_s:g} s: {self.stderr()}")

    def started(self, rank: int) -> bool:
        return any(
            e["event"] == "start" and e.get("incarnation") == self.incarnation
            for e in read_log(self.workdir, rank)
        )

    def kill(self) -> None:
        """SIGKILL every rank: the node went away (no handler runs, nothing more is saved)."""
        for p in self.procs:
            if p.poll() is None:
                p.kill()
        for p in self.procs:
            p.wait()

    def wait(self, timeout_s: float = 120.0) -> list[int]:
        end = time.monotonic() + timeout_s
        codes = []
        for p in self.procs:
            codes.append(p.wait(timeout=max(0.1, end - time.monotonic())))
        return codes

    def stderr(self) -> str:
        out = []
        for r in range(self.world):
            path = self.workdir / f"rank-{r}.err"
            if path.exists():
                out.append(f"[rank {r}] " + path.read_text(errors="replace")[-1500:])
        return "\n".join(out)


def read_log(workdir: Path, rank: int) -> list[dict[str, Any]]:
    path = workdir / f"rank-{rank}.jsonl"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue  # a line cut by SIGKILL
    return out


if __name__ == "__main__":
    sys.exit(main())
