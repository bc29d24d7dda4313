"""The production image, run with podman (runc, read-only root): what it holds, and
``reclaimd run`` becoming ready against the local stack as user ``reclaimd``. Then the chaos
image (``make image-chaos``: the product image plus the reclaimd-chaos layer), which the
chart's drill Job runs: ``reclaimd drill`` in it, as the same user, without the test tools.

The images come from ``deploy/image/build.sh`` (``make image``, ``make image-chaos``): their
OCI archives are cached per commit, so this costs seconds when they are built, minutes (a
build) when they are not.
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


def built(*flavor: str) -> str:
    """The image deploy/image/build.sh makes (or has cached), loaded into podman: its tag."""
    done = subprocess.run(
        [str(BUILD), *flavor], capture_output=True, text=True, check=False,
        timeout=BUILD_TIMEOUT_S,
    )  # fmt: skip
    if done.returncode != 0:
        pytest.fail(f"deploy/image/build.sh failed: {done.stderr.strip()[-600:]}", pytrace=False)
    archive = Path(done.stdout.strip().splitlines()[-1])
    tag = (archive.parent / "tag").read_text().strip()
    podman("load", "-q", "-i", str(archive), timeout=300)
    return tag


@pytest.fixture(scope="module")
def image() -> str:
    return built()


@pytest.fixture(scope="module")
def chaos_image(image: str) -> str:
    return built("chaos")


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


FIND = (
    "import importlib.util, json, sys\n"
    "names = sys.argv[1].split(',')\n"
    "print(json.dumps({n: importlib.util.find_spec(n) is not None for n in names}))\n"
)
# Every module of the packages named in argv[1] imports (as the image builds check).
IMPORT_ALL = (
    "import importlib, json, pkgutil, sys\n"
    "names = []\n"
    "for top in sys.argv[1].split(','):\n"
    "    p = importlib.import_module(top)\n"
    "    names += [top] + [m.name for m in pkgutil.walk_packages(p.__path__, top + '.')]\n"
    "for n in names:\n"
    "    importlib.import_module(n)\n"
    "print(json.dumps(names))\n"
)


def found(image: str, *names: str) -> dict[str, bool]:
    done = run_once(image, "-c", FIND, ",".join(names), entrypoint="/opt/reclaimd/bin/python")
    assert done.returncode == 0, done.stderr
    result: dict[str, bool] = json.loads(done.stdout)
    return result


def test_holds_the_daemon_only(image: str) -> None:
    names = ["reclaimd.daemon", "reclaimd.handlers.sqs.parser", "reclaimd_trainer",
             "reclaimd_trainer.torch", "reclaimd_trainer.lightning", "reclaimd_trainer.hf", "chaos",
             "pytest", "moto", "hypothesis", "ruff", "mypy", "pip", "torch"]  # fmt: skip
    assert found(image, *names) == {
        "reclaimd.daemon": True,
        "reclaimd.handlers.sqs.parser": True,
        "reclaimd_trainer": True,  # the checkpoint contract the daemon speaks
        "reclaimd_trainer.torch": False,  # the SDK's integrations need torch: its own wheel
        "reclaimd_trainer.lightning": False,
        "reclaimd_trainer.hf": False,
        "chaos": False,  # the drills are the chaos image's
        "pytest": False,
        "moto": False,
        "hypothesis": False,
        "ruff": False,
        "mypy": False,
        "pip": False,
        "torch": False,
    }
    drill = run_once(image, "drill", "--help")
    assert drill.returncode == 2
    assert "invalid choice: 'drill'" in drill.stderr


@pytest.mark.parametrize(("flavor", "packages"), [("image", "reclaimd"), ("chaos_image", "chaos")])
def test_every_module_it_ships_imports(
    request: pytest.FixtureRequest, flavor: str, packages: str
) -> None:
    tag: str = request.getfixturevalue(flavor)
    done = run_once(tag, "-c", IMPORT_ALL, packages, entrypoint="/opt/reclaimd/bin/python")
    assert done.returncode == 0, done.stderr[-1500:]
    names = json.loads(done.stdout)
    assert len(names) > 10
    if flavor == "image":  # the sources ship inside the product, each folder whole
        assert "reclaimd.handlers.sqs.transport" in names, names


# --- the chaos image -------------------------------------------------------------------------


def image_field(image: str, field: str) -> Any:
    return json.loads(podman("image", "inspect", "--format", f"{{{{json {field}}}}}", image).stdout)


def test_the_chaos_image_is_the_product_image_and_one_layer(image: str, chaos_image: str) -> None:
    product = image_field(image, ".RootFS.Layers")
    chaos = image_field(chaos_image, ".RootFS.Layers")
    assert chaos[: len(product)] == product
    assert len(chaos) == len(product) + 1
    for field in (".Config.User", ".Config.Entrypoint", ".Config.Env", ".Config.WorkingDir"):
        assert image_field(chaos_image, field) == image_field(image, field), field


def test_the_chaos_image_runs_reclaimd_drill(chaos_image: str) -> None:
    done = run_once(chaos_image, "drill", "--help")
    assert done.returncode == 0, done.stderr
    assert "run" in done.stdout
    # The chart's drill.scenario names a file here (/opt/reclaimd/scenarios, the shipped ones).
    scenario = "/opt/reclaimd/scenarios/gameday-spot-storm.yaml"
    check = run_once(chaos_image, "drill", "check", scenario)
    assert check.returncode == 0, check.stderr
    assert "gameday-spot-storm" in check.stdout


def test_the_chaos_image_runs_as_65532_on_a_read_only_root(chaos_image: str) -> None:
    test_runs_as_65532_on_a_read_only_root(chaos_image)


def test_the_chaos_image_holds_the_rig_and_no_test_tools(chaos_image: str) -> None:
    names = ["chaos.drill.run", "chaos.drill.scenario", "reclaimd.daemon", "chaos.torchjob",
             "chaos.bench.trainer", "reclaimd_trainer.torch", "pytest", "moto", "hypothesis",
             "pip", "torch"]  # fmt: skip
    assert found(chaos_image, *names) == {
        "chaos.drill.run": True,
        "chaos.drill.scenario": True,
        "reclaimd.daemon": True,
        "chaos.torchjob": False,  # the torch jobs stay out: no torch here
        "chaos.bench.trainer": False,
        "reclaimd_trainer.torch": False,
        "pytest": False,
        "moto": False,
        "hypothesis": False,
        "pip": False,  # pip only in the build stage
        "torch": False,
    }


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
