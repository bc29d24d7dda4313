"""deploy/aws applied to moto: every kind reclaimd parses reaches the queue, nothing else does.

The rules and the queue policy come from the plain JSON in deploy/aws (the same documents the
CloudFormation template embeds, see tests/unit/test_deploy_aws.py). Each case is checked both
ways: the expected routing is stated, and the EC2 handler must agree with it (a delivered event
parses into notices, a filtered one would have been Ignored), so the rules drop only what
reclaimd would drop anyway. moto does not enforce queue policies; the policy is set and read back
so that its placeholders are proven resolvable, not to test AWS's authorization.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import boto3
import pytest
from stack import REPO_DIR, Stack

from reclaimd.handlers.sqs import parser as ec2_spot
from reclaimd.model import Ignored, Windows, load_json, parse_time

AWS_DIR = REPO_DIR / "deploy" / "aws"
# The public sample payloads beside the checkout (as tests/unit/shared_fixtures.py finds them).
FIXTURES = REPO_DIR.parent / "shared" / "fixtures"
RULES = {
    "SpotInterruptionRule": "spot-interruption.json",
    "RebalanceRecommendationRule": "rebalance-recommendation.json",
    "InstanceStateChangeRule": "instance-state-change.json",
    "HealthScheduledChangeRule": "health-scheduled-change.json",
    "AsgTerminateLifecycleRule": "asg-terminate-lifecycle.json",
}
# Receives until the marker shows up; a deadline so a broken route fails instead of hanging.
MAX_RECEIVES = 30


@dataclass(frozen=True)
class Case:
    source: str
    detail_type: str
    detail: dict[str, Any]
    resources: tuple[str, ...] = ()
    time: str = "2025-01-01T12:00:00Z"

    def entry(self) -> dict[str, Any]:
        return {
            "Source": self.source,
            "DetailType": self.detail_type,
            "Detail": json.dumps(self.detail),
            "Resources": list(self.resources),
            "Time": parse_time(self.time),
        }

    def handler_acts(self) -> bool:
        """Whether reclaimd turns this event into notices (the body EventBridge would send)."""
        body = {
            "version": "0",
            "id": str(uuid.uuid4()),
            "source": self.source,
            "detail-type": self.detail_type,
            "account": "123456789012",
            "time": self.time,
            "region": "us-east-1",
            "resources": list(self.resources),
            "detail": self.detail,
        }
        outcome = ec2_spot.parse(
            json.dumps(body).encode(), received_at=datetime.now(UTC), windows=Windows()
        )
        return not isinstance(outcome, Ignored)


def fixture_case(name: str, **detail: Any) -> Case:
    event = load_json((FIXTURES / "aws" / name).read_bytes())
    return Case(
        source=event["source"],
        detail_type=event["detail-type"],
        detail={**event["detail"], **detail},
        resources=tuple(event["resources"]),
        time=event["time"],
    )


SPOT = "eventbridge-spot-interruption-warning.json"
STATE = "eventbridge-instance-state-change.json"
HEALTH = "eventbridge-health-scheduled-change.json"
ASG = "eventbridge-asg-terminate-lifecycle-action.json"

DELIVERED = {
    "spot-warning": fixture_case(SPOT),
    "rebalance": fixture_case("eventbridge-rebalance-recommendation.json"),
    "state-shutting-down": fixture_case(STATE),
    "state-stopping": fixture_case(STATE, state="stopping"),
    "state-stopped": fixture_case(STATE, state="stopped"),
    "state-terminated": fixture_case(STATE, state="terminated"),
    "health-scheduled-change": fixture_case(HEALTH),
    "asg-terminate": fixture_case(ASG),
}
FILTERED = {
    "state-pending": fixture_case(STATE, state="pending"),
    "state-running": fixture_case(STATE, state="running"),
    "health-issue": fixture_case(HEALTH, eventTypeCategory="issue"),
    "health-rds": fixture_case(HEALTH, service="RDS"),
    "asg-launch": Case(
        "aws.autoscaling",
        "EC2 Instance-launch Lifecycle Action",
        {**fixture_case(ASG).detail, "LifecycleTransition": "autoscaling:EC2_INSTANCE_LAUNCHING"},
    ),
    "s3-object-created": Case(
        "aws.s3",
        "Object Created",
        {"bucket": {"name": "checkpoints"}, "object": {"key": "rank-0.pt", "size": 1}},
        ("arn:aws:s3:::checkpoints",),
    ),
}


@dataclass(frozen=True)
class Routed:
    sqs: Any
    events: Any
    queue_url: str
    policy: dict[str, Any]
    expected_policy: dict[str, Any]


def substitute(node: Any, values: dict[str, str]) -> Any:
    """The JSON document with its ``${...}`` placeholders resolved (Fn::Sub's job in the stack)."""
    if isinstance(node, dict):
        return {k: substitute(v, values) for k, v in node.items()}
    if isinstance(node, list):
        return [substitute(v, values) for v in node]
    if isinstance(node, str):
        for name, value in values.items():
            node = node.replace(f"${{{name}}}", value)
        assert "${" not in node, f"unresolved placeholder in {node}"
    return node


@pytest.fixture(scope="module")
def routed(stack: Stack) -> Iterator[Routed]:
    rid = uuid.uuid4().hex[:8]
    sqs, events = boto3.client("sqs"), boto3.client("events")
    queue_url = sqs.create_queue(QueueName=f"reclaimd-cloud-{rid}")["QueueUrl"]
    queue_arn = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])[
        "Attributes"
    ]["QueueArn"]
    rules: list[str] = []
    try:
        arns = {"Queue.Arn": queue_arn}
        for logical, pattern_file in RULES.items():
            name = f"reclaimd-{rid}-{logical}"
            pattern = (AWS_DIR / "event-patterns" / pattern_file).read_text()
            arn = events.put_rule(Name=name, EventPattern=pattern)["RuleArn"]
            rules.append(name)
            events.put_targets(Rule=name, Targets=[{"Id": "reclaimd-queue", "Arn": queue_arn}])
            arns[f"{logical}.Arn"] = arn
        expected = substitute(load_json((AWS_DIR / "queue-policy.json").read_bytes()), arns)
        sqs.set_queue_attributes(QueueUrl=queue_url, Attributes={"Policy": json.dumps(expected)})
        policy = load_json(
            sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["Policy"])["Attributes"][
                "Policy"
            ]
        )
        yield Routed(sqs, events, queue_url, policy, expected)
    finally:
        for name in rules:
            events.remove_targets(Rule=name, Ids=["reclaimd-queue"])
            events.delete_rule(Name=name)
        sqs.delete_queue(QueueUrl=queue_url)


