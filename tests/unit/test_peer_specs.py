"""reclaimd/cluster/peers.py's reading of the peers' specs (the e2e test reads them from the
API server; these are the shapes it does not create)."""

from __future__ import annotations

from typing import Any

from reclaimd.cluster import peers

KARP = peers.Place("deployments", "karpenter", "karpenter")
NTH_D = peers.Place("deployments", "kube-system", peers.NTH)
NTH_DS = peers.Place("daemonsets", "kube-system", peers.NTH)
OURS = "https://sqs.eu-west-1.amazonaws.com/111122223333/reclaimd-interruptions"


def spec(*containers: dict[str, Any], scheduled: int = 0) -> dict[str, Any]:
    return {
        "spec": {"template": {"spec": {"containers": list(containers)}}},
        "status": {"desiredNumberScheduled": scheduled},
    }


def env(**values: str) -> list[dict[str, str]]:
    return [{"name": k, "value": v} for k, v in values.items()]


def test_karpenter_flag_in_either_form_and_the_env() -> None:
    for c in (
        {"args": ["--interruption-queue", "my-cluster"]},
        {"args": ["--interruption-queue=my-cluster"]},
        {"env": env(INTERRUPTION_QUEUE="my-cluster")},
    ):
        line = peers.karpenter(KARP, spec(c), OURS, its_nodes=False)
        assert "its queue my-cluster" in line and "none here yet" in line, c
    assert peers.karpenter(KARP, spec({"env": env(INTERRUPTION_QUEUE="")}), OURS, True) == ""
    assert peers.karpenter(KARP, spec({"name": "controller"}), OURS, True) == ""


def test_karpenter_on_our_queue_by_name_or_url_and_a_queue_from_a_secret() -> None:
    for queue in ("reclaimd-interruptions", OURS):
        line = peers.karpenter(KARP, spec({"env": env(INTERRUPTION_QUEUE=queue)}), OURS, True)
        assert "reclaimd's own queue" in line
    hidden = {"env": [{"name": "INTERRUPTION_QUEUE", "valueFrom": {"configMapKeyRef": {}}}]}
    assert "not read" in peers.karpenter(KARP, spec(hidden), OURS, True)


def test_nth_queue_mode_says_which_instances() -> None:
    tagged = spec({"env": env(ENABLE_SQS_TERMINATION_DRAINING="true", QUEUE_URL="https://q/x")})
    line = peers.nth_queue(NTH_D, tagged, OURS)
    assert "its queue https://q/x" in line and "tagged aws-node-termination-handler/managed" in line
    custom = spec(
        {
            "env": env(
                ENABLE_SQS_TERMINATION_DRAINING="True",
                QUEUE_URL=OURS,
                MANAGED_TAG="team/nth",
            )
        }
    )
    line = peers.nth_queue(NTH_D, custom, OURS)
    assert "reclaimd's own queue" in line and "tagged team/nth" in line
    every = spec(
        {"env": env(ENABLE_SQS_TERMINATION_DRAINING="true", CHECK_TAG_BEFORE_DRAINING="false")}
    )
    assert "every instance" in peers.nth_queue(NTH_D, every, OURS)
    assert peers.nth_queue(NTH_D, spec({"env": env(QUEUE_URL=OURS)}), OURS) == ""


def test_nth_imds_mode_drains_by_default() -> None:
    assert "the 12 node(s)" in peers.nth_metadata_mode(NTH_DS, spec({"name": "nth"}, scheduled=12))
    off = spec({"env": env(ENABLE_SPOT_INTERRUPTION_DRAINING="false")})
    assert peers.nth_metadata_mode(NTH_DS, off) == ""
