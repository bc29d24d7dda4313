"""Build the reclaimd-trainer wheel: ``python deploy/trainer/sdk/build.py OUT_DIR``.

Stages the SDK's modules (and nothing else of reclaimd) beside this directory's
pyproject.toml in a temporary directory and builds a wheel there, offline (no build
isolation: setuptools comes from the environment). Prints the wheel's path.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
sys.path.insert(0, str(REPO / "deploy"))
from sidewheel import build_staged  # noqa: E402 (deploy/sidewheel.py: shared by both)

# What reclaimd.trainer imports of reclaimd: tests/unit/test_trainer_dist.py keeps this true.
MODULES = ("__init__.py", "model.py", "putbudget.py", "py.typed")


def build(out: Path) -> Path:
    def stage(directory: Path) -> None:
        package = directory / "reclaimd"
        package.mkdir()
        for name in MODULES:
            if (REPO / "reclaimd" / name).exists():
                shutil.copy(REPO / "reclaimd" / name, package / name)
        shutil.copytree(
            REPO / "reclaimd" / "trainer",
            package / "trainer",
            ignore=shutil.ignore_patterns("__pycache__"),
        )

    return build_staged(HERE / "pyproject.toml", out, "reclaimd_trainer", stage)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: build.py OUT_DIR")
    print(build(Path(sys.argv[1])))
