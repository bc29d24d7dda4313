"""Build the reclaimd-trainer wheel: ``python deploy/trainer/sdk/build.py OUT_DIR``.

Stages reclaimd_trainer/ (the SDK, nothing of reclaimd) and this directory's pyproject.toml in
a temporary directory, in the checkout's layout (the pyproject names the package by a relative
path), and builds a wheel there, offline (no build isolation: setuptools comes from the
environment; the dev extra pins one with bdist_wheel built in). Prints the wheel's path.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
sys.path.insert(0, str(REPO / "deploy"))
from sidewheel import build_staged  # noqa: E402 (deploy/sidewheel.py: shared by both)

PROJECT = HERE.relative_to(REPO)  # where the pyproject sits in the staged tree


def build(out: Path, leave_out: frozenset[str] = frozenset()) -> Path:
    """``leave_out``: SDK modules (paths relative to the checkout) not to ship (the image
    leaves out those that need torch)."""

    def ignore(directory: str, names: list[str]) -> set[str]:
        rel = Path(directory).resolve().relative_to(REPO)
        return {n for n in names if n == "__pycache__" or str(rel / n) in leave_out}

    def stage(directory: Path) -> None:
        shutil.copytree(REPO / "reclaimd_trainer", directory / "reclaimd_trainer", ignore=ignore)

    return build_staged(HERE / "pyproject.toml", out, "reclaimd_trainer", stage, at=PROJECT)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: build.py OUT_DIR [MODULE_PATH_TO_LEAVE_OUT...]")
    print(build(Path(sys.argv[1]), frozenset(sys.argv[2:])))
