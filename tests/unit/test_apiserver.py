"""The product's own Kubernetes client: kubeconfig and in-cluster loading, the requests it
sends (against a loopback aiohttp server standing in for the API server's HTTP) and how a
status becomes a ``KubeError``. The e2e tests run every call against the real kube-apiserver.
"""

from __future__ import annotations

import base64
import json
import os
import stat
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web

from reclaimd.cluster import apiserver, connect, errors, kubeconfig
from reclaimd.cluster.apiserver import ApiServer
from reclaimd.cluster.kubeconfig import Connection, KubeconfigError, Token

# --- paths and queries ------------------------------------------------------------------------


def test_paths_name_each_resource_and_escape_names() -> None:
    assert apiserver.node() == "/api/v1/nodes"
    assert apiserver.node("gpu-1") == "/api/v1/nodes/gpu-1"
    assert apiserver.pod("") == "/api/v1/pods"
    assert apiserver.pod("team", "r0") == "/api/v1/namespaces/team/pods/r0"
    assert apiserver.lease("reclaimd", "a/b") == (
        "/apis/coordination.k8s.io/v1/namespaces/reclaimd/leases/a%2Fb"
    )
    assert apiserver.group("kueue.x-k8s.io/v1beta2", "workloads", "w", "ns") == (
        "/apis/kueue.x-k8s.io/v1beta2/namespaces/ns/workloads/w"
    )


def test_query_spells_booleans_as_the_server_does_and_drops_none() -> None:
    assert apiserver.query({"watch": True, "x": False, "limit": 5, "gone": None}) == {
        "watch": "true",
        "x": "false",
        "limit": "5",
    }


# --- kubeconfig ---------------------------------------------------------------------------------


def _write(path: Path, doc: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(doc))
    return path


def _config(user: dict[str, Any], cluster: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "c",
                "cluster": cluster
                or {"server": "https://10.0.0.1:6443/", "insecure-skip-tls-verify": True},
            }
        ],
        "users": [{"name": "u", "user": user}],
        "contexts": [
            {"name": "ctx", "context": {"cluster": "c", "user": "u"}},
            {"name": "other", "context": {"cluster": "c", "user": "nobody"}},
        ],
        "current-context": "ctx",
    }


async def test_a_token_kubeconfig(tmp_path: Path) -> None:
    conn = kubeconfig.load(str(_write(tmp_path / "k", _config({"token": "s3cret"}))))
    assert conn.server == "https://10.0.0.1:6443"  # no trailing slash: paths start with /
    assert conn.ssl is False
    assert conn.token is not None and await conn.token.get() == "s3cret"


async def test_a_token_file_is_read_relative_to_the_kubeconfig_and_again_as_it_ages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "tok").write_text("one\n")
    conn = kubeconfig.load(str(_write(tmp_path / "k", _config({"tokenFile": "tok"}))))
    assert conn.token is not None
    assert await conn.token.get() == "one"
    (tmp_path / "tok").write_text("two\n")
    assert await conn.token.get() == "one"  # within the minute: no read
    monkeypatch.setattr(kubeconfig, "TOKEN_FILE_TTL_S", 0.0)
    conn.token._expires = 0.0
    assert await conn.token.get() == "two"


def test_kubeconfig_env_lists_several_files_first_wins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = _write(tmp_path / "a", {"current-context": "ctx"})
    second = _write(tmp_path / "b", {**_config({"token": "t"}), "current-context": "other"})
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv(
        "KUBECONFIG", f"{first}{os.pathsep}{tmp_path / 'absent'}{os.pathsep}{second}"
    )
    conn = kubeconfig.load()
    assert conn.token is not None and conn.token.value == "t"  # ctx (the first file's) won


def test_bad_kubeconfigs_are_one_line_errors(tmp_path: Path) -> None:
    with pytest.raises(KubeconfigError, match="no kubeconfig"):
        kubeconfig.load(str(tmp_path / "absent"))
    with pytest.raises(KubeconfigError, match="no context 'nope'"):
        kubeconfig.load(str(_write(tmp_path / "k", _config({"token": "t"}))), context="nope")
    with pytest.raises(KubeconfigError, match="auth-provider"):
        kubeconfig.load(str(_write(tmp_path / "k", _config({"auth-provider": {"name": "gcp"}}))))
    bad_ca = _config({"token": "t"}, {"server": "https://x", "certificate-authority-data": "!!"})
    with pytest.raises(KubeconfigError, match="base64"):
        kubeconfig.load(str(_write(tmp_path / "k", bad_ca)))
    not_pem = {"server": "https://x", "certificate-authority-data": base64.b64encode(b"x").decode()}
    with pytest.raises(KubeconfigError, match="CA unusable"):
        kubeconfig.load(str(_write(tmp_path / "k", _config({"token": "t"}, not_pem))))


async def test_build_api_client_turns_a_bad_kubeconfig_into_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(errors.ConfigError, match="no kubeconfig"):
        await connect.build_api_client(str(tmp_path / "absent"))


