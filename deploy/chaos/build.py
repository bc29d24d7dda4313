"""Build the reclaimd-chaos wheel: ``python deploy/chaos/build.py OUT_DIR``.

Stages chaos/ (its modules and package data, without the modules that need torch) beside this
directory's pyproject.toml in a temporary directory and builds a wheel there, offline (no
build isolation: setuptools comes from the environment). Prints the wheel's path.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "deploy"))
from sidewheel import build_staged  # noqa: E402 (deploy/sidewheel.py: shared by both)


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
    left_out = torch_modules()

    def ignore(directory: str, names: list[str]) -> set[str]:
        rel = Path(directory).resolve().relative_to(REPO)
        return {n for n in names if n == "__pycache__" or str(rel / n) in left_out}

    def stage(directory: Path) -> None:
        shutil.copytree(REPO / "chaos", directory / "chaos", ignore=ignore)

    return build_staged(HERE / "pyproject.toml", out, "reclaimd_chaos", stage)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: build.py OUT_DIR")
    print(build(Path(sys.argv[1])))
