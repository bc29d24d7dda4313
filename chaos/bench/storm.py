"""``make bench-storm``: a zone-wide Spot reclaim at the API server's own limit, in one run.

1. **Calibrate** the physical limit: node PATCHes (a merge patch of one annotation, the shape
   of reclaimd's claim write) against the stack's kube-apiserver from one client at several
   concurrencies, on plain Node objects made for it and deleted after. The best rate is the
   apiserver's max writes/s on this machine, today. Then the intake's own limit on each
   transport the storm's notices use (SQS, Kafka, Pub/Sub; ``chaos.bench.intake``): a plain
   consumer's messages/s, so that the report shows whether the intake or reclaimd is slower.
2. **Storm**: the shipped ``spot-az-storm-1000`` drill (1,000 kwok nodes, 2,000 GPU pods in
   gangs of 1-8 ranks, 300 Spot warnings within 5 s, 2 replicas), judged as every drill is.
3. Report: writes made by kind (what each replica counted at its write budget), the physical
   minimum for all-cordoned (doomed nodes / max writes/s), the measured all-cordoned time
   (first send to last cordon) and their ratio, notice->cordoned and notice->all-ranks-asked
   p50/p99/max, deadlines met, each replica's peak RSS, reclaimd's received/s (its root spans)
   against the plain consumer's messages/s, takeovers; with ``--cache``, the cache's RSS
   from ``bench_cache`` (5,000 nodes, 50,000 pods).

Timings are reported, never asserted: machines are noisy. JSON in ``out/bench-storm.json``,
a table on stdout. Exit 0 when the run completed (whether targets were met is in the table),
1 when the drill's verdict failed, 2 on bad arguments or no stack.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import sys
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

from chaos import stack as stackenv
from chaos.bench import intake
from chaos.bench.latency import percentile

SCENARIO = Path(__file__).resolve().parents[2] / "chaos" / "scenarios" / "spot-az-storm-1000.yaml"
CALIBRATION_LABEL = "reclaimd.io/bench"


# --- 1. the physical limit ------------------------------------------------------------------


async def calibrate(
    stack: stackenv.StackEnv, *, nodes: int, concurrencies: list[int], seconds: float
) -> dict[str, Any]:
    """Node PATCHes per second at each concurrency, from one client: the daemon's own
    (``ApiServer``), so the limit is the API server's, not a client's."""
    from reclaimd.cluster import apiserver
    from reclaimd.cluster.connect import build_api_client

    run = uuid.uuid4().hex[:6]
    api = await build_api_client(stack.kubeconfig, pool_size=max(concurrencies))
    names = [f"calib-{run}-{i}" for i in range(nodes)]
    try:
        gate = asyncio.Semaphore(64)

        async def make(name: str) -> None:
            async with gate:
                body = {
                    "metadata": {"name": name, "labels": {CALIBRATION_LABEL: "calibrate"}},
                    "spec": {"unschedulable": True},
                }
                await api.post(apiserver.node(), body)

        await asyncio.gather(*(make(n) for n in names))
        rows = [await _patch_rate(api, names, c, seconds) for c in concurrencies]
        best = max(rows, key=lambda r: r["writes_per_s"])
        return {"node_patch": rows, "max_writes_per_s": best["writes_per_s"], "best": best}
    finally:
        gate = asyncio.Semaphore(64)

        async def drop(name: str) -> None:
            async with gate:
                with contextlib.suppress(Exception):
                    await api.delete(apiserver.node(name))

        await asyncio.gather(*(drop(n) for n in names))
        await api.close()


async def _patch_rate(api: Any, names: list[str], c: int, seconds: float) -> dict[str, Any]:
    """``c`` writers PATCH the nodes round-robin for ``seconds``: completed writes per second."""
    from reclaimd.cluster import apiserver

    done = errors = 0
    stop_at = time.monotonic() + seconds

    async def writer(k: int) -> None:
        nonlocal done, errors
        i = k
        while time.monotonic() < stop_at:
            body = {"metadata": {"annotations": {"reclaimd.io/calibrate": str(i)}}}
            try:
                await api.patch(apiserver.node(names[i % len(names)]), body)
                done += 1
            except Exception:
                errors += 1
            i += c

    started = time.monotonic()
    await asyncio.gather(*(writer(k) for k in range(c)))
    rate = done / (time.monotonic() - started)
    print(f"bench-storm: calibrate c={c}: {rate:.0f} PATCH/s", file=sys.stderr, flush=True)
    return {"concurrency": c, "writes_per_s": round(rate, 1), "writes": done, "errors": errors}


# --- 2. the storm ---------------------------------------------------------------------------


async def storm(
    stack: stackenv.StackEnv, scenario_path: Path, *, every_source: bool = False
) -> dict[str, Any]:
    """The scenario's storm; ``every_source``: the replicas also consume every other central
    source (nothing sent on them), to measure what loading them costs."""
    from chaos.drill import scenario as scenarios
    from chaos.drill.run import Progress, run_drill
    from chaos.drill.verdict.render import to_json

    scenario = scenarios.load(scenario_path)
    if every_source:
        listen = tuple(sorted(scenarios.LISTENABLE))
        scenario = scenario.model_copy(
            update={"reclaimd": scenario.reclaimd.model_copy(update={"listen": listen})}
        )
    verdict = await run_drill(scenario, stack=stack, progress=Progress(sys.stderr))
    return to_json(verdict)


def footprint(drill: dict[str, Any]) -> dict[str, Any]:
    """Per replica: peak RSS (its own VmHWM) and the modules it had loaded when it stopped."""
    daemons = drill.get("daemons") or {}
    return {
        "peak_rss_mb": {n: st.get("peak_rss_mb") for n, st in daemons.items()},
        "modules_loaded": {n: st.get("modules_loaded") for n, st in daemons.items()},
        "verdict_ok": drill.get("ok"),
    }


def after_send(rows: list[dict[str, Any]], field: str) -> list[float]:
    """Seconds from each drill row's ``sent_at`` to its ``field`` (rows without either left out)."""
    out = []
    for r in rows:
        if r.get(field) and r.get("sent_at"):
            end = datetime.fromisoformat(r[field].replace("Z", "+00:00"))
            sent = datetime.fromisoformat(r["sent_at"].replace("Z", "+00:00"))
            out.append((end - sent).total_seconds())
    return out


