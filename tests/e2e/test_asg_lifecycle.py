"""The ASG lifecycle after-drain part (handlers/sqs/lifecycle.py), with the real boto3
client, built by the SQS registry entry (handlers/sqs/__init__.py).

1. Against moto's Auto Scaling API on the stack: a launch template, a group, a termination
   hook; a lifecycle notice for one of the group's instances heartbeats while "draining" and
   completes with CONTINUE. moto 5.2.5 (the stack's, pinned in deploy/local/versions) answers
   both RecordLifecycleActionHeartbeat and CompleteLifecycleAction with HTTP 500 (not
   implemented) and models no Terminating:Wait state, so what is checked there is what reaches
   the wire (every call, its parameters, as botocore sends them to moto) and that the errors are
   counted, never raised into the runbook.
2. Against a small local server speaking the Auto Scaling query protocol for those two calls
   (it keeps the active lifecycle actions, answers ValidationError "No active Lifecycle Action
   found" as AWS does for a finished one): completion once, idempotence, a successor's repeat
   counted as already done, ABANDON for a notice the runbook gave up on.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any
from urllib.parse import parse_qs

import aiohttp.web
import boto3
import pytest
from stack import Stack

from reclaimd import handlers
from reclaimd.config import Settings
from reclaimd.handlers import running
from reclaimd.handlers.sqs.lifecycle import AsgLifecycle
from reclaimd.model import Notice, utcnow

REGION = "us-east-1"
HOOK = "reclaimd-drain"


def lifecycle_notice(group: str, instance: str, token: str, hook: str = HOOK) -> Notice:
    """The notice the EC2 parser makes of EventBridge's lifecycle action event."""
    event = {
        "version": "0",
        "id": str(uuid.uuid4()),
        "detail-type": "EC2 Instance-terminate Lifecycle Action",
        "source": "aws.autoscaling",
        "account": "123456789012",
        "time": utcnow().strftime("%Y-%m-%dT%H:%M:%SZ"),
        "region": REGION,
        "resources": [],
        "detail": {
            "LifecycleActionToken": token,
            "AutoScalingGroupName": group,
            "LifecycleHookName": hook,
            "EC2InstanceId": instance,
            "LifecycleTransition": "autoscaling:EC2_INSTANCE_TERMINATING",
            "Origin": "AutoScalingGroup",
            "Destination": "EC2",
        },
    }
    outcome = handlers.parse("ec2", json.dumps(event).encode(), received_at=utcnow())
    assert isinstance(outcome, tuple) and len(outcome) == 1
    return outcome[0]


def after_drain(endpoint: str) -> AsgLifecycle:
    settings = Settings.model_validate(
        {"sqs": {"enabled": True, "queue_url": "q", "endpoint_url": endpoint, "region": REGION}}
    )
    part = running.after_drain(settings)
    assert isinstance(part, AsgLifecycle)
    return part


def record_requests(part: AsgLifecycle) -> list[dict[str, str]]:
    """Every request the part's client puts on the wire, as its form fields."""
    sent: list[dict[str, str]] = []

    def keep(request: Any, **_: Any) -> None:
        body = request.body.decode() if isinstance(request.body, bytes) else request.body
        sent.append({k: v[0] for k, v in parse_qs(body or "").items()})

    part.client(REGION).meta.events.register("before-send.auto-scaling", keep)
    return sent


async def until(check: Callable[[], bool], timeout_s: float = 30) -> None:
    async with asyncio.timeout(timeout_s):
        while not check():  # noqa: ASYNC110 - polling counters, no event to wait on
            await asyncio.sleep(0.02)


# --- 1. moto ------------------------------------------------------------------------------


@pytest.fixture
def group(stack: Stack) -> tuple[str, str]:
    """A moto Auto Scaling group with a termination hook: (group name, one instance id)."""
    name = f"reclaimd-e2e-{uuid.uuid4().hex[:8]}"
    ec2 = boto3.client("ec2", endpoint_url=stack.aws_endpoint, region_name=REGION)
    asg = boto3.client("autoscaling", endpoint_url=stack.aws_endpoint, region_name=REGION)
    ec2.create_launch_template(
        LaunchTemplateName=name,
        LaunchTemplateData={"ImageId": "ami-12c6146b", "InstanceType": "p5.48xlarge"},
    )
    asg.create_auto_scaling_group(
        AutoScalingGroupName=name,
        LaunchTemplate={"LaunchTemplateName": name},
        MinSize=1,
        MaxSize=1,
        DesiredCapacity=1,
        AvailabilityZones=[f"{REGION}a"],
    )
    asg.put_lifecycle_hook(
        AutoScalingGroupName=name,
        LifecycleHookName=HOOK,
        LifecycleTransition="autoscaling:EC2_INSTANCE_TERMINATING",
        HeartbeatTimeout=300,
        DefaultResult="CONTINUE",
    )
    hooks = asg.describe_lifecycle_hooks(AutoScalingGroupName=name)["LifecycleHooks"]
    assert [h["LifecycleHookName"] for h in hooks] == [HOOK]
    instances = asg.describe_auto_scaling_groups(AutoScalingGroupNames=[name])[
        "AutoScalingGroups"
    ][0]["Instances"]
    return name, instances[0]["InstanceId"]


