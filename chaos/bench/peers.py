"""``make bench-peers``: one Spot storm handled by released aws-node-termination-handler (NTH)
and by reclaimd, side by side, against the same local apiserver.

The storm: N kwok nodes x 2 plain pods (one gang of two ranks per node, not opted in to
checkpoints), one Spot Interruption Warning per node sent at once to a fresh SQS queue. One
consumer at a time: NTH first (stopped at the end of its run), then fresh nodes and pods for
reclaimd. Each node is both a kwok node and an EC2 instance in a moto of the bench's own (NTH
maps instance id -> ``PrivateDnsName`` with DescribeInstances, reclaimd reads
``spec.providerID``), so the same node objects serve both. How NTH is built and run out of a
pod: deploy/local/nth/build.sh and ../shared/research/nth-peer-bench.md.

Measured per node from its message's send: cordoned (a node watch sees
``spec.unschedulable``), all its pods gone (a pod watch sees the DELETED events); per run the
makespan, when the queue was first empty, and the API requests each consumer made, counted at
the apiserver: each consumer runs as a ServiceAccount of the bench's own namespace (NTH with its
Helm chart's rules, reclaimd with deploy/kubernetes/rbac.yaml's), each gets FlowSchemas of its
own (one per resource and verb, on the priority level it would have had anyway, so nothing about
its treatment changes), and the apiserver's ``apiserver_flowcontrol_dispatched_requests_total``
is read before and after. Timings are reported, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import re
import signal
import ssl
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn, cast

import yaml

from chaos.ports import free_port as _free_port

REPO = Path(__file__).resolve().parents[2]
NTH_BUILD = REPO / "deploy" / "local" / "nth" / "build.sh"
NTH_VERSION = "v1.25.6"
REGION, ZONE = "us-east-2", "us-east-2a"
LABEL = "reclaimd.io/bench-peers"
# Both consumers run as ServiceAccounts of the bench's own namespace: identities nobody else
# on the shared stack uses, so the requests counted for them are theirs alone.
BENCH_NAMESPACE = "bench-peers"
NTH_SA = "aws-node-termination-handler"
RECLAIMD_SA = "reclaimd"
SIDES = ("nth", "reclaimd")
PODS_PER_NODE = 2

# NTH's Helm chart ClusterRole (config/helm/aws-node-termination-handler/templates/
# clusterrole.yaml at v1.25.6), events omitted since EMIT_KUBERNETES_EVENTS is off.
NTH_RULES: list[dict[str, Any]] = [
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "patch", "update"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "get"]},
    {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]},
    {"apiGroups": ["extensions"], "resources": ["daemonsets"], "verbs": ["get"]},
    {"apiGroups": ["apps"], "resources": ["daemonsets"], "verbs": ["get"]},
]


class BenchError(Exception):
    """Something the bench cannot work around: one line, exit 2."""


# --- arguments --------------------------------------------------------------------------------


class _OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad argument is one line on stderr and exit 2 (no usage dump)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {value}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive: {value}")
    return value


def _sides(text: str) -> tuple[str, ...]:
    wanted = tuple(s.strip() for s in text.split(",") if s.strip())
    bad = [s for s in wanted if s not in SIDES]
    if bad or not wanted:
        raise argparse.ArgumentTypeError(f"sides are nth and/or reclaimd, got {text!r}")
    return tuple(s for s in SIDES if s in wanted)  # NTH first, always


def build_parser() -> argparse.ArgumentParser:
    p = _OneLineParser(
        prog="bench-peers",
        description="One Spot storm through released NTH and through reclaimd, side by side.",
    )
    p.add_argument("--nodes", type=_positive_int, default=200, help="kwok nodes (2 pods each)")
    p.add_argument("--repeat", type=_positive_int, default=3, help="runs per side")
    p.add_argument(
        "--cap", type=_positive_float, default=300.0, help="seconds a run may take after the send"
    )
    p.add_argument("--sides", type=_sides, default=SIDES, help="nth,reclaimd (default both)")
    p.add_argument("--nth-workers", type=_positive_int, default=None, help="default: --nodes")
    p.add_argument("--out", type=Path, default=Path("out/bench-peers.json"))
    return p


# --- small pure helpers (unit-tested) ---------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile; None for no values."""
    ordered = sorted(values)
    if not ordered:
        return None
    k = max(0, min(len(ordered) - 1, round(q * (len(ordered) - 1))))
    return ordered[k]


def flow_counts(metrics_text: str, prefix: str) -> dict[str, dict[str, float]]:
    """From the apiserver's /metrics: dispatched and rejected requests per FlowSchema whose
    name starts with ``prefix``, as {"dispatched": {fs: n}, "rejected": {fs: n}}."""
    out: dict[str, dict[str, float]] = {"dispatched": {}, "rejected": {}}
    pattern = re.compile(
        r"^apiserver_flowcontrol_(dispatched|rejected)_requests_total\{([^}]*)\}\s+(\S+)"
    )
    for line in metrics_text.splitlines():
        m = pattern.match(line)
        if not m:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
        fs = labels.get("flow_schema", "")
        if fs.startswith(prefix):
            bucket = out[m.group(1)]
            bucket[fs] = bucket.get(fs, 0.0) + float(m.group(3))
    return out


def delta(
    after: dict[str, dict[str, float]], before: dict[str, dict[str, float]]
) -> dict[str, Any]:
    return {
        kind: {k: int(v - before.get(kind, {}).get(k, 0.0)) for k, v in after[kind].items()}
        for kind in after
    }


def ratio(slow: float | None, fast: float | None) -> float | None:
    if slow is None or fast is None or fast <= 0:
        return None
    return round(slow / fast, 1)


# --- counting requests at the apiserver -------------------------------------------------------

