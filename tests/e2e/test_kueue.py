"""Kueue reclaim end to end: the stack's real Kueue preempts a borrower to give a lender its
quota back (reclaimWithinCohort), and a real ``reclaimd run`` with the kueue source signals
every rank of the borrower and writes one ledger event with the preemption reason.

Nothing here writes a Workload: Kueue creates it for the Job, admits it, and evicts it; the
kube-scheduler binds the pods; the Job controller creates and deletes them.

Pods run on nodes of a kwok started by this module (not the stack's): the stack's kwok uses
kwok's "fast" stages, in which a Job's pod completes the moment it runs and a deleted pod
vanishes at once. A training job runs until stopped, and a kubelet keeps a deleted pod for
its termination grace period (the checkpoint window Kueue leaves), so this kwok runs the
stack's node and pod-ready stages with two of its own instead: at the end of the grace
period the pod fails, then its object goes once the Job controller has let go of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator, Callable
from functools import partial
from pathlib import Path
from typing import Any, cast

import aiohttp
import pytest
import yaml
from aiohttp import web
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio.client.rest import ApiException

from chaos import fleet
from chaos import stack as stackenv
from chaos.harness import Harness
from chaos.ports import free_port as _free_port
from chaos.stack import StackEnv
from chaos.trainers import TrainerFleet
from reclaimd import annotations as ann
from reclaimd import handlers
from reclaimd.model import Notice, rfc3339, utcnow

GPU = fleet.GPU
KUEUE = ("kueue.x-k8s.io", "v1beta2")
CLAIM = "reclaimd.io/claim"
GRACE_S = 10  # the pods' terminationGracePeriodSeconds: all Kueue leaves them
# The stack's Kueue acts only in namespaces that opt in (deploy/local/kueue/kueue.sh).
MANAGED = {"reclaimd.io/kueue": "managed"}

# --- a kwok for training pods ----------------------------------------------------------------

KEEP_STAGES = ("node-initialize", "node-heartbeat-with-lease", "pod-ready")
STOP_AFTER_GRACE = """
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-stop-after-grace
spec:
  resourceRef: {apiGroup: v1, kind: Pod}
  selector:
    matchExpressions:
    - {key: .metadata.deletionTimestamp, operator: Exists}
    - {key: .status.phase, operator: In, values: [Running]}
  delay:
    durationMilliseconds: 0
    durationFrom: {expressionFrom: .metadata.deletionTimestamp}
  next:
    statusTemplate: |
      {{ $now := Now }}
      phase: Failed
      containerStatuses:
      {{ range .spec.containers }}
      - image: {{ .image | Quote }}
        name: {{ .name | Quote }}
        ready: false
        restartCount: 0
        state:
          terminated:
            exitCode: 137
            reason: Error
            finishedAt: {{ $now | Quote }}
      {{ end }}
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-remove-stopped
spec:
  resourceRef: {apiGroup: v1, kind: Pod}
  selector:
    matchExpressions:
    - {key: .metadata.deletionTimestamp, operator: Exists}
    - {key: .status.phase, operator: In, values: [Failed, Succeeded]}
    - {key: .metadata.finalizers, operator: DoesNotExist}
  next:
    delete: true