async def test_heartbeats_while_draining_then_continue_reach_moto(
    stack: Stack, group: tuple[str, str]
) -> None:
    name, instance = group
    token = str(uuid.uuid4())
    part = after_drain(stack.aws_endpoint)
    part.heartbeat_s = 0.05
    sent = await asyncio.to_thread(record_requests, part)
    notice = lifecycle_notice(name, instance, token)
    action = {
        "AutoScalingGroupName": name,
        "LifecycleHookName": HOOK,
        "LifecycleActionToken": token,
        "InstanceId": instance,
    }
    async with part.holding(notice):
        await until(lambda: part.counters.errors >= 2)  # two heartbeats answered (500)
    beats = len([r for r in sent if r["Action"] == "RecordLifecycleActionHeartbeat"])
    failed_beats = part.counters.errors
    await part.finished(notice, drained=True)

    heartbeats = [r for r in sent if r["Action"] == "RecordLifecycleActionHeartbeat"]
    completes = [r for r in sent if r["Action"] == "CompleteLifecycleAction"]
    assert len(heartbeats) == beats >= 2  # none after the drain ended
    assert all({k: r[k] for k in action} == action for r in heartbeats)
    assert completes and all(
        r == {**action, "Action": "CompleteLifecycleAction", "Version": "2011-01-01"}
        | {"LifecycleActionResult": "CONTINUE"}
        for r in completes
    )
    # moto 5.2.5 implements neither call: each is one counted error, none raised, none
    # taken for done (a resumed notice would try again).
    assert part.counters.completed == 0 and part.counters.heartbeats == 0
    assert part.counters.errors == failed_beats + 1 and part.counters.already_done == 0


# --- 2. the Auto Scaling query protocol, served locally -------------------------------------

_NS = "http://autoscaling.amazonaws.com/doc/2011-01-01/"


class FakeAutoScaling:
    """Just the two calls: active actions by token, what was completed and how."""

    def __init__(self) -> None:
        self.active: dict[str, str] = {}  # token -> instance id
        self.completed: dict[str, str] = {}  # token -> result
        self.heartbeats: list[str] = []
        self.calls: list[str] = []

    async def handle(self, request: aiohttp.web.Request) -> aiohttp.web.Response:
        form = {k: v[0] for k, v in parse_qs(await request.text()).items()}
        action, token = form["Action"], form.get("LifecycleActionToken", "")
        self.calls.append(action)
        if self.active.get(token) != form.get("InstanceId"):
            return aiohttp.web.Response(
                status=400,
                content_type="text/xml",
                text=f'<ErrorResponse xmlns="{_NS}"><Error><Type>Sender</Type>'
                "<Code>ValidationError</Code><Message>No active Lifecycle Action found with "
                f"token {token}</Message></Error><RequestId>r</RequestId></ErrorResponse>",
            )
        if action == "CompleteLifecycleAction":
            self.completed[token] = form["LifecycleActionResult"]
            del self.active[token]
        else:
            self.heartbeats.append(token)
        return aiohttp.web.Response(
            content_type="text/xml",
            text=f'<{action}Response xmlns="{_NS}"><{action}Result/>'
            f"<ResponseMetadata><RequestId>r</RequestId></ResponseMetadata></{action}Response>",
        )


@pytest.fixture
async def fake(unused_tcp_port: int) -> AsyncIterator[tuple[FakeAutoScaling, str]]:
    server = FakeAutoScaling()
    app = aiohttp.web.Application()
    app.router.add_post("/", server.handle)
    runner = aiohttp.web.AppRunner(app)
    await runner.setup()
    site = aiohttp.web.TCPSite(runner, "127.0.0.1", unused_tcp_port)
    await site.start()
    try:
        yield server, f"http://127.0.0.1:{unused_tcp_port}"
    finally:
        await runner.cleanup()


INSTANCE = "i-0123456789abcdef0"


async def test_a_drained_notice_completes_its_action_once(
    fake: tuple[FakeAutoScaling, str],
) -> None:
    server, url = fake
    token = str(uuid.uuid4())
    server.active[token] = INSTANCE
    part = after_drain(url)
    part.heartbeat_s = 0.05
    notice = lifecycle_notice("gpu-asg", INSTANCE, token)
    async with part.holding(notice):
        await until(lambda: len(server.heartbeats) >= 2)
    await part.finished(notice, drained=True)
    assert server.completed == {token: "CONTINUE"}
    assert part.counters.completed == 1 and part.counters.errors == 0
    assert part.counters.heartbeats == len(server.heartbeats) >= 2
    calls = len(server.calls)
    await part.finished(notice, drained=True)  # the runbook's retry, or a second gang
    async with part.holding(notice):
        pass
    assert len(server.calls) == calls  # nothing more sent for a completed action


async def test_a_successors_repeat_counts_as_done(fake: tuple[FakeAutoScaling, str]) -> None:
    server, url = fake
    token = str(uuid.uuid4())
    server.active[token] = INSTANCE
    notice = lifecycle_notice("gpu-asg", INSTANCE, token)
    await after_drain(url).finished(notice, drained=True)
    successor = after_drain(url)  # the notice resumed by a peer after a crash
    await successor.finished(notice, drained=True)
    assert server.completed == {token: "CONTINUE"}
    assert successor.counters.already_done == 1 and successor.counters.errors == 0


async def test_a_notice_the_runbook_gave_up_on_is_abandoned(
    fake: tuple[FakeAutoScaling, str],
) -> None:
    server, url = fake
    token = str(uuid.uuid4())
    server.active[token] = INSTANCE
    part = after_drain(url)
    await part.finished(lifecycle_notice("gpu-asg", INSTANCE, token), drained=False)
    assert server.completed == {token: "ABANDON"}


async def test_an_unreachable_endpoint_is_counted_never_raised(unused_tcp_port: int) -> None:
    part = after_drain(f"http://127.0.0.1:{unused_tcp_port}")
    part.heartbeat_s = 0.05
    notice = lifecycle_notice("gpu-asg", INSTANCE, str(uuid.uuid4()))
    async with part.holding(notice):
        await until(lambda: part.counters.errors >= 1)
    await part.finished(notice, drained=True)
    assert part.counters.completed == 0 and part.counters.errors >= 2
