"""The trainer SDK as its own distribution, reclaimd-trainer (import name ``reclaimd_trainer``),
beside the controller's, reclaimd: neither wheel holds a file of the other's. The SDK's wheel,
installed alone, works in an interpreter that has nothing else (``-S``: no site-packages, so no
reclaimd, boto3, kubernetes-asyncio, grpc, OpenTelemetry or aiohttp to find); both installed side
by side in a fresh venv, uninstalling either leaves every file of the other in place."""

from __future__ import annotations

import email.parser
import json
import subprocess
import sys
import textwrap
import tomllib
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from trainer_helpers import SDK_ROUND_TRIP, check_round_trip
from wheels import (
    REPO,
    dependency_links,
    fresh_venv,
    outside_env,
    pip,
    product_wheel,
    run,
    sdk_wheel,
)

import reclaimd_trainer

VERSION = reclaimd_trainer.__version__
SDK_PROJECT = tomllib.loads((REPO / "deploy/trainer/sdk/pyproject.toml").read_text())["project"]

PROGRAM = (
    textwrap.dedent(
        """
        import json, sys
        if len(sys.argv) > 1:
            sys.path.insert(0, sys.argv[1])
        import reclaimd_trainer as sdk
        missing = []
        for name in ("reclaimd", "handlers", "chaos", "boto3", "kubernetes_asyncio", "grpc",
                     "opentelemetry", "aiohttp", "torch"):
            try:
                __import__(name)
            except ImportError:
                missing.append(name)
        """
    )
    + SDK_ROUND_TRIP
    + textwrap.dedent(
        """
        print(json.dumps({"from": sdk.__file__, "missing": missing, "version": sdk.__version__,
                          **round_trip(sdk)}))
        """
    )
)


def metadata(wheel: Path, dist: str) -> email.message.Message:
    with zipfile.ZipFile(wheel) as z:
        text = z.read(f"{dist}-{VERSION}.dist-info/METADATA").decode()
    return email.parser.Parser().parsestr(text)


def files_of(wheel: Path) -> list[str]:
    """What the wheel installs, its .dist-info aside."""
    with zipfile.ZipFile(wheel) as z:
        return sorted(n for n in z.namelist() if ".dist-info/" not in n)


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    out = tmp_path_factory.mktemp("dist")
    return sdk_wheel(out / "sdk"), product_wheel(out / "product")


def test_the_sdk_wheel_holds_reclaimd_trainer_alone(wheels: tuple[Path, Path]) -> None:
    sdk, _ = wheels
    assert sdk.name == f"reclaimd_trainer-{VERSION}-py3-none-any.whl"
    shipped = sorted(
        str(p.relative_to(REPO)) for p in (REPO / "reclaimd_trainer").glob("*.py")
    )
    assert files_of(sdk) == sorted([*shipped, "reclaimd_trainer/py.typed"])
    # What it requires is what its pyproject declares; torch and the rest are extras.
    requires = metadata(sdk, "reclaimd_trainer").get_all("Requires-Dist") or []
    core = sorted(str(Requirement(r)) for r in requires if "extra ==" not in r)
    assert core == sorted(str(Requirement(r)) for r in SDK_PROJECT["dependencies"])
    extras = metadata(sdk, "reclaimd_trainer").get_all("Provides-Extra") or []
    assert set(extras) == {"s3", "aio", "torch", "lightning", "hf"}


def test_the_controller_wheel_holds_no_sdk_file_and_requires_the_sdk(
    wheels: tuple[Path, Path],
) -> None:
    sdk, product = wheels
    files = files_of(product)
    assert files and not [n for n in files if n.startswith("reclaimd_trainer/")]
    assert not set(files) & set(files_of(sdk))
    requires = metadata(product, "reclaimd").get_all("Requires-Dist") or []
    assert f"reclaimd-trainer=={VERSION}" in [r.replace(" ", "") for r in requires]


def test_the_sdk_installed_alone_works_with_nothing_else(
    wheels: tuple[Path, Path], tmp_path: Path
) -> None:
    site = tmp_path / "site"
    run(sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
        "--target", site, wheels[0])  # fmt: skip
    ran = subprocess.run(
        [sys.executable, "-S", "-c", PROGRAM, str(site)],
        capture_output=True, text=True, timeout=120, check=False,
        cwd=tmp_path,  # not the checkout: its packages must not be the ones imported
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr[-2000:]
    doc = json.loads(ran.stdout.strip().splitlines()[-1])
    assert doc["from"].startswith(str(site))
    assert set(doc["missing"]) == {
        "reclaimd", "handlers", "chaos", "boto3", "kubernetes_asyncio", "grpc", "opentelemetry",
        "aiohttp", "torch",
    }  # fmt: skip
    check_round_trip(doc)


def present(python: Path, wheel: Path) -> list[str]:
    """Which of ``wheel``'s files are missing from the venv of ``python``."""
    purelib = Path(
        run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])")
        .stdout.strip()
    )
    return [n for n in files_of(wheel) if not (purelib / n).is_file()]


def test_both_wheels_side_by_side_uninstalling_either_leaves_the_other_whole(
    wheels: tuple[Path, Path], tmp_path: Path
) -> None:
    sdk, product = wheels
    python = fresh_venv(tmp_path / "venv", dependency_links(tmp_path / "deps"))
    env = outside_env()
    pip(python, "install", "--quiet", "--no-deps", "--no-index", sdk, product)
    assert present(python, sdk) == [] and present(python, product) == []

    # The controller goes: the SDK keeps every file, imports and answers a request.
    pip(python, "uninstall", "--yes", "reclaimd")
    assert present(python, sdk) == []
    assert present(python, product) == files_of(product)  # it did go
    done = run(python, "-c", PROGRAM, env=env, cwd=tmp_path)
    doc = json.loads(done.stdout.strip().splitlines()[-1])
    assert doc["from"].startswith(str(tmp_path / "venv"))
    assert {"reclaimd", "handlers", "chaos"} <= set(doc["missing"])
    check_round_trip(doc)

    # The SDK goes: the controller keeps every file. It depends on the SDK (the contract's
    # times and share are the SDK's), so its import names that dependency and nothing of its
    # own; the SDK's wheel back alone, the controller imports without being reinstalled.
    pip(python, "install", "--quiet", "--no-deps", "--no-index", product)
    pip(python, "uninstall", "--yes", "reclaimd-trainer")
    assert present(python, product) == []
    assert present(python, sdk) == files_of(sdk)
    probe = "import reclaimd.daemon, reclaimd.handlers.sqs.parser, reclaimd.checkpoint"
    refused = subprocess.run(
        [python, "-c", probe], capture_output=True, text=True, timeout=120, check=False,
        env=env, cwd=tmp_path,
    )  # fmt: skip
    assert refused.returncode != 0
    assert "No module named 'reclaimd_trainer'" in refused.stderr.strip().splitlines()[-1]
    pip(python, "install", "--quiet", "--no-deps", "--no-index", sdk)
    run(python, "-c", probe, env=env, cwd=tmp_path)
