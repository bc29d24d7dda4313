"""The game day's blast radius, without a cluster: which labelled nodes a scenario binds to,
and every refusal (one line, before anything is sent)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from chaos import fleet
from chaos.drill.plan import plan
from chaos.drill.scenario import parse
from chaos.gameday.cleanup import _restore_patches
from chaos.gameday.target import GameDayError, Release, _set, bind, finished, state_of
from reclaimd.config import Settings

SCENARIO = {
    "name": "gd",
    "seed": 1,
    "cluster": {"pools": [{"name": "a", "count": 2, "zone": "us-east-2a"}]},
    "gangs": [{"name": "llm", "ranks": 2, "gpus_per_rank": 4}],
    "notices": [{"source": "ec2-sqs", "target": {"nodes": ["a-0"]}}],
}


def node(name: str, *, purchase: str = "spot", **spec: Any) -> dict[str, Any]:
    body = fleet.node_body(
        fleet.NodeSpec(name, f"i-{abs(hash(name)) % 16**17:017x}", purchase_option=purchase)
    )
    body["spec"].update(spec)
    return body


def release(nodes: frozenset[str] = frozenset()) -> Release:
    return Release("r", "ns", Settings(), ("r-0",), nodes, dry_run=False)


def the_plan() -> Any:
    return plan(parse(SCENARIO), run_id="t")


def test_binds_each_planned_node_to_a_labelled_one_with_its_real_facts() -> None:
    nodes = [node("n-1"), node("n-2"), node("n-3", purchase="on-demand")]
    bound, states = bind(the_plan(), nodes, {}, label="k=v", max_nodes=5, release=release())
    assert [n.name for n in bound.nodes] == ["n-1", "n-2"]  # the spot ones, in name order
    assert bound.nodes[0].instance_id.startswith("i-") and bound.nodes[0].zone == "us-east-2a"
    assert [s.name for s in states] == ["n-1", "n-2"] and not states[0].unschedulable
    assert bound.windows == Settings().windows  # the release's windows, not the scenario's


TAINTED = {"taints": [{"key": "reclaimd.io/interruption", "effect": "NoSchedule"}]}
TWO = ["n-1", "n-2"]


@pytest.mark.parametrize(
    ("nodes", "pods", "max_nodes", "says"),
    [
        ([node(n) for n in TWO], {}, 1, "the scenario needs 2 nodes; --max-nodes is 1"),
        ([node("n-1")], {}, 5, "needs 2 aws spot node(s); 1 carry k=v"),
        ([node("n-1"), node("n-2", unschedulable=True)], {}, 5, "n-2 carries k=v but is cordoned"),
        ([node("n-1"), node("n-2", **TAINTED)], {}, 5, "has a reclaimd taint"),
        ([node(n) for n in TWO], {"n-2": ["prod/web-0"]}, 5, "runs 1 pod(s) a game day would"),
    ],
)
def test_refuses_what_is_not_a_drill_target(
    nodes: list[dict[str, Any]], pods: dict[str, list[str]], max_nodes: int, says: str
) -> None:
    with pytest.raises(GameDayError, match=says.replace("(", r"\(").replace(")", r"\)")):
        bind(the_plan(), nodes, pods, label="k=v", max_nodes=max_nodes, release=release())


def test_a_node_running_the_release_is_refused() -> None:
    with pytest.raises(GameDayError, match="runs the release itself"):
        bind(
            the_plan(), [node("n-1"), node("n-2")], {}, label="k=v", max_nodes=5,
            release=release(frozenset({"n-1"})),
        )  # fmt: skip


def test_state_of_and_set_path() -> None:
    n = node("n-1", unschedulable=True)
    n["metadata"]["annotations"]["reclaimd.io/claim"] = "{}"
    st = state_of(n)
    assert st.unschedulable and st.claim == "{}" and st.labels["type"] == "kwok"
    data: dict[str, Any] = {"ledger": {"topic": "t"}}
    _set(data, "ledger.bootstrap", "k:9092")
    _set(data, "sqs.wait_time_s", "1")  # a string here: the settings model converts it
    assert data == {"ledger": {"topic": "t", "bootstrap": "k:9092"}, "sqs": {"wait_time_s": "1"}}
    assert Settings.model_validate(data).sqs.wait_time_s == 1
    with pytest.raises(GameDayError, match="is not a section"):
        _set(data, "ledger.topic.x", "1")
    with pytest.raises(GameDayError, match="no such setting"):
        _set(data, "ledgr.bootstrap", "1")


def claimed(name: str, phase: str) -> dict[str, Any]:
    body = node(name)
    body["metadata"].setdefault("annotations", {})["reclaimd.io/claim"] = json.dumps(
        {"notice_id": "n", "holder": "r-0", "phase": phase, "claimed_at": "2026-05-01T12:00:00Z"}
    )
    return body


def test_an_open_claim_is_refused_and_a_finished_one_is_only_a_record() -> None:
    """An earlier drill's (or a real notice's) finished claim stays on a node put back, so
    that a late copy of its notice is a duplicate: it holds the node for nothing."""
    with pytest.raises(GameDayError, match="n-2 carries k=v but is claimed"):
        bind(the_plan(), [node("n-1"), claimed("n-2", "drained")], {}, label="k=v",
             max_nodes=5, release=release())  # fmt: skip
    bound, states = bind(the_plan(), [node("n-1"), claimed("n-2", "done")], {}, label="k=v",
                         max_nodes=5, release=release())  # fmt: skip
    assert [n.name for n in bound.nodes] == TWO and states[1].claim
    assert finished(states[1].claim) and not finished(None) and not finished("not json")
    # put back: the release's finished claim stays, an open one is erased (and waited for)
    st = states[0]
    meta, _ = _restore_patches(st, state_of(claimed("n-1", "done")))
    assert meta["metadata"]["annotations"]["reclaimd.io/claim"] == states[1].claim
    meta, _ = _restore_patches(st, state_of(claimed("n-1", "signaled")))
    assert meta["metadata"]["annotations"]["reclaimd.io/claim"] is None
