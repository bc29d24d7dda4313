"""deploy/aws: the JSON files are the source of truth; the CloudFormation template must embed
them unchanged, and the patterns must cover exactly the kinds the EC2 handler parses."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from reclaimd.handlers.sqs.parser import KINDS

AWS_DIR = Path(__file__).resolve().parents[2] / "deploy" / "aws"
PATTERNS_DIR = AWS_DIR / "event-patterns"
TEMPLATE = AWS_DIR / "reclaimd.cfn.yaml"

# Which rule of the template carries which pattern file.
RULES = {
    "SpotInterruptionRule": "spot-interruption.json",
    "RebalanceRecommendationRule": "rebalance-recommendation.json",
    "InstanceStateChangeRule": "instance-state-change.json",
    "HealthScheduledChangeRule": "health-scheduled-change.json",
    "AsgTerminateLifecycleRule": "asg-terminate-lifecycle.json",
}


def load_json(path: Path) -> Any:
    return json.loads(path.read_text())


def as_cloudformation(node: Any) -> Any:
    """The JSON document as the template writes it: each ``${...}`` string under Fn::Sub."""
    if isinstance(node, dict):
        return {k: as_cloudformation(v) for k, v in node.items()}
    if isinstance(node, list):
        return [as_cloudformation(v) for v in node]
    if isinstance(node, str) and "${" in node:
        return {"Fn::Sub": node}
    return node


@pytest.fixture(scope="module")
def resources() -> dict[str, Any]:
    template = yaml.safe_load(TEMPLATE.read_text())
    assert isinstance(template, dict)
    found = template["Resources"]
    assert isinstance(found, dict)
    return found


def test_every_pattern_file_is_one_rule() -> None:
    assert sorted(p.name for p in PATTERNS_DIR.glob("*.json")) == sorted(RULES.values())


@pytest.mark.parametrize(("rule", "pattern_file"), sorted(RULES.items()))
def test_template_rule_embeds_pattern_file(
    resources: dict[str, Any], rule: str, pattern_file: str
) -> None:
    properties = resources[rule]["Properties"]
    assert resources[rule]["Type"] == "AWS::Events::Rule"
    assert properties["EventPattern"] == load_json(PATTERNS_DIR / pattern_file)
    assert properties["Targets"] == [
        {"Id": "reclaimd-queue", "Arn": {"Fn::GetAtt": ["Queue", "Arn"]}}
    ]


def test_template_embeds_queue_policy(resources: dict[str, Any]) -> None:
    policy = resources["QueuePolicy"]["Properties"]
    assert policy["Queues"] == [{"Ref": "Queue"}]
    assert policy["PolicyDocument"] == as_cloudformation(load_json(AWS_DIR / "queue-policy.json"))


def test_template_embeds_iam_policy(resources: dict[str, Any]) -> None:
    document = resources["ReclaimdPolicy"]["Properties"]["PolicyDocument"]
    assert document == as_cloudformation(load_json(AWS_DIR / "iam-policy.json"))


def test_queue_policy_admits_only_the_rules() -> None:
    (allow,) = [
        s for s in load_json(AWS_DIR / "queue-policy.json")["Statement"] if s["Effect"] == "Allow"
    ]
    assert allow["Principal"] == {"Service": "events.amazonaws.com"}
    assert allow["Action"] == "sqs:SendMessage"
    sources = allow["Condition"]["ArnEquals"]["aws:SourceArn"]
    assert sources == [f"${{{rule}.Arn}}" for rule in RULES]


def test_iam_policy_grants_nothing_else() -> None:
    statements = load_json(AWS_DIR / "iam-policy.json")["Statement"]
    assert all(s["Effect"] == "Allow" for s in statements)
    granted = {(a, s["Resource"]) for s in statements for a in s["Action"]}
    queue = "${Queue.Arn}"
    groups = (
        "arn:${AWS::Partition}:autoscaling:${AWS::Region}:${AWS::AccountId}"
        ":autoScalingGroup:*:autoScalingGroupName/*"
    )
    assert granted == {
        ("sqs:ReceiveMessage", queue),
        ("sqs:DeleteMessage", queue),
        ("sqs:ChangeMessageVisibility", queue),
        ("sqs:GetQueueAttributes", queue),
        ("autoscaling:CompleteLifecycleAction", groups),
        ("autoscaling:RecordLifecycleActionHeartbeat", groups),
    }


def test_patterns_cover_exactly_the_parsed_kinds() -> None:
    covered = set()
    for name in RULES.values():
        pattern = load_json(PATTERNS_DIR / name)
        covered |= {(s, d) for s in pattern["source"] for d in pattern["detail-type"]}
    assert covered == set(KINDS)


def test_template_passes_cfn_lint(tmp_path: Path) -> None:
    from cfnlint.api import lint_file

    assert [str(m) for m in lint_file(TEMPLATE)] == []
    # The linter does flag a broken template (a rule targeting a resource that does not exist).
    broken = tmp_path / "broken.yaml"
    broken.write_text(TEMPLATE.read_text().replace("[Queue, Arn]", "[Missing, Arn]", 1))
    assert lint_file(broken) != []


def test_template_embeds_the_msk_iam_policy_only_when_asked(resources: dict[str, Any]) -> None:
    msk = resources["ReclaimdMskIamPolicy"]
    assert msk["Condition"] == "UseMskIam"
    document = msk["Properties"]["PolicyDocument"]
    assert document == as_cloudformation(load_json(AWS_DIR / "msk-iam-policy.json"))


def test_msk_iam_policy_grants_the_ledger_and_notices_and_nothing_else() -> None:
    statements = load_json(AWS_DIR / "msk-iam-policy.json")["Statement"]
    assert all(s["Effect"] == "Allow" for s in statements)
    arn = "arn:${AWS::Partition}:kafka:${AWS::Region}:${AWS::AccountId}:"
    c = "${MskClusterName}/${MskClusterUuid}"

    def resources(s: dict[str, Any]) -> list[str]:
        r = s["Resource"]
        return [r] if isinstance(r, str) else list(r)

    granted = {
        (a, r.removeprefix(arn)) for s in statements for a in s["Action"] for r in resources(s)
    }
    ledger = {f"topic/{c}/reclaimd.restart-waste*", f"topic/{c}/reclaimd.allocation*"}
    assert granted == {
        ("kafka-cluster:Connect", f"cluster/{c}"),
        ("kafka-cluster:DescribeCluster", f"cluster/{c}"),
        # The ledger's producer is transactional, hence idempotent.
        ("kafka-cluster:WriteDataIdempotently", f"cluster/{c}"),
        *{("kafka-cluster:DescribeTopic", t) for t in ledger},
        *{("kafka-cluster:WriteData", t) for t in ledger},
        # The adoption scan and the report read the ledger back.
        *{("kafka-cluster:ReadData", t) for t in ledger},
        ("kafka-cluster:DescribeTopic", f"topic/{c}/reclaimd.notices*"),
        ("kafka-cluster:ReadData", f"topic/{c}/reclaimd.notices*"),
        ("kafka-cluster:DescribeGroup", f"group/{c}/reclaimd*"),
        ("kafka-cluster:AlterGroup", f"group/{c}/reclaimd*"),
        ("kafka-cluster:DescribeTransactionalId", f"transactional-id/{c}/reclaimd-ledger-*"),
        ("kafka-cluster:AlterTransactionalId", f"transactional-id/{c}/reclaimd-ledger-*"),
    }
    # Every grant is confined to the one cluster: never a wildcard over clusters.
    assert all(f"/{c}" in r for _, r in granted)