def test_in_cluster_reads_the_service_account(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "fd00::1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    with pytest.raises(KubeconfigError, match="no in-cluster service account"):
        kubeconfig.in_cluster(tmp_path)
    (tmp_path / "token").write_text("sa-token")
    (tmp_path / "ca.crt").write_text("not a certificate")
    with pytest.raises(KubeconfigError, match="CA unreadable"):
        kubeconfig.in_cluster(tmp_path)


async def test_an_exec_plugin_gives_the_token_until_it_expires(tmp_path: Path) -> None:
    plugin = tmp_path / "plugin"
    count = tmp_path / "count"
    plugin.write_text(
        f"#!{sys.executable}\n"
        "import json, os, pathlib\n"
        f"p = pathlib.Path({str(count)!r})\n"
        "n = int(p.read_text()) + 1 if p.exists() else 1\n"
        "p.write_text(str(n))\n"
        "assert json.loads(os.environ['KUBERNETES_EXEC_INFO'])['kind'] == 'ExecCredential'\n"
        "print(json.dumps({'status': {'token': os.environ['PREFIX'] + str(n),\n"
        "                             'expirationTimestamp': '2000-01-01T00:00:00Z'}}))\n"
    )
    plugin.chmod(plugin.stat().st_mode | stat.S_IXUSR)
    spec = {"command": str(plugin), "env": [{"name": "PREFIX", "value": "tok-"}]}
    conn = kubeconfig.load(str(_write(tmp_path / "k", _config({"exec": spec}))))
    assert conn.token is not None
    assert await conn.token.get() == "tok-1"
    assert await conn.token.get() == "tok-2"  # long expired: asked again


async def test_an_exec_plugin_that_fails_is_a_clear_error(tmp_path: Path) -> None:
    token = Token(exec_spec={"command": "false"})
    with pytest.raises(KubeconfigError, match="exited 1"):
        await token.get()
    token = Token(exec_spec={"command": str(tmp_path / "absent")})
    with pytest.raises(KubeconfigError, match="failed: FileNotFoundError"):
        await token.get()


# --- requests against a loopback HTTP server ------------------------------------------------


class Recorded:
    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []


@pytest.fixture
async def served() -> AsyncIterator[tuple[ApiServer, Recorded]]:
    seen = Recorded()

    async def handle(request: web.Request) -> web.StreamResponse:
        body = await request.text()
        seen.requests.append(
            {
                "method": request.method,
                "path": request.path,
                "query": dict(request.query),
                "type": request.headers.get("Content-Type", ""),
                "auth": request.headers.get("Authorization", ""),
                "body": json.loads(body) if body else None,
            }
        )
        if request.path.endswith("/missing"):
            return web.json_response(
                {"kind": "Status", "message": 'nodes "missing" not found'}, status=404
            )
        if request.path.endswith("/busy"):
            return web.json_response(
                {"message": "slow down"}, status=429, headers={"Retry-After": "2"}
            )
        if request.path.endswith("/garbled"):
            return web.Response(text="<html>a proxy's error page</html>")
        if request.query.get("watch") == "true":
            response = web.StreamResponse()
            await response.prepare(request)
            for n in range(2):
                await response.write(
                    json.dumps({"type": "ADDED", "object": {"n": n}}).encode() + b"\n"
                )
            await response.write_eof()
            return response
        return web.json_response({"kind": "Node", "metadata": {"name": "n"}})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    api = ApiServer.open(Connection(f"http://127.0.0.1:{port}", False, Token(value="t0k")))
    try:
        yield api, seen
    finally:
        await api.close()
        await runner.cleanup()


async def test_requests_carry_the_token_json_and_a_merge_patch(
    served: tuple[ApiServer, Recorded],
) -> None:
    api, seen = served
    assert await api.get(apiserver.node("n"), labelSelector="a=b") == {
        "kind": "Node",
        "metadata": {"name": "n"},
    }
    await api.patch(apiserver.node("n"), {"spec": {"unschedulable": True}})
    await api.delete(apiserver.node("n"), {"preconditions": {"resourceVersion": "7"}})
    get, patch, delete = seen.requests
    assert get["query"] == {"labelSelector": "a=b"} and get["auth"] == "Bearer t0k"
    assert patch["type"] == "application/merge-patch+json"
    assert patch["body"] == {"spec": {"unschedulable": True}}
    assert delete["method"] == "DELETE"
    assert delete["body"] == {"preconditions": {"resourceVersion": "7"}}


async def test_a_status_becomes_our_error_with_its_message_and_retry_after(
    served: tuple[ApiServer, Recorded],
) -> None:
    api, _ = served
    missing = 'read node: failed 404: nodes "missing"'
    with pytest.raises(errors.NotFound, match=missing), errors.kube_errors("read node"):
        await api.get(apiserver.node("missing"))
    with pytest.raises(errors.Throttled) as caught, errors.kube_errors("patch node"):
        await api.patch(apiserver.node("busy"), {})
    assert caught.value.retry_after_s == 2.0


async def test_a_garbled_answer_is_a_retriable_server_error(
    served: tuple[ApiServer, Recorded],
) -> None:
    api, _ = served
    with pytest.raises(errors.ServerError) as caught, errors.kube_errors("read node"):
        await api.get(apiserver.node("garbled"))
    assert caught.value.retriable
    assert "not a JSON object" in str(caught.value)


async def test_a_refused_connection_is_a_retriable_server_error() -> None:
    api = ApiServer.open(Connection("http://127.0.0.1:9", False))
    try:
        with pytest.raises(errors.ServerError) as caught, errors.kube_errors("read node"):
            await api.get(apiserver.node("n"))
        assert caught.value.retriable
    finally:
        await api.close()


async def test_a_stream_is_read_line_by_line(served: tuple[ApiServer, Recorded]) -> None:
    api, seen = served
    response = await api.stream(apiserver.node(), watch=True, resourceVersion="5")
    try:
        lines = [json.loads(line) async for line in response.content if line.strip()]
    finally:
        response.release()
    assert [e["object"]["n"] for e in lines] == [0, 1]
    assert seen.requests[-1]["query"] == {"watch": "true", "resourceVersion": "5"}
