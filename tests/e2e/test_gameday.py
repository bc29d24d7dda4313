"""Game days: ``reclaimd drill run --cluster`` against the Helm-installed release, not against
replicas the drill starts itself.

The chart is installed as a user would (two controller replicas on on-demand nodes, SQS and
the ledger configured in its values); ``podplayer`` runs its pods as ``reclaimd run``
processes, since kwok runs no container. Eight Spot nodes exist, six of them carrying the drill
label. The drill binds the scenario to the labelled nodes, sends through the release's queue,
judges from what the release wrote and cleans up; the tests then read the cluster themselves.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pytest
import yaml
from kubernetes_asyncio import client as k8s
from podplayer import PodPlayer
from stack import REPO_DIR, Stack
from test_helm_install import HELM, run
from test_image import PODMAN, ULIMITS, built

from chaos import fleet
from chaos import kube as chaos_kube
from chaos.gameday.target import finished

CHART = REPO_DIR / "deploy" / "helm" / "reclaimd"
SCENARIOS = REPO_DIR / "chaos" / "scenarios"
SCENARIO = SCENARIOS / "gameday-spot-storm.yaml"
# A letter first: all-digit (or 1e5-like) hex would reach helm as a YAML number, not a label.
RUN = "a" + uuid.uuid4().hex[:5]
NS = f"gd-rel-{RUN}"
RELEASE = f"gd{RUN}"
PLACE = "reclaimd.io/e2e-gameday"  # where the release's controllers may run
DRILL = f"reclaimd.io/game-day={RUN}"
CONTROLLERS = [
    fleet.NodeSpec(f"gd-od-{i}-{RUN}", f"i-{RUN}c{i}{0:09x}", purchase_option="on-demand")
    for i in range(2)
]
SPOT = {
    (z, i): fleet.NodeSpec(f"gd-spot-{z}{i}-{RUN}", f"i-{RUN}{z}{i}{0:09x}", zone=f"us-east-2{z}")
    for z in "ab"
    for i in range(4)
}
LABELLED = [n for (_, i), n in SPOT.items() if i < 3]  # three per zone carry the drill label
UNLABELLED = [n for (_, i), n in SPOT.items() if i == 3]
GCE = [  # GKE Spot nodes for the Pub/Sub game day
    fleet.NodeSpec(f"gd-gce-{i}-{RUN}", f"gd-gce-{i}-{RUN}", zone="us-central1-a", cloud="gce",
                   project="reclaimd-local", sku="a3-highgpu-8g")
    for i in range(4)
]  # fmt: skip
ON_DEMAND = [  # healthy on-demand nodes for the Kueue game day
    fleet.NodeSpec(f"gd-odk-{i}-{RUN}", f"i-{RUN}d{i}{0:09x}", purchase_option="on-demand")
    for i in range(3)
]
ALL_SPOT = LABELLED + UNLABELLED + GCE + ON_DEMAND


@dataclass
class Release:
    stack: Stack
    api: k8s.ApiClient
    player: PodPlayer
    queue_url: str
    topic: str
    sqs: Any


async def _untainted(api: k8s.ApiClient, names: list[str], timeout_s: float = 240) -> None:
    """kwok's Ready comes first; the node lifecycle controller lifts not-ready later."""
    core = k8s.CoreV1Api(api)
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout_s
    while loop.time() < end:
        nodes = [await core.read_node(n) for n in names]
        taints = [t.key for n in nodes for t in n.spec.taints or []]
        if not any(key.startswith("node.kubernetes.io/") for key in taints):
            return
        await asyncio.sleep(1.0)
    raise TimeoutError("the node lifecycle controller never lifted not-ready")