"""


class TrainingKwok:
    """A kwok process managing only the nodes annotated ``kwok.x-k8s.io/node=<selector>``."""

    def __init__(self, stack: StackEnv, selector: str, workdir: Path) -> None:
        cache = Path(os.environ.get("RECLAIMD_CACHE", Path.home() / ".cache" / "reclaimd"))
        self.dir = cache / f"kwok-{stack['KWOK_VERSION']}"
        self.kubeconfig = stack.dir / "kubeconfig" / "kwok.kubeconfig"
        self.selector = selector
        self.stages = workdir / "kwok-training-stages.yaml"
        self.log = workdir / "kwok-training.log"
        self.proc: asyncio.subprocess.Process | None = None

    def write_stages(self) -> None:
        kept = [
            doc
            for doc in yaml.safe_load_all((self.dir / "stages.yaml").read_text())
            if doc and doc["metadata"]["name"] in KEEP_STAGES
        ]
        assert len(kept) == len(KEEP_STAGES), "the stack's kwok stages changed"
        docs = [*kept, *yaml.safe_load_all(STOP_AFTER_GRACE)]
        self.stages.write_text(yaml.safe_dump_all(docs))

    async def start(self) -> None:
        self.write_stages()
        port = _free_port()
        with self.log.open("ab") as log:
            self.proc = await asyncio.create_subprocess_exec(
                str(self.dir / "kwok"),
                f"--kubeconfig={self.kubeconfig}",
                "--manage-all-nodes=false",
                f"--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node={self.selector}",
                "--node-lease-duration-seconds=40",
                "--cidr=10.246.0.0/16",
                "--node-ip=10.0.0.2",
                f"--server-address=127.0.0.1:{port}",
                f"--config={self.stages}",
                stdout=log,
                stderr=log,
            )
        async with aiohttp.ClientSession() as session:
            for _ in range(300):
                if self.proc.returncode is not None:
                    raise RuntimeError(f"kwok exited {self.proc.returncode}; log: {self.log}")
                with contextlib.suppress(aiohttp.ClientError):
                    async with session.get(f"http://127.0.0.1:{port}/healthz") as r:
                        if r.status == 200:
                            return
                await asyncio.sleep(0.1)
        raise TimeoutError(f"kwok not healthy after 30s; log: {self.log}")

    async def stop(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.terminate()
            try:
                await asyncio.wait_for(self.proc.wait(), 10)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()


# --- one checkpoint address for every rank of a Job -------------------------------------------


class CheckpointRelay:
    """A Job's pods share one template, so its ``checkpoint-url`` names the pod
    (``http://127.0.0.1:<port>/{namespace}/{pod}/checkpoint``); the relay hands each request to
    that pod's fake trainer, and answers 404 for a pod that has none."""

    def __init__(self, trainers: TrainerFleet) -> None:
        self.trainers = trainers
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self.port = 0

    @property
    def template(self) -> str:
        return f"http://127.0.0.1:{self.port}/{{namespace}}/{{pod}}/checkpoint"

    async def start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{ns}/{pod}/checkpoint{tail:.*}", self._forward)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        self.port = int(self._runner.addresses[0][1])
        self._session = aiohttp.ClientSession()

    async def stop(self) -> None:
        if self._session is not None:
            await self._session.close()
        if self._runner is not None:
            await self._runner.cleanup()

    async def _forward(self, request: web.Request) -> web.Response:
        ns, pod = request.match_info["ns"], request.match_info["pod"]
        trainer = self.trainers.trainers.get(f"{ns}/{pod}")
        if trainer is None or self._session is None:
            return web.json_response({"error": f"no trainer for {ns}/{pod}"}, status=404)
        headers = {k: v for k, v in request.headers.items() if k.lower() in _FORWARDED}
        async with self._session.request(
            request.method,
            trainer.url + request.match_info["tail"],
            data=await request.read(),
            headers=headers,
        ) as reply:
            body = await reply.read()
            out = {"Content-Type": reply.headers.get("Content-Type", "application/json")}
            if location := reply.headers.get("Location"):
                out["Location"] = f"/{ns}/{pod}{location}"
            return web.Response(status=reply.status, body=body, headers=out)


_FORWARDED = frozenset({"content-type", "traceparent"})


# --- Kueue objects ---------------------------------------------------------------------------


def cluster_queue(name: str, cohort: str, flavor: str, gpus: int, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ClusterQueue",
        "metadata": {"name": name},
        "spec": {
            "cohortName": cohort,
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
            "resourceGroups": [
                {
                    "coveredResources": [GPU],
                    "flavors": [
                        {"name": flavor, "resources": [{"name": GPU, "nominalQuota": gpus}]}
                    ],
                }
            ],
            # The lender takes its nominal quota back from any borrower in the cohort.
            "preemption": {"reclaimWithinCohort": "Any", "withinClusterQueue": "Never"},
        },
    }


def training_job(
    name: str, namespace: str, *, queue: str, ranks: int, gpus: int, checkpoint_url: str
) -> dict[str, Any]:
    """A suspended Indexed Job, as a user submits it to Kueue; every rank opts in to the
    checkpoint contract through the pod template."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"kueue.x-k8s.io/queue-name": queue},
        },
        "spec": {
            "suspend": True,
            "parallelism": ranks,
            "completions": ranks,
            "completionMode": "Indexed",
            "backoffLimit": 0,
            "template": {
                "metadata": {
                    "labels": {"reclaimd.io/tenant": "team-b", "reclaimd.io/job": name},
                    "annotations": {
                        ann.CHECKPOINT_URL: checkpoint_url,
                        ann.CHECKPOINT_TIMEOUT: "20s",
                        ann.CHECKPOINT_SCOPE: "rank",
                        ann.LAST_CHECKPOINT: rfc3339(fleet.ago(600).replace(microsecond=0)),
                    },
                },
                "spec": {
                    "restartPolicy": "Never",
                    "terminationGracePeriodSeconds": GRACE_S,
                    "automountServiceAccountToken": False,
                    "containers": [
                        {
                            "name": "trainer",
                            "image": "registry.invalid/trainer:fake",
                            "resources": {"requests": {GPU: str(gpus)}, "limits": {GPU: str(gpus)}},
                        }
                    ],
                },
            },
        },
    }


class Kueue:
    """This run's ResourceFlavor, cohort of two ClusterQueues and their LocalQueues."""

    def __init__(self, h: Harness, nodes_label: tuple[str, str]) -> None:
        assert h.api is not None
        self.h = h
        self.custom = k8s.CustomObjectsApi(h.api)
        self.batch = k8s.BatchV1Api(h.api)
        run = h.run_id
        self.flavor = f"gpu-{run}"
        self.lender, self.borrower = f"lend-{run}", f"borrow-{run}"
        self.nodes_label = nodes_label
        self.created: list[tuple[str, str]] = []  # cluster-scoped (plural, name), for cleanup

    async def create(self) -> None:
        ns = self.h.namespace
        await self.h.core.patch_namespace(ns, {"metadata": {"labels": MANAGED}})
        key, value = self.nodes_label
        await self._cluster(
            "resourceflavors",
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "ResourceFlavor",
                "metadata": {"name": self.flavor},
                # Kueue puts these in the admitted pods' nodeSelector: this run's nodes only.
                "spec": {"nodeLabels": {key: value}},
            },
        )
        cohort = f"cohort-{self.h.run_id}"
        await self._cluster("clusterqueues", cluster_queue(self.lender, cohort, self.flavor, 8, ns))
        await self._cluster(
            "clusterqueues", cluster_queue(self.borrower, cohort, self.flavor, 0, ns)
        )
        for cq in (self.lender, self.borrower):
            await self.custom.create_namespaced_custom_object(
                *KUEUE,
                ns,
                "localqueues",
                {
                    "apiVersion": "kueue.x-k8s.io/v1beta2",
                    "kind": "LocalQueue",
                    "metadata": {"name": cq, "namespace": ns},
                    "spec": {"clusterQueue": cq},
                },
            )
        for cq in (self.lender, self.borrower):
            await until(partial(self._active, cq), f"ClusterQueue {cq} active")

    async def _cluster(self, plural: str, body: dict[str, Any]) -> None:
        await self.custom.create_cluster_custom_object(*KUEUE, plural, body)
        self.created.append((plural, body["metadata"]["name"]))

    async def _active(self, name: str) -> bool:
        cq = await self.custom.get_cluster_custom_object(*KUEUE, "clusterqueues", name)
        return _condition(cq, "Active") == "True"

    async def submit(self, name: str, queue: str, ranks: int, gpus: int, url: str) -> Any:
        body = training_job(
            name, self.h.namespace, queue=queue, ranks=ranks, gpus=gpus, checkpoint_url=url
        )
        return await self.batch.create_namespaced_job(self.h.namespace, cast(Any, body))

    async def workload_of(self, job_uid: str) -> dict[str, Any] | None:
        listed = await self.custom.list_namespaced_custom_object(
            *KUEUE,
            self.h.namespace,
            "workloads",
            label_selector=f"kueue.x-k8s.io/job-uid={job_uid}",
        )
        items: list[dict[str, Any]] = listed["items"]
        return items[0] if items else None

    async def running_pods(self, job: str) -> list[Any]:
        pods = await self.h.core.list_namespaced_pod(
            self.h.namespace, label_selector=f"batch.kubernetes.io/job-name={job}"
        )
        return [
            p
            for p in pods.items
            if p.status.phase == "Running" and p.status.pod_ip and not p.metadata.deletion_timestamp
        ]

    async def delete(self) -> None:
        ns = self.h.namespace
        for job in ("lender", "borrower"):
            with contextlib.suppress(ApiException):
                await self.batch.delete_namespaced_job(
                    job, ns, propagation_policy="Background", grace_period_seconds=0
                )
        for cq in (self.lender, self.borrower):
            with contextlib.suppress(ApiException):
                await self.custom.delete_namespaced_custom_object(*KUEUE, ns, "localqueues", cq)
        for plural, name in reversed(self.created):
            with contextlib.suppress(ApiException):
                await self.custom.delete_cluster_custom_object(*KUEUE, plural, name)


