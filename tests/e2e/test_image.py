"""The production image, run with podman (runc, read-only root): what it holds, and
``reclaimd run`` becoming ready against the local stack as user ``reclaimd``.

The image comes from ``deploy/image/build.sh`` (``make image``): its OCI archive is cached per
commit, so this costs seconds when the image is built, minutes (a build) when it is not.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_asyncio import client as k8s
from stack import REPO_DIR, Stack

from chaos import kube as chaos_kube
from chaos.harness import RBAC
from chaos.ports import free_port

BUILD = REPO_DIR / "deploy" / "image" / "build.sh"
BUILD_TIMEOUT_S = 1500  # a cold build on a busy 2-core machine (base, wheels, image)
PODMAN = [
    "podman", "--cgroup-manager", "cgroupfs", "--runtime", "runc",
]  # fmt: skip
# podman's default open-files limit is above this machine's hard limit.
ULIMITS = ["--ulimit", "nofile=4096:4096", "--ulimit", "nproc=4096:4096"]
# The outbox volume, owned by the image's user (U) as the chart's emptyDir is through fsGroup.
OUTBOX_TMPFS = "type=tmpfs,destination=/var/lib/reclaimd,tmpfs-size=64m,tmpfs-mode=0700,U=true"
UID = 65532


def podman(
    *args: str, check: bool = True, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [*PODMAN, *args], capture_output=True, text=True, check=False, timeout=timeout
    )
    if check and done.returncode != 0:
        raise AssertionError(f"podman {args[0]} failed: {done.stderr.strip()[-600:]}")
    return done


@pytest.fixture(scope="module")
def image() -> str:
    done = subprocess.run(
        [str(BUILD)], capture_output=True, text=True, check=False, timeout=BUILD_TIMEOUT_S
    )
    if done.returncode != 0:
        pytest.fail(f"deploy/image/build.sh failed: {done.stderr.strip()[-600:]}", pytrace=False)
    archive = Path(done.stdout.strip().splitlines()[-1])
    tag = (archive.parent / "tag").read_text().strip()
    podman("load", "-q", "-i", str(archive), timeout=300)
    return tag


def run_once(
    image: str, *args: str, entrypoint: str | None = None
) -> subprocess.CompletedProcess[str]:
    extra = ["--entrypoint", entrypoint] if entrypoint else []
    return podman(
        "run", "--rm", "--read-only", "--network", "none", *ULIMITS, *extra, image, *args,
        check=False,
    )  # fmt: skip


def test_version(image: str) -> None:
    done = run_once(image, "version")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "reclaimd 0.1.0\n"


def test_runs_as_65532_on_a_read_only_root(image: str) -> None:
    probe = (
        "import os, json\n"
        "try:\n"
        "    open('/opt/reclaimd/x', 'w'); writable = True\n"
        "except OSError:\n"
        "    writable = False\n"
        "print(json.dumps([os.getuid(), os.getgid(), writable]))\n"
    )
    done = run_once(image, "-c", probe, entrypoint="/opt/reclaimd/bin/python")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [UID, UID, False]


def test_holds_the_daemon_only(image: str) -> None:
    probe = (
        "import importlib.util, json\n"
        "names = ['reclaimd.daemon', 'handlers.ec2_spot', 'chaos', 'pytest',\n"
        "         'moto', 'hypothesis', 'ruff', 'mypy', 'pip']\n"
        "print(json.dumps({n: importlib.util.find_spec(n) is not None for n in names}))\n"
    )
    done = run_once(image, "-c", probe, entrypoint="/opt/reclaimd/bin/python")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "reclaimd.daemon": True,
        "handlers.ec2_spot": True,
        "chaos": False,  # the drills stay in the source tree
        "pytest": False,
        "moto": False,
        "hypothesis": False,
        "ruff": False,
        "mypy": False,
        "pip": False,
    }
    drill = run_once(image, "drill", "--help")
    assert drill.returncode == 2
    assert "invalid choice: 'drill'" in drill.stderr


def self_contained(kubeconfig: Path) -> dict[str, Any]:
    """The kubeconfig with every file it names inlined, so one read-only mount carries it."""
    cfg: dict[str, Any] = yaml.safe_load(kubeconfig.read_text())
    fields = {
        "certificate-authority": "certificate-authority-data",
        "client-certificate": "client-certificate-data",
        "client-key": "client-key-data",
    }
    for section in ("clusters", "users"):
        for entry in cfg.get(section, []):
            body = entry.get("cluster") or entry.get("user") or {}
            for path_key, data_key in fields.items():
                if path_key in body:
                    path = Path(body.pop(path_key))
                    if not path.is_absolute():
                        path = kubeconfig.parent / path
                    body[data_key] = base64.b64encode(path.read_bytes()).decode()
    return cfg


def http_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)
    except OSError:
        return 0


@pytest.fixture
async def rbac(kube: k8s.ApiClient) -> None:
    await chaos_kube.apply_file(kube, RBAC)  # the chart's render, bound to user reclaimd


@pytest.fixture
def container(image: str, stack: Stack, rbac: None, tmp_path: Path) -> Iterator[tuple[str, int]]:
    port = free_port()
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "kubeconfig").write_text(yaml.safe_dump(self_contained(stack.reclaimd_kubeconfig)))
    settings = {
        "cluster_name": "image-e2e",
        "metrics_port": port,
        "kube": {"kubeconfig": "/etc/reclaimd/kubeconfig"},
        "imds": {"enabled": True, "url": stack.imds_url, "poll_interval_s": 1.0},
        "tracing": {"span_file": None},
    }
    (etc / "config.yaml").write_text(yaml.safe_dump(settings))
    for f in (etc, *etc.iterdir()):
        os.chmod(f, 0o755 if f.is_dir() else 0o644)  # readable by uid 65532, writable by none
    started = podman(
        "run", "-d", "--read-only", "--network", "host", *ULIMITS,
        "--mount", OUTBOX_TMPFS,
        "-v", f"{etc}:/etc/reclaimd:ro",
        image, "run", "--config", "/etc/reclaimd/config.yaml",
    )  # fmt: skip
    cid = started.stdout.strip()
    try:
        yield cid, port
    finally:
        podman("rm", "-f", "-t", "5", cid, check=False)


def test_run_becomes_ready_against_the_local_stack(container: tuple[str, int]) -> None:
    cid, port = container
    base = f"http://127.0.0.1:{port}"
    end = time.monotonic() + 120
    while http_status(f"{base}/readyz") != 200:
        state = podman("inspect", "-f", "{{.State.Running}}", cid, check=False).stdout.strip()
        if state != "true" or time.monotonic() > end:
            logs = podman("logs", cid, check=False)
            pytest.fail(f"not ready (running={state}): {(logs.stdout + logs.stderr)[-800:]}")
        time.sleep(1)
    assert http_status(f"{base}/healthz") == 200
    with urllib.request.urlopen(f"{base}/metrics", timeout=5) as r:
        assert b"reclaimd_" in r.read()