@pytest.fixture(scope="module")
async def release(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Release]:
    api = await chaos_kube.rig_client(str(stack.kubeconfig))
    await fleet.create_nodes_labelled(api, CONTROLLERS, {PLACE: RUN})
    await fleet.create_nodes(api, UNLABELLED)
    drill_label = {DRILL.partition("=")[0]: RUN}
    await fleet.create_nodes_labelled(api, LABELLED + GCE + ON_DEMAND, drill_label)
    await fleet.wait_nodes_ready(api, [n.name for n in CONTROLLERS + ALL_SPOT])
    await _untainted(api, [n.name for n in CONTROLLERS + ALL_SPOT])
    sqs = boto3.client("sqs", endpoint_url=stack.aws_endpoint, region_name="us-east-1")
    queue_url = sqs.create_queue(QueueName=f"gd-{RUN}")["QueueUrl"]
    topic = f"reclaimd.restart-waste.gd-{RUN}"
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    admin = AIOKafkaAdminClient(bootstrap_servers=stack.kafka_bootstrap)
    await admin.start()
    appended = {"message.timestamp.type": "LogAppendTime"}
    notices = f"reclaimd.notices.gd-{RUN}"
    await admin.create_topics(
        [NewTopic(topic, 1, 1, topic_configs=appended), NewTopic(notices, 3, 1)]
    )
    await admin.close()
    # the Logging sink's topic, one subscription per replica slot (deploy/gcp/main.tf's)
    from google.cloud import pubsub_v1

    publisher, subscriber = pubsub_v1.PublisherClient(), pubsub_v1.SubscriberClient()
    sink = publisher.topic_path(stack.pubsub_project, f"gd-sink-{RUN}")
    publisher.create_topic(name=sink)
    subs = [subscriber.subscription_path(stack.pubsub_project, f"gd-{RUN}-{i}") for i in (0, 1)]
    for sub in subs:
        subscriber.create_subscription(name=sub, topic=sink, ack_deadline_seconds=10)
    values = {
        "controller": {"replicas": 2, "nodeSelector": {PLACE: RUN}},
        "rbac": {"extraSubjects": [
            {"kind": "User", "name": "reclaimd", "apiGroup": "rbac.authorization.k8s.io"}
        ]},
        "config": {
            "cluster_name": "local",
            "sqs": {"enabled": True, "queue_url": queue_url, "endpoint_url": stack.aws_endpoint,
                    "region": "us-east-1", "wait_time_s": 1, "visibility_timeout_s": 10},
            "pubsub": {"enabled": True, "project": stack.pubsub_project,
                       "subscription": f"gd-{RUN}"},
            "kueue": {"enabled": True},
            "kafka_notices": {"enabled": True, "bootstrap": stack.kafka_bootstrap,
                              "topic": notices, "group_id": f"reclaimd-gd-{RUN}"},
            "ledger": {"bootstrap": stack.kafka_bootstrap, "topic": topic},
            # the probes answer on loopback: an exception a game day's values would name
            "checkpoint": {"allowed_hosts": ["127.0.0.1"]},
        },
    }  # fmt: skip
    workdir = tmp_path_factory.mktemp("gameday")
    path = workdir / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    helm = [str(HELM), f"--kubeconfig={stack.kubeconfig}"]
    run(*helm, "install", RELEASE, str(CHART), "-n", NS, "--create-namespace", "-f", str(path))
    player = PodPlayer(api, NS, RELEASE, workdir / "pods", str(stack.reclaimd_kubeconfig))
    try:
        await player.start(replicas=2)
        yield Release(stack, api, player, queue_url, topic, sqs)
    finally:
        await player.stop()
        run(*helm, "uninstall", RELEASE, "-n", NS, "--ignore-not-found", check=False)
        await fleet.delete_nodes(api, [n.name for n in CONTROLLERS + ALL_SPOT])
        await fleet.delete_namespace(api, NS)
        sqs.delete_queue(QueueUrl=queue_url)
        for sub in subs:
            subscriber.delete_subscription(subscription=sub)
        publisher.delete_topic(topic=sink)
        subscriber.close()
        await api.close()


async def start_drill(
    r: Release, *extra: str, out: Path | None = None, scenario: Path = SCENARIO
) -> Any:
    """``reclaimd drill run --cluster`` as a game day runs it: a process of its own."""
    cmd = [
        sys.executable, "-m", "reclaimd.cli", "drill", "run", str(scenario), "--cluster",
        "--kubeconfig", str(r.stack.kubeconfig), "--release", RELEASE,
        "--release-namespace", NS, "--node-label", DRILL, "--max-nodes", "6",
        "--spans", r.player.span_glob(), *(["--json", str(out)] if out else []), *extra,
    ]  # fmt: skip
    return await asyncio.create_subprocess_exec(
        *cmd, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=os.environ
    )


async def drill(
    r: Release, *extra: str, out: Path | None = None, scenario: Path = SCENARIO
) -> tuple[int, str, str]:
    proc = await start_drill(r, *extra, out=out, scenario=scenario)
    stdout, stderr = await asyncio.wait_for(proc.communicate(), 400)
    return int(proc.returncode or 0), stdout.decode(), stderr.decode()


