"""Observability end to end: a real reclaimd handles a Spot notice from SQS, then

* its spans go over OTLP (gRPC, then HTTP) to the stack's OpenTelemetry Collector and are read
  back by trace id from the file the collector wrote: the notice's whole trace, the receive span
  linked from it, and the trace the ledger event points at;
* its ``/metrics`` shows the notice, the step latencies, the acks, the evictions and the
  restart waste by cost label, and ``/healthz`` and ``/readyz`` answer;
* ``reclaimd postmortem`` turns its span file into the timeline, as text and as a page that
  Chromium draws (the picture is kept in the run's directory).
"""

from __future__ import annotations

import asyncio
import json
import math
import shutil
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from chaos import stack as stackenv
from chaos.harness import Harness
from chaos.ports import free_port
from reclaimd import postmortem
from reclaimd.model import Notice

STEPS = ("claim", "resolve", "cordon", "checkpoint", "drain", "ledger")


@pytest.fixture
async def h(stack: Any) -> AsyncIterator[Harness]:
    async with Harness(stackenv.load()) as harness:
        yield harness


async def spot_scenario(h: Harness, **daemon: Any) -> tuple[Notice, list[dict[str, Any]]]:
    """The demo's fleet: a 3-rank gang across nodes 0-2 and a one-pod job on node 0; a Spot
    notice for node 0, handled by a daemon started with ``daemon``; its 2 ledger events."""
    nodes = [h.node_spec(i) for i in range(3)]
    await h.add_nodes(nodes)
    await h.add_gang("llm", [n.name for n in nodes])
    await h.add_gang("eval", [nodes[0].name], gpus_per_rank=1, queue="eval")
    await h.start_daemon(**daemon)
    notice = h.send_spot(nodes[0])
    events = await h.ledger_events(count=2, timeout_s=90, settle_s=0.5)
    assert len(events) == 2
    for d in h.daemons:
        assert await d.stop() == 0  # SIGTERM: the tracer flushes what it holds
    return notice, events


# --- OTLP to a real collector ---------------------------------------------------------------


async def collected(path: Path, trace_ids: set[str], timeout_s: float = 20) -> list[dict[str, Any]]:
    """The spans of these traces from the collector's file, once the notice's root is there."""
    end = asyncio.get_running_loop().time() + timeout_s
    while True:
        spans = [s for s in postmortem.read_spans(path) if s["trace_id"] in trace_ids]
        if any(s["name"] == postmortem.ROOT for s in spans):
            return spans
        if asyncio.get_running_loop().time() > end:
            raise AssertionError(f"no root span of {sorted(trace_ids)} in {path}")
        await asyncio.sleep(0.25)


def resources_of(path: Path, trace_ids: set[str]) -> list[dict[str, Any]]:
    """The resource attributes of every batch in the collector's file with spans of these."""
    out = []
    for line in path.read_text().splitlines():
        for rs in json.loads(line).get("resourceSpans", []):
            ids = {s["traceId"].lower() for ss in rs["scopeSpans"] for s in ss["spans"]}
            if ids & trace_ids:
                attrs = rs["resource"]["attributes"]
                out.append({kv["key"]: next(iter(kv["value"].values())) for kv in attrs})
    return out


def trace_of(traceparent: str) -> str:
    version, trace_id, span_id, flags = traceparent.split("-")
    assert (version, len(trace_id), len(span_id)) == ("00", 32, 16)
    assert int(flags, 16) & 1, "sampled"
    return trace_id


