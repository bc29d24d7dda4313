"""A storm of checkpoint uploads, asked with reclaimd's per-rank shares, against the stack's S3.

20 ranks of one tenant each upload 3 objects through a fault proxy that answers 20 % of the
PutObject attempts with 503 SlowDown (each object at most once, so every object can end stored
whatever the retry limits). Asserted: the facts that are not timings. Every object is stored
exactly once (the bucket is versioned, so a duplicate put would show as a second version);
every attempt the ranks made reached the proxy, and attempts = objects + the 503s (no attempt
is lost or doubled); and the tenant's requests in any 1 s window, counted from the proxy's log,
stay within budget + burst. That last one is a rate limit, not a latency.

The 1 s window gets a one-token tolerance: a rank takes its token before the request leaves the
process (boto3 runs in a worker thread, then loopback and the proxy's own loop), so arrivals at
the proxy lag the tokens by a few milliseconds, unevenly. A window at the proxy can then hold
the sends of slightly more than one second at the ranks: burst + budget x (1 s + lag), which is
one token more as long as the lag stays under 1 / budget (50 ms at 20/s).
"""

from __future__ import annotations

from typing import Any

import pytest

from chaos.bench.uploads import StormConfig, run_storm

pytestmark = pytest.mark.e2e

BUDGET_QPS = 20.0
BURST = 20


async def test_a_tenants_upload_storm_stays_inside_its_budget(stack: Any) -> None:
    cfg = StormConfig(
        ranks=20,
        objects_per_rank=3,
        gang_size=4,
        fault_share=0.2,
        max_faults_per_key=1,
        budget_qps=BUDGET_QPS,
        burst=BURST,
        spread_s=0.0,
        deadline_s=60.0,
    )
    rep = await run_storm(cfg, s3_endpoint=stack.aws_endpoint)

    assert rep.objects == 60
    assert rep.slow_downs > 0  # the faults really happened, and were retried
    assert rep.stored_once == rep.objects
    assert rep.stored_more_than_once == 0 and rep.missing_objects == 0
    assert rep.put_requests_at_proxy == rep.attempts_by_ranks
    assert rep.attempts_by_ranks == rep.objects + rep.slow_downs
    assert rep.ranks_durable == cfg.ranks
    # Unpaced, the ranks' own guards (20/s each) would send all 72-odd requests in well under
    # a second; inside the tenant's budget no 1 s window holds more than budget + burst.
    assert rep.most_in_1s_window <= BUDGET_QPS + BURST + 1