# (bucket, apiGroup, resource, verbs): one FlowSchema each per identity, most specific first.
BUCKETS: list[tuple[str, str, str, list[str]]] = [
    ("node-get", "", "nodes", ["get"]),
    ("node-list", "", "nodes", ["list"]),
    ("node-watch", "", "nodes", ["watch"]),
    ("node-patch", "", "nodes", ["patch"]),
    ("node-update", "", "nodes", ["update"]),
    ("pod-get", "", "pods", ["get"]),
    ("pod-list", "", "pods", ["list"]),
    ("pod-watch", "", "pods", ["watch"]),
    ("pod-delete", "", "pods", ["delete"]),
    ("pod-evict", "", "pods/eviction", ["create"]),
    ("lease-read", "coordination.k8s.io", "leases", ["get", "list", "watch"]),
    ("lease-write", "coordination.k8s.io", "leases", ["*"]),
    ("other-read", "*", "*", ["get", "list", "watch"]),
    ("other-write", "*", "*", ["*"]),
    ("non-resource", "", "", ["*"]),  # discovery, /version, /healthz: reads
]
READ_BUCKETS = {b for b, _, r, verbs in BUCKETS if not r or set(verbs) <= {"get", "list", "watch"}}
FS_PREFIX = "bench-peers-"


def flow_schemas(side: str, subject: dict[str, Any], priority_level: str) -> list[dict[str, Any]]:
    docs = []
    for i, (bucket, group, resource, verbs) in enumerate(BUCKETS):
        rule: dict[str, Any] = {"subjects": [subject]}
        if resource:
            rule["resourceRules"] = [
                {
                    "verbs": verbs,
                    "apiGroups": [group],
                    "resources": [resource],
                    "clusterScope": True,
                    "namespaces": ["*"],
                }
            ]
        else:
            rule["nonResourceRules"] = [{"verbs": verbs, "nonResourceURLs": ["*"]}]
        docs.append(
            {
                "apiVersion": "flowcontrol.apiserver.k8s.io/v1",
                "kind": "FlowSchema",
                "metadata": {"name": f"{FS_PREFIX}{side}-{bucket}", "labels": {LABEL: "apf"}},
                "spec": {
                    "priorityLevelConfiguration": {"name": priority_level},
                    # After the system schemas (<= 900), before service-accounts (9000) and
                    # global-default (9900), which these identities would otherwise match.
                    "matchingPrecedence": 1000 + (0 if side == "nth" else 100) + i,
                    "distinguisherMethod": {"type": "ByUser"},
                    "rules": [rule],
                },
            }
        )
    return docs


def summarize_requests(counts: dict[str, Any], side: str) -> dict[str, Any]:
    """Per bucket, plus reads / writes / total and the APF rejections (429s)."""
    prefix = f"{FS_PREFIX}{side}-"
    by = {
        k.removeprefix(prefix): v for k, v in counts["dispatched"].items() if k.startswith(prefix)
    }
    by = {k: v for k, v in sorted(by.items()) if v}
    rejected = sum(v for k, v in counts["rejected"].items() if k.startswith(prefix))
    reads = sum(v for k, v in by.items() if k in READ_BUCKETS)
    total = sum(by.values())
    return {"total": total, "reads": reads, "writes": total - reads, "rejected": rejected, "by": by}


@dataclass
class Apiserver:
    """The stack's apiserver as admin (client certificate), for /metrics and probes."""

    url: str
    ca: Path
    cert: Path
    key: Path

    def _get(self, path: str, headers: dict[str, str] | None = None, *, admin: bool = True) -> Any:
        ctx = ssl.create_default_context(cafile=str(self.ca))
        if admin:
            ctx.load_cert_chain(str(self.cert), str(self.key))
        req = urllib.request.Request(self.url + path, headers=headers or {})
        return urllib.request.urlopen(req, context=ctx, timeout=30)

    def metrics(self) -> str:
        with self._get("/metrics") as r:
            return cast(bytes, r.read()).decode()

    def priority_level_of(self, token: str, timeout_s: float = 30) -> str:
        """The APF priority level a request with this token lands on (a response header),
        once the token may list nodes (a new binding takes a moment to reach the authorizer)."""
        ctx = ssl.create_default_context(cafile=str(self.ca))
        headers = {"Authorization": f"Bearer {token}"}
        req = urllib.request.Request(self.url + "/api/v1/nodes?limit=1", headers=headers)
        end = time.monotonic() + timeout_s
        while True:
            try:
                with urllib.request.urlopen(req, context=ctx, timeout=30) as r:
                    uid = r.headers.get("X-Kubernetes-PF-PriorityLevel-UID", "")
                break
            except urllib.error.HTTPError as e:
                if e.code != 403 or time.monotonic() > end:
                    raise BenchError(f"a bench identity cannot list nodes: HTTP {e.code}") from e
                time.sleep(0.3)
        path = "/apis/flowcontrol.apiserver.k8s.io/v1/prioritylevelconfigurations"
        with self._get(path) as r:
            items = json.loads(r.read())["items"]
        for item in items:
            if item["metadata"]["uid"] == uid:
                return str(item["metadata"]["name"])
        raise BenchError(f"no priority level with uid {uid!r} (is APF on?)")


# --- NTH: build, identity, process ------------------------------------------------------------


def ensure_nth() -> Path:
    """The cached NTH binary; build.sh builds it first if missing (its progress on stderr)."""
    try:
        done = subprocess.run(
            ["bash", str(NTH_BUILD), NTH_VERSION], stdout=subprocess.PIPE, text=True, check=False
        )
    except OSError as e:
        raise BenchError(f"cannot run {NTH_BUILD}: {e.strerror}") from e
    if done.returncode != 0:
        raise BenchError(f"building NTH {NTH_VERSION} failed (exit {done.returncode}); see above")
    path = Path(done.stdout.strip().splitlines()[-1])
    if not os.access(path, os.X_OK):
        raise BenchError(f"build.sh printed {path}, which is not an executable")
    return path


