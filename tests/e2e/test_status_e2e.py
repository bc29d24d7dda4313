"""``reclaimd status`` against the real stack, as a process, under exactly the chart's
``reclaimd-viewer`` rights (rendered by helm, applied, bound to a ServiceAccount of this run
whose token comes from TokenRequest): a real Spot notice, held in flight by trainers that take
their time to save, is shown with its countdown, its gang and its replica (whose /metrics its
holder Lease names), then as finished with its outcome. Without the role: one line, exit 2.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, cast

import pytest
import yaml
from kubernetes_asyncio.client import ApiException
from kubernetes_asyncio.dynamic import DynamicClient
from stack import REPO_DIR

from chaos import kube
from chaos import stack as stackenv
from chaos.harness import Harness
from chaos.ports import free_port
from chaos.trainers import Behaviour

VERSIONS = REPO_DIR / "deploy" / "local" / "versions.env"
CACHE = Path(os.environ.get("RECLAIMD_CACHE") or Path.home() / ".cache" / "reclaimd")
SAVE_S = 40.0  # each rank's save: the notice stays in flight about this long


def pins() -> dict[str, str]:
    return dict(ln.split("=", 1) for ln in VERSIONS.read_text().splitlines() if "=" in ln)


def viewer_docs(release: str, subject: dict[str, str]) -> list[dict[str, Any]]:
    """The chart's viewer rights for ``release`` in namespace reclaimd, bound to ``subject``."""
    p = pins()
    helm = CACHE / f"helm-{p['HELM_VERSION']}" / "helm"
    if not helm.is_file():
        pytest.fail(f"no helm at {helm}: run deploy/helm/tools.sh", pytrace=False)
    done = subprocess.run(
        [str(helm), "template", release, str(REPO_DIR / "deploy" / "helm" / "reclaimd"),
         "--namespace", "reclaimd", "--kube-version", p["K8S_VERSION"].lstrip("v"),
         "--show-only", "templates/viewer-rbac.yaml", "--set", "viewer.create=true",
         "--set", "config.cluster_name=local",
         "--set", "config.cluster_name=e2e",
         "--set-json", f"viewer.subjects=[{json.dumps(subject)}]"],
        capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-800:]
    docs = [d for d in yaml.safe_load_all(done.stdout) if d]
    assert sorted(d["kind"] for d in docs) == [
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
    ]
    return docs


async def kubeconfig_for(h: Harness, sa: str) -> Path:
    """A kubeconfig with a TokenRequest token of ``sa`` (in the run's namespace)."""
    await kube.apply_documents(
        cast(Any, h.api),
        [
            {
                "apiVersion": "v1",
                "kind": "ServiceAccount",
                "metadata": {"name": sa, "namespace": h.namespace},
            }
        ],
    )
    return await h.token_kubeconfig(sa)


