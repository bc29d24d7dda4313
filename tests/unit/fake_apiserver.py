"""One stand-in for ``ApiServer`` in unit tests: objects served by path, every request kept as
it would go on the wire. What the real server does with them is the e2e tests' part."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, NamedTuple, cast

from reclaimd.cluster.apiserver import ApiServer, ApiStatus, JsonObject
from reclaimd.cluster.kubeconfig import Connection


class Sent(NamedTuple):
    method: str
    path: str
    query: dict[str, Any]
    body: Any  # as JSON would carry it; None without a body
    content_type: str


class FakeApiServer(ApiServer):
    """GET answers ``objects[path]`` (404 when absent); other methods answer {}. ``answers``,
    when given, are used first, one a request: a JSON object, or a status to raise."""

    def __init__(
        self, objects: Mapping[str, JsonObject] | None = None, *answers: JsonObject | int
    ) -> None:
        super().__init__(Connection("https://127.0.0.1:1", ssl=False), cast(Any, None))
        self.objects = dict(objects or {})
        self.answers = list(answers)
        self.sent: list[Sent] = []

    @property
    def requests(self) -> list[tuple[str, str, Any]]:
        """(method, path, the query of a GET or the body of a write)."""
        return [(s.method, s.path, s.query if s.method == "GET" else s.body) for s in self.sent]

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        body: Mapping[str, Any] | None = None,
        content_type: str = "application/json",
    ) -> JsonObject:
        wire = None if body is None else json.loads(json.dumps(body))
        self.sent.append(Sent(method, path, dict(params or {}), wire, content_type))
        if self.answers:
            answer = self.answers.pop(0)
        elif method == "GET":
            answer = self.objects.get(path, 404)
        else:
            answer = {}
        if isinstance(answer, int):
            raise ApiStatus(answer, b'{"kind":"Status","message":"said no"}')
        return answer
