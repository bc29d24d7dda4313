"""The claim decision (reclaimd.cluster.claims.decide) and the claim's JSON form."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from reclaimd.cluster.claims import Claim, ClaimStatus, NodeObj, Phase, decide
from reclaimd.model import Notice, NoticeKind, ParseError, Target

NOW = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
LEASE_S = 20.0
NODE = NodeObj("gpu-1")


def notice(nid: str, deadline_s: float | None) -> Notice:
    return Notice(id=nid, source="t", kind=NoticeKind.SPOT_INTERRUPTION,
                  target=Target(node_name="gpu-1"), issued_at=NOW,
                  deadline=NOW + timedelta(seconds=deadline_s) if deadline_s is not None
                  else None, received_at=NOW)


def claim(nid: str, *, holder: str = "b", deadline_s: float | None = 120,
          phase: Phase = Phase.CLAIMED, heartbeat_age_s: float = 0) -> Claim:
    return Claim(target=NODE, notice_id=nid,
                 deadline=NOW + timedelta(seconds=deadline_s) if deadline_s is not None
                 else None, holder=holder, phase=phase, claimed_at=NOW - timedelta(minutes=1),
                 heartbeat_at=NOW - timedelta(seconds=heartbeat_age_s))


@pytest.mark.parametrize(
    ("existing", "incoming", "status"),
    [
        (None, notice("n1", 120), ClaimStatus.CLAIMED),
        (claim("n1", holder="a"), notice("n1", 120), ClaimStatus.ALREADY_OURS),
        (claim("n1"), notice("n1", 120), ClaimStatus.DUPLICATE),
        (claim("n1", heartbeat_age_s=LEASE_S + 1), notice("n1", 120), ClaimStatus.TAKEN_OVER),
        (claim("n1", holder="a", phase=Phase.DONE), notice("n1", 120), ClaimStatus.DUPLICATE),
        (claim("n1", deadline_s=60), notice("n2", 120), ClaimStatus.SUPERSEDED),
        (claim("n1", deadline_s=120), notice("n2", 120), ClaimStatus.SUPERSEDED),
        (claim("n1", deadline_s=120), notice("n2", 30), ClaimStatus.CLAIMED),
        (claim("n1", deadline_s=None), notice("n2", 120), ClaimStatus.CLAIMED),
        (claim("n1", deadline_s=None), notice("n2", None), ClaimStatus.SUPERSEDED),
        (claim("n1", deadline_s=60), notice("n2", None), ClaimStatus.SUPERSEDED),
        (claim("n1", phase=Phase.DONE), notice("n2", 120), ClaimStatus.CLAIMED),
        # Past its deadline with a dead holder: abandoned, the new notice takes the node.
        (claim("n1", deadline_s=-5, heartbeat_age_s=LEASE_S + 1), notice("n2", 120),
         ClaimStatus.CLAIMED),
        # Past its deadline but its holder is still finishing (ledger): leave it be.
        (claim("n1", deadline_s=-5), notice("n2", 120), ClaimStatus.SUPERSEDED),
    ],
)
def test_decide(existing: Claim | None, incoming: Notice, status: ClaimStatus) -> None:
    assert decide(existing, incoming, "a", NOW, LEASE_S) is status


def test_claim_round_trips_through_the_annotation() -> None:
    original = claim("n1", phase=Phase.SIGNALED)
    text = json.dumps(original.to_json())
    assert Claim.from_json(NODE, text) == original


@pytest.mark.parametrize("text", ["not json", "[]", '{"notice_id": "x"}',
                                  '{"notice_id":"x","holder":"h","phase":"nope",'
                                  '"claimed_at":"2026-05-01T12:00:00Z"}'])
def test_unreadable_claims_are_one_line_parse_errors(text: str) -> None:
    with pytest.raises(ParseError) as e:
        Claim.from_json(NODE, text)
    assert "\n" not in str(e.value) and "node/gpu-1" in str(e.value)
