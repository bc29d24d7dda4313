"""The metadata servers as ``make bench-fuzz`` serves them: EC2 IMDS, the GCE metadata server
and Azure Scheduled Events on one aiohttp app, each answering hostile bodies
(``chaos.bench.hostile``) while its budget lasts and the real notices it is handed in between,
counting both. The drills' stand-ins (``chaos.standins.azure``, ``chaos.standins.gce``) serve
the real protocol; the Azure event shape is theirs (``azure.preempt_document``)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from chaos.bench import hostile


@dataclass
class Tally:
    hostile: int = 0
    real: int = 0
    refused: int = 0  # writes the transport itself refused (the apiserver's schema, SQS limits)


@dataclass
class ScheduledEvents:
    """What the Azure route answers ``GET /metadata/scheduledevents``, one document per GET.

    The poller hands a document over only when its version (``DocumentIncarnation``, else its
    digest: ``reclaimd.handlers.azure_scheduled.transport.version_of``) differs from the last one it
    read, so every answer's version differs from the one before: each hostile answer is a
    message the daemon must count. In turn: the real document while ``real`` is set (counted
    once, as one message, however often it is read), a hostile one while ``budget`` lasts,
    else a document with no events (an idle IMDS's, counted as neither)."""

    rng: random.Random = field(default_factory=random.Random)
    tally: Tally = field(default_factory=Tally)
    budget: int = 0  # hostile answers left to give
    real: str = ""  # the real document, served on every GET while set
    real_reads: int = 0  # GETs answered with it
    incarnation: int = 1  # the last DocumentIncarnation given out
    last: str = ""  # the version of the last answer
    idle: str = ""
    approvals: int = 0  # StartRequests POSTed (the daemon approving the drained event)

    def next_incarnation(self) -> int:
        self.incarnation += 1
        return self.incarnation

    def answer(self) -> str:
        from reclaimd.handlers.azure_scheduled.transport import version_of

        if self.real:
            body, version = self.real, version_of(self.real)
            self.real_reads += 1
            if version != self.last:
                self.tally.real += 1
            self.idle = ""
        elif self.budget > 0:
            body, version = self._hostile(version_of)
            self.budget -= 1
            self.tally.hostile += 1
            self.idle = ""
        else:
            if not self.idle:  # after another document: a new incarnation, read once
                self.idle = json.dumps(
                    {"DocumentIncarnation": self.next_incarnation(), "Events": []}
                )
            body, version = self.idle, version_of(self.idle)
        self.last = version
        return body

    def _hostile(self, version_of: Callable[[str], str]) -> tuple[str, str]:
        for _ in range(100):
            body = hostile.scheduled_events_body(self.rng, self.next_incarnation())
            version = version_of(body)
            if version != self.last:
                return body, version
        raise RuntimeError("no hostile document of a new version in 100 draws")


@dataclass
class MetadataState:
    """What the IMDS, GCE metadata and Azure routes answer; each phase switches its own on."""

    imds_identity: dict[str, str]
    gce_identity: dict[str, str]
    rng: random.Random
    imds_budget: int = 0  # hostile answers left to give
    gce_budget: int = 0
    imds_real: list[str] = field(default_factory=list)  # real bodies to serve next, in order
    gce_real: list[tuple[str, str, str]] = field(default_factory=list)  # (path, value, etag)
    served: dict[str, Tally] = field(
        default_factory=lambda: {"imds": Tally(), "gce_metadata": Tally()}
    )
    gce_active: asyncio.Event = field(default_factory=asyncio.Event)
    etag: int = 0
    azure_compute: dict[str, Any] = field(default_factory=dict)  # /metadata/instance/compute
    azure: ScheduledEvents = field(default_factory=ScheduledEvents)

    def __post_init__(self) -> None:
        self.served["azure_scheduled"] = self.azure.tally


def metadata_app(state: MetadataState) -> Any:
    from aiohttp import web

    async def token(_request: web.Request) -> web.Response:
        return web.Response(text="fuzz-token-" + "a" * 40)

    async def imds(request: web.Request) -> web.Response:
        path = request.match_info["path"]
        if path in state.imds_identity:
            return web.Response(text=state.imds_identity[path])
        if path == "spot/instance-action" and state.imds_real:
            state.served["imds"].real += 1
            return web.Response(text=state.imds_real.pop(0))
        if state.imds_budget <= 0:
            return web.Response(status=404, text="Not Found")
        state.imds_budget -= 1
        state.served["imds"].hostile += 1
        return web.Response(text=hostile.imds_body(path, state.rng))

    async def gce(request: web.Request) -> web.Response:
        path = request.match_info["path"]
        headers = {"Metadata-Flavor": "Google"}
        if path in state.gce_identity:
            return web.Response(text=state.gce_identity[path], headers=headers)
        if path not in ("instance/preempted", "instance/maintenance-event"):
            return web.Response(status=404, headers=headers)
        hanging = request.query.get("wait_for_change") == "true"
        for pending in list(state.gce_real):
            if pending[0] == path:
                state.gce_real.remove(pending)
                state.served["gce_metadata"].real += 1
                return web.Response(text=pending[1], headers={**headers, "ETag": pending[2]})
        if state.gce_budget <= 0:
            if hanging:  # nothing changes: hold the hanging GET a while, as the server does
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(state.gce_active.wait(), timeout=1.0)
            idle = "FALSE" if path == "instance/preempted" else "NONE"
            return web.Response(text=idle, headers={**headers, "ETag": "idle"})
        state.gce_budget -= 1
        state.served["gce_metadata"].hostile += 1
        state.etag += 1
        etag = state.rng.choice([f"e{state.etag:08x}", f"e{state.etag}\u00e9", f"{state.etag}" * 9])
        etag = etag.encode("latin-1", errors="replace").decode("latin-1")
        return web.Response(
            text=hostile.metadata_value(state.rng), headers={**headers, "ETag": etag}
        )

    async def azure_events(_request: web.Request) -> web.Response:
        return web.Response(text=state.azure.answer(), content_type="application/json")

    async def azure_approve(request: web.Request) -> web.Response:
        await request.read()
        state.azure.approvals += 1
        return web.Response(status=200)

    async def compute(_request: web.Request) -> web.Response:
        return web.json_response(state.azure_compute)

    app = web.Application(client_max_size=1024**2)
    app.router.add_put("/latest/api/token", token)
    app.router.add_get("/latest/meta-data/{path:.*}", imds)
    app.router.add_get("/computeMetadata/v1/{path:.*}", gce)
    app.router.add_get("/metadata/scheduledevents", azure_events)
    app.router.add_post("/metadata/scheduledevents", azure_approve)
    app.router.add_get("/metadata/instance/compute", compute)
    return app
