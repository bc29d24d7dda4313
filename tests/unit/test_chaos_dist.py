"""The rig as its own distribution, reclaimd-chaos (``reclaimd[chaos]``): a wheel of chaos/ and
its data without the torch jobs, installed with the product's wheel into a fresh venv that
has neither the checkout nor torch, where ``reclaimd drill`` is a command and every module it
ships imports.

Dependencies: no index here, so both wheels go in with ``--no-deps`` and the venv reaches the
dev venv's installed libraries through a ``site.addsitedir`` of a directory of links to them,
minus the frameworks (torch, Lightning, transformers, accelerate) and the dev venv's editable
reclaimd (which would put the checkout back on the path). What the wheel declares is checked
against what chaos imports instead.
"""

from __future__ import annotations

import ast
import email.parser
import json
import os
import sys
import textwrap
import tomllib
import zipfile
from pathlib import Path

import pytest
from wheels import dependency_links, product_wheel, run, sdk_wheel

import reclaimd

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "deploy" / "chaos" / "build.py"
VERSION = reclaimd.__version__
FRAMEWORKS = ("torch", "lightning", "transformers", "accelerate")
# Left out of the dependency links (besides the checkout's own): the frameworks and their kin.
NOT_LINKED = (
    "torch", "functorch", "lightning", "pytorch_lightning", "transformers", "accelerate",
    "triton",
)  # fmt: skip
# What each third-party import of chaos is a part of (a new import must be added here and
# declared in deploy/chaos/pyproject.toml).
DISTRIBUTION_OF = {
    "aiohttp": "aiohttp",
    "aiokafka": "aiokafka",
    "boto3": "boto3",
    "botocore": "boto3",  # boto3 pins its botocore
    "google": "google-cloud-pubsub",  # google.cloud.pubsub_v1, google.api_core (its dependency)
    "kubernetes_asyncio": "kubernetes-asyncio",
    "prometheus_client": "prometheus-client",
    "pydantic": "pydantic",
    "yaml": "PyYAML",
    "reclaimd": "reclaimd",
    "reclaimd_trainer": "reclaimd-trainer",  # its fake fleets' server, the guarded upload
}

PROGRAM = textwrap.dedent(
    """
    import importlib, json, pkgutil, sys
    missing = []
    for name in sys.argv[1].split(","):
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    import chaos, reclaimd

    def refuse(name):
        raise ImportError(f"walk: {name}")

    names = ["chaos"] + [m.name for m in pkgutil.walk_packages(chaos.__path__, "chaos.", refuse)]
    for name in names:
        importlib.import_module(name)
    print(json.dumps({"chaos": chaos.__file__, "reclaimd": reclaimd.__file__,
                      "imported": names, "missing": missing}))
    """
)


def metadata(wheel: Path, dist: str) -> email.message.Message:
    with zipfile.ZipFile(wheel) as z:
        text = z.read(f"{dist}-{VERSION}.dist-info/METADATA").decode()
    return email.parser.Parser().parsestr(text)


def third_party_roots(paths: list[Path]) -> set[str]:
    roots: set[str] = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                roots.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                roots.add(node.module.split(".")[0])
    return {
        r for r in roots if r not in sys.stdlib_module_names and r not in ("__future__", "chaos")
    }


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    out = tmp_path_factory.mktemp("dist")
    built = run(sys.executable, BUILD, out)
    chaos = Path(built.stdout.strip().splitlines()[-1])
    return chaos, product_wheel(out / "reclaimd"), sdk_wheel(out / "sdk")


def shipped_sources() -> list[Path]:
    left_out = set(
        run(sys.executable, REPO / "deploy/image/torch_modules.py", REPO, "chaos").stdout.split()
    )
    return sorted(
        p for p in (REPO / "chaos").rglob("*.py") if str(p.relative_to(REPO)) not in left_out
    )


