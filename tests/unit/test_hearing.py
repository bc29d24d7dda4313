"""A source is deaf when its receives have failed for longer than a few rounds: not one blip,
not a quiet topic. /readyz names each deaf central source, and ``reclaimd_transport_deaf``
says the same (the stack's replicas: tests/e2e/test_hearing.py)."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import pytest
from prometheus_client import CollectorRegistry

from reclaimd import health, metrics
from reclaimd.handlers import running
from reclaimd.handlers.transport import DEAF_AFTER_FAILURES, DEAF_AFTER_S, Counters


@dataclass
class FakeSource:
    counters: Counters = field(default_factory=Counters)

    async def run(self) -> None:
        return None


def test_failures_make_a_source_deaf_only_past_a_few_rounds() -> None:
    c = Counters()
    start = time.monotonic()
    assert not c.deaf(start + 3600)  # quiet, never failed: hearing (a quiet topic is no fault)
    for _ in range(DEAF_AFTER_FAILURES - 1):
        c.failed("QueueDoesNotExist: gone")
    assert not c.deaf(start + 3600)  # too few rounds, however long
    c.failed("QueueDoesNotExist: gone")
    assert c.failing_s(start + DEAF_AFTER_S - 1) > 0
    assert not c.deaf(start + DEAF_AFTER_S - 1)  # a burst of failures, not yet long
    assert c.deaf(start + DEAF_AFTER_S + 1)
    assert c.problem == "QueueDoesNotExist: gone"
    c.heard()  # one receive that works: hearing again
    assert not c.deaf(time.monotonic() + 3600) and c.failing_s() == 0 and c.problem == ""
    assert c.last_receive > 0


def test_readiness_names_each_deaf_central_source() -> None:
    sqs, kueue = FakeSource(), FakeSource()
    agent = FakeSource()  # a node agent's deafness is its own node's, not a replica's
    for c in (sqs.counters, agent.counters):
        for _ in range(DEAF_AFTER_FAILURES):
            c.failed("refused")
        c._ok_at -= DEAF_AFTER_S + 1
    sources = {"sqs": sqs, "kueue": kueue, "imds": agent}
    checks = running.hearing(sources)
    assert set(checks) == {"sqs", "kueue"}
    ready = health.Readiness({"cache": lambda: True, **checks})
    assert not ready() and ready.last_failing == ("sqs",)
    sqs.counters.heard()
    assert ready()


def test_the_metric_says_what_readiness_says() -> None:
    deaf, fine = FakeSource(), FakeSource()
    for _ in range(DEAF_AFTER_FAILURES):
        deaf.counters.failed("NotFound")
    deaf.counters._ok_at -= DEAF_AFTER_S + 1
    fine.counters.heard()
    m = metrics.Metrics(CollectorRegistry())
    m.bind(transports={"pubsub": deaf.counters, "sqs": fine.counters})
    got = {
        (s.name, s.labels["transport"]): s.value
        for family in m.registry.collect()
        for s in family.samples
        if s.name.startswith("reclaimd_transport_") and "transport" in s.labels
    }
    assert got[("reclaimd_transport_deaf", "pubsub")] == 1.0
    assert got[("reclaimd_transport_deaf", "sqs")] == 0.0
    assert got[("reclaimd_transport_failing_seconds", "pubsub")] > DEAF_AFTER_S
    assert got[("reclaimd_transport_last_receive_timestamp_seconds", "pubsub")] == 0.0
    assert got[("reclaimd_transport_last_receive_timestamp_seconds", "sqs")] > 1e9


def test_turning_deaf_is_logged_once_with_why(caplog: pytest.LogCaptureFixture) -> None:
    sqs = FakeSource()
    check = running.hearing({"sqs": sqs})["sqs"]
    for _ in range(DEAF_AFTER_FAILURES):
        sqs.counters.failed("QueueDoesNotExist: The specified queue does not exist.")
    sqs.counters._ok_at -= DEAF_AFTER_S + 1
    with caplog.at_level(logging.ERROR, logger="reclaimd.handlers.running"):
        assert [check(), check(), check()] == [False, False, False]
    said = [r for r in caplog.records if r.getMessage() == "source cannot hear"]
    assert len(said) == 1, said
    fields = said[0].__dict__["fields"]
    assert fields["source"] == "sqs" and fields["problem"].startswith("QueueDoesNotExist")
    sqs.counters.heard()
    assert check()