def _dist(values: list[float]) -> dict[str, float | int | None]:
    if not values:
        return {"p50": None, "p99": None, "max": None, "n": 0}
    return {
        "p50": round(percentile(values, 0.5), 3),
        "p99": round(percentile(values, 0.99), 3),
        "max": round(max(values), 3),
        "n": len(values),
    }


def receipts(span_files: list[str]) -> dict[str, float]:
    """When each notice was received (its root span's start, epoch seconds), from the
    replicas' span files: the issue's targets count from receipt, the drill from the send."""
    out: dict[str, float] = {}
    for path in span_files:
        try:
            lines = Path(path).read_text(encoding="utf-8").splitlines()
        except OSError:
            continue
        for line in lines:
            try:
                span = json.loads(line)
            except ValueError:
                continue
            nid = (span.get("attributes") or {}).get("reclaimd.notice.id")
            if span.get("name") == "reclaimd.notice" and nid:
                at = int(span["start_ns"]) / 1e9
                out[str(nid)] = min(at, out.get(str(nid), at))
    return out


def earliest_all_cordoned(arrivals: list[float], max_wps: float) -> float:
    """The physical minimum given when the notices arrived: a server taking ``max_wps``
    writes/s cordons each node no sooner than its notice arrives, one write per node."""
    if not arrivals or max_wps <= 0:
        return 0.0
    order = sorted(arrivals)
    done = order[0]
    for t in order:
        done = max(t, done) + 1.0 / max_wps
    return done - order[0]


def _span(times: list[float]) -> float | None:
    """First to last: how long the sends took (reclaimd cannot receive faster than that)."""
    return round(max(times) - min(times), 3) if times else None


def _since(rows: list[dict[str, Any]], field: str, start: dict[str, float]) -> list[float]:
    out = []
    for r in rows:
        t0 = start.get(str(r.get("notice_id")))
        if r.get(field) and t0 is not None:
            end = datetime.fromisoformat(r[field].replace("Z", "+00:00")).timestamp()
            out.append(end - t0)
    return out


