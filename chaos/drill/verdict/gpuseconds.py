"""The GPU-seconds rule, recomputed from ground truth (``reclaimd.waste``, ARCHITECTURE §5),
never from reclaimd's own numbers."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from chaos.drill.verdict.facts import GangFacts

# --- GPU-seconds: the rule, from ground truth ------------------------------------------------


def expected_gpu_seconds(gang: GangFacts, stopped: datetime) -> tuple[float, float]:
    """(low, high) GPU-seconds lost by ``gang`` when its ranks stopped at ``stopped``.

    A rank's clock starts at the latest of its annotated checkpoint, its pod's start and every
    durable checkpoint reclaimd got an ack for in time before the stop: the charging notice's,
    or an earlier one's (a rebalance recommendation's checkpoint is just as good). The two values
    differ only when an ack raced reclaimd's budget: low counts such acks, high does not.
    """
    leader = next((r for r in gang.ranks if r.leader and r.opted_in), None)
    if gang.scope == "leader" and leader is None:
        opted = [r for r in gang.ranks if r.opted_in]
        leader = min(opted, key=lambda r: r.rank) if opted else None
    low = high = 0.0
    for rank in gang.ranks:
        speaker = leader if gang.scope == "leader" else rank
        sure: list[datetime] = [t for t in (rank.annotated_checkpoint, rank.started_at) if t]
        maybe: list[datetime] = []
        for save in speaker.saves.values() if speaker is not None else ():
            t = save.checkpoint_time
            if t is None or t > stopped:
                continue
            counted = save.counted()
            if counted is True:
                sure.append(t)
            elif counted is None:
                maybe.append(t)
        low += _lost(rank.gpus, [*sure, *maybe], stopped)
        high += _lost(rank.gpus, sure, stopped)
    return low, high


def _lost(gpus: int, starts: Sequence[datetime], stopped: datetime) -> float:
    if not starts:
        return 0.0  # no known start: the ledger counts zero rather than invent one
    return gpus * max(0.0, (stopped - max(starts)).total_seconds())
