"""ASG lifecycle hooks: what an ``EC2_INSTANCE_TERMINATING`` notice needs around its drain.

An Auto Scaling group with a termination lifecycle hook keeps the instance in
``Terminating:Wait`` until the hook's action is completed or its heartbeat timeout passes (up
to an hour by default, billed). So, for a notice the EC2 parser made from a lifecycle action
(it keeps the group, hook name and token in the notice's attributes):

- ``holding(notice)``: while the drain runs, ``RecordLifecycleActionHeartbeat`` at once and
  every ``heartbeat_s``, so a long checkpoint does not run into the hook's timeout;
- ``finished(notice, drained)``: ``CompleteLifecycleAction`` once, ``CONTINUE`` when the
  gangs are drained (other hooks still run), ``ABANDON`` when the runbook gave up on them
  (the instance goes either way; ABANDON tells the other hooks this one failed).

A notice without lifecycle attributes is a no-op. Errors are logged and counted, never raised
into the runbook. "No active lifecycle action" means it was completed already (by a peer, by
us before a crash, or it timed out): it counts as done, so a resumed notice completes once.
boto3 blocks: every call runs in a thread (``asyncio.to_thread``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from reclaimd import logs
from reclaimd.handlers.sqs.parser import AsgLifecycleFacts
from reclaimd.handlers.sqs.settings import SqsSettings
from reclaimd.model import Notice, Placement

log = logging.getLogger(__name__)

TERMINATING = "autoscaling:EC2_INSTANCE_TERMINATING"
HEARTBEAT_S = 60.0  # well inside the shortest useful hook timeout (30 s is the API's minimum)
CONTINUE, ABANDON = "CONTINUE", "ABANDON"


@dataclass(frozen=True)
class LifecycleAction:
    """The four names ``CompleteLifecycleAction`` and the heartbeat take, and where."""

    group: str
    hook: str
    token: str
    instance_id: str
    region: str = ""

    @classmethod
    def of(cls, notice: Notice) -> LifecycleAction | None:
        """The action a notice carries; None for every other notice."""
        action = AsgLifecycleFacts.of(notice)
        if action.lifecycle_transition != TERMINATING:
            return None
        group, hook = action.asg_name, action.lifecycle_hook_name
        token = action.lifecycle_action_token
        if not (group and hook and token and notice.target.instance_id):
            return None
        return cls(group, hook, token, notice.target.instance_id, Placement.of(notice).region)

    def params(self) -> dict[str, str]:
        return {
            "AutoScalingGroupName": self.group,
            "LifecycleHookName": self.hook,
            "LifecycleActionToken": self.token,
            "InstanceId": self.instance_id,
        }


@dataclass
class LifecycleCounters:
    heartbeats: int = 0
    completed: int = 0
    already_done: int = 0  # completed elsewhere, or timed out, before we did
    errors: int = 0


def _no_active_action(e: Exception) -> bool:
    """AWS answers ValidationError "No active Lifecycle Action found ..." for a finished one."""
    response = getattr(e, "response", None)
    if not isinstance(response, dict):
        return False
    error = response.get("Error") or {}
    return bool(
        error.get("Code") == "ValidationError"
        and "no active lifecycle action" in str(error.get("Message", "")).lower()
    )


class AsgLifecycle:
    """The SQS source's after-drain part (``reclaimd.afterdrain.AfterDrain``)."""

    def __init__(
        self,
        client_for: Callable[[str], Any],
        *,
        region: str = "us-east-1",
        heartbeat_s: float = HEARTBEAT_S,
    ) -> None:
        """``client_for(region)`` builds a boto3 ``autoscaling`` client (called in a thread,
        once per region)."""
        self._client_for, self.region, self.heartbeat_s = client_for, region, heartbeat_s
        self.counters = LifecycleCounters()
        self._clients: dict[str, Any] = {}
        self._clients_lock = threading.Lock()
        self._done: set[str] = set()  # tokens completed (or found completed)
        self._completing: set[str] = set()

    # --- the AfterDrain protocol ----------------------------------------------------------

    @contextlib.asynccontextmanager
    async def holding(self, notice: Notice) -> AsyncIterator[None]:
        action = LifecycleAction.of(notice)
        if action is None or action.token in self._done:
            yield
            return
        beating = asyncio.create_task(self._heartbeats(action), name=f"asg-heartbeat-{action}")
        try:
            yield
        finally:
            beating.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beating

    async def finished(self, notice: Notice, drained: bool) -> None:
        action = LifecycleAction.of(notice)
        if action is None or action.token in self._done or action.token in self._completing:
            return
        result = CONTINUE if drained else ABANDON
        self._completing.add(action.token)
        try:
            if await self._call(action, "complete_lifecycle_action", LifecycleActionResult=result):
                self.counters.completed += 1
                logs.event(
                    log,
                    "lifecycle action completed",
                    notice_id=notice.id,
                    group=action.group,
                    hook=action.hook,
                    instance_id=action.instance_id,
                    result=result,
                )
        finally:
            self._completing.discard(action.token)

    # --- the calls ------------------------------------------------------------------------

    async def _heartbeats(self, action: LifecycleAction) -> None:
        while action.token not in self._done:
            if await self._call(action, "record_lifecycle_action_heartbeat"):
                self.counters.heartbeats += 1
            await asyncio.sleep(self.heartbeat_s)

    async def _call(self, action: LifecycleAction, op: str, **extra: str) -> bool:
        """One call in a thread; True when it succeeded. Never raises (but cancellation)."""
        try:
            client = await asyncio.to_thread(self.client, action.region or self.region)
            await asyncio.to_thread(getattr(client, op), **action.params(), **extra)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            if _no_active_action(e):
                self.counters.already_done += 1
                self._done.add(action.token)
                logs.event(log, "lifecycle action already finished", op=op, group=action.group)
                return False
            self.counters.errors += 1
            logs.event(
                log,
                "lifecycle call failed",
                logging.WARNING,
                op=op,
                group=action.group,
                instance_id=action.instance_id,
                error=f"{type(e).__name__}: {e}"[:200],
            )
            return False
        if op == "complete_lifecycle_action":
            self._done.add(action.token)
        return True

    def client(self, region: str) -> Any:
        """The region's client, built once (blocks: call it in a thread)."""
        with self._clients_lock:  # boto3 client creation is not thread-safe
            if region not in self._clients:
                self._clients[region] = self._client_for(region)
            return self._clients[region]


# --- built by the registry (reclaimd.handlers.build), for an enabled source ----------------


def after_drain(s: SqsSettings) -> AsgLifecycle:
    """Lifecycle actions arrive through the SQS queue; the same endpoint serves Auto Scaling
    (a VPC endpoint, moto)."""
    import boto3
    from botocore.config import Config

    retries = Config(retries={"mode": "standard", "max_attempts": 3})

    def client_for(region: str) -> Any:
        return boto3.client(
            "autoscaling", region_name=region, endpoint_url=s.endpoint_url, config=retries
        )

    return AsgLifecycle(client_for, region=s.region)
