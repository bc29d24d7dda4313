"""Routine checkpoints that do not stop training: DCP's ``async_save``, every N steps.

An asked save (reclaimd's request) holds the loop, and should: the gang is about to lose its
nodes and the ack waits for the upload anyway. Routine saves are where ``async_save`` helps.
The loop waits only while the state is copied to CPU memory (DCP's ``FileSystemWriter``
stages a real copy); the stash is written on DCP's thread, and this module's worker thread
uploads each rank's shards and has rank 0 write ``COMMITTED``. So when an ask fails (a 30 s
GCE window too short for a large model, a rank that cannot reach the store) the gang restores
from the last routine checkpoint, not from the start.

- **One save in flight** (DCP's advice: each staging is a checkpoint-sized copy in host
  memory). Whether the last one is done is agreed by all ranks (an all-reduce at routine
  steps only), so every rank starts the next DCP save, a collective, at the same step; a
  routine step that finds it still running is skipped on every rank.
- **A gloo group of its own**: DCP's plan exchange and the commit's all-reduce run on the
  worker thread and never interleave with the decision and the asked save on the loop's.
- **An ask waits for it**, then saves the asked step as always: the two never upload at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch.distributed as dist
from torch.distributed.checkpoint.filesystem import FileSystemWriter
from torch.distributed.checkpoint.state_dict_saver import async_save
from torch.distributed.checkpoint.stateful import Stateful

from reclaimd_trainer.contract import CheckpointResult, one_line
from reclaimd_trainer.times import utcnow

if TYPE_CHECKING:
    from reclaimd_trainer.torch import Checkpointer, Decision, SaveReport


class RoutineSaves:
    """Every ``every`` steps, an ``async_save`` of the state, uploaded and committed behind
    the loop (see the module doc). ``Checkpointer(every=N)`` makes one; its ``maybe_save``
    drives it."""

    def __init__(
        self,
        ckpt: Checkpointer,
        *,
        every: int,
        timeout_s: float = 600.0,
        on_durable: Callable[[SaveReport], None] | None = None,
        group_timeout_s: float = 600.0,
    ) -> None:
        if every < 1:
            raise ValueError("every must be at least 1")
        self.ckpt = ckpt
        self.every = every
        self.timeout_s = timeout_s  # a routine upload has no notice's deadline: its own
        self.on_durable = on_durable  # e.g. patch the pod's reclaimd.io/last-checkpoint
        self.group: Any = (
            dist.new_group(backend="gloo", timeout=timedelta(seconds=group_timeout_s))
            if ckpt.distributed
            else None
        )
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="reclaimd-routine")
        self.inflight: Future[SaveReport] | None = None
        self.reports: list[SaveReport] = []
        self.skipped = 0

    def due(self, step: int) -> bool:
        return step % self.every == 0

    def start(self, step: int, state: Stateful) -> bool:
        """Collective at a routine step: stage ``state`` and save it behind the loop; False if
        the last routine save is still running on some rank (this step is skipped)."""
        busy = self.inflight is not None and not self.inflight.done()
        if not self.ckpt.all_ranks(not busy):
            self.skipped += 1
            return False
        self._collect()
        from reclaimd_trainer.torch import Decision, SaveReport  # the module that made us

        taken = utcnow()
        directory = self.ckpt.step_dir(step)
        report = SaveReport(
            step, CheckpointResult(taken, step, directory.resolve().as_uri() + "/", False)
        )
        t0 = time.perf_counter()
        self.ckpt.clear_stash(step)
        saving = async_save(
            {"train": state},
            storage_writer=FileSystemWriter(directory),
            process_group=self.group,
            no_dist=not self.ckpt.distributed,
        )
        report.stall_s = time.perf_counter() - t0
        decision = Decision(step, (), taken + timedelta(seconds=self.timeout_s))
        self.inflight = self.pool.submit(self._finish, decision, report, saving, t0)
        return True

    def wait(self) -> SaveReport | None:
        """Block until the save in flight (if any) is committed or failed; its report."""
        if self.inflight is None:
            return None
        report = self.inflight.result()
        self._collect()
        return report

    def close(self) -> None:
        try:
            self.wait()
        finally:
            self.pool.shutdown(wait=True)
            if self.group is not None:
                dist.destroy_process_group(self.group)
                self.group = None

    # --- the worker thread -------------------------------------------------------------------

    def _finish(self, decision: Decision, report: SaveReport, saving: Any, t0: float) -> SaveReport:
        ckpt = self.ckpt
        stashed = True
        try:
            saving.result(timeout=self.timeout_s)
        except Exception as e:  # the others learn it at the commit, which this rank joins
            report.error = one_line(f"stash failed: {type(e).__name__}: {e}")
            stashed = False
        report.stash_s = time.perf_counter() - t0
        mine = ckpt.my_files(ckpt.step_dir(decision.step)) if stashed else []
        report.stash_bytes = sum(p.stat().st_size for p in mine)
        if stashed:
            ckpt.saved_steps.add(decision.step)
        if ckpt.store is not None:
            uri = ckpt.upload_and_commit(decision, mine, report, group=self.group, stashed=stashed)
            if uri:
                taken = report.result.checkpoint_time
                report.result = CheckpointResult(taken, decision.step, uri, True)
        ckpt.prune()
        if report.result.durable and self.on_durable is not None:
            self.on_durable(report)
        return report

    def _collect(self) -> None:
        if self.inflight is not None and self.inflight.done():
            self.reports.append(self.inflight.result())
            self.inflight = None