def summarize(calibration: dict[str, Any], drill: dict[str, Any]) -> dict[str, Any]:
    notices = drill["notices"]
    full = [n for n in notices if n.get("response") == "full"]
    sent = [datetime.fromisoformat(n["sent_at"].replace("Z", "+00:00")) for n in full]
    cordons = [
        datetime.fromisoformat(n["cordoned_at"].replace("Z", "+00:00"))
        for n in full
        if n.get("cordoned_at")
    ]
    doomed = len(full)
    max_wps = float(calibration["max_writes_per_s"])
    minimum_s = doomed / max_wps if max_wps else None
    received = receipts(drill.get("span_files") or [])
    sent_at = {
        str(n["notice_id"]): datetime.fromisoformat(n["sent_at"].replace("Z", "+00:00")).timestamp()
        for n in notices
        if n.get("sent_at")
    }
    paced_s = earliest_all_cordoned([t.timestamp() for t in sent], max_wps)
    all_cordoned_s = (max(cordons) - min(sent)).total_seconds() if cordons and sent else None
    writes: dict[str, int] = {}
    budget: dict[str, Any] = {}
    for name, stats in (drill.get("daemons") or {}).items():
        for kind, count in (stats.get("kube_writes") or {}).items():
            writes[kind] = writes.get(kind, 0) + int(count)
        budget[name] = stats.get("kube_budget") or {}
    gangs = drill.get("gangs") or []
    charged = [g for g in gangs if g.get("ledger_events")]
    pods = sum(int(g.get("ranks") or 0) for g in charged)
    total = sum(writes.values())

    def per(kinds: tuple[str, ...], n: int) -> float | None:
        return round(sum(writes.get(k, 0) for k in kinds) / n, 2) if n else None

    return {
        "doomed_nodes": doomed,
        "cordoned": len(cordons),
        "physical_min_all_cordoned_s": round(minimum_s, 3) if minimum_s else None,
        "all_cordoned_s": round(all_cordoned_s, 3) if all_cordoned_s is not None else None,
        "ratio_to_physical_min": (
            round(all_cordoned_s / minimum_s, 2) if all_cordoned_s and minimum_s else None
        ),
        # The same all-cordoned time against the minimum the arrivals allow (300 notices
        # sent over 5 s cannot all be cordoned before the last one is sent).
        "physical_min_given_arrivals_s": round(paced_s, 3) if paced_s else None,
        "ratio_to_min_given_arrivals": (
            round(all_cordoned_s / paced_s, 2) if all_cordoned_s and paced_s else None
        ),
        "notice_to_cordoned_s": _dist(after_send(full, "cordoned_at")),
        "notice_to_all_asked_s": _dist(after_send(notices, "all_signaled_at")),
        # From receipt (the clock for "asked within 2 s"), and the transport's share.
        "send_to_receipt_s": _dist([received[k] - v for k, v in sent_at.items() if k in received]),
        "receipt_to_cordoned_s": _dist(_since(full, "cordoned_at", received)),
        "receipt_to_all_asked_s": _dist(_since(notices, "all_signaled_at", received)),
        "notice_to_drained_s": _dist(after_send(notices, "drained_at")),
        "deadlines_met": sum(1 for n in notices if n.get("deadline_met")),
        "notices": len(notices),
        # reclaimd's own receive rate (first to last root span), against a plain consumer's
        "intake": intake.received_rate(received.values())
        | {"sent_first_to_last_s": _span(list(sent_at.values()))},
        "lost": (drill.get("summary") or {}).get("lost"),
        "doubled": (drill.get("summary") or {}).get("doubled"),
        "takeovers": (drill.get("summary") or {}).get("takeovers"),
        "live_takeovers": (drill.get("summary") or {}).get("live_takeovers"),
        "fenced_actions": (drill.get("summary") or {}).get("fenced_actions"),
        # From a gang's charge end to its event on the topic (the broker's append time), and
        # the listener the replicas wrote it through (chaos.stack: SASL_SSL unless asked).
        "ledger_delay_p50_s": (drill.get("summary") or {}).get("ledger_delay_p50_s"),
        "ledger_delay_max_s": (drill.get("summary") or {}).get("ledger_delay_max_s"),
        "kafka_listener": os.environ.get("RECLAIMD_RIG_KAFKA") or "sasl_ssl",
        "writes_by_kind": dict(sorted(writes.items())),
        "writes_total": total,
        "writes_per_doomed_node": round(total / doomed, 2) if doomed else None,
        # What each object cost (attempts, retries included): the minimum is 2 per node
        # (claim+cordon, done), 1 per gang (its Lease), 1 per pod (its eviction).
        "claim_writes_per_node": per(("write claim on node",), doomed),
        "lease_writes_per_gang": per(("create lease", "take over lease"), len(charged)),
        "eviction_writes_per_pod": per(("evict pod", "delete pod"), pods),
        "gangs_charged": len(charged),
        "ranks_of_charged_gangs": pods,
        **footprint(drill),
        # Per replica: writes that waited for the budget, pushed back by the server (429 from
        # priority and fairness, 5xx), retried; reads; the rate the budget ended at.
        "write_budget": budget,
        "failed_checks": [c["name"] for c in drill.get("checks", []) if not c["ok"]],
    }