@pytest.mark.parametrize(
    ("protocol", "endpoint_key"),
    [("grpc", "OTELCOL_GRPC_ENDPOINT"), ("http/protobuf", "OTELCOL_HTTP_ENDPOINT")],
)
async def test_spans_reach_the_collector_over_otlp(
    h: Harness, protocol: str, endpoint_key: str
) -> None:
    collector = Path(h.stack["OTELCOL_SPANS_FILE"])
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": h.stack[endpoint_key],
        "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
        "OTEL_RESOURCE_ATTRIBUTES": f"reclaimd.test.run={h.run_id}",
    }
    notice, events = await spot_scenario(h, env=env)
    assert not h.span_file.exists(), "with OTEL_* set, no JSON-lines file is written"

    # The ledger events name their trace; both events of the notice are in the same one.
    trace_ids = {trace_of(e["x_TraceParent"]) for e in events}
    assert len(trace_ids) == 1
    assert {e["_headers"]["traceparent"] for e in events} == {e["x_TraceParent"] for e in events}
    spans = await collected(collector, trace_ids)
    names = [s["name"] for s in spans]
    # claim (with the cordon) and resolve once per notice; the rest once per gang (two)
    for step in STEPS:
        per_gang = step in ("checkpoint", "drain", "ledger")
        assert names.count(f"reclaimd.{step}") == (2 if per_gang else 1), (step, names)
    assert names.count("reclaimd.checkpoint.rank") == 4  # 3 ranks of the gang, and the job
    assert names.count("reclaimd.evict") == 4  # every rank of the gang, and the job

    root = next(s for s in spans if s["name"] == postmortem.ROOT)
    a = root["attributes"]
    assert a["reclaimd.notice.id"] == notice.id
    assert a["host.id"] == notice.target.instance_id
    assert a["cloud.region"] == notice.attributes["region"]
    assert all(s["parent_id"] for s in spans if s is not root)  # one tree under the root
    ranks = [s for s in spans if s["name"] == "reclaimd.checkpoint.rank"]
    assert len({s["attributes"]["k8s.pod.uid"] for s in ranks}) == 4
    assert all(s["attributes"]["reclaimd.acked"] for s in ranks)
    assert {s["kind"] for s in ranks} == {"CLIENT"}  # the checkpoint request to the pod

    # The receive span: a trace of its own, named after the queue, with the admission.
    receipts = [
        s
        for s in postmortem.read_spans(collector)
        if s["name"].startswith("receive ")
        and s["attributes"].get("reclaimd.notice.id") == notice.id
    ]
    assert len(receipts) == 1
    receipt = receipts[0]
    queue = h.queue_url.rsplit("/", 1)[-1]
    assert receipt["name"] == f"receive {queue}" and receipt["kind"] == "CLIENT"
    assert receipt["trace_id"] not in trace_ids
    assert receipt["attributes"]["messaging.system"] == "aws_sqs"
    assert receipt["attributes"]["messaging.destination.name"] == queue
    assert receipt["attributes"]["reclaimd.admission"] == "claimed"

    # With the runbook on tracing.notice_span: conventions on the root, links, span kinds.
    assert a["cloud.provider"] == "aws" and a["cloud.platform"] == "aws_ec2"
    assert a["messaging.system"] == "aws_sqs" and a["k8s.cluster.name"] == "local"
    assert root["kind"] == "CONSUMER"
    assert [e["name"] for e in root["events"]] == ["reclaimd.notice.issued"]
    links = {(lk["trace_id"], lk["span_id"]): lk["attributes"] for lk in root["links"]}
    assert links == {(receipt["trace_id"], receipt["span_id"]): {"reclaimd.link": "receive"}}
    ledger = next(s for s in spans if s["name"] == "reclaimd.ledger")
    assert ledger["kind"] == "PRODUCER"
    assert ledger["attributes"]["messaging.destination.name"] == h.topic
    assert {s["attributes"]["reclaimd.gang"] for s in spans if s["name"] == "reclaimd.evict"} == {
        f"jobset:{h.namespace}/llm",
        f"jobset:{h.namespace}/eval",
    }

    # The process's resource: reclaimd's own attributes and OTEL_RESOURCE_ATTRIBUTES.
    (resource,) = {json.dumps(r, sort_keys=True) for r in resources_of(collector, trace_ids)}
    attrs = json.loads(resource)
    assert attrs["service.name"] == "reclaimd" and attrs["k8s.cluster.name"] == "local"
    assert attrs["service.instance.id"] == h.holder("reclaimd")
    assert attrs["reclaimd.test.run"] == h.run_id

    # The post-mortem reads the collector's OTLP/JSON as well as its own file.
    t = postmortem.load(collector, notice.id)
    assert t.trace_id in trace_ids and t.deadline_met
    assert len([r for r in t.rows if r.step == "evict"]) == 4


