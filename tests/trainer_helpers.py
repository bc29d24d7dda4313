"""What the trainer tests share: a Spot interruption notice, a team-a JobSet gang, and the SDK's
round trip that the subprocess tests run."""

from __future__ import annotations

import textwrap
import uuid
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

from reclaimd.model import Gang, GangKey, Member, Notice, NoticeKind, Target, utcnow


def spot_notice(
    prefix: str,
    *,
    now: datetime | None = None,
    instance_id: str = "i-0abc",
    node_name: str = "n",
    window_s: float = 60,
    unique: bool = True,
) -> Notice:
    """A Spot interruption ``ec2-<prefix>[-<8 hex>]`` issued at ``now``, due ``window_s`` later."""
    now = utcnow() if now is None else now
    return Notice(
        id=f"ec2-{prefix}-{uuid.uuid4().hex[:8]}" if unique else f"ec2-{prefix}",
        source="ec2",
        kind=NoticeKind.SPOT_INTERRUPTION,
        target=Target(instance_id=instance_id, node_name=node_name),
        issued_at=now,
        deadline=now + timedelta(seconds=window_s),
        received_at=now,
    )


def jobset_gang(name: str, members: Iterable[Member]) -> Gang:
    """The gang of JobSet ``team-a/<name>`` with ``members`` in order."""
    return Gang(key=GangKey("jobset", "team-a", name), members=tuple(members))


# Program text, for the tests that run the SDK in a bare interpreter (test_trainer_dist,
# test_trainer_imports) once they imported it their own way: defines ``round_trip(sdk)``, one
# checkpoint request answered and acked, the loop's first step, /incarnation read back.
SDK_ROUND_TRIP = textwrap.dedent(
    """
    def round_trip(sdk):
        import json, threading, urllib.request
        from datetime import timedelta
        from reclaimd_trainer.times import rfc3339, utcnow
        with sdk.Signal(host="127.0.0.1", port=0) as signal:
            body = {"notice_id": "n-1", "deadline": rfc3339(utcnow() + timedelta(seconds=30))}
            def answer():
                signal.wait(10)
                signal.ack(sdk.CheckpointResult(utcnow(), step=7, uri="s3://b/k", durable=True))
            threading.Thread(target=answer).start()
            req = urllib.request.Request(signal.url, data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
            reply = json.loads(urllib.request.urlopen(req, timeout=10).read())
            signal.requested  # the loop's first step boundary
            where = signal.url + "/incarnation"
            seen = json.loads(urllib.request.urlopen(where, timeout=10).read())
        return {"reply": reply, "incarnation": seen}
    """
)


def check_round_trip(doc: Mapping[str, Any]) -> None:
    """What ``round_trip`` returned: the ack of the checkpoint, and the first step known."""
    assert doc["reply"]["step"] == 7 and doc["reply"]["durable"] is True
    assert doc["incarnation"]["first_step_at"] is not None