def deliver(routed: Routed, case: Case) -> list[dict[str, Any]]:
    """Put ``case``, then a Spot warning as a marker; every envelope received before the marker
    (so a filtered event is proven absent without waiting on a clock)."""
    sent = routed.events.put_events(Entries=[case.entry()])
    marker_case = fixture_case(SPOT, **{"instance-id": f"i-marker{uuid.uuid4().hex[:8]}"})
    marker = routed.events.put_events(Entries=[marker_case.entry()])
    assert sent["FailedEntryCount"] == 0
    assert marker["FailedEntryCount"] == 0
    marker_id = marker["Entries"][0]["EventId"]
    received: list[dict[str, Any]] = []
    for _ in range(MAX_RECEIVES):
        reply = routed.sqs.receive_message(
            QueueUrl=routed.queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=2
        )
        for message in reply.get("Messages", []):
            routed.sqs.delete_message(
                QueueUrl=routed.queue_url, ReceiptHandle=message["ReceiptHandle"]
            )
            envelope = load_json(message["Body"])
            if envelope["id"] == marker_id:
                return received
            received.append(envelope)
    pytest.fail(f"marker event {marker_id} never reached the queue", pytrace=False)


def test_queue_policy_resolves_to_the_rules(routed: Routed) -> None:
    assert routed.policy == routed.expected_policy
    (allow,) = [s for s in routed.policy["Statement"] if s["Effect"] == "Allow"]
    sources = allow["Condition"]["ArnEquals"]["aws:SourceArn"]
    assert len(sources) == len(RULES)
    assert all(":rule/reclaimd-" in arn for arn in sources)


@pytest.mark.parametrize("name", sorted(DELIVERED))
def test_parsed_kind_reaches_the_queue(routed: Routed, name: str) -> None:
    case = DELIVERED[name]
    assert case.handler_acts(), f"{name}: reclaimd would ignore it; it belongs in FILTERED"
    (envelope,) = deliver(routed, case)
    assert (envelope["source"], envelope["detail-type"]) == (case.source, case.detail_type)
    assert envelope["detail"] == case.detail
    outcome = ec2_spot.parse(
        json.dumps(envelope).encode(), received_at=datetime.now(UTC), windows=Windows()
    )
    assert not isinstance(outcome, Ignored)
    assert {n.target.instance_id for n in outcome} == {"i-1234567890abcdef0"}


@pytest.mark.parametrize("name", sorted(FILTERED))
def test_unrelated_event_does_not_reach_the_queue(routed: Routed, name: str) -> None:
    case = FILTERED[name]
    assert not case.handler_acts(), f"{name}: reclaimd acts on it; a rule must deliver it"
    assert deliver(routed, case) == []
