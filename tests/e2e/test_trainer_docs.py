"""Every Python snippet of docs/checkpoint-contract.md's trainer section, run as written, in
order and in one namespace, where only the SDK is installed: a fresh venv holding the
reclaimd-trainer wheel, whose libraries are exactly what its extras (s3, aio, torch, lightning,
hf) require, installed offline from the wheel cache of `make trainer-deps` (no reclaimd, no
chaos). The snippets run there (trainer_docs_runner.py) against moto while reclaimd's own
signaller asks from here: each must ack durably, and the plain loop run again restores the step
it saved."""

from __future__ import annotations

import asyncio
import email.parser
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import uuid
import zipfile
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import aiohttp
import boto3
import pytest
from trainer_helpers import jobset_gang, spot_notice
from wheels import fresh_venv, outside_env, pip, run, sdk_wheel

from reclaimd.checkpoint import signal_gang
from reclaimd.model import Member, RankAck, utcnow
from reclaimd.putbudget import TenantPutBudgets

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "checkpoint-contract.md"
RUNNER = Path(__file__).resolve().parent / "trainer_docs_runner.py"
VERSIONS = REPO / "deploy" / "trainer" / "versions.env"
CACHE = Path(os.environ.get("RECLAIMD_CACHE", Path.home() / ".cache" / "reclaimd"))
EXTRAS = "s3,aio,torch,lightning,hf"
MARK = b"@reclaimd-docs "  # trainer_docs_runner.py's lines


def pins() -> list[str]:
    """The framework versions the trainer tests use (deploy/trainer/versions.env)."""
    v = dict(
        line.split("=", 1) for line in VERSIONS.read_text().splitlines() if "=" in line
    )  # fmt: skip
    return [
        f"torch=={v['TORCH_VERSION']}",
        f"lightning=={v['LIGHTNING_VERSION']}",
        f"transformers=={v['TRANSFORMERS_VERSION']}",
        f"accelerate=={v['ACCELERATE_VERSION']}",
    ]


def requirements_of(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as z:
        name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        meta = email.parser.Parser().parsestr(z.read(name).decode())
    return sorted(meta.get_all("Requires-Dist") or [])


def libraries(wheel: Path) -> Path:
    """The site-packages of a venv holding what the SDK's extras require and nothing else,
    installed offline from the wheel cache: built once per set of requirements (installing
    torch takes minutes), in the cache. The SDK itself is not in it."""
    key = hashlib.sha256(
        "\n".join([*requirements_of(wheel), *pins(), sys.version]).encode()
    ).hexdigest()[:12]
    venv = CACHE / f"trainer-docs-libs-{key}"
    CACHE.mkdir(parents=True, exist_ok=True)
    with (CACHE / ".trainer-docs-libs.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another session may be building the same
        if not (venv / "done").exists():
            partial = venv.with_name(venv.name + ".partial")
            shutil.rmtree(partial, ignore_errors=True)
            python = fresh_venv(partial)
            wheels = CACHE / "wheels"
            built = subprocess.run(
                [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet",
                 "--no-index", "--find-links", str(wheels), f"{wheel}[{EXTRAS}]", *pins()],
                capture_output=True, text=True, timeout=1800, check=False,
            )  # fmt: skip
            assert built.returncode == 0, (
                f"the SDK's requirements are not all in {wheels}: run `make trainer-deps`\n"
                + built.stderr[-1500:]
            )
            pip(python, "uninstall", "--yes", "--quiet", "reclaimd-trainer")
            # A venv's scripts name its path: only its site-packages is used, by a .pth.
            (partial / "done").touch()
            partial.rename(venv)
    purelib = run(
        venv / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    )
    return Path(purelib.stdout.strip())


@pytest.fixture(scope="module")
def sdk_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv: the SDK's wheel, and the libraries its extras require."""
    tmp = tmp_path_factory.mktemp("sdk-only")
    wheel = sdk_wheel(tmp / "dist")
    python = fresh_venv(tmp / "venv", libraries(wheel))
    pip(python, "install", "--quiet", "--no-deps", "--no-index", wheel)
    probe = run(
        python, "-c",
        "import json, importlib.util as u; print(json.dumps({m: u.find_spec(m) is not None "
        "for m in ('reclaimd_trainer', 'reclaimd', 'handlers', 'chaos', 'kubernetes_asyncio', "
        "'pytest')}))",
        env=outside_env(), cwd=tmp,
    )  # fmt: skip
    assert json.loads(probe.stdout) == {
        "reclaimd_trainer": True,
        "reclaimd": False,
        "handlers": False,
        "chaos": False,
        "kubernetes_asyncio": False,
        "pytest": False,
    }
    return python


async def ask(url: str) -> RankAck:
    now = utcnow()
    notice = spot_notice("doc", now=now, instance_id="i-0")
    member = Member(
        namespace="team-a",
        name="doc-0",
        uid="u0",
        node="n",
        gpus=1,
        rank=0,
        pod_ip="127.0.0.1",
        checkpoint_url=url,
    )
    gang = jobset_gang("doc", (member,))
    async with aiohttp.ClientSession() as session:
        acks = await signal_gang(
            gang,
            notice,
            budget_deadline=now + timedelta(seconds=30),
            session=session,
            put_budgets=TenantPutBudgets(),
        )
    return acks[0]


async def lines(proc: asyncio.subprocess.Process) -> AsyncIterator[dict[str, Any]]:
    assert proc.stdout is not None
    while True:
        line = await asyncio.wait_for(proc.stdout.readline(), 300)
        if not line:
            return
        if line.startswith(MARK):  # the runner's, not the frameworks' own prints
            yield json.loads(line[len(MARK) :])


async def test_every_trainer_snippet_runs_where_only_the_sdk_is_installed_and_acks_durably(
    stack: Any, sdk_python: Path, tmp_path: Path
) -> None:
    bucket = f"doc-{uuid.uuid4().hex[:10]}"
    boto3.client("s3", endpoint_url=stack.aws_endpoint, region_name="us-east-1").create_bucket(
        Bucket=bucket
    )
    errors = (tmp_path / "runner.err").open("wb")
    proc = await asyncio.create_subprocess_exec(
        str(sdk_python), str(RUNNER), str(DOC), bucket, str(tmp_path),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=errors,
        env=outside_env(), cwd=tmp_path,  # not the checkout: nothing of it is importable
    )  # fmt: skip
    acks: dict[str, RankAck] = {}
    said: dict[str, dict[str, Any]] = {}
    try:
        async for doc in lines(proc):
            if "ask" in doc:
                ack = acks[doc["phase"]] = await ask(doc["ask"])
                if doc["phase"] == "plain":
                    assert proc.stdin is not None
                    proc.stdin.write(f"{ack.step}\n".encode())
                    await proc.stdin.drain()
            else:
                said[doc["phase"]] = doc
        code = await asyncio.wait_for(proc.wait(), 60)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        errors.close()
    assert code == 0, (tmp_path / "runner.err").read_text()[-3000:]

    plain = acks["plain"]
    assert plain.acked and plain.durable and plain.step is not None, plain
    assert plain.uri.endswith(f"/checkpoints/team-a/llama/step-{plain.step:010d}/")
    assert said["plain-again"]["first_step"] == plain.step  # restored from the bucket
    for phase in ("lightning", "hf"):
        assert acks[phase].acked and acks[phase].durable, acks[phase]
        assert said[f"{phase}-saved"]["step"] == acks[phase].step
    assert acks["aio"].acked and acks["aio"].durable, acks["aio"]
    assert said["aio-saved"]["saves"] == 1
