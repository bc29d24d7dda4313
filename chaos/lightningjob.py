"""The drills' real torch job again, as a PyTorch Lightning ``Trainer`` (DDP, gloo on CPU) with
``reclaimd_trainer.lightning.ReclaimdCallback``: same arguments and step log as
chaos/torchjob.py (``TorchGang(..., module="chaos.lightningjob")`` starts it).

Each rank is a process of its own with torchelastic's environment, so Lightning joins the
given world instead of launching its own processes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, IterableDataset

from chaos.torchjob import batch, build_model, digest
from reclaimd_trainer import Signal
from reclaimd_trainer.lightning import ReclaimdCallback
from reclaimd_trainer.torch import S3Reader, SaveReport


class Batches(IterableDataset[tuple[torch.Tensor, torch.Tensor]]):
    def __init__(self, seed: int, rank: int, steps: int) -> None:
        self.seed, self.rank, self.steps = seed, rank, steps

    def __iter__(self) -> Any:
        for step in range(self.steps):
            yield batch(self.seed, step, self.rank)


class Module(pl.LightningModule):
    def __init__(self, hidden: int, layers: int, seed: int) -> None:
        super().__init__()
        self.net = build_model(hidden, layers, seed)
        self.loss = nn.MSELoss()

    def training_step(self, b: Any, batch_idx: int) -> torch.Tensor:
        x, y = b
        loss: torch.Tensor = self.loss(self.net(x.squeeze(0)), y.squeeze(0))
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=1e-3)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    for name, kind, default in [
        ("--rank", int, None),
        ("--world", int, None),
        ("--master-port", int, None),
        ("--workdir", str, None),
        ("--run", str, "job"),
        ("--tenant", str, "acme"),
        ("--bucket", str, ""),
        ("--endpoint", str, ""),
        ("--stash", str, ""),
        ("--steps", int, 1_000_000),
        ("--step-sleep", float, 0.0),
        ("--hidden", int, 64),
        ("--layers", int, 2),
        ("--seed", int, 7),
        ("--incarnation", int, 0),
    ]:
        ap.add_argument(name, type=kind, default=default, required=default is None)
    args = ap.parse_args(argv)
    workdir = Path(args.workdir)
    log = (workdir / f"rank-{args.rank}.jsonl").open("a", buffering=1)

    def emit(event: str, **fields: Any) -> None:
        doc = {"event": event, "rank": args.rank, "t": time.time(), **fields}
        log.write(json.dumps(doc) + "\n")

    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(args.master_port),
        RANK=str(args.rank),
        WORLD_SIZE=str(args.world),
        LOCAL_RANK=str(args.rank),
        LOCAL_WORLD_SIZE=str(args.world),
        GROUP_RANK="0",
        ROLE_RANK=str(args.rank),
        TORCHELASTIC_RUN_ID="drill",
    )
    torch.set_num_threads(1)
    signal = Signal(host="127.0.0.1", port=0).start()
    store = reader = None
    if args.bucket:
        from reclaimd_trainer.s3 import GuardedPut, make_s3_client

        s3: Any = make_s3_client(endpoint_url=args.endpoint or None)
        store = GuardedPut(s3).bind(args.tenant, args.bucket)
        reader = S3Reader(s3, args.bucket)
    module = Module(args.hidden, args.layers, args.seed)
    net: nn.Module = module.net

    def saved(report: SaveReport) -> None:
        opt = trainer.optimizers[0]
        emit(
            "saved",
            step=report.step,
            durable=report.result.durable,
            uri=report.result.uri,
            checkpoint_time=report.result.checkpoint_time.isoformat(),
            stash_s=report.stash_s,
            upload_s=report.upload_s,
            commit_s=report.commit_s,
            error=report.error,
            digest=digest(net, opt),
        )

    cb = ReclaimdCallback(
        signal,
        run=args.run,
        stash_dir=args.stash or workdir / "stash",
        store=store,
        reader=reader,
        prefix=f"checkpoints/{args.tenant}/{args.run}/",
        on_saved=saved,
    )

    class StepLog(pl.Callback):
        def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
            url_file = workdir / f"rank-{args.rank}.url"
            url_file.with_suffix(".tmp").write_text(signal.url)
            emit(
                "start",
                incarnation=args.incarnation,
                restored=trainer.global_step or None,
                digest=digest(net, trainer.optimizers[0]),
                url=signal.url,
            )
            url_file.with_suffix(".tmp").rename(url_file)

        def on_train_batch_end(self, trainer: pl.Trainer, *a: Any) -> None:
            if args.step_sleep:
                time.sleep(args.step_sleep)
            emit("step", step=trainer.global_step)

    trainer = pl.Trainer(
        accelerator="cpu",
        devices=args.world,
        num_nodes=1,
        strategy="ddp",
        max_steps=args.steps,
        callbacks=[StepLog(), cb],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        use_distributed_sampler=False,
    )
    data = DataLoader(Batches(args.seed, args.rank, 10_000_000), batch_size=1)
    trainer.fit(module, train_dataloaders=data, ckpt_path=cb.resume_path())
    emit("final", step=trainer.global_step, digest=digest(net, trainer.optimizers[0]))
    signal.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