# Runs as `sh -c SCRIPT sh TOKEN CA NAMESPACE BINARY` inside `unshare --mount`: a private
# tmpfs over /run (/var/run -> /run) holds the service-account files where
# rest.InClusterConfig() looks, then NTH replaces the shell, so the PID we hold is NTH's.
NTH_MOUNT_SCRIPT = """set -e
mount -t tmpfs -o size=1m,mode=755 tmpfs /run
d=/run/secrets/kubernetes.io/serviceaccount
mkdir -p "$d"
touch "$d/token" "$d/ca.crt" "$d/namespace"
mount --bind "$1" "$d/token"
mount --bind "$2" "$d/ca.crt"
mount --bind "$3" "$d/namespace"
exec "$4"
"""


def nth_env(
    *, queue_url: str, aws_endpoint: str, api_host: str, api_port: str, workers: int
) -> dict[str, str]:
    """Queue mode at its best (nth-peer-bench.md, "A fair comparison"), as far as it works."""
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", "/root"),
        "KUBERNETES_SERVICE_HOST": api_host,
        "KUBERNETES_SERVICE_PORT": api_port,
        "NODE_NAME": "bench-peers-nth",  # required even in queue mode
        "ENABLE_SQS_TERMINATION_DRAINING": "true",
        "QUEUE_URL": queue_url,
        "AWS_REGION": REGION,
        "AWS_ENDPOINT": aws_endpoint,  # aws-sdk-go v1: SQS and EC2 (AWS_ENDPOINT_URL ignored)
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "WORKERS": str(workers),
        "TAINT_NODE": "true",
        # Not "true": in v1.25.6 that path lists a node's pods only inside the Kubernetes-events
        # branch (pkg/node/node.go, CordonAndDrain), so with events off it cordons and evicts
        # nothing, and still deletes the message. "false" drains (one quorum-read LIST per node).
        "USE_APISERVER_CACHE": "false",
        "CHECK_TAG_BEFORE_DRAINING": "false",
        "CHECK_ASG_TAG_BEFORE_DRAINING": "false",
        "EMIT_KUBERNETES_EVENTS": "false",
        "SQS_MSG_VISIBILITY_TIMEOUT_SEC": "119",
        "POD_TERMINATION_GRACE_PERIOD": "-1",  # the pod's own, as reclaimd's evictions
        "ENABLE_PROMETHEUS_SERVER": "false",
        "ENABLE_PROBES_SERVER": "false",
        "JSON_LOGGING": "true",
        "LOG_LEVEL": "info",
    }


@dataclass
class NthProcess:
    binary: Path
    workdir: Path
    env: dict[str, str]
    token: Path
    ca: Path
    namespace_file: Path
    name: str = "nth"
    proc: asyncio.subprocess.Process | None = None

    @property
    def log_path(self) -> Path:
        return self.workdir / f"{self.name}.log"

    def _log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def tail(self, lines: int = 3) -> str:
        return " | ".join(self._log().splitlines()[-lines:])

    async def start(self, timeout_s: float = 60) -> None:
        log = self.log_path.open("ab")
        args = [str(self.token), str(self.ca), str(self.namespace_file), str(self.binary)]
        self.proc = await asyncio.create_subprocess_exec(
            "unshare", "--mount", "--propagation", "private",
            "sh", "-c", NTH_MOUNT_SCRIPT, "sh", *args,
            stdout=log, stderr=log, env=self.env,
        )  # fmt: skip
        log.close()
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout_s
        while "Started watching for interruption events" not in self._log():
            if self.proc.returncode is not None:
                raise BenchError(f"NTH exited {self.proc.returncode}: {self.tail()}")
            if loop.time() > end:
                raise BenchError(f"NTH not running after {timeout_s:g}s: {self.tail()}")
            await asyncio.sleep(0.1)

    async def stop(self, timeout_s: float = 10) -> None:
        if self.proc is None or self.proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(self.proc.wait(), timeout_s)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            await self.proc.wait()


# --- a moto of the bench's own, with the instances ----------------------------------------------


