"""``make bench-fuzz``: hostile input on every transport of one real ``reclaimd run``.

One daemon runs every source at once against the local stack: SQS (moto), Pub/Sub (the
emulator), the Kafka notices topic, Kueue Workloads on the apiserver, and EC2 IMDS, the GCE
metadata server and Azure Scheduled Events, all three served by a small aiohttp server this
bench starts (the daemon's ``imds.url``, ``gce_metadata.url`` and ``azure_scheduled.url`` point
at it). Per transport the bench sends ``--per-transport`` hostile messages from
``chaos.bench.hostile`` (seeded: truncated JSON, huge bodies, deep nesting, wrong types, control and
bidi characters, grammar-breaking identifiers, path traversal, SSRF-looking URLs, duplicate
keys, ...), with a few real notices mixed in, each aimed at a kwok node of its own
(``--nodes``, created for the run, deleted after).

Reported per transport: messages sent, what the daemon counted (received, notices, ignored,
parse errors, acked), what is left on the transport (SQS messages, Pub/Sub messages, Kafka
records not committed by the daemon's group), and whether every real notice was claimed on
its node (or Workload). For the process: crashes (an exit before the bench stops it), RSS
sampled every second and whether it stayed flat (mean of the last quarter within 10% of the
second quarter's), and its exit code on SIGTERM.

JSON in ``out/bench-fuzz.json``, a table on stdout, progress on stderr. Exit 0 when every
check held, 1 when one did not, 2 on bad arguments or no stack.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from chaos.bench.fuzz import report, send, watch
from chaos.bench.fuzz.common import (
    AWS_ZONE,
    AZURE_LOCATION,
    AZURE_PROJECT,
    AZURE_SKU,
    AZURE_ZONE,
    FUZZ_LABEL,
    GCE_PROJECT,
    GCE_ZONE,
    KUEUE,
    MIN_NODES,
    OUT,
    REAL,
    TRANSPORTS,
    RealNotice,
    _instance_id,
    progress,
)
from chaos.ports import free_port as _free_port
from chaos.standins import azure as azure_metadata_server
from chaos.standins.fuzzing import MetadataState, ScheduledEvents, Tally, metadata_app


class FuzzRun:
    def __init__(self, args: argparse.Namespace) -> None:
        from chaos import stack as stackenv
        from chaos.harness import Harness

        self.args = args
        self.stack = stackenv.load()
        self.h = Harness(self.stack)
        self.run = self.h.run_id
        self.rng = random.Random(args.seed)
        self.sent = {t: Tally() for t in TRANSPORTS}
        self.reals: list[RealNotice] = []
        self.rss: list[tuple[float, float]] = []
        self.crashed: int | None = None
        self.started = 0.0
        self.notices_topic = f"reclaimd.notices.fuzz.{self.run}"
        self.group = f"reclaimd-fuzz-{self.run}"
        self.state: MetadataState | None = None
        self.channel: Any = None

    # -- fleet --

    def _fleet(self) -> tuple[list[Any], list[Any], list[Any]]:
        from chaos import fleet
        from chaos.drill.plan import azure_vm_name

        n_gce = max(REAL["pubsub"] + REAL["gce_metadata"], self.args.nodes // 3)
        n_azure = REAL["azure_scheduled"]
        n_aws = max(
            REAL["sqs"] + REAL["kafka_notices"] + REAL["imds"], self.args.nodes - n_gce - n_azure
        )
        aws = [
            fleet.NodeSpec(f"fz-{self.run}-a{i}", _instance_id(self.run, f"a{i}"), zone=AWS_ZONE)
            for i in range(n_aws)
        ]
        gce = [
            fleet.NodeSpec(
                f"fz-{self.run}-g{i}",
                "",
                zone=GCE_ZONE,
                cloud="gce",
                project=GCE_PROJECT,
                sku="a3-highgpu-8g",
            )
            for i in range(n_gce)
        ]
        azure = [
            fleet.NodeSpec(
                f"fz-{self.run}-z{i}",
                azure_vm_name(self.run, "fuzz", i),
                zone=f"{AZURE_LOCATION}-{AZURE_ZONE}",
                sku=AZURE_SKU,
                cloud="azure",
                project=AZURE_PROJECT,
            )
            for i in range(n_azure)
        ]
        return aws, gce, azure

    async def _own_moto(self) -> str:
        """A moto of this bench's own for SQS: the shared one is slow with everything it ever
        held, and the fault drills restart it (losing every queue)."""
        port = _free_port()
        server = Path(sys.executable).with_name("moto_server")
        self.moto = await asyncio.create_subprocess_exec(
            str(server),
            "-H",
            "127.0.0.1",
            "-p",
            str(port),
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        url = f"http://127.0.0.1:{port}"
        import boto3

        region = self.stack.values.get("AWS_DEFAULT_REGION", "us-east-1")
        self.h.sqs = boto3.client("sqs", endpoint_url=url, region_name=region)
        for _ in range(100):
            try:
                self.h.queue_url = await asyncio.to_thread(self.h.create_queue)
                return url
            except Exception:
                await asyncio.sleep(0.2)
        raise RuntimeError(f"moto on {url} did not start")

    async def run_all(self) -> dict[str, Any]:
        from aiohttp import web

        from chaos import inject

        async with self.h as h:
            with contextlib.suppress(Exception):  # the harness's queue on the shared moto
                await asyncio.to_thread(h.sqs.delete_queue, QueueUrl=h.queue_url)
            self.moto_url = await self._own_moto()
            aws, gce, azure = self._fleet()
            progress(f"run {self.run}: {len(aws) + len(gce) + len(azure)} kwok nodes")
            await h.add_nodes([*aws, *gce, *azure])
            self.aws, self.gce, self.azure = aws, gce, azure
            await h.create_topics({self.notices_topic: 1})
            self.channel = inject.PubSubChannel(self.stack["PUBSUB_PROJECT_ID"], f"fuzz-{self.run}")
            await asyncio.to_thread(self.channel.create, ack_deadline_s=10)
            imds_node, gce_node, azure_node = aws[-1], gce[-1], azure[-1]
            self.state = MetadataState(
                imds_identity={
                    "instance-id": imds_node.instance_id,
                    "placement/availability-zone": imds_node.zone,
                    "placement/region": imds_node.zone[:-1],
                    "instance-type": imds_node.sku,
                },
                gce_identity={
                    "instance/name": gce_node.name,
                    "instance/zone": f"projects/123456789012/zones/{gce_node.zone}",
                    "project/project-id": gce_node.project,
                },
                rng=random.Random(f"{self.args.seed}/metadata"),
                azure_compute=azure_metadata_server.compute_of(azure_node).to_json(),
                azure=ScheduledEvents(random.Random(f"{self.args.seed}/azure")),
            )
            runner = web.AppRunner(metadata_app(self.state), access_log=None)
            await runner.setup()
            port = _free_port()
            await web.TCPSite(runner, "127.0.0.1", port).start()
            try:
                return await self._with_daemon(
                    f"http://127.0.0.1:{port}", imds_node, gce_node, azure_node
                )
            finally:
                await runner.cleanup()
                await asyncio.to_thread(self.channel.delete)
                await self._cleanup()
                if self.moto.returncode is None:
                    self.moto.terminate()
                    await self.moto.wait()

    async def _with_daemon(
        self, metadata_url: str, imds_node: Any, gce_node: Any, azure_node: Any
    ) -> dict[str, Any]:
        h = self.h
        self.metrics_port = _free_port()
        daemon = await h.start_daemon(
            "reclaimd-fuzz",
            sqs={
                "receivers": 2,
                "concurrency": 64,
                "endpoint_url": self.moto_url,
                "queue_url": self.h.queue_url,
            },
            pubsub={
                "enabled": True,
                "project": self.stack["PUBSUB_PROJECT_ID"],
                "subscription": f"fuzz-{self.run}",
            },
            kafka_notices={
                "enabled": True,
                "bootstrap": h.replica_kafka.bootstrap,
                "topic": self.notices_topic,
                "group_id": self.group,
            },
            kueue={"enabled": True, "namespaces": [h.namespace]},
            imds={"enabled": True, "url": metadata_url, "poll_interval_s": 0.01},
            gce_metadata={
                "enabled": True,
                "url": metadata_url,
                "node_name": gce_node.name,
                "timeout_s": 5,
            },
            azure_scheduled={
                "enabled": True,
                "url": metadata_url,
                "node_name": azure_node.name,
                "poll_interval_s": 0.01,
            },
            checkpoint={"allowed_hosts": ["127.0.0.1"]},
            metrics_port=self.metrics_port,
        )
        assert daemon.proc is not None
        self.daemon = daemon
        self.started = time.monotonic()
        sampler = asyncio.create_task(watch.sample(self, daemon.proc.pid))
        watcher = asyncio.create_task(watch.watch_reals(self))
        phases: list[tuple[str, Callable[[], Awaitable[None]]]] = [
            ("sqs", (lambda: send.sqs(self))),
            ("pubsub", (lambda: send.pubsub(self))),
            ("kafka_notices", (lambda: send.kafka(self))),
            ("kueue", (lambda: send.kueue(self))),
            ("imds", lambda: send.imds(self, imds_node)),
            ("gce_metadata", lambda: send.gce(self, gce_node)),
            ("azure_scheduled", lambda: send.azure(self, azure_node)),
        ]
        timings: dict[str, float] = {}
        self.windows: dict[str, tuple[float, float]] = {}  # phase -> (start, end) since start
        self.errors: dict[str, str] = {}
        try:
            for name, phase in phases:
                t0 = time.monotonic()
                progress(f"{name}: sending {self.args.per_transport} hostile + {REAL[name]} real")
                try:
                    await phase()
                except Exception as e:  # the shared stack's parts restart under the drills
                    watch.check_alive(self)
                    self.errors[name] = f"{type(e).__name__}: {e}"[:300]
                    progress(f"{name}: phase failed: {self.errors[name]}")
                timings[name] = round(time.monotonic() - t0, 1)
                self.windows[name] = (t0 - self.started, time.monotonic() - self.started)
                progress(f"{name}: sent in {timings[name]} s (rss {watch.rss_now(self)} MiB)")
            drained = await watch.drain(self)
            counted = await watch.scrape(self)
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
        exit_code = await watch.stop(self, daemon)
        sampler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sampler
        left = await watch.leftovers(self)
        return report.result(
            self, counted=counted, drained=drained, left=left, timings=timings, exit_code=exit_code
        )

    def _spread(self, transport: str) -> set[int]:
        """Where the real notices go among the hostile ones (evenly, not first or last)."""
        n, k = self.args.per_transport, REAL[transport]
        return {(i + 1) * n // (k + 1) for i in range(k)}

    async def _cleanup(self) -> None:
        from kubernetes_asyncio import client as k8s

        if self.h.api is None:
            return
        with contextlib.suppress(Exception):
            await k8s.CustomObjectsApi(self.h.api).delete_collection_namespaced_custom_object(
                *KUEUE, self.h.namespace, "workloads", label_selector=f"{FUZZ_LABEL}={self.run}"
            )
        with contextlib.suppress(Exception):
            await k8s.CoreV1Api(self.h.api).delete_namespace(self.h.namespace)
        with contextlib.suppress(Exception):
            await asyncio.to_thread(self.h.sqs.delete_queue, QueueUrl=self.h.queue_url)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="chaos.bench.fuzz.run", description=__doc__.splitlines()[0])
    p.add_argument(
        "--per-transport", type=int, default=10_000, help="hostile messages per transport"
    )
    p.add_argument("--nodes", type=int, default=20, help="kwok nodes for the real notices")
    p.add_argument("--seed", type=int, default=11)
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    if args.per_transport < 10 or args.nodes < MIN_NODES:
        print(
            f"bench_fuzz: --per-transport must be >= 10 and --nodes >= {MIN_NODES}",
            file=sys.stderr,
        )
        return 2
    from chaos.stack import StackNotRunning

    try:
        run = FuzzRun(args)
    except (StackNotRunning, OSError, ValueError) as e:
        print(f"bench_fuzz: {e}", file=sys.stderr)
        return 2
    result = asyncio.run(run.run_all())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(report.table(result))
    print(f"(JSON: {args.out})")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
