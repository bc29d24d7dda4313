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

``python -m chaos.bench.peers.run``; its parts: common, apiserver, cluster, nth, moto,
side, summary."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn, cast

import yaml

from chaos.bench.peers.apiserver import Apiserver
from chaos.bench.peers.common import NTH_VERSION, PODS_PER_NODE, REGION, SIDES, BenchError
from chaos.bench.peers.moto import Moto
from chaos.bench.peers.nth import ensure_nth, nth_env
from chaos.bench.peers.side import Bench
from chaos.bench.peers.summary import ratios, summarize, table

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
