"""A saved step's files in the object store, for the torch integration's ``Checkpointer``.

Each rank uploads its own shard files through the guarded PutObject (``store``), paced at
reclaimd's share of the tenant's PutObject budget as the rank's ``Signal`` hands it while the
upload runs; rank 0 then writes ``COMMITTED``, a JSON manifest, once every rank stored its
part (the collective that decides it stays with the ``Checkpointer``). A step not in the
stash is downloaded from here to be restored. Needs no framework: torch is the caller's.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from reclaimd_trainer.budget import Share
from reclaimd_trainer.contract import CheckpointRequest, CheckpointResult, ObjectPut, upload_parts
from reclaimd_trainer.signal import Signal
from reclaimd_trainer.times import utcnow

if TYPE_CHECKING:
    from reclaimd_trainer.torch import Decision, ObjectRead, SaveReport

COMMITTED = "COMMITTED"


class Gang(Protocol):
    """The collectives of the ranks that save together (``torch.Checkpointer``)."""

    rank: int
    world: int

    def all_ranks(self, ok: bool, *, group: Any = None) -> bool: ...

    def from_rank0(self, value: str, group: Any = None) -> str: ...


def upload_and_commit(
    gang: Gang,
    store: ObjectPut,
    signal: Signal,
    decision: Decision,
    files: list[Path],
    *,
    report: SaveReport,
    prefix: str,
    group: Any,
    stashed: bool,
    margins: tuple[float, float],
    torch_version: str,
) -> str:
    """Collective on ``group``: this rank's ``files`` uploaded, then rank 0 commits once every
    rank stored its part. The durable URI, or "" (``report.error`` says why). ``margins``: the
    reply's and the commit's, before the deadline."""
    reply_margin_s, commit_margin_s = margins
    t1 = time.perf_counter()
    ok, uri = False, ""
    if stashed:
        ok, uri, report.error = upload_shards(
            store,
            signal,
            decision,
            files,
            report,
            prefix=prefix,
            reply_margin_s=reply_margin_s,
            commit_margin_s=commit_margin_s,
        )
    report.upload_s = time.perf_counter() - t1
    report.uploaded_bytes = report.stash_bytes if ok else 0
    report.parts = len(files)
    t2 = time.perf_counter()
    everyone = gang.all_ranks(ok, group=group)
    committed = False
    if everyone and gang.rank == 0:
        manifest = {
            "step": decision.step,
            "world_size": gang.world,
            "notices": list(decision.notice_ids),
            "torch": torch_version,
            "saved_at": utcnow().isoformat(),
        }
        committed = commit(store, decision, manifest, prefix=prefix, reply_margin_s=reply_margin_s)
        if not committed:
            report.error = "commit did not finish before the deadline"
    committed = gang.all_ranks(committed if gang.rank == 0 else True, group=group) and everyone
    report.commit_s = time.perf_counter() - t2
    # a rank without files (Lightning: rank 0 writes) has no uri of its own
    return gang.from_rank0(uri, group) if committed else ""


def upload_shards(
    store: ObjectPut,
    signal: Signal,
    decision: Decision,
    files: list[Path],
    report: SaveReport,
    *,
    prefix: str,
    reply_margin_s: float,
    commit_margin_s: float,
) -> tuple[bool, str, str]:
    """This rank's ``files`` stored under ``prefix``: (stored, the step's URI, why not)."""
    assert decision.deadline is not None
    if not files:
        return True, "", ""  # nothing of this rank's in the stash (Lightning: rank 0 writes)
    # The shards must leave room for the commit and the answer.
    deadline = decision.deadline - timedelta(seconds=commit_margin_s)
    request = CheckpointRequest(
        notice_id=",".join(decision.notice_ids) or "local", deadline=deadline
    )
    parts = [(prefix + p.name, p.read_bytes()) for p in files]

    async def go() -> CheckpointResult:
        watcher = asyncio.create_task(_follow_share(signal, store, report))
        try:
            return await upload_parts(
                request,
                parts,
                store=store,
                step=decision.step,
                reply_margin_s=reply_margin_s,
                stash_uri="",
            )
        finally:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
            _set_share(store, None)

    result = asyncio.run(go())
    if not result.durable:
        return False, "", "upload did not finish before the deadline"
    uri = result.uri.rsplit("/", 1)[0] + "/"
    return True, uri, ""


def commit(
    store: ObjectPut,
    decision: Decision,
    manifest: Mapping[str, Any],
    *,
    prefix: str,
    reply_margin_s: float,
) -> bool:
    """Rank 0's ``COMMITTED`` under ``prefix``: whether it was stored by the deadline."""
    assert decision.deadline is not None
    request = CheckpointRequest(notice_id="commit", deadline=decision.deadline)
    result = asyncio.run(
        upload_parts(
            request,
            [(prefix + COMMITTED, json.dumps(manifest).encode())],
            store=store,
            reply_margin_s=reply_margin_s,
        )
    )
    return result.durable


def download(reader: ObjectRead, prefix: str, directory: Path) -> None:
    """The step under ``prefix`` (its shards and ``.metadata``) into an empty ``directory``."""
    if directory.exists():
        shutil.rmtree(directory)
    directory.mkdir(parents=True)
    for key in reader.list_keys(prefix):
        name = key[len(prefix) :]
        if name and "/" not in name and name != COMMITTED:
            (directory / name).write_bytes(reader.get(key))


async def _follow_share(signal: Signal, store: ObjectPut, report: SaveReport) -> None:
    """Hand the guard every share reclaimd sends while the upload runs, on this loop."""
    last: Share | str | None = "unset"
    while True:
        share = signal.put_budget
        if share != last:
            _set_share(store, share)
            report.shares.append(share)
            last = share
        await asyncio.sleep(0.05)


def _set_share(store: ObjectPut, share: Share | None) -> None:
    setter = getattr(store, "set_put_budget", None)
    if callable(setter):
        setter(share)
