"""Metrics without a daemon: what a report and an admission count, label bounds, the parts read at
scrape time, the documented names, and the /metrics, /healthz, /readyz server."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import aiohttp
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from chaos.ports import free_port
from reclaimd import health, metrics
from reclaimd.checkpoint import NOT_OPTED_IN
from reclaimd.intake import Admission
from reclaimd.ledger.labels import LabelPolicy
from reclaimd.model import (
    CheckpointOutcome,
    Gang,
    GangKey,
    Member,
    Notice,
    NoticeKind,
    RankAck,
    RestartWaste,
    Target,
    frozen_map,
)
from reclaimd.pipeline import Report
from reclaimd.sourcing import Slot
from reclaimd.transports import Counters
from reclaimd.transports.pubsub import SlottedPubSubSource
from reclaimd_trainer.s3 import PutCounters

DOCS = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"
T0 = datetime(2025, 1, 1, 12, 0, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def spot(source: str = "aws.ec2.spot", nid: str = "n-1") -> Notice:
    return Notice(
        id=nid,
        source=source,
        kind=NoticeKind.SPOT_INTERRUPTION,
        target=Target(instance_id="i-1"),
        issued_at=T0,
        deadline=at(120),
        received_at=at(0.5),
    )


def member(name: str, rank: int) -> Member:
    return Member(namespace="ml", name=name, uid=f"u-{name}", node="gpu-0", gpus=8, rank=rank)


def gang(name: str, labels: Mapping[str, str], *members: Member) -> Gang:
    return Gang(key=GangKey("jobset", "ml", name), members=members, labels=frozen_map(labels))


def waste(n: Notice, g: Gang, gpu_s: float, outcome: CheckpointOutcome, met: bool) -> RestartWaste:
    return RestartWaste(
        event_id=f"e-{g.key.name}",
        notice=n,
        gang=g,
        gpu_seconds_lost=gpu_s,
        stopped_at=at(30),
        last_good_checkpoint=at(-600),
        outcome=outcome,
        deadline_met=met,
    )


def report(n: Notice | None = None, *, met: bool = True) -> Report:
    n = n or spot()
    llm = gang(
        "llm",
        {"tenant": "team-a", "queue": "research", "sku": "p5.48xlarge", "purchase_option": "spot"},
        member("llm-0", 0),
        member("llm-1", 1),
    )
    solo = gang("solo", {"tenant": "team-a", "queue": "eval", "prompt": "secret"}, member("s", 0))
    r = Report(n)
    r.mark("received", n.received_at)
    for step, s in [("claimed", 0.52), ("resolved", 0.53), ("cordoned", 0.6)]:
        r.mark(step, at(s))
    r.mark("signaled", at(3.0))
    r.mark("drained", at(30.0) if met else at(125.0))
    r.mark("recorded", at(30.1))
    r.acks[llm.key] = (
        RankAck(llm.members[0], acked=True, durable=True, latency_s=1.5),
        RankAck(llm.members[1], acked=True, durable=False, latency_s=2.0),
    )
    r.acks[solo.key] = (RankAck(solo.members[0], acked=False, error=NOT_OPTED_IN),)
    r.evictions = {"ml/llm-0": "evicted", "ml/llm-1": "evicted", "ml/s": "deleted"}
    r.wastes = [
        waste(n, llm, 9600.0, CheckpointOutcome.NOT_DURABLE, met),
        waste(n, solo, 4800.0, CheckpointOutcome.NOT_OPTED_IN, met),
    ]
    return r


Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def samples(m: metrics.Metrics) -> Samples:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in m.registry.collect()
        for s in family.samples
    }


def value(got: Samples, name: str, **labels: str) -> float:
    return got.get((name, frozenset(labels.items())), 0.0)


# --- observed -----------------------------------------------------------------------------


def test_a_report_counts_steps_acks_evictions_and_waste() -> None:
    m = metrics.Metrics(CollectorRegistry())
    m.observe_report(report())
    got = samples(m)
    src = {"source": "aws.ec2.spot"}
    kind = "spot_interruption"
    assert value(got, "reclaimd_notices_handled_total", **src, kind=kind, response="full") == 1
    assert value(got, "reclaimd_notice_receipt_lag_seconds_sum", **src) == pytest.approx(0.5)
    assert value(got, "reclaimd_notice_step_seconds_sum", **src, step="cordoned") == pytest.approx(
        0.1
    )
    assert value(got, "reclaimd_notice_step_seconds_sum", **src, step="drained") == pytest.approx(
        29.5
    )
    # 0.1 s to cordon falls in the 0.1 bucket, not the 0.05 one
    assert value(got, "reclaimd_notice_step_seconds_bucket", **src, step="cordoned", le="0.1") == 1
    assert value(got, "reclaimd_notice_step_seconds_bucket", **src, step="cordoned", le="0.05") == 0
    assert value(got, "reclaimd_deadline_misses_total", **src, kind=kind) == 0
    assert value(got, "reclaimd_deadline_margin_seconds_sum", **src) == pytest.approx(90.0)
    assert value(got, "reclaimd_checkpoint_rank_acks_total", result="durable") == 1
    assert value(got, "reclaimd_checkpoint_rank_acks_total", result="not_durable") == 1
    assert value(got, "reclaimd_checkpoint_rank_acks_total", result="not_opted_in") == 1
    assert value(got, "reclaimd_checkpoint_ack_seconds_sum") == pytest.approx(3.5)
    assert value(got, "reclaimd_evictions_total", outcome="evicted") == 2
    assert value(got, "reclaimd_evictions_total", outcome="deleted") == 1
    assert value(got, "reclaimd_checkpoint_outcomes_total", outcome="not_durable") == 1
    assert value(got, "reclaimd_restart_waste_events_total", deadline_met="true") == 2
    labels = {"tenant": "team-a", "queue": "research", "sku": "p5.48xlarge", "cell": ""}
    assert value(
        got, "reclaimd_restart_waste_gpu_seconds_total", **labels, purchase_option="spot"
    ) == pytest.approx(9600.0)
    # the solo gang's refused "prompt" label never shows; its absent ones are empty
    solo = {"tenant": "team-a", "queue": "eval", "sku": "", "cell": "", "purchase_option": ""}
    assert value(got, "reclaimd_restart_waste_gpu_seconds_total", **solo) == pytest.approx(4800.0)
    assert not any("secret" in v for _, ls in got for _, v in ls)


def test_a_late_drain_is_a_miss_with_no_margin() -> None:
    m = metrics.Metrics(CollectorRegistry())
    m.observe_report(report(met=False))
    got = samples(m)
    src = {"source": "aws.ec2.spot"}
    assert value(got, "reclaimd_deadline_misses_total", **src, kind="spot_interruption") == 1
    assert value(got, "reclaimd_deadline_margin_seconds_sum", **src) == 0.0
    assert value(got, "reclaimd_deadline_margin_seconds_bucket", **src, le="0.005") == 1
    assert value(got, "reclaimd_restart_waste_events_total", deadline_met="false") == 2


def test_admissions_by_source_kind_and_admission() -> None:
    m = metrics.Metrics(CollectorRegistry())
    m.observe_admission(spot(), Admission.CLAIMED)
    m.observe_admission(spot(), Admission.DUPLICATE)
    m.observe_admission(spot("kafka://drills/producer-42"), Admission.CLAIMED)
    got = samples(m)
    name = "reclaimd_notices_admitted_total"
    kind = "spot_interruption"
    assert value(got, name, source="aws.ec2.spot", kind=kind, admission="claimed") == 1
    assert value(got, name, source="aws.ec2.spot", kind=kind, admission="duplicate") == 1
    assert value(got, name, source="kafka", kind=kind, admission="claimed") == 1


# --- label bounds -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "label"),
    [
        ("aws.ec2.spot", "aws.ec2.spot"),
        ("gcp.compute.preempted", "gcp.compute.preempted"),
        ("kueue.workload", "kueue.workload"),
        ("kafka://anything/a producer says", "kafka"),
        ("Not A Source!", "other"),
        ("a." * 30, "other"),
    ],
)
def test_source_labels_are_bounded(source: str, label: str) -> None:
    assert metrics.source_label(source) == label


def test_too_many_distinct_cost_values_become_other() -> None:
    m = metrics.Metrics(CollectorRegistry(), max_values_per_label=3)
    for i in range(5):
        r = report(spot(nid=f"n-{i}"))
        r.wastes = [
            waste(
                r.notice, gang(f"g{i}", {"tenant": f"t{i}"}), 10.0, CheckpointOutcome.NO_ACK, True
            )
        ]
        m.observe_report(r)
    got = samples(m)
    tenants = {
        dict(ls)["tenant"]: v
        for (name, ls), v in got.items()
        if name == "reclaimd_restart_waste_gpu_seconds_total"
    }
    assert tenants == {"t0": 10.0, "t1": 10.0, "t2": 10.0, "other": 20.0}
    assert value(got, "reclaimd_metric_label_overflow_total", label="tenant") == 2


def test_cost_labels_follow_the_ledger_allowlist_and_value_rules() -> None:
    m = metrics.Metrics(CollectorRegistry(), label_policy=LabelPolicy(("queue",)))
    r = report()
    long_queue = "q" * 64  # over the 63-character limit of a label value
    r.wastes = [
        waste(
            r.notice,
            gang("g", {"tenant": "team-a", "queue": long_queue}),
            1.0,
            CheckpointOutcome.NO_ACK,
            True,
        ),
        waste(
            r.notice,
            gang("h", {"tenant": "team-a", "queue": "ok"}),
            2.0,
            CheckpointOutcome.NO_ACK,
            True,
        ),
    ]
    m.observe_report(r)
    got = samples(m)
    rows = {
        tuple(sorted(dict(ls).items())): v
        for (name, ls), v in got.items()
        if name == "reclaimd_restart_waste_gpu_seconds_total"
    }
    empty = {"tenant": "", "sku": "", "cell": "", "purchase_option": ""}
    assert rows == {
        tuple(sorted({**empty, "queue": ""}.items())): 1.0,  # too long: dropped
        tuple(sorted({**empty, "queue": "ok"}.items())): 2.0,  # tenant not allowed: empty
    }


def test_eviction_outcomes_are_words() -> None:
    m = metrics.Metrics(CollectorRegistry())
    r = report()
    r.evictions = {"ml/a": "left-to-scheduler", "ml/b": "a sentence, with spaces"}
    m.observe_report(r)
    got = samples(m)
    assert value(got, "reclaimd_evictions_total", outcome="left-to-scheduler") == 1
    assert value(got, "reclaimd_evictions_total", outcome="other") == 1


# --- bound parts --------------------------------------------------------------------------


@dataclass
class FakeLedger:
    published: int = 7
    publish_errors: int = 2
    waiting: int = 3
    oldest_s: float = 42.5

    def depth(self) -> int:
        return self.waiting

    def oldest_age_s(self) -> float:
        return self.oldest_s


@dataclass
class FakeRestarts:
    looks: int = 5
    recorded: int = 1


@dataclass
class FakeRunbook:
    taken_over: int = 2
    fenced: int = 1


@dataclass
class FakeMeter:
    hours_closed: int = 3
    last_closed_hour_end: float = 1_772_370_000.0


@dataclass
class FakePuts:
    total: PutCounters = field(default_factory=PutCounters)

    def counters(self, identity: str | None = None) -> PutCounters:
        return self.total


def test_bound_parts_are_read_at_scrape_time() -> None:
    m = metrics.Metrics(CollectorRegistry())
    ledger = FakeLedger()
    puts = FakePuts(PutCounters(puts=10, attempts=14, throttled_waits=5, retries=4, failed=1))
    sqs = Counters(received=4, acked=3, left_for_redelivery=1, parse_errors=1)
    sqs.admitted(Admission.CLAIMED)
    sqs.admitted(Admission.RETRY)
    waiting, held = [0], [-1]
    watcher = FakeRestarts()
    book, hours = FakeRunbook(), FakeMeter()
    m.bind(
        ledger=ledger,
        label_drops=lambda: {"refused_key": 2},
        puts=puts,
        kube_waiting=lambda: waiting[0],
        kube_throttled=lambda: 9,
        transports={"sqs": sqs},
        scheduler_depth=lambda: 1,
        slots={"pubsub": Slot(SlottedPubSubSource.slot_help, lambda: held[0])},
        restarts=watcher,
        runbook=book,
        meter=hours,
    )
    got = samples(m)
    assert value(got, "reclaimd_ledger_outbox_depth") == 3
    assert value(got, "reclaimd_ledger_published_total") == 7
    assert value(got, "reclaimd_ledger_publish_failures_total") == 2
    assert value(got, "reclaimd_ledger_outbox_oldest_age_seconds") == 42.5
    assert value(got, "reclaimd_notices_taken_over_total") == 2
    assert value(got, "reclaimd_notices_fenced_total") == 1
    assert value(got, "reclaimd_meter_hours_closed_total") == 3
    assert value(got, "reclaimd_meter_last_closed_hour_end_timestamp_seconds") == 1_772_370_000
    assert value(got, "reclaimd_ledger_labels_dropped_total", reason="refused_key") == 2
    assert value(got, "reclaimd_objectstore_put_requests_total") == 10
    assert value(got, "reclaimd_objectstore_put_throttled_total") == 5
    assert value(got, "reclaimd_objectstore_put_retries_total") == 4
    assert value(got, "reclaimd_objectstore_put_failures_total") == 1
    assert value(got, "reclaimd_kube_writes_throttled_total") == 9
    assert value(got, "reclaimd_transport_received_total", transport="sqs") == 4
    assert value(got, "reclaimd_transport_redeliveries_total", transport="sqs") == 1
    assert value(got, "reclaimd_transport_parse_errors_total", transport="sqs") == 1
    assert (
        value(got, "reclaimd_transport_admissions_total", transport="sqs", admission="retry") == 1
    )
    assert value(got, "reclaimd_scheduler_depth") == 1
    assert value(got, "reclaimd_pubsub_slot") == -1  # waiting for a slot
    assert value(got, "reclaimd_restart_looks_total") == 5
    assert value(got, "reclaimd_restart_overhead_events_total") == 1
    # a later scrape sees the parts as they are then
    ledger.waiting, ledger.oldest_s, waiting[0], held[0] = 0, 0.0, 12, 1
    book.fenced, hours.hours_closed = 2, 4
    puts.total.retries = 40
    watcher.looks += 2
    got = samples(m)
    assert value(got, "reclaimd_ledger_outbox_depth") == 0
    assert value(got, "reclaimd_kube_writes_waiting") == 12
    assert value(got, "reclaimd_pubsub_slot") == 1
    assert value(got, "reclaimd_objectstore_put_retries_total") == 40
    assert value(got, "reclaimd_restart_looks_total") == 7
    assert value(got, "reclaimd_ledger_outbox_oldest_age_seconds") == 0
    assert value(got, "reclaimd_notices_fenced_total") == 2
    assert value(got, "reclaimd_meter_hours_closed_total") == 4


def test_every_put_counter_has_a_metric() -> None:
    assert set(metrics._PUT_FIELDS) == set(PutCounters.__dataclass_fields__)
    # by_admission is its own family; the hearing fields are read by the _HEARING gauges
    hearing = {"last_receive", "failures", "problem", "_ok_at"}
    assert set(metrics._TRANSPORT_FIELDS) | {"by_admission"} | hearing == set(
        Counters.__dataclass_fields__
    )


def test_unbound_parts_have_no_series() -> None:
    names = {name for name, _ in samples(metrics.Metrics(CollectorRegistry()))}
    bound = (
        "reclaimd_ledger_",
        "reclaimd_objectstore_",
        "reclaimd_restart_looks",
        "reclaimd_notices_taken_over",
        "reclaimd_notices_fenced",
        "reclaimd_meter_",
    )
    assert not any(n.startswith(bound) for n in names)


# --- names and docs -----------------------------------------------------------------------


def all_families() -> dict[str, tuple[str, tuple[str, ...]]]:
    """Every reclaimd family with everything bound: name -> (type, label names)."""
    m = metrics.Metrics(CollectorRegistry())
    m.bind(
        ledger=FakeLedger(),
        label_drops=lambda: {"bad_value": 1},
        puts=FakePuts(),
        kube_waiting=lambda: 0,
        kube_throttled=lambda: 0,
        transports={"sqs": Counters(by_admission={"claimed": 1})},
        scheduler_depth=lambda: 0,
        slots={"pubsub": Slot("a slot", lambda: 0)},
        restarts=FakeRestarts(),
        runbook=FakeRunbook(),
        meter=FakeMeter(),
    )
    m.observe_report(report())
    m.observe_report(report(spot(nid="late"), met=False))
    m.observe_admission(spot(), Admission.CLAIMED)
    m.label_overflow.labels("tenant")
    out = {}
    for family in m.registry.collect():
        if not family.name.startswith("reclaimd_"):
            continue
        labels = {k for s in family.samples for k in s.labels if k not in ("le",)}
        name = family.name + ("_total" if family.type == "counter" else "")
        out[name] = (family.type, tuple(sorted(labels)))
    return out


def documented() -> dict[str, tuple[str, tuple[str, ...]]]:
    """The table rows of docs/metrics.md: | `name` | type | `label`, ... | help |"""
    out = {}
    for line in DOCS.read_text().splitlines():
        m = re.match(r"\|\s*`(reclaimd_[a-z_]+)`\s*\|\s*(\w+)\s*\|([^|]*)\|", line)
        if m:
            labels = tuple(sorted(re.findall(r"`([a-z_]+)`", m.group(3))))
            out[m.group(1)] = (m.group(2), labels)
    return out


def test_every_metric_is_documented_with_its_type_and_labels() -> None:
    assert all_families() == documented()


def test_label_names_are_fixed_and_few() -> None:
    for name, (_, labels) in all_families().items():
        assert len(labels) <= 5, name
        assert not {"pod", "node", "notice_id", "gang", "namespace"} & set(labels), name


# --- serving ------------------------------------------------------------------------------


async def get(url: str, accept: str = "") -> tuple[int, str, str]:
    headers = {"Accept": accept} if accept else {}
    async with aiohttp.ClientSession() as session, session.get(url, headers=headers) as r:
        return r.status, r.headers.get("Content-Type", ""), await r.text()


async def test_serve_metrics_health_and_readiness() -> None:
    m = metrics.Metrics()
    m.observe_admission(spot(), Admission.CLAIMED)
    state = {"synced": False}

    def broken() -> bool:
        raise OSError("disk gone")

    ready = health.Readiness({"cache": lambda: state["synced"]})
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    async with m.serve(port, ready, host="127.0.0.1") as served:
        assert served == port
        status, ctype, body = await get(f"{base}/metrics")
        assert status == 200 and ctype.startswith("text/plain")
        families = {f.name for f in text_string_to_metric_families(body)}
        assert {"reclaimd_notices_admitted", "process_cpu_seconds"} <= families
        status, ctype, _ = await get(f"{base}/metrics", "application/openmetrics-text")
        assert ctype.startswith("application/openmetrics-text")
        assert (await get(f"{base}/healthz"))[0] == 200
        assert (await get(f"{base}/readyz"))[:1] == (503,)
        state["synced"] = True
        assert (await get(f"{base}/readyz"))[0] == 200
        ready.checks["outbox"] = broken
        assert ready.failing() == ["outbox"]
        assert (await get(f"{base}/readyz"))[0] == 503
    with pytest.raises(aiohttp.ClientConnectionError):
        await get(f"{base}/healthz")


async def test_port_zero_serves_nothing() -> None:
    async with metrics.Metrics().serve(0, lambda: True) as served:
        assert served is None


def test_outbox_writable(tmp_path: Path) -> None:
    assert health.outbox_writable(tmp_path / "outbox.sqlite")()  # not created yet: fine
    (tmp_path / "outbox.sqlite").write_bytes(b"")
    assert health.outbox_writable(tmp_path / "outbox.sqlite")()
    assert not health.outbox_writable(tmp_path / "missing-dir" / "outbox.sqlite")()


def test_the_dashboard_queries_only_metrics_that_exist() -> None:
    path = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "reclaimd-dashboard.json"
    dashboard = json.loads(path.read_text())
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    exprs = [t["expr"] for p in panels for t in p.get("targets", [])]
    used = {
        re.sub(r"_(bucket|sum|count)$", "", name)
        for e in exprs
        for name in re.findall(r"\breclaimd_[a-z_]+", e)
    }
    known = set(all_families())
    assert used <= known, used - known
    assert known - used == set(), "every metric has a place on the dashboard"