def status(kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``reclaimd status`` as a user runs it: a process of its own."""
    return subprocess.run(
        [sys.executable, "-m", "reclaimd.cli", "status", "--kubeconfig", str(kubeconfig), *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,  # a look while the shared stack is busy with others' storms
        cwd=REPO_DIR,
    )


async def until(
    kubeconfig: Path, found: Callable[[dict[str, Any]], bool], timeout_s: float
) -> dict[str, Any]:
    """Look again and again (each look a process) until ``found`` says the look shows it."""
    end = asyncio.get_running_loop().time() + timeout_s
    while True:
        done = await asyncio.to_thread(status, kubeconfig, "--format", "json")
        assert done.returncode == 0, done.stderr
        doc: dict[str, Any] = json.loads(done.stdout)
        if found(doc):
            return doc
        assert asyncio.get_running_loop().time() < end, json.dumps(doc)[:2000]


@pytest.fixture
async def h(stack: Any) -> AsyncIterator[Harness]:
    async with Harness(stackenv.load()) as harness:
        yield harness


@pytest.fixture
async def viewer(h: Harness) -> AsyncIterator[Path]:
    """A ServiceAccount of this run with the chart's viewer rights and nothing else."""
    sa = "status-viewer"
    path = await kubeconfig_for(h, sa)
    docs = viewer_docs(
        f"st-{h.run_id}", {"kind": "ServiceAccount", "name": sa, "namespace": h.namespace}
    )
    assert h.api is not None
    await kube.apply_documents(h.api, docs)
    # A new binding takes a moment to reach the authorizer: until the command itself passes.
    end = asyncio.get_running_loop().time() + 20
    while (await asyncio.to_thread(status, path)).returncode != 0:
        assert asyncio.get_running_loop().time() < end, "the viewer binding never took effect"
    yield path
    dyn = await DynamicClient(h.api)
    for doc in docs:
        resource = await dyn.resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
        meta = doc["metadata"]
        try:
            await dyn.delete(resource, name=meta["name"], namespace=meta.get("namespace"))
        except ApiException as e:
            if e.status != 404:
                raise


async def test_status_shows_a_notice_in_flight_with_its_countdown_then_finished(
    h: Harness, viewer: Path
) -> None:
    nodes = [h.node_spec(i) for i in range(2)]
    await h.add_nodes(nodes)
    slow = Behaviour(ack_latency_s=(SAVE_S, SAVE_S))
    gang = await h.add_gang("train", [nodes[0].name, nodes[1].name], behaviour=slow)
    port = free_port()
    await h.start_daemon(metrics_port=port)
    notice = h.send_spot(nodes[0])
    assert notice.deadline is not None

    def in_flight(doc: dict[str, Any]) -> bool:
        return any(n["notice_id"] == notice.id for n in doc["in_flight"])

    doc = await until(viewer, in_flight, timeout_s=SAVE_S)
    (n,) = [n for n in doc["in_flight"] if n["notice_id"] == notice.id]
    assert n["target"] == f"node/{nodes[0].name}"
    assert (n["source"], n["kind"]) == (notice.source, notice.kind.value)
    assert n["holder"] == h.holder() and n["holder_alive"]
    assert 0 < n["seconds_left"] <= 120
    # The replica holding it, its /metrics read where its holder Lease says it is.
    (me,) = [r for r in doc["replicas"] if r["holder"] == h.holder()]
    assert me["alive"] and me["metrics_address"] == f"127.0.0.1:{port}"
    assert me["metrics"] is not None and me["metrics"]["outbox_depth"] is not None

    # The screen: the notice with a countdown.
    text = await asyncio.to_thread(status, viewer)
    assert text.returncode == 0, text.stderr
    (line,) = [
        ln
        for ln in text.stdout.splitlines()
        if ln.rstrip().endswith(notice.id) and f"node/{nodes[0].name}" in ln
    ]
    assert re.search(r"\s\d+s\s", line) and "deadline met" not in line, line

    # Its gang, once owned: both ranks asked, both pods still there while they save.
    doc = await until(
        viewer,
        lambda d: any(n["notice_id"] == notice.id and n["gangs"] for n in d["in_flight"]),
        timeout_s=SAVE_S,
    )
    (n,) = [n for n in doc["in_flight"] if n["notice_id"] == notice.id]
    (g,) = n["gangs"]
    assert g["gang"].endswith(f"/{gang.name}") and g["asked"] == 2

    doc = await until(
        viewer,
        lambda d: any(f["notice_id"] == notice.id for f in d["finished"]),
        timeout_s=120,
    )
    assert not in_flight(doc)
    (f,) = [f for f in doc["finished"] if f["notice_id"] == notice.id]
    assert f["outcome"] == "deadline met" and f["holder"] == h.holder()


async def test_without_the_viewer_role_status_is_one_line_and_exit_2(h: Harness) -> None:
    path = await kubeconfig_for(h, "status-nobody")
    done = await asyncio.to_thread(status, path)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("reclaimd status: list nodes: failed 403")
    assert "Traceback" not in done.stderr