@dataclass
class Moto:
    """``moto_server`` on a free loopback port: SQS queues and EC2 instances of this bench
    only (the stack's moto keeps every earlier run's state)."""

    workdir: Path
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    ec2: Any = None
    subnet: str = ""
    octet: int = field(default_factory=lambda: random.randint(1, 250))
    launched: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 30) -> None:
        import boto3

        server = Path(sys.executable).parent / "moto_server"
        if not server.exists():
            raise BenchError(f"{server} missing: run `make venv`")
        self.port = _free_port()
        log = (self.workdir / "moto.log").open("ab")
        # Its own session: a Ctrl-C meant for the bench must not take moto down mid-cleanup.
        self.proc = subprocess.Popen(
            [str(server), "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
        log.close()
        end = time.monotonic() + timeout_s
        while True:
            try:
                with urllib.request.urlopen(self.url + "/moto-api/", timeout=2):
                    break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > end:
                    log_path = self.workdir / "moto.log"
                    raise BenchError(f"moto did not start; log: {log_path}") from None
                time.sleep(0.2)
        self.ec2 = boto3.client(
            "ec2", endpoint_url=self.url, region_name=REGION,
            aws_access_key_id="testing", aws_secret_access_key="testing",
        )  # fmt: skip
        vpc = self.ec2.create_vpc(CidrBlock=f"10.{self.octet}.0.0/16")["Vpc"]["VpcId"]
        self.subnet = self.ec2.create_subnet(
            VpcId=vpc, CidrBlock=f"10.{self.octet}.0.0/16", AvailabilityZone=ZONE
        )["Subnet"]["SubnetId"]

    def launch(self, n: int) -> list[tuple[str, str]]:
        """``n`` running instances with addresses of their own: (instance id, PrivateDnsName)."""
        from concurrent.futures import ThreadPoolExecutor

        # Explicit addresses: moto picks random ones, and a repeated name would be one node.
        ips = []
        for _ in range(n):
            k = self.launched + 16
            self.launched += 1
            ips.append(f"10.{self.octet}.{k >> 8}.{k & 255}")

        def one(ip: str) -> tuple[str, str]:
            inst = self.ec2.run_instances(
                ImageId="ami-12c6146b", MinCount=1, MaxCount=1, InstanceType="p5.48xlarge",
                SubnetId=self.subnet, PrivateIpAddress=ip,
            )["Instances"][0]  # fmt: skip
            return str(inst["InstanceId"]), str(inst["PrivateDnsName"])

        with ThreadPoolExecutor(8) as pool:
            return list(pool.map(one, ips))

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


# --- watching the storm -----------------------------------------------------------------------


@dataclass
class Observed:
    """Monotonic times of what the watches saw."""

    cordoned: dict[str, float] = field(default_factory=dict)  # node -> first unschedulable
    gone: dict[str, float] = field(default_factory=dict)  # pod -> DELETED


async def _watch(
    list_call: Callable[..., Any], on_event: Callable[[str, Any, float], None], rv: str, **kw: Any
) -> None:
    """Follow a watch from ``rv`` until cancelled, resuming from the last version seen."""
    from kubernetes_asyncio import watch

    loop = asyncio.get_running_loop()
    while True:
        w = watch.Watch()
        try:
            async for ev in w.stream(list_call, resource_version=rv, timeout_seconds=900, **kw):
                obj = ev["object"]
                if ev["type"] == "ERROR":
                    raise BenchError(f"watch error: {str(obj)[:120]}")
                rv = obj.metadata.resource_version or rv
                on_event(ev["type"], obj, loop.time())
        finally:
            w.stop()


# --- one run of one side ----------------------------------------------------------------------


@dataclass
class Bench:
    args: argparse.Namespace
    stack: Any  # chaos.stack.StackEnv, pointed at the bench's moto
    moto: Moto
    apiserver: Apiserver
    workdir: Path
    nth_binary: Path | None = None
    tokens: dict[str, Path] = field(default_factory=dict)
    reclaimd_kubeconfig: Path | None = None
    background: dict[str, int] = field(default_factory=dict)
    failed: list[dict[str, Any]] = field(default_factory=list)
    runs: list[dict[str, Any]] = field(default_factory=list)

    def say(self, message: str) -> None:
        print(f"bench-peers: {message}", file=sys.stderr, flush=True)

    # --- identities and FlowSchemas -------------------------------------------------------

    async def setup_identities(self) -> None:
        """Both ServiceAccounts with their RBAC, a token each, the FlowSchemas that count them."""
        from kubernetes_asyncio import client as k8s

        from chaos import fleet, kube
        from chaos.harness import RBAC
        from chaos.kube import rig_client

        api = await rig_client(self.stack.kubeconfig)
        try:
            await self._delete_flow_schemas(api)
            # Nodes an interrupted bench left behind (their names could come round again).
            stale = await k8s.CoreV1Api(api).list_node(label_selector=LABEL)
            await fleet.delete_nodes(api, [n.metadata.name for n in stale.items])
            await fleet.ensure_namespace(api, BENCH_NAMESPACE)
            await kube.apply_file(api, RBAC)
            await kube.apply_documents(api, [*_nth_rbac(), *_reclaimd_rbac(RBAC)])
            core = k8s.CoreV1Api(api)
            docs = []
            for side in self.args.sides:
                sa = NTH_SA if side == "nth" else RECLAIMD_SA
                # A day is plenty for one bench; a pod's projected token would be rotated.
                token = await core.create_namespaced_service_account_token(
                    sa, BENCH_NAMESPACE, cast(Any, {"spec": {"expirationSeconds": 86400}})
                )
                self.tokens[side] = self.workdir / f"{side}-token"
                self.tokens[side].write_text(token.status.token)
                self.tokens[side].chmod(0o600)
                level = await asyncio.to_thread(
                    self.apiserver.priority_level_of, token.status.token
                )
                subject = {
                    "kind": "ServiceAccount",
                    "serviceAccount": {"name": sa, "namespace": BENCH_NAMESPACE},
                }
                docs += flow_schemas(side, subject, level)
                self.say(f"counting {side}'s API requests at the apiserver (APF level {level})")
            (self.workdir / "namespace").write_text(BENCH_NAMESPACE)
            if "reclaimd" in self.tokens:
                self.reclaimd_kubeconfig = self._token_kubeconfig(self.tokens["reclaimd"])
            await kube.apply_documents(api, docs)
            await asyncio.sleep(2)  # the APF config controller picks new schemas up in ~1 s
            self.background = await _cluster_size(core)
            self.say(
                f"the apiserver holds {self.background['nodes']} nodes and "
                f"{self.background['pods']} pods besides the bench's (shared stack)"
            )
        finally:
            await api.close()

    def _token_kubeconfig(self, token: Path) -> Path:
        admin = yaml.safe_load(Path(self.stack.kubeconfig).read_text())
        cluster = admin["clusters"][0]
        user = "bench-peers-reclaimd"
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [cluster],
            "users": [{"name": user, "user": {"token": token.read_text()}}],
            "contexts": [{"name": user, "context": {"cluster": cluster["name"], "user": user}}],
            "current-context": user,
        }
        path = self.workdir / "reclaimd.kubeconfig"
        path.write_text(yaml.safe_dump(config))
        path.chmod(0o600)
        return path

    async def _delete_flow_schemas(self, api: Any) -> None:
        from kubernetes_asyncio import client as k8s

        custom = k8s.CustomObjectsApi(api)
        g, v, r = "flowcontrol.apiserver.k8s.io", "v1", "flowschemas"
        listed = await custom.list_cluster_custom_object(g, v, r, label_selector=LABEL)
        for item in listed["items"]:
            with contextlib.suppress(Exception):
                await custom.delete_cluster_custom_object(g, v, r, item["metadata"]["name"])

    async def teardown_identities(self) -> None:
        from chaos.kube import rig_client

        api = await rig_client(self.stack.kubeconfig)
        try:
            await self._delete_flow_schemas(api)
        finally:
            await api.close()

    def _counts(self) -> dict[str, dict[str, float]]:
        return flow_counts(self.apiserver.metrics(), FS_PREFIX)

    # --- a run ----------------------------------------------------------------------------

    async def run_side(self, side: str, repeat: int) -> dict[str, Any]:
        from kubernetes_asyncio import client as k8s

        from chaos import fleet
        from chaos.harness import Harness

        n = self.args.nodes
        run_id = f"bp{repeat}{side[0]}{uuid.uuid4().hex[:5]}"
        label = {LABEL: run_id}
        selector = f"{LABEL}={run_id}"
        tag = f"{side} run {repeat}/{self.args.repeat}"
        async with Harness(self.stack, name=run_id, workdir=self.workdir / run_id) as h:
            assert h.api is not None
            core, ns = k8s.CoreV1Api(h.api), h.namespace
            instances = await asyncio.to_thread(self.moto.launch, n)
            specs = [fleet.NodeSpec(name=dns, instance_id=iid, zone=ZONE) for iid, dns in instances]
            h.nodes.extend(specs)  # the harness deletes them at the end
            try:
                await fleet.create_nodes_labelled(h.api, specs, label)
                await fleet.wait_listed(
                    h.api, what="nodes", names=[s.name for s in specs], ready=fleet.node_is_ready,
                    list_call=lambda: core.list_node(label_selector=selector),
                    timeout_s=300,
                )  # fmt: skip
                gangs = [
                    fleet.GangSpec(
                        name=f"g{i}",
                        ranks=[fleet.RankSpec(s.name)] * PODS_PER_NODE,
                        extra_labels=label,
                    )
                    for i, s in enumerate(specs)
                ]
                pods = await fleet.create_gangs(h.api, gangs, h.namespace)
                await fleet.wait_listed(
                    h.api, what="pods", names=pods, ready=fleet.pod_is_running,
                    list_call=lambda: core.list_namespaced_pod(ns, label_selector=selector),
                    timeout_s=300,
                )  # fmt: skip
                node_of = {p: s.name for s, g in zip(specs, gangs, strict=True) for p in
                           (g.pod_name(r) for r in range(PODS_PER_NODE))}  # fmt: skip
                self.say(f"{tag}: {n} nodes Ready, {len(pods)} pods Running")
                result = await self._storm(_Run(side, tag, h, specs, node_of, selector))
            finally:
                await self._clear_pods(core, h.namespace)
                await fleet.delete_namespace(h.api, h.namespace)
        result.update({"side": side, "repeat": repeat, "run_id": run_id})
        return result

    async def _clear_pods(self, core: Any, namespace: str) -> None:
        """Pods a capped run left behind: deleted at once, so their nodes can go too."""
        with contextlib.suppress(Exception):
            await core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)

    async def _start(self, side: str, h: Any) -> Any:
        from chaos.process import DaemonProcess

        if side == "reclaimd":
            # `reclaimd run` with the drills' settings, its SQS source on the bench's queue.
            kube = {"kubeconfig": str(self.reclaimd_kubeconfig)}
            config = h.daemon_config(holder=h.holder("reclaimd"), kube=kube)
            d = DaemonProcess(config, h.workdir, "reclaimd")
            h.daemons.append(d)  # stopped by the harness, even if it never comes up
            try:
                # Its cache LISTs the whole cluster first: minutes when the shared stack is busy.
                await d.start(timeout_s=180)
            except (RuntimeError, TimeoutError) as e:
                raise BenchError(f"reclaimd did not start: {e}") from e
            return d
        assert self.nth_binary is not None
        api_host, _, api_port = self.apiserver.url.removeprefix("https://").partition(":")
        env = nth_env(
            queue_url=h.queue_url,
            aws_endpoint=self.moto.url,
            api_host=api_host,
            api_port=api_port or "443",
            workers=self.args.nth_workers or self.args.nodes,
        )
        p = NthProcess(
            self.nth_binary, h.workdir, env, self.tokens["nth"], self.apiserver.ca,
            self.workdir / "namespace",
        )  # fmt: skip
        await p.start()
        return p

    async def _storm(self, run: _Run) -> dict[str, Any]:
        from kubernetes_asyncio import client as k8s

        core = k8s.CoreV1Api(run.h.api)
        seen = Observed()
        watches = await self._watches(run, core, seen)
        before = await asyncio.to_thread(self._counts)
        consumer: Any = None
        try:
            consumer = await self._start(run.side, run.h)
            self.say(f"{run.tag}: {run.side} running; sending {len(run.specs)} Spot warnings")
            at_send = await asyncio.to_thread(self._counts)
            sent, t0, t_sent = await self._send_all(run)
            queue_empty_at, ended = await self._until_done(run, seen, t0)
        finally:
            if consumer is not None:
                await consumer.stop()
            for w in watches:
                w.cancel()
            await asyncio.gather(*watches, return_exceptions=True)
        after = await asyncio.to_thread(self._counts)
        result = per_node_figures(run.specs, run.pods_of, sent=sent, seen=seen, t0=t0, ended=ended)
        result.update(
            {
                "send_spread_s": round(t_sent - t0, 3),
                "queue_empty_s": None if queue_empty_at is None else round(queue_empty_at - t0, 3),
                "cap_s": self.args.cap,
                "requests": summarize_requests(delta(after, at_send), run.side),
                "startup_requests": summarize_requests(delta(at_send, before), run.side),
            }
        )
        self.say(f"{run.tag}: {one_line(result)}")
        return result

    async def _watches(self, run: _Run, core: Any, seen: Observed) -> list[asyncio.Task[None]]:
        """Node and pod watches from the current state, recording into ``seen``."""

        def on_node(kind: str, node: Any, at: float) -> None:
            name = node.metadata.name
            if node.spec and node.spec.unschedulable and name not in seen.cordoned:
                seen.cordoned[name] = at

        def on_pod(kind: str, pod: Any, at: float) -> None:
            if kind == "DELETED" and pod.metadata.name in run.node_of:
                seen.gone.setdefault(pod.metadata.name, at)

        ns, sel = run.h.namespace, run.selector
        nodes_rv = (await core.list_node(label_selector=sel)).metadata.resource_version
        pods = await core.list_namespaced_pod(ns, label_selector=sel)
        return [
            asyncio.create_task(_watch(core.list_node, on_node, nodes_rv, label_selector=sel)),
            asyncio.create_task(
                _watch(
                    core.list_namespaced_pod,
                    on_pod,
                    pods.metadata.resource_version,
                    namespace=ns,
                    label_selector=sel,
                )
            ),
        ]

    async def _send_all(self, run: _Run) -> tuple[dict[str, float], float, float]:
        """One warning per node, 16 sends at a time; each node's send time (when SQS took it)."""
        from chaos import inject

        loop = asyncio.get_running_loop()
        sent: dict[str, float] = {}
        gate = asyncio.Semaphore(16)

        async def send(spec: Any) -> None:
            event = inject.spot_itn_event(spec.instance_id, zone=spec.zone, region=REGION)
            async with gate:
                await asyncio.to_thread(inject.send_sqs, run.h.sqs, run.h.queue_url, event)
            sent[spec.name] = loop.time()

        t0 = loop.time()
        await asyncio.gather(*(send(s) for s in run.specs))
        return sent, t0, loop.time()

    async def _until_done(self, run: _Run, seen: Observed, t0: float) -> tuple[float | None, float]:
        """Until every node is cordoned, every pod gone and the queue empty, or the cap."""
        loop = asyncio.get_running_loop()
        queue_empty_at: float | None = None
        last_report = t0
        while loop.time() < t0 + self.args.cap:
            depth = await asyncio.to_thread(run.h.queue_depth)
            now = loop.time()
            if depth == 0 and queue_empty_at is None:
                queue_empty_at = now
            done = len(seen.cordoned) == len(run.specs) and len(seen.gone) == len(run.node_of)
            if done and queue_empty_at is not None:
                break
            if now - last_report >= 15:
                last_report = now
                self.say(
                    f"{run.tag}: t={now - t0:.0f}s {len(seen.cordoned)}/{len(run.specs)} "
                    f"cordoned, {len(seen.gone)}/{len(run.node_of)} pods gone, queue {depth}"
                )
            await asyncio.sleep(0.25)
        return queue_empty_at, loop.time()


