"""A stand-in for the GCE metadata server: the few keys reclaimd reads, with its semantics.

No emulator of the metadata server exists, so the tests and drills use this small aiohttp
server. It implements what the per-node watcher depends on, as the Compute Engine docs
describe it:

- ``GET /computeMetadata/v1/<key>`` returns the plain-text value with the response headers
  ``Metadata-Flavor: Google`` and ``ETag``; a request without ``Metadata-Flavor: Google``, or
  with ``X-Forwarded-For`` (a proxied request), is refused with 403; an unknown key is 404.
- ``?wait_for_change=true`` hangs until the value changes. With ``last_etag=E`` it returns at
  once when the current ETag is not ``E`` (the caller missed a change), else it hangs; without
  ``last_etag`` it waits for the next change. ``timeout_sec=N`` (a positive integer, else 400)
  ends the wait after N seconds with the current, unchanged value and ETag.
- An ETag names one version of one value: setting a key again (even to an earlier value)
  gives a new ETag, as a second preemption of a recreated VM would.

Keys served: ``instance/{name,hostname,id,zone,preempted,maintenance-event}``,
``instance/scheduling/{preemptible,on-host-maintenance}``,
``project/{project-id,numeric-project-id}``. ``instance/zone`` is
``projects/<number>/zones/<zone>``, as on GCE.

Injecting: in process, ``server.set("instance/preempted", "TRUE")``; standalone
(``python -m chaos.standins.gce --instance N --zone Z --project P``), a
``PUT /chaos/v1/<key>`` with the value as body. ``flavor_header=False`` makes it answer
without the ``Metadata-Flavor`` header, to test that a client refuses such a response.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import itertools
from typing import Any

from aiohttp import web

PREFIX = "/computeMetadata/v1/"
CONTROL = "/chaos/v1/"
FLAVOR = "Metadata-Flavor"
MAX_WAIT_S = 3600.0  # a hanging GET without timeout_sec ends after this, unchanged


class GceMetadataServer:
    def __init__(
        self,
        *,
        project: str,
        zone: str,
        instance: str,
        project_number: str = "123456789012",
        instance_id: str = "1844488190123456789",
        host: str = "127.0.0.1",
        port: int = 0,
        flavor_header: bool = True,
    ) -> None:
        self.host, self.port = host, port
        self.flavor_header = flavor_header
        self._values: dict[str, str] = {}
        self._etags: dict[str, str] = {}
        self._versions = itertools.count(1)
        self._changed = asyncio.Condition()
        self._closing = False
        self._runner: web.AppRunner | None = None
        self.waiting = 0  # hanging GETs in progress: lets a test flip a key while watched
        self.requests: list[tuple[str, dict[str, str]]] = []  # (key, query) as received
        for key, value in {
            "instance/name": instance,
            "instance/hostname": f"{instance}.{zone}.c.{project}.internal",
            "instance/id": instance_id,
            "instance/zone": f"projects/{project_number}/zones/{zone}",
            "instance/preempted": "FALSE",
            "instance/maintenance-event": "NONE",
            "instance/scheduling/preemptible": "TRUE",
            "instance/scheduling/on-host-maintenance": "TERMINATE",
            "project/project-id": project,
            "project/numeric-project-id": project_number,
        }.items():
            self._store(key, value)

    # --- state ------------------------------------------------------------------------------

    def _store(self, key: str, value: str) -> None:
        self._values[key] = value
        version = next(self._versions)
        self._etags[key] = hashlib.sha256(f"{key}\0{version}\0{value}".encode()).hexdigest()[:16]

    def value(self, key: str) -> str:
        return self._values[key]

    def etag(self, key: str) -> str:
        return self._etags[key]

    async def set(self, key: str, value: str) -> str:
        """Set ``key`` (relative to ``/computeMetadata/v1/``), wake its watchers; the new ETag."""
        async with self._changed:
            self._store(key, value)
            self._changed.notify_all()
        return self._etags[key]

    # --- HTTP -------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self) -> str:
        app = web.Application()
        app.router.add_get(PREFIX + "{key:.+}", self._get)
        app.router.add_put(CONTROL + "{key:.+}", self._put)
        self._runner = web.AppRunner(app, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        self.port = self._runner.addresses[0][1]  # the port the OS picked for port=0
        return self.url

    async def stop(self) -> None:
        async with self._changed:
            self._closing = True  # let hanging GETs return instead of holding the shutdown
            self._changed.notify_all()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> GceMetadataServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def _reply(self, status: int, text: str, etag: str = "") -> web.Response:
        headers = {FLAVOR: "Google"} if self.flavor_header else {}
        if etag:
            headers["ETag"] = etag
        return web.Response(
            status=status, text=text, headers=headers, content_type="application/text"
        )

    async def _get(self, request: web.Request) -> web.Response:
        key = request.match_info["key"]
        query = dict(request.query)
        self.requests.append((key, query))
        if request.headers.get(FLAVOR) != "Google":
            return self._reply(403, f"Missing {FLAVOR}:Google header.\n")
        if "X-Forwarded-For" in request.headers:
            return self._reply(403, "Request had an X-Forwarded-For header.\n")
        if key not in self._values:
            return self._reply(404, "Not found.\n")
        if query.get("wait_for_change", "").lower() == "true":
            try:
                timeout = _timeout(query.get("timeout_sec"))
            except ValueError:
                return self._reply(400, "timeout_sec must be a positive integer.\n")
            await self._wait(key, query.get("last_etag") or self._etags[key], timeout)
        return self._reply(200, self._values[key], self._etags[key])

    async def _wait(self, key: str, last_etag: str, timeout_s: float) -> None:
        self.waiting += 1
        try:
            async with self._changed:
                await asyncio.wait_for(
                    self._changed.wait_for(lambda: self._closing or self._etags[key] != last_etag),
                    timeout_s,
                )
        except TimeoutError:
            pass  # the unchanged value, as the real server answers a timed-out wait
        finally:
            self.waiting -= 1

    async def _put(self, request: web.Request) -> web.Response:
        key = request.match_info["key"]
        etag = await self.set(key, (await request.text()).strip())
        return web.json_response({"key": key, "value": self._values[key], "etag": etag})


def _timeout(raw: str | None) -> float:
    if raw is None:
        return MAX_WAIT_S
    seconds = int(raw)
    if seconds <= 0:
        raise ValueError(raw)
    return float(seconds)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="GCE metadata server stand-in (tests, drills)")
    p.add_argument("--instance", required=True)
    p.add_argument("--zone", required=True)
    p.add_argument("--project", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    args = p.parse_args(argv)

    async def serve() -> Any:
        server = GceMetadataServer(
            project=args.project,
            zone=args.zone,
            instance=args.instance,
            host=args.host,
            port=args.port,
        )
        print(await server.start(), flush=True)
        try:
            await asyncio.Event().wait()
        finally:
            await server.stop()

    asyncio.run(serve())


if __name__ == "__main__":
    main()
