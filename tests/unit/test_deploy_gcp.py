"""deploy/gcp's sink filter against the sample LogEntries: what reclaimd acts on passes, the rest
does not (no Cloud Logging emulator exists; see tests/unit/logging_filter.py)."""

from __future__ import annotations

import base64
import copy
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from logging_filter import compile_filter
from shared_fixtures import FIXTURES

from reclaimd.handlers.pubsub import parser as gke_preemption
from reclaimd.model import Ignored, Windows

GCP_DIR = Path(__file__).resolve().parents[2] / "deploy" / "gcp"
FILTER = (GCP_DIR / "preemption-filter.txt").read_text()
PREEMPTED = "preempted-logentry.json"
MATCHING = [
    PREEMPTED,
    "terminate-on-host-maintenance-logentry.json",
    "migrate-on-host-maintenance-logentry.json",
]


def entry(name: str) -> dict[str, Any]:
    loaded = json.loads((FIXTURES / "gcp" / name).read_text())
    assert isinstance(loaded, dict)
    return loaded


def variant(name: str, path: str, value: str) -> dict[str, Any]:
    changed = copy.deepcopy(entry(name))
    *parents, leaf = path.split(".")
    node = changed
    for part in parents:
        node = node[part]
    node[leaf] = value
    return changed


def reclaimd_acts(log_entry: dict[str, Any]) -> bool:
    outcome = gke_preemption.parse(
        json.dumps(log_entry).encode(), received_at=datetime.now(UTC), windows=Windows()
    )
    return not isinstance(outcome, Ignored)


UNRELATED = {
    "host-error": variant(PREEMPTED, "protoPayload.methodName", "compute.instances.hostError"),
    "guest-terminate": variant(
        PREEMPTED, "protoPayload.methodName", "compute.instances.guestTerminate"
    ),
    "automatic-restart": variant(
        PREEMPTED, "protoPayload.methodName", "compute.instances.automaticRestart"
    ),
    "user-stop": variant(PREEMPTED, "protoPayload.methodName", "v1.compute.instances.stop"),
    "not-an-instance": variant(PREEMPTED, "resource.type", "gce_disk"),
    "other-service": variant(PREEMPTED, "protoPayload.serviceName", "container.googleapis.com"),
}


@pytest.mark.parametrize("name", MATCHING)
def test_preemption_and_maintenance_entries_match(name: str) -> None:
    log_entry = entry(name)
    assert reclaimd_acts(log_entry)
    assert compile_filter(FILTER)(log_entry)


def test_entry_as_the_sink_publishes_it_matches() -> None:
    envelope = entry("preempted-pubsub-push-envelope.json")
    published = json.loads(base64.b64decode(envelope["message"]["data"]))
    assert compile_filter(FILTER)(published)


@pytest.mark.parametrize("method", sorted(gke_preemption.METHODS))
def test_every_handled_method_passes(method: str) -> None:
    assert compile_filter(FILTER)(variant(PREEMPTED, "protoPayload.methodName", method))


@pytest.mark.parametrize("name", sorted(UNRELATED))
def test_unrelated_entries_do_not_match(name: str) -> None:
    log_entry = UNRELATED[name]
    assert not compile_filter(FILTER)(log_entry)
    if name in {"host-error", "guest-terminate", "automatic-restart", "user-stop"}:
        assert not reclaimd_acts(log_entry), f"{name}: reclaimd acts on it; the filter drops it"


def test_evaluator_follows_logging_precedence() -> None:
    # OR binds tighter than AND in the Logging query language.
    matches = compile_filter('a="1" AND b="2" OR b="3"')
    assert matches({"a": "1", "b": "3"})
    assert not matches({"a": "0", "b": "2"})
    assert not matches({"b": "3"})
    assert compile_filter('(a.b="x" OR a.b="y") AND c="z"')({"a": {"b": "y"}, "c": "z"})


@pytest.mark.parametrize(
    "text", ['NOT a="1"', 'a:"1"', 'a="1" b="2"', "a=1", 'a="1" AND', '(a="1"', 'a>"1"']
)
def test_evaluator_refuses_what_it_does_not_evaluate(text: str) -> None:
    with pytest.raises(ValueError):
        compile_filter(text)