def _condition(obj: dict[str, Any], kind: str, field: str = "status") -> str:
    for c in (obj.get("status") or {}).get("conditions") or ():
        if c.get("type") == kind:
            return str(c.get(field, ""))
    return ""


async def until(check: Callable[[], Any], what: str, timeout_s: float = 90) -> Any:
    """Poll ``check`` (sync or async) until it returns something truthy; that value."""
    end = asyncio.get_running_loop().time() + timeout_s
    while True:
        got = check()
        if asyncio.iscoroutine(got):
            got = await got
        if got:
            return got
        if asyncio.get_running_loop().time() > end:
            raise TimeoutError(f"not after {timeout_s}s: {what}")
        await asyncio.sleep(0.25)


# --- the test --------------------------------------------------------------------------------


@pytest.fixture
async def h(stack: Any) -> AsyncIterator[Harness]:
    async with Harness(stackenv.load()) as harness:
        yield harness


@pytest.fixture
async def kwok(h: Harness) -> AsyncIterator[TrainingKwok]:
    k = TrainingKwok(h.stack, f"kueue-{h.run_id}", h.workdir)
    await k.start()
    try:
        yield k
    finally:
        await k.stop()


@pytest.fixture
async def relay(h: Harness) -> AsyncIterator[CheckpointRelay]:
    r = CheckpointRelay(h.trainers)
    await r.start()
    try:
        yield r
    finally:
        await r.stop()