async def node_states(api: k8s.ApiClient, specs: list[fleet.NodeSpec]) -> dict[str, Any]:
    """Each node's cordon, taints, open claim and run label: a claim the release finished
    stays on a node put back (the record that makes a late copy of its notice a duplicate),
    and holds it for nothing; an unlabelled node has no claim at all."""
    core = k8s.CoreV1Api(api)
    out = {}
    for s in specs:
        n = await core.read_node(s.name)
        claim = (n.metadata.annotations or {}).get("reclaimd.io/claim")
        assert claim is None or s not in UNLABELLED, (s.name, claim)
        out[s.name] = (
            bool(n.spec.unschedulable),
            sorted(t.key for t in n.spec.taints or []),
            None if finished(claim) else claim,
            (n.metadata.labels or {}).get(fleet.DRILL_LABEL),
        )
    return out


async def test_refusals_change_nothing(release: Release) -> None:
    before = await node_states(release.api, ALL_SPOT)
    for extra, says in [
        (("--max-nodes", "2"), "the scenario needs 6 nodes; --max-nodes is 2"),
        (("--node-label", "reclaimd.io/game-day=nowhere"), "no node carries"),
        (("--release", "nosuch"), "no reclaimd release 'nosuch'"),
    ]:
        code, out, err = await drill(release, *extra)
        assert code == 2, (extra, out, err)
        assert says in err and len(err.strip().splitlines()) == 1, err  # one line, no traceback
    # a labelled node already cordoned is not a drill target
    core = k8s.CoreV1Api(release.api)
    await core.patch_node(LABELLED[0].name, {"spec": {"unschedulable": True}})
    try:
        code, _, err = await drill(release)
        assert code == 2 and f"node {LABELLED[0].name}" in err and "cordoned" in err, err
    finally:
        await core.patch_node(LABELLED[0].name, {"spec": {"unschedulable": None}})
    code, out, err = await drill(release, "--dry-run")
    assert code == 0, err
    assert all(n.name in out for n in LABELLED) and not any(n.name in out for n in UNLABELLED)
    assert await node_states(release.api, ALL_SPOT) == before
    depth = release.sqs.get_queue_attributes(
        QueueUrl=release.queue_url, AttributeNames=["ApproximateNumberOfMessages"]
    )["Attributes"]["ApproximateNumberOfMessages"]
    assert depth == "0"  # nothing was sent


async def test_spot_storm_against_the_release_is_judged_and_cleaned_up(
    release: Release, tmp_path: Path
) -> None:
    before = await node_states(release.api, ALL_SPOT)
    holders = set(release.player.running)
    out = tmp_path / "verdict.json"
    code, stdout, stderr = await drill(release, out=out)
    print(stdout)
    assert out.exists(), (code, stderr[-3000:])
    verdict = json.loads(out.read_text())
    failed = [c for c in verdict["checks"] if c["required"] and not c["ok"]]
    assert code == 0 and not failed, (failed, stderr[-2000:])
    assert {c["name"] for c in verdict["checks"]} >= {"cleaned up", "every deadline met"}
    # judged on the release's own work: its spans (the drill started no reclaimd), its claims
    assert verdict["notices"] and all(n["traced"] for n in verdict["notices"])
    gangs = verdict["gangs"]
    assert len(gangs) == 3 and all(g["ledger_events"] == 1 for g in gangs), gangs
    assert set(release.player.running) == holders  # no replica came or went
    # cleaned up: every node as it was (the unlabelled ones never touched), the probes gone
    assert await node_states(release.api, ALL_SPOT) == before
    names = {n.metadata.name for n in (await k8s.CoreV1Api(release.api).list_namespace()).items}
    assert f"gd-{verdict['run_id']}" not in names