def table(result: dict[str, Any]) -> str:
    s = result["storm"]
    c = result["calibration"]
    lines = [
        "== bench-storm",
        "apiserver node PATCH/s by concurrency: "
        + ", ".join(f"c={r['concurrency']}: {r['writes_per_s']:.0f}" for r in c["node_patch"]),
        f"max writes/s {c['max_writes_per_s']:.0f}; {s['doomed_nodes']} doomed nodes ->"
        f" physical minimum for all-cordoned {s['physical_min_all_cordoned_s']} s",
        f"all cordoned after {s['all_cordoned_s']} s ({s['cordoned']}/{s['doomed_nodes']}):"
        f" {s['ratio_to_physical_min']}x the minimum (target <= 2x)",
        f"minimum given the notices' arrivals {s.get('physical_min_given_arrivals_s')} s:"
        f" {s.get('ratio_to_min_given_arrivals')}x",
    ]
    lines.extend(intake_lines(c.get("intake") or {}, s.get("intake") or {}))
    for key, label in (
        ("notice_to_cordoned_s", "sent -> cordoned"),
        ("notice_to_all_asked_s", "sent -> all ranks asked"),
        ("send_to_receipt_s", "sent -> received"),
        ("receipt_to_cordoned_s", "received -> cordoned"),
        ("receipt_to_all_asked_s", "received -> all ranks asked"),
        ("notice_to_drained_s", "sent -> drained"),
    ):
        d = s.get(key) or {}
        if not d:
            continue
        lines.append(f"{label:<28} p50 {d['p50']}  p99 {d['p99']}  max {d['max']}  (n={d['n']})")
    lines.append(
        f"deadlines met {s['deadlines_met']}/{s['notices']}; lost {s.get('lost')},"
        f" doubled {s.get('doubled')}; takeovers of a faulted replica {s.get('takeovers')},"
        f" of a live holder {s.get('live_takeovers')} (fenced actions {s.get('fenced_actions')})"
    )
    lines.append(
        f"ledger over {s.get('kafka_listener')}: charge end -> on the topic"
        f" p50 {s.get('ledger_delay_p50_s')} s, max {s.get('ledger_delay_max_s')} s"
    )
    lines.append(
        f"writes {s['writes_total']} ({s['writes_per_doomed_node']} per doomed node): "
        + ", ".join(f"{k} {v}" for k, v in s["writes_by_kind"].items())
    )
    lines.append(
        f"per object: claim writes {s['claim_writes_per_node']}/node (minimum 2: claim+cordon,"
        f" done),"
        f" Lease {s['lease_writes_per_gang']}/gang (minimum 1; {s['gangs_charged']} gangs),"
        f" eviction {s['eviction_writes_per_pod']}/pod (minimum 1;"
        f" {s['ranks_of_charged_gangs']} pods)"
    )
    for label, f in (("scenario's sources", s), ("every source", result.get("every_source"))):
        if f:
            lines.append(
                f"per replica, {label}: peak RSS MB "
                + ", ".join(f"{k} {v}" for k, v in f["peak_rss_mb"].items())
                + "; modules loaded "
                + ", ".join(f"{k} {v}" for k, v in f["modules_loaded"].items())
            )
    for name, b in sorted((s.get("write_budget") or {}).items()):
        if b:
            lines.append(f"write budget {name}: " + ", ".join(f"{k} {v}" for k, v in b.items()))
    if "cache" in result:
        lines.append(f"cache: {json.dumps(result['cache'])}")
    lines.append(
        f"drill verdict: {'ok' if s['verdict_ok'] else 'FAILED ' + ', '.join(s['failed_checks'])}"
    )
    return "\n".join(lines)


