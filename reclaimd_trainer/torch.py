"""PyTorch: torch.distributed.checkpoint (DCP) saves for reclaimd's requests, one step per gang.

``Checkpointer`` is what a torch loop adds to ``Signal``::

    ckpt = Checkpointer(signal, run="llama", stash_dir="/dev/shm/ckpt", store=guarded_put,
                        reader=S3Reader(s3, bucket), prefix=f"checkpoints/{tenant}/llama/")
    step = ckpt.restore(model, optimizer) or 0       # newest complete checkpoint, every rank
    while step < steps:
        train_step(); step += 1
        ckpt.maybe_save(step, model, optimizer)     # collective: every rank, every step

What it does:

- **One step for the gang.** A request reaches the ranks at different moments, and a DCP save
  is collective. ``poll(step)`` all-reduces "some rank was asked" (and the earliest deadline)
  on a gloo process group of its own, so every rank decides at the same step, and gathers the
  notice ids: a rank answers a notice it is asked for later with that save, never a second.
  ``check_every`` spaces the all-reduce out (on a 2-core CPU test it costs ~0.1 ms).
- **Stash, then upload.** ``dcp.save`` writes ``<stash_dir>/<run>/step-<N>/`` (``/dev/shm`` or
  local disk: fast, and dies with the node). Each rank then uploads its own shard files
  (``__<rank>_<n>.distcp``; rank 0 also ``.metadata``) through ``store`` (the guarded
  PutObject, ``GuardedPut(...).bind(tenant, bucket)``), paced at reclaimd's share of the
  tenant's PutObject budget as the request and polls hand it. When every rank stored its part
  (all-reduce), rank 0 writes ``COMMITTED`` (a JSON manifest): the checkpoint is complete.
- **The ack.** ``durable: true`` only with ``COMMITTED`` stored before the deadline reclaimd
  gave (the earliest across the gang); otherwise the ack points at the stash, ``durable:
  false``: still an answer at a step boundary, but the waste clock is not reset.
- **restore()**: the newest step that is ``COMMITTED`` in the object store or complete in the
  stash of every rank (a ``.metadata`` whose files are all there), agreed by all ranks; loads
  it in place (DCP reshards, so the world size may change) and returns the step.

Without an initialised process group (one process) it saves and loads alone.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.filesystem import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save
from torch.distributed.checkpoint.stateful import Stateful

from reclaimd_trainer import shardstore
from reclaimd_trainer.budget import Share
from reclaimd_trainer.contract import (
    CheckpointResult,
    ObjectPut,
    one_line,
)
from reclaimd_trainer.routine import RoutineSaves
from reclaimd_trainer.shardstore import COMMITTED
from reclaimd_trainer.signal import Signal
from reclaimd_trainer.times import utcnow

METADATA = ".metadata"
_STEP_DIR = re.compile(r"step-(\d{10})")
_NO_DEADLINE = 1e18


class ObjectRead(Protocol):
    """What ``restore`` needs of the object store: keys under a prefix, and one object."""

    def list_keys(self, prefix: str) -> Iterable[str]: ...

    def get(self, key: str) -> bytes: ...


class SharePut(ObjectPut, Protocol):
    def set_put_budget(self, share: Share | None) -> None: ...


class S3Reader:
    """``ObjectRead`` over a boto3-style S3 client (``list_objects_v2``, ``get_object``).

    Duck-typed: the SDK does not import boto3; the trainer's image brings the client."""

    def __init__(self, client: Any, bucket: str) -> None:
        self.client = client
        self.bucket = bucket

    def list_keys(self, prefix: str) -> Iterator[str]:
        token: str | None = None
        while True:
            kw: dict[str, Any] = {"Bucket": self.bucket, "Prefix": prefix}
            if token:
                kw["ContinuationToken"] = token
            page = self.client.list_objects_v2(**kw)
            for obj in page.get("Contents", []):
                yield str(obj["Key"])
            if not page.get("IsTruncated"):
                return
            token = page.get("NextContinuationToken")

    def get(self, key: str) -> bytes:
        body: bytes = self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read()
        return body


