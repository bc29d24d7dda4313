"""The trainer SDK as its own distribution, reclaimd-trainer: a wheel of the SDK and the two
modules it reads, installed alone and used by an interpreter that has nothing else (``-S``:
no site-packages, so no boto3, kubernetes-asyncio, grpc, OpenTelemetry or aiohttp to find)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

from trainer_helpers import SDK_ROUND_TRIP, check_round_trip

import reclaimd

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "deploy" / "trainer" / "sdk" / "build.py"

PROGRAM = (
    textwrap.dedent(
        """
        import json, sys
        sys.path.insert(0, sys.argv[1])
        import reclaimd, reclaimd.trainer as sdk
        missing = []
        for name in ("boto3", "kubernetes_asyncio", "grpc", "opentelemetry", "aiohttp", "torch",
                     "reclaimd.ledger", "reclaimd.cluster", "reclaimd.objectstore"):
            try:
                __import__(name)
            except ImportError:
                missing.append(name)
        """
    )
    + SDK_ROUND_TRIP
    + textwrap.dedent(
        """
        print(json.dumps({"from": reclaimd.__file__, "missing": missing,
                          "version": reclaimd.__version__, **round_trip(sdk)}))
        """
    )
)


def test_the_sdk_wheel_holds_the_sdk_alone_and_works_with_nothing_else(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, str(BUILD), str(tmp_path / "dist")],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    wheel = Path(out.stdout.strip().splitlines()[-1])
    assert wheel.name == f"reclaimd_trainer-{reclaimd.__version__}-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as z:
        code = sorted(n for n in z.namelist() if not n.startswith("reclaimd_trainer-"))
        metadata = z.read(f"reclaimd_trainer-{reclaimd.__version__}.dist-info/METADATA").decode()
    sdk = sorted(f"reclaimd/trainer/{p.name}" for p in (REPO / "reclaimd/trainer").glob("*.py"))
    read = ["reclaimd/__init__.py", "reclaimd/model.py", "reclaimd/putbudget.py"]
    assert code == sorted([*read, "reclaimd/py.typed", *sdk])
    # no required dependency: torch, Lightning and transformers are extras
    assert "Requires-Dist" not in "".join(
        line for line in metadata.splitlines() if "extra ==" not in line
    )

    site = tmp_path / "site"
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
         "--target", str(site), str(wheel)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stderr[-2000:]
    ran = subprocess.run(
        [sys.executable, "-S", "-c", PROGRAM, str(site)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=tmp_path,  # not the checkout: its reclaimd must not be the one imported
    )
    assert ran.returncode == 0, ran.stderr[-2000:]
    doc = json.loads(ran.stdout.strip().splitlines()[-1])
    assert doc["from"].startswith(str(site))
    assert set(doc["missing"]) == {
        "boto3", "kubernetes_asyncio", "grpc", "opentelemetry", "aiohttp", "torch",
        "reclaimd.ledger", "reclaimd.cluster", "reclaimd.objectstore",
    }  # fmt: skip
    check_round_trip(doc)
