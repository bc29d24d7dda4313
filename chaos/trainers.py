"""A fleet of fake trainers speaking the checkpoint contract through ``reclaimd_trainer.server``.

Each rank gets its own ``CheckpointServer`` on loopback (kwok pod IPs are not routable, so a
pod's ``checkpoint-url`` names the trainer's loopback port directly). A behaviour decides how
long the save takes and whether it fails, hangs or lands durably; every request is recorded so
a test or a drill can check that every rank was asked, with which traceparent, and when.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import datetime

from reclaimd.model import utcnow
from reclaimd_trainer.server import CheckpointRequest, CheckpointResult, CheckpointServer


@dataclass(frozen=True)
class Behaviour:
    ack_latency_s: tuple[float, float] = (0.05, 0.2)  # uniform range
    fail: bool = False  # answer 500
    hang: bool = False  # never finish: reclaimd's budget must cut it off
    durable: bool = True


class FakeTrainer:
    def __init__(self, key: str, behaviour: Behaviour, rng: random.Random) -> None:
        self.key = key
        self.behaviour = behaviour
        self._rng = rng
        self.server = CheckpointServer(self._save, host="127.0.0.1", port=0)

    async def _save(self, request: CheckpointRequest) -> CheckpointResult:
        b = self.behaviour
        if b.hang:
            await asyncio.Event().wait()
        await asyncio.sleep(self._rng.uniform(*b.ack_latency_s))
        if b.fail:
            raise RuntimeError("disk full")
        # The state is taken when the request arrives; the save takes the latency above.
        return CheckpointResult(
            checkpoint_time=request.received_at,
            step=1000,
            uri=f"s3://ckpt/checkpoints/{self.key}/{request.notice_id}" if b.durable else "",
            durable=b.durable,
        )

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def requests(self) -> list[CheckpointRequest]:
        return list(self.server.requests)


class TrainerFleet:
    """``async with TrainerFleet() as fleet: url = await fleet.add("ns/pod", Behaviour())``."""

    def __init__(self, seed: int = 0) -> None:
        self._rng = random.Random(seed)
        self.trainers: dict[str, FakeTrainer] = {}

    async def add(self, key: str, behaviour: Behaviour | None = None) -> str:
        trainer = FakeTrainer(key, behaviour or Behaviour(), self._rng)
        await trainer.server.start()
        self.trainers[key] = trainer
        return trainer.url

    def __getitem__(self, key: str) -> FakeTrainer:
        return self.trainers[key]

    def __iter__(self) -> Iterator[FakeTrainer]:
        return iter(self.trainers.values())

    def asked(self, notice_id: str) -> set[str]:
        """Keys of the trainers that received a request for ``notice_id``."""
        return {t.key for t in self if any(r.notice_id == notice_id for r in t.requests)}

    async def close(self) -> None:
        await asyncio.gather(*(t.server.stop() for t in self), return_exceptions=True)

    async def __aenter__(self) -> TrainerFleet:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


# --- drills: ranks with a planned behaviour and a record of every save ---------------------


@dataclass(frozen=True)
class SaveRecord:
    """What one rank did with one notice's request: the drill's ground truth for the ack."""

    notice_id: str
    received_at: datetime
    deadline: datetime  # when reclaimd said it stops waiting for this rank
    finished_at: datetime | None  # None: never (a hanging rank)
    saved: bool  # finished without error
    durable: bool
    checkpoint_time: datetime | None


class ScriptedTrainer(FakeTrainer):
    """A drill's rank: the latency is fixed by the scenario's plan (seeded), not drawn at
    request time, so a drill replays the same way; every save is kept in ``saves``."""

    def __init__(
        self, key: str, *, latency_s: float, fail: bool, hang: bool, durable: bool
    ) -> None:
        behaviour = Behaviour(
            ack_latency_s=(latency_s, latency_s), fail=fail, hang=hang, durable=durable
        )
        super().__init__(key, behaviour, random.Random(0))
        self.saves: dict[str, SaveRecord] = {}

    async def _save(self, request: CheckpointRequest) -> CheckpointResult:
        b = self.behaviour
        record = SaveRecord(
            notice_id=request.notice_id,
            received_at=request.received_at,
            deadline=request.deadline,
            finished_at=None,
            saved=False,
            durable=False,
            checkpoint_time=None,
        )
        self.saves[request.notice_id] = record
        try:
            result = await super()._save(request)
        except Exception:
            self.saves[request.notice_id] = replace(record, finished_at=utcnow())
            raise
        self.saves[request.notice_id] = replace(
            record,
            finished_at=utcnow(),
            saved=True,
            durable=b.durable,
            checkpoint_time=result.checkpoint_time,
        )
        return result


async def add_trainer(fleet: TrainerFleet, trainer: FakeTrainer) -> str:
    """Start ``trainer`` and let ``fleet`` own it (and close it); returns its checkpoint URL."""
    await trainer.server.start()
    fleet.trainers[trainer.key] = trainer
    return trainer.url
