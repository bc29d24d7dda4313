"""The fuzz bench's corpus, small, against the parsers: no crash, every outcome a Notice tuple,
an Ignored or a one-line ParseError, and no notice for a hostile identifier."""

from __future__ import annotations

import random
from datetime import UTC, datetime

import pytest

from chaos import hostile
from handlers import PARSERS, ids
from reclaimd.model import Ignored, Notice, ParseError, Windows

RECEIVED = datetime(2025, 9, 16, 12, 0, tzinfo=UTC)
PER_SOURCE = 600


@pytest.mark.parametrize("source", hostile.SOURCES)
def test_every_hostile_payload_is_a_notice_an_ignored_or_a_parse_error(source: str) -> None:
    rng = random.Random(f"corpus/{source}")
    seen = {"notice": 0, "ignored": 0, "error": 0}
    for _ in range(PER_SOURCE):
        payload = hostile.message(source, rng)
        try:
            outcome = PARSERS[source](payload, received_at=RECEIVED, windows=Windows())
        except ParseError as e:
            assert "\n" not in str(e) and len(str(e)) < 400, str(e)[:200]
            seen["error"] += 1
            continue
        if isinstance(outcome, Ignored):
            seen["ignored"] += 1
            continue
        assert isinstance(outcome, tuple) and outcome
        for notice in outcome:
            assert isinstance(notice, Notice)
            t = notice.target
            # Whatever got through names only identifiers of the right grammar.
            assert not t.instance_id or ids.CLOUD_INSTANCE.matches(t.instance_id)
            assert not t.node_name or ids.K8S_NAME.matches(t.node_name)
            assert not t.provider_id or ids.PROVIDER_ID.matches(t.provider_id)
            assert Notice.from_json(notice.to_json()) == notice
        seen["notice"] += 1
    # The corpus is hostile: most of it is unreadable, and it reaches every outcome.
    assert seen["error"] > PER_SOURCE // 2, seen


def test_the_corpus_is_seeded() -> None:
    a = [hostile.message("ec2", random.Random(1)) for _ in range(3)]
    b = [hostile.message("ec2", random.Random(1)) for _ in range(3)]
    assert a == b


def test_sqs_text_keeps_only_characters_sqs_accepts() -> None:
    text = hostile.sqs_text(b'{"a": "\x00\x01\xff\xed\xa0\x80ok\t"}')
    assert "\x00" not in text and "\x01" not in text and "ok\t" in text


def test_the_http_answers_are_text() -> None:
    rng = random.Random(3)
    for path in ("spot/instance-action", "events/maintenance/scheduled"):
        assert isinstance(hostile.imds_body(path, rng), str)
    assert isinstance(hostile.metadata_value(rng), str)
    assert hostile.workload_status(rng)["conditions"][0]["message"]