def intake_lines(plain: dict[str, Any], reclaimd: dict[str, Any]) -> list[str]:
    """Per calibrated transport: a plain consumer's messages/s, then reclaimd's received/s."""
    lines = []
    for key, q in sorted(plain.items()):
        if "error" in q:
            lines.append(f"intake {key}: calibration failed: {q['error']}")
            continue
        lines.append(
            f"intake {q['transport']}: {q['messages']} messages to {q['consumer']}"
            f" in {q['all_received_s']} s: {q['received_per_s']}/s"
        )
        vs = intake.compare(q, reclaimd)
        lines.append(
            f"intake {key}: plain {vs['plain_per_s']}/s vs reclaimd received"
            f" {reclaimd.get('received')} in {reclaimd.get('first_to_last_s')} s:"
            f" {vs['reclaimd_per_s']}/s ({vs['reclaimd_to_plain']}x plain; sent over"
            f" {reclaimd.get('sent_first_to_last_s')} s)"
        )
    return lines


def scenario_sources(path: Path) -> set[str]:
    from chaos.drill import scenario as scenarios

    return {str(n.source) for n in scenarios.load(path).notices}


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    stack = stackenv.load()
    calibration = await calibrate(
        stack, nodes=args.calibrate_nodes, concurrencies=args.concurrency, seconds=args.seconds
    )
    # The intake's own limit, on the transports the storm uses, in the same run.
    calibration["intake"] = await intake.calibrate(
        stack, scenario_sources(args.scenario), args.calibrate_messages
    )
    drill = await storm(stack, args.scenario)
    summary = summarize(calibration, drill)
    result: dict[str, Any] = {
        "benchmark": "storm",
        "scenario": args.scenario.stem,
        "calibration": calibration,
        "storm": summary,
        # messages/s of a plain consumer vs reclaimd's received/s, per calibrated transport
        "intake_vs_plain": {
            key: intake.compare(q, summary["intake"]) for key, q in calibration["intake"].items()
        },
        "machine": {"python": platform.python_version(), "cpus": _cpus()},
    }
    if args.every_source:
        result["every_source"] = footprint(await storm(stack, args.scenario, every_source=True))
    if args.cache:
        from chaos.bench import cache as bench_cache

        result["cache"] = await bench_cache.bench(bench_cache.parse([]), stack)
    args.drill_json.parent.mkdir(parents=True, exist_ok=True)
    args.drill_json.write_text(json.dumps(drill, indent=1) + "\n")
    return result


def _cpus() -> int:
    import os

    return os.cpu_count() or 0


def _concurrencies(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of integers: {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError("concurrencies must be positive integers")
    return values


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="chaos.bench.storm", description=__doc__.splitlines()[0])
    p.add_argument("--scenario", type=Path, default=SCENARIO)
    p.add_argument("--calibrate-nodes", type=int, default=200)
    p.add_argument("--concurrency", type=_concurrencies, default=[1, 8, 32, 64, 128])
    p.add_argument("--seconds", type=float, default=3.0, help="per calibration concurrency")
    p.add_argument(
        "--calibrate-messages", type=int, default=300, help="SQS messages (the storm's notices)"
    )
    p.add_argument("--cache", action="store_true", help="also the cache RSS bench (slow)")
    p.add_argument(
        "--no-every-source", dest="every_source", action="store_false",
        help="skip the second storm whose replicas consume every central source (their RSS)",
    )  # fmt: skip
    p.add_argument("--out", type=Path, default=Path("out/bench-storm.json"))
    p.add_argument("--drill-json", type=Path, default=Path("out/bench-storm-drill.json"))
    args = p.parse_args(argv)
    if not args.scenario.is_file():
        print(f"bench-storm: no scenario file {args.scenario}", file=sys.stderr)
        return 2
    try:
        result = asyncio.run(bench(args))
    except stackenv.StackNotRunning as e:
        print(f"bench-storm: {e}", file=sys.stderr)
        return 2
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(table(result))
    return 0 if result["storm"]["verdict_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