# --- /metrics, /healthz, /readyz ------------------------------------------------------------


Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


async def scrape(port: int) -> Samples:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{port}/metrics") as r,
    ):
        assert r.status == 200
        text = await r.text()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    """One sample's value; 0 when absent (a counter never incremented)."""
    return samples.get((name, frozenset(labels.items())), 0.0)


def total(samples: Samples, name: str) -> float:
    return sum(v for (n, _), v in samples.items() if n == name)


async def status(port: int, path: str) -> int:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{port}{path}") as r,
    ):
        return r.status


async def test_metrics_health_and_postmortem_after_a_spot_notice(h: Harness) -> None:
    port = free_port()
    nodes = [h.node_spec(i) for i in range(3)]
    await h.add_nodes(nodes)
    await h.add_gang("llm", [n.name for n in nodes])
    await h.add_gang("eval", [nodes[0].name], gpus_per_rank=1, queue="eval", opt_in=False)
    await h.start_daemon(metrics_port=port)
    assert await status(port, "/healthz") == 200
    assert await status(port, "/readyz") == 200  # running: the cache has synced
    notice = h.send_spot(nodes[0])
    events = await h.ledger_events(count=2, timeout_s=90, settle_s=0.5)
    assert len(events) == 2
    samples = await scrape(port)
    for _ in range(40):  # the publisher marks events sent just after Kafka's ack
        if value(samples, "reclaimd_ledger_published_total") >= 2:
            break
        await asyncio.sleep(0.25)
        samples = await scrape(port)
    assert_notice_metrics(samples)
    assert_waste_by_cost_label(samples, events)
    assert_bound_metrics(samples)
    for d in h.daemons:
        assert await d.stop() == 0
    await assert_postmortem(h, notice)


def assert_notice_metrics(samples: Samples) -> None:
    spot = {"source": "aws.ec2.spot"}
    kind = "spot_interruption"
    claimed = {"kind": kind, "admission": "claimed"}
    assert value(samples, "reclaimd_notices_admitted_total", **spot, **claimed) == 1
    assert value(samples, "reclaimd_notices_handled_total", **spot, kind=kind, response="full") == 1
    assert total(samples, "reclaimd_notices_admitted_total") == 1
    # the cordon is the claim's own write; then resolve, and per gang signal, drain, record
    steps = ("claimed", "cordoned", "resolved", "signaled", "drained", "recorded")
    for step in steps:
        assert value(samples, "reclaimd_notice_step_seconds_count", **spot, step=step) == 1
    # each step ends after the one before it, all inside the 120 s window
    sums = [value(samples, "reclaimd_notice_step_seconds_sum", **spot, step=s) for s in steps]
    assert sums == sorted(sums) and 0 < sums[-1] < 120
    assert value(samples, "reclaimd_deadline_misses_total", **spot, kind=kind) == 0
    assert value(samples, "reclaimd_deadline_margin_seconds_count", **spot) == 1
    assert value(samples, "reclaimd_deadline_margin_seconds_sum", **spot) > 60
    assert value(samples, "reclaimd_checkpoint_rank_acks_total", result="durable") == 3
    assert value(samples, "reclaimd_checkpoint_rank_acks_total", result="not_opted_in") == 1
    assert value(samples, "reclaimd_checkpoint_ack_seconds_count") == 3
    assert total(samples, "reclaimd_evictions_total") == 4
    assert value(samples, "reclaimd_checkpoint_outcomes_total", outcome="checkpointed") == 1
    assert value(samples, "reclaimd_checkpoint_outcomes_total", outcome="not_opted_in") == 1
    assert value(samples, "reclaimd_restart_waste_events_total", deadline_met="true") == 2


