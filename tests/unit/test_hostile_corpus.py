"""The fuzz bench's corpus, small, against the parsers: no crash, every outcome a Notice tuple,
an Ignored or a one-line ParseError, and no notice for a hostile identifier."""

from __future__ import annotations

import contextlib
import json
import random
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from chaos.bench import hostile
from reclaimd.handlers import ALIASES, PARSERS, ids
from reclaimd.handlers.azure_scheduled import parser as azure_scheduled
from reclaimd.model import Ignored, Notice, ParseError, Windows

RECEIVED = datetime(2025, 9, 16, 12, 0, tzinfo=UTC)
PER_SOURCE = 600
AZURE_FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "azure"
# What a notice's instance id must be: an Azure VM (``<scale set>_<n>``) for Azure's source,
# else the generic grammar (an EC2 id or a GCE name or number).
INSTANCE = {"azure-scheduled": azure_scheduled.VM_RESOURCE_NAME}


@pytest.mark.parametrize("source", hostile.SOURCES)
def test_every_hostile_payload_is_a_notice_an_ignored_or_a_parse_error(source: str) -> None:
    rng = random.Random(f"corpus/{source}")
    seen = {"notice": 0, "ignored": 0, "error": 0}
    for _ in range(PER_SOURCE):
        payload = hostile.message(source, rng)
        try:
            parser = PARSERS[ALIASES.get(source, source)]  # the rig names parsers so
            outcome = parser(payload, received_at=RECEIVED, windows=Windows())
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
            instance = INSTANCE.get(source, ids.CLOUD_INSTANCE)
            assert not t.instance_id or instance.matches(t.instance_id)
            assert not t.node_name or ids.K8S_NAME.matches(t.node_name)
            assert not t.provider_id or ids.PROVIDER_ID.matches(t.provider_id)
            if source == "azure-scheduled":
                # The VM the envelope names, and a providerID that names it too.
                assert t.instance_id
                if t.provider_id:
                    vm = azure_scheduled.provider_id(t.provider_id)
                    assert vm.name.lower() == t.instance_id.lower()
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
    assert isinstance(hostile.scheduled_events_body(rng), str)


def _azure_parse(envelope: dict[str, Any]) -> Any:
    return PARSERS["azure_scheduled"](
        json.dumps(envelope).encode(), received_at=RECEIVED, windows=Windows()
    )


def test_the_azure_bases_are_the_documented_shapes_and_parse() -> None:
    """Unbroken, each base is a document the parser reads: a notice for the VM for Preempt,
    Terminate, Reboot and Redeploy, Ignored for a Freeze and for no events; and each event
    has the keys of one of the documented examples (tests/fixtures/azure)."""
    documented = set()
    for path in AZURE_FIXTURES.glob("scheduledevents-*.json"):
        for event in json.loads(path.read_text())["Events"]:
            documented.add(frozenset(event))
    kinds: dict[str, int] = {}
    for envelope in hostile.bases("azure-scheduled"):
        for event in envelope["document"]["Events"]:
            assert frozenset(event) in documented, sorted(event)
        outcome = _azure_parse(envelope)
        if isinstance(outcome, Ignored):
            kinds["ignored"] = kinds.get("ignored", 0) + 1
            continue
        (notice,) = outcome
        assert notice.target.instance_id == hostile.AZURE_VM
        kinds[notice.attributes["event_type"]] = 1
    assert kinds == {"Preempt": 1, "Terminate": 1, "Reboot": 1, "Redeploy": 1, "ignored": 3}


def test_the_azure_corpus_reaches_every_outcome() -> None:
    rng = random.Random("corpus/azure-scheduled/outcomes")
    seen: set[str] = set()
    for _ in range(PER_SOURCE):
        try:
            outcome = PARSERS["azure_scheduled"](
                hostile.message("azure-scheduled", rng), received_at=RECEIVED, windows=Windows()
            )
        except ParseError:
            seen.add("error")
            continue
        seen.add("ignored" if isinstance(outcome, Ignored) else "notice")
    assert seen == {"error", "ignored", "notice"}


def test_a_hostile_scheduled_events_body_is_no_notice_for_the_vm_it_is_served_to() -> None:
    """What the fuzz bench's stand-in serves: text (servable as UTF-8) whose events name other
    VMs, so it is refused or ignored, never a notice for the daemon's node; most keep the
    incarnation they were given, so each answer is a new document to the poller."""
    rng = random.Random(7)
    kept = 0
    for i in range(400):
        body = hostile.scheduled_events_body(rng, incarnation=1000 + i)
        body.encode()  # no lone surrogate: a server can send it
        try:
            outcome = _azure_parse({"vm_name": "aks-fuzz-0f0f0f0f-vmss_0", "document": body})
        except ParseError:
            outcome = None
        assert outcome is None or isinstance(outcome, Ignored), outcome
        with contextlib.suppress(ValueError, TypeError, KeyError, RecursionError):
            kept += json.loads(body)["DocumentIncarnation"] == 1000 + i
    assert kept > 400 // 3, kept
