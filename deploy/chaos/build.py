"""Build the reclaimd-chaos wheel: ``python deploy/chaos/build.py OUT_DIR``.

Stages chaos/ (its modules and package data, without the modules that need torch) beside this
directory's pyproject.toml in a temporary directory and builds a wheel there, offline (no
build isolation: setuptools comes from the environment). Prints the wheel's path.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


def torch_modules() -> set[str]:
    """chaos/ modules that need torch (deploy/image/torch_modules.py: the image's rule too)."""
    spec = importlib.util.spec_from_file_location(
        "torch_modules", REPO / "deploy" / "image" / "torch_modules.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    found: list[str] = module.torch_modules(REPO, ["chaos"])
    return set(found)


def build(out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    left_out = torch_modules()

    def ignore(directory: str, names: list[str]) -> set[str]:
        rel = Path(directory).resolve().relative_to(REPO)
        return {n for n in names if n == "__pycache__" or str(rel / n) in left_out}

    with tempfile.TemporaryDirectory(prefix="reclaimd-chaos-") as tmp:
        stage = Path(tmp)
        shutil.copy(HERE / "pyproject.toml", stage / "pyproject.toml")
        shutil.copytree(REPO / "chaos", stage / "chaos", ignore=ignore)
        before = set(out.glob("reclaimd_chaos-*.whl"))
        subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
             "--no-build-isolation", "--wheel-dir", str(out), str(stage)],
            check=True,
        )  # fmt: skip
    made = sorted(set(out.glob("reclaimd_chaos-*.whl")) - before) or sorted(
        out.glob("reclaimd_chaos-*.whl")
    )
    return made[-1]


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: build.py OUT_DIR")
    print(build(Path(sys.argv[1])))