class TrainState(Stateful):
    """A model and its optimizers as one DCP ``Stateful`` (DDP/FSDP names normalised by
    ``get_state_dict``), plus ``extra`` plain values (the step, a data cursor)."""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizers: torch.optim.Optimizer | Sequence[torch.optim.Optimizer] = (),
        extra: dict[str, Any] | None = None,
    ) -> None:
        self.model = model
        self.optimizers = (
            [optimizers] if isinstance(optimizers, torch.optim.Optimizer) else list(optimizers)
        )
        self.extra = dict(extra or {})

    def state_dict(self) -> dict[str, Any]:
        model_sd, optim_sd = get_state_dict(self.model, self.optimizers)
        return {"model": model_sd, "optim": optim_sd, "extra": self.extra}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        set_state_dict(
            self.model,
            self.optimizers,
            model_state_dict=state_dict["model"],
            optim_state_dict=state_dict["optim"],
            options=StateDictOptions(strict=True),
        )
        self.extra = dict(state_dict.get("extra", {}))


@dataclass(frozen=True)
class Decision:
    """What every rank agreed at one step: save, for these notices, before this deadline."""

    step: int
    notice_ids: tuple[str, ...]
    deadline: datetime | None


@dataclass
class SaveReport:
    """One save, as this rank saw it (the bench and the logs read it)."""

    step: int
    result: CheckpointResult
    stash_s: float = 0.0
    stall_s: float = 0.0  # a routine save: how long the loop waited (the copy to CPU memory)
    upload_s: float = 0.0
    commit_s: float = 0.0
    stash_bytes: int = 0
    uploaded_bytes: int = 0
    parts: int = 0
    error: str = ""
    shares: list[Share | None] = field(default_factory=list)