async def test_a_release_pod_deleted_mid_drill(release: Release, tmp_path: Path) -> None:
    """The game day's fault: one of the release's pods deleted while the storm is handled;
    the other replica takes its notices over, the ReplicaSet's new pod joins; still every
    gang charged once, every deadline met, and cleaned up."""
    before = await node_states(release.api, ALL_SPOT)
    out = tmp_path / "verdict.json"
    probes = f"gd-probes-{RUN}"  # given, as the chart's drill Job gives its own: kept after
    await fleet.ensure_namespace(release.api, probes)
    proc = await start_drill(release, "--namespace", probes, out=out)
    assert proc.stderr is not None
    seen: list[str] = []
    while not any(" sent " in line for line in seen):  # the storm has begun
        line = (await asyncio.wait_for(proc.stderr.readline(), 120)).decode()
        assert line, "".join(seen)
        seen.append(line)
    victim = sorted(release.player.running)[0]
    await k8s.CoreV1Api(release.api).delete_namespaced_pod(victim, NS)
    out_b, err_b = await asyncio.wait_for(proc.communicate(), 400)
    code, stdout, stderr = proc.returncode, out_b.decode(), "".join(seen) + err_b.decode()
    print(stdout)
    assert out.exists(), (code, stderr[-3000:])
    verdict = json.loads(out.read_text())
    failed = [c for c in verdict["checks"] if c["required"] and not c["ok"]]
    assert code == 0 and not failed, (failed, stderr[-2000:])
    assert all(g["ledger_events"] == 1 for g in verdict["gangs"])
    assert victim in release.player.stopped
    await release.player.wait_running(2, timeout_s=90)  # the ReplicaSet's new pod joins
    assert victim not in release.player.running and len(release.player.running) == 2
    assert await node_states(release.api, ALL_SPOT) == before
    core = k8s.CoreV1Api(release.api)
    assert not (await core.list_namespaced_pod(probes)).items  # the run's probes gone
    assert (await core.read_namespace(probes)).status.phase == "Active"  # its namespace kept
    await fleet.delete_namespace(release.api, probes)


@pytest.mark.parametrize(
    ("scenario", "gangs"),
    [("gameday-gce-storm", 2), ("gameday-kueue-reclaim", 1), ("kafka-notices", 2)],
)
async def test_gce_storm_kueue_reclaim_and_kafka_notices_against_the_release(
    release: Release, tmp_path: Path, scenario: str, gangs: int
) -> None:
    """GCE preemptions through the release's Pub/Sub subscription (its sink's topic), a
    Kueue reclaim written into a Workload, and CloudEvents on its Kafka notices topic (the
    local drill's own scenario, duplicates and malformed events included): judged from what
    the release wrote, cleaned up."""
    before = await node_states(release.api, ALL_SPOT)
    out = tmp_path / "verdict.json"
    code, stdout, stderr = await drill(release, out=out, scenario=SCENARIOS / f"{scenario}.yaml")
    print(stdout)
    assert out.exists(), (code, stderr[-3000:])
    verdict = json.loads(out.read_text())
    failed = [c for c in verdict["checks"] if c["required"] and not c["ok"]]
    assert code == 0 and not failed, (failed, stderr[-2000:])
    charged = verdict["gangs"]
    assert len(charged) == gangs and all(g["ledger_events"] == 1 for g in charged), charged
    assert verdict["notices"] and all(n["traced"] for n in verdict["notices"])
    assert await node_states(release.api, ALL_SPOT) == before


@pytest.fixture(scope="module")
def chaos_image() -> str:
    built()  # the product image first: the chaos image is a layer on it
    return built("chaos")


async def test_the_chaos_image_runs_the_game_day(
    release: Release, chaos_image: str, tmp_path: Path
) -> None:
    """Where a game day runs: the chaos image (``make image-chaos``), read-only, as 65532, on
    the host's network (the stack is on loopback), with the admin kubeconfig and the release's
    span files mounted read-only; the scenario is the one the image ships."""
    before = await node_states(release.api, ALL_SPOT)
    spans = str(Path(release.player.span_glob()).parents[1])
    kubeconfig = tmp_path / "kubeconfig"  # readable by the image's user (the stack's is 0600)
    kubeconfig.write_text(release.stack.kubeconfig.read_text())
    kubeconfig.chmod(0o644)
    env = ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION"]
    cmd = [
        *PODMAN, "run", "--rm", "--read-only", "--network", "host", *ULIMITS,
        "--tmpfs", "/tmp:rw,size=64m,mode=1777", "-e", "HOME=/tmp",
        *[a for k in env for a in ("-e", k)],
        "-v", f"{kubeconfig}:/kube/config:ro", "-v", f"{spans}:{spans}:ro",
        chaos_image, "drill", "run", "/opt/reclaimd/scenarios/gameday-spot-storm.yaml",
        "--cluster", "--kubeconfig", "/kube/config", "--release", RELEASE,
        "--release-namespace", NS, "--node-label", DRILL, "--max-nodes", "6",
        "--spans", release.player.span_glob(),
    ]  # fmt: skip
    proc = await asyncio.create_subprocess_exec(
        *cmd, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out_b, err_b = await asyncio.wait_for(proc.communicate(), 400)
    stdout = out_b.decode()
    print(stdout)
    assert proc.returncode == 0, (stdout[-3000:], err_b.decode()[-2000:])
    assert "== verdict: PASS" in stdout and "[PASS] cleaned up" in stdout
    assert await node_states(release.api, ALL_SPOT) == before
