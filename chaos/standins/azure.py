"""A stand-in for the Azure Instance Metadata Service: Scheduled Events and the compute metadata.

No emulator of IMDS exists, so the tests and drills use this small aiohttp server. It follows
Microsoft's "Scheduled Events for Linux VMs" (api-version 2020-07-01) and "Azure Instance
Metadata Service" pages:

- every request needs the header ``Metadata: true``; without it, or with ``X-Forwarded-For``
  (a proxied request), the answer is 400, as IMDS answers; an ``api-version`` the endpoint
  does not know (or none) is 400 with the ``newest-versions`` it does;
- ``GET /metadata/scheduledevents`` returns ``{"DocumentIncarnation", "Events": [...]}``; the
  incarnation grows by one whenever the events change;
- ``POST /metadata/scheduledevents`` with ``{"StartRequests": [{"EventId": ...}]}`` approves:
  a ``Scheduled`` event turns ``Started`` (``NotBefore`` blank), then, ``started_s`` later,
  leaves the document (its terminal state: no ``Completed`` status exists). A malformed body
  is 400; an id that is well formed but unknown or already started is 200, as the docs say
  for an event another VM approved;
- a ``Scheduled`` event nobody approves starts by itself at its ``NotBefore``;
- ``GET /metadata/instance/compute`` returns this VM's compute metadata (``name``,
  ``resourceId``, ``vmSize``, ``priority``, ...), and ``/metadata/instance`` wraps it.

Injecting: in process, ``server.schedule("Preempt", not_before_s=30)`` (default resource: this
VM) or ``server.preempt()``; ``server.cancel(event_id)`` removes an event unstarted, as Azure
rarely does. Standalone (``python -m chaos.standins.azure``), ``POST /chaos/v1/events``
with ``{"EventType", "Resources"?, "NotBeforeSeconds"?, "EventSource"?, "Description"?,
"DurationInSeconds"?}`` answers ``{"EventId"}``, ``DELETE /chaos/v1/events/<id>`` cancels and
``GET /chaos/v1/approvals`` lists the ids approved. ``on_start`` (in process) is awaited with
each event as it starts: a drill deletes the node there.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any, Protocol

from aiohttp import web

EVENTS_PATH = "/metadata/scheduledevents"
COMPUTE_PATH = "/metadata/instance/compute"
INSTANCE_PATH = "/metadata/instance"
CONTROL = "/chaos/v1/"
# The versions each endpoint serves (from the docs' version tables); the newest last.
EVENT_VERSIONS = (
    "2017-08-01",
    "2017-11-01",
    "2019-01-01",
    "2019-04-01",
    "2019-08-01",
    "2020-07-01",
)
INSTANCE_VERSIONS = ("2019-03-11", "2020-09-01", "2020-12-01", "2021-01-01", "2021-02-01")
EVENT_TYPES = ("Freeze", "Reboot", "Redeploy", "Preempt", "Terminate")
# Minimum notice per type (the docs' "Event scheduling" table); Terminate: 5 min, its floor.
MIN_NOTICE_S = {"Freeze": 900, "Reboot": 900, "Redeploy": 600, "Preempt": 30, "Terminate": 300}

OnStart = Callable[[dict[str, Any]], Awaitable[None]]


@dataclass(frozen=True)
class Compute:
    """The VM the stand-in runs on; the defaults are an AKS Spot GPU pool instance."""

    subscription: str = "8d1a5e3c-0f1b-4c2a-9e7d-2b6f4a1c9e00"
    resource_group: str = "MC_gpu-rg_train-aks_eastus"
    scale_set: str = "aks-spotgpu-12345678-vmss"  # "" for a standalone VM named ``vm``
    instance: str = "3"
    vm: str = ""
    vm_size: str = "Standard_ND96isr_H100_v5"
    priority: str = "Spot"
    location: str = "eastus"
    zone: str = "1"

    @property
    def name(self) -> str:
        return f"{self.scale_set}_{self.instance}" if self.scale_set else self.vm

    @property
    def resource_id(self) -> str:
        head = f"/subscriptions/{self.subscription}/resourceGroups/{self.resource_group}"
        tail = (
            f"virtualMachineScaleSets/{self.scale_set}/virtualMachines/{self.instance}"
            if self.scale_set
            else f"virtualMachines/{self.vm}"
        )
        return f"{head}/providers/Microsoft.Compute/{tail}"

    @property
    def computer_name(self) -> str:
        """AKS's node name: the scale set's prefix + the instance id in base 36, 6 wide."""
        if not self.scale_set:
            return self.vm
        n, digits = int(self.instance), ""
        while True:
            n, r = divmod(n, 36)
            digits = "0123456789abcdefghijklmnopqrstuvwxyz"[r] + digits
            if not n:
                break
        return self.scale_set + digits.rjust(6, "0")

    def to_json(self) -> dict[str, Any]:
        return {
            "azEnvironment": "AzurePublicCloud",
            "evictionPolicy": "Delete" if self.priority == "Spot" else "",
            "location": self.location,
            "name": self.name,
            "osProfile": {"adminUsername": "azureuser", "computerName": self.computer_name},
            "osType": "Linux",
            "priority": self.priority,
            "resourceGroupName": self.resource_group,
            "resourceId": self.resource_id,
            "subscriptionId": self.subscription,
            "vmScaleSetName": self.scale_set,
            "vmSize": self.vm_size,
            "zone": self.zone,
        }


class AzureNode(Protocol):
    """What ``compute_of`` reads of a node (``fleet.NodeSpec``, ``scenario.PlannedNode``)."""

    @property
    def instance_id(self) -> str: ...  # the VM name, ``<scale set>_<n>``
    @property
    def zone(self) -> str: ...  # ``<region>-<n>``, as AKS labels a node
    @property
    def sku(self) -> str: ...
    @property
    def purchase_option(self) -> str: ...
    @property
    def project(self) -> str: ...  # names the resource group


def compute_of(node: AzureNode) -> Compute:
    """The AKS instance a fleet's Azure node is (``fleet.NodeSpec.provider_id`` names the same):
    its scale set and instance from its VM name, its region and zone from ``<region>-<n>``."""
    from chaos import fleet

    scale_set, instance = node.instance_id.rsplit("_", 1)
    location, _, zone = node.zone.rpartition("-")
    return Compute(
        subscription=fleet.AZURE_SUBSCRIPTION,
        resource_group=fleet.azure_resource_group(node.project),
        scale_set=scale_set,
        instance=instance,
        vm_size=node.sku,
        priority="Spot" if node.purchase_option == "spot" else "Regular",
        location=location if location and zone.isdigit() else node.zone.replace("-", ""),
        zone=zone if location and zone.isdigit() else "",
    )


def rfc1123(t: datetime) -> str:
    """``Mon, 19 Sep 2016 18:29:47 GMT``, the docs' ``NotBefore`` form."""
    return format_datetime(t.astimezone(UTC).replace(microsecond=0), usegmt=True)


