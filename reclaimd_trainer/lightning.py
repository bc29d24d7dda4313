"""PyTorch Lightning: reclaimd's requests saved as Lightning's own checkpoint, at a step boundary
every rank agreed on, uploaded through the guarded PutObject; resume with ``ckpt_path``::

    signal = Signal(port=8080).start()
    reclaimd_cb = ReclaimdCallback(signal, run="llama", stash_dir="/dev/shm/ckpt",
                                   store=guarded_put, reader=S3Reader(s3, bucket),
                                   prefix=f"checkpoints/{tenant}/llama/")
    trainer = L.Trainer(callbacks=[reclaimd_cb], ...)
    trainer.fit(model, ckpt_path=reclaimd_cb.resume_path())   # None the first time

- The decision is ``Checkpointer.poll`` in ``on_train_batch_end`` (a gloo group of its own,
  made in ``setup`` once Lightning has initialised the default group); every rank then calls
  ``trainer.save_checkpoint`` (Lightning: "needs to be called on all processes"), which writes
  ``lightning.ckpt`` on rank 0 with the loops' state, so ``fit(ckpt_path=...)`` resumes the
  global step and the epoch as Lightning does. Rank 0 uploads it and ``COMMITTED``; every rank
  acks with the same result.
- SIGTERM stays Lightning's: the SDK installs no handler, and Lightning's (installed at fit
  start) raises ``SIGTERMException`` after ``on_train_batch_end``, that is after this save.
  The callback never saves on an exception, so a SIGTERM after reclaimd's save is not a second
  save, and a SIGTERM without a request is Lightning's business (``OnExceptionCheckpoint``).
- ``stop_after_save=True`` also sets ``trainer.should_stop`` (a warning if ``min_steps`` holds it).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning.pytorch as pl

from reclaimd_trainer.contract import ObjectPut
from reclaimd_trainer.shardstore import COMMITTED
from reclaimd_trainer.signal import Signal
from reclaimd_trainer.torch import (
    Checkpointer,
    ObjectRead,
    SaveReport,
    durable_steps,
)

log = logging.getLogger(__name__)

CKPT_NAME = "lightning.ckpt"


class ReclaimdCallback(pl.Callback):
    def __init__(
        self,
        signal: Signal,
        *,
        run: str,
        stash_dir: str | os.PathLike[str],
        store: ObjectPut | None = None,
        reader: ObjectRead | None = None,
        prefix: str = "",
        check_every: int = 1,
        stop_after_save: bool = False,
        on_saved: Callable[[SaveReport], None] | None = None,
    ) -> None:
        self.signal = signal
        self.options: dict[str, Any] = {
            "run": run,
            "stash_dir": stash_dir,
            "store": store,
            "reader": reader,
            "prefix": prefix,
            "check_every": check_every,
            "on_saved": on_saved,
        }
        self.stop_after_save = stop_after_save
        self.checkpointer: Checkpointer | None = None
        self.saves: list[SaveReport] = []

    # --- before fit: where to resume from --------------------------------------------------

    def resume_path(self) -> str | None:
        """The newest ``COMMITTED`` checkpoint of the run, downloaded to this rank's stash;
        ``None`` if there is none. Call it on every rank before ``fit`` (no collective: the
        object store's listing is the same for all, nothing is saved while a gang restarts)."""
        reader: ObjectRead | None = self.options["reader"]
        if reader is None:
            return None
        prefix = str(self.options["prefix"])
        steps = durable_steps(reader, prefix)
        if not steps:
            return None
        step = steps[-1]
        rank = int(os.environ.get("RANK", "0"))
        directory = Path(self.options["stash_dir"]) / str(self.options["run"])
        directory = directory / f"resume-{step:010d}-rank{rank}"
        directory.mkdir(parents=True, exist_ok=True)
        key = f"{prefix}step-{step:010d}/{CKPT_NAME}"
        path = directory / CKPT_NAME
        path.write_bytes(reader.get(key))
        manifest = json.loads(reader.get(f"{prefix}step-{step:010d}/{COMMITTED}"))
        log.info("resuming from step %s (%s)", manifest.get("step"), key)
        return str(path)

    # --- Lightning's hooks -----------------------------------------------------------------

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit" and self.checkpointer is None:
            self.checkpointer = Checkpointer(self.signal, **self.options)

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        ckpt = self.checkpointer
        if ckpt is None:
            return
        decision = ckpt.poll(trainer.global_step)
        if decision is None:
            return

        def write(directory: Path) -> list[Path]:
            path = directory / CKPT_NAME
            trainer.save_checkpoint(path)  # every rank: the strategy decides who writes
            return [path] if trainer.is_global_zero else []

        self.saves.append(ckpt.save(decision, write=write))
        if self.stop_after_save:
            trainer.should_stop = True
            if trainer.min_steps and trainer.global_step < trainer.min_steps:
                log.warning("min_steps=%s holds the stop after the save", trainer.min_steps)

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self.checkpointer is not None and stage == "fit":
            self.checkpointer.close()
            self.checkpointer = None
