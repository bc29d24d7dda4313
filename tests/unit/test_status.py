"""``reclaimd status`` on a cluster given as objects (the real readers of claims and Leases),
with one replica's /metrics served by a real aiohttp server and one that does not answer;
bad input through the CLI: one line, exit 2. The real API server and RBAC: e2e/test_status_e2e.py.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import sys
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web
from fake_apiserver import FakeApiServer

from reclaimd import cli, config, status, statusview, wiring
from reclaimd.cluster import apiserver, gangclaims, gangrecord, holders, slots
from reclaimd.cluster.claims import CLAIM_ANNOTATION, Claim, NodeObj, Phase
from reclaimd.cluster.ratelimit import RateLimiter
from reclaimd.model import Gang, GangKey, Member, Notice, NoticeKind, Target, rfc3339, utcnow

NS = "reclaimd"
METRICS = """# TYPE reclaimd_ledger_outbox_depth gauge
reclaimd_ledger_outbox_depth 3.0
# TYPE reclaimd_scheduler_depth gauge
reclaimd_scheduler_depth 2.0
# TYPE reclaimd_kube_writes_waiting gauge
reclaimd_kube_writes_waiting 0.0
# TYPE reclaimd_ledger_outbox_oldest_age_seconds gauge
reclaimd_ledger_outbox_oldest_age_seconds 41.5
"""


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def notice(nid: str, node: str, deadline: datetime) -> Notice:
    now = utcnow()
    return Notice(
        id=nid,
        source="test.source",
        kind=NoticeKind.SPOT_INTERRUPTION,
        target=Target(node_name=node),
        issued_at=now,
        deadline=deadline,
        received_at=now,
    )


def node_with(
    name: str, n: Notice, holder: str, phase: Phase, facts: dict[str, Any] | None = None
) -> dict[str, Any]:
    now = utcnow()
    claim = Claim(
        target=NodeObj(name),
        notice_id=n.id,
        deadline=n.deadline,
        holder=holder,
        phase=phase,
        claimed_at=now - timedelta(seconds=30),
        heartbeat_at=now - timedelta(seconds=5 if phase is Phase.DONE else 30),
        notice=n.to_json(),
        facts=facts or {},
    )
    text = json.dumps(claim.to_json())
    return {"metadata": {"name": name, "annotations": {CLAIM_ANNOTATION: text}}}


def holder_lease(holder: str, metrics: str, *, renewed: datetime) -> dict[str, Any]:
    return {
        "metadata": {
            "name": holders.lease_name(holder),
            "labels": {holders.HOLDER_LABEL: "true"},
            "annotations": {
                holders.HOLDER_ANNOTATION: holder,
                holders.PROBE_ANNOTATION: "127.0.0.1:1",
                holders.METRICS_ANNOTATION: metrics,
            },
        },
        "spec": {"renewTime": rfc3339(renewed), "leaseDurationSeconds": 20},
    }


@pytest.fixture
async def metrics_server() -> AsyncIterator[str]:
    async def serve(_: web.Request) -> web.Response:
        return web.Response(text=METRICS)

    app = web.Application()
    app.router.add_get("/metrics", serve)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    yield f"127.0.0.1:{port}"
    await runner.cleanup()


def cluster(metrics: str, pods: tuple[str, ...] = ("u0",)) -> FakeApiServer:
    now = utcnow()
    live = notice("n-live", "node-a", now + timedelta(seconds=90))
    done = notice("n-done", "node-b", now - timedelta(seconds=10))
    gone = notice("n-gone", "node-c", now - timedelta(seconds=60))
    members = tuple(
        Member(namespace="train", name=f"r{i}", uid=f"u{i}", node="node-a", gpus=8, rank=i)
        for i in range(2)
    )
    gang = Gang(key=GangKey("job", "train", "g1"), members=members)
    acked = gangrecord.acks_from_json(
        json.dumps({"u0": {"at": rfc3339(now), "step": 7, "uri": "s3://x"}}), gang
    )
    gang_lease = {
        "metadata": {
            "name": gangclaims.lease_name(gang),
            "labels": {gangclaims.NOTICE_LABEL: gangclaims.notice_label(live.id)},
            "annotations": {
                gangclaims.NOTICE_ANNOTATION: live.id,
                gangclaims.RECORD_ANNOTATION: gangrecord.gang_json(gang),
                gangclaims.ACKS_ANNOTATION: gangrecord.acks_json(acked),
            },
        },
        "spec": {"holderIdentity": "replica-a"},
    }
    # A gang the finished notice charged, its Lease kept for hours: not read again.
    old_rank = replace(members[0], namespace="old")
    old_gang = Gang(key=GangKey("job", "old", "g0"), members=(old_rank,))
    old_lease = {
        "metadata": {
            "name": gangclaims.lease_name(old_gang),
            "labels": {gangclaims.NOTICE_LABEL: gangclaims.notice_label(done.id)},
            "annotations": {
                gangclaims.NOTICE_ANNOTATION: done.id,
                gangclaims.RECORD_ANNOTATION: gangrecord.gang_json(old_gang),
            },
        },
        "spec": {"holderIdentity": "replica-b"},
    }
    slot = {
        "metadata": {
            "name": slots.lease_name("sub-0"),
            "labels": {slots.SLOT_LABEL: "true"},
            "annotations": {slots.SUBSCRIPTION_ANNOTATION: "sub-0"},
        },
        "spec": {
            "holderIdentity": "replica-a",
            "renewTime": rfc3339(now),
            "leaseDurationSeconds": 20,
        },
    }
    nodes = [
        node_with("node-a", live, "replica-a", Phase.CLAIMED),
        node_with("node-b", done, "replica-b", Phase.DONE, {"deadline_met": False}),
        node_with("node-c", gone, "replica-gone", Phase.CLAIMED),
        {"metadata": {"name": "node-d"}},
    ]
    leases = [
        gang_lease,
        old_lease,
        slot,
        holder_lease("replica-a", metrics, renewed=now),
        holder_lease("replica-b", f"127.0.0.1:{closed_port()}", renewed=now),
    ]
    return FakeApiServer(
        {
            apiserver.node(): {"items": nodes},
            apiserver.lease(NS): {"items": leases},
            # u1 was evicted: one rank's pod left
            apiserver.pod("train"): {"items": [{"metadata": {"uid": uid}} for uid in pods]},
        }
    )


async def test_status_shows_in_flight_gangs_replicas_and_finished(metrics_server: str) -> None:
    api = cluster(metrics_server)
    s = await status.read(api, NS)
    # every LIST from the API server's watch cache: no quorum read of etcd mid-storm
    lists = [q for method, path, q in api.requests if method == "GET" and path != "/apis"]
    assert lists and all(q == {"resourceVersion": "0"} for q in lists)
    assert apiserver.pod("old") not in {path for _, path, _ in api.requests}
    (n,) = s.in_flight
    assert (n.notice_id, n.source, n.target, n.holder) == (
        "n-live",
        "test.source",
        "node/node-a",
        "replica-a",
    )
    assert n.holder_alive and n.seconds_left is not None and 85 < n.seconds_left <= 90
    assert n.phase == "draining"  # acks recorded and a pod gone
    (g,) = n.gangs
    assert (g.gang, g.asked, g.durable, g.pods_left) == ("job:train/g1", 2, 1, 1)
    outcomes = {f.notice_id: f.outcome for f in s.finished}
    assert outcomes["n-done"] == "deadline missed"
    assert outcomes["n-gone"].startswith("abandoned")
    by_holder = {r.holder: r for r in s.replicas}
    a, b = by_holder["replica-a"], by_holder["replica-b"]
    assert a.alive and a.slots == ("sub-0",) and a.metrics is not None
    assert (a.metrics.outbox_depth, a.metrics.in_flight, a.metrics.outbox_oldest_s) == (3, 2, 41.5)
    assert b.alive and b.metrics is None and "does not answer" in b.metrics_error
    text = statusview.render(s)
    assert "NOTICES IN FLIGHT (1)" in text and "node/node-a" in text and "draining" in text
    assert "replica-b: /metrics at" in text
    json.dumps(s.to_json())  # --format json


@pytest.mark.parametrize(("pods", "phase"), [(("u0", "u1"), "draining"), ((), "drained")])
async def test_the_phase_follows_the_gangs_pods(pods: tuple[str, ...], phase: str) -> None:
    s = await status.read(cluster("", pods), NS)
    assert [n.phase for n in s.in_flight] == [phase]  # acks recorded: past the checkpoint


async def test_no_gangs_yet_is_the_claims_phase_and_no_metrics_address_is_said() -> None:
    now = utcnow()
    live = notice("n1", "node-a", now + timedelta(seconds=30))
    api = FakeApiServer(
        {
            apiserver.node(): {"items": [node_with("node-a", live, "r", Phase.CLAIMED)]},
            apiserver.lease(NS): {"items": [holder_lease("r", "", renewed=now)]},
        }
    )
    s = await status.read(api, NS)
    assert [n.phase for n in s.in_flight] == ["claimed"]
    (r,) = s.replicas
    assert r.metrics is None and r.metrics_error.startswith("its Lease names no /metrics")


async def test_a_refused_read_is_one_line_naming_it() -> None:
    api = FakeApiServer({}, 403)
    with pytest.raises(status.StatusError, match=r"^list nodes: failed 403.*reclaimd-viewer"):
        await status.read(api, NS)


def kubeconfig_to(tmp_path: Path, server: str) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": server}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    return path


@pytest.mark.parametrize("json_format", [False, True])
def test_an_unreachable_cluster_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], json_format: bool
) -> None:
    path = kubeconfig_to(tmp_path, f"http://127.0.0.1:{closed_port()}")
    argv = ["status", "--kubeconfig", str(path), *(["--format", "json"] if json_format else [])]
    assert cli.main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("reclaimd status: list nodes: ")
    assert "Traceback" not in err


def test_a_missing_kubeconfig_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["status", "--kubeconfig", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "load Kubernetes config" in err


async def test_the_holder_lease_names_where_its_metrics_answer() -> None:
    api = FakeApiServer()
    lease = holders.HolderLeases(
        api, NS, "me", lease_s=10.0, limiter=RateLimiter(), metrics_address=lambda: "10.1.2.3:9464"
    )
    await lease.renew()
    (_, _, body) = api.requests[0]
    assert body["metadata"]["annotations"][holders.METRICS_ANNOTATION] == "10.1.2.3:9464"


def test_the_metrics_address_is_the_metrics_port_at_the_advertised_host() -> None:
    s = config.Settings.model_validate(
        {"metrics_port": 9464, "peer_probe": {"advertise": "10.0.0.7", "enabled": False}}
    )
    assert wiring._metrics_address(s, None)() == "10.0.0.7:9464"
    off = s.model_copy(update={"metrics_port": 0})
    assert wiring._metrics_address(off, None)() == ""


@pytest.fixture
async def quiet_cluster(tmp_path: Path) -> AsyncIterator[Path]:
    """An API server on loopback (plain HTTP) with one node, no Kueue and no Leases."""
    answers = {
        apiserver.node(): {"items": [{"metadata": {"name": "node-a"}}]},
        "/apis": {"groups": []},
        apiserver.lease(NS): {"items": []},
    }

    async def serve(request: web.Request) -> web.Response:
        if request.path in answers:
            return web.json_response(answers[request.path])
        return web.json_response({"kind": "Status", "message": "not found"}, status=404)

    app = web.Application()
    app.router.add_get("/{tail:.*}", serve)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield kubeconfig_to(tmp_path, f"http://127.0.0.1:{runner.addresses[0][1]}")
    await runner.cleanup()


async def test_watch_redraws_until_stopped(quiet_cluster: Path) -> None:
    """Two looks, each a document of its own, from one process; then it is stopped."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "reclaimd.cli", "status", "--kubeconfig", str(quiet_cluster),
        "--format", "json", "--watch", "0.1",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None
    try:
        async with asyncio.timeout(60):
            looks = [json.loads(await proc.stdout.readline()) for _ in range(2)]
    finally:
        proc.terminate()
        await proc.wait()
    assert [d["in_flight"] for d in looks] == [[], []]
    assert looks[0]["at"] < looks[1]["at"]


def args_of(*argv: str) -> argparse.Namespace:
    return cli.build_parser().parse_args(["status", *argv])


def test_in_a_pod_reclaimds_namespace_is_the_pods(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "namespace").write_text("ops\n")
    monkeypatch.setattr(status, "SA_NAMESPACE", tmp_path / "namespace")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    assert status._where(args_of()) == (None, "ops")
    assert status._where(args_of("-n", "other")) == (None, "other")
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST")
    assert status._where(args_of()) == (None, "reclaimd")


def test_a_settings_file_gives_the_namespace_and_kubeconfig(tmp_path: Path) -> None:
    settings = tmp_path / "reclaimd.yaml"
    settings.write_text("lease_namespace: rd\nkube: {kubeconfig: /k/config}\n")
    assert status._where(args_of("--config", str(settings))) == ("/k/config", "rd")
    settings.write_text("lease_namespace: [\n")
    with pytest.raises(status.StatusError):
        status._where(args_of("--config", str(settings)))