async def add_training_nodes(h: Harness, kwok: TrainingKwok, label: tuple[str, str]) -> None:
    assert h.api is not None
    specs = [h.node_spec(i, gpus=4) for i in range(2)]
    core = k8s.CoreV1Api(h.api)
    for spec in specs:
        body = fleet.node_body(spec)
        body["metadata"]["annotations"]["kwok.x-k8s.io/node"] = kwok.selector
        body["metadata"]["labels"][label[0]] = label[1]
        await core.create_node(cast(Any, body))
    h.nodes.extend(specs)  # the harness deletes them
    await fleet.wait_nodes_ready(h.api, [s.name for s in specs])


def kueue_notice(workload: dict[str, Any]) -> Notice:
    """The notice the kueue parser makes of the Workload as the API serves it."""
    outcome = handlers.parse("kueue", json.dumps(workload).encode(), received_at=utcnow())
    assert isinstance(outcome, tuple) and len(outcome) == 1, outcome
    return outcome[0]


async def test_kueue_reclaim_within_cohort(
    h: Harness, kwok: TrainingKwok, relay: CheckpointRelay
) -> None:
    label = ("reclaimd.io/kueue-run", h.run_id)
    await add_training_nodes(h, kwok, label)
    kueue = Kueue(h, label)
    try:
        await kueue.create()
        await h.start_daemon(
            sqs={"enabled": False},
            kueue={"enabled": True, "namespaces": [h.namespace]},
            # The relay stands in for the ranks on loopback: not the pods' own IPs.
            checkpoint={"allowed_hosts": ["127.0.0.1"]},
        )

        # The borrower: 3 ranks x 2 GPUs, admitted on 6 of the lender's 8 GPUs (its own: 0).
        borrower = await kueue.submit("borrower", kueue.borrower, 3, 2, relay.template)
        pods = await until(
            lambda: _all_running(kueue, "borrower", 3), "the borrower's 3 pods Running"
        )
        wl = await kueue.workload_of(borrower.metadata.uid)
        assert wl is not None and _condition(wl, "Admitted") == "True"
        assert wl["status"]["admission"]["clusterQueue"] == kueue.borrower
        ranks = {f"{h.namespace}/{p.metadata.name}" for p in pods}
        for key in ranks:
            await h.trainers.add(key)

        # The lender wants 4 of its 8 back: Kueue evicts the borrower to reclaim them.
        lender = await kueue.submit("lender", kueue.lender, 2, 2, relay.template)
        events = await h.ledger_events(count=1, timeout_s=120, settle_s=3.0)

        evicted = await kueue.workload_of(borrower.metadata.uid)
        assert evicted is not None
        assert _condition(evicted, "Evicted", "reason") == "Preempted"
        assert _condition(evicted, "Preempted", "reason") == "InCohortReclamation"
        notice = kueue_notice(evicted)
        # Kueue names the preemptor in its message: the lender's Job.
        assert notice.attributes["preemptor_job_uid"] == lender.metadata.uid

        # every rank of the borrower was asked to checkpoint, and no other pod
        assert h.trainers.asked(notice.id) == ranks

        # one event, for the borrower's gang, with the preemption reason
        assert len(events) == 1, events
        event = events[0]
        assert event["x_NoticeId"] == notice.id
        assert event["x_NoticeReason"] == "InCohortReclamation"
        assert event["x_NoticeKind"] == "reclaim"
        assert event["x_GangSize"] == 3
        assert event["x_CheckpointOutcome"] == "checkpointed"

        # the claim is on the Workload, and the runbook finished
        claim = await until(
            lambda: _claim_done(kueue, borrower.metadata.uid), "the claim on the Workload done"
        )
        assert claim["notice_id"] == notice.id

        # the borrower's pods are gone; the lender runs on the quota it took back
        assert await h.pods_left([k.split("/", 1)[1] for k in ranks]) == []
        await until(lambda: _all_running(kueue, "lender", 2), "the lender's pods Running")

        timings = await h.timings(notice)
        print(f"\nkueue reclaim timings (s): {json.dumps(timings, sort_keys=True)}")
        (h.workdir / "kueue-timings.json").write_text(json.dumps(timings, sort_keys=True))
        assert "all_ranks_signaled_s" in timings and "drained_s" in timings
    finally:
        await kueue.delete()


async def _all_running(kueue: Kueue, job: str, count: int) -> list[Any]:
    pods = await kueue.running_pods(job)
    return pods if len(pods) == count else []


async def _claim_done(kueue: Kueue, job_uid: str) -> dict[str, Any] | None:
    wl = await kueue.workload_of(job_uid)
    raw = ((wl or {}).get("metadata") or {}).get("annotations", {}).get(CLAIM)
    claim: dict[str, Any] | None = json.loads(raw) if raw else None
    return claim if claim and claim.get("phase") == "done" else None