def test_the_chaos_wheel_holds_chaos_and_its_data_without_the_torch_jobs(
    wheels: tuple[Path, Path, Path],
) -> None:
    chaos, product, _ = wheels
    assert chaos.name == f"reclaimd_chaos-{VERSION}-py3-none-any.whl"
    with zipfile.ZipFile(chaos) as z:
        files = sorted(n for n in z.namelist() if not n.startswith("reclaimd_chaos-"))
    data = [
        str(p.relative_to(REPO))
        for p in [*(REPO / "chaos/scenarios").glob("*.yaml"), REPO / "chaos/demo-rates.csv"]
    ]
    code = [str(p.relative_to(REPO)) for p in shipped_sources()]
    assert files == sorted([*code, *data])
    for torch_job in ("chaos/torchjob.py", "chaos/lightningjob.py", "chaos/bench/trainer.py"):
        assert torch_job not in files
    # Nothing in common with the product's wheel: installed together, neither owns the other's.
    with zipfile.ZipFile(product) as z:
        product_files = set(z.namelist())
    assert not [n for n in product_files if n.startswith("chaos/")]
    assert not set(files) & product_files


def test_the_chaos_wheel_declares_reclaimd_at_its_version_and_what_chaos_imports(
    wheels: tuple[Path, Path, Path],
) -> None:
    requires = metadata(wheels[0], "reclaimd_chaos").get_all("Requires-Dist") or []
    names = {r.split(";")[0].replace(" ", "") for r in requires}
    assert f"reclaimd=={VERSION}" in names
    declared = {n.split("<")[0].split(">")[0].split("=")[0].lower() for n in names}
    roots = third_party_roots(shipped_sources())
    assert roots <= DISTRIBUTION_OF.keys(), f"new imports: {roots - DISTRIBUTION_OF.keys()}"
    assert {DISTRIBUTION_OF[r].lower() for r in roots} <= declared
    # Each bound is reclaimd's own, and reclaimd[chaos] names this very version.
    main = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    ours = tomllib.loads((REPO / "deploy/chaos/pyproject.toml").read_text())["project"]
    assert ours["version"] == main["version"] == VERSION
    assert set(ours["dependencies"]) - {f"reclaimd=={VERSION}"} <= set(main["dependencies"])
    assert f"reclaimd-trainer=={VERSION}" in main["dependencies"]
    assert main["optional-dependencies"]["chaos"] == [f"reclaimd-chaos=={VERSION}"]
    # `reclaimd drill`: the entry point reclaimd's CLI looks up (reclaimd/cli.py), as the
    # checkout's editable install declares it.
    with zipfile.ZipFile(wheels[0]) as z:
        points = z.read(f"reclaimd_chaos-{VERSION}.dist-info/entry_points.txt").decode()
    assert "[reclaimd.cli]\ndrill = chaos.drill.cli:add_parser" in points
    assert ours["entry-points"]["reclaimd.cli"] == main["entry-points"]["reclaimd.cli"]


def test_installed_without_the_checkout_or_torch_reclaimd_drill_runs_and_every_module_imports(
    wheels: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    chaos, product, sdk = wheels
    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", "--without-pip", venv)
    python = venv / "bin" / "python"
    run(sys.executable, "-m", "pip", "--python", python, "install", "--quiet", "--no-deps",
        "--no-index", chaos, product, sdk)  # fmt: skip
    purelib = run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    links = dependency_links(tmp_path / "deps", NOT_LINKED)
    (Path(purelib.stdout.strip()) / "zz_deps.pth").write_text(
        f"import site; site.addsitedir({str(links)!r})\n"
    )
    # Not the checkout: no PYTHONPATH (the unit tests run with one), not run from the tree.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}

    drill = run(venv / "bin" / "reclaimd", "drill", "--help", env=env, cwd=tmp_path)
    assert "run" in drill.stdout

    done = run(python, "-c", PROGRAM, ",".join(FRAMEWORKS), env=env, cwd=tmp_path)
    doc = json.loads(done.stdout.strip().splitlines()[-1])
    assert doc["missing"] == list(FRAMEWORKS)  # so "imports" means: without them
    assert doc["chaos"].startswith(str(venv)) and doc["reclaimd"].startswith(str(venv))
    with zipfile.ZipFile(chaos) as z:
        modules = {
            n.removesuffix(".py").replace("/", ".").removesuffix(".__init__")
            for n in z.namelist()
            if n.endswith(".py")
        }
    assert set(doc["imported"]) == modules