class Checkpointer:
    """reclaimd's requests turned into collective DCP saves (see the module doc).

    Create it on every rank at the same point (``new_group`` is collective). ``prefix`` is the
    run's key prefix in the bucket, inside the tenant's (``checkpoints/<tenant>/...``).
    """

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
        reply_margin_s: float = 0.5,
        commit_margin_s: float = 1.0,
        group_timeout_s: float = 120.0,
        keep_stashes: int = 2,
        on_saved: Callable[[SaveReport], None] | None = None,
        every: int = 0,
        on_durable: Callable[[SaveReport], None] | None = None,
    ) -> None:
        if check_every < 1:
            raise ValueError("check_every must be at least 1")
        if prefix and not prefix.endswith("/"):
            raise ValueError("prefix must end with '/'")
        self.signal, self.run, self.stash_root = signal, run, Path(stash_dir) / run
        self.store, self.reader, self.prefix = store, reader, prefix
        self.check_every, self.keep_stashes = check_every, keep_stashes
        self.reply_margin_s, self.commit_margin_s = reply_margin_s, commit_margin_s
        self.on_saved = on_saved  # called after the save, before the ack (a step log's line)
        self.distributed = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank() if self.distributed else 0
        self.world = dist.get_world_size() if self.distributed else 1
        # A group of its own: the decision and the save's collectives never interleave with the
        # training's (DDP's all-reduces on the default group), whatever its backend.
        self.group: Any = (
            dist.new_group(backend="gloo", timeout=timedelta(seconds=group_timeout_s))
            if self.distributed
            else None
        )
        self.saves: list[SaveReport] = []
        self.saved_steps: set[int] = set()
        self.poll_count = 0
        # every > 0: routine async saves between asks (reclaimd_trainer/routine.py)
        self.routine = RoutineSaves(self, every=every, on_durable=on_durable) if every else None

    # --- the decision ------------------------------------------------------------------------

    def poll(self, step: int) -> Decision | None:
        """Collective: every rank calls it at every step and gets the same answer."""
        if step % self.check_every:
            return None
        self.poll_count += 1
        waiting = self.signal.pending()
        asked = 1.0 if self.signal.requested else 0.0
        deadline = min((r.deadline.timestamp() for r in waiting), default=_NO_DEADLINE)
        if not self.distributed:
            if not asked:
                return None
            ids = tuple(r.notice_id for r in waiting)
            return Decision(step, ids, _when(deadline))
        flags = torch.tensor([asked, -deadline], dtype=torch.float64)
        dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=self.group)
        if flags[0].item() == 0.0:
            return None
        mine = [r.notice_id for r in waiting]
        every: list[Any] = [None] * self.world
        dist.all_gather_object(every, mine, group=self.group)
        ids = tuple(sorted({i for ranks in every for i in (ranks or [])}))
        return Decision(step, ids, _when(-float(flags[1].item())))

    def maybe_save(
        self,
        step: int,
        model: torch.nn.Module,
        optimizers: torch.optim.Optimizer | Sequence[torch.optim.Optimizer] = (),
        extra: dict[str, Any] | None = None,
    ) -> SaveReport | None:
        """``poll`` and, if the gang was asked, ``save``: call it on every rank at every step.
        With ``every``, a step that is not asked may start a routine save behind the loop."""
        decision = self.poll(step)
        state = TrainState(model, optimizers, {"step": step, **(extra or {})})
        if decision is None:
            if self.routine is not None and self.routine.due(step):
                self.routine.start(step, state)
            return None
        if self.routine is not None:
            self.routine.wait()  # one save at a time: the asked one follows the routine one
        return self.save(decision, state)

    # --- the save ----------------------------------------------------------------------------

    def save(
        self,
        decision: Decision,
        state: Stateful | None = None,
        *,
        write: Callable[[Path], Sequence[Path]] | None = None,
    ) -> SaveReport:
        """Collective: stash, upload this rank's shards, commit, ack. Never raises for a failed
        upload (the ack says not durable); a failed stash acks ``500`` and raises.

        ``state`` is saved with DCP; or ``write(directory)`` writes the stash itself (every
        rank calls it) and returns the files this rank uploads (the Lightning callback saves
        Lightning's own checkpoint this way)."""
        if (state is None) == (write is None):
            raise ValueError("save takes a state or a write function")
        step = decision.step
        taken = utcnow()
        directory = self.step_dir(step)
        report = SaveReport(step, CheckpointResult(taken, step, _file_uri(directory), False))
        t0 = time.perf_counter()
        mine: list[Path] = []
        try:
            self.clear_stash(step)
            if write is not None:
                directory.mkdir(parents=True, exist_ok=True)
                mine = list(write(directory))
                self._barrier()
            else:
                dcp_save(
                    {"train": state},
                    storage_writer=FileSystemWriter(directory),
                    process_group=self.group,
                    no_dist=not self.distributed,
                )
                mine = self.my_files(directory)
            self.saved_steps.add(step)
        except Exception as e:
            report.error = one_line(f"stash failed: {type(e).__name__}: {e}")
            self.signal.fail(report.error, covers=decision.notice_ids)
            self.saves.append(report)
            raise
        report.stash_s = time.perf_counter() - t0
        report.stash_bytes = sum(p.stat().st_size for p in mine)
        durable_uri = ""
        if self.store is not None and decision.deadline is not None:
            durable_uri = self.upload_and_commit(decision, mine, report)
        elif self.store is not None:
            report.error = "no deadline to upload against"
        if durable_uri:
            report.result = CheckpointResult(taken, step, durable_uri, True)
        if self.on_saved is not None:
            self.on_saved(report)
        self.signal.ack(report.result, covers=decision.notice_ids)
        self.saves.append(report)
        self.prune()
        return report

    def upload_and_commit(
        self,
        decision: Decision,
        files: list[Path],
        report: SaveReport,
        *,
        group: Any = None,
        stashed: bool = True,
    ) -> str:
        """Collective on ``group`` (the checkpointer's by default): upload this rank's
        ``files``, then rank 0 commits once every rank stored its part. The durable URI, or
        "" (``report.error`` says why). A rank whose stash failed still takes part."""
        assert self.store is not None
        return shardstore.upload_and_commit(
            self,
            self.store,
            self.signal,
            decision,
            files,
            report=report,
            prefix=self.step_prefix(decision.step),
            group=group,
            stashed=stashed,
            margins=(self.reply_margin_s, self.commit_margin_s),
            torch_version=torch.__version__,
        )

    def step_dir(self, step: int) -> Path:
        return self.stash_root / f"step-{step:010d}"

    def clear_stash(self, step: int) -> None:
        """Collective: a step's stash directory starts empty on every rank."""
        directory = self.step_dir(step)
        if self.rank == 0 and directory.exists():
            shutil.rmtree(directory)
        if self.distributed:
            dist.barrier(group=self.group)

    def step_prefix(self, step: int) -> str:
        return f"{self.prefix}step-{step:010d}/"

    def my_files(self, directory: Path) -> list[Path]:
        files = sorted(directory.glob(f"__{self.rank}_*.distcp"))
        if self.rank == 0:
            files.append(directory / METADATA)
        return files

    # --- restore -----------------------------------------------------------------------------

    def durable_steps(self) -> list[int]:
        return durable_steps(self.reader, self.prefix) if self.reader is not None else []

    def stashed_steps(self) -> list[int]:
        """Steps whose stash on this node is complete (every file its ``.metadata`` names)."""
        if not self.stash_root.is_dir():
            return []
        out = []
        for d in self.stash_root.iterdir():
            m = _STEP_DIR.fullmatch(d.name)
            if m and _complete_locally(d):
                out.append(int(m[1]))
        return sorted(out)

    def restore(
        self,
        model: torch.nn.Module,
        optimizers: torch.optim.Optimizer | Sequence[torch.optim.Optimizer] = (),
        extra: dict[str, Any] | None = None,
    ) -> int | None:
        """Collective: load the newest complete checkpoint into ``model`` and ``optimizers`` on
        every rank; returns its step (``None``: nothing to restore, nothing changed)."""
        state = TrainState(model, optimizers, extra)
        found = self.restore_state(state)
        if found is None:
            return None
        if extra is not None:
            extra.update(state.extra)
        return found

    def restore_state(self, state: Stateful) -> int | None:
        durable = set(self.durable_steps()) if self.rank == 0 else set()
        local = set(self.stashed_steps())
        if self.distributed:
            every: list[Any] = [None] * self.world
            dist.all_gather_object(every, sorted(local), group=self.group)
            shared = set.intersection(*(set(s) for s in every))
            box: list[Any] = [sorted(durable)]
            dist.broadcast_object_list(box, src=0, group=self.group)
            durable = set(box[0])
        else:
            shared = local
        candidates = durable | shared
        if not candidates:
            return None
        step = max(candidates)
        if step in shared:
            directory = self.step_dir(step)
        else:
            directory = self.stash_root / f"restore-{step:010d}-rank{self.rank}"
            self._download(step, directory)
        dcp_load(
            {"train": state},
            storage_reader=FileSystemReader(directory),
            process_group=self.group,
            no_dist=not self.distributed,
        )
        if step in shared:
            self.saved_steps.add(step)
        return step

    def _download(self, step: int, directory: Path) -> None:
        assert self.reader is not None
        shardstore.download(self.reader, self.step_prefix(step), directory)

    # --- collectives -------------------------------------------------------------------------

    def _barrier(self) -> None:
        if self.distributed:
            dist.barrier(group=self.group)

    def all_ranks(self, ok: bool, *, group: Any = None) -> bool:
        """Collective: ``ok`` on every rank (on ``group``, the checkpointer's by default)."""
        if not self.distributed:
            return ok
        t = torch.tensor([1 if ok else 0], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.group if group is None else group)
        return bool(t.item())

    def from_rank0(self, value: str, group: Any = None) -> str:
        if not self.distributed:
            return value
        box: list[Any] = [value]
        dist.broadcast_object_list(box, src=0, group=self.group if group is None else group)
        return str(box[0])

    def prune(self) -> None:
        # Every rank: on a real cluster each node has its own stash (here they may share one).
        if self.keep_stashes < 1 or not self.stash_root.is_dir():
            return
        steps = sorted(d for d in self.stash_root.iterdir() if _STEP_DIR.fullmatch(d.name))
        for d in steps[: -self.keep_stashes]:
            shutil.rmtree(d, ignore_errors=True)

    def close(self) -> None:
        if self.routine is not None:
            self.routine.close()
            self.routine = None
        if self.group is not None:
            dist.destroy_process_group(self.group)
            self.group = None


def durable_steps(reader: ObjectRead, prefix: str) -> list[int]:
    """The run's steps whose ``COMMITTED`` marker is in the object store, oldest first."""
    steps = []
    for key in reader.list_keys(prefix):
        rest = key[len(prefix) :]
        m = _STEP_DIR.fullmatch(rest.removesuffix("/" + COMMITTED))
        if m and rest.endswith("/" + COMMITTED):
            steps.append(int(m[1]))
    return sorted(steps)


def _complete_locally(directory: Path) -> bool:
    meta = directory / METADATA
    if not meta.is_file():
        return False
    try:
        metadata = FileSystemReader(directory).read_metadata()
    except Exception:
        return False
    need: dict[str, int] = {}
    for info in metadata.storage_data.values():
        end = int(info.offset) + int(info.length)
        need[str(info.relative_path)] = max(need.get(str(info.relative_path), 0), end)
    for name, size in need.items():
        path = directory / name
        if not path.is_file() or path.stat().st_size < size:
            return False
    return True


def _when(ts: float) -> datetime | None:
    return None if ts >= _NO_DEADLINE else datetime.fromtimestamp(ts, UTC)


def _file_uri(path: Path) -> str:
    return path.resolve().as_uri() + "/"
