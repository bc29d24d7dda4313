"""Bench: a storm of checkpoint uploads stays inside the tenant's PutObject budget.

500 ranks of one tenant are asked to checkpoint, as reclaimd asks them: each request carries the
rank's share from a real ``TenantPutBudgets``, and every status poll (every 0.5 s) the share
refreshed. Each rank is a real ``CheckpointServer`` whose save uploads N small objects (the parts
of its checkpoint) through its own guarded put, paced at the share, to a moto server of its own
(a free loopback port, as the stack runs it) behind a fault proxy that answers a share of the
PutObject with 503 SlowDown. The ranks share one boto3 client (one per rank would cost 500 x its
memory); each has its own guard, so its own bucket and retry budget, as a pod has.

Reported (JSON in ``out/bench-uploads.json``, a table on stdout): the tenant's request rate at
the proxy (per-second series: max, p99, mean; the most in any 1 s window) against the budget and
``budget + burst``; retry amplification (attempts / objects) against the unavoidable one for
fault share p (every 503 costs one more attempt: ``1 / (1 - p)``), target at most 1.1x; objects
stored once, ranks durable, asked->acked times.

``run_storm`` is also what the e2e test drives, at a small size against the stack's moto.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import json
import logging
import math
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.request import urlopen

import aiohttp
import botocore.exceptions

from chaos.ports import free_port
from reclaimd.model import rfc3339, utcnow
from reclaimd.putbudget import HEADER, REQUEST_FIELD, TenantPutBudgets
from reclaimd_trainer.s3 import BoundPut, GuardedPut, PutCounters, PutLimits, make_s3_client
from reclaimd_trainer.server import (
    CheckpointRequest,
    CheckpointResult,
    CheckpointServer,
    upload_parts,
)

POLL_INTERVAL_S = 0.5  # reclaimd's status poll
TENANT = "acme"


@dataclass(frozen=True)
class StormConfig:
    ranks: int = 500
    objects_per_rank: int = 2
    object_bytes: int = 512
    gang_size: int = 8
    fault_share: float = 0.1
    max_faults_per_key: int | None = None  # None: every attempt may fail
    budget_qps: float = 20.0
    burst: int | None = None  # None: one second of the budget
    spread_s: float = 5.0  # the gangs' requests are spread over this long
    deadline_s: float = 80.0  # each rank's checkpoint deadline after it is asked
    max_attempts: int = 6  # per object, in each rank's guard
    seed: int = 1

    def check(self) -> None:
        if self.ranks < 1 or self.objects_per_rank < 1 or self.gang_size < 1:
            raise ValueError("ranks, objects per rank and gang size must be at least 1")
        if not 0.0 <= self.fault_share < 1.0:
            raise ValueError("fault share must be in [0, 1)")
        if not (self.budget_qps > 0 and math.isfinite(self.budget_qps)):
            raise ValueError("budget must be a positive number of PutObject/s")
        if self.spread_s < 0 or self.deadline_s <= 0:
            raise ValueError("spread must be >= 0 and deadline > 0 seconds")
        if self.object_bytes < 0 or self.max_attempts < 1:
            raise ValueError("object size must be >= 0 and max attempts >= 1")


@dataclass
class RankOutcome:
    asked_at: float = 0.0
    acked_at: float | None = None
    durable: bool = False
    status: str = ""
    first_share_waits: bool = False
    polls: int = 0


@dataclass
class StormReport:
    config: dict[str, Any]
    budget_qps: float
    burst: int
    objects: int
    put_requests_at_proxy: int
    slow_downs: int
    attempts_by_ranks: int
    retries_by_ranks: int
    failed_puts: int
    gave_up: dict[str, int]  # puts given up by the ranks' guards, by why
    stored_objects: int
    stored_once: int
    stored_more_than_once: int
    missing_objects: int
    ranks_durable: int
    rate_per_s: dict[str, float]
    most_in_1s_window: int
    limit_1s_window: float
    amplification: float
    unavoidable_amplification: float
    amplification_vs_unavoidable: float
    asked_to_acked_s: dict[str, float]
    makespan_s: float
    ideal_makespan_s: float
    wall_s: float
    puts: list[tuple[float, str, int]] = field(default_factory=list, repr=False)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("puts")
        return out


# --- servers this bench starts -------------------------------------------------------------


def _wait_http(url: str, timeout_s: float, proc: subprocess.Popen[bytes]) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited with {proc.returncode}")
        try:
            with urlopen(url, timeout=1.0):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer within {timeout_s:.0f}s")


@contextlib.contextmanager
def moto_server() -> Iterator[str]:
    """A moto server of our own on a free loopback port, as ``deploy/local/stack.sh`` runs it."""
    exe = Path(sys.executable).with_name("moto_server")
    port = free_port()
    cmd = [str(exe), "-H", "127.0.0.1", "-p", str(port)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_http(url + "/moto-api/data.json", 30.0, proc)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.asynccontextmanager
async def fault_proxy(upstream: str, cfg: StormConfig) -> AsyncIterator[str]:
    cmd = [
        sys.executable,
        "-m",
        "chaos.faultproxy",
        "--upstream",
        upstream,
        "--fault-share",
        repr(cfg.fault_share),
        "--seed",
        str(cfg.seed),
    ]
    if cfg.max_faults_per_key is not None:
        cmd += ["--max-faults", str(cfg.max_faults_per_key)]
    proc = await asyncio.create_subprocess_exec(
        *cmd, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 30.0)
        text = line.decode().strip()
        if not text.startswith("listening on "):
            err = b"" if proc.stderr is None else await proc.stderr.read()
            raise RuntimeError(f"fault proxy did not start: {err.decode().strip()[-200:]}")
        yield text.removeprefix("listening on ")
    finally:
        if proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 10.0)
            except TimeoutError:
                proc.kill()
                await proc.wait()


# --- the storm -----------------------------------------------------------------------------


@dataclass
class _Rank:
    index: int
    gang: int
    server: CheckpointServer
    guard: GuardedPut
    store: BoundPut
    keys: list[str]
    outcome: RankOutcome = field(default_factory=RankOutcome)

    @property
    def pod(self) -> str:
        return f"trainer-{self.gang}-{self.index}"


async def _ask(
    rank: _Rank,
    *,
    notice_id: str,
    budgets: TenantPutBudgets,
    session: aiohttp.ClientSession,
    deadline_s: float,
) -> None:
    """What reclaimd does for one rank: grant, POST with the share, poll with the refreshed
    share in the header, release when answered or given up."""
    out = rank.outcome
    loop = asyncio.get_running_loop()
    out.asked_at = loop.time()
    end = out.asked_at + deadline_s
    share = budgets.grant(TENANT, rank.pod, deadline=end)
    out.first_share_waits = share.waits
    body = {
        "notice_id": notice_id,
        "reason": "spot_interruption",
        "deadline": rfc3339(utcnow() + timedelta(seconds=deadline_s)),
        "gang": f"jobset:{TENANT}/run-{rank.gang}",
        "rank": rank.index,
        "namespace": TENANT,
        "pod": rank.pod,
        REQUEST_FIELD: share.to_json(),
    }
    try:
        async with asyncio.timeout_at(end):
            async with session.post(rank.server.url, json=body) as resp:
                status, location, doc = resp.status, resp.headers.get("Location"), await resp.json()
            while status == 202:
                await asyncio.sleep(POLL_INTERVAL_S)
                share = budgets.refresh(TENANT, rank.pod)
                poll = rank.server.url.rsplit("/", 1)[0] + (location or "")
                out.polls += 1
                async with session.get(poll, headers={HEADER: share.header_value()}) as resp:
                    status, doc = resp.status, await resp.json()
        out.acked_at = loop.time()
        out.status = str(status)
        out.durable = status == 200 and bool(doc.get("durable"))
    except TimeoutError:
        out.status = "timeout"
    except (aiohttp.ClientError, OSError, ValueError) as e:
        out.status = f"{type(e).__name__}"
    finally:
        budgets.release(TENANT, rank.pod)


def _saver(rank_holder: list[_Rank], cfg: StormConfig) -> Any:
    payload = os.urandom(cfg.object_bytes)

    async def on_checkpoint(req: CheckpointRequest) -> CheckpointResult:
        rank = rank_holder[0]
        parts = [(key, payload) for key in rank.keys]
        prefix = rank.keys[0].rsplit("/", 1)[0] + "/"
        return await upload_parts(
            req, parts, store=rank.store, uri=f"s3://{rank.store.bucket}/{prefix}", step=100,
            concurrency=len(parts),
        )

    return on_checkpoint


BUCKET = "bench-uploads"


async def run_storm(
    cfg: StormConfig, *, s3_endpoint: str, bucket: str | None = None
) -> StormReport:
    """Run one storm against ``s3_endpoint`` (moto) through a fault proxy; the report.

    Each run writes a fresh bucket under fixed keys, so which attempts the proxy fails (a hash
    of key and attempt) is the same from run to run for one seed."""
    cfg.check()
    started = time.monotonic()
    bucket = bucket or f"{BUCKET}-{int(time.time() * 1000)}"
    direct = make_s3_client(endpoint_url=s3_endpoint)
    await asyncio.to_thread(direct.create_bucket, Bucket=bucket)
    await asyncio.to_thread(
        direct.put_bucket_versioning,
        Bucket=bucket,
        VersioningConfiguration={"Status": "Enabled"},
    )
    run = "run"
    budgets = TenantPutBudgets(cfg.budget_qps, cfg.burst)
    budget = budgets.budget(TENANT)
    limits = PutLimits(max_attempts=cfg.max_attempts)  # the pods' own guard limit: 20/s each
    async with fault_proxy(s3_endpoint, cfg) as proxy_url:
        client = make_s3_client(endpoint_url=proxy_url, max_pool_connections=16)
        ranks: list[_Rank] = []
        try:
            for i in range(cfg.ranks):
                holder: list[_Rank] = []
                guard = GuardedPut(client.put_object, limits=limits)
                gang = i // cfg.gang_size
                keys = [
                    f"checkpoints/{TENANT}/{run}/gang-{gang}/step-100/rank-{i}/part-{j}"
                    for j in range(cfg.objects_per_rank)
                ]
                store = guard.bind(TENANT, bucket)
                server = CheckpointServer(
                    _saver(holder, cfg), host="127.0.0.1", port=0, put_budget=store
                )
                rank = _Rank(
                    index=i, gang=gang, server=server, guard=guard, store=store, keys=keys
                )
                holder.append(rank)
                ranks.append(rank)
                await server.start()
            await _storm(cfg, ranks, budgets)
        finally:
            for rank in ranks:
                await rank.server.stop()
        async with aiohttp.ClientSession() as s, s.get(proxy_url + "/_faultproxy/log") as r:
            log = await r.json()
    puts = [(float(t), str(k), int(st)) for t, k, st in log["puts"] if k.startswith(bucket + "/")]
    versions = await asyncio.to_thread(_versions, direct, bucket, f"checkpoints/{TENANT}/{run}/")
    return _report(
        cfg,
        budget_qps=budget.qps,
        burst=budget.burst,
        ranks=ranks,
        puts=puts,
        versions=versions,
        wall_s=time.monotonic() - started,
    )


async def _storm(cfg: StormConfig, ranks: list[_Rank], budgets: TenantPutBudgets) -> None:
    gangs: dict[int, list[_Rank]] = {}
    for r in ranks:
        gangs.setdefault(r.gang, []).append(r)
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def one_gang(g: int, members: list[_Rank]) -> None:
            await asyncio.sleep(cfg.spread_s * g / max(1, len(gangs)))
            loop = asyncio.get_running_loop()
            # As reclaimd's fan-out does: the gang's ranks count before the first is granted.
            budgets.announce(
                TENANT, [m.pod for m in members], deadline=loop.time() + cfg.deadline_s
            )
            await asyncio.gather(
                *(
                    _ask(
                        m,
                        notice_id=f"ec2-bench-{g}",
                        budgets=budgets,
                        session=session,
                        deadline_s=cfg.deadline_s,
                    )
                    for m in members
                )
            )

        await asyncio.gather(*(one_gang(g, members) for g, members in gangs.items()))


def _versions(client: Any, bucket: str, prefix: str) -> Counter[str]:
    counts: Counter[str] = Counter()
    for page in client.get_paginator("list_object_versions").paginate(
        Bucket=bucket, Prefix=prefix
    ):
        for v in page.get("Versions", []):
            counts[v["Key"]] += 1
    return counts


# --- figures -------------------------------------------------------------------------------


def most_in_window(times: list[float], window_s: float) -> int:
    """The most requests in any closed window of ``window_s`` (count-based, from the log)."""
    ordered = sorted(times)
    return max(
        (bisect.bisect_right(ordered, t + window_s) - i for i, t in enumerate(ordered)),
        default=0,
    )


def per_second(times: list[float]) -> list[int]:
    if not times:
        return []
    t0 = min(times)
    bins = Counter(int(t - t0) for t in times)
    return [bins.get(i, 0) for i in range(max(bins) + 1)]


def _pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


def _report(
    cfg: StormConfig,
    *,
    budget_qps: float,
    burst: int,
    ranks: list[_Rank],
    puts: list[tuple[float, str, int]],
    versions: Counter[str],
    wall_s: float,
) -> StormReport:
    total = PutCounters()
    for r in ranks:
        total.add(r.guard.counters())
    keys = [k for r in ranks for k in r.keys]
    times = [t for t, _, _ in puts]
    series = per_second(times)
    slow_downs = sum(1 for _, _, st in puts if st == 503)
    objects = len(keys)
    span = (max(times) - min(times)) if len(times) > 1 else 0.0
    amplification = len(puts) / objects
    unavoidable = 1.0 / (1.0 - cfg.fault_share)
    waits = [
        r.outcome.acked_at - r.outcome.asked_at for r in ranks if r.outcome.acked_at is not None
    ]
    return StormReport(
        config=asdict(cfg),
        budget_qps=budget_qps,
        burst=burst,
        objects=objects,
        put_requests_at_proxy=len(puts),
        slow_downs=slow_downs,
        attempts_by_ranks=total.attempts,
        retries_by_ranks=total.retries,
        failed_puts=total.failed,
        gave_up={"retry_budget": total.budget_refused, "deadline": total.deadline_giveups},
        stored_objects=sum(1 for k in keys if versions.get(k, 0) > 0),
        stored_once=sum(1 for k in keys if versions.get(k, 0) == 1),
        stored_more_than_once=sum(1 for k in keys if versions.get(k, 0) > 1),
        missing_objects=sum(1 for k in keys if versions.get(k, 0) == 0),
        ranks_durable=sum(1 for r in ranks if r.outcome.durable),
        rate_per_s={
            "max": float(max(series, default=0)),
            "p99": float(_pct([float(x) for x in series], 0.99)),
            "mean": len(times) / span if span > 0 else float(len(times)),
        },
        most_in_1s_window=most_in_window(times, 1.0),
        limit_1s_window=burst + budget_qps,
        amplification=amplification,
        unavoidable_amplification=unavoidable,
        amplification_vs_unavoidable=amplification / unavoidable,
        asked_to_acked_s={
            "p50": _pct(waits, 0.5),
            "p99": _pct(waits, 0.99),
            "max": max(waits, default=0.0),
        },
        makespan_s=span,
        ideal_makespan_s=max(0.0, (len(puts) - burst) / budget_qps),
        wall_s=wall_s,
        puts=puts,
    )


def table(rep: StormReport) -> str:
    c = rep.config
    rows = [
        ("storm", f"{c['ranks']} ranks x {c['objects_per_rank']} objects, one tenant, "
                  f"{c['fault_share']:.0%} PutObject answered 503 SlowDown"),
        ("budget", f"{rep.budget_qps:g} PutObject/s, burst {rep.burst}"),
        ("rate at the proxy, per second", f"max {rep.rate_per_s['max']:.0f}  "
                                          f"p99 {rep.rate_per_s['p99']:.0f}  "
                                          f"mean {rep.rate_per_s['mean']:.1f}"),
        ("most in any 1 s window", f"{rep.most_in_1s_window} (budget + burst = "
                                   f"{rep.limit_1s_window:g})"),
        ("PutObject requests / objects", f"{rep.put_requests_at_proxy} / {rep.objects}  "
                                         f"({rep.slow_downs} answered 503)"),
        ("retry amplification", f"{rep.amplification:.3f} vs unavoidable "
                                f"{rep.unavoidable_amplification:.3f} = "
                                f"{rep.amplification_vs_unavoidable:.3f}x (target <= 1.1x)"),
        ("stored once / missing / duplicated", f"{rep.stored_once} / {rep.missing_objects} / "
                                               f"{rep.stored_more_than_once}"),
        ("puts given up: retry budget / deadline", f"{rep.gave_up['retry_budget']} / "
                                                    f"{rep.gave_up['deadline']}"),
        ("ranks durable", f"{rep.ranks_durable} / {c['ranks']}"),
        ("asked -> acked p50 / p99 / max", f"{rep.asked_to_acked_s['p50']:.1f} / "
                                           f"{rep.asked_to_acked_s['p99']:.1f} / "
                                           f"{rep.asked_to_acked_s['max']:.1f} s"),
        ("makespan (ideal at the budget)", f"{rep.makespan_s:.1f} s "
                                           f"({rep.ideal_makespan_s:.1f} s)"),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m chaos.bench.uploads", description=__doc__)
    d = StormConfig()
    parser.add_argument("--ranks", type=int, default=d.ranks)
    parser.add_argument("--objects", type=int, default=d.objects_per_rank)
    parser.add_argument("--fault-share", type=float, default=d.fault_share)
    parser.add_argument("--budget", type=float, default=d.budget_qps, help="PutObject/s/tenant")
    parser.add_argument("--burst", type=int, default=None)
    parser.add_argument("--spread", type=float, default=d.spread_s)
    parser.add_argument("--deadline", type=float, default=d.deadline_s)
    parser.add_argument("--json", default="out/bench-uploads.json")
    args = parser.parse_args(argv)
    cfg = StormConfig(
        ranks=args.ranks,
        objects_per_rank=args.objects,
        fault_share=args.fault_share,
        budget_qps=args.budget,
        burst=args.burst,
        spread_s=args.spread,
        deadline_s=args.deadline,
    )
    try:
        cfg.check()
        TenantPutBudgets(cfg.budget_qps, cfg.burst)
    except ValueError as e:
        print(f"bench-uploads: {e}", file=sys.stderr)
        return 2
    # Failed uploads are counted in the report; 500 ranks' warnings would drown the table.
    logging.getLogger("reclaimd").setLevel(logging.ERROR)
    # Our own moto takes any credentials: moto's documented placeholders, not real ones.
    for name, value in (
        ("AWS_ACCESS_KEY_ID", "testing"),
        ("AWS_SECRET_ACCESS_KEY", "testing"),
        ("AWS_DEFAULT_REGION", "us-east-1"),
    ):
        os.environ.setdefault(name, value)
    try:
        with moto_server() as endpoint:
            rep = asyncio.run(run_storm(cfg, s3_endpoint=endpoint))
    except (RuntimeError, OSError, botocore.exceptions.BotoCoreError) as e:
        print(f"bench-uploads: {e}", file=sys.stderr)
        return 1
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rep.to_json(), indent=2) + "\n")
    print(table(rep))
    print(f"\nJSON: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