@dataclass
class _Run:
    """One side's run: its harness, nodes, and which node each pod is on."""

    side: str
    tag: str
    h: Any  # chaos.harness.Harness
    specs: Sequence[Any]  # fleet.NodeSpec
    node_of: dict[str, str]
    selector: str

    @property
    def pods_of(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for pod, node in self.node_of.items():
            out.setdefault(node, []).append(pod)
        return out


def per_node_figures(
    specs: Sequence[Any],
    pods_of: dict[str, list[str]],
    *,
    sent: dict[str, float],
    seen: Observed,
    t0: float,
    ended: float,
) -> dict[str, Any]:
    """Per node: send -> cordoned, send -> its last pod gone; the run's totals."""
    cordon = [seen.cordoned[s.name] - sent[s.name] for s in specs if s.name in seen.cordoned]
    drained_nodes = [s.name for s in specs if all(p in seen.gone for p in pods_of[s.name])]
    drained = [max(seen.gone[p] for p in pods_of[n]) - sent[n] for n in drained_nodes]
    all_cordoned, all_drained = len(cordon) == len(specs), len(drained_nodes) == len(specs)
    complete = all_cordoned and all_drained
    last = max([*seen.cordoned.values(), *seen.gone.values()], default=t0)

    def r(x: float | None) -> float | None:
        return None if x is None else round(x, 3)

    return {
        "nodes": len(specs),
        "pods": sum(len(v) for v in pods_of.values()),
        "complete": complete,
        "elapsed_s": r(ended - t0),
        "cordoned": len(cordon),
        "drained_nodes": len(drained_nodes),
        "pods_gone": len(seen.gone),
        "cordoned_s": {"p50": r(percentile(cordon, 0.5)), "max": r(max(cordon, default=None))},
        "drained_s": {"p50": r(percentile(drained, 0.5)), "max": r(max(drained, default=None))},
        # from the first send; all-cordoned / all-drained only when every node got there
        "all_cordoned_s": r(max(seen.cordoned.values()) - t0) if all_cordoned else None,
        "all_drained_s": r(max(seen.gone.values()) - t0) if all_drained else None,
        "makespan_s": r(last - t0) if complete else None,
        "per_node": {
            "cordoned_s": sorted(round(x, 3) for x in cordon),
            "drained_s": sorted(round(x, 3) for x in drained),
        },
    }  # fmt: skip


def one_line(r: dict[str, Any]) -> str:
    def f(x: float | None) -> str:
        return "-" if x is None else f"{x:.1f}"

    return (
        f"{r['cordoned']}/{r['nodes']} cordoned (p50 {f(r['cordoned_s']['p50'])} s, "
        f"max {f(r['cordoned_s']['max'])} s), {r['drained_nodes']}/{r['nodes']} drained "
        f"(p50 {f(r['drained_s']['p50'])} s, max {f(r['drained_s']['max'])} s), "
        f"makespan {f(r['makespan_s'])} s, queue empty {f(r['queue_empty_s'])} s, "
        f"{r['requests']['total']} requests ({r['requests']['writes']} writes)"
    )


# --- summary ----------------------------------------------------------------------------------


def _median(values: Sequence[float]) -> float | None:
    return round(statistics.median(values), 3) if values else None


def summarize(runs: Sequence[dict[str, Any]], side: str) -> dict[str, Any] | None:
    """Pooled per-node figures over the side's runs; run totals as medians. A run that did not
    finish within its cap makes its side's max/makespan a lower bound (the cap)."""
    mine = [r for r in runs if r["side"] == side]
    if not mine:
        return None
    cordon = [x for r in mine for x in r["per_node"]["cordoned_s"]]
    drained = [x for r in mine for x in r["per_node"]["drained_s"]]
    complete = all(r["complete"] for r in mine)
    all_c = all(r["all_cordoned_s"] is not None for r in mine)
    all_d = all(r["all_drained_s"] is not None for r in mine)
    cap = max(r["elapsed_s"] for r in mine)

    def bound(values: list[float], ok: bool) -> dict[str, Any]:
        top = max(values, default=None)
        return {"value": top if ok else cap, "lower_bound": not ok}

    return {
        "runs": len(mine),
        "complete": complete,
        "nodes_per_run": mine[0]["nodes"],
        "cordoned_per_run": [r["cordoned"] for r in mine],
        "drained_per_run": [r["drained_nodes"] for r in mine],
        "cordoned_p50_s": percentile(cordon, 0.5) if all_c else None,
        "cordoned_max_s": bound(cordon, all_c),
        "drained_p50_s": percentile(drained, 0.5) if all_d else None,
        "drained_max_s": bound(drained, all_d),
        "all_cordoned_s": _bounded_median([r["all_cordoned_s"] for r in mine], cap),
        "all_drained_s": _bounded_median([r["all_drained_s"] for r in mine], cap),
        "makespan_s": _bounded_median([r["makespan_s"] for r in mine], cap),
        "queue_empty_s": _bounded_median([r["queue_empty_s"] for r in mine], cap),
        "requests": _median([r["requests"]["total"] for r in mine]),
        "writes": _median([r["requests"]["writes"] for r in mine]),
        "rejected": sum(r["requests"]["rejected"] for r in mine),
    }


def _bounded_median(values: Sequence[float | None], cap: float) -> dict[str, Any]:
    """Median over runs; a run that never got there counts as the cap, marked a lower bound."""
    done = [v for v in values if v is not None]
    filled = [v if v is not None else cap for v in values]
    return {"value": _median(filled), "lower_bound": len(done) < len(values)}


def ratios(nth: dict[str, Any], rc: dict[str, Any]) -> dict[str, Any]:
    """NTH / reclaimd; ``at_least`` when NTH's figure is a lower bound (it hit the cap)."""

    def b(key: str) -> dict[str, Any]:
        n, r = nth[key], rc[key]
        return {"ratio": ratio(n["value"], r["value"]), "at_least": n["lower_bound"]}

    out = {
        "cordoned_p50": {"ratio": ratio(nth["cordoned_p50_s"], rc["cordoned_p50_s"]),
                         "at_least": nth["cordoned_p50_s"] is None},
        "cordoned_max": b("cordoned_max_s"),
        "drained_p50": {"ratio": ratio(nth["drained_p50_s"], rc["drained_p50_s"]),
                        "at_least": nth["drained_p50_s"] is None},
        "drained_max": b("drained_max_s"),
        "all_cordoned": b("all_cordoned_s"),
        "all_drained": b("all_drained_s"),
        "makespan": b("makespan_s"),
        "requests": {"ratio": ratio(nth["requests"], rc["requests"]), "at_least": False},
    }  # fmt: skip
    for key in ("all_cordoned", "all_drained"):
        value = out[key]["ratio"]
        out[key]["target_10x_met"] = value is not None and value >= 10
    return out


def table(summary: dict[str, Any], rat: dict[str, Any] | None) -> str:
    def cell(v: Any) -> str:
        if isinstance(v, dict):
            if v.get("value") is None:
                return "-"
            return (">" if v["lower_bound"] else "") + f"{v['value']:.1f}"
        return "-" if v is None else f"{v:.1f}" if isinstance(v, float) else str(v)

    rows = [
        ("send->cordoned p50 s", "cordoned_p50_s", "cordoned_p50"),
        ("send->cordoned max s", "cordoned_max_s", "cordoned_max"),
        ("send->pods gone p50 s", "drained_p50_s", "drained_p50"),
        ("send->pods gone max s", "drained_max_s", "drained_max"),
        ("all cordoned s", "all_cordoned_s", "all_cordoned"),
        ("all drained s", "all_drained_s", "all_drained"),
        ("makespan s", "makespan_s", "makespan"),
        ("queue empty s", "queue_empty_s", None),
        ("API requests / run", "requests", "requests"),
        ("  of which writes", "writes", None),
        ("APF rejections (all runs)", "rejected", None),
    ]
    nth, rc = summary.get("nth"), summary.get("reclaimd")
    lines = [f"{'':28}{'NTH ' + NTH_VERSION:>16}{'reclaimd':>12}{'NTH/reclaimd':>14}"]
    for title, key, rkey in rows:
        a = cell(nth[key]) if nth else "-"
        c = cell(rc[key]) if rc else "-"
        x = "-"
        if rat and rkey:
            rv = rat[rkey]
            if rv["ratio"] is not None:
                x = (">=" if rv["at_least"] else "") + f"{rv['ratio']:.1f}x"
        lines.append(f"{title:28}{a:>16}{c:>12}{x:>14}")
    if nth:
        lines.append(
            f"NTH nodes cordoned per run: {nth['cordoned_per_run']}, drained: "
            f"{nth['drained_per_run']} (of {nth['nodes_per_run']})"
        )
    if rc:
        lines.append(
            f"reclaimd nodes cordoned per run: {rc['cordoned_per_run']}, drained: "
            f"{rc['drained_per_run']} (of {rc['nodes_per_run']})"
        )
    if rat:
        for key in ("all_cordoned", "all_drained"):
            v = rat[key]
            met = "met" if v["target_10x_met"] else "NOT met"
            lines.append(
                f"target reclaimd >= 10x faster than NTH to {key.replace('_', '-')}: {met}"
            )
    return "\n".join(lines)


# --- wiring -----------------------------------------------------------------------------------


async def _cluster_size(core: Any) -> dict[str, int]:
    """Nodes and pods in the whole cluster (one LIST of one item each): other engineers' load
    on the shared apiserver, recorded next to the figures."""
    out = {}
    for what, call in (("nodes", core.list_node), ("pods", core.list_pod_for_all_namespaces)):
        page = await call(limit=1)
        out[what] = len(page.items) + int(page.metadata.remaining_item_count or 0)
    return out


def _nth_rbac() -> list[dict[str, Any]]:
    role = f"{FS_PREFIX}nth"
    return [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": NTH_SA, "namespace": BENCH_NAMESPACE},
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": role},
            "rules": NTH_RULES,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": role},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": role,
            },
            "subjects": [{"kind": "ServiceAccount", "name": NTH_SA, "namespace": BENCH_NAMESPACE}],
        },
    ]


