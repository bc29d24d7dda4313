"""The trainer SDK imports in a process where the controller's libraries cannot be imported.

A trainer image should not carry boto3, kubernetes-asyncio, grpc, OpenTelemetry or aiohttp,
nor the controller itself: the subprocess below installs an import hook that refuses them (and
every module of reclaimd, handlers and chaos), then imports the SDK, serves one request and
acks it. torch is allowed:
``reclaimd_trainer.torch`` is the PyTorch integration, and it must not pull them in either.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

from trainer_helpers import SDK_ROUND_TRIP, check_round_trip

BLOCKED = (
    "boto3",
    "botocore",
    "kubernetes_asyncio",
    "grpc",
    "opentelemetry",
    "aiohttp",
    "aiokafka",
    "google",
    "tenacity",
    "pydantic",
    "reclaimd",
    "handlers",
    "chaos",
)

PROGRAM = (
    textwrap.dedent(
        """
        import importlib.abc, json, sys

        BLOCKED = set(sys.argv[1].split(","))

        class Refuse(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in BLOCKED:
                    raise ImportError(f"blocked in this test: {name}")
                return None

        sys.meta_path.insert(0, Refuse())
        import reclaimd_trainer as sdk
        import reclaimd_trainer.torch  # the DCP integration: torch, nothing of the controller
        """
    )
    + SDK_ROUND_TRIP
    + textwrap.dedent(
        """
        done = round_trip(sdk)
        loaded = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
        print(json.dumps({**done, "loaded": loaded}))
        """
    )
)


def test_sdk_imports_and_serves_without_the_controllers_libraries() -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROGRAM, ",".join(BLOCKED)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    import json

    doc = json.loads(out.stdout.strip().splitlines()[-1])
    assert doc["loaded"] == []
    check_round_trip(doc)


def test_the_hook_really_blocks() -> None:
    """The same hook makes the guarded S3 upload (boto3) fail to import: the test can fail."""
    program = PROGRAM.split("import reclaimd_trainer as sdk")[0] + "import reclaimd_trainer.s3\n"
    out = subprocess.run(
        [sys.executable, "-c", program, ",".join(BLOCKED)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode != 0
    assert "blocked in this test: boto3" in out.stderr