def assert_waste_by_cost_label(samples: Samples, events: list[dict[str, Any]]) -> None:
    """GPU-seconds by cost label: the ledger's numbers, under the ledger's tags."""
    labels = ("tenant", "queue", "sku", "cell", "purchase_option")
    by_tags = {tuple(e["Tags"].get(k, "") for k in labels): e["x_WastedGpuSeconds"] for e in events}
    assert ("team-a", "eval", "p5.48xlarge", "", "spot") in by_tags
    for tags, gpu_s in by_tags.items():
        got = value(
            samples,
            "reclaimd_restart_waste_gpu_seconds_total",
            **dict(zip(labels, tags, strict=True)),
        )
        assert gpu_s > 0 and math.isclose(got, gpu_s, abs_tol=0.01), (tags, got, gpu_s)
    assert len([n for n, _ in samples if n == "reclaimd_restart_waste_gpu_seconds_total"]) == 2


def assert_bound_metrics(samples: Samples) -> None:
    """What the other parts count, read at scrape time."""
    assert value(samples, "reclaimd_ledger_published_total") == 2
    assert value(samples, "reclaimd_ledger_outbox_depth") == 0
    assert value(samples, "reclaimd_ledger_publish_failures_total") == 0
    assert value(samples, "reclaimd_transport_received_total", transport="sqs") == 1
    assert value(samples, "reclaimd_transport_acked_total", transport="sqs") == 1
    sqs_claimed = {"transport": "sqs", "admission": "claimed"}
    assert value(samples, "reclaimd_transport_admissions_total", **sqs_claimed) == 1
    assert value(samples, "reclaimd_scheduler_depth") == 0
    assert value(samples, "reclaimd_build_info", version="0.1.0") == 1


async def run(*argv: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(
        subprocess.run, argv, capture_output=True, text=True, check=False, timeout=timeout_s
    )


# ``reclaimd postmortem`` as cli.py wires it (add_parser + func), without depending on cli.py.
POSTMORTEM_CLI = (
    "import sys, argparse\n"
    "from reclaimd import postmortem\n"
    "p = argparse.ArgumentParser(prog='reclaimd'); postmortem.add_parser(p.add_subparsers())\n"
    "a = p.parse_args(sys.argv[1:]); sys.exit(a.func(a))"
)


async def assert_postmortem(h: Harness, notice: Notice) -> None:
    """The post-mortem of the notice from the daemon's span file: text, SVG, and the page as
    Chromium draws it (kept in the run's directory for a person to look at)."""
    svg, page, png = (h.workdir / f"postmortem.{ext}" for ext in ("svg", "html", "png"))
    out = await run(
        sys.executable, "-c", POSTMORTEM_CLI, "postmortem", notice.id,
        "--from", str(h.span_file), "--svg", str(svg), "--html", str(page),
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    text = out.stdout
    (h.workdir / "postmortem.txt").write_text(text)
    assert text.startswith(f"notice {notice.id}") and "deadline met" in text
    assert f"  gang jobset:{h.namespace}/llm" in text
    for rank in range(3):
        assert f"rank {rank}" in text
    assert text.count(" evict ") == 4
    picture = svg.read_text()
    # the deadline: a line on the window overview, and on the zoomed timeline unless it lies
    # beyond it (a notice handled in seconds of 120), where it is named at the edge instead
    assert picture.count('class="deadline"') + picture.count('class="deadline-off-scale"') == 2
    chromium = shutil.which("chromium")
    assert chromium, "chromium is not installed (deploy/local/install.sh installs it)"
    with tempfile.TemporaryDirectory() as profile:
        shot = await run(
            chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
            "--no-first-run", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", f"--user-data-dir={profile}", f"--screenshot={png}",
            "--window-size=1400,900", page.as_uri(),
        )  # fmt: skip
    assert shot.returncode == 0, shot.stderr[-500:]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    print(f"post-mortem picture: {png}")  # shown with -s: a person looks at it
