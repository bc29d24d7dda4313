"""``make bench-peers``: its bad-input paths (one line, exit 2) and the arithmetic it reports.
The bench itself needs the stack and minutes; it is not run here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from chaos.bench.peers.apiserver import FS_PREFIX, READ_BUCKETS, flow_schemas, summarize_requests
from chaos.bench.peers.common import NTH_BUILD, delta, flow_counts, percentile
from chaos.bench.peers.run import build_parser
from chaos.bench.peers.side import Observed, per_node_figures
from chaos.bench.peers.summary import ratios, summarize, table

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "argv",
    [
        ["--nodes", "0"],
        ["--nodes", "many"],
        ["--repeat", "-1"],
        ["--cap", "0"],
        ["--sides", "karpenter"],
        ["--sides", ","],
        ["--bogus"],
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(argv: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "chaos.bench.peers.run", *argv],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=False,
    )
    assert done.returncode == 2
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("bench-peers: error: "), done.stderr


def test_arguments_parse() -> None:
    args = build_parser().parse_args(["--nodes", "50", "--repeat", "1", "--sides", "reclaimd"])
    assert (args.nodes, args.repeat, args.sides, args.cap) == (50, 1, ("reclaimd",), 300.0)
    # NTH always runs first, whatever order is asked for
    assert build_parser().parse_args(["--sides", "reclaimd,nth"]).sides == ("nth", "reclaimd")


@pytest.mark.parametrize("argv", [["v2.0.0-beta"], ["1.25.6"], ["v1.25.6", "extra"], ["v1.x.6"]])
def test_nth_build_script_refuses_bad_versions_in_one_line(argv: list[str]) -> None:
    done = subprocess.run(
        ["bash", str(NTH_BUILD), *argv], capture_output=True, text=True, check=False
    )
    assert done.returncode == 2
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("[nth] error: usage:"), done.stderr


METRICS = """\
# HELP apiserver_flowcontrol_dispatched_requests_total [BETA] Number of requests executed
# TYPE apiserver_flowcontrol_dispatched_requests_total counter
apiserver_flowcontrol_dispatched_requests_total{flow_schema="bench-peers-nth-node-get",priority_level="workload-low"} 40
apiserver_flowcontrol_dispatched_requests_total{flow_schema="bench-peers-nth-node-patch",priority_level="workload-low"} 12
apiserver_flowcontrol_dispatched_requests_total{flow_schema="global-default",priority_level="global-default"} 999
apiserver_flowcontrol_rejected_requests_total{flow_schema="bench-peers-nth-node-patch",priority_level="workload-low",reason="queue-full"} 3
apiserver_flowcontrol_rejected_requests_total{flow_schema="bench-peers-nth-node-patch",priority_level="workload-low",reason="time-out"} 1
"""  # noqa: E501


def test_request_counts_from_metrics() -> None:
    before = flow_counts(METRICS, FS_PREFIX)
    assert before["dispatched"] == {
        "bench-peers-nth-node-get": 40.0,
        "bench-peers-nth-node-patch": 12.0,
    }
    assert before["rejected"] == {"bench-peers-nth-node-patch": 4.0}
    after = flow_counts(METRICS.replace("} 40", "} 45").replace("} 12", "} 20"), FS_PREFIX)
    s = summarize_requests(delta(after, before), "nth")
    assert s == {
        "total": 13,
        "reads": 5,
        "writes": 8,
        "rejected": 0,
        "by": {"node-get": 5, "node-patch": 8},
    }
    assert summarize_requests(delta(after, before), "reclaimd")["total"] == 0


def test_flow_schemas_are_ordered_and_cover_everything() -> None:
    docs = flow_schemas("nth", {"kind": "User", "user": {"name": "x"}}, "workload-low")
    precedences = [d["spec"]["matchingPrecedence"] for d in docs]
    assert precedences == sorted(precedences) and len(set(precedences)) == len(docs)
    assert all(d["spec"]["priorityLevelConfiguration"]["name"] == "workload-low" for d in docs)
    catch_all = docs[-2]["spec"]["rules"][0]
    assert catch_all["resourceRules"][0]["resources"] == ["*"]
    assert catch_all["resourceRules"][0]["verbs"] == ["*"]
    assert docs[-1]["spec"]["rules"][0]["nonResourceRules"][0]["nonResourceURLs"] == ["*"]
    assert "non-resource" in READ_BUCKETS and "other-write" not in READ_BUCKETS
    other = flow_schemas("reclaimd", {"kind": "User", "user": {"name": "y"}}, "global-default")
    assert not {d["spec"]["matchingPrecedence"] for d in other} & set(precedences)


class _Spec:
    def __init__(self, name: str) -> None:
        self.name = name


def test_per_node_figures_and_lower_bounds() -> None:
    specs = [_Spec("a"), _Spec("b")]
    pods_of = {"a": ["a-0", "a-1"], "b": ["b-0", "b-1"]}
    sent = {"a": 10.0, "b": 11.0}
    seen = Observed(cordoned={"a": 12.0}, gone={"a-0": 13.0, "a-1": 15.0, "b-0": 16.0})
    r = per_node_figures(specs, pods_of, sent=sent, seen=seen, t0=10.0, ended=40.0)
    assert (r["cordoned"], r["drained_nodes"], r["pods_gone"], r["complete"]) == (1, 1, 3, False)
    assert r["cordoned_s"] == {"p50": 2.0, "max": 2.0}
    assert r["drained_s"] == {"p50": 5.0, "max": 5.0}
    assert r["all_cordoned_s"] is None and r["makespan_s"] is None
    run = {**r, "side": "nth", "queue_empty_s": None, "requests": {"total": 9, "writes": 4,
                                                                   "rejected": 0}}  # fmt: skip
    s = summarize([run], "nth")
    assert s is not None
    assert s["all_cordoned_s"] == {"value": 30.0, "lower_bound": True}
    assert s["cordoned_max_s"] == {"value": 30.0, "lower_bound": True}

    seen.cordoned["b"] = 11.5
    seen.gone["b-1"] = 14.0
    r2 = per_node_figures(specs, pods_of, sent=sent, seen=seen, t0=10.0, ended=17.0)
    assert r2["complete"] and r2["all_cordoned_s"] == 2.0 and r2["all_drained_s"] == 6.0
    assert r2["makespan_s"] == 6.0
    fast = {**r2, "side": "reclaimd", "queue_empty_s": 1.0,
            "requests": {"total": 3, "writes": 2, "rejected": 0}}  # fmt: skip
    rs = summarize([fast], "reclaimd")
    assert rs is not None and s is not None
    rat = ratios(s, rs)
    assert rat["all_cordoned"] == {"ratio": 15.0, "at_least": True, "target_10x_met": True}
    assert rat["all_drained"]["ratio"] == 5.0 and not rat["all_drained"]["target_10x_met"]
    assert rat["requests"] == {"ratio": 3.0, "at_least": False}
    assert "NOT met" in table({"nth": s, "reclaimd": rs}, rat)


def test_percentile() -> None:
    assert percentile([], 0.5) is None
    assert percentile([3.0, 1.0, 2.0], 0.5) == 2.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 1.0) == 4.0