def scheduled_event(
    event_type: str,
    resources: list[str],
    not_before_s: float,
    *,
    source: str = "Platform",
    description: str = "",
    duration_s: int = -1,
) -> dict[str, Any]:
    """One ``Scheduled`` event as IMDS lists it, ``not_before_s`` from now, with a new EventId."""
    return {
        "EventId": str(uuid.uuid4()).upper(),
        "EventStatus": "Scheduled",
        "EventType": event_type,
        "ResourceType": "VirtualMachine",
        "Resources": resources,
        "NotBefore": rfc1123(datetime.now(UTC) + timedelta(seconds=not_before_s)),
        "Description": description,
        "EventSource": source,
        "DurationInSeconds": duration_s,
    }


def preempt_document(vm_name: str, incarnation: int, not_before_s: float) -> str:
    """A Scheduled Events document holding one Spot eviction of ``vm_name``, as IMDS sends it
    (what ``make bench-fuzz`` hands its metadata route as the real notice)."""
    event = scheduled_event("Preempt", [vm_name], not_before_s)
    return json.dumps({"DocumentIncarnation": incarnation, "Events": [event]})


class AzureMetadataServer:
    def __init__(
        self,
        compute: Compute | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        started_s: float = 1.0,
        on_start: OnStart | None = None,
    ) -> None:
        self.compute = compute or Compute()
        self.host, self.port = host, port
        self.started_s, self.on_start = started_s, on_start
        self.incarnation = 1
        self._events: dict[str, dict[str, Any]] = {}
        self._timers: dict[str, asyncio.Task[None]] = {}
        self._runner: web.AppRunner | None = None
        self.approvals: list[str] = []  # EventIds POSTed, in order (known or not)
        self.requests: list[tuple[str, str]] = []  # (method, path) as received

    # --- state ------------------------------------------------------------------------------

    def document(self) -> dict[str, Any]:
        return {"DocumentIncarnation": self.incarnation, "Events": list(self._events.values())}

    def event(self, event_id: str) -> dict[str, Any] | None:
        return self._events.get(event_id)

    def schedule(
        self,
        event_type: str,
        *,
        resources: list[str] | None = None,
        not_before_s: float | None = None,
        source: str = "Platform",
        description: str = "",
        duration_s: int = -1,
    ) -> str:
        """Add a ``Scheduled`` event (default: for this VM, the type's minimum notice)."""
        if event_type not in EVENT_TYPES:
            raise ValueError(f"EventType {event_type!r} is not one of {EVENT_TYPES}")
        delay = MIN_NOTICE_S[event_type] if not_before_s is None else not_before_s
        event = scheduled_event(
            event_type,
            list(resources or [self.compute.name]),
            delay,
            source=source,
            description=description,
            duration_s=duration_s,
        )
        event_id = str(event["EventId"])
        self._events[event_id] = event
        self.incarnation += 1
        self._later(event_id, delay, self._start)
        return event_id

    def preempt(self, not_before_s: float = 30.0) -> str:
        """A Spot eviction of this VM, ``not_before_s`` ahead (Azure gives at least 30 s)."""
        return self.schedule("Preempt", not_before_s=not_before_s)

    def cancel(self, event_id: str) -> bool:
        """Remove an event before it starts (Azure found the operation too risky)."""
        if self._events.get(event_id, {}).get("EventStatus") != "Scheduled":
            return False
        self._remove(event_id)
        return True

    def _later(self, event_id: str, delay_s: float, step: Callable[[str], Awaitable[None]]) -> None:
        async def run() -> None:
            await asyncio.sleep(max(0.0, delay_s))
            await step(event_id)

        old = self._timers.pop(event_id, None)
        if old is not None and old is not asyncio.current_task():
            old.cancel()
        self._timers[event_id] = asyncio.get_running_loop().create_task(run())

    async def _start(self, event_id: str) -> None:
        event = self._events.get(event_id)
        if event is None or event["EventStatus"] != "Scheduled":
            return
        event.update(EventStatus="Started", NotBefore="")
        self.incarnation += 1
        self._later(event_id, self.started_s, self._finish)
        if self.on_start is not None:
            await self.on_start(dict(event))

    async def _finish(self, event_id: str) -> None:
        self._remove(event_id)

    def _remove(self, event_id: str) -> None:
        if self._events.pop(event_id, None) is not None:
            self.incarnation += 1
        timer = self._timers.pop(event_id, None)
        if timer is not None and timer is not asyncio.current_task():
            timer.cancel()

    # --- HTTP -------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self) -> str:
        app = web.Application()
        app.router.add_get(EVENTS_PATH, self._get_events)
        app.router.add_post(EVENTS_PATH, self._post_events)
        app.router.add_get(COMPUTE_PATH, self._get_compute)
        app.router.add_get(INSTANCE_PATH, self._get_instance)
        app.router.add_post(CONTROL + "events", self._control_schedule)
        app.router.add_delete(CONTROL + "events/{event_id}", self._control_cancel)
        app.router.add_get(CONTROL + "approvals", self._control_approvals)
        self._runner = web.AppRunner(app, handle_signals=False)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.host, self.port).start()
        self.port = self._runner.addresses[0][1]  # the port the OS picked for port=0
        return self.url

    async def stop(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        for timer in list(self._timers.values()):
            with contextlib.suppress(asyncio.CancelledError):
                await timer
        self._timers.clear()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> AzureMetadataServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def _refused(self, request: web.Request, versions: tuple[str, ...]) -> web.Response | None:
        """IMDS's 400s: the Metadata header, a proxied request, the api-version."""
        self.requests.append((request.method, request.path))
        if request.headers.get("Metadata", "").lower() != "true":
            return _error("Bad request. Required metadata header not specified")
        if "X-Forwarded-For" in request.headers:
            return _error("Bad request. Requests with X-Forwarded-For header are not allowed")
        if request.query.get("api-version") not in versions:
            return web.json_response(
                {
                    "error": "Bad request. api-version is invalid or was not specified in the "
                    "request. For more information refer to aka.ms/azureimds",
                    "newest-versions": list(reversed(versions[-3:])),
                },
                status=400,
            )
        return None

    async def _get_events(self, request: web.Request) -> web.Response:
        refused = self._refused(request, EVENT_VERSIONS)
        return refused or web.json_response(self.document())

    async def _post_events(self, request: web.Request) -> web.Response:
        refused = self._refused(request, EVENT_VERSIONS)
        if refused is not None:
            return refused
        ids = _start_requests(await request.text())
        if ids is None:
            return _error("Bad request. The payload is malformed")
        for event_id in ids:
            self.approvals.append(event_id)
            # A Scheduled event starts; a started or unknown one is a no-op, still a 200.
            await self._start(event_id)
        return web.Response(status=200)

    async def _get_compute(self, request: web.Request) -> web.Response:
        refused = self._refused(request, INSTANCE_VERSIONS)
        return refused or web.json_response(self.compute.to_json())

    async def _get_instance(self, request: web.Request) -> web.Response:
        refused = self._refused(request, INSTANCE_VERSIONS)
        return refused or web.json_response({"compute": self.compute.to_json(), "network": {}})

    async def _control_schedule(self, request: web.Request) -> web.Response:
        try:
            spec = json.loads(await request.text())
            event_id = self.schedule(
                spec["EventType"],
                resources=spec.get("Resources"),
                not_before_s=spec.get("NotBeforeSeconds"),
                source=spec.get("EventSource", "Platform"),
                description=spec.get("Description", ""),
                duration_s=int(spec.get("DurationInSeconds", -1)),
            )
        except (ValueError, KeyError, TypeError) as e:
            return _error(f"bad event: {e}")
        return web.json_response({"EventId": event_id})

    async def _control_cancel(self, request: web.Request) -> web.Response:
        return web.json_response({"canceled": self.cancel(request.match_info["event_id"])})

    async def _control_approvals(self, request: web.Request) -> web.Response:
        return web.json_response({"approvals": self.approvals})


def _error(message: str) -> web.Response:
    return web.json_response({"error": message}, status=400)


def _start_requests(body: str) -> list[str] | None:
    """The EventIds of a ``{"StartRequests": [{"EventId": ...}]}`` body; None if malformed."""
    try:
        data = json.loads(body)
    except ValueError:
        return None
    requests = data.get("StartRequests") if isinstance(data, dict) else None
    if not isinstance(requests, list) or not requests:
        return None
    ids = [r.get("EventId") if isinstance(r, dict) else None for r in requests]
    if not all(isinstance(i, str) and i for i in ids):
        return None
    return [str(i) for i in ids]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="Azure IMDS stand-in: Scheduled Events (tests, drills)")
    p.add_argument("--scale-set", default=Compute.scale_set)
    p.add_argument("--instance", default=Compute.instance)
    p.add_argument("--vm", default="", help="a standalone VM's name (with --scale-set '')")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--started-s", type=float, default=1.0)
    args = p.parse_args(argv)

    async def serve() -> None:
        compute = Compute(scale_set=args.scale_set, instance=args.instance, vm=args.vm)
        server = AzureMetadataServer(
            compute, host=args.host, port=args.port, started_s=args.started_s
        )
        print(await server.start(), flush=True)
        try:
            await asyncio.Event().wait()
        finally:
            await server.stop()

    asyncio.run(serve())


if __name__ == "__main__":
    main()
