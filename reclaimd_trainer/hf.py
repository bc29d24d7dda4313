"""Hugging Face ``Trainer``: reclaimd's requests saved as the Trainer's own ``checkpoint-<step>``
at a step every rank agreed on, uploaded through the guarded PutObject; resume from it::

    signal = Signal(port=8080).start()
    reclaimd_cb = ReclaimdTrainerCallback(signal, run="llama", store=guarded_put,
                                          reader=S3Reader(s3, bucket),
                                          prefix=f"checkpoints/{tenant}/llama/")
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[reclaimd_cb])
    trainer.train(resume_from_checkpoint=reclaimd_cb.resume_path(args.output_dir))

- ``on_step_end`` (after the optimizer step, on every rank) polls the gang's decision
  (``Checkpointer.poll``, a gloo group of its own) and sets ``control.should_save``: the
  Trainer then writes ``checkpoint-<step>`` as it always does (model, optimizer, scheduler,
  ``trainer_state.json``, RNG states) and calls ``on_save``, where each rank uploads the files
  it wrote and rank 0 commits. A periodic save at the same step is the same save: never two.
- ``resume_path`` downloads the newest ``COMMITTED`` checkpoint (never HF's own "highest
  number", which ``get_last_checkpoint`` takes without checking it is complete).
- SIGTERM stays the Trainer's: with ``enable_jit_checkpoint`` it saves on SIGTERM itself; the
  callback logs that the two may both save (reclaimd's at the request, JIT's at the SIGTERM).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from reclaimd_trainer.contract import ObjectPut
from reclaimd_trainer.signal import Signal
from reclaimd_trainer.torch import Checkpointer, Decision, ObjectRead, SaveReport, durable_steps

log = logging.getLogger(__name__)


class ReclaimdTrainerCallback(TrainerCallback):
    def __init__(
        self,
        signal: Signal,
        *,
        run: str,
        store: ObjectPut | None = None,
        reader: ObjectRead | None = None,
        prefix: str = "",
        stash_dir: str | os.PathLike[str] | None = None,
        check_every: int = 1,
        stop_after_save: bool = False,
        on_saved: Callable[[SaveReport], None] | None = None,
    ) -> None:
        self.signal = signal
        self.options: dict[str, Any] = {
            "run": run,
            "store": store,
            "reader": reader,
            "prefix": prefix,
            "check_every": check_every,
            "on_saved": on_saved,
        }
        self.stash_dir = stash_dir
        self.stop_after_save = stop_after_save
        self.checkpointer: Checkpointer | None = None
        self.decision: Decision | None = None
        self.saves: list[SaveReport] = []

    def resume_path(self, output_dir: str | os.PathLike[str]) -> str | None:
        """The newest ``COMMITTED`` checkpoint, downloaded as ``<output_dir>/checkpoint-<step>``
        (on every rank, before ``train``); ``None`` when there is none."""
        reader: ObjectRead | None = self.options["reader"]
        if reader is None:
            return None
        prefix = str(self.options["prefix"])
        steps = durable_steps(reader, prefix)
        if not steps:
            return None
        step = steps[-1]
        directory = Path(output_dir) / f"checkpoint-{step}"
        directory.mkdir(parents=True, exist_ok=True)
        step_prefix = f"{prefix}step-{step:010d}/"
        for key in reader.list_keys(step_prefix):
            name = key[len(step_prefix) :]
            if name and "/" not in name and name != "COMMITTED":
                (directory / name).write_bytes(reader.get(key))
        return str(directory)

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        if self.checkpointer is None:
            stash = self.stash_dir if self.stash_dir is not None else str(args.output_dir)
            self.checkpointer = Checkpointer(self.signal, stash_dir=stash, **self.options)
        if getattr(args, "enable_jit_checkpoint", False):
            log.warning(
                "enable_jit_checkpoint is on: the Trainer also saves on SIGTERM, after "
                "reclaimd's save at its request"
            )

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        if self.checkpointer is None:
            return
        decision = self.checkpointer.poll(state.global_step)
        if decision is not None:
            self.decision = decision
            control.should_save = True  # every rank alike: the Trainer's save is collective

    def on_save(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        decision, self.decision = self.decision, None
        if decision is None or self.checkpointer is None:
            return
        ckpt = self.checkpointer
        written = Path(str(args.output_dir)) / f"checkpoint-{state.global_step}"

        def write(directory: Path) -> list[Path]:
            # The Trainer has written it: rank 0 the shared files, each rank its RNG state.
            files = sorted(p for p in written.iterdir() if p.is_file())
            if ckpt.rank == 0:
                return [p for p in files if not _other_ranks_rng(p.name, 0)]
            return [p for p in files if p.name == f"rng_state_{ckpt.rank}.pth"]

        self.saves.append(ckpt.save(decision, write=write))
        if self.stop_after_save:
            control.should_training_stop = True

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        if self.checkpointer is not None:
            self.checkpointer.close()
            self.checkpointer = None


def _other_ranks_rng(name: str, rank: int) -> bool:
    return name.startswith("rng_state_") and name != f"rng_state_{rank}.pth"