def _reclaimd_rbac(rbac: Path) -> list[dict[str, Any]]:
    """reclaimd's ServiceAccount, and a copy of each binding of deploy/kubernetes/rbac.yaml for
    it: exactly the rights reclaimd ships with."""
    docs: list[dict[str, Any]] = [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": RECLAIMD_SA, "namespace": BENCH_NAMESPACE},
        }
    ]
    for doc in yaml.safe_load_all(rbac.read_text()):
        if not doc or doc.get("kind") not in ("ClusterRoleBinding", "RoleBinding"):
            continue
        meta = {"name": f"{FS_PREFIX}{doc['metadata']['name']}"}
        if "namespace" in doc["metadata"]:
            meta["namespace"] = doc["metadata"]["namespace"]
        docs.append(
            {
                "apiVersion": doc["apiVersion"],
                "kind": doc["kind"],
                "metadata": meta,
                "roleRef": doc["roleRef"],
                "subjects": [
                    {"kind": "ServiceAccount", "name": RECLAIMD_SA, "namespace": BENCH_NAMESPACE}
                ],
            }
        )
    return docs


def _apiserver(stack: Any) -> Apiserver:
    cfg = yaml.safe_load(Path(stack.kubeconfig).read_text())
    url = str(cfg["clusters"][0]["cluster"]["server"])
    pki = Path(stack.dir) / "pki"
    a = Apiserver(url, pki / "ca.crt", pki / "admin.crt", pki / "admin.key")
    for f in (a.ca, a.cert, a.key):
        if not f.exists():
            raise BenchError(f"{f} missing: is the local stack up (make stack-up)?")
    return a


