"""``make demo``: one Spot Interruption Warning through SQS, handled by a real reclaimd.

The fleet: 4 kwok GPU nodes (node 2 on-demand, the others spot); a 3-rank gang across nodes
0-2 and a one-pod job of another tenant on node 0. The notice names node 0's instance. What it
prints: each step with its time against the deadline, what every rank was asked and answered,
and the restart-waste events read back from Kafka. What money looks like is the storm's to
show (``chaos.demo.report``, after this): one warning of a few seconds costs cents.
"""

from __future__ import annotations

import asyncio
import json
import sys

from chaos import stack as stackenv
from chaos.harness import Harness
from reclaimd import postmortem
from reclaimd.model import utcnow


def say(text: str = "") -> None:
    print(text, flush=True)


async def demo() -> int:
    stack = stackenv.load()
    async with Harness(stack) as h:
        say(f"== reclaimd demo (run {h.run_id}, namespace {h.namespace})")
        nodes = [
            h.node_spec(i, purchase_option="on_demand" if i == 2 else "spot") for i in range(4)
        ]
        await h.add_nodes(nodes)
        say(f"   4 kwok GPU nodes Ready: {', '.join(n.name for n in nodes)} (node 2 on-demand)")
        gang = await h.add_gang("llm-pretrain", [n.name for n in nodes[:3]])
        solo = await h.add_gang(
            "eval-job", [nodes[0].name], gpus_per_rank=1, queue="eval", tenant="team-b"
        )
        say(f"   gang {gang.name}: 3 ranks x 8 GPUs on {', '.join(n.name for n in nodes[:3])}")
        say(f"   job  {solo.name}: 1 pod x 1 GPU on {nodes[0].name}; last checkpoints 10 min ago")

        await h.start_daemon()
        say("   reclaimd running (as user 'reclaimd', least-privilege RBAC)")
        doomed = nodes[0]
        notice = h.send_spot(doomed)
        sent = utcnow()
        assert notice.deadline is not None
        say(
            f"\n-> Spot Interruption Warning for {doomed.instance_id} ({doomed.name}) sent to SQS;"
            f" deadline {notice.deadline:%H:%M:%S} (120 s)"
        )

        events = await h.ledger_events(count=2, timeout_s=120, settle_s=1.0)
        took = (utcnow() - sent).total_seconds()
        await asyncio.sleep(0.5)  # let the batch span exporter write the last spans
        for d in h.daemons:
            await d.stop()

        say(f"\n== timeline (from the notice's trace, {h.span_file})")
        try:
            timeline = postmortem.load(h.span_file, notice.id)
            say(postmortem.render_text(timeline))
        except postmortem.NotFound as missing:
            say(f"   {missing}")

        say("\n== what the ranks received")
        for t in h.trainers:
            reqs = [r for r in t.requests if r.notice_id == notice.id]
            if reqs:
                at = (reqs[0].received_at - notice.received_at).total_seconds()
                say(f"   {t.key:<40} asked at +{at:.3f}s  traceparent {reqs[0].traceparent[:36]}…")

        claim = await h.claim_of(doomed.name)
        node = await h.core.read_node(doomed.name)
        taints = [f"{t.key}={t.value}:{t.effect}" for t in (node.spec.taints or [])]
        say(f"\n== node {doomed.name}: unschedulable={node.spec.unschedulable} taints={taints}")
        say(f"   claim phase {claim and claim.get('phase')} holder {claim and claim.get('holder')}")

        say(f"\n== restart-waste ledger ({h.topic}), {len(events)} event(s)")
        for e in events:
            shown = {k: v for k, v in e.items() if not k.startswith("_")}
            say(json.dumps(shown, indent=2, sort_keys=True))
        ok = len(events) == 2 and all(e.get("x_DeadlineMet") for e in events)
        deadline_left = (notice.deadline - utcnow()).total_seconds()
        say(
            f"\n== {'OK' if ok else 'NOT OK'}: {len(events)} gang event(s) in {took:.2f} s,"
            f" {deadline_left:.0f} s before the deadline"
        )
        return 0 if ok else 1


def main() -> int:
    try:
        return asyncio.run(demo())
    except stackenv.StackNotRunning as e:
        print(f"demo: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
