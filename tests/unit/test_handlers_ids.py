"""Identifier grammars: good ids pass unchanged, everything else is a one-line ParseError.

First each grammar on its own (real ids, and the near misses and hostile values a payload
can carry), then each parser: a real fixture with one identifier replaced is a ParseError
naming that field, never a notice.
"""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from shared_fixtures import FIXTURES

from reclaimd.handlers import PARSERS, ids
from reclaimd.model import ParseError, Windows

RECEIVED = datetime(2025, 9, 16, 12, 0, tzinfo=UTC)
# Hostile values every grammar refuses, and those that free-text names (an ASG name may
# hold spaces and slashes; a CloudEvents source is a URI reference) refuse too.
HOSTILE = ["", " ", "../etc/passwd", "a\nb", "a b", "a/b", "x" * 300, "A\x00", "ünï", "a,b=c"]
HOSTILE_TO_FREE_TEXT = ["", "a\nb", "x" * 300, "A\x00", "a\x7f"]
FREE_TEXT = {"ASG_NAME", "CLOUDEVENT_SOURCE"}

GOOD: dict[str, list[str]] = {
    "EC2_INSTANCE_ID": ["i-1234567890abcdef0", "i-0abc1234", "i-0aaaaaaaaaaaaaaa1"],
    "AWS_REGION": ["us-east-2", "us-gov-west-1", "eu-central-1", "us-isob-east-1", "cn-north-1"],
    "AWS_ZONE": ["us-east-2a", "us-west-2-lax-1a", "us-east-1-wl1-bos-wlz-1", "eu-west-1c"],
    "AWS_ACCOUNT": ["123456789012", "000000000000"],
    "ASG_NAME": ["my-asg", "eks-gpu-p5-2024 (prod)", "a" * 255],
    "LIFECYCLE_HOOK_NAME": ["my-lifecycle-hook", "drain/hook_1"],
    "LIFECYCLE_TOKEN": ["b4dd0f5b-0ef2-4479-9dad-6c55f027000e"],
    "EC2_INSTANCE_TYPE": ["p5.48xlarge", "u-6tb1.metal", "g6e.xlarge"],
    "K8S_NAME": ["ip-10-0-0-1.us-east-2.compute.internal", "gpu-0", "a" * 63 + "." + "b" * 63],
    "K8S_NAMESPACE": ["team-b", "default", "a" * 63],
    "K8S_UID": ["6f1c2d3e-4a5b-4c6d-8e9f-0a1b2c3d4e5f", "uid-1"],
    "GCE_NAME": ["gke-train-cluster-spot-a100-5b909138-nr65", "vm-1", "a" * 63],
    "GCE_ZONE": ["us-central1-a", "europe-west4-b"],
    "GCE_REGION": ["us-central1", "asia-northeast1"],
    "GCP_PROJECT": ["example-project", "reclaimd-local", "abcdef"],
    "PROVIDER_ID": ["aws:///us-east-2a/i-0abc1234", "gce://p-1/us-central1-a/vm", "kwok://n1"],
    "CLOUD_INSTANCE": ["i-0abc1234", "vm-1", "1844488190123456789"],
    "CLOUDEVENT_SOURCE": ["//drills/us-east-2", "urn:reclaimd:test"],
    "TRACEPARENT": ["00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"],
}
BAD: dict[str, list[str]] = {
    "EC2_INSTANCE_ID": ["i-0abc", "i-1234567890abcdef", "i-1234567890ABCDEF0", "i-0garbage"],
    "AWS_REGION": ["us-east", "US-EAST-2", "us-east-2a", "useast2"],
    "AWS_ZONE": ["us-east-2", "us-east-2A", "us-east-2/a", "zone-a"],
    "AWS_ACCOUNT": ["12345678901", "1234567890123", "12345678901a"],
    "ASG_NAME": ["a" * 256, "tab\there"],
    "LIFECYCLE_HOOK_NAME": ["hook name", "hook;rm", "a" * 256],
    "LIFECYCLE_TOKEN": ["not-a-token", "b4dd0f5b0ef244799dad6c55f027000e"],
    "EC2_INSTANCE_TYPE": ["p5", "p5.48xlarge.x"],
    "K8S_NAME": ["Upper", "-lead", "trail-", "a..b", "a" * 254, "a_b"],
    "K8S_NAMESPACE": ["a.b", "a" * 64, "Team"],
    "K8S_UID": ["u" * 129],
    "GCE_NAME": ["1vm", "vm-", "a" * 64, "vm.x"],
    "GCE_ZONE": ["us-central1", "us/central1-a", "us-central1-ab"],
    "GCE_REGION": ["us-central1-a", "central"],
    "GCP_PROJECT": ["abcde", "1project", "project-", "a" * 31, "example.com:project", "Proj-1"],
    "PROVIDER_ID": ["aws:///../i-0abc1234", "http://x/a?b=c", "noscheme", "aws:///a//b"],
    "CLOUD_INSTANCE": ["i_0abc", "I-0ABC1234", "../x", "-x"],
    "CLOUDEVENT_SOURCE": ["a b", "x" * 257],
    "TRACEPARENT": ["00-xyz", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331"],
}


@pytest.mark.parametrize(("grammar", "value"), [(g, v) for g, vs in GOOD.items() for v in vs])
def test_good_identifiers_pass_unchanged(grammar: str, value: str) -> None:
    assert getattr(ids, grammar).check(value, "f") == value


@pytest.mark.parametrize(
    ("grammar", "value"),
    [
        (g, v)
        for g, vs in BAD.items()
        for v in [*vs, *(HOSTILE_TO_FREE_TEXT if g in FREE_TEXT else HOSTILE)]
        if not (g == "LIFECYCLE_HOOK_NAME" and v == "a/b")  # AWS allows "/" in hook names
    ],
)
def test_bad_identifiers_are_one_line_parse_errors(grammar: str, value: str) -> None:
    with pytest.raises(ParseError, match=r"^f: not ") as e:
        getattr(ids, grammar).check(value, "f")
    assert "\n" not in str(e.value) and len(str(e.value)) < 200


def test_every_grammar_has_good_and_bad_cases() -> None:
    grammars = {
        n for n, v in vars(ids).items() if isinstance(v, ids.Grammar) and not n.startswith("_")
    }
    assert grammars == set(GOOD) == set(BAD)


def test_gce_numeric_ids_fit_uint64() -> None:
    assert ids.gce_instance_id("18446744073709551615", "f") == "18446744073709551615"
    for bad in ("18446744073709551616", "99999999999999999999", "-1", "12a", "", "1" * 21):
        with pytest.raises(ParseError, match=r"^f: not a GCE instance id"):
            ids.gce_instance_id(bad, "f")


def test_a_zone_must_be_in_its_region() -> None:
    assert ids.aws_zone("us-east-2a", "zone", "us-east-2") == "us-east-2a"
    with pytest.raises(ParseError, match="not in region"):
        ids.aws_zone("us-west-2a", "zone", "us-east-2")


def test_grammars_are_linear_on_long_hostile_input() -> None:
    # Length is checked before the pattern, so no pattern ever sees a long string.
    for grammar in (v for v in vars(ids).values() if isinstance(v, ids.Grammar)):
        assert not grammar.matches("a" * 10_000 + "!")


# --- per parser: one identifier replaced in a real payload -----------------------------------


def fixture(*parts: str) -> Any:
    return json.loads(FIXTURES.joinpath(*parts).read_text())


def parse(source: str, payload: Any) -> Any:
    raw = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    return PARSERS[source](raw, received_at=RECEIVED, windows=Windows())


def _set(path: tuple[str | int, ...], value: Any) -> Callable[[Any], Any]:
    def edit(doc: Any) -> Any:
        doc = copy.deepcopy(doc)
        node = doc
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
        return doc

    return edit


def _imds_envelope() -> dict[str, Any]:
    return {
        "instance_id": "i-1234567890abcdef0",
        "path": "spot/instance-action",
        "body": json.dumps(fixture("aws", "imds-spot-instance-action.json")),
        "zone": "us-east-2a",
        "region": "us-east-2",
        "node_name": "ip-10-0-0-1.us-east-2.compute.internal",
        "instance_type": "p5.48xlarge",
    }


def _pubsub(entry: dict[str, Any]) -> dict[str, Any]:
    return {"message": {"data": base64.b64encode(json.dumps(entry).encode()).decode()}}


SPOT = ("aws", "eventbridge-spot-interruption-warning.json")
LIFECYCLE = ("aws", "eventbridge-asg-terminate-lifecycle-action.json")
DIRECT = ("aws", "asg-terminate-lifecycle-direct-sqs.json")
HEALTH = ("aws", "eventbridge-health-scheduled-change.json")
PREEMPTED = ("gcp", "preempted-logentry.json")
WORKLOAD = ("kueue", "workload-v1beta2-reclaim-preempted-t0-evicted.json")
RN = "projects/example-project/zones/us-central1-a/instances/"

CASES: list[tuple[str, Callable[[], Any], Callable[[Any], Any], str]] = [
    (
        "sqs",
        lambda: fixture(*SPOT),
        _set(("detail", "instance-id"), "i-../x"),
        "detail.instance-id",
    ),
    ("sqs", lambda: fixture(*SPOT), _set(("region",), "us east"), "region"),
    ("sqs", lambda: fixture(*SPOT), _set(("account",), "12"), "account"),
    ("sqs", lambda: fixture(*LIFECYCLE), _set(("detail", "EC2InstanceId"), "x"), "EC2InstanceId"),
    ("sqs", lambda: fixture(*LIFECYCLE), _set(("detail", "LifecycleHookName"), "a b"), "Hook"),
    ("sqs", lambda: fixture(*LIFECYCLE), _set(("detail", "LifecycleActionToken"), "t"), "Token"),
    ("sqs", lambda: fixture(*DIRECT), _set(("AutoScalingGroupName",), "a\nb"), "GroupName"),
    ("sqs", lambda: fixture(*DIRECT), _set(("AccountId",), "acct"), "AccountId"),
    (
        "sqs",
        lambda: fixture(*HEALTH),
        _set(("detail", "affectedEntities", 0, "entityValue"), "i-zz"),
        "entityValue",
    ),
    ("imds", _imds_envelope, _set(("instance_id",), "i-0abc"), "instance_id"),
    ("imds", _imds_envelope, _set(("zone",), "us-west-2a"), "zone"),
    ("imds", _imds_envelope, _set(("region",), "mars"), "region"),
    ("imds", _imds_envelope, _set(("node_name",), "Node_1"), "node_name"),
    ("imds", _imds_envelope, _set(("instance_type",), "big"), "instance_type"),
    (
        "pubsub",
        lambda: fixture(*PREEMPTED),
        _set(("protoPayload", "resourceName"), RN + "Bad_Name"),
        "instance",
    ),
    (
        "pubsub",
        lambda: fixture(*PREEMPTED),
        _set(("protoPayload", "resourceName"), RN.replace("example-project", "ab") + "vm"),
        "project",
    ),
    (
        "pubsub",
        lambda: _pubsub(fixture(*PREEMPTED)),
        lambda d: _pubsub(
            _set(("resource", "labels", "instance_id"), "99999999999999999999")(fixture(*PREEMPTED))
        ),
        "instance_id",
    ),
    ("kueue", lambda: fixture(*WORKLOAD), _set(("metadata", "name"), "Bad..Name"), "name"),
    ("kueue", lambda: fixture(*WORKLOAD), _set(("metadata", "namespace"), "a.b"), "namespace"),
    ("kueue", lambda: fixture(*WORKLOAD), _set(("metadata", "uid"), "u i d"), "uid"),
    ("kueue", lambda: fixture(*WORKLOAD), _set(("spec", "queueName"), "../q"), "queueName"),
    (
        "kueue",
        lambda: fixture(*WORKLOAD),
        _set(("status", "admission", "clusterQueue"), "CQ"),
        "clusterQueue",
    ),
]


def _cloudevent(target: dict[str, Any]) -> dict[str, Any]:
    return {
        "specversion": "1.0",
        "id": "e-1",
        "source": "//drills/us-east-2",
        "type": "io.reclaimd.notice.spot_interruption.v1",
        "time": "2025-09-16T11:59:00Z",
        "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        "data": {"target": target},
    }


GOOD_TARGET = {
    "node_name": "ip-10-0-0-1",
    "instance_id": "i-0abc1234",
    "provider_id": "aws:///us-east-2a/i-0abc1234",
    "workload": {"namespace": "team-b", "name": "train-b", "uid": "u-1"},
}
for key, value, field in [
    ("node_name", "../../etc", "node_name"),
    ("instance_id", "i_0abc", "instance_id"),
    ("provider_id", "aws:///../i-0abc1234", "provider_id"),
    ("workload", {"namespace": "Team", "name": "x"}, "namespace"),
    ("workload", {"namespace": "t", "name": "x?y"}, "name"),
]:
    CASES.append(
        (
            "kafka_notices",
            lambda: _cloudevent(dict(GOOD_TARGET)),
            _set(("data", "target", key), value),
            field,
        )
    )
CASES.append(
    ("kafka_notices", lambda: _cloudevent(dict(GOOD_TARGET)), _set(("source",), "a b"), "source")
)
CASES.append(
    (
        "kafka_notices",
        lambda: _cloudevent(dict(GOOD_TARGET)),
        _set(("traceparent",), "x"),
        "traceparent",
    )
)
for key, value in [("instance", "1-vm"), ("zone", "us-central1"), ("project", "p")]:
    CASES.append(
        (
            "gce_metadata",
            lambda: {
                "instance": "gke-train-cluster-spot-a100-5b909138-nr65",
                "project": "example-project",
                "zone": "us-central1-a",
                "path": "instance/preempted",
                "value": "TRUE",
            },
            _set((key,), value),
            key,
        )
    )


@pytest.mark.parametrize(("source", "good", "edit", "field"), CASES)
def test_a_bad_identifier_in_a_real_payload_is_a_parse_error(
    source: str, good: Callable[[], Any], edit: Callable[[Any], Any], field: str
) -> None:
    outcome = parse(source, good())
    assert isinstance(outcome, tuple) and outcome, "the unedited payload must be a notice"
    with pytest.raises(ParseError, match=field) as e:
        parse(source, edit(good()))
    assert "\n" not in str(e.value)


def test_a_notice_issued_in_the_future_is_a_parse_error() -> None:
    # A far-future issue time would hold a claim (and a graceful stop) until then.
    spot = _set(("time",), "2999-12-31T23:59:59Z")(fixture(*SPOT))
    with pytest.raises(ParseError, match="time: issued in the future"):
        parse("sqs", spot)
    workload = fixture(*WORKLOAD)
    for condition in workload["status"]["conditions"]:
        condition["lastTransitionTime"] = "2999-01-01T00:00:00Z"
    with pytest.raises(ParseError, match="lastTransitionTime: issued in the future"):
        parse("kueue", workload)
    # Within a day of receipt is clock skew (or a replayed sample), not the future.
    assert isinstance(parse("sqs", _set(("time",), "2025-09-16T20:00:00Z")(fixture(*SPOT))), tuple)