@contextlib.contextmanager
def _moto(workdir: Path) -> Iterator[Moto]:
    m = Moto(workdir)
    try:
        m.start()
        yield m
    finally:
        m.stop()


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from chaos import stack as stackenv

    try:
        stack = stackenv.load()
    except ValueError as e:  # a malformed stack.env line
        raise BenchError(str(e)) from e
    apiserver = _apiserver(stack)
    workdir = Path(stack.dir) / "runs" / f"bench-peers-{time.strftime('%H%M%S')}"
    workdir.mkdir(parents=True, exist_ok=True)
    nth_binary = ensure_nth() if "nth" in args.sides else None
    with _moto(workdir) as moto:
        # Everything the harness gives a run (queue, reclaimd's SQS source) on the bench's moto.
        values = {**stack.values, "AWS_ENDPOINT_URL": moto.url, "AWS_DEFAULT_REGION": REGION}
        values.setdefault("AWS_ACCESS_KEY_ID", "testing")
        values.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
        bench = Bench(
            args, stackenv.StackEnv(stack.dir, values), moto, apiserver, workdir, nth_binary
        )
        bench.say(f"moto on {moto.url}; work files in {workdir}")
        await bench.setup_identities()
        try:
            for repeat in range(1, args.repeat + 1):
                for side in args.sides:
                    try:
                        bench.runs.append(await bench.run_side(side, repeat))
                    except BenchError as e:  # the other runs still count
                        bench.say(f"{side} run {repeat}/{args.repeat} failed: {e}")
                        bench.failed.append({"side": side, "repeat": repeat, "error": str(e)})
        finally:
            await bench.teardown_identities()
    summary = {s: summarize(bench.runs, s) for s in args.sides}
    rat = None
    if summary.get("nth") and summary.get("reclaimd"):
        rat = ratios(
            cast(dict[str, Any], summary["nth"]), cast(dict[str, Any], summary["reclaimd"])
        )
    return {
        "benchmark": "bench_peers",
        "storm": {
            "nodes": args.nodes,
            "pods_per_node": PODS_PER_NODE,
            "notice": "EC2 Spot Instance Interruption Warning, one per node, sent at once",
            "repeat": args.repeat,
            "cap_s": args.cap,
        },
        "nth": {
            "version": NTH_VERSION,
            "mode": "queue (SQS), out of a pod with a ServiceAccount token",
            "settings": {
                k: v
                for k, v in nth_env(
                    queue_url="",
                    aws_endpoint="",
                    api_host="",
                    api_port="",
                    workers=args.nth_workers or args.nodes,
                ).items()
                if k
                not in (
                    "PATH",
                    "HOME",
                    "AWS_ACCESS_KEY_ID",
                    "AWS_SECRET_ACCESS_KEY",
                    "QUEUE_URL",
                    "AWS_ENDPOINT",
                    "KUBERNETES_SERVICE_HOST",
                    "KUBERNETES_SERVICE_PORT",
                )
            },
        },
        "requests_counted_by": "apiserver_flowcontrol_dispatched_requests_total of per-identity "
        "FlowSchemas, from the send until the consumer stopped (startup_requests: before)",
        "units": "seconds from each node's message send; all_*/makespan from the first send",
        "cluster_background": bench.background,
        "summary": summary,
        "ratios_nth_over_reclaimd": rat,
        "runs": bench.runs,
        "failed_runs": bench.failed,
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count() or 0},
    }


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from chaos.stack import StackNotRunning

    try:
        result = asyncio.run(run(args))
    except (BenchError, StackNotRunning) as e:
        print(f"bench-peers: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("bench-peers: interrupted", file=sys.stderr)
        return 130
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(table(result["summary"], result["ratios_nth_over_reclaimd"]))
    for f in result["failed_runs"]:
        print(f"{f['side']} run {f['repeat']} failed: {f['error']}")
    print(f"(JSON: {args.out})")
    return 1 if result["failed_runs"] else 0


if __name__ == "__main__":
    sys.exit(main())
